//! The node's GPUs: which device files they are, which a job gets, and what it is told.
//!
//! The agent declares `--gpus N`; in real execution those are N device files, given with
//! `--gpu-devices` (`/dev/nvidia0,/dev/nvidia1`, or AMD's `/dev/dri/renderD128,...`) or found
//! as `/dev/nvidia0`, `/dev/nvidia1`, ... GPU `i` is the i-th file. A job allocated `gpu:k` on
//! this node gets the k free GPUs with the lowest indices ([`crate::runner`] keeps which are
//! free, as it does cpus); its cgroup is denied every other GPU device ([`crate::devices`]).
//!
//! What the job is told follows Slurm (`gres.html`, "GPU Management"): `SLURM_JOB_GPUS` and
//! `GPU_DEVICE_ORDINAL` carry the node's indices of its GPUs; `CUDA_VISIBLE_DEVICES` and
//! `ROCR_VISIBLE_DEVICES` are the indices the GPU runtime will see. When the job's devices are
//! constrained, the runtime sees only the job's GPUs and numbers them from 0, so those are
//! `0..k`; unconfined (`--confinement none`) it sees all of them and they are the node's
//! indices.

use std::path::{Path, PathBuf};

use crate::devices::CharDevice;

/// The node's GPU devices, GPU `i` at index `i`.
#[derive(Debug, Clone, Default)]
pub struct Gpus {
    devices: Vec<(PathBuf, CharDevice)>,
}

/// The GPU inventory does not match what the agent declares.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("--gpu-devices {path}: {source}")]
    Device {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--gpus {declared} but {found} GPU device files ({list}): give the node's GPU devices \
         with --gpu-devices, or declare as many GPUs as it has"
    )]
    Count {
        declared: u32,
        found: usize,
        list: String,
    },
}

impl Gpus {
    /// The `declared` GPUs of this node: the device files `paths`, or when none are given the
    /// node's `/dev/nvidiaN` files in order.
    pub fn discover(declared: u32, paths: &[PathBuf]) -> Result<Self, GpuError> {
        let paths = if paths.is_empty() && declared > 0 {
            nvidia_devices(Path::new("/dev"))
        } else {
            paths.to_vec()
        };
        let mut devices = Vec::with_capacity(paths.len());
        for path in paths {
            let device = CharDevice::of(&path).map_err(|source| GpuError::Device {
                path: path.clone(),
                source,
            })?;
            devices.push((path, device));
        }
        if devices.len() != declared as usize {
            return Err(GpuError::Count {
                declared,
                found: devices.len(),
                list: devices
                    .iter()
                    .map(|(p, _)| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        Ok(Gpus { devices })
    }

    pub fn count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// The devices of every GPU not in `given` (node indices): what the job must not open.
    pub fn denied(&self, given: &[u32]) -> Vec<CharDevice> {
        self.devices
            .iter()
            .enumerate()
            .filter(|(i, _)| !given.contains(&(*i as u32)))
            .map(|(_, (_, d))| *d)
            .collect()
    }
}

/// `/dev/nvidia0`, `/dev/nvidia1`, ... under `dev`, by number (not `nvidiactl`, `nvidia-uvm`).
fn nvidia_devices(dev: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(dev)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let n = name.strip_prefix("nvidia")?.parse::<u32>().ok()?;
                    Some((n, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The variables telling a job its GPUs (`given`: node indices, lowest first); none when it
/// has none. `constrained`: its cgroup hides the other GPUs.
pub fn environment(given: &[u32], constrained: bool) -> Vec<(&'static str, String)> {
    if given.is_empty() {
        return Vec::new();
    }
    let list = |ids: &mut dyn Iterator<Item = u32>| {
        ids.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
    };
    let node = list(&mut given.iter().copied());
    let visible = if constrained {
        list(&mut (0..given.len() as u32))
    } else {
        node.clone()
    };
    vec![
        ("SLURM_JOB_GPUS", node.clone()),
        ("GPU_DEVICE_ORDINAL", node),
        ("CUDA_VISIBLE_DEVICES", visible.clone()),
        ("ROCR_VISIBLE_DEVICES", visible),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_told_its_gpus_as_slurm_tells_them() {
        assert!(environment(&[], true).is_empty());
        let env = environment(&[1, 3], true);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SLURM_JOB_GPUS"), Some("1,3"));
        assert_eq!(get("GPU_DEVICE_ORDINAL"), Some("1,3"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("0,1"));
        assert_eq!(get("ROCR_VISIBLE_DEVICES"), Some("0,1"));
        let env = environment(&[2], false);
        assert!(env.contains(&("CUDA_VISIBLE_DEVICES", "2".into())));
    }

    #[test]
    fn the_declared_count_must_match_the_devices() {
        let e = Gpus::discover(2, &[PathBuf::from("/dev/null")]).unwrap_err();
        assert!(
            e.to_string().contains("--gpus 2 but 1 GPU device files"),
            "{e}"
        );
        let e = Gpus::discover(1, &[PathBuf::from("/nonexistent/nvidia0")]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/nvidia0"), "{e}");
        let g =
            Gpus::discover(2, &[PathBuf::from("/dev/null"), PathBuf::from("/dev/zero")]).unwrap();
        assert_eq!(g.denied(&[0]), vec![CharDevice { major: 1, minor: 5 }]);
        assert_eq!(g.denied(&[0, 1]), Vec::new());
        assert!(Gpus::discover(0, &[]).unwrap().denied(&[]).is_empty());
    }

    #[test]
    fn nvidia_devices_are_found_by_number() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["nvidia10", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia0"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let found: Vec<String> = nvidia_devices(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(found, ["nvidia0", "nvidia2", "nvidia10"]);
    }
}
