//! Job priority: one engine, several formulas, each factor normalized to [0, 1] and shown.
//!
//! Formulas (chosen by [`PriorityConfig`]):
//! - **Multifactor** (Slurm; GWDG's weights in [`Multifactor::gwdg`]): age (capped at
//!   PriorityMaxAge), association, fair-share, job size, partition, QOS, TRES (cpu, memory),
//!   each normalized and weighted, plus the raw site factor, minus nice.
//! - **Flux** (Flux's multi-factor priority plugin): wait time, fair-share, QOS, queue, job size and the user factor,
//!   which defaults to its maximum so a user can only lower their job's priority.
//! - **IT4I** (IT4I's job priority documentation): 1000 x queue_priority + fairshare / 1000 + eligible_time / 864000,
//!   with fairshare = MAX_FAIRSHARE x (1 - usage_project / usage_total).
//! - **Maui** (HPC2N's Maui scheduling policy): queued time, expansion factor, resources, bypass count, QOS, target
//!   queue time (growing exponentially as a job nears its QOS's target) and fair-share.
//! - **FCFS** (Slurm's priority/basic): every job 0; the order of consideration's tie-breaks
//!   (submit time, then id) make it first come, first served.
//! - **Runtime** ([`RuntimeOrder`]): shortest expected run time first, largest expansion
//!   factor first, or Carastan-Santos and de Camargo's F1 (SC'17), on the time limit or the
//!   runtime prediction (see [`crate::predict`]).
//!
//! Each formula is written once, as a function that reports each factor to a sink:
//! [`priority`] sums them without allocating (it runs for every pending job every pass) and
//! [`explain`] keeps them for `sprio`. Math that is not plain arithmetic uses `libm`, so the
//! same job gets the same priority on every replica and platform.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::config::{QueueOrdering, ShuffleBy};
use crate::fairshare::{self, FairShare};
use crate::ids::JobId;
use crate::ids::PartitionName;
use crate::job::{Job, JobState, Part};
use crate::quantity::{Seconds, TimeMs};
use crate::state::State;

/// Slurm multifactor weights (`PriorityWeight*`) and normalization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Multifactor {
    /// Age stops growing after this long (PriorityMaxAge).
    pub max_age: Seconds,
    pub weight_age: u32,
    pub weight_assoc: u32,
    pub weight_fairshare: u32,
    pub weight_job_size: u32,
    pub weight_partition: u32,
    pub weight_qos: u32,
    pub weight_tres_cpu: u32,
    pub weight_tres_mem: u32,
    /// PriorityFavorSmall: the job size factor favours small jobs instead of large ones.
    pub favor_small: bool,
}

impl Multifactor {
    /// GWDG's weights (GWDG's Slurm documentation): age 10,000 (max age 5 days), fair-share 100,000, job size
    /// 1,000, partition 1,000,000, QOS 10,000; association, site and TRES disabled.
    pub fn gwdg() -> Multifactor {
        Multifactor {
            max_age: Seconds::days(5),
            weight_age: 10_000,
            weight_assoc: 0,
            weight_fairshare: 100_000,
            weight_job_size: 1_000,
            weight_partition: 1_000_000,
            weight_qos: 10_000,
            weight_tres_cpu: 0,
            weight_tres_mem: 0,
            favor_small: false,
        }
    }
}

/// Flux's six weights.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flux {
    /// Wait time stops adding after this long.
    pub max_wait: Seconds,
    pub weight_wait: u32,
    pub weight_fairshare: u32,
    pub weight_qos: u32,
    pub weight_queue: u32,
    pub weight_job_size: u32,
    pub weight_user: u32,
}

/// IT4I's sort formula parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct It4i {
    /// MAX_FAIRSHARE (1E6).
    pub max_fairshare: u64,
    /// Eligible time is normalized against this span; the formula is exact below it.
    pub eligible_time_span: Seconds,
}

impl Default for It4i {
    fn default() -> Self {
        It4i {
            max_fairshare: 1_000_000,
            eligible_time_span: Seconds::days(100),
        }
    }
}

