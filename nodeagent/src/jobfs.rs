//! jobfs: each job's scratch directory with a real size cap.
//!
//! A size-limited mount per job under the agent's jobfs directory, `<dir>/<job>.<epoch>`:
//! - **loop** (default): a sparse ext4 image of the job's size on local disk, loop-mounted
//!   `nosuid,nodev` (mke2fs and mount from e2fsprogs and util-linux do the formatting and the
//!   loop device);
//! - **tmpfs** (when configured): `tmpfs` with `size=` — in RAM, counted against nothing else.
//!
//! Private to its job: the mounted root belongs to the job's user with mode 0700; images are
//! 0600 in `<dir>/.images`, a directory of root's with mode 0700 (a readable image would let
//! anyone read the job's files with `debugfs`); `<dir>` itself is 0711, so a job reaches its
//! own mount and nobody lists the others. The directory is exported as `TMPDIR`, `PBS_JOBFS`
//! and `DOCKET_JOBFS`, and is unmounted and removed when the job ends. A job that fills it sees
//! ENOSPC; one that ended unsuccessfully with its jobfs full is reported as "jobfs exceeded".
//! Mounts left by an agent that died mid-job are removed at start.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::rootdir::RootDir;

/// The area's mode: jobs pass through to their own mounts; nobody lists them.
const AREA_MODE: u32 = 0o711;
/// Where the loop images are, and its mode.
const IMAGES: &str = ".images";
const IMAGES_MODE: u32 = 0o700;

/// How job scratch is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobfsKind {
    Loop,
    Tmpfs,
}

/// A jobfs could not be made.
#[derive(Debug, thiserror::Error)]
pub enum JobfsError {
    #[error("jobfs {path}: {message}")]
    Failed { path: PathBuf, message: String },
}

