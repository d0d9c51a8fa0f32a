//! Attacks on who a request is from, run for real as an unprivileged user (`nobody`) against
//! a credential signer and three controllers: each must fail with a clear error and change
//! nothing. Also `auth/munge` against a real munged.
//!
//! The attacker's toolkit is the `docket` binary (copied where `nobody` may run it), the
//! cluster's CA certificate and the signer's socket, which every user of a real cluster has;
//! the cluster key stays readable by root only, as on a real cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Auth, DEADLINE, auth_env, run, start_cluster_with, text};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;

const SITE: &str = r#"
[[nodes]]
NodeName = "n[01-02]"
CPUs = 4
RealMemory = "8G"

[[partitions]]
PartitionName = "batch"
Nodes = "ALL"
Default = true
MaxTime = "1-00:00:00"

[[accounts]]
Name = "ops"

[[users]]
Name = "root"
DefaultAccount = "ops"

[[users]]
Name = "nobody"
DefaultAccount = "ops"
"#;

/// Root for real, or a skip (a failure when DOCKET_REQUIRE_PRIVILEGED is set).
fn privileged(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
        "DOCKET_REQUIRE_PRIVILEGED is set but this test runs without root ({why})"
    );
    eprintln!("skipped: {why} needs root");
    false
}

fn nobody() -> nix::unistd::User {
    nix::unistd::User::from_name("nobody").unwrap().unwrap()
}

/// A directory `nobody` can use: the `docket` binary and its command names, and the
/// cluster's CA certificate. The test directory is opened (0755) so that nobody reaches the
/// signer's socket; the secrets directory stays 0700.
fn toolkit(dir: &Path) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kit = dir.join("kit");
    std::fs::create_dir(&kit).unwrap();
    std::fs::set_permissions(&kit, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_docket"), kit.join("docket")).unwrap();
    for name in ["sbatch", "squeue", "scancel", "scontrol"] {
        std::os::unix::fs::symlink("docket", kit.join(name)).unwrap();
    }
    std::fs::copy(dir.join("secrets").join("ca.pem"), kit.join("ca.pem")).unwrap();
    kit
}

/// `name` from the toolkit, run as nobody, with `env` (DOCKET_ADDR and the rest).
fn as_nobody(
    kit: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, String)],
    stdin: Option<&str>,
) -> Output {
    let who = nobody();
    let mut cmd = Command::new(kit.join(name));
    cmd.args(args)
        .current_dir(kit)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .uid(who.uid.as_raw())
        .gid(who.gid.as_raw())
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// nobody cannot cancel root's `job`, but can submit (and cancel) a job of its own; the id
/// of nobody's job.
fn nobody_is_held_to_itself(kit: &Path, env: &[(&str, String)], job: &str) -> String {
    let o = as_nobody(kit, "scancel", &[job], env, None);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("nobody cannot cancel job"), "{o:?}");
    let o = as_nobody(
        kit,
        "sbatch",
        &["--parsable", "-H", "-t", "5"],
        env,
        Some("#!/bin/sh\ntrue\n"),
    );
    assert!(o.status.success(), "{o:?}");
    text(&o).trim().to_owned()
}