/// Maui's weights and normalization spans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maui {
    pub weight_queue_time: u32,
    pub weight_xfactor: u32,
    pub weight_resources: u32,
    pub weight_bypass: u32,
    pub weight_qos: u32,
    pub weight_target_queue_time: u32,
    pub weight_fairshare: u32,
    /// Queue time counts fully after this long.
    pub max_queue_time: Seconds,
    /// An expansion factor of this much counts fully.
    pub max_xfactor: u32,
    /// This many bypasses count fully.
    pub max_bypass: u32,
}

impl Maui {
    /// HPC2N: "weights currently biased towards fairshare target, the expansion factor and
    /// queuetime".
    pub fn hpc2n() -> Maui {
        Maui {
            weight_queue_time: 1_000,
            weight_xfactor: 1_000,
            weight_resources: 100,
            weight_bypass: 100,
            weight_qos: 100,
            weight_target_queue_time: 500,
            weight_fairshare: 2_000,
            max_queue_time: Seconds::days(5),
            max_xfactor: 10,
            max_bypass: 50,
        }
    }
}

/// Orders by expected run time (the time limit, or a prediction where the site predicts):
/// what the scheduling literature beats FCFS's slowdowns with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimeOrder {
    /// Shortest expected run time first (SJF): priority = -expected run time in seconds.
    ShortestFirst,
    /// Largest expansion factor first (LXF, Maui's XFACTOR alone): priority =
    /// (eligible wait + expected run time) / expected run time, the slowdown the job would
    /// have if it started now; short jobs gain fastest as they wait.
    LargestXfactor,
    /// Carastan-Santos and de Camargo's F1 (SC'17), learned under EASY to minimize bounded
    /// slowdown: score = log10(r) x n + 870 x log10(s), lowest first, with r the expected
    /// run time, n the cpus and s the submit time in seconds. Their s counts from the
    /// trace's start, as a replay's clock does; on a live cluster's clock (from 1970) the
    /// second term barely differs between jobs, so F1 becomes smallest log-area first and
    /// `starvation_wait` should bound the wait.
    F1,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PriorityFormula {
    Fcfs,
    Multifactor(Multifactor),
    Flux(Flux),
    It4i(It4i),
    Maui(Maui),
    Runtime(RuntimeOrder),
}

impl PriorityFormula {
    /// The formula's name, as `PriorityType` spells it without `priority/` (and the order
    /// for `runtime`): what `sprio --json` reports.
    pub fn name(&self) -> &'static str {
        match self {
            PriorityFormula::Fcfs => "basic",
            PriorityFormula::Multifactor(_) => "multifactor",
            PriorityFormula::Flux(_) => "flux",
            PriorityFormula::It4i(_) => "it4i",
            PriorityFormula::Maui(_) => "maui",
            PriorityFormula::Runtime(RuntimeOrder::ShortestFirst) => "runtime/shortest",
            PriorityFormula::Runtime(RuntimeOrder::LargestXfactor) => "runtime/xfactor",
            PriorityFormula::Runtime(RuntimeOrder::F1) => "runtime/f1",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorityConfig {
    pub formula: PriorityFormula,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig {
            formula: PriorityFormula::Multifactor(Multifactor::gwdg()),
        }
    }
}

/// What every priority in one pass shares: computed once, then read per job.
#[derive(Debug)]
pub struct PriorityInputs<'a> {
    pub state: &'a State,
    pub now: TimeMs,
    pub fairshare: FairShare<'a>,
    max_partition_factor: u32,
    max_qos_priority: u32,
    max_assoc_priority: u32,
    total_nodes: u64,
    total_cpus: u64,
    total_memory: u64,
    total_jobfs: u64,
    /// Does any QOS preempt? (Most sites: none, and no job's QOS need be looked up.)
    any_preemptor: bool,
    /// The one priority tier every partition has, if they all have the same.
    uniform_tier: Option<u32>,
}

