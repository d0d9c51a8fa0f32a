//! Real clusters for the command line's tests: a credential signer (`docket-authd`) and
//! three `docket-controller` processes on loopback, with the cluster's secrets, and the
//! commands run against them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(30);

/// The controller binary next to ours (built here when this package is tested alone).
pub fn controller_binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_docket")).with_file_name("docket-controller");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", "docket-controller"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "building docket-controller failed");
    }
    path
}

pub struct Procs(pub Vec<Child>);
impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn free_addr() -> String {
    docket_auth::local::free_loopback_addr().unwrap()
}

/// A sibling binary of ours (built here when this package is tested alone).
pub fn sibling(bin: &str, package: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_docket")).with_file_name(bin);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", package])
            .status()
            .unwrap()
            .success();
        assert!(ok, "building {package} failed");
    }
    path
}

/// What the commands need to reach the cluster of `dir` besides DOCKET_ADDR: its CA and the
/// credential signer's socket.
pub fn auth_env(dir: &Path) -> [(&'static str, PathBuf); 2] {
    [
        ("DOCKET_TLS_CA", dir.join("secrets").join("ca.pem")),
        ("DOCKET_AUTH_SOCKET", dir.join("authd.sock")),
    ]
}

/// Runs `name` (a symlink to `docket`) with `args` in `dir`, DOCKET_ADDR set.
pub fn run(dir: &Path, addr: &str, name: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(dir.join(name));
    cmd.args(args)
        .current_dir(dir)
        .env("DOCKET_ADDR", addr)
        .envs(auth_env(dir))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Three controllers serving `site` from `dir`, with every alias linked into `dir`; the
/// processes and DOCKET_ADDR.
pub fn start_cluster(dir: &Path, site: &str) -> (Procs, String) {
    start_cluster_with(dir, site, &Auth::Docket)
}

/// How a test cluster's users prove who they are.
pub enum Auth {
    /// docket-authd on `dir/authd.sock` (started here).
    Docket,
    /// A munged already listening on this socket.
    Munge(PathBuf),
}

/// Like [`start_cluster`], with `auth`.
pub fn start_cluster_with(dir: &Path, site: &str, auth: &Auth) -> (Procs, String) {
    std::fs::write(dir.join("site.toml"), site).unwrap();
    for name in [
        "sbatch", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sprio", "sshare", "qsub",
        "qstat", "qdel", "pbsnodes",
    ] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_docket"), dir.join(name)).unwrap();
    }
    // The cluster's secrets and this host's credential signer.
    let secrets = docket_auth::local::LocalSecrets::create(&dir.join("secrets"), "test").unwrap();
    for id in 1..=3 {
        secrets
            .issue(&docket_auth::tls::Role::Replica(id), &["127.0.0.1".into()])
            .unwrap();
    }
    let mut procs = Procs(Vec::new());
    let socket = dir.join("authd.sock");
    if let Auth::Docket = auth {
        procs.0.push(
            Command::new(sibling("docket-authd", "docket-auth"))
                .arg("--socket")
                .arg(&socket)
                .arg("--key")
                .arg(secrets.key_file())
                .args(["--log", "warn"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(start.elapsed() < DEADLINE, "docket-authd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let addrs: BTreeMap<u64, String> = (1..=3).map(|id| (id, free_addr())).collect();
    let bootstrap = addrs
        .iter()
        .map(|(id, a)| format!("{id}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let controller = controller_binary();
    for (id, a) in &addrs {
        let mut cmd = Command::new(&controller);
        cmd.args([
            "run",
            "--id",
            &id.to_string(),
            "--listen",
            a,
            "--agent-fence-ms",
            "0",
        ])
        .args(["--log", "off"])
        .arg("--data-dir")
        .arg(dir.join(format!("r{id}")))
        .arg("--config")
        .arg(dir.join("site.toml"))
        .args(secrets.controller_flags(*id))
        .args(match auth {
            Auth::Docket => Vec::new(),
            Auth::Munge(socket) => vec![
                "--auth-type".to_owned(),
                "auth/munge".to_owned(),
                "--munge-socket".to_owned(),
                socket.display().to_string(),
            ],
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if *id == 1 {
            cmd.args(["--bootstrap", &bootstrap]);
        }
        procs.0.push(cmd.spawn().unwrap());
    }
    let addr = addrs.values().cloned().collect::<Vec<_>>().join(",");
    (procs, addr)
}

pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
