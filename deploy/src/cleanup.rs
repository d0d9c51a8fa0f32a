//! Leaving nothing behind: jobs cancelled before their agents stop, then any process still
//! naming the state directory (job monitors outlive agents by design), mounts under it and
//! the agents' cgroups removed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::rpc;

/// What the sweep found and removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sweep {
    pub processes: usize,
    pub mounts: usize,
    pub cgroups: usize,
}

/// Cancels every live job and waits (up to `timeout`) until none runs, so every job's
/// processes end through its agent.
pub async fn cancel_everything(leader: &str, timeout: Duration) {
    let Ok(jobs) = rpc::all_jobs(leader).await else {
        return;
    };
    let live: Vec<pb::JobRef> = jobs
        .iter()
        .filter(|j| matches!(j.state_code.as_str(), "PD" | "R" | "S"))
        .map(|j| pb::JobRef {
            job_id: j.job_id,
            task: None,
        })
        .collect();
    if !live.is_empty()
        && let Ok(mut c) = rpc::jobs(leader)
    {
        let _ = c
            .cancel_jobs(rpc::as_user("root", pb::JobsRequest { jobs: live }))
            .await;
    }
    let start = Instant::now();
    while start.elapsed() < timeout {
        match rpc::all_jobs(leader).await {
            Ok(jobs)
                if !jobs
                    .iter()
                    .any(|j| matches!(j.state_code.as_str(), "R" | "S" | "CG")) =>
            {
                return;
            }
            Err(_) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// This process and its ancestors (a `timeout` or shell wrapping us names the state
/// directory too, and must not be swept).
fn ourselves() -> Vec<i32> {
    let mut out = vec![std::process::id() as i32];
    let mut pid = out[0];
    while pid > 1 && out.len() < 64 {
        let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
            })
            .unwrap_or(0);
        if ppid <= 1 {
            break;
        }
        out.push(ppid);
        pid = ppid;
    }
    out
}

/// Processes (other than this one and its ancestors) whose command line names `dir`.
pub fn processes_naming(dir: &Path) -> Vec<i32> {
    let needle = dir.display().to_string();
    let mine = ourselves();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !mine.contains(pid) && crate::local::alive(*pid))
        .filter(|pid| {
            // Whole path components: `/tmp/a` must not match `/tmp/ab`.
            let inside = format!("{needle}/");
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .split('\0')
                        .any(|arg| arg == needle || arg.contains(&inside))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// A mount point as `/proc/self/mountinfo` writes it: space, tab, newline and backslash as
/// octal escapes (`\040`, `\011`, `\012`, `\134`).
fn unescape_mount_point(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| {
                let v = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
                u8::try_from(v).ok()
            });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Mount points at or under `dir` (as it resolves: mountinfo names them so), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_point)
        .filter(|m| m.starts_with(dir))
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    out
}

/// Detaches every mount strictly under `dir` (as it resolves), deepest first; how many.
pub fn unmount_under(dir: &Path) -> usize {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    mounts_under(&dir)
        .iter()
        .filter(|m| m.as_path() != dir)
        .filter(|m| nix::mount::umount2(m.as_path(), nix::mount::MntFlags::MNT_DETACH).is_ok())
        .count()
}

/// Kills what still names `state_dir` (with its process group), unmounts what is mounted
/// under it, removes the agents' cgroup directories (children first).
pub fn sweep(state_dir: &Path, cgroups: &[PathBuf]) -> Sweep {
    let mut out = Sweep::default();
    let own_group = nix::unistd::getpgrp();
    for pid in processes_naming(state_dir) {
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(pid))).unwrap_or(Pid::from_raw(pid));
        // A job monitor leads its own group (its job's processes); never ours.
        if pgid != own_group {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        out.processes += 1;
    }
    if out.processes > 0 {
        std::thread::sleep(Duration::from_millis(200));
    }
    out.mounts = unmount_under(state_dir);
    for dir in cgroups {
        let Ok(children) = std::fs::read_dir(dir) else {
            continue;
        };
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir())
                && std::fs::remove_dir(child.path()).is_ok()
            {
                out.cgroups += 1;
            }
        }
        if std::fs::remove_dir(dir).is_ok() {
            out.cgroups += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_as_mountinfo_escapes_them() {
        assert_eq!(
            unescape_mount_point(r"/tmp/a\040b\011c\012d\134e"),
            PathBuf::from("/tmp/a b\tc\nd\\e")
        );
        // Not an escape: left as written.
        assert_eq!(
            unescape_mount_point(r"/x\9\777\04"),
            PathBuf::from(r"/x\9\777\04")
        );
    }
}