impl State {
    /// Everything a priority pass needs, as of `now`.
    pub fn priority_inputs(&self, now: TimeMs) -> PriorityInputs<'_> {
        let usage = fairshare::Usage {
            ledger: &self.usage,
            now,
            half_life: self.config.fairshare.half_life,
        };
        let fairshare = match self.config.priority.formula {
            PriorityFormula::Fcfs | PriorityFormula::Runtime(_) => FairShare::unused(&self.assocs),
            _ => fairshare::compute(
                self.config.fairshare.algorithm,
                &self.accounts,
                &self.assocs,
                usage,
                false,
            ),
        };
        PriorityInputs {
            state: self,
            now,
            fairshare,
            max_partition_factor: self
                .partitions
                .values()
                .map(|p| p.priority_job_factor)
                .max()
                .unwrap_or(0),
            max_qos_priority: self.qos.values().map(|q| q.priority).max().unwrap_or(0),
            // A walk of every association: only the multifactor formula reads it.
            max_assoc_priority: match self.config.priority.formula {
                PriorityFormula::Multifactor(_) => self
                    .accounts
                    .accounts
                    .values()
                    .flat_map(|a| a.users.values().map(|u| u.priority))
                    .max()
                    .unwrap_or(0),
                _ => 0,
            },
            total_nodes: self.nodes.len() as u64,
            total_cpus: self.nodes.values().map(|n| u64::from(n.spec.cpus)).sum(),
            total_memory: self.nodes.values().map(|n| n.spec.memory.0).sum(),
            total_jobfs: self.nodes.values().map(|n| n.spec.jobfs.0).sum(),
            any_preemptor: self.qos.values().any(|q| !q.preempt.is_empty()),
            uniform_tier: {
                let mut tiers = self.partitions.values().map(|p| p.priority_tier);
                let first = tiers.next().unwrap_or(0);
                tiers.all(|t| t == first).then_some(first)
            },
        }
    }
}

/// One line of `sprio`: a factor's normalized value, its weight and what it adds.
#[derive(Debug, Clone, PartialEq)]
pub struct FactorLine {
    pub name: &'static str,
    pub value: f64,
    pub weight: f64,
    pub contribution: f64,
}

/// A job's priority and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub job: JobId,
    pub priority: f64,
    pub factors: Vec<FactorLine>,
}

fn ratio(x: f64, max: f64) -> f64 {
    if max <= 0.0 {
        0.0
    } else {
        (x / max).clamp(0.0, 1.0)
    }
}

/// Maui's target queue time factor: grows exponentially from 0 at submission to 1 at the
/// target, (e^(q/T) - 1) / (e - 1), and stays at 1 past it.
pub fn target_queue_factor(queued: Seconds, target: Seconds) -> f64 {
    if target.0 == 0 {
        return 0.0;
    }
    let x = (queued.0 as f64 / target.0 as f64).min(1.0);
    ((libm::exp(x) - 1.0) / (libm::exp(1.0) - 1.0)).clamp(0.0, 1.0)
}

/// Feeds every factor of `job` under the configured formula to `sink(name, value, weight)`.
/// Unless `full`, factors whose weight is zero are skipped without computing their value.
fn evaluate(
    inputs: &PriorityInputs<'_>,
    job: &Job,
    full: bool,
    out: &mut impl FnMut(&'static str, f64, f64),
) {
    let mut sink = |name: &'static str, value: &dyn Fn() -> f64, weight: f64| {
        if full || weight != 0.0 {
            out(name, value(), weight);
        }
    };
    let f = JobFactors::of(inputs, job);
    match &inputs.state.config.priority.formula {
        PriorityFormula::Fcfs => {}
        PriorityFormula::Multifactor(m) => multifactor(&f, m, &mut sink),
        PriorityFormula::Flux(x) => flux(&f, x, &mut sink),
        PriorityFormula::It4i(p) => it4i(&f, p, &mut sink),
        PriorityFormula::Runtime(order) => runtime_order(&f, *order, &mut sink),
        PriorityFormula::Maui(m) => maui(&f, m, &mut sink),
    }
}

