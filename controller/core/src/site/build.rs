//! From the file as written ([`RawFile`]) to a validated [`SiteConfig`]: units converted,
//! hostlists expanded, names checked, defaults filled in, every error naming its key.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use super::file::*;
use super::{AccountDef, SiteConfig, SiteError, UserDef};
use crate::account::{AssocLimits, Grant, User, UserAssoc};
use crate::config::{
    BackfillMode, BackfillOrder, Promotion, QueueOrdering, SchedConfig, SchedParams, ShuffleBy,
};
use crate::fairshare::FairshareAlgorithm;
use crate::ids::{AccountName, NodeName};
use crate::node::NodeSpec;
use crate::partition::{Milli, Partition, PartitionLimits, PreemptMode};
use crate::predict::RuntimePredictor;
use crate::preempt::ParallelRun;
use crate::priority::{Flux, It4i, Maui, Multifactor, PriorityFormula, RuntimeOrder};
use crate::qos::Qos;
use crate::quantity::{self, MiB, Seconds, SlurmDuration};
use crate::tres::BillingWeights;

type Result<T> = std::result::Result<T, SiteError>;

/// Validates a parsed file.
pub fn build(raw: RawFile) -> Result<SiteConfig> {
    let sched = sched_config(&raw)?;
    let nodes = nodes(&raw.nodes)?;
    let qos = raw
        .qos
        .iter()
        .enumerate()
        .map(|(i, q)| qos(&format!("qos[{i}]"), q))
        .collect::<Result<Vec<_>>>()?;
    unique("qos", qos.iter().map(|q| q.name.to_string()))?;
    let accounts = accounts(&raw.accounts)?;
    let max_tres = raw
        .priority_flags
        .as_ref()
        .is_some_and(|f| f.contains(&RawPriorityFlag::MaxTres));
    let all: BTreeSet<NodeName> = nodes.iter().map(|n| n.name.clone()).collect();
    let partitions = raw
        .partitions
        .iter()
        .enumerate()
        .map(|(i, p)| partition(&format!("partitions[{i}]"), p, &all, max_tres))
        .collect::<Result<Vec<_>>>()?;
    unique("partitions", partitions.iter().map(|p| p.name.to_string()))?;
    if partitions.iter().filter(|p| p.is_default).count() > 1 {
        return Err(SiteError::invalid(
            "partitions",
            "more than one partition has Default = true; at most one may",
        ));
    }
    let users = raw
        .users
        .iter()
        .enumerate()
        .map(|(i, u)| user(&format!("users[{i}]"), u))
        .collect::<Result<Vec<_>>>()?;
    unique("users", users.iter().map(|u| u.user.name.to_string()))?;
    Ok(SiteConfig {
        cluster_name: raw.cluster_name.clone(),
        sched,
        nodes,
        qos,
        accounts,
        partitions,
        users,
    })
}

fn unique(key: &str, names: impl Iterator<Item = String>) -> Result<()> {
    let mut seen = BTreeSet::new();
    for n in names {
        if !seen.insert(n.clone()) {
            return Err(SiteError::invalid(key, format!("{n} is defined twice")));
        }
    }
    Ok(())
}

fn name<T: FromStr>(key: &str, text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse()
        .map_err(|e: T::Err| SiteError::invalid(key, e.to_string()))
}

/// A duration; `None` = unlimited.
fn duration(key: &str, d: &RawDuration) -> Result<Option<Seconds>> {
    match d {
        RawDuration::Minutes(m) => m
            .checked_mul(60)
            .map(|s| Some(Seconds(s)))
            .ok_or_else(|| SiteError::invalid(key, format!("{m} minutes is too long"))),
        RawDuration::Text(t) => match quantity::parse_duration(t) {
            Ok(SlurmDuration::Limit(s)) => Ok(Some(s)),
            Ok(SlurmDuration::Unlimited) => Ok(None),
            Err(e) => Err(SiteError::invalid(key, e.to_string())),
        },
    }
}

/// A duration that must be finite.
fn finite(key: &str, d: &RawDuration) -> Result<Seconds> {
    duration(key, d)?.ok_or_else(|| SiteError::invalid(key, "must be a finite time, not UNLIMITED"))
}

fn size(key: &str, s: &RawSize) -> Result<MiB> {
    match s {
        RawSize::MiB(m) => Ok(MiB(*m)),
        RawSize::Text(t) => {
            quantity::parse_size(t).map_err(|e| SiteError::invalid(key, e.to_string()))
        }
    }
}

/// A rate such as 1.5, kept in thousandths.
fn milli(key: &str, x: f64) -> Result<Milli> {
    if !(x.is_finite() && (0.0..=1_000_000.0).contains(&x)) {
        return Err(SiteError::invalid(
            key,
            format!("{x} is out of range; allowed 0 to 1000000"),
        ));
    }
    Ok(Milli((x * 1000.0).round() as u32))
}

