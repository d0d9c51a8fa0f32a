//! What a user asks for when submitting a job.
//!
//! A [`JobSpec`] is the validated, defaults-not-yet-applied request: the options of `sbatch`
//! or `qsub` after the CLI parsed them. Defaults (partition, account, QOS, time limit, memory)
//! are resolved by apply against the replicated configuration, so every replica resolves
//! them the same way. Large opaque inputs (the script, the environment) are not stored here:
//! they are content-addressed blobs ([`BlobId`]) kept once in state however many jobs or
//! array tasks share them.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use crate::ids::{AccountName, NodeName, PartitionName, QosName, UserName};
use crate::job::array::ArraySpec;
use crate::job::dependency::Dependency;
use crate::quantity::{MiB, Seconds, TimeMs};

/// The content hash (SHA-256) of a blob (script or environment) held in state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlobId(pub [u8; 32]);

impl BlobId {
    /// The id of `data`: its SHA-256.
    pub fn of(data: &[u8]) -> BlobId {
        use sha2::Digest;
        BlobId(sha2::Sha256::digest(data).into())
    }
}

impl std::fmt::Display for BlobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// How much memory a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryRequest {
    /// `--mem=N`: per node.
    PerNode(MiB),
    /// `--mem-per-cpu=N`.
    PerCpu(MiB),
    /// `--mem=0`: all the memory of every node it gets.
    WholeNode,
}

/// How long a job may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimeRequest {
    /// No `-t`: the partition's DefaultTime.
    Default,
    /// `-t 0`: no limit of its own; the partition's MaxTime applies.
    Unlimited,
    /// `-t D-HH:MM:SS`.
    Limit(Seconds),
}

/// The signal to send before the time limit (`--signal=[B:]SIG[@secs]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WarnSignal {
    pub signal: i32,
    pub before: Seconds,
    /// `B:`: the batch shell only, not every step.
    pub batch_only: bool,
}

/// A submission, as parsed from the command line and directives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// `-J`. Text fields are [`SmolStr`]s: short ones (most) need no allocation of their own.
    pub name: SmolStr,
    /// Who runs it (authenticated by the controller, not claimed by the client).
    pub user: UserName,
    /// `-A`; `None` = the user's default account.
    pub account: Option<AccountName>,
    /// `-p`; `None` = the default partition.
    pub partition: Option<PartitionName>,
    /// `-q`; `None` = the partition's or association's default QOS.
    pub qos: Option<QosName>,
    /// `-N`: nodes (minimum; Docket allocates exactly this many).
    pub nodes: u32,
    /// `-n`: tasks.
    pub ntasks: u32,
    /// `-c`: cpus per task.
    pub cpus_per_task: u32,
    /// `--ntasks-per-node`.
    pub ntasks_per_node: Option<u32>,
    /// `--mem` / `--mem-per-cpu`; `None` = the partition's DefMemPerCPU.
    pub memory: Option<MemoryRequest>,
    /// Virtual memory (memory + swap, and RLIMIT_AS when `address_space_limit`), per node.
    pub vmem: Option<MiB>,
    /// Also cap the address space of every process (RLIMIT_AS) at `vmem`.
    pub address_space_limit: bool,
    /// GPUs per node (`--gpus-per-node`, `--gres=gpu:N`, PBS `ngpus=`); 0 = none.
    pub gpus_per_node: u32,
    /// Scratch space per node (`-l jobfs=`); `None` = the configured default.
    pub jobfs: Option<MiB>,
    /// `-t`.
    pub time: TimeRequest,
    /// `--nice`: subtracted from priority; negative only for admins.
    pub nice: i32,
    /// Flux's user factor in percent: the owner may lower priority, never raise it.
    pub user_factor_pct: u8,
    /// `-a`.
    pub array: Option<ArraySpec>,
    /// `-d`.
    pub dependency: Option<Dependency>,
    /// `--begin`.
    pub begin: Option<TimeMs>,
    /// `-H`: submit held.
    pub hold: bool,
    /// `--requeue`: requeue instead of failing on node failure or preemption.
    pub requeue: bool,
    /// `--exclusive`: whole nodes.
    pub exclusive: bool,
    /// `-C`: node features required (all of them).
    pub features: BTreeSet<String>,
    /// `-w`: these nodes must be part of the allocation.
    pub nodelist: BTreeSet<NodeName>,
    /// `-x`: never these nodes.
    pub exclude: BTreeSet<NodeName>,
    /// `-D`.
    pub work_dir: SmolStr,
    /// `-o`; `None` = `slurm-%j.out` (`slurm-%A_%a.out` for arrays).
    pub stdout: Option<SmolStr>,
    /// `-e`; `None` = same as stdout.
    pub stderr: Option<SmolStr>,
    /// The batch script.
    pub script: BlobId,
    /// The environment to export (`--export`), if any.
    pub env: Option<BlobId>,
    /// `--signal`.
    pub signal: Option<WarnSignal>,
    /// `--reservation`: run inside this advance reservation.
    pub reservation: Option<crate::ids::ReservationName>,
    /// An interactive allocation (`salloc`, `srun` outside a job, `qsub -I`): its script
    /// only holds the allocation while its owner's commands run as steps, so accounting
    /// shows no `batch` step for it.
    pub interactive: bool,
    /// `--comment`: free text for the owner and the site's tools, shown by `squeue %k`,
    /// `scontrol show job` and `sacct --format Comment`. At most [`MAX_COMMENT`] bytes.
    #[serde(
        deserialize_with = "crate::layout::since_v2",
        skip_serializing_if = "crate::layout::before_v2",
        default
    )]
    pub comment: Option<SmolStr>,
}

/// The longest comment a job may carry, in bytes (Slurm stores comments as unbounded text;
/// a bound keeps every job's record small).
pub const MAX_COMMENT: usize = 1024;

impl JobSpec {
    /// A minimal one-task job, as tests and benchmarks need by the thousand.
    pub fn simple(user: UserName, script: BlobId) -> JobSpec {
        JobSpec {
            name: SmolStr::new_static("job"),
            user,
            account: None,
            partition: None,
            qos: None,
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            ntasks_per_node: None,
            memory: None,
            vmem: None,
            address_space_limit: false,
            gpus_per_node: 0,
            jobfs: None,
            time: TimeRequest::Default,
            nice: 0,
            user_factor_pct: 100,
            array: None,
            dependency: None,
            begin: None,
            hold: false,
            requeue: false,
            exclusive: false,
            features: BTreeSet::new(),
            nodelist: BTreeSet::new(),
            exclude: BTreeSet::new(),
            work_dir: SmolStr::new_static("/"),
            stdout: None,
            stderr: None,
            script,
            env: None,
            signal: None,
            reservation: None,
            interactive: false,
            comment: None,
        }
    }

    /// Total cpus: tasks x cpus per task.
    pub fn cpus(&self) -> u64 {
        u64::from(self.ntasks) * u64::from(self.cpus_per_task)
    }
}