/// What several formulas read of one job: its partition and QOS, how long it has been
/// eligible, and the factors computed the same way in each.
struct JobFactors<'a> {
    inputs: &'a PriorityInputs<'a>,
    job: &'a Job,
    qos: Option<&'a crate::qos::Qos>,
    partition_priority: u32,
    eligible: Seconds,
}

impl<'a> JobFactors<'a> {
    fn of(inputs: &'a PriorityInputs<'a>, job: &'a Job) -> Self {
        let r = &job.resolved;
        JobFactors {
            inputs,
            job,
            qos: inputs.state.qos.get(&r.qos),
            partition_priority: inputs
                .state
                .partitions
                .get(&r.partition)
                .map_or(0, |p| p.priority_job_factor),
            eligible: job.eligible_time(inputs.now),
        }
    }

    fn fairshare(&self) -> f64 {
        self.inputs.fairshare.factor_of(self.job.resolved.assoc)
    }

    fn partition(&self) -> f64 {
        ratio(
            f64::from(self.partition_priority),
            f64::from(self.inputs.max_partition_factor),
        )
    }

    fn qos(&self) -> f64 {
        ratio(
            f64::from(self.qos.map_or(0, |q| q.priority)),
            f64::from(self.inputs.max_qos_priority),
        )
    }

    /// Eligible time over `max`, capped at 1.
    fn waited(&self, max: Seconds) -> f64 {
        ratio(self.eligible.0 as f64, max.0 as f64)
    }
}

/// Slurm's priority/multifactor.
fn multifactor(
    f: &JobFactors<'_>,
    m: &Multifactor,
    sink: &mut impl FnMut(&'static str, &dyn Fn() -> f64, f64),
) {
    let (inputs, job, state) = (f.inputs, f.job, f.inputs.state);
    sink("age", &|| f.waited(m.max_age), f64::from(m.weight_age));
    let assoc = state
        .accounts
        .get(&job.resolved.account)
        .and_then(|a| a.users.get(&job.spec.user))
        .map_or(0, |u| u.priority);
    sink(
        "assoc",
        &|| ratio(f64::from(assoc), f64::from(inputs.max_assoc_priority)),
        f64::from(m.weight_assoc),
    );
    sink(
        "fairshare",
        &|| f.fairshare(),
        f64::from(m.weight_fairshare),
    );
    let size = ratio(f64::from(job.spec.nodes), inputs.total_nodes as f64);
    let size = if m.favor_small { 1.0 - size } else { size };
    sink("jobsize", &|| size, f64::from(m.weight_job_size));
    sink(
        "partition",
        &|| f.partition(),
        f64::from(m.weight_partition),
    );
    sink("qos", &|| f.qos(), f64::from(m.weight_qos));
    sink(
        "tres_cpu",
        &|| ratio(job.cpus() as f64, inputs.total_cpus as f64),
        f64::from(m.weight_tres_cpu),
    );
    let mem = job
        .alloc
        .as_ref()
        .map(|a| a.shares.iter().map(|s| s.memory.0).sum::<u64>())
        .unwrap_or(0);
    sink(
        "tres_mem",
        &|| ratio(mem as f64, inputs.total_memory as f64),
        f64::from(m.weight_tres_mem),
    );
    sink("site", &|| job.site_priority as f64, 1.0);
    sink("nice", &|| f64::from(job.spec.nice), -1.0);
}

/// Flux's multi-factor priority plugin.
fn flux(f: &JobFactors<'_>, x: &Flux, sink: &mut impl FnMut(&'static str, &dyn Fn() -> f64, f64)) {
    let (inputs, job) = (f.inputs, f.job);
    sink("wait", &|| f.waited(x.max_wait), f64::from(x.weight_wait));
    sink(
        "fairshare",
        &|| f.fairshare(),
        f64::from(x.weight_fairshare),
    );
    sink("qos", &|| f.qos(), f64::from(x.weight_qos));
    sink("queue", &|| f.partition(), f64::from(x.weight_queue));
    sink(
        "jobsize",
        &|| ratio(f64::from(job.spec.nodes), inputs.total_nodes as f64),
        f64::from(x.weight_job_size),
    );
    sink(
        "user",
        &|| f64::from(job.spec.user_factor_pct.min(100)) / 100.0,
        f64::from(x.weight_user),
    );
}