/// `soft` or `[soft, hard]`.
fn max_ps(key: &str, m: &RawMaxPs) -> Result<(Option<u64>, Option<u64>)> {
    match m {
        RawMaxPs::One(s) => Ok((Some(*s), Some(*s))),
        RawMaxPs::Pair(v) => match v.as_slice() {
            [s, h] if s <= h => Ok((Some(*s), Some(*h))),
            [s, h] => Err(SiteError::invalid(
                key,
                format!("the soft limit {s} exceeds the hard limit {h}"),
            )),
            [s] => Ok((Some(*s), Some(*s))),
            _ => Err(SiteError::invalid(
                key,
                "expected soft or [soft, hard] processor-seconds",
            )),
        },
    }
}

/// `key=value` pairs separated by commas (`CPU=1000,Mem=2000`), keys lower-cased.
fn pairs<'a>(key: &str, text: &'a str, allowed: &str) -> Result<Vec<(String, &'a str)>> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim()))
                .ok_or_else(|| {
                    SiteError::invalid(key, format!("{p:?} is not TRES=value; allowed: {allowed}"))
                })
        })
        .collect()
}

/// A cpu count in TRES form (`cpu=128`), the only TRES Docket limits by.
fn tres_cpu(key: &str, text: &str) -> Result<u64> {
    let mut cpu = None;
    for (k, v) in pairs(key, text, "cpu=N")? {
        if k != "cpu" {
            return Err(SiteError::invalid(
                key,
                format!("TRES {k:?} cannot be limited; allowed: cpu=N"),
            ));
        }
        cpu = Some(
            v.parse::<u64>()
                .map_err(|_| SiteError::invalid(key, format!("{v:?} is not a whole number")))?,
        );
    }
    cpu.ok_or_else(|| SiteError::invalid(key, "empty; expected cpu=N"))
}

fn number<T: FromStr>(key: &str, v: &str) -> Result<T> {
    v.parse()
        .map_err(|_| SiteError::invalid(key, format!("{v:?} is not a number")))
}

/// `TRESBillingWeights = "CPU=1.0,Mem=0.25G,GRES/gpu=2.0"`; memory weights are per MiB
/// unless suffixed `G` (per GiB), as in Slurm.
fn billing(key: &str, text: &str, max_tres: bool) -> Result<BillingWeights> {
    let mut w = BillingWeights {
        cpu: Milli::ZERO,
        mem_per_gib: Milli::ZERO,
        gpu: Milli::ZERO,
        max_tres,
    };
    for (k, v) in pairs(key, text, "CPU, Mem, GRES/gpu")? {
        match k.as_str() {
            "cpu" => w.cpu = milli(key, number(key, v)?)?,
            "mem" => {
                w.mem_per_gib = match v.strip_suffix(['G', 'g']) {
                    Some(g) => milli(key, number(key, g)?)?,
                    None => milli(key, number::<f64>(key, v)? * 1024.0)?,
                }
            }
            "gres/gpu" | "gpu" => w.gpu = milli(key, number(key, v)?)?,
            other => {
                return Err(SiteError::invalid(
                    key,
                    format!("unknown TRES {other:?}; allowed: CPU, Mem, GRES/gpu"),
                ));
            }
        }
    }
    Ok(w)
}

fn retention(raw: &RawFile) -> Result<crate::config::Retention> {
    let purge_job_after = raw
        .purge_job_after
        .as_deref()
        .map(|t| purge_after("PurgeJobAfter", t))
        .transpose()?;
    Ok(crate::config::Retention {
        purge_job_after,
        archive_jobs: raw.archive_jobs.unwrap_or(true),
        archive_format: match raw.archive_format {
            None | Some(RawArchiveFormat::Csv) => crate::config::ArchiveFormat::Csv,
            Some(RawArchiveFormat::Swf) => crate::config::ArchiveFormat::Swf,
        },
    })
}

/// slurmdbd's purge times: a number and `hours`, `days` or `months` (a month is 30 days
/// here). At least one hour, at most 100 years.
fn purge_after(key: &str, text: &str) -> Result<Seconds> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let bad = || {
        SiteError::invalid(
            key,
            format!("{text:?}: expected a number of hours, days or months, as `12months`"),
        )
    };
    let n: u64 = n.parse().map_err(|_| bad())?;
    let hours = match unit.trim().to_ascii_lowercase().as_str() {
        "hour" | "hours" => n,
        "day" | "days" => n.saturating_mul(24),
        "month" | "months" => n.saturating_mul(30 * 24),
        _ => return Err(bad()),
    };
    if !(1..=100 * 365 * 24).contains(&hours) {
        return Err(SiteError::invalid(
            key,
            format!("{text:?}: must be between 1 hour and 100 years"),
        ));
    }
    Ok(Seconds::hours(hours))
}

