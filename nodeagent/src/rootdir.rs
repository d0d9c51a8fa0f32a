//! Directories that belong to the agent, used only through their handles.
//!
//! The agent runs as root, and root must never follow a path a user can write: a symlink
//! planted at a name root is about to write (`exit.tmp -> /etc/shadow`) would make root
//! truncate whatever it points to. So the agent's bookkeeping lives in directories it owns and
//! nobody else can write, each opened once with `O_DIRECTORY | O_NOFOLLOW` and checked (owned by
//! the agent's euid); every file in one is then opened, created, renamed and removed relative
//! to that handle (`openat`, `mkdirat`, `renameat`, `unlinkat`) and never through a symlink
//! (`O_NOFOLLOW`, `O_EXCL` for new files). A name is one path component, never `..`.
//!
//! This is also where a job's own directory (its script and node file) is made: root's, with
//! the files written while root's and lent to the user on their handles ([`crate::lend`]).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

/// The most a bookkeeping file read back may hold: these are a few numbers, an environment
/// block at most. A bigger one is refused rather than read.
pub const MAX_READ: u64 = 4 << 20;

/// An open directory that belongs to this process's euid.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn at(path: &Path, name: &str) -> impl FnOnce(Errno) -> io::Error {
    let what = path.join(name);
    move |e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", what.display()),
        )
    }
}

/// `name` must be one path component.
fn component(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not one path component"),
        ));
    }
    Ok(name)
}

fn dir_flags() -> OFlag {
    OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC
}