/// IT4Innovations' formula: queue priority first, then fair share, then eligible time.
fn it4i(f: &JobFactors<'_>, p: &It4i, sink: &mut impl FnMut(&'static str, &dyn Fn() -> f64, f64)) {
    let max_queue = f64::from(f.inputs.max_partition_factor);
    sink("queue", &|| f.partition(), 1000.0 * max_queue);
    sink(
        "fairshare",
        &|| f.fairshare(),
        p.max_fairshare as f64 / 1000.0,
    );
    let span = p.eligible_time_span;
    sink(
        "eligible_time",
        &|| f.waited(span),
        span.0 as f64 / 864_000.0,
    );
}

/// Orders by expected runtime: shortest first, largest expected slowdown first, or the
/// learned F1 function of runtime, size and submission time.
fn runtime_order(
    f: &JobFactors<'_>,
    order: RuntimeOrder,
    sink: &mut impl FnMut(&'static str, &dyn Fn() -> f64, f64),
) {
    let job = f.job;
    // An unlimited job counts as a year.
    let runtime = job
        .expected_runtime(f.inputs.now)
        .map_or(365.0 * 86_400.0, |s| s.0.max(1) as f64);
    match order {
        RuntimeOrder::ShortestFirst => sink("expected_runtime", &|| runtime, -1.0),
        RuntimeOrder::LargestXfactor => sink(
            "xfactor",
            &|| (f.eligible.0 as f64 + runtime) / runtime,
            1.0,
        ),
        RuntimeOrder::F1 => {
            sink(
                "log_area",
                &|| libm::log10(runtime) * job.cpus() as f64,
                -1.0,
            );
            let submitted = (job.submit_time.0 as f64 / 1000.0).max(0.1);
            sink("log_submit", &|| libm::log10(submitted), -870.0);
        }
    }
}

/// Maui's priority: queue time, expansion factor, resources, bypass, QOS, target queue time
/// and fair share.
fn maui(f: &JobFactors<'_>, m: &Maui, sink: &mut impl FnMut(&'static str, &dyn Fn() -> f64, f64)) {
    let (inputs, job, eligible) = (f.inputs, f.job, f.eligible);
    let r = &job.resolved;
    sink(
        "queuetime",
        &|| f.waited(m.max_queue_time),
        f64::from(m.weight_queue_time),
    );
    let xfactor = match r.time_limit {
        Some(limit) if limit.0 > 0 => (eligible.0 + limit.0) as f64 / limit.0 as f64,
        _ => 1.0,
    };
    sink(
        "xfactor",
        &|| ratio(xfactor - 1.0, f64::from(m.max_xfactor.saturating_sub(1))),
        f64::from(m.weight_xfactor),
    );
    let resources = maui_resources(inputs, job);
    sink("resources", &|| resources, f64::from(m.weight_resources));
    sink(
        "bypass",
        &|| ratio(f64::from(job.bypass_count), f64::from(m.max_bypass)),
        f64::from(m.weight_bypass),
    );
    sink("qos", &|| f.qos(), f64::from(m.weight_qos));
    let target = f.qos.and_then(|q| q.target_queue_time).unwrap_or_default();
    sink(
        "target_queuetime",
        &|| target_queue_factor(eligible, target),
        f64::from(m.weight_target_queue_time),
    );
    sink(
        "fairshare",
        &|| f.fairshare(),
        f64::from(m.weight_fairshare),
    );
}