fn preempt_mode(m: Option<RawPreemptMode>) -> PreemptMode {
    match m {
        None | Some(RawPreemptMode::Off) => PreemptMode::Off,
        Some(RawPreemptMode::Suspend) => PreemptMode::Suspend,
        Some(RawPreemptMode::Requeue) => PreemptMode::Requeue,
        Some(RawPreemptMode::Cancel) => PreemptMode::Cancel,
    }
}

fn sched_config(raw: &RawFile) -> Result<SchedConfig> {
    let mut c = SchedConfig::default();
    if let Some(v) = raw.max_array_size {
        c.max_array_size = v;
    }
    if let Some(v) = raw.max_job_count {
        c.max_job_count = v;
    }
    if let Some(v) = raw.max_submit_batch {
        c.max_batch = v;
    }
    if let Some(v) = raw.min_job_age {
        c.min_job_age = Seconds(v);
    }
    c.retention = retention(raw)?;
    if let Some(v) = &raw.default_jobfs {
        c.default_jobfs = size("DefaultJobfs", v)?;
    }
    if let Some(v) = &raw.max_wall_time {
        c.max_walltime = duration("MaxWallTime", v)?;
    }
    if let Some(v) = &raw.default_qos {
        c.default_qos = name("DefaultQOS", v)?;
    }
    if let Some(v) = &raw.bonus_qos {
        c.bonus_qos = Some(name("BonusQOS", v)?);
    }
    if let Some(v) = &raw.max_blob_size {
        c.max_blob_bytes = size("MaxBlobSize", v)?.0.saturating_mul(1 << 20);
    }
    if let Some(list) = &raw.private_data {
        c.private_data = crate::config::PrivateData {
            jobs: list.contains(&RawPrivateData::Jobs),
            accounting: list.contains(&RawPrivateData::Accounting),
            usage: list.contains(&RawPrivateData::Usage),
        };
    }
    if let Some(v) = raw.max_submit_jobs_per_user {
        c.user_caps.max_jobs = (v > 0).then_some(v);
    }
    if let Some(v) = &raw.max_script_bytes_per_user {
        let mib = size("MaxScriptBytesPerUser", v)?.0;
        c.user_caps.max_script_bytes = (mib > 0).then(|| mib.saturating_mul(1 << 20));
    }
    c.queue_ordering = match raw.queue_ordering {
        None | Some(RawQueueOrdering::Priority) => QueueOrdering::Priority,
        Some(RawQueueOrdering::ShuffleUser) => QueueOrdering::Shuffle(ShuffleBy::User),
        Some(RawQueueOrdering::ShuffleProject) => QueueOrdering::Shuffle(ShuffleBy::Project),
    };
    sched_params(raw, &mut c)?;
    priority(raw, &mut c)?;
    if let Some(q) = &raw.queue_policy {
        queue_policy(q, &mut c)?;
    }
    if let Some(p) = &raw.preempt_parallel_run {
        c.preempt.parallel_run = Some(parallel_run(p)?);
    }
    Ok(c)
}

/// `QueuePolicy`: the per-user idle and running job caps, MAXPS and promotion order.
fn queue_policy(q: &RawQueuePolicy, c: &mut SchedConfig) -> Result<()> {
    if let Some(v) = q.max_idle_jobs {
        c.queue_policy.max_idle_jobs_per_user = Some(v);
    }
    if let Some(v) = q.max_jobs {
        c.queue_policy.max_jobs_per_user = Some(v);
    }
    if let Some(m) = &q.max_ps {
        (c.queue_policy.maxps_soft, c.queue_policy.maxps_hard) = max_ps("QueuePolicy.MAXPS", m)?;
    }
    c.queue_policy.promotion = match q.promotion {
        None | Some(RawPromotion::Newest) => Promotion::Newest,
        Some(RawPromotion::Oldest) => Promotion::Oldest,
    };
    Ok(())
}

/// `PreemptParallelRun`: each setting or its default, checked.
fn parallel_run(p: &RawParallelRun) -> Result<ParallelRun> {
    let d = ParallelRun::default();
    let run = ParallelRun {
        min_size_ratio: p.min_size_ratio.unwrap_or(d.min_size_ratio),
        max_expansion: p.max_expansion.unwrap_or(d.max_expansion),
        weight_expansion: p.weight_expansion.unwrap_or(d.weight_expansion),
        weight_done: p.weight_done.unwrap_or(d.weight_done),
        weight_running: p.weight_running.unwrap_or(d.weight_running),
        weight_wait: p.weight_wait.unwrap_or(d.weight_wait),
        weight_bypass: p.weight_bypass.unwrap_or(d.weight_bypass),
    };
    if run.min_size_ratio < 1 {
        return Err(SiteError::invalid(
            "PreemptParallelRun.MinSizeRatio",
            "must be at least 1",
        ));
    }
    if !(run.max_expansion.is_finite() && run.max_expansion >= 1.0) {
        return Err(SiteError::invalid(
            "PreemptParallelRun.MaxExpansion",
            "must be a number of at least 1.0",
        ));
    }
    let weights = [
        run.weight_expansion,
        run.weight_done,
        run.weight_running,
        run.weight_wait,
        run.weight_bypass,
    ];
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return Err(SiteError::invalid(
            "PreemptParallelRun",
            "weights must be finite and not negative",
        ));
    }
    Ok(run)
}

