//! The site configuration file: the example configurations of the seed sites parse, build a
//! state and say what the seeds say; bad files get errors naming the key and what it
//! accepts; and `docket sim` replays on a site with its policies (preemption, walltime cap,
//! Maui's idle cap).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use docket_core::config::{BackfillMode, QueueOrdering, QueuePolicy, SchedParams, ShuffleBy};
use docket_core::fairshare::FairshareAlgorithm;
use docket_core::partition::{Milli, PreemptMode};
use docket_core::priority::{Multifactor, PriorityFormula};
use docket_core::quantity::{MiB, Seconds, TimeMs};
use docket_core::sim::swf::{SwfJob, Trace};
use docket_core::sim::{Policy, SimOptions, SimSite, replay};
use docket_core::site::{self, SiteConfig, SiteError};

fn example(name: &str) -> SiteConfig {
    let path = manifest_dir().join("../../deploy/config").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let file = site::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // It builds a state, and the [sim] table parses.
    file.site.to_state(TimeMs(0)).unwrap();
    SimSite::from_file(&file).unwrap();
    file.site
}

fn partition<'a>(s: &'a SiteConfig, name: &str) -> &'a docket_core::partition::Partition {
    s.partitions
        .iter()
        .find(|p| p.name.as_str() == name)
        .unwrap()
}

#[test]
fn every_example_configuration_is_valid() {
    let dir = manifest_dir().join("../../deploy/config");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            example(path.file_name().unwrap().to_str().unwrap());
            seen += 1;
        }
    }
    assert!(seen >= 4, "the four seed sites at least");
}

#[test]
fn hpc2n_is_maui_with_idle_and_total_caps_maxps_and_five_days() {
    let s = example("hpc2n.toml");
    assert_eq!(s.sched.queue_policy, QueuePolicy::hpc2n());
    assert_eq!(s.sched.max_walltime, Some(Seconds::days(5)));
    assert!(matches!(s.sched.priority.formula, PriorityFormula::Maui(_)));
    assert_eq!(s.nodes.len(), 635);
    assert!(
        s.nodes
            .iter()
            .all(|n| n.cpus == 8 && n.memory == MiB::gib(16))
    );
    let snac = s
        .accounts
        .iter()
        .find(|a| a.name.as_str() == "snic2011-1-1")
        .unwrap();
    assert_eq!(
        (snac.limits.maxps_soft, snac.limits.maxps_hard),
        (Some(72_000_000), Some(216_000_000)),
        "hard = 3 x soft"
    );
}

#[test]
fn nci_has_charged_queues_suspension_grants_and_the_shuffle() {
    let s = example("nci.toml");
    let express = partition(&s, "express");
    let normal = partition(&s, "normal");
    assert!(express.priority_tier > normal.priority_tier, "priority-run");
    assert_eq!(
        (express.charge_rate, normal.charge_rate),
        (Milli(3000), Milli(1000))
    );
    assert_eq!(normal.preempt_mode, PreemptMode::Suspend);
    assert!(s.sched.preempt.parallel_run.is_some());
    assert_eq!(s.sched.bonus_qos.as_ref().unwrap().as_str(), "bonus");
    assert_eq!(
        s.qos
            .iter()
            .find(|q| q.name.as_str() == "bonus")
            .unwrap()
            .usage_factor,
        Milli(0)
    );
    assert_eq!(
        s.sched.queue_ordering,
        QueueOrdering::Shuffle(ShuffleBy::Project)
    );
    assert_eq!(s.sched.default_jobfs, MiB(100));
    let a99 = s
        .accounts
        .iter()
        .find(|a| a.name.as_str() == "a99")
        .unwrap();
    assert_eq!(a99.grant.unwrap().granted_milli_su, 50_000_000);
}