impl RootDir {
    /// Opens `path`, creating it (and its parents) if missing, as a directory of this
    /// process's euid with exactly `mode`. Refused if it is a symlink or belongs to someone
    /// else.
    pub fn open_or_create(path: &Path, mode: u32) -> io::Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match nix::unistd::mkdir(path, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(at(path, "")(e)),
        }
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty()).map_err(at(path, ""))?;
        Self::checked(fd, path.to_path_buf(), mode)
    }

    /// Opens the existing directory `path`, checked like [`RootDir::open_or_create`].
    pub fn open(path: &Path, mode: u32) -> io::Result<Self> {
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty()).map_err(at(path, ""))?;
        Self::checked(fd, path.to_path_buf(), mode)
    }

    fn checked(fd: OwnedFd, path: PathBuf, mode: u32) -> io::Result<Self> {
        let st = fstat(&fd).map_err(at(&path, ""))?;
        let me = nix::unistd::geteuid().as_raw();
        if st.st_uid != me {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to uid {}, not to this agent (uid {me}); it may not keep its \
                     state there",
                    path.display(),
                    st.st_uid
                ),
            ));
        }
        if st.st_mode & 0o7777 != mode {
            fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(at(&path, ""))?;
        }
        Ok(RootDir { fd, path })
    }

    /// Where it is (for messages, and for paths handed to processes that must name it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (creating if missing) the subdirectory `name`, checked like
    /// [`RootDir::open_or_create`].
    pub fn subdir(&self, name: &str, mode: u32) -> io::Result<RootDir> {
        let name = component(name)?;
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(at(&self.path, name)(e)),
        }
        self.open_subdir(name, mode)
    }

    /// Opens the existing subdirectory `name`, checked like [`RootDir::open_or_create`].
    pub fn open_subdir(&self, name: &str, mode: u32) -> io::Result<RootDir> {
        let name = component(name)?;
        let fd =
            openat(&self.fd, name, dir_flags(), Mode::empty()).map_err(at(&self.path, name))?;
        Self::checked(fd, self.path.join(name), mode)
    }

    /// Makes the subdirectory `name` afresh (whatever was there is removed first).
    pub fn fresh_subdir(&self, name: &str, mode: u32) -> io::Result<RootDir> {
        self.remove_tree(name)?;
        let name = component(name)?;
        mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)).map_err(at(&self.path, name))?;
        self.open_subdir(name, mode)
    }

    /// Creates the file `name`, which must not exist yet, with `mode`, and writes `contents`.
    pub fn write_new(&self, name: &str, contents: &[u8], mode: u32) -> io::Result<std::fs::File> {
        let mut file = self.create_new(name, mode)?;
        file.write_all(contents).map_err(|e| {
            io::Error::new(e.kind(), format!("{}: {e}", self.path.join(name).display()))
        })?;
        Ok(file)
    }

    /// Creates the file `name`, which must not exist yet (never through a symlink), open for
    /// writing.
    pub fn create_new(&self, name: &str, mode: u32) -> io::Result<std::fs::File> {
        let name = component(name)?;
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(at(&self.path, name))?;
        Ok(std::fs::File::from(fd))
    }

    /// Opens the existing file `name` (never through a symlink) for appending.
    pub fn open_append(&self, name: &str) -> io::Result<std::fs::File> {
        let name = component(name)?;
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(at(&self.path, name))?;
        Ok(std::fs::File::from(fd))
    }

    /// Replaces the file `name` with `contents` atomically: a new temporary file, then a
    /// rename over the old one. Readers see the old contents or the new, never a part.
    pub fn write_atomically(&self, name: &str, contents: &[u8]) -> io::Result<()> {
        let name = component(name)?;
        let tmp = format!(".{name}.tmp");
        self.remove_file(&tmp)?;
        let mut file = self.create_new(&tmp, 0o600)?;
        file.write_all(contents).map_err(|e| {
            io::Error::new(e.kind(), format!("{}: {e}", self.path.join(&tmp).display()))
        })?;
        drop(file);
        renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(at(&self.path, name))
    }

    /// Reads the file `name` (not through a symlink, at most [`MAX_READ`] bytes); None when
    /// there is none.
    pub fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let name = component(name)?;
        let Some(fd) = self.open_regular(name, OFlag::O_RDONLY)? else {
            return Ok(None);
        };
        let mut buf = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_READ + 1)
            .read_to_end(&mut buf)?;
        if buf.len() as u64 > MAX_READ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is over {MAX_READ} bytes",
                    self.path.join(name).display()
                ),
            ));
        }
        Ok(Some(buf))
    }

    /// Opens the regular file `name` (one component) for `access`: never through a symlink,
    /// without blocking (a FIFO) and without becoming the agent's terminal (a tty); None when
    /// there is none, an error when it is anything but a regular file.
    fn open_regular(&self, name: &str, access: OFlag) -> io::Result<Option<OwnedFd>> {
        let fd = match openat(
            &self.fd,
            name,
            access | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(at(&self.path, name)(e)),
        };
        use nix::sys::stat::SFlag;
        let st = fstat(&fd).map_err(at(&self.path, name))?;
        if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a regular file", self.path.join(name).display()),
            ));
        }
        Ok(Some(fd))
    }

    /// Reads the file `name` as text; None when there is none or it is unreadable.
    pub fn read_text(&self, name: &str) -> Option<String> {
        match self.read(name) {
            Ok(Some(bytes)) => String::from_utf8(bytes).ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "reading agent bookkeeping");
                None
            }
        }
    }

    /// Opens (creating if missing) the file `name` for reading and writing, for a lock.
    pub fn open_lock(&self, name: &str) -> io::Result<std::fs::File> {
        let name = component(name)?;
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(at(&self.path, name))?;
        Ok(std::fs::File::from(fd))
    }

    /// Whether `name` exists (a symlink counts as existing, and is never followed).
    pub fn exists(&self, name: &str) -> bool {
        component(name).is_ok()
            && fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// Empties the file `name`, if there is one (never through a symlink): its contents go,
    /// its inode stays. See [`crate::runner`] for why a file is sometimes emptied rather than
    /// removed. Only a regular file is emptied: opened without truncating, checked, then
    /// truncated.
    pub fn empty(&self, name: &str) -> io::Result<()> {
        let name = component(name)?;
        match self.open_regular(name, OFlag::O_WRONLY)? {
            Some(fd) => nix::unistd::ftruncate(&fd, 0).map_err(at(&self.path, name)),
            None => Ok(()),
        }
    }

    /// Removes the file `name`, if there is one.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        let name = component(name)?;
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(at(&self.path, name)(e)),
        }
    }

    /// Removes the subdirectory `name` and everything in it, if there is one. The standard
    /// library's `remove_dir_all` never follows a symlink it meets inside (CVE-2022-21658).
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        let name = component(name)?;
        match std::fs::remove_dir_all(self.path.join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("removing {}: {e}", self.path.join(name).display()),
            )),
        }
    }

    /// The directory's handle.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Checks that nobody but this process's euid and root can replace `path` or anything on the