fn sched_params(raw: &RawFile, c: &mut SchedConfig) -> Result<()> {
    let s = &mut c.sched;
    if let Some(RawSchedulerType::Builtin) = raw.scheduler_type {
        s.backfill = BackfillMode::Off;
    }
    let Some(p) = &raw.scheduler_parameters else {
        return Ok(());
    };
    let set = |v: Option<u32>, into: &mut u32| {
        if let Some(v) = v {
            *into = v;
        }
    };
    set(p.default_queue_depth, &mut s.default_queue_depth);
    set(p.partition_job_depth, &mut s.partition_job_depth);
    set(p.bf_max_job_test, &mut s.bf_max_job_test);
    set(p.bf_max_job_user, &mut s.bf_max_job_user);
    set(p.bf_max_job_part, &mut s.bf_max_job_part);
    set(p.bf_reservation_depth, &mut s.reservation_depth);
    set(p.max_rpc_cnt, &mut s.loops.max_rpc_cnt);
    if let Some(v) = p.bf_continue {
        s.bf_continue = v;
    }
    if let Some(o) = p.bf_order {
        s.bf_order = match o {
            RawBackfillOrder::Queue => BackfillOrder::Queue,
            RawBackfillOrder::Shortest => BackfillOrder::Shortest,
        };
    }
    if let Some(r) = p.runtime_predictor {
        s.runtime_predictor = match r {
            RawRuntimePredictor::TimeLimit => RuntimePredictor::TimeLimit,
            RawRuntimePredictor::RecentAverage => RuntimePredictor::RecentAverage,
        };
    }
    if let Some(m) = p.bf_mode {
        if s.backfill == BackfillMode::Off {
            return Err(SiteError::invalid(
                "SchedulerParameters.bf_mode",
                "set, but SchedulerType is sched/builtin (no backfill)",
            ));
        }
        s.backfill = match m {
            RawBackfillMode::Easy => BackfillMode::Easy,
            RawBackfillMode::Conservative => BackfillMode::Conservative,
        };
    }
    bounded_sched_params(p, s)
}

/// The `SchedulerParameters` that are times and intervals, each within its range.
fn bounded_sched_params(p: &RawSchedParams, s: &mut SchedParams) -> Result<()> {
    let positive = |key: &str, v: u64, max: u64| -> Result<u64> {
        if v == 0 || v > max {
            return Err(SiteError::invalid(
                format!("SchedulerParameters.{key}"),
                format!("{v} is out of range; allowed 1 to {max}"),
            ));
        }
        Ok(v)
    };
    if let Some(v) = p.bf_window {
        // Minutes, as Slurm; at most a year.
        s.bf_window = Seconds(positive("bf_window", v, 525_600)? * 60);
    }
    if let Some(v) = p.bf_resolution {
        s.bf_resolution = Seconds(positive("bf_resolution", v, 3600)?);
    }
    if let Some(v) = p.sched_interval {
        s.loops.sched_interval = Seconds(positive("sched_interval", v, 86_400)?);
    }
    if let Some(v) = p.max_sched_time {
        s.loops.max_sched_time = Seconds(positive("max_sched_time", v, 3600)?);
    }
    if let Some(v) = p.bf_interval {
        s.loops.bf_interval = Seconds(positive("bf_interval", v, 10_800)?);
        // Slurm: bf_max_time defaults to bf_interval.
        s.loops.bf_max_time = s.loops.bf_interval;
    }
    if let Some(v) = p.bf_max_time {
        s.loops.bf_max_time = Seconds(positive("bf_max_time", v, 86_400)?);
    }
    if let Some(v) = p.bf_yield_interval {
        s.loops.bf_yield_interval_us = positive("bf_yield_interval", v, 10_000_000)?;
    }
    if let Some(v) = p.starvation_wait {
        // At most a year.
        s.starvation_wait = Some(Seconds(positive("starvation_wait", v, 31_536_000)?));
    }
    if let Some(v) = p.bf_yield_sleep {
        s.loops.bf_yield_sleep_us = positive("bf_yield_sleep", v, 10_000_000)?;
    }
    Ok(())
}

