//! Who is at the other end of a Unix socket, as the kernel says.
//!
//! `SO_PEERCRED` gives the uid, gid and pid the connecting process had when it called
//! `connect`; `SO_PEERGROUPS` (Linux 4.13) its supplementary groups. Neither can be forged by
//! the caller, which is the whole basis of the signer's trust.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// `SO_PEERGROUPS` (the libc crate does not export it on every architecture).
#[cfg(any(target_arch = "mips", target_arch = "mips64"))]
const SO_PEERGROUPS: nix::libc::c_int = 59;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_PEERGROUPS: nix::libc::c_int = 0x003d;
#[cfg(not(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const SO_PEERGROUPS: nix::libc::c_int = 59;

/// Most groups read (Linux's NGROUPS_MAX).
const MAX_GROUPS: usize = 65_536;

/// The identity of a connected peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups; `None` when the kernel cannot tell (before Linux 4.13).
    pub groups: Option<Vec<u32>>,
}

/// The peer of the connected Unix socket `fd`.
pub fn peer_of(fd: BorrowedFd<'_>) -> io::Result<Peer> {
    let cred = getsockopt(&fd, PeerCredentials).map_err(io::Error::from)?;
    Ok(Peer {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
        groups: peer_groups(fd)?,
    })
}

fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Option<Vec<u32>>> {
    let mut groups: Vec<nix::libc::gid_t> = vec![0; 64];
    loop {
        let mut len =
            (groups.len() * std::mem::size_of::<nix::libc::gid_t>()) as nix::libc::socklen_t;
        // SAFETY: `groups` is a live buffer of exactly `len` bytes, and `len` a live
        // socklen_t; the kernel writes at most `len` bytes and sets `len` to what it wrote
        // (or, with ERANGE, to what it needs).
        let rc = unsafe {
            nix::libc::getsockopt(
                fd.as_raw_fd(),
                nix::libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<nix::libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(Some(groups));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(nix::libc::ERANGE) if n > groups.len() && n <= MAX_GROUPS => {
                groups.resize(n, 0);
            }
            Some(nix::libc::ENOPROTOOPT) => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_kernel_names_our_own_process_as_the_peer() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = peer_of(a.as_fd()).unwrap();
        assert_eq!(peer.uid, nix::unistd::geteuid().as_raw());
        assert_eq!(peer.gid, nix::unistd::getegid().as_raw());
        assert_eq!(peer.pid, std::process::id() as i32);
        let mine: Vec<u32> = nix::unistd::getgroups()
            .unwrap()
            .iter()
            .map(|g| g.as_raw())
            .collect();
        if let Some(groups) = peer.groups {
            let mut got = groups.clone();
            got.sort_unstable();
            let mut want = mine.clone();
            want.sort_unstable();
            assert_eq!(got, want);
        }
    }
}