#[test]
fn gwdg_has_its_weights_loop_limits_and_tiers() {
    let s = example("gwdg.toml");
    assert_eq!(
        s.sched.priority.formula,
        PriorityFormula::Multifactor(Multifactor::gwdg())
    );
    assert_eq!(s.sched.fairshare.algorithm, FairshareAlgorithm::FairTree);
    let p = &s.sched.sched;
    let gwdg = SchedParams::gwdg();
    assert_eq!(
        (p.default_queue_depth, p.partition_job_depth, p.bf_window),
        (
            gwdg.default_queue_depth,
            gwdg.partition_job_depth,
            gwdg.bf_window
        )
    );
    assert_eq!(
        (p.bf_max_job_test, p.bf_max_job_user, p.bf_max_job_part),
        (2000, 15, 200)
    );
    assert_eq!(p.loops.max_sched_time, Seconds(8));
    assert_eq!(p.loops.bf_interval, Seconds(45));
    assert_eq!(p.loops.bf_max_time, Seconds(75));
    assert_eq!(p.loops.max_rpc_cnt, 50);
    assert_eq!(partition(&s, "standard96:test").priority_tier, 100);
    assert_eq!(partition(&s, "standard96:test").priority_job_factor, 10);
    assert_eq!(partition(&s, "large96").priority_tier, 20);
    assert_eq!(partition(&s, "standard96").priority_tier, 1);
}

#[test]
fn it4i_uses_its_formula_and_leaves_qexp_uncharged() {
    let s = example("it4i.toml");
    assert!(matches!(s.sched.priority.formula, PriorityFormula::It4i(_)));
    assert_eq!(s.sched.fairshare.algorithm, FairshareAlgorithm::It4i);
    assert_eq!(s.sched.fairshare.half_life, Seconds::days(7));
    assert_eq!(partition(&s, "qexp").usage_factor, Milli(0));
    assert!(partition(&s, "qexp").priority_job_factor > partition(&s, "qprod").priority_job_factor);
}

/// A small valid file to break one key at a time.
const BASE: &str = r#"
[[nodes]]
NodeName = "n[1-2]"
CPUs = 4
RealMemory = "8G"

[[partitions]]
PartitionName = "work"
Nodes = "ALL"
Default = true

[[qos]]
Name = "normal"
"#;

fn error_of(text: &str) -> String {
    let e = match site::parse(text) {
        Ok(f) => match f.site.to_state(TimeMs(0)) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e,
        },
        Err(e) => e,
    };
    e.to_string()
}

/// Site-file fragments that must be refused, with the words the refusal must contain: the
/// key, and what it accepts.
const BAD_FRAGMENTS: &[(&str, &[&str])] = &[
    (
        "[SchedulerParameters]\nbf_windw = 10\n",
        &["bf_windw", "bf_window"],
    ),
    (
        "SchedulerType = \"sched/fifo\"\n",
        &["SchedulerType", "sched/backfill", "sched/builtin"],
    ),
    (
        "PriorityType = \"priority/lottery\"\n",
        &["priority/multifactor", "priority/basic"],
    ),
    ("MaxWallTime = \"5 days\"\n", &["MaxWallTime", "D-H:M:S"]),
    (
        "[SchedulerParameters]\nbf_resolution = 0\n",
        &["SchedulerParameters.bf_resolution", "allowed 1 to 3600"],
    ),
    (
        "[SchedulerParameters]\nbf_mode = \"aggressive\"\n",
        &["bf_mode", "easy", "conservative"],
    ),
    (
        "PriorityType = \"priority/basic\"\nPriorityWeightAge = 5\n",
        &["PriorityWeightAge", "priority/multifactor"],
    ),
    ("DefaultJobfs = \"12Q\"\n", &["DefaultJobfs", "unit"]),
    (
        "[[accounts]]\nName = \"child\"\nParent = \"nobody\"\n",
        &["accounts[0].Parent", "nobody", "list parents first"],
    ),
    (
        "[[users]]\nName = \"alice\"\nDefaultAccount = \"nowhere\"\n",
        &["user alice", "nowhere"],
    ),
    (
        "[[partitions]]\nPartitionName = \"p2\"\nNodes = \"m[1-2]\"\n",
        &["partitions[1].Nodes", "m1", "not defined"],
    ),
    (
        "[[partitions]]\nPartitionName = \"p2\"\nNodes = \"ALL\"\nDefault = true\n",
        &["partitions", "Default"],
    ),
    (
        "[[partitions]]\nPartitionName = \"p2\"\nNodes = \"ALL\"\nPreemptMode = \"KILL\"\n",
        &["PreemptMode", "SUSPEND", "REQUEUE"],
    ),
    (
        "[[partitions]]\nPartitionName = \"p2\"\nNodes = \"ALL\"\nTRESBillingWeights = \"CPU=1,Power=2\"\n",
        &["partitions[1].TRESBillingWeights", "power", "GRES/gpu"],
    ),
    (
        "[[partitions]]\nPartitionName = \"p2\"\nNodes = \"ALL\"\nAllowQos = [\"gold\"]\n",
        &["partition p2", "gold"],
    ),
    (
        "[[nodes]]\nNodeName = \"x[1-99999999]\"\nCPUs = 1\nRealMemory = 1\n",
        &["nodes[1].NodeName", "at most"],
    ),
    (
        "[[nodes]]\nNodeName = \"n1\"\nCPUs = 1\nRealMemory = 1\n",
        &["nodes[1].NodeName", "n1", "twice"],
    ),
    ("[[qos]]\nName = \"normal\"\n", &["qos", "normal", "twice"]),
    (
        "[[qos]]\nName = \"q2\"\nGrpTRES = \"mem=10\"\n",
        &["qos[1].GrpTRES", "cpu=N"],
    ),
    (
        "[QueuePolicy]\nMAXPS = [10, 5]\n",
        &["QueuePolicy.MAXPS", "exceeds the hard limit"],
    ),
    (
        "[SchedulerParameters]\nbf_order = \"random\"\n",
        &["bf_order", "queue", "shortest"],
    ),
    (
        "[SchedulerParameters]\nruntime_predictor = \"oracle\"\n",
        &["runtime_predictor", "time_limit", "recent_average"],
    ),
    (
        "[SchedulerParameters]\nstarvation_wait = 0\n",
        &["SchedulerParameters.starvation_wait", "allowed 1 to"],
    ),
    (
        "[PriorityRuntime]\nOrder = \"shortest\"\n",
        &["PriorityRuntime", "priority/runtime"],
    ),
];

