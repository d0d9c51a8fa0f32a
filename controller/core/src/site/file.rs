//! The TOML file as written, before validation: every key an admin may set, named as Slurm
//! (or, for Maui's and NCI's policies, as those sites) name them. Unknown keys are refused,
//! so a misspelt `bf_windw` is an error naming the allowed keys, not a silent default.

use serde::Deserialize;

/// A duration: a Slurm time string (`2-00:00:00`, `UNLIMITED`) or a whole number of minutes,
/// as Slurm reads a bare number in `MaxTime`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawDuration {
    Minutes(u64),
    Text(String),
}

/// A size: a string with a unit (`4G`) or a whole number of MiB, as Slurm's `RealMemory`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawSize {
    MiB(u64),
    Text(String),
}

/// Maui's MAXPS: `soft` or `[soft, hard]` processor-seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawMaxPs {
    One(u64),
    Pair(Vec<u64>),
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawArchiveFormat {
    Csv,
    Swf,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub enum RawSchedulerType {
    #[serde(rename = "sched/backfill")]
    Backfill,
    #[serde(rename = "sched/builtin")]
    Builtin,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub enum RawPriorityType {
    #[serde(rename = "priority/multifactor")]
    Multifactor,
    #[serde(rename = "priority/basic")]
    Basic,
    #[serde(rename = "priority/flux")]
    Flux,
    #[serde(rename = "priority/it4i")]
    It4i,
    #[serde(rename = "priority/maui")]
    Maui,
    /// Docket: by expected run time (`[PriorityRuntime] Order`).
    #[serde(rename = "priority/runtime")]
    Runtime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum RawPriorityFlag {
    /// Classic fair-share instead of Fair Tree.
    #[serde(rename = "NO_FAIR_TREE")]
    NoFairTree,
    /// Bill the largest weighted resource instead of the sum, in every partition.
    #[serde(rename = "MAX_TRES")]
    MaxTres,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawQueueOrdering {
    Priority,
    ShuffleUser,
    ShuffleProject,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawBackfillMode {
    Easy,
    Conservative,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawBackfillOrder {
    Queue,
    Shortest,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawRuntimePredictor {
    TimeLimit,
    RecentAverage,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawRuntimeOrder {
    Shortest,
    Xfactor,
    F1,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct RawPriorityRuntime {
    pub order: RawRuntimeOrder,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawPromotion {
    Newest,
    Oldest,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub enum RawPreemptMode {
    #[serde(rename = "OFF")]
    Off,
    #[serde(rename = "SUSPEND")]
    Suspend,
    #[serde(rename = "REQUEUE")]
    Requeue,
    #[serde(rename = "CANCEL")]
    Cancel,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub enum RawPartitionState {
    #[serde(rename = "UP")]
    Up,
    #[serde(rename = "DOWN")]
    Down,
}

/// Slurm's `PrivateData` values Docket honours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawPrivateData {
    Jobs,
    Accounting,
    Usage,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub enum RawAdminLevel {
    None,
    Operator,
    Administrator,
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct RawFile {
    /// The daemon's own settings (listen addresses, data directory, peers): read by
    /// docket-controller, not replicated, ignored by `docket sim`.
    #[serde(rename = "controller")]
    pub controller: Option<toml::Table>,
    /// How `docket sim` maps SWF fields; ignored by the controller.
    #[serde(rename = "sim")]
    pub sim: Option<toml::Table>,

    pub cluster_name: Option<String>,
    pub max_array_size: Option<u32>,
    pub max_job_count: Option<u64>,
    pub max_submit_batch: Option<u32>,
    /// Seconds, as Slurm.
    pub min_job_age: Option<u64>,
    /// How long the accounting archive keeps a finished job, as slurmdbd's `PurgeJobAfter`
    /// (`12months`, `90days`, `720hours`); absent: forever.
    pub purge_job_after: Option<String>,
    /// Export expiring records before they leave (slurmdbd's `ArchiveJobs`); default yes.
    pub archive_jobs: Option<bool>,
    /// `csv` (default) or `swf`.
    pub archive_format: Option<RawArchiveFormat>,
    pub default_jobfs: Option<RawSize>,
    pub max_wall_time: Option<RawDuration>,
    #[serde(rename = "DefaultQOS")]
    pub default_qos: Option<String>,
    #[serde(rename = "BonusQOS")]
    pub bonus_qos: Option<String>,
    pub max_blob_size: Option<RawSize>,
    pub queue_ordering: Option<RawQueueOrdering>,
    /// `["jobs", "accounting", "usage"]`: what users may not see of each other's.
    pub private_data: Option<Vec<RawPrivateData>>,
    /// Job records one user may have queued or running; 0 for no cap (admins exempt).
    pub max_submit_jobs_per_user: Option<u32>,
    /// Bytes of distinct scripts and environments one user's queued jobs may hold; 0 for no
    /// cap (admins exempt).
    pub max_script_bytes_per_user: Option<RawSize>,

    pub scheduler_type: Option<RawSchedulerType>,
    pub scheduler_parameters: Option<RawSchedParams>,

    pub priority_type: Option<RawPriorityType>,
    pub priority_flags: Option<Vec<RawPriorityFlag>>,
    pub priority_decay_half_life: Option<RawDuration>,
    pub priority_max_age: Option<RawDuration>,
    pub priority_favor_small: Option<bool>,
    pub priority_weight_age: Option<u32>,
    pub priority_weight_assoc: Option<u32>,
    pub priority_weight_fairshare: Option<u32>,
    pub priority_weight_job_size: Option<u32>,
    pub priority_weight_partition: Option<u32>,
    #[serde(rename = "PriorityWeightQOS")]
    pub priority_weight_qos: Option<u32>,
    /// `"CPU=1000,Mem=2000"`.
    #[serde(rename = "PriorityWeightTRES")]
    pub priority_weight_tres: Option<String>,
    pub priority_flux: Option<RawFlux>,
    #[serde(rename = "PriorityIT4I")]
    pub priority_it4i: Option<RawIt4i>,
    pub priority_maui: Option<RawMaui>,
    pub priority_runtime: Option<RawPriorityRuntime>,

    pub queue_policy: Option<RawQueuePolicy>,
    pub preempt_parallel_run: Option<RawParallelRun>,

    #[serde(rename = "nodes", default)]
    pub nodes: Vec<RawNode>,
    #[serde(rename = "partitions", default)]
    pub partitions: Vec<RawPartition>,
    #[serde(rename = "qos", default)]
    pub qos: Vec<RawQos>,
    #[serde(rename = "accounts", default)]
    pub accounts: Vec<RawAccount>,
    #[serde(rename = "users", default)]
    pub users: Vec<RawUser>,
}

/// Slurm's `SchedulerParameters`, one key per option, in Slurm's units (bf_window in
/// minutes, the yield interval and sleep in microseconds, the rest in seconds).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSchedParams {
    pub default_queue_depth: Option<u32>,
    pub partition_job_depth: Option<u32>,
    pub sched_interval: Option<u64>,
    pub max_sched_time: Option<u64>,
    pub max_rpc_cnt: Option<u32>,
    pub bf_interval: Option<u64>,
    pub bf_max_time: Option<u64>,
    pub bf_yield_interval: Option<u64>,
    pub bf_yield_sleep: Option<u64>,
    pub bf_window: Option<u64>,
    pub bf_resolution: Option<u64>,
    pub bf_max_job_test: Option<u32>,
    pub bf_max_job_user: Option<u32>,
    pub bf_max_job_part: Option<u32>,
    pub bf_continue: Option<bool>,
    /// Docket: `easy` (one reservation per partition) or `conservative`.
    pub bf_mode: Option<RawBackfillMode>,
    /// Docket: how many jobs conservative backfill reserves for (0 = all it considers).
    pub bf_reservation_depth: Option<u32>,
    /// Docket: `queue` or `shortest` (EASY++'s shortest-predicted-first backfill).
    pub bf_order: Option<RawBackfillOrder>,
    /// Docket: `time_limit` or `recent_average` (EASY++'s runtime predictions).
    pub runtime_predictor: Option<RawRuntimePredictor>,
    /// Docket: seconds a job may be eligible before it goes ahead of every other job.
    pub starvation_wait: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct RawFlux {
    pub max_wait: Option<RawDuration>,
    pub weight_wait: Option<u32>,
    pub weight_fairshare: Option<u32>,
    pub weight_qos: Option<u32>,
    pub weight_queue: Option<u32>,
    pub weight_job_size: Option<u32>,
    pub weight_user: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct RawIt4i {
    pub max_fairshare: Option<u64>,
    pub eligible_time_span: Option<RawDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct RawMaui {
    pub weight_queue_time: Option<u32>,
    #[serde(rename = "WeightXFactor")]
    pub weight_xfactor: Option<u32>,
    pub weight_resources: Option<u32>,
    pub weight_bypass: Option<u32>,
    #[serde(rename = "WeightQOS")]
    pub weight_qos: Option<u32>,
    pub weight_target_queue_time: Option<u32>,
    pub weight_fairshare: Option<u32>,
    pub max_queue_time: Option<RawDuration>,
    #[serde(rename = "MaxXFactor")]
    pub max_xfactor: Option<u32>,
    pub max_bypass: Option<u32>,
}

/// Maui's `USERCFG[DEFAULT]` (HPC2N).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueuePolicy {
    #[serde(rename = "MAXIJOB")]
    pub max_idle_jobs: Option<u32>,
    #[serde(rename = "MAXJOB")]
    pub max_jobs: Option<u32>,
    #[serde(rename = "MAXPS")]
    pub max_ps: Option<RawMaxPs>,
    #[serde(rename = "Promotion")]
    pub promotion: Option<RawPromotion>,
}

/// NCI's parallel-run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct RawParallelRun {
    pub min_size_ratio: Option<u32>,
    pub max_expansion: Option<f64>,
    pub weight_expansion: Option<f64>,
    pub weight_done: Option<f64>,
    pub weight_running: Option<f64>,
    pub weight_wait: Option<f64>,
    pub weight_bypass: Option<f64>,
}

/// `NodeName=n[001-004] CPUs=16 RealMemory=64000 TmpDisk=100000 Gres=gpu:4 Features=...`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNode {
    #[serde(rename = "NodeName")]
    pub name: String,
    #[serde(rename = "CPUs")]
    pub cpus: u32,
    #[serde(rename = "RealMemory")]
    pub real_memory: RawSize,
    /// Local scratch for jobfs.
    #[serde(rename = "TmpDisk")]
    pub tmp_disk: Option<RawSize>,
    /// `gpu:N`.
    #[serde(rename = "Gres")]
    pub gres: Option<String>,
    #[serde(rename = "Features", default)]
    pub features: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartition {
    #[serde(rename = "PartitionName")]
    pub name: String,
    /// A hostlist, or `ALL`.
    #[serde(rename = "Nodes")]
    pub nodes: String,
    #[serde(rename = "Default", default)]
    pub default: bool,
    #[serde(rename = "State")]
    pub state: Option<RawPartitionState>,
    #[serde(rename = "PriorityTier")]
    pub priority_tier: Option<u32>,
    #[serde(rename = "PriorityJobFactor")]
    pub priority_job_factor: Option<u32>,
    #[serde(rename = "DefaultTime")]
    pub default_time: Option<RawDuration>,
    #[serde(rename = "MaxTime")]
    pub max_time: Option<RawDuration>,
    #[serde(rename = "MaxNodes")]
    pub max_nodes: Option<u32>,
    #[serde(rename = "DefMemPerCPU")]
    pub def_mem_per_cpu: Option<RawSize>,
    #[serde(rename = "PreemptMode")]
    pub preempt_mode: Option<RawPreemptMode>,
    /// NCI: service units per cpu-hour.
    #[serde(rename = "ChargeRate")]
    pub charge_rate: Option<f64>,
    /// Multiplier on fair-share usage (0 = uncharged, IT4I's qexp).
    #[serde(rename = "UsageFactor")]
    pub usage_factor: Option<f64>,
    /// `"CPU=1.0,Mem=0.25G,GRES/gpu=2.0"`.
    #[serde(rename = "TRESBillingWeights")]
    pub tres_billing_weights: Option<String>,
    #[serde(rename = "AllowQos")]
    pub allow_qos: Option<Vec<String>>,
    #[serde(rename = "AllowAccounts")]
    pub allow_accounts: Option<Vec<String>>,
    /// The QOS of jobs that name none.
    #[serde(rename = "QOS")]
    pub qos: Option<String>,
    #[serde(rename = "MaxJobsPerUser")]
    pub max_jobs_per_user: Option<u32>,
    #[serde(rename = "MaxSubmitJobsPerUser")]
    pub max_submit_jobs_per_user: Option<u32>,
    /// `"cpu=N"`.
    #[serde(rename = "MaxTRESPerUser")]
    pub max_tres_per_user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQos {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Priority")]
    pub priority: Option<u32>,
    #[serde(rename = "Preempt", default)]
    pub preempt: Vec<String>,
    #[serde(rename = "PreemptMode")]
    pub preempt_mode: Option<RawPreemptMode>,
    #[serde(rename = "UsageFactor")]
    pub usage_factor: Option<f64>,
    /// Maui's QTTARGET.
    #[serde(rename = "TargetQueueTime")]
    pub target_queue_time: Option<RawDuration>,
    #[serde(rename = "MaxWall")]
    pub max_wall: Option<RawDuration>,
    #[serde(rename = "MaxJobsPerUser")]
    pub max_jobs_per_user: Option<u32>,
    #[serde(rename = "MaxSubmitJobsPerUser")]
    pub max_submit_jobs_per_user: Option<u32>,
    #[serde(rename = "MaxTRESPerUser")]
    pub max_tres_per_user: Option<String>,
    #[serde(rename = "GrpJobs")]
    pub grp_jobs: Option<u32>,
    #[serde(rename = "GrpTRES")]
    pub grp_tres: Option<String>,
    #[serde(rename = "GrpTRESRunMins")]
    pub grp_tres_run_mins: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccount {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Parent")]
    pub parent: Option<String>,
    #[serde(rename = "Fairshare")]
    pub fairshare: Option<u32>,
    #[serde(rename = "MaxJobs")]
    pub max_jobs: Option<u32>,
    #[serde(rename = "GrpTRESRunMins")]
    pub grp_tres_run_mins: Option<String>,
    #[serde(rename = "MAXPS")]
    pub max_ps: Option<RawMaxPs>,
    /// NCI: the project's grant in service units.
    #[serde(rename = "GrantSU")]
    pub grant_su: Option<f64>,
    /// Users who may act on this account's jobs (Slurm's account coordinators).
    #[serde(rename = "Coordinators", default)]
    pub coordinators: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUser {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "DefaultAccount")]
    pub default_account: String,
    /// Every account the user may charge; the default account is always one.
    #[serde(rename = "Accounts", default)]
    pub accounts: Vec<String>,
    #[serde(rename = "Fairshare")]
    pub fairshare: Option<u32>,
    #[serde(rename = "Priority")]
    pub priority: Option<u32>,
    #[serde(rename = "AdminLevel")]
    pub admin_level: Option<RawAdminLevel>,
    #[serde(rename = "MaxJobs")]
    pub max_jobs: Option<u32>,
    #[serde(rename = "GrpTRESRunMins")]
    pub grp_tres_run_mins: Option<String>,
    #[serde(rename = "MAXPS")]
    pub max_ps: Option<RawMaxPs>,
}