/// way to it: every directory above it (after symlinks are resolved, and the symlinks' own
/// directories too) must belong to root or to the euid and must not be writable by group or
/// others, unless it is sticky (`/tmp`: there only an entry's owner may rename or remove it).
/// The agent's handles are opened without following a final symlink, but a user who could
/// rename a directory above the state directory could swap the whole tree under a path the
/// agent hands to its monitor.
pub fn check_ancestors(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let absolute = std::path::absolute(path)?;
    // Each ancestor as written, and each as it resolves.
    let mut dirs: Vec<PathBuf> = absolute
        .ancestors()
        .skip(1)
        .map(Path::to_path_buf)
        .collect();
    if let Some(existing) = absolute.ancestors().skip(1).find(|a| a.exists())
        && let Ok(real) = std::fs::canonicalize(existing)
    {
        dirs.extend(real.ancestors().map(Path::to_path_buf));
    }
    for dir in dirs {
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.mode();
        let writable_by_others = mode & 0o022 != 0 && mode & 0o1000 == 0;
        if (meta.uid() != 0 && meta.uid() != me) || writable_by_others {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} (above {}) belongs to uid {} with mode {:o}: someone other than root \
                     could replace what is below it; keep the agent's directories under \
                     directories only root can write",
                    dir.display(),
                    path.display(),
                    meta.uid(),
                    mode & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// Gives the open file `file` to `uid:gid`.
pub fn give_file(file: &std::fs::File, uid: u32, gid: u32) -> io::Result<()> {
    fchown(file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn files_are_written_and_read_only_through_the_handle_never_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(&tmp.path().join("state"), 0o700).unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o700);

        dir.write_atomically("exit", b"0 0\n").unwrap();
        assert_eq!(dir.read_text("exit").as_deref(), Some("0 0\n"));
        dir.write_atomically("exit", b"1 0\n").unwrap();
        assert_eq!(dir.read_text("exit").as_deref(), Some("1 0\n"));

        // A symlink planted at the temporary name, or at the name itself, is never followed.
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".pgid.tmp")).unwrap();
        dir.write_atomically("pgid", b"1").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::os::unix::fs::symlink(&victim, dir.path().join("link")).unwrap();
        assert!(dir.read("link").is_err(), "read through a symlink");
        assert!(dir.create_new("link", 0o600).is_err());
        assert!(dir.write_new("link", b"x", 0o600).is_err());
        assert!(dir.empty("link").is_err(), "emptied through a symlink");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(dir.exists("link"));

        // Emptying keeps the file (and its inode), without its contents; a missing one is fine.
        dir.write_new("environ", b"SECRET=1\0", 0o600).unwrap();
        let inode = std::fs::metadata(dir.path().join("environ")).unwrap().ino();
        dir.empty("environ").unwrap();
        assert_eq!(dir.read("environ").unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(
            std::fs::metadata(dir.path().join("environ")).unwrap().ino(),
            inode
        );
        dir.empty("never-written").unwrap();
        assert!(!dir.exists("never-written"));
        // Only a regular file: a FIFO is refused without blocking, a directory too.
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(dir.empty("fifo").is_err());
        std::fs::create_dir(dir.path().join("a-dir")).unwrap();
        assert!(dir.empty("a-dir").is_err());

        // A symlinked subdirectory is refused too.
        std::os::unix::fs::symlink(tmp.path(), dir.path().join("sub")).unwrap();
        assert!(dir.subdir("sub", 0o700).is_err());
        assert!(dir.open_subdir("sub", 0o700).is_err());

        // Names are single components.
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(dir.read(bad).is_err(), "{bad:?}");
            assert!(dir.create_new(bad, 0o600).is_err(), "{bad:?}");
        }

        // Absent is None; a fresh subdirectory replaces what was there.
        assert!(dir.read("nothing").unwrap().is_none());
        let sub = dir.subdir("runs", 0o700).unwrap();
        sub.write_new("old", b"x", 0o600).unwrap();
        let fresh = dir.fresh_subdir("runs", 0o700).unwrap();
        assert!(!fresh.exists("old"));
    }

    #[test]
    fn a_directory_others_could_write_above_the_state_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_ancestors(&open.join("state")).unwrap_err();
        assert!(err.to_string().contains("mode 777"), "{err}");
        // Sticky, like /tmp: fine.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_ancestors(&open.join("state")).unwrap();
        // Through a symlink to an open directory: refused too.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let safe = tmp.path().join("safe");
        std::os::unix::fs::symlink(&open, &safe).unwrap();
        assert!(check_ancestors(&safe.join("x").join("state")).is_err());
    }

    #[test]
    fn an_oversized_file_is_refused_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(tmp.path(), 0o700).unwrap();
        let f = dir.create_new("big", 0o600).unwrap();
        f.set_len(MAX_READ + 1).unwrap();
        let err = dir.read("big").unwrap_err();
        assert!(err.to_string().contains("over"), "{err}");
    }
}