#[test]
fn errors_name_the_key_and_what_it_accepts() {
    site::parse(BASE).unwrap().site.to_state(TimeMs(0)).unwrap();
    let cases = BAD_FRAGMENTS;
    for (extra, wanted) in cases {
        // Top-level keys go before the tables, tables after.
        let text = if extra.starts_with('[') {
            format!("{BASE}{extra}")
        } else {
            format!("{extra}{BASE}")
        };
        let e = error_of(&text);
        for w in *wanted {
            assert!(e.contains(w), "error for {extra:?} lacks {w:?}: {e}");
        }
    }
}

#[test]
fn the_sim_table_is_checked_by_the_simulator() {
    let text = format!("{BASE}[sim]\nqueues = {{ x = {{ partition = \"work\" }} }}\n");
    let file = site::parse(&text).unwrap();
    let e = SimSite::from_file(&file).unwrap_err();
    assert!(
        matches!(&e, SiteError::Invalid { key, .. } if key == "sim.queues.x"),
        "{e}"
    );
}

fn swf(id: u64, submit: u64, procs: u64, runtime: u64, queue: i64) -> SwfJob {
    SwfJob {
        id,
        submit,
        runtime,
        procs,
        estimate: runtime.max(1) * 2,
        user: id as i64 % 2,
        group: 1,
        queue,
        partition: -1,
    }
}

fn replay_on(text: &str, jobs: Vec<SwfJob>) -> docket_core::sim::Replay {
    let file = site::parse(text).unwrap();
    let options = SimOptions {
        policy: None,
        procs: None,
        max_jobs: None,
        site: Some(SimSite::from_file(&file).unwrap()),
    };
    replay(
        &Trace {
            jobs,
            ..Trace::default()
        },
        &options,
        &mut |_, _| {},
    )
    .unwrap()
}

#[test]
fn sim_on_a_site_suspends_for_express_and_resumes_after() {
    let text = r#"
        PriorityType = "priority/basic"
        [[nodes]]
        NodeName = "n1"
        CPUs = 8
        RealMemory = "16G"
        [[partitions]]
        PartitionName = "normal"
        Nodes = "ALL"
        Default = true
        PreemptMode = "SUSPEND"
        [[partitions]]
        PartitionName = "express"
        Nodes = "ALL"
        PriorityTier = 10
        [[qos]]
        Name = "normal"
        [sim]
        queues = { 2 = { partition = "express" } }
    "#;
    // A normal job fills the node; an express one arrives at 20 and runs 10 s.
    let r = replay_on(text, vec![swf(1, 0, 8, 100, 1), swf(2, 20, 4, 10, 2)]);
    assert_eq!(r.summary.policy, Policy::EASY);
    let by_id = |id| r.outcomes.iter().find(|o| o.swf_id == id).unwrap();
    assert_eq!((by_id(2).start, by_id(2).end), (20, 30));
    // Suspended from 20 to 30: its 100 s of work end at 110.
    assert_eq!((by_id(1).start, by_id(1).end), (0, 110));
    assert_eq!(r.summary.jobs, 2);
}