/// Submits a held job as root (through the commands, as root runs them); its id.
fn roots_job(dir: &Path, addr: &str) -> String {
    let start = Instant::now();
    loop {
        let o = run(
            dir,
            addr,
            "sbatch",
            &["--parsable", "-H", "-J", "roots", "-t", "10"],
            Some("#!/bin/sh\nsleep 1\n"),
        );
        if o.status.success() {
            return text(&o).trim().to_owned();
        }
        // Before the first leader has applied the site, the user is unknown: wait.
        assert!(start.elapsed() < DEADLINE, "{o:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The job's state code as root sees it.
fn state_of(dir: &Path, addr: &str, job: &str) -> String {
    let o = run(dir, addr, "squeue", &["-h", "-o", "%t", "-j", job], None);
    assert!(o.status.success(), "{o:?}");
    text(&o).trim().to_owned()
}

/// A jobs client to `addr` over TLS, checking the cluster CA in `kit`.
fn jobs_client(kit: &Path, addr: &str) -> JobsClient<tonic::transport::Channel> {
    let tls = docket_auth::tls::TlsContext::load(docket_auth::tls::TlsFiles {
        ca: kit.join("ca.pem"),
        identity: None,
    })
    .unwrap();
    JobsClient::new(
        docket_auth::tls::connect::channel(addr, &tls, Duration::from_secs(2), None).unwrap(),
    )
}

/// A cancel of `job`, carrying `credential` (if any) and claiming to be root in the old
/// header.
fn cancel_request(job: u64, credential: Option<&str>) -> tonic::Request<pb::JobsRequest> {
    let mut req = tonic::Request::new(pb::JobsRequest {
        jobs: vec![pb::JobRef {
            job_id: job,
            task: None,
        }],
    });
    req.metadata_mut().insert(
        docket_proto::metadata::CLAIMED_USER,
        "root".parse().unwrap(),
    );
    if let Some(c) = credential {
        req.metadata_mut()
            .insert(docket_proto::metadata::CREDENTIAL, c.parse().unwrap());
    }
    req
}

#[test]
fn an_unprivileged_user_cannot_act_as_anyone_else() {
    if !privileged("running commands as nobody") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_procs, addr) = start_cluster_with(d, SITE, &Auth::Docket);
    let kit = toolkit(d);
    let env = [
        ("DOCKET_ADDR", addr.clone()),
        ("DOCKET_TLS_CA", kit.join("ca.pem").display().to_string()),
        (
            "DOCKET_AUTH_SOCKET",
            d.join("authd.sock").display().to_string(),
        ),
        ("DOCKET_RETRY_SECONDS", "10".to_owned()),
    ];
    let job = roots_job(d, &addr);
    assert_eq!(state_of(d, &addr, &job), "PD");

    // nobody cancels root's job through the commands: refused; what nobody may do, it can:
    // submit a job of its own, owned by nobody.
    let mine = nobody_is_held_to_itself(&kit, &env, &job);
    let o = run(d, &addr, "squeue", &["-h", "-o", "%u", "-j", &mine], None);
    assert_eq!(text(&o).trim(), "nobody");
    let o = as_nobody(&kit, "scancel", &[&mine], &env, None);
    assert!(o.status.success(), "{o:?}");
    // ... drains a node: refused.
    nobody_cannot_drain_a_node(d, &addr, &kit, &env);
    // ... reads the cluster key to mint a credential of its own: the file is root's.
    nobody_cannot_read_the_cluster_key(d);

    // A hand-written client: nobody's own credential (from the signer, as nobody), the old
    // header claiming root. The credential decides: nobody, not permitted.
    let o = as_nobody(&kit, "docket", &["credential"], &env, None);
    assert!(o.status.success(), "{o:?}");
    let credential = text(&o).trim().to_owned();
    let id: u64 = job.parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let leader = nobodys_credential_is_not_permitted(&kit, &addr, id, &credential).await;
        let mut c = jobs_client(&kit, &leader);
        // The same credential again: refused as a replay.
        let replayed = cancel_request(id, Some(&credential));
        expect_unauthenticated(&mut c, replayed, "already used").await;
        // No credential, only the header: refused.
        expect_unauthenticated(&mut c, cancel_request(id, None), "no credential").await;
        // nobody's credential rewritten to say root (uid 0): the signature no longer
        // matches.
        let o = as_nobody(&kit, "docket", &["credential"], &env, None);
        let fresh = text(&o).trim().to_owned();
        let forged = cancel_request(id, Some(&forge_as_root(&fresh)));
        expect_unauthenticated(&mut c, forged, "signature does not match").await;
        // A credential made with another cluster's key: unknown key.
        let other = cancel_request(id, Some(&other_clusters_credential()));
        expect_unauthenticated(&mut c, other, "does not hold").await;
        // A plain-text client (no TLS): no answer at all.
        plain_text_gets_no_answer(&leader, cancel_request(id, Some(&fresh))).await;
    });
    assert_eq!(state_of(d, &addr, &job), "PD", "root's job is untouched");
}

