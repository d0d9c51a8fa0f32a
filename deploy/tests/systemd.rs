//! The production units: the controller is `Type=notify`, the agent owns its cgroup subtree
//! (`Delegate=yes`) and does not take its jobs down with it (`KillMode=process`); both pass
//! `systemd-analyze verify` (with paths pointed at this build); every variable the example
//! environment files set is one the daemons read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn unit(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("systemd")
            .join(name),
    )
    .unwrap()
}

fn bins() -> PathBuf {
    docket_deploy::testing::bin_dir(
        env!("CARGO_BIN_EXE_docket-local"),
        &["docket-controller", "docket-nodeagent", "docket-authd"],
    )
}

#[test]
fn the_units_say_what_the_daemons_need() {
    let controller = unit("docket-controller.service");
    for line in [
        "Type=notify",
        "ExecStart=/usr/local/bin/docket-controller run",
        "EnvironmentFile=/etc/docket/controller.env",
    ] {
        assert!(controller.lines().any(|l| l == line), "{line}");
    }
    let authd = unit("docket-authd.service");
    for line in [
        "Type=notify",
        "User=root",
        "ExecStart=/usr/local/bin/docket-authd",
        "EnvironmentFile=/etc/docket/authd.env",
        "RuntimeDirectory=docket",
    ] {
        assert!(authd.lines().any(|l| l == line), "{line}");
    }
    let agent = unit("docket-nodeagent.service");
    for line in [
        "Delegate=yes",
        "DelegateSubgroup=agent",
        "KillMode=process",
        "User=root",
        "ExecStart=/usr/local/bin/docket-nodeagent run",
    ] {
        assert!(agent.lines().any(|l| l == line), "{line}");
    }
    // The runs' records of the jobs it re-adopts when it starts again are on the tmpfs it
    // mounts itself, in the host's mount namespace: no RuntimeDirectory= of systemd's, and
    // no option that would give the service a namespace of its own (gone at each restart).
    for option in [
        "RuntimeDirectory",
        "PrivateTmp",
        "ProtectSystem",
        "ProtectHome",
        "ReadWritePaths",
        "ReadOnlyPaths",
        "InaccessiblePaths",
        "TemporaryFileSystem",
        "PrivateMounts",
        "MountFlags",
    ] {
        assert!(
            !agent.lines().any(|l| l.starts_with(option)),
            "{option}: {agent}"
        );
    }
}

#[test]
fn every_variable_of_the_environment_files_is_a_flag() {
    let bins = bins();
    for (env, bin, args) in [
        (
            "controller.env",
            "docket-controller",
            &["run", "--help"][..],
        ),
        ("nodeagent.env", "docket-nodeagent", &["run", "--help"][..]),
        ("authd.env", "docket-authd", &["--help"][..]),
    ] {
        let help = Command::new(bins.join(bin)).args(args).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let text = unit(env);
        let vars: Vec<&str> = text
            .lines()
            .map(|l| l.trim_start_matches("# "))
            .filter(|l| l.starts_with("DOCKET_"))
            .filter_map(|l| l.split('=').next())
            .collect();
        assert!(vars.len() >= 4, "{env}: {vars:?}");
        for v in vars {
            assert!(
                help.contains(&format!("[env: {v}=")),
                "{env}: {v} is not read by {bin}"
            );
        }
    }
}

#[test]
fn systemd_analyze_accepts_the_units() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skipped: systemd-analyze is not installed here");
        return;
    };
    assert!(probe.status.success());
    let bins = bins();
    let dir = tempfile::tempdir().unwrap();
    let env_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let mut paths = Vec::new();
    for name in [
        "docket-controller.service",
        "docket-nodeagent.service",
        "docket-authd.service",
    ] {
        let text = unit(name)
            .replace("/usr/local/bin/", &format!("{}/", bins.display()))
            .replace("/etc/docket/", &format!("{}/", env_dir.display()));
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        paths.push(path);
    }
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // Only complaints about these units count (the host's own units may have their own);
    // a systemd before 254 does not know DelegateSubgroup= and says so (it is ignored there).
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("docket-"))
        .filter(|l| !(l.contains("Unknown key") && l.contains("'DelegateSubgroup'")))
        .collect();
    assert!(o.status.success() && ours.is_empty(), "{err}");
}
