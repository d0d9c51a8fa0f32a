//! The scheduler configuration that is part of replicated state.
//!
//! It lives in the Raft log (changed by [`Command::SetConfig`](crate::command::Command)), not
//! in each replica's file, so every replica applies every command under the same rules.

use serde::{Deserialize, Serialize};

use crate::fairshare::FairshareAlgorithm;
use crate::ids::QosName;
use crate::quantity::{MiB, Seconds};

/// Maui's per-user queue policy (HPC2N's Maui scheduling policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePolicy {
    /// Most jobs a user may have in the idle (eligible) part; the rest are blocked.
    pub max_idle_jobs_per_user: Option<u32>,
    /// Most jobs a user may have running plus idle.
    pub max_jobs_per_user: Option<u32>,
    /// Default MAXPS soft limit in processor-seconds (accounts may override).
    pub maxps_soft: Option<u64>,
    /// Default MAXPS hard limit in processor-seconds.
    pub maxps_hard: Option<u64>,
    /// Which blocked job moves up when an idle slot frees.
    pub promotion: Promotion,
}

/// The order in which blocked jobs are promoted to idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Promotion {
    /// The newest blocked job first, as HPC2N's policy page states.
    Newest,
    /// The oldest blocked job first.
    Oldest,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            max_idle_jobs_per_user: None,
            max_jobs_per_user: None,
            maxps_soft: None,
            maxps_hard: None,
            promotion: Promotion::Newest,
        }
    }
}

impl QueuePolicy {
    /// HPC2N's published policy: 8 idle, 72 total, MAXPS 72,000 / 1,080,000 s.
    pub fn hpc2n() -> QueuePolicy {
        QueuePolicy {
            max_idle_jobs_per_user: Some(8),
            max_jobs_per_user: Some(72),
            maxps_soft: Some(72_000),
            maxps_hard: Some(1_080_000),
            promotion: Promotion::Newest,
        }
    }
}

/// How usage is turned into fair-share factors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FairshareConfig {
    pub algorithm: FairshareAlgorithm,
    /// Usage halves every this long (Slurm's PriorityDecayHalfLife; Flux and IT4I: a week).
    /// Zero: no decay.
    pub half_life: Seconds,
}

impl Default for FairshareConfig {
    fn default() -> Self {
        FairshareConfig {
            algorithm: FairshareAlgorithm::FairTree,
            half_life: Seconds::days(7),
        }
    }
}

/// How jobs within one partition are ordered for consideration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueOrdering {
    /// By priority (the formula), then submit time, then id.
    Priority,
    /// NCI's shuffle for equal access: by the cpus of everything the same owner has ahead.
    Shuffle(ShuffleBy),
}

/// Whose jobs count as "the same owner" when shuffling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShuffleBy {
    User,
    Project,
}

/// How backfill protects the jobs ahead of a backfilled one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackfillMode {
    /// No backfill: the main pass only (strict priority order, FCFS under basic priority).
    Off,
    /// EASY: only the first job that cannot start (per partition) gets a reservation.
    Easy,
    /// Conservative: every job considered, up to `reservation_depth`, gets a reservation.
    Conservative,
}

/// The order backfill tries its candidates in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackfillOrder {
    /// The order of consideration (priority), as Slurm's backfill.
    #[default]
    Queue,
    /// Shortest expected run time first (Tsafrir et al.'s SJBF): more, shorter jobs fit in
    /// the holes before each reservation. Applies to EASY; conservative backfill reserves
    /// in queue order.
    Shortest,
}