/// nobody's `scontrol update ... State=DRAIN`: refused for want of the admin role, and no
/// node drains.
fn nobody_cannot_drain_a_node(d: &Path, addr: &str, kit: &Path, env: &[(&str, String)]) {
    let o = as_nobody(
        kit,
        "scontrol",
        &["update", "NodeName=n01", "State=DRAIN", "Reason=mine"],
        env,
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("admin role"), "{o:?}");
    let o = run(d, addr, "sinfo", &["-h", "-N", "-o", "%N %t"], None);
    assert!(!text(&o).contains("drain"), "{}", text(&o));
}

/// `cat` of the cluster key, run as nobody, fails.
fn nobody_cannot_read_the_cluster_key(d: &Path) {
    let who = nobody();
    let o = Command::new("cat")
        .arg(d.join("secrets").join("auth.key"))
        .uid(who.uid.as_raw())
        .gid(who.gid.as_raw())
        .output()
        .unwrap();
    assert!(!o.status.success(), "nobody read the cluster key: {o:?}");
}

/// A cancel of root's job `id` with nobody's `credential` and the old header claiming root,
/// sent to each replica in `addr` until one answers: refused because nobody may not cancel
/// it; the address that answered.
async fn nobodys_credential_is_not_permitted(
    kit: &Path,
    addr: &str,
    id: u64,
    credential: &str,
) -> String {
    // Any replica forwards writes; ask each until one answers.
    let mut answer = None;
    for a in addr.split(',') {
        let mut c = jobs_client(kit, a);
        match c.cancel_jobs(cancel_request(id, Some(credential))).await {
            Ok(r) => {
                answer = Some((a.to_owned(), r.into_inner()));
                break;
            }
            Err(s) if s.code() == tonic::Code::Unavailable => continue,
            Err(s) => panic!("{s:?}"),
        }
    }
    let (a, r) = answer.expect("no replica answered");
    assert!(
        r.results[0].error.contains("nobody cannot cancel job"),
        "{r:?}"
    );
    a
}

/// `request` sent through `c`: refused as unauthenticated, with `why` in the message.
async fn expect_unauthenticated(
    c: &mut JobsClient<tonic::transport::Channel>,
    request: tonic::Request<pb::JobsRequest>,
    why: &str,
) {
    let e = c.cancel_jobs(request).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains(why), "{e:?}");
}

/// A credential for root (uid 0) minted with a key of another cluster's.
fn other_clusters_credential() -> String {
    docket_auth::local::Minter::new(
        docket_auth::KeyRing::new(vec![docket_auth::Key::generate().unwrap()]).unwrap(),
        "elsewhere",
    )
    .credential(0, "root")
    .unwrap()
}

/// `request` sent to `leader` in plain text (no TLS): no answer at all.
async fn plain_text_gets_no_answer(leader: &str, request: tonic::Request<pb::JobsRequest>) {
    let plain = JobsClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{leader}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect_lazy(),
    );
    let e = plain.clone().cancel_jobs(request).await.unwrap_err();
    assert_ne!(e.code(), tonic::Code::Ok, "{e:?}");
}

/// `credential` with its claims changed to uid 0 and user root, the signature kept.
fn forge_as_root(credential: &str) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    let rest = credential
        .strip_prefix(docket_auth::credential::PREFIX)
        .unwrap();
    let (body, tag) = rest.split_once('.').unwrap();
    let body = B64.decode(body).unwrap();
    let (mut claims, _): (docket_auth::Claims, &[u8]) =
        postcard::take_from_bytes(&body[8..]).unwrap();
    claims.uid = 0;
    claims.user = "root".into();
    let mut forged = body[..8].to_vec();
    forged.extend(postcard::to_allocvec(&claims).unwrap());
    format!(
        "{}{}.{tag}",
        docket_auth::credential::PREFIX,
        B64.encode(forged)
    )
}

/// A munged of our own: its key, socket and files in `dir`.
struct Munged(std::process::Child);