fn priority(raw: &RawFile, c: &mut SchedConfig) -> Result<()> {
    if let Some(d) = &raw.priority_decay_half_life {
        // UNLIMITED or 0: no decay.
        c.fairshare.half_life = duration("PriorityDecayHalfLife", d)?.unwrap_or(Seconds::ZERO);
    }
    let no_fair_tree = raw
        .priority_flags
        .as_ref()
        .is_some_and(|f| f.contains(&RawPriorityFlag::NoFairTree));
    c.fairshare.algorithm = if no_fair_tree {
        FairshareAlgorithm::Classic
    } else {
        FairshareAlgorithm::FairTree
    };
    let kind = raw.priority_type.unwrap_or(RawPriorityType::Multifactor);
    only_the_formula_s_keys(raw, kind)?;
    c.priority.formula = match kind {
        RawPriorityType::Basic => PriorityFormula::Fcfs,
        RawPriorityType::Multifactor => PriorityFormula::Multifactor(multifactor(raw)?),
        RawPriorityType::Flux => PriorityFormula::Flux(flux(raw)?),
        RawPriorityType::It4i => {
            c.fairshare.algorithm = FairshareAlgorithm::It4i;
            PriorityFormula::It4i(it4i(raw)?)
        }
        RawPriorityType::Maui => PriorityFormula::Maui(maui(raw)?),
        RawPriorityType::Runtime => PriorityFormula::Runtime(runtime_order(raw)?),
    };
    Ok(())
}

/// Keys that belong to one formula are refused under another, so they cannot silently do
/// nothing.
fn only_the_formula_s_keys(raw: &RawFile, kind: RawPriorityType) -> Result<()> {
    let multifactor_keys = [
        ("PriorityMaxAge", raw.priority_max_age.is_some()),
        ("PriorityFavorSmall", raw.priority_favor_small.is_some()),
        ("PriorityWeightAge", raw.priority_weight_age.is_some()),
        ("PriorityWeightAssoc", raw.priority_weight_assoc.is_some()),
        (
            "PriorityWeightFairshare",
            raw.priority_weight_fairshare.is_some(),
        ),
        (
            "PriorityWeightJobSize",
            raw.priority_weight_job_size.is_some(),
        ),
        (
            "PriorityWeightPartition",
            raw.priority_weight_partition.is_some(),
        ),
        ("PriorityWeightQOS", raw.priority_weight_qos.is_some()),
        ("PriorityWeightTRES", raw.priority_weight_tres.is_some()),
    ];
    let other_tables = [
        ("PriorityFlux", raw.priority_flux.is_some(), "priority/flux"),
        ("PriorityIT4I", raw.priority_it4i.is_some(), "priority/it4i"),
        ("PriorityMaui", raw.priority_maui.is_some(), "priority/maui"),
        (
            "PriorityRuntime",
            raw.priority_runtime.is_some(),
            "priority/runtime",
        ),
    ];
    let wanted = match kind {
        RawPriorityType::Multifactor => "priority/multifactor",
        RawPriorityType::Basic => "priority/basic",
        RawPriorityType::Flux => "priority/flux",
        RawPriorityType::It4i => "priority/it4i",
        RawPriorityType::Maui => "priority/maui",
        RawPriorityType::Runtime => "priority/runtime",
    };
    for (key, set, needs) in other_tables {
        if set && needs != wanted {
            return Err(SiteError::invalid(
                key,
                format!("set, but PriorityType is {wanted}; it applies to {needs}"),
            ));
        }
    }
    if !matches!(kind, RawPriorityType::Multifactor)
        && let Some((key, _)) = multifactor_keys.iter().find(|(_, set)| *set)
    {
        return Err(SiteError::invalid(
            *key,
            format!("set, but PriorityType is {wanted}; it applies to priority/multifactor"),
        ));
    }
    Ok(())
}

/// `priority/multifactor`: Slurm's weights, `PriorityMaxAge` and `PriorityWeightTRES`.
fn multifactor(raw: &RawFile) -> Result<Multifactor> {
    // Slurm's defaults: every weight 0 unless set, PriorityMaxAge 7 days.
    let mut m = Multifactor {
        max_age: Seconds::days(7),
        weight_age: raw.priority_weight_age.unwrap_or(0),
        weight_assoc: raw.priority_weight_assoc.unwrap_or(0),
        weight_fairshare: raw.priority_weight_fairshare.unwrap_or(0),
        weight_job_size: raw.priority_weight_job_size.unwrap_or(0),
        weight_partition: raw.priority_weight_partition.unwrap_or(0),
        weight_qos: raw.priority_weight_qos.unwrap_or(0),
        weight_tres_cpu: 0,
        weight_tres_mem: 0,
        favor_small: raw.priority_favor_small.unwrap_or(false),
    };
    if let Some(d) = &raw.priority_max_age {
        m.max_age = finite("PriorityMaxAge", d)?;
    }
    if let Some(t) = &raw.priority_weight_tres {
        let key = "PriorityWeightTRES";
        for (k, v) in pairs(key, t, "CPU, Mem")? {
            match k.as_str() {
                "cpu" => m.weight_tres_cpu = number(key, v)?,
                "mem" => m.weight_tres_mem = number(key, v)?,
                other => {
                    return Err(SiteError::invalid(
                        key,
                        format!("unknown TRES {other:?}; allowed: CPU, Mem"),
                    ));
                }
            }
        }
    }
    Ok(m)
}