/// The limits of the scheduling passes, in Slurm's `SchedulerParameters` vocabulary. Zero
/// means unlimited wherever Slurm says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedParams {
    /// Jobs the direct pass (on submission) considers (Slurm's default 100; GWDG 500).
    pub default_queue_depth: u32,
    /// Jobs per partition the main pass considers (0 = unlimited; GWDG 100).
    pub partition_job_depth: u32,
    pub backfill: BackfillMode,
    /// Conservative backfill: how many jobs get reservations (0 = unlimited).
    pub reservation_depth: u32,
    /// How far ahead backfill plans (Slurm's bf_window, default 1 day; GWDG 2 days).
    pub bf_window: Seconds,
    /// The granularity of backfill's time slots (bf_resolution, default 60 s).
    pub bf_resolution: Seconds,
    /// Jobs backfill considers per pass (bf_max_job_test, default 500; GWDG 2000).
    pub bf_max_job_test: u32,
    /// Jobs backfill considers per user (bf_max_job_user; 0 = unlimited; GWDG 15).
    pub bf_max_job_user: u32,
    /// Jobs backfill considers per partition (bf_max_job_part; 0 = unlimited; GWDG 200).
    pub bf_max_job_part: u32,
    /// After a yield during which the state changed, backfill goes on with the rest of its
    /// order rather than ending the cycle (the next cycle starts over from the top).
    pub bf_continue: bool,
    /// The order backfill tries the jobs behind each partition's first blocked job in:
    /// the queue's, or shortest expected run time first (EASY++'s SJBF).
    pub bf_order: BackfillOrder,
    /// What the planners take a job's run time to be: its limit, or a prediction.
    pub runtime_predictor: crate::predict::RuntimePredictor,
    /// Jobs eligible this long are considered before every other job (after preemptors,
    /// advance-reservation jobs and higher tiers), longest eligible first, whatever their
    /// priority: the bound on starvation under orders that favour short jobs
    /// (`None` = no bound beyond the formula's own age factor).
    pub starvation_wait: Option<Seconds>,
    /// When and for how long the leader runs the passes.
    pub loops: LoopParams,
}

/// The leader's scheduling loops, in Slurm's `SchedulerParameters` vocabulary. The core
/// never reads a clock: these are carried in the replicated config so every replica that
/// becomes leader runs the same loops, and the controller reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopParams {
    /// The main pass runs this often (sched_interval, default 60 s).
    pub sched_interval: Seconds,
    /// ... for at most this long (max_sched_time, default 2 s).
    pub max_sched_time: Seconds,
    /// The backfill pass runs this often (bf_interval, default 30 s).
    pub bf_interval: Seconds,
    /// ... for at most this long in all, yields included (bf_max_time, default bf_interval).
    pub bf_max_time: Seconds,
    /// Backfill yields locks after this long (bf_yield_interval, default 2 s) ...
    pub bf_yield_interval_us: u64,
    /// ... for this long (bf_yield_sleep, default 0.5 s).
    pub bf_yield_sleep_us: u64,
    /// Loops yield while more RPCs than this are in flight (max_rpc_cnt; 0 = never).
    pub max_rpc_cnt: u32,
}

impl Default for LoopParams {
    fn default() -> Self {
        LoopParams {
            sched_interval: Seconds(60),
            max_sched_time: Seconds(2),
            bf_interval: Seconds(30),
            bf_max_time: Seconds(30),
            bf_yield_interval_us: 2_000_000,
            bf_yield_sleep_us: 500_000,
            max_rpc_cnt: 0,
        }
    }
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams {
            default_queue_depth: 100,
            partition_job_depth: 0,
            backfill: BackfillMode::Easy,
            reservation_depth: 0,
            bf_window: Seconds::days(1),
            bf_resolution: Seconds(60),
            bf_max_job_test: 500,
            bf_max_job_user: 0,
            bf_max_job_part: 0,
            bf_continue: false,
            bf_order: BackfillOrder::Queue,
            runtime_predictor: crate::predict::RuntimePredictor::TimeLimit,
            starvation_wait: None,
            loops: LoopParams::default(),
        }
    }
}

impl SchedParams {
    /// GWDG's settings (GWDG's Slurm documentation).
    pub fn gwdg() -> SchedParams {
        SchedParams {
            default_queue_depth: 500,
            partition_job_depth: 100,
            bf_window: Seconds::minutes(2880),
            bf_max_job_test: 2000,
            bf_max_job_user: 15,
            bf_max_job_part: 200,
            ..SchedParams::default()
        }
    }

    /// No depth limit and one-second slots: the textbook algorithms, as `docket sim` tests.
    pub fn unlimited(backfill: BackfillMode) -> SchedParams {
        SchedParams {
            default_queue_depth: 0,
            partition_job_depth: 0,
            backfill,
            reservation_depth: 0,
            bf_window: Seconds(u64::MAX / 4),
            bf_resolution: Seconds(1),
            bf_max_job_test: 0,
            bf_max_job_user: 0,
            bf_max_job_part: 0,
            bf_continue: true,
            ..SchedParams::default()
        }
    }
}