/// Maui's resource factor: the mean of the job's shares of the machine's cpus, memory and
/// jobfs.
fn maui_resources(inputs: &PriorityInputs<'_>, job: &Job) -> f64 {
    let r = &job.resolved;
    let mem_per_node = match r.memory {
        crate::job::MemoryRequest::PerNode(m) => m.0,
        crate::job::MemoryRequest::PerCpu(m) => {
            m.0.saturating_mul(job.cpus() / u64::from(job.spec.nodes.max(1)))
        }
        crate::job::MemoryRequest::WholeNode => inputs.total_memory / inputs.total_nodes.max(1),
    };
    let nodes = u64::from(job.spec.nodes);
    (ratio(job.cpus() as f64, inputs.total_cpus as f64)
        + ratio(
            (mem_per_node.saturating_mul(nodes)) as f64,
            inputs.total_memory as f64,
        )
        + ratio(
            (r.jobfs.0.saturating_mul(nodes)) as f64,
            inputs.total_jobfs as f64,
        ))
        / 3.0
}

/// A job's priority under the configured formula.
pub fn priority(inputs: &PriorityInputs<'_>, job: &Job) -> f64 {
    if inputs.state.config.priority.formula == PriorityFormula::Fcfs {
        return 0.0;
    }
    let mut total = 0.0;
    evaluate(inputs, job, false, &mut |_, value, weight| {
        total += value * weight
    });
    total
}

/// A job's priority, factor by factor (what `sprio` prints).
pub fn explain(inputs: &PriorityInputs<'_>, job: &Job) -> Explanation {
    let mut factors = Vec::with_capacity(10);
    evaluate(inputs, job, true, &mut |name, value, weight| {
        factors.push(FactorLine {
            name,
            value,
            weight,
            contribution: value * weight,
        })
    });
    Explanation {
        job: job.id,
        priority: factors.iter().map(|f| f.contribution).sum(),
        factors,
    }
}

/// Where a job stands in the order of consideration (GWDG's Slurm documentation): jobs that can preempt, jobs
/// in a reservation, higher partition priority tier, starving jobs (eligible for
/// `starvation_wait`, longest eligible first), higher priority, earlier submission, lower id. Sort with [`OrderKey::consider_before`]: `Less` goes first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderKey {
    pub preemptor: bool,
    pub in_reservation: bool,
    pub tier: u32,
    /// Eligible for `starvation_wait` or longer: ahead of every job that is not (after
    /// preemptors, advance-reservation jobs and higher tiers), longest eligible first.
    pub starving: bool,
    /// Seconds eligible so far (orders starving jobs).
    pub eligible_s: u64,
    pub priority: f64,
    pub submit: TimeMs,
    pub id: JobId,
}

/// An [`OrderKey`] ordered so that a max-heap yields the job to consider first.
#[derive(Debug, Clone, Copy)]
pub struct FirstFirst(pub OrderKey);

impl PartialEq for FirstFirst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for FirstFirst {}

impl PartialOrd for FirstFirst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FirstFirst {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.consider_before(&self.0)
    }
}

impl OrderKey {
    pub fn new(inputs: &PriorityInputs<'_>, job: &Job, in_reservation: bool) -> OrderKey {
        let state = inputs.state;
        let eligible = job.eligible_time(inputs.now);
        // Every pending job gets a key on every pass: skip the name lookups where the
        // answer is the same for all.
        OrderKey {
            preemptor: inputs.any_preemptor
                && state
                    .qos
                    .get(&job.resolved.qos)
                    .is_some_and(|q| !q.preempt.is_empty()),
            in_reservation,
            tier: inputs.uniform_tier.unwrap_or_else(|| {
                state
                    .partitions
                    .get(&job.resolved.partition)
                    .map_or(0, |p| p.priority_tier)
            }),
            starving: state
                .config
                .sched
                .starvation_wait
                .is_some_and(|w| eligible >= w),
            eligible_s: eligible.0,
            priority: priority(inputs, job),
            submit: job.submit_time,
            id: job.id,
        }
    }

