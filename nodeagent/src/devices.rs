//! Keeping a job off the devices it was not given: the node's GPUs other than its own.
//!
//! A GPU is reached through character devices (`/dev/nvidiaN`, major 195; an AMD GPU's
//! `/dev/dri/renderD*`, major 226). A job's cgroup is denied read, write and mknod on each GPU
//! device the job was not allocated, so opening one fails with EPERM whatever the file's mode
//! (Slurm's `ConstrainDevices=yes`):
//! - **v1**: one line `c MAJOR:MINOR rwm` per device in the job's `devices.deny`. A new v1
//!   devices cgroup starts with its parent's rules, which on a stock host allow everything, so
//!   only the exceptions are written.
//! - **v2** has no device files: the kernel asks BPF programs of type
//!   `BPF_PROG_TYPE_CGROUP_DEVICE` attached to the cgroup and its ancestors. youki's
//!   `libcgroups` generates the program from rules (allow by default, deny each device) and
//!   loads it; it is attached with `BPF_F_ALLOW_MULTI`, so a program a service manager attached
//!   higher up still applies as well. The program stays attached until the cgroup is removed.
//!
//! The job's processes are not root and carry `no_new_privs`: they can neither rewrite
//! `devices.deny` nor detach the program.

use std::os::fd::AsRawFd;
use std::path::Path;

use libcgroups::v2::devices::{bpf, program::Program};
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType};

/// A character device, by its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CharDevice {
    pub major: u32,
    pub minor: u32,
}

impl CharDevice {
    /// The character device at `path` (following symlinks, as `/dev/dri/by-path` links are).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(path)?;
        if !meta.file_type().is_char_device() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a character device", path.display()),
            ));
        }
        let rdev = meta.rdev();
        Ok(CharDevice {
            major: nix::sys::stat::major(rdev) as u32,
            minor: nix::sys::stat::minor(rdev) as u32,
        })
    }
}

impl std::fmt::Display for CharDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c {}:{}", self.major, self.minor)
    }
}

/// Denying devices to a cgroup failed.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the cgroup v2 device program: {0}")]
    Program(String),
    #[error(
        "loading or attaching the cgroup v2 device program to {path}: {message} (the kernel \
         needs CONFIG_CGROUP_BPF, and the agent CAP_SYS_ADMIN)"
    )]
    Bpf {
        path: std::path::PathBuf,
        message: String,
    },
}

/// v1: denies `devices` to the cgroup `dir` (its `devices.deny`).
pub fn deny_v1(dir: &Path, devices: &[CharDevice]) -> Result<(), DevicesError> {
    let file = dir.join("devices.deny");
    for d in devices {
        std::fs::write(&file, format!("{d} rwm")).map_err(|source| DevicesError::Io {
            path: file.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The v2 device program: every device allowed but `devices`.
pub fn program(devices: &[CharDevice]) -> Result<Program, DevicesError> {
    let rules = devices
        .iter()
        .map(|d| {
            LinuxDeviceCgroupBuilder::default()
                .allow(false)
                .typ(LinuxDeviceType::C)
                .major(i64::from(d.major))
                .minor(i64::from(d.minor))
                .access("rwm")
                .build()
                .map_err(|e| DevicesError::Program(e.to_string()))
        })
        .collect::<Result<Vec<LinuxDeviceCgroup>, _>>()?;
    Program::from_rules(&rules, true).map_err(|e| DevicesError::Program(e.to_string()))
}

/// v2: attaches a program denying `devices` to the cgroup `dir`.
pub fn deny_v2(dir: &Path, devices: &[CharDevice]) -> Result<(), DevicesError> {
    if devices.is_empty() {
        return Ok(());
    }
    let prog = program(devices)?;
    let bpf_err = |message: String| DevicesError::Bpf {
        path: dir.to_path_buf(),
        message,
    };
    let cgroup = std::fs::File::open(dir).map_err(|source| DevicesError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    // The kernel reads the licence as a C string.
    let load = || bpf::prog::load("Apache-2.0\0", prog.bytecodes());
    // Kernels before 5.11 charge BPF programs to RLIMIT_MEMLOCK: raise it once if refused.
    let fd = match load() {
        Ok(fd) => fd,
        Err(_) => {
            bpf::prog::bump_memlock_rlimit().map_err(|e| bpf_err(e.to_string()))?;
            load().map_err(|e| bpf_err(format!("loading: {e}")))?
        }
    };
    let attached = bpf::prog::attach(fd, cgroup.as_raw_fd());
    // Attached, the program lives as long as the cgroup: our descriptor is not needed.
    let _ = nix::unistd::close(fd);
    attached.map_err(|e| bpf_err(format!("attaching: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated program, run in libcgroups' BPF interpreter: the denied GPUs refused for
    /// every access, the others and every other device allowed.
    #[test]
    fn the_v2_program_denies_exactly_the_devices_not_given() {
        let denied = [
            CharDevice {
                major: 195,
                minor: 1,
            },
            CharDevice {
                major: 195,
                minor: 3,
            },
        ];
        let prog = program(&denied).unwrap();
        let run = |major, minor, access: &str| {
            prog.execute(LinuxDeviceType::C, major, minor, access.to_owned())
                .unwrap()
        };
        for access in ["r", "w", "rw", "m", "rwm"] {
            assert_eq!(run(195, 1, access), 0, "195:1 {access}");
            assert_eq!(run(195, 3, access), 0, "195:3 {access}");
            assert_eq!(run(195, 0, access), 1, "195:0 {access}");
            assert_eq!(run(195, 2, access), 1, "195:2 {access}");
        }
        // /dev/null, /dev/nvidiactl (195:255), a block device: untouched.
        assert_eq!(run(1, 3, "rw"), 1);
        assert_eq!(run(195, 255, "rw"), 1);
        assert_eq!(
            prog.execute(LinuxDeviceType::B, 195, 1, "r".into())
                .unwrap(),
            1
        );
    }

    #[test]
    fn only_character_devices_are_devices() {
        let e = CharDevice::of(Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("not a character device"), "{e}");
        assert_eq!(
            CharDevice::of(Path::new("/dev/null")).unwrap(),
            CharDevice { major: 1, minor: 3 }
        );
    }
}
