//! For tests that start real clusters: the directory of the binaries next to a test's own
//! binary, with any that are missing built first.
//!
//! Only missing binaries are built: a workspace test run (CI) has built them all, and
//! rebuilding one while another test runs it would pull it from under that test. After
//! changing a daemon, `cargo build --workspace --bins` before testing one package alone.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The package that builds each binary.
fn package_of(bin: &str) -> &str {
    match bin {
        "docket" => "docket-cli",
        "docket-local" => "docket-deploy",
        "docket-authd" => "docket-auth",
        other => other,
    }
}

/// `exe`'s directory, holding every one of `bins` (missing ones built with `$CARGO`).
///
/// # Panics
/// When a build fails: this is for tests.
pub fn bin_dir(exe: &str, bins: &[&str]) -> PathBuf {
    let dir = Path::new(exe)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let missing: Vec<&str> = bins
        .iter()
        .copied()
        .filter(|b| !dir.join(b).exists())
        .collect();
    if !missing.is_empty() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.arg("build");
        for b in &missing {
            cmd.args(["-p", package_of(b)]);
        }
        let ok = cmd.status().is_ok_and(|s| s.success());
        assert!(ok, "building {missing:?} failed");
    }
    dir
}
/// A directory that lives as long as this test process and is removed when it exits.
///
/// Tests keep what they make once per process (a cluster's secrets) in a static, and a static
/// is never dropped: a `TempDir` there would leave one directory of keys in the temporary
/// directory for every test process. `atexit` runs when the test harness exits, passed or
/// failed; only a process killed by a signal leaves its directory.
///
/// # Panics
/// When the directory cannot be made: this is for tests.
pub fn process_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    extern "C" fn remove() {
        if let Some(dir) = DIR.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir()
            .expect("a temporary directory for this test process")
            .keep();
        // SAFETY: `remove` only reads a OnceLock that is set by then and removes a directory.
        assert_eq!(
            unsafe { libc::atexit(remove) },
            0,
            "atexit refused the handler"
        );
        dir
    })
    .clone()
}

/// A finished command's standard output and error, one after the other (for messages).
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