    pub fn consider_before(&self, other: &OrderKey) -> Ordering {
        other
            .preemptor
            .cmp(&self.preemptor)
            .then(other.in_reservation.cmp(&self.in_reservation))
            .then(other.tier.cmp(&self.tier))
            .then(other.starving.cmp(&self.starving))
            .then_with(|| {
                if self.starving && other.starving {
                    other.eligible_s.cmp(&self.eligible_s)
                } else {
                    Ordering::Equal
                }
            })
            .then(other.priority.total_cmp(&self.priority))
            .then(self.submit.cmp(&other.submit))
            .then(self.id.cmp(&other.id))
    }
}

impl State {
    /// Idle pending jobs in the order the scheduler considers them (no reservations yet).
    /// Under NCI shuffling, a job's place within its tier comes from its shuffle score
    /// instead of its priority.
    pub fn consideration_order(&self, now: TimeMs) -> Vec<JobId> {
        if let Some(kept) = self.queue_index.in_order() {
            return kept.collect();
        }
        let mut keys = self.consideration_keys(now);
        keys.sort_by(OrderKey::consider_before);
        keys.into_iter().map(|k| k.id).collect()
    }

    /// Every idle pending job's place in the order of consideration, unsorted (a pass
    /// that usually stops early takes them from a heap instead of sorting them all).
    pub fn consideration_keys(&self, now: TimeMs) -> Vec<OrderKey> {
        let inputs = self.priority_inputs(now);
        let shuffle = match self.config.queue_ordering {
            QueueOrdering::Priority => None,
            QueueOrdering::Shuffle(by) => Some(self.shuffle_scores(by)),
        };
        let keys: Vec<OrderKey> = self
            .queue_index
            .idle()
            .filter_map(|id| self.jobs.get(&id))
            .filter(|j| j.state == JobState::Pending && j.part == Part::Idle)
            .map(|j| {
                let mut key = OrderKey::new(&inputs, j, j.spec.reservation.is_some());
                if let Some(scores) = &shuffle {
                    // Lower score first: negate into the "higher priority first" slot.
                    key.priority = -(scores.get(&j.id).copied().unwrap_or(0) as f64);
                }
                key
            })
            .collect();
        keys
    }

    /// NCI's queue shuffle (NCI's PBS job scheduling documentation): each queued job scores the cpus of every job, in any
    /// state, ahead of it in the same queue and belonging to the same user (or project);
    /// running jobs are ahead of every queued one, queued ones in submission order. Sorting
    /// on the score promotes those with nothing running and demotes those with much.
    pub fn shuffle_scores(&self, by: ShuffleBy) -> BTreeMap<JobId, u64> {
        type Owner = (PartitionName, String);
        let owner = |j: &Job| -> Owner {
            let who = match by {
                ShuffleBy::User => j.spec.user.to_string(),
                ShuffleBy::Project => j.resolved.account.to_string(),
            };
            (j.resolved.partition.clone(), who)
        };
        let mut ahead: BTreeMap<Owner, u64> = BTreeMap::new();
        for job in self.holding.iter().filter_map(|id| self.jobs.get(id)) {
            *ahead.entry(owner(job)).or_default() += job.cpus();
        }
        let mut queued: Vec<&Job> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending)
            .collect();
        queued.sort_by_key(|j| (j.submit_time, j.id));
        let mut scores = BTreeMap::new();
        for job in queued {
            let sum = ahead.entry(owner(job)).or_default();
            scores.insert(job.id, *sum);
            *sum += job.cpus();
        }
        scores
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_queue_factor_grows_exponentially_to_one() {
        let t = Seconds::hours(10);
        assert_eq!(target_queue_factor(Seconds(0), t), 0.0);
        let half = target_queue_factor(Seconds::hours(5), t);
        assert!((half - 0.377_540_668_798_145_4).abs() < 1e-12, "{half}");
        assert!(half < 0.5, "convex: slower than linear at first");
        assert_eq!(target_queue_factor(t, t), 1.0);
        assert_eq!(target_queue_factor(Seconds::hours(20), t), 1.0);
        assert_eq!(target_queue_factor(Seconds::hours(5), Seconds(0)), 0.0);
    }
}