impl Drop for Munged {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_munged(dir: &Path) -> Option<(Munged, PathBuf)> {
    let missing = |what: &str| {
        assert!(
            std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
            "DOCKET_REQUIRE_PRIVILEGED is set but {what} is missing (apt-get install munge)"
        );
        eprintln!("skipped: {what} is missing (apt-get install munge)");
        None
    };
    let Ok(lib) = docket_auth::munge::Munge::load(None) else {
        return missing("libmunge.so.2");
    };
    drop(lib);
    let munge_dir = dir.join("munge");
    std::fs::create_dir(&munge_dir).unwrap();
    std::fs::set_permissions(&munge_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = munge_dir.join("munge.key");
    let created = Command::new("mungekey")
        .arg("--create")
        .arg(format!("--keyfile={}", key.display()))
        .status();
    if !created.is_ok_and(|s| s.success()) {
        return missing("mungekey");
    }
    let socket = munge_dir.join("munge.sock");
    let child = Command::new("munged")
        .args(["--foreground", "--force"])
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--key-file={}", key.display()))
        .arg(format!(
            "--pid-file={}",
            munge_dir.join("munged.pid").display()
        ))
        .arg(format!(
            "--log-file={}",
            munge_dir.join("munged.log").display()
        ))
        .arg(format!(
            "--seed-file={}",
            munge_dir.join("munged.seed").display()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(child) = child else {
        return missing("munged");
    };
    let munged = Munged(child);
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(start.elapsed() < DEADLINE, "munged did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((munged, socket))
}

/// `name` (a command in `d`) reaching the cluster at `addr` with munge credentials from
/// the munged on `socket`.
fn munge_command(d: &Path, name: &str, addr: &str, socket: &Path) -> Command {
    let mut cmd = Command::new(d.join(name));
    cmd.env("DOCKET_ADDR", addr)
        .envs(auth_env(d))
        .env("DOCKET_AUTH_TYPE", "auth/munge")
        .env("DOCKET_AUTH_SOCKET", socket);
    cmd
}

/// Submits a held job as root through munge, retried until the first leader knows root;
/// its id.
fn roots_job_through_munge(d: &Path, addr: &str, socket: &Path) -> String {
    let start = Instant::now();
    loop {
        let mut cmd = munge_command(d, "sbatch", addr, socket);
        cmd.args(["--parsable", "-H", "-t", "10"])
            .current_dir(d)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"#!/bin/sh\ntrue\n")
                .unwrap();
        }
        let o = child.wait_with_output().unwrap();
        if o.status.success() {
            return text(&o).trim().to_owned();
        }
        assert!(start.elapsed() < DEADLINE, "{o:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn munge_credentials_from_a_real_munged_prove_users_too() {
    if !privileged("running commands as nobody") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some((_munged, socket)) = start_munged(d) else {
        return;
    };
    let (_procs, addr) = start_cluster_with(d, SITE, &Auth::Munge(socket.clone()));
    // Root, through munge.
    let job = roots_job_through_munge(d, &addr, &socket);
    // nobody, through munge: munged vouches for uid 65534, the controller resolves nobody.
    let kit = toolkit(d);
    let env = [
        ("DOCKET_ADDR", addr.clone()),
        ("DOCKET_TLS_CA", kit.join("ca.pem").display().to_string()),
        ("DOCKET_AUTH_TYPE", "auth/munge".to_owned()),
        ("DOCKET_AUTH_SOCKET", socket.display().to_string()),
    ];
    let mine = nobody_is_held_to_itself(&kit, &env, &job);
    let o = munge_command(d, "squeue", &addr, &socket)
        .args(["-h", "-o", "%u", "-j", &mine])
        .output()
        .unwrap();
    assert_eq!(text(&o).trim(), "nobody", "{o:?}");
    // A munge credential replayed: munged refuses it.
    let o = as_nobody(&kit, "docket", &["credential"], &env, None);
    assert!(o.status.success(), "{o:?}");
    let credential = text(&o).trim().to_owned();
    assert!(credential.starts_with("MUNGE:"), "{credential}");
    let id: u64 = job.parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        // First use (any replica; a follower forwards it): nobody, not permitted.
        let first = addr.split(',').next().unwrap();
        let mut c = jobs_client(&kit, first);
        let r = c
            .cancel_jobs(cancel_request(id, Some(&credential)))
            .await
            .unwrap();
        assert!(
            r.get_ref().results[0]
                .error
                .contains("nobody cannot cancel"),
            "{r:?}"
        );
        // Again: munged refuses the replay.
        let replayed = cancel_request(id, Some(&credential));
        expect_unauthenticated(&mut c, replayed, "already used").await;
    });
}
