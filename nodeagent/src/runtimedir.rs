//! The runtime directory: what lasts exactly as long as the runs it describes (each run's
//! record and each job's script), kept in memory on a tmpfs of the agent's own.
//!
//! Why in memory: every run creates nine files and directories there and removes three. On a
//! disk that is disk work, and on an ext4 without a journal every new inode skips the ones
//! freed in the last minutes (docs/node-agent.md has the measurements). Nothing there needs to
//! outlive a reboot, which ends the runs too: the Filesystem Hierarchy Standard's `/run`.
//!
//! Why a tmpfs of its own rather than the host's `/run`: that one is shared by every service
//! of the node and capped in inodes (systemd mounts it with `nr_inodes=800k`); run records
//! kept for a day under a steady stream of short jobs, or a job appending to its own script
//! (the user's, as Slurm's spooled script is), would fill it for all of them. The agent's
//! own mount has its own size and inode caps, so what fills it stops only this agent's
//! launches (and a job's tmpfs pages are charged to its memory limit).
//!
//! The agent mounts it over the directory when the directory is not already a mount point.
//! A restarted agent finds its mount and uses it as it is (its runs' records are there); a
//! reboot leaves an empty directory, and the runs the state file still holds are reported
//! lost. A directory that is already a mount point (one the site made) is used as it is.
//! So is one that holds anything: records of runs still going (an agent that kept them
//! there on the directory's own file system), or what must outlive a reboot (a runtime
//! directory that is, or holds, the state directory); a tmpfs over it would hide them.

use std::io;
use std::path::Path;

use crate::rootdir::RootDir;

/// Inodes the tmpfs allows per MiB of its size: a run's record is six inodes and two pages.
pub const INODES_PER_MIB: u64 = 256;

/// What the agent did with its runtime directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// It mounted a tmpfs of its own there.
    Mounted,
    /// It found a mount point there (its own from before a restart, or the site's).
    Found,
    /// It uses the directory as it is: asked to (`size_mib` 0), or it may not mount.
    Plain(String),
}

/// Whether `dir` is a mount point: the kernel's own word (`statx`'s `STATX_ATTR_MOUNT_ROOT`,
/// Linux 5.8), which also knows bind mounts from the same file system; on older kernels,
/// whether its device differs from its parent's.
pub fn is_mount_point(dir: &RootDir) -> io::Result<bool> {
    use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};
    match rustix::fs::statx(
        dir.fd(),
        "",
        AtFlags::EMPTY_PATH | AtFlags::NO_AUTOMOUNT,
        StatxFlags::empty(),
    ) {
        Ok(st) if st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) => {
            return Ok(st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
        }
        Ok(_) | Err(rustix::io::Errno::NOSYS) => {}
        Err(e) => return Err(e.into()),
    }
    let own = nix::sys::stat::fstat(dir.fd()).map_err(io::Error::from)?;
    let parent = nix::sys::stat::fstatat(dir.fd(), "..", nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(io::Error::from)?;
    Ok(own.st_dev != parent.st_dev || own.st_ino == parent.st_ino)
}

/// Mounts a tmpfs of `size_mib` (0: none) on `dir` unless it is a mount point already, holds
/// anything, or is `keep` or above it (the state directory, whose file must outlive a
/// reboot). The mount goes through the directory's handle (`/proc/self/fd/N`), so it lands on
/// the directory that was checked, whatever is renamed meanwhile.
pub fn prepare(dir: &RootDir, size_mib: u64, mode: u32, keep: &Path) -> io::Result<Prepared> {
    if is_mount_point(dir)? {
        return Ok(Prepared::Found);
    }
    if size_mib == 0 {
        return Ok(Prepared::Plain("asked not to mount one".into()));
    }
    let (here, keep) = (
        std::fs::canonicalize(dir.path())?,
        std::fs::canonicalize(keep)?,
    );
    if keep.starts_with(&here) {
        return Ok(Prepared::Plain(format!(
            "it holds {}, which must outlive a reboot",
            keep.display()
        )));
    }
    if std::fs::read_dir(dir.path())?.next().is_some() {
        return Ok(Prepared::Plain(
            "it holds files from before (runs an agent kept there may still be going); \
             empty it, with no jobs running, to have a tmpfs mounted there"
                .into(),
        ));
    }
    let inodes = size_mib.saturating_mul(INODES_PER_MIB);
    let target =
        Path::new("/proc/self/fd").join(std::os::fd::AsRawFd::as_raw_fd(&dir.fd()).to_string());
    match nix::mount::mount(
        Some("docket-run"),
        &target,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(format!("size={size_mib}m,nr_inodes={inodes},mode={mode:o}").as_str()),
    ) {
        Ok(()) => Ok(Prepared::Mounted),
        Err(nix::errno::Errno::EPERM) => Ok(Prepared::Plain(
            "this process may not mount (no CAP_SYS_ADMIN)".into(),
        )),
        Err(e) => Err(io::Error::other(format!(
            "mounting a {size_mib} MiB tmpfs on {}: {e}",
            dir.path().display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_is_not_a_mount_point_and_size_zero_mounts_nothing() {
        let base = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(&base.path().join("run"), 0o711).unwrap();
        assert!(!is_mount_point(&dir).unwrap());
        let state = base.path().join("state");
        std::fs::create_dir(&state).unwrap();
        assert!(matches!(
            prepare(&dir, 0, 0o711, &state).unwrap(),
            Prepared::Plain(_)
        ));
        assert!(!is_mount_point(&dir).unwrap());
    }

    /// Nothing is mounted over what must not be hidden: the state directory (the runtime
    /// directory is it, or holds it), or files from before. Refused before any mount, so
    /// this runs unprivileged.
    #[test]
    fn no_tmpfs_over_the_state_directory_or_over_files_from_before() {
        let base = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(&base.path().join("run"), 0o711).unwrap();
        for keep in [base.path().join("run"), base.path().join("run/state")] {
            std::fs::create_dir_all(&keep).unwrap();
            let Prepared::Plain(why) = prepare(&dir, 8, 0o711, &keep).unwrap() else {
                panic!("mounted over {}", keep.display());
            };
            assert!(why.contains("outlive a reboot"), "{why}");
        }
        std::fs::remove_dir(base.path().join("run/state")).unwrap();
        std::fs::create_dir_all(base.path().join("run/runs/7.1")).unwrap();
        let elsewhere = base.path().join("state");
        std::fs::create_dir(&elsewhere).unwrap();
        let Prepared::Plain(why) = prepare(&dir, 8, 0o711, &elsewhere).unwrap() else {
            panic!("mounted over a run's record");
        };
        assert!(why.contains("files from before"), "{why}");
        assert!(!is_mount_point(&dir).unwrap());
    }
}