/// `priority/flux`: the `[PriorityFlux]` table.
fn flux(raw: &RawFile) -> Result<Flux> {
    let f = raw.priority_flux.as_ref();
    let w = |g: fn(&RawFlux) -> Option<u32>| f.and_then(g).unwrap_or(0);
    let max_wait = match f.and_then(|f| f.max_wait.as_ref()) {
        Some(d) => finite("PriorityFlux.MaxWait", d)?,
        None => Seconds::days(7),
    };
    Ok(Flux {
        max_wait,
        weight_wait: w(|f| f.weight_wait),
        weight_fairshare: w(|f| f.weight_fairshare),
        weight_qos: w(|f| f.weight_qos),
        weight_queue: w(|f| f.weight_queue),
        weight_job_size: w(|f| f.weight_job_size),
        weight_user: w(|f| f.weight_user),
    })
}

/// `priority/it4i`: the `[PriorityIT4I]` table.
fn it4i(raw: &RawFile) -> Result<It4i> {
    let mut p = It4i::default();
    if let Some(r) = &raw.priority_it4i {
        if let Some(v) = r.max_fairshare {
            p.max_fairshare = v;
        }
        if let Some(d) = &r.eligible_time_span {
            p.eligible_time_span = finite("PriorityIT4I.EligibleTimeSpan", d)?;
        }
    }
    Ok(p)
}

/// `priority/maui`: HPC2N's weights, changed by the `[PriorityMaui]` table.
fn maui(raw: &RawFile) -> Result<Maui> {
    let mut m = Maui::hpc2n();
    if let Some(r) = &raw.priority_maui {
        let set = |v: Option<u32>, into: &mut u32| {
            if let Some(v) = v {
                *into = v;
            }
        };
        set(r.weight_queue_time, &mut m.weight_queue_time);
        set(r.weight_xfactor, &mut m.weight_xfactor);
        set(r.weight_resources, &mut m.weight_resources);
        set(r.weight_bypass, &mut m.weight_bypass);
        set(r.weight_qos, &mut m.weight_qos);
        set(r.weight_target_queue_time, &mut m.weight_target_queue_time);
        set(r.weight_fairshare, &mut m.weight_fairshare);
        set(r.max_xfactor, &mut m.max_xfactor);
        set(r.max_bypass, &mut m.max_bypass);
        if let Some(d) = &r.max_queue_time {
            m.max_queue_time = finite("PriorityMaui.MaxQueueTime", d)?;
        }
    }
    Ok(m)
}

/// `priority/runtime`: the order `[PriorityRuntime] Order` names (required).
fn runtime_order(raw: &RawFile) -> Result<RuntimeOrder> {
    let order = raw
        .priority_runtime
        .as_ref()
        .map(|r| r.order)
        .ok_or_else(|| {
            SiteError::invalid(
                "PriorityRuntime.Order",
                "required with priority/runtime: shortest, xfactor or f1",
            )
        })?;
    Ok(match order {
        RawRuntimeOrder::Shortest => RuntimeOrder::ShortestFirst,
        RawRuntimeOrder::Xfactor => RuntimeOrder::LargestXfactor,
        RawRuntimeOrder::F1 => RuntimeOrder::F1,
    })
}

fn nodes(raw: &[RawNode]) -> Result<Vec<NodeSpec>> {
    let mut out: Vec<NodeSpec> = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, n) in raw.iter().enumerate() {
        let key = format!("nodes[{i}]");
        let names = crate::hostlist::expand(&n.name)
            .map_err(|e| SiteError::invalid(format!("{key}.NodeName"), e.to_string()))?;
        if n.cpus == 0 {
            return Err(SiteError::invalid(
                format!("{key}.CPUs"),
                "must be at least 1",
            ));
        }
        let memory = size(&format!("{key}.RealMemory"), &n.real_memory)?;
        let jobfs = match &n.tmp_disk {
            Some(t) => size(&format!("{key}.TmpDisk"), t)?,
            None => MiB::ZERO,
        };
        let gpus = match &n.gres {
            None => 0,
            Some(g) => {
                let k = format!("{key}.Gres");
                let count = g
                    .strip_prefix("gpu:")
                    .ok_or_else(|| SiteError::invalid(&k, format!("{g:?}: expected gpu:N")))?;
                // `gpu:a100:4`: the type is accepted and not scheduled on.
                let count = count.rsplit(':').next().unwrap_or(count);
                number::<u32>(&k, count)?
            }
        };
        for name_text in names {
            let name: NodeName = name(&format!("{key}.NodeName"), &name_text)?;
            if !seen.insert(name.clone()) {
                return Err(SiteError::invalid(
                    format!("{key}.NodeName"),
                    format!("node {name} is defined twice"),
                ));
            }
            out.push(NodeSpec {
                name,
                cpus: n.cpus,
                memory,
                jobfs,
                gpus,
                features: n.features.iter().cloned().collect(),
            });
        }
    }
    Ok(out)
}