#[test]
fn sim_on_a_site_counts_what_its_policies_refuse_and_never_start() {
    let text = r#"
        MaxWallTime = "5-0"
        [QueuePolicy]
        MAXIJOB = 2
        [[nodes]]
        NodeName = "n[1-4]"
        CPUs = 8
        RealMemory = "16G"
        [[partitions]]
        PartitionName = "batch"
        Nodes = "ALL"
        Default = true
        [[qos]]
        Name = "normal"
    "#;
    let mut long = swf(1, 0, 1, 6 * 86_400, 1);
    long.estimate = 6 * 86_400;
    // Five one-cpu jobs of one user at once: with two idle slots, the first pass starts
    // two, and Maui promotes the next as each starts: all five start at 0.
    let mut jobs = vec![long];
    for id in 2..7 {
        let mut j = swf(id, 0, 1, 50, 1);
        j.user = 7;
        jobs.push(j);
    }
    // A job wider than a node spans nodes.
    jobs.push(swf(9, 0, 12, 50, 1));
    let r = replay_on(text, jobs);
    assert_eq!(r.summary.refused, 1);
    assert!(
        r.summary
            .first_refusal
            .as_deref()
            .unwrap()
            .contains("site maximum walltime"),
        "{:?}",
        r.summary.first_refusal
    );
    assert_eq!(r.summary.jobs, 6);
    assert_eq!(r.summary.unstarted, 0);
    assert!(r.outcomes.iter().all(|o| o.start == 0), "{:?}", r.outcomes);
    assert_eq!(r.summary.procs, 32);
}

#[test]
fn sim_policy_defaults_to_the_site_and_can_be_overridden() {
    let text = format!("{BASE}[SchedulerParameters]\nbf_mode = \"conservative\"\n");
    let file = site::parse(&text).unwrap();
    assert_eq!(file.site.sched.sched.backfill, BackfillMode::Conservative);
    let mut options = SimOptions {
        policy: None,
        procs: None,
        max_jobs: None,
        site: Some(SimSite::from_file(&file).unwrap()),
    };
    let t = Trace {
        jobs: vec![swf(1, 0, 1, 10, 1)],
        ..Trace::default()
    };
    let r = replay(&t, &options, &mut |_, _| {}).unwrap();
    assert_eq!(r.summary.policy, Policy::CONSERVATIVE);
    options.policy = Some(Policy::FCFS);
    let r = replay(&t, &options, &mut |_, _| {}).unwrap();
    assert_eq!(r.summary.policy, Policy::FCFS);
    // --procs conflicts with a site that defines nodes.
    options.procs = Some(64);
    let e = replay(&t, &options, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("--procs"), "{e}");
}

/// This crate's directory, read when the test runs (cargo and nextest set it) rather than
/// baked in at compile time: a test binary built from one clone and reused by another through
/// a shared target directory must still read the tree it is testing.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn account_coordinators_come_from_the_file() {
    let text = r#"
[[accounts]]
Name = "proj"
Coordinators = ["carol"]

[[users]]
Name = "carol"
DefaultAccount = "proj"

[[users]]
Name = "dave"
DefaultAccount = "proj"
"#;
    let file = site::parse(text).unwrap();
    let state = file.site.to_state(TimeMs(0)).unwrap();
    let carol = "carol".parse().unwrap();
    let dave = "dave".parse().unwrap();
    let proj = "proj".parse().unwrap();
    assert!(state.is_coordinator(&carol, &proj));
    assert!(!state.is_coordinator(&dave, &proj));
    // A coordinator who is not a user is refused, naming the object being built.
    let bad = text.replace("[\"carol\"]", "[\"nobody\"]");
    let err = site::parse(&bad)
        .unwrap()
        .site
        .to_state(TimeMs(0))
        .unwrap_err();
    assert!(err.to_string().contains("nobody"), "{err}");
}

