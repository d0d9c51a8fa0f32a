//! The Docket node agent.
//!
//! - [`world`]: the job's output files and environment (Slurm's and PBS's variables).
//! - [`runner`]: runs on this node — launch as the user, walltime, suspend/resume, kill,
//!   epochs, simulated runs.
//! - [`session`]: the leader: registration, instructions, heartbeats, reports, the fence.
//!
//! - [`cgroup`]: confinement on cgroup v2 and v1 hosts (cpuset, memory, vmem, pids, freezer).
//! - [`launcher`]: the single-threaded process that forks each run's monitor.
//! - [`shim`]: the job's first process, which joins the cgroups and becomes the user.
//! - [`rootdir`]: the agent's private directories, used only through their handles.
//! - [`runtimedir`]: the runs' records and the jobs' scripts, on a tmpfs of the agent's own.
//!
//! - [`jobfs`]: each job's size-capped scratch mount.
//!
//! - [`crash`]: named points where a fault drill can make the agent crash.

pub mod cgroup;
pub mod crash;
pub mod devices;
pub mod gpu;
pub mod jobfs;
pub mod launcher;
pub mod lend;
pub mod lifecycle;
pub mod rootdir;
pub mod runner;
pub mod runtimedir;
pub mod session;
pub mod shim;
pub mod statefile;
pub mod steps;
pub mod world;