/// What users may see of other users' work (Slurm's `PrivateData`). Off by default, as in
/// Slurm; admins, and coordinators for their accounts, always see everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrivateData {
    /// Queue listings, job details and priorities (`squeue`, `scontrol show job`, `sprio`)
    /// show a user only their own jobs. As in Slurm, this covers accounting too.
    pub jobs: bool,
    /// Accounting records (`sacct`) show a user only their own jobs.
    pub accounting: bool,
    /// Fair-share usage (`sshare`) shows a user only their own rows and the accounts above
    /// them.
    pub usage: bool,
}

/// Caps that keep one user from exhausting a replica's memory with queued work. Admins
/// (and root) are exempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCaps {
    /// Most job records a user may have queued or running (`MaxSubmitJobsPerUser`; an array
    /// is one record until its tasks start).
    pub max_jobs: Option<u32>,
    /// Most bytes of distinct scripts and environments a user's queued jobs may hold
    /// (`MaxScriptBytesPerUser`).
    pub max_script_bytes: Option<u64>,
}

impl Default for UserCaps {
    fn default() -> Self {
        UserCaps {
            max_jobs: Some(10_000),
            max_script_bytes: Some(256 << 20),
        }
    }
}

/// Replicated scheduler configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedConfig {
    /// Array indexes run from 0 to MaxArraySize - 1 (Slurm's default 1001).
    pub max_array_size: u32,
    /// Most jobs (records) the queue holds; submissions beyond are refused.
    pub max_job_count: u64,
    /// Most jobs one submission command may carry.
    pub max_batch: u32,
    /// Jobfs per node when a job does not ask: none by default, as in Slurm; NCI sets 100 MB
    /// (`DefaultJobfs`).
    pub default_jobfs: MiB,
    /// A walltime no job may exceed, whatever its partition (HPC2N: 5 days).
    pub max_walltime: Option<Seconds>,
    /// The QOS of jobs that name none and whose partition has no default.
    pub default_qos: QosName,
    /// The largest script or environment blob accepted, in bytes.
    pub max_blob_bytes: u64,
    pub queue_policy: QueuePolicy,
    /// Finished jobs leave the queue this long after they end (Slurm's MinJobAge), unless a
    /// live job's dependency still names them.
    pub min_job_age: Seconds,
    pub fairshare: FairshareConfig,
    pub priority: crate::priority::PriorityConfig,
    pub queue_ordering: QueueOrdering,
    /// Jobs of a project whose grant is spent run in this QOS, uncharged (NCI's bonus). With
    /// none set, they wait (AccountGrantExhausted).
    pub bonus_qos: Option<QosName>,
    /// The passes' limits.
    pub sched: SchedParams,
    /// Preemption (priority-run and parallel-run).
    pub preempt: crate::preempt::PreemptConfig,
    /// What users may see of each other's work.
    pub private_data: PrivateData,
    /// Per-user caps on queued work.
    pub user_caps: UserCaps,
    /// How long the accounting archive keeps finished jobs, and what it does with them
    /// before it lets them go.
    pub retention: Retention,
}

/// How long the accounting archive keeps a finished job (slurmdbd's `PurgeJobAfter`,
/// `ArchiveJobs`). By default forever: records leave only by an operator's setting. The
/// expiry is decided here, on the replicated clock at a tick, so every replica drops the same
/// records at the same log position and exports the same file first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Records of jobs that ended longer ago than this leave the archive. `None`: kept.
    pub purge_job_after: Option<Seconds>,
    /// Whether expiring records are written to an export file first (on every replica).
    pub archive_jobs: bool,
    pub archive_format: ArchiveFormat,
}

/// The format of the files expiring records are exported to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArchiveFormat {
    /// One line per job with a header, `sacct -P`'s fields and separator.
    #[default]
    Csv,
    /// The Standard Workload Format of the Parallel Workloads Archive, for replays.
    Swf,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            max_array_size: 1001,
            max_job_count: 1_000_000,
            max_batch: 100_000,
            default_jobfs: MiB(0),
            max_walltime: None,
            default_qos: match "normal".parse() {
                Ok(q) => q,
                Err(_) => unreachable!("`normal` is a valid QOS name"),
            },
            max_blob_bytes: 4 << 20,
            queue_policy: QueuePolicy::default(),
            min_job_age: Seconds(300),
            fairshare: FairshareConfig::default(),
            priority: crate::priority::PriorityConfig::default(),
            queue_ordering: QueueOrdering::Priority,
            bonus_qos: None,
            sched: SchedParams::default(),
            preempt: crate::preempt::PreemptConfig::default(),
            private_data: PrivateData::default(),
            user_caps: UserCaps::default(),
            retention: Retention::default(),
        }
    }
}
