//! The Docket node agent.
//!
//! - [`world`]: the job's output files and environment (Slurm's and PBS's variables).
//! - [`runner`]: runs on this node — launch as the user, walltime, suspend/resume, kill,
//!   epochs, simulated runs.
//! - [`session`]: the leader: registration, instructions, heartbeats, reports, the fence.
//!
//! Confinement (cgroups, jobfs mounts) and re-adoption after an agent restart are the next
//! increment of this crate (issue 7).

pub mod runner;
pub mod session;
pub mod world;