#[test]
fn privacy_and_per_user_caps_come_from_the_file() {
    let text = format!(
        "PrivateData = [\"jobs\", \"usage\"]\nMaxSubmitJobsPerUser = 500\n\
         MaxScriptBytesPerUser = \"64M\"\n{BASE}"
    );
    let site = site::parse(&text).unwrap().site;
    let config = &site.sched;
    assert!(config.private_data.jobs && config.private_data.usage);
    assert!(!config.private_data.accounting);
    assert_eq!(config.user_caps.max_jobs, Some(500));
    assert_eq!(config.user_caps.max_script_bytes, Some(64 << 20));
    // 0 lifts a cap; the defaults keep one user from filling the queue.
    let site = site::parse(&format!("MaxSubmitJobsPerUser = 0\n{BASE}"))
        .unwrap()
        .site;
    assert_eq!(site.sched.user_caps.max_jobs, None);
    let site = site::parse(BASE).unwrap().site;
    assert_eq!(site.sched.user_caps.max_jobs, Some(10_000));
    assert!(
        !site.sched.private_data.jobs,
        "public by default, as in Slurm"
    );
    let e = error_of(&format!("PrivateData = [\"everything\"]\n{BASE}"));
    assert!(e.contains("PrivateData") || e.contains("everything"), "{e}");
}

/// slurmdbd's retention: `PurgeJobAfter` in hours, days or months, export on by default,
/// bad values named.
#[test]
fn archive_retention_comes_from_the_file() {
    use docket_core::config::ArchiveFormat;
    let site = site::parse(BASE).unwrap().site;
    assert_eq!(site.sched.retention.purge_job_after, None, "kept forever");
    let site = site::parse(&format!("PurgeJobAfter = \"12months\"\n{BASE}"))
        .unwrap()
        .site;
    let r = &site.sched.retention;
    assert_eq!(r.purge_job_after, Some(Seconds::hours(360 * 24)));
    assert!(
        r.archive_jobs,
        "exported before they go unless told otherwise"
    );
    assert_eq!(r.archive_format, ArchiveFormat::Csv);
    let site = site::parse(&format!(
        "PurgeJobAfter = \"36hours\"\nArchiveJobs = false\nArchiveFormat = \"swf\"\n{BASE}"
    ))
    .unwrap()
    .site;
    let r = &site.sched.retention;
    assert_eq!(r.purge_job_after, Some(Seconds::hours(36)));
    assert!(!r.archive_jobs);
    assert_eq!(r.archive_format, ArchiveFormat::Swf);
    for bad in [
        "0days",
        "12",
        "3 weeks",
        "-1days",
        "99999999999999999999days",
    ] {
        let e = error_of(&format!("PurgeJobAfter = \"{bad}\"\n{BASE}"));
        assert!(e.contains("PurgeJobAfter"), "{bad}: {e}");
    }
}

/// EASY++ and the runtime orders are site settings: `runtime_predictor`, `bf_order` and
/// `starvation_wait` in `[SchedulerParameters]`, `PriorityType = "priority/runtime"` with
/// its order; `priority/runtime` without an order is refused.
#[test]
fn runtime_predictions_and_orders_come_from_the_file() {
    use docket_core::config::BackfillOrder;
    use docket_core::predict::RuntimePredictor;
    use docket_core::priority::RuntimeOrder;
    let text = format!(
        "PriorityType = \"priority/runtime\"\n{BASE}[PriorityRuntime]\nOrder = \"xfactor\"\n\
         [SchedulerParameters]\nbf_order = \"shortest\"\nruntime_predictor = \"recent_average\"\n\
         starvation_wait = 86400\n"
    );
    let site = site::parse(&text).unwrap().site;
    let s = &site.sched;
    assert_eq!(
        s.priority.formula,
        PriorityFormula::Runtime(RuntimeOrder::LargestXfactor)
    );
    assert_eq!(s.sched.bf_order, BackfillOrder::Shortest);
    assert_eq!(s.sched.runtime_predictor, RuntimePredictor::RecentAverage);
    assert_eq!(s.sched.starvation_wait, Some(Seconds(86_400)));
    // Defaults: Slurm's behaviour.
    let plain = site::parse(BASE).unwrap().site;
    assert_eq!(plain.sched.sched.bf_order, BackfillOrder::Queue);
    assert_eq!(
        plain.sched.sched.runtime_predictor,
        RuntimePredictor::TimeLimit
    );
    assert_eq!(plain.sched.sched.starvation_wait, None);
    let e = error_of(&format!("PriorityType = \"priority/runtime\"\n{BASE}"));
    assert!(
        e.contains("PriorityRuntime.Order") && e.contains("xfactor"),
        "{e}"
    );
}