fn failed(path: &Path, message: impl Into<String>) -> JobfsError {
    JobfsError::Failed {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// A system tool run as root: root's fixed path and nothing else of the agent's environment.
fn tool(name: &str) -> Command {
    let mut cmd = Command::new(name);
    cmd.env_clear()
        .env("PATH", crate::shim::ROOT_PATH)
        .current_dir("/");
    cmd
}

fn run(cmd: &mut Command, path: &Path) -> Result<(), JobfsError> {
    let out = cmd
        .output()
        .map_err(|e| failed(path, format!("running {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(failed(
            path,
            format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

/// The agent's jobfs area.
#[derive(Debug, Clone)]
pub struct Jobfs {
    dir: PathBuf,
    kind: JobfsKind,
}

/// One job's mounted scratch (serializable, so a restarted agent finds it again).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobScratch {
    pub path: PathBuf,
    image: Option<PathBuf>,
}

impl Jobfs {
    /// The area at `dir` (created, root's with mode 0711, its images' directory 0700).
    pub fn open(dir: PathBuf, kind: JobfsKind) -> Result<Self, JobfsError> {
        let area =
            RootDir::open_or_create(&dir, AREA_MODE).map_err(|e| failed(&dir, e.to_string()))?;
        area.subdir(IMAGES, IMAGES_MODE)
            .map_err(|e| failed(&dir.join(IMAGES), e.to_string()))?;
        Ok(Jobfs { dir, kind })
    }

    fn images(&self) -> Result<RootDir, JobfsError> {
        RootDir::open_or_create(&self.dir, AREA_MODE)
            .and_then(|area| area.subdir(IMAGES, IMAGES_MODE))
            .map_err(|e| failed(&self.dir.join(IMAGES), e.to_string()))
    }

    /// Unmounts and removes scratch left by an agent that died mid-job, except the scratch of
    /// runs it re-adopted (`keep`: their mount paths).
    pub fn reap_stale(&self, keep: &std::collections::BTreeSet<PathBuf>) {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = self.dir.display().to_string();
        for line in mounts.lines() {
            if let Some(mount) = line.split(' ').nth(4)
                && mount.starts_with(&prefix)
                && mount != prefix
                && !keep.contains(Path::new(mount))
            {
                tracing::warn!(mount, "removing a stale jobfs mount");
                let _ = tool("umount").args(["-l", mount]).output();
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let p = e.path();
                if keep.contains(&p) || e.file_name() == IMAGES {
                    continue;
                }
                let _ = std::fs::remove_dir(&p);
            }
        }
        if let Ok(images) = self.images()
            && let Ok(entries) = std::fs::read_dir(images.path())
        {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let mount = name.strip_suffix(".img").map(|m| self.dir.join(m));
                if !mount.is_some_and(|m| keep.contains(&m)) {
                    let _ = images.remove_file(&name);
                }
            }
        }
    }

    /// Mounts a scratch of `size_mib` for run (job, epoch), owned by uid:gid.
    pub fn create(
        &self,
        job: u64,
        epoch: u64,
        size_mib: u64,
        uid: u32,
        gid: u32,
    ) -> Result<JobScratch, JobfsError> {
        let name = format!("{job}.{epoch}");
        let path = self.dir.join(&name);
        let area = RootDir::open_or_create(&self.dir, AREA_MODE)
            .map_err(|e| failed(&self.dir, e.to_string()))?;
        // The mount point is root's until the filesystem is on it.
        area.fresh_subdir(&name, 0o700)
            .map_err(|e| failed(&path, e.to_string()))?;
        let image = match self.kind {
            JobfsKind::Tmpfs => {
                run(
                    tool("mount")
                        .args(["-t", "tmpfs", "-o"])
                        .arg(format!("size={size_mib}m,mode=0700,nosuid,nodev"))
                        .arg("tmpfs")
                        .arg(&path),
                    &path,
                )?;
                None
            }
            JobfsKind::Loop => {
                let images = self.images()?;
                let image_name = format!("{name}.img");
                let image = images.path().join(&image_name);
                images
                    .remove_file(&image_name)
                    .map_err(|e| failed(&image, e.to_string()))?;
                let file = images
                    .create_new(&image_name, 0o600)
                    .map_err(|e| failed(&image, e.to_string()))?;
                file.set_len(size_mib << 20)
                    .map_err(|e| failed(&image, e.to_string()))?;
                drop(file);
                run(
                    tool("mkfs.ext4")
                        .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
                        .arg(&image),
                    &image,
                )?;
                run(
                    tool("mount")
                        .args(["-o", "loop,nosuid,nodev"])
                        .arg(&image)
                        .arg(&path),
                    &path,
                )?;
                Some(image)
            }
        };
        let scratch = JobScratch { path, image };
        // The mounted root: the user's, 0700 (the mount is root's own, freshly made).
        let owned = area.open_subdir(&name, 0o700).and_then(|root| {
            nix::unistd::fchown(
                root.fd().as_fd(),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .map_err(std::io::Error::from)
        });
        if let Err(e) = owned {
            scratch.remove();
            return Err(failed(
                &scratch.path,
                format!("giving it to uid {uid}: {e}"),
            ));
        }
        Ok(scratch)
    }
}

impl JobScratch {
    /// Whether it is full: less than 2% (at least 1 MiB) left, which is what a writer that got
    /// ENOSPC leaves (the filesystem keeps a little back for its own metadata).
    pub fn full(&self) -> bool {
        nix::sys::statvfs::statvfs(&self.path)
            .map(|s| {
                let unit = s.fragment_size().max(1) as u128;
                let total = s.blocks() as u128 * unit;
                let free = s.blocks_available() as u128 * unit;
                free < (total / 50).max(1 << 20)
            })
            .unwrap_or(false)
    }

    /// Unmounts and removes it. The job's processes are gone by now (its cgroup is emptied
    /// first); if another process of the same user still holds the mount (nobody else can
    /// enter it), it is detached lazily: that process keeps what it has open, the space comes
    /// back when it lets go, and the name is free at once.
    pub fn remove(&self) {
        let out = tool("umount").arg(&self.path).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            // Something still holds it open: detach it lazily.
            let _ = tool("umount").arg("-l").arg(&self.path).output();
        }
        let _ = std::fs::remove_dir(&self.path);
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}