fn qos(key: &str, q: &RawQos) -> Result<Qos> {
    let mut out = Qos::new(name(&format!("{key}.Name"), &q.name)?);
    if let Some(v) = q.priority {
        out.priority = v;
    }
    for p in &q.preempt {
        out.preempt.insert(name(&format!("{key}.Preempt"), p)?);
    }
    out.preempt_mode = preempt_mode(q.preempt_mode);
    if let Some(v) = q.usage_factor {
        out.usage_factor = milli(&format!("{key}.UsageFactor"), v)?;
    }
    if let Some(d) = &q.target_queue_time {
        out.target_queue_time = duration(&format!("{key}.TargetQueueTime"), d)?;
    }
    let l = &mut out.limits;
    if let Some(d) = &q.max_wall {
        l.max_wall = duration(&format!("{key}.MaxWall"), d)?;
    }
    l.max_jobs_per_user = q.max_jobs_per_user;
    l.max_submit_jobs_per_user = q.max_submit_jobs_per_user;
    l.grp_jobs = q.grp_jobs;
    if let Some(t) = &q.max_tres_per_user {
        l.max_cpus_per_user = Some(tres_cpu(&format!("{key}.MaxTRESPerUser"), t)?);
    }
    if let Some(t) = &q.grp_tres {
        l.grp_cpus = Some(tres_cpu(&format!("{key}.GrpTRES"), t)?);
    }
    if let Some(t) = &q.grp_tres_run_mins {
        l.grp_cpu_run_mins = Some(tres_cpu(&format!("{key}.GrpTRESRunMins"), t)?);
    }
    Ok(out)
}

fn assoc_limits(
    key: &str,
    max_jobs: Option<u32>,
    run_mins: Option<&String>,
    ps: Option<&RawMaxPs>,
) -> Result<AssocLimits> {
    let mut l = AssocLimits {
        max_jobs,
        ..AssocLimits::default()
    };
    if let Some(t) = run_mins {
        l.grp_cpu_run_mins = Some(tres_cpu(&format!("{key}.GrpTRESRunMins"), t)?);
    }
    if let Some(m) = ps {
        (l.maxps_soft, l.maxps_hard) = max_ps(&format!("{key}.MAXPS"), m)?;
    }
    Ok(l)
}

fn accounts(raw: &[RawAccount]) -> Result<Vec<AccountDef>> {
    let root: AccountName = name("accounts", crate::account::ROOT)?;
    let mut defined: BTreeSet<AccountName> = BTreeSet::from([root.clone()]);
    let mut out = Vec::new();
    for (i, a) in raw.iter().enumerate() {
        let key = format!("accounts[{i}]");
        let account: AccountName = name(&format!("{key}.Name"), &a.name)?;
        if account == root {
            return Err(SiteError::invalid(
                format!("{key}.Name"),
                "root exists already; define the accounts under it",
            ));
        }
        let parent: AccountName = match &a.parent {
            Some(p) => name(&format!("{key}.Parent"), p)?,
            None => root.clone(),
        };
        if !defined.contains(&parent) {
            return Err(SiteError::invalid(
                format!("{key}.Parent"),
                format!("account {parent} is not defined before {account}; list parents first"),
            ));
        }
        if !defined.insert(account.clone()) {
            return Err(SiteError::invalid(
                format!("{key}.Name"),
                format!("account {account} is defined twice"),
            ));
        }
        let shares = a.fairshare.unwrap_or(1);
        if shares == 0 {
            return Err(SiteError::invalid(
                format!("{key}.Fairshare"),
                "must be at least 1",
            ));
        }
        let grant = match a.grant_su {
            None => None,
            Some(su) if su.is_finite() && (0.0..=1e15).contains(&su) => Some(Grant {
                granted_milli_su: (su * 1000.0).round() as u64,
                used_milli_su: 0,
            }),
            Some(su) => {
                return Err(SiteError::invalid(
                    format!("{key}.GrantSU"),
                    format!("{su} is out of range; allowed 0 to 1e15"),
                ));
            }
        };
        out.push(AccountDef {
            name: account,
            parent,
            shares,
            limits: assoc_limits(
                &key,
                a.max_jobs,
                a.grp_tres_run_mins.as_ref(),
                a.max_ps.as_ref(),
            )?,
            grant,
            coordinators: a
                .coordinators
                .iter()
                .enumerate()
                .map(|(j, u)| name(&format!("{key}.Coordinators[{j}]"), u))
                .collect::<Result<_>>()?,
        });
    }
    Ok(out)
}

