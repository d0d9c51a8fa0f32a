//! A job's own files (its script and node file) stay root's and are lent to the job's user
//! through a POSIX access ACL.
//!
//! Slurm spools a batch script as the user's file (`slurm_script`, mode 0500 in slurmd's
//! spool). An owner may `chmod` its file and then grow it without end; here that would fill
//! the agent's capped runtime tmpfs (or the state directory's disk) and fail every launch on
//! the node until the job ended. So the agent keeps the files its own, mode 0500 or 0400, and
//! adds one named-user entry for the job's user (`user:UID:r-x` for the script, `r--` for the
//! node file) with a matching mask: the user reads and runs them, and, not being their owner,
//! can neither change their mode nor their ACL nor write to them. Nobody else gets anything
//! (the group's and others' entries are `---`; the directories above are root's, 0711). The
//! file's group is the user's, for tools that read the mode bits ([`lend_file`]).
//!
//! The ACL is written as the kernel's `system.posix_acl_access` extended attribute
//! (`include/uapi/linux/posix_acl_xattr.h`; acl(5)): five entries of eight bytes after a
//! version word. The crates that set ACLs wrap libacl, a C library and a build dependency
//! more, for what is here one `fsetxattr` of 44 bytes.
//!
//! A file system without ACLs (`EOPNOTSUPP`: tmpfs built without `CONFIG_TMPFS_POSIX_ACL`,
//! some network file systems) gets the files given to the user as before, and the caller is
//! told so it can warn.

use std::io;
use std::os::fd::AsFd;

/// `posix_acl_xattr_header.a_version`.
const ACL_VERSION: u32 = 2;
/// Entry tags (`ACL_USER_OBJ` ...): the kernel wants them in this order, named users by id.
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// The id of an entry that names nobody (`ACL_UNDEFINED_ID`).
const UNDEFINED_ID: u32 = u32::MAX;
const READ: u16 = 4;
const EXECUTE: u16 = 1;

/// How a file reached its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lent {
    /// Root's, readable (and runnable) by the user through its ACL.
    ReadOnly,
    /// The file system has no ACLs: the user's own file, as Slurm does it.
    Given,
    /// The user is the agent's own (an agent run unprivileged): the file is already theirs.
    Own,
}

/// What the user may do with a lent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadExecute,
}

impl Access {
    fn bits(self) -> u16 {
        match self {
            Access::Read => READ,
            Access::ReadExecute => READ | EXECUTE,
        }
    }
}

/// The access ACL that lets `uid` do `access`, the owner the same, and nobody else anything.
pub fn read_only_acl(uid: u32, access: Access) -> Vec<u8> {
    let perm = access.bits();
    let entries = [
        (USER_OBJ, perm, UNDEFINED_ID),
        (USER, perm, uid),
        (GROUP_OBJ, 0, UNDEFINED_ID),
        (MASK, perm, UNDEFINED_ID),
        (OTHER, 0, UNDEFINED_ID),
    ];
    let mut xattr = Vec::with_capacity(4 + 8 * entries.len());
    xattr.extend_from_slice(&ACL_VERSION.to_le_bytes());
    for (tag, perm, id) in entries {
        xattr.extend_from_slice(&tag.to_le_bytes());
        xattr.extend_from_slice(&perm.to_le_bytes());
        xattr.extend_from_slice(&id.to_le_bytes());
    }
    xattr
}

/// The extended attribute that holds a file's access ACL.
const ACCESS_ACL: &str = "system.posix_acl_access";

/// Lends the open file `file`, which this process created and owns, to `uid:gid`: through
/// its ACL if the file system has them, else by giving it away (`fchown`).
///
/// The file's group becomes `gid`, with nothing for the group in the ACL: the kernel then
/// refuses the group's other members, while programs that judge access from the mode bits
/// alone (Perl's `-r`, busybox's `test -r`) see the mask's bits in the group's place and let
/// the job's user, a member of `gid`, read what it may.
pub fn lend_file(file: &std::fs::File, uid: u32, gid: u32, access: Access) -> io::Result<Lent> {
    if uid == nix::unistd::geteuid().as_raw() {
        return Ok(Lent::Own);
    }
    let acl = read_only_acl(uid, access);
    match rustix::fs::fsetxattr(
        file.as_fd(),
        ACCESS_ACL,
        &acl,
        rustix::fs::XattrFlags::empty(),
    ) {
        Ok(()) => {
            nix::unistd::fchown(file, None, Some(nix::unistd::Gid::from_raw(gid)))
                .map_err(io::Error::from)?;
            Ok(Lent::ReadOnly)
        }
        // The kernel says EOPNOTSUPP both for a file system without ACLs and for an ACL it
        // cannot parse: only the first may fall back to the user's own file.
        Err(rustix::io::Errno::OPNOTSUPP) if !supports_acls(file) => {
            crate::rootdir::give_file(file, uid, gid)?;
            Ok(Lent::Given)
        }
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("setting the access ACL that lends the file to uid {uid}: {e}"),
        )),
    }
}

/// Whether `file`'s file system keeps POSIX ACLs: reading a file's access ACL answers
/// `ENODATA` (none set) where it does and `EOPNOTSUPP` where it does not.
fn supports_acls(file: &std::fs::File) -> bool {
    let mut buf = [0u8; 128];
    !matches!(
        rustix::fs::fgetxattr(file.as_fd(), ACCESS_ACL, &mut buf),
        Err(rustix::io::Errno::OPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// What the kernel made of it: the ACL read back as written, and the mode it derived
    /// (the mask in the group's bits). A file's owner may set its ACL, so this needs no root;
    /// a file system without ACLs skips it.
    #[test]
    fn the_kernel_takes_the_acl_and_derives_the_mode_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script");
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o500))
            .unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let acl = read_only_acl(65534, Access::ReadExecute);
        match rustix::fs::fsetxattr(
            file.as_fd(),
            ACCESS_ACL,
            &acl,
            rustix::fs::XattrFlags::empty(),
        ) {
            Err(rustix::io::Errno::OPNOTSUPP) => {
                assert!(!supports_acls(&file));
                eprintln!("skipped: {} keeps no POSIX ACLs", dir.path().display());
                return;
            }
            other => other.unwrap(),
        }
        let mut back = [0u8; 128];
        let n = rustix::fs::fgetxattr(file.as_fd(), ACCESS_ACL, &mut back).unwrap();
        assert_eq!(&back[..n], &acl[..]);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o550);
        assert!(supports_acls(&file));
    }

    #[test]
    fn the_acl_is_the_kernels_layout_sorted_by_tag() {
        let acl = read_only_acl(65534, Access::ReadExecute);
        assert_eq!(acl.len(), 44);
        assert_eq!(&acl[..4], &[2, 0, 0, 0]);
        let entries: Vec<(u16, u16, u32)> = acl[4..]
            .chunks(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect();
        assert_eq!(
            entries,
            [
                (0x01, 5, u32::MAX),
                (0x02, 5, 65534),
                (0x04, 0, u32::MAX),
                (0x10, 5, u32::MAX),
                (0x20, 0, u32::MAX),
            ]
        );
        assert_eq!(read_only_acl(7, Access::Read)[6], 4);
    }
}