fn partition(
    key: &str,
    p: &RawPartition,
    all: &BTreeSet<NodeName>,
    max_tres: bool,
) -> Result<Partition> {
    let nodes: BTreeSet<NodeName> = if p.nodes.eq_ignore_ascii_case("ALL") {
        all.clone()
    } else {
        let k = format!("{key}.Nodes");
        let mut set = BTreeSet::new();
        for n in
            crate::hostlist::expand(&p.nodes).map_err(|e| SiteError::invalid(&k, e.to_string()))?
        {
            let n: NodeName = name(&k, &n)?;
            if !all.contains(&n) {
                return Err(SiteError::invalid(
                    &k,
                    format!("node {n} is not defined in [[nodes]]"),
                ));
            }
            set.insert(n);
        }
        set
    };
    let mut out = Partition::new(name(&format!("{key}.PartitionName"), &p.name)?, nodes);
    out.is_default = p.default;
    out.up = !matches!(p.state, Some(RawPartitionState::Down));
    if let Some(v) = p.priority_tier {
        out.priority_tier = v;
    }
    if let Some(v) = p.priority_job_factor {
        out.priority_job_factor = v;
    }
    if let Some(d) = &p.default_time {
        out.default_time = duration(&format!("{key}.DefaultTime"), d)?;
    }
    if let Some(d) = &p.max_time {
        out.max_time = duration(&format!("{key}.MaxTime"), d)?;
    }
    if let (Some(def), Some(max)) = (out.default_time, out.max_time)
        && def > max
    {
        return Err(SiteError::invalid(
            format!("{key}.DefaultTime"),
            format!("{def} exceeds MaxTime {max}"),
        ));
    }
    out.max_nodes = p.max_nodes;
    if let Some(s) = &p.def_mem_per_cpu {
        out.def_mem_per_cpu = Some(size(&format!("{key}.DefMemPerCPU"), s)?);
    }
    out.preempt_mode = preempt_mode(p.preempt_mode);
    if let Some(v) = p.charge_rate {
        out.charge_rate = milli(&format!("{key}.ChargeRate"), v)?;
    }
    if let Some(v) = p.usage_factor {
        out.usage_factor = milli(&format!("{key}.UsageFactor"), v)?;
    }
    out.billing = match &p.tres_billing_weights {
        Some(t) => billing(&format!("{key}.TRESBillingWeights"), t, max_tres)?,
        None => BillingWeights {
            max_tres,
            ..BillingWeights::default()
        },
    };
    if let Some(list) = &p.allow_qos {
        let k = format!("{key}.AllowQos");
        out.allowed_qos = Some(list.iter().map(|q| name(&k, q)).collect::<Result<_>>()?);
    }
    if let Some(list) = &p.allow_accounts {
        let k = format!("{key}.AllowAccounts");
        out.allowed_accounts = Some(list.iter().map(|a| name(&k, a)).collect::<Result<_>>()?);
    }
    if let Some(q) = &p.qos {
        out.default_qos = Some(name(&format!("{key}.QOS"), q)?);
    }
    out.limits = PartitionLimits {
        max_jobs_per_user: p.max_jobs_per_user,
        max_submit_jobs_per_user: p.max_submit_jobs_per_user,
        max_cpus_per_user: match &p.max_tres_per_user {
            Some(t) => Some(tres_cpu(&format!("{key}.MaxTRESPerUser"), t)?),
            None => None,
        },
    };
    Ok(out)
}

fn user(key: &str, u: &RawUser) -> Result<UserDef> {
    let default_account: AccountName = name(&format!("{key}.DefaultAccount"), &u.default_account)?;
    let mut accounts: BTreeMap<AccountName, ()> = BTreeMap::new();
    accounts.insert(default_account.clone(), ());
    for a in &u.accounts {
        accounts.insert(name(&format!("{key}.Accounts"), a)?, ());
    }
    let shares = u.fairshare.unwrap_or(1);
    if shares == 0 {
        return Err(SiteError::invalid(
            format!("{key}.Fairshare"),
            "must be at least 1",
        ));
    }
    let limits = assoc_limits(
        key,
        u.max_jobs,
        u.grp_tres_run_mins.as_ref(),
        u.max_ps.as_ref(),
    )?;
    let assoc = UserAssoc {
        shares,
        priority: u.priority.unwrap_or(0),
        limits,
    };
    Ok(UserDef {
        user: User {
            name: name(&format!("{key}.Name"), &u.name)?,
            default_account,
            admin: matches!(
                u.admin_level,
                Some(RawAdminLevel::Operator | RawAdminLevel::Administrator)
            ),
        },
        assocs: accounts.into_keys().map(|a| (a, assoc.clone())).collect(),
    })
}
