//! Priority formulas and the order of consideration, with the seeds' numbers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::{Cluster, jr, name};
use docket_core::account::{AssocLimits, Grant};
use docket_core::command::EndCause;
use docket_core::config::SchedConfig;
use docket_core::fairshare::FairshareAlgorithm;
use docket_core::job::{Reason, TimeRequest};
use docket_core::partition::{Milli, Partition};
use docket_core::priority::{self, Flux, It4i, Multifactor, PriorityFormula};
use docket_core::qos::Qos;
use docket_core::quantity::Seconds;
use docket_core::{Command, JobId};

fn with_formula(formula: PriorityFormula, fs: FairshareAlgorithm) -> Cluster {
    let mut config = SchedConfig::default();
    config.priority.formula = formula;
    config.fairshare.algorithm = fs;
    config.fairshare.half_life = Seconds::hours(168);
    Cluster::new(config, 2)
}

fn partition(c: &mut Cluster, name_: &str, factor: u32, tier: u32) {
    let mut p = Partition::new(name(name_), BTreeSet::from([name("n001"), name("n002")]));
    p.priority_job_factor = factor;
    p.priority_tier = tier;
    p.def_mem_per_cpu = Some(docket_core::quantity::MiB::gib(1));
    c.ok(Command::UpsertPartition(Box::new(p)));
}

fn qos(c: &mut Cluster, name_: &str, priority: u32) {
    let mut q = Qos::new(name(name_));
    q.priority = priority;
    c.ok(Command::UpsertQos(Box::new(q)));
}

fn explain(c: &Cluster, id: JobId) -> priority::Explanation {
    let inputs = c.state.priority_inputs(c.now);
    priority::explain(&inputs, c.job(id))
}

fn factor(e: &priority::Explanation, name: &str) -> (f64, f64, f64) {
    let f = e.factors.iter().find(|f| f.name == name).unwrap();
    (f.value, f.weight, f.contribution)
}

/// IT4I: 1000*queue_priority + fairshare/1000 + eligible_time/864000, with fairshare =
/// 1E6 * (1 - usage_project/usage_total).
#[test]
fn it4i_formula_with_its_numbers() {
    let mut c = with_formula(
        PriorityFormula::It4i(It4i::default()),
        FairshareAlgorithm::It4i,
    );
    // Queue priorities 1 (qprod) and 2 (qlong-ish); the fixture's `work` has factor 1.
    partition(&mut c, "qprod", 1, 1);
    partition(&mut c, "qfast", 2, 1);
    c.set_account("p2", AssocLimits::default(), None);
    c.add_user("carol", "p2");
    // Usage: proj (alice) 3 cpu-hours, p2 (carol) 1 cpu-hour: proj 0.75 of the total.
    let mut a = c.spec("alice");
    a.ntasks = 3;
    a.partition = Some(name("qprod"));
    let mut b = c.spec("carol");
    b.partition = Some(name("qprod"));
    let ids = c.submit(vec![a]);
    let idc = c.submit(vec![b]);
    c.start(jr(ids[0]), &["n001"]).unwrap();
    c.start(jr(idc[0]), &["n001"]).unwrap();
    c.apply_after(3600, Command::Tick).unwrap();
    c.end(ids[0], EndCause::Exited, 0);
    c.end(idc[0], EndCause::Exited, 0);
    // Now a job of each, one day eligible.
    let mut j1 = c.spec("alice");
    j1.partition = Some(name("qprod"));
    let mut j2 = c.spec("carol");
    j2.partition = Some(name("qfast"));
    let x = c.submit(vec![j1])[0];
    let y = c.submit(vec![j2])[0];
    c.apply_after(86_400, Command::Tick).unwrap();
    // Usage decays by the same factor for both projects, so the ratio stays 3:1.
    let e = explain(&c, x);
    assert!((factor(&e, "fairshare").2 - 250.0).abs() < 1e-9, "{e:?}");
    assert!((factor(&e, "queue").2 - 1000.0).abs() < 1e-9);
    assert!((factor(&e, "eligible_time").2 - 0.1).abs() < 1e-9);
    assert!((e.priority - 1250.1).abs() < 1e-9, "{}", e.priority);
    let e = explain(&c, y);
    assert!(
        (e.priority - (2000.0 + 750.0 + 0.1)).abs() < 1e-9,
        "{}",
        e.priority
    );
    // Queue priority dominates: "other properties cannot compete with queue priority".
    assert!(explain(&c, y).priority > explain(&c, x).priority);
}

/// GWDG's multifactor weights: partition 1,000,000, fair-share 100,000, QOS 10,000, age
/// 10,000 (full after 5 days), job size 1,000; the *:test partitions have factor 10, the
/// others 1; QOS interactive 1000, 2h 100, others 0; nice is subtracted.
#[test]
fn gwdg_multifactor_weights() {
    let mut c = with_formula(
        PriorityFormula::Multifactor(Multifactor::gwdg()),
        FairshareAlgorithm::FairTree,
    );
    partition(&mut c, "medium", 1, 1);
    partition(&mut c, "medium-test", 10, 100);
    qos(&mut c, "interactive", 1000);
    qos(&mut c, "2h", 100);
    let mut t = c.spec("alice");
    t.partition = Some(name("medium-test"));
    t.qos = Some(name("2h"));
    t.nodes = 1;
    let mut m = c.spec("bob");
    m.partition = Some(name("medium"));
    m.qos = Some(name("interactive"));
    m.nodes = 2;
    m.ntasks = 2;
    m.nice = 0;
    let a = c.submit(vec![t])[0];
    let b = c.submit(vec![m])[0];
    c.apply_after(Seconds::days(5).0 / 2, Command::Tick)
        .unwrap();
    let ea = explain(&c, a);
    assert_eq!(factor(&ea, "partition"), (1.0, 1_000_000.0, 1_000_000.0));
    assert_eq!(factor(&ea, "qos"), (0.1, 10_000.0, 1_000.0));
    assert_eq!(factor(&ea, "age"), (0.5, 10_000.0, 5_000.0));
    assert_eq!(factor(&ea, "jobsize"), (0.5, 1_000.0, 500.0));
    // Both users unused: Fair Tree ranks them equal, at the top.
    assert_eq!(factor(&ea, "fairshare"), (1.0, 100_000.0, 100_000.0));
    let eb = explain(&c, b);
    assert_eq!(factor(&eb, "partition").2, 100_000.0);
    assert_eq!(factor(&eb, "qos").2, 10_000.0);
    assert_eq!(factor(&eb, "jobsize").2, 1_000.0);
    assert_eq!(
        ea.priority,
        1_000_000.0 + 1_000.0 + 5_000.0 + 500.0 + 100_000.0
    );
    // Age stops at PriorityMaxAge.
    c.apply_after(Seconds::days(30).0, Command::Tick).unwrap();
    assert_eq!(factor(&explain(&c, a), "age").0, 1.0);
}

/// Flux: "The user can assign a user factor that can only lower a job's priority".
#[test]
fn flux_user_factor_only_lowers() {
    let flux = Flux {
        max_wait: Seconds::days(7),
        weight_wait: 1000,
        weight_fairshare: 1000,
        weight_qos: 0,
        weight_queue: 0,
        weight_job_size: 0,
        weight_user: 1000,
    };
    let mut c = with_formula(PriorityFormula::Flux(flux), FairshareAlgorithm::Classic);
    let normal = c.spec("alice");
    let mut lowered = c.spec("alice");
    lowered.user_factor_pct = 40;
    let mut above = c.spec("alice");
    above.user_factor_pct = 150;
    let ids = c.submit(vec![normal, lowered]);
    let p0 = explain(&c, ids[0]).priority;
    let p1 = explain(&c, ids[1]).priority;
    assert_eq!(
        factor(&explain(&c, ids[0]), "user").0,
        1.0,
        "the default is the maximum"
    );
    assert!((p0 - p1 - 600.0).abs() < 1e-9);
    // Asking for more than 100% is refused, not capped silently.
    let r = c.submit_as(docket_core::Actor::User(name("alice")), vec![above]);
    assert!(
        r[0].clone()
            .unwrap_err()
            .to_string()
            .contains("user_factor_pct")
    );
    // Classic fair-share: an unused user is at 1.0.
    assert_eq!(factor(&explain(&c, ids[0]), "fairshare").0, 1.0);
}

/// Seed 003's order: preemptors, reservations, partition tier, priority, submit time, id.
#[test]
fn slurm_order_of_consideration_and_tie_breaks() {
    let mut c = with_formula(
        PriorityFormula::Multifactor(Multifactor::gwdg()),
        FairshareAlgorithm::FairTree,
    );
    partition(&mut c, "low", 1, 1);
    partition(&mut c, "test", 1, 100);
    qos(&mut c, "high", 1000);
    let mut pre = Qos::new(name("preemptor"));
    pre.preempt = BTreeSet::from([name("normal")]);
    c.ok(Command::UpsertQos(Box::new(pre)));
    let job = |c: &Cluster, p: &str, q: &str| {
        let mut s = c.spec("alice");
        s.partition = Some(name(p));
        s.qos = Some(name(q));
        s
    };
    let tier_low = c.submit(vec![job(&c, "test", "normal")])[0];
    let high_prio = c.submit(vec![job(&c, "low", "high")])[0];
    let first = c.submit(vec![job(&c, "low", "normal")])[0];
    c.apply_after(1, Command::Tick).unwrap();
    let same_time = c.submit(vec![job(&c, "low", "normal"), job(&c, "low", "normal")]);
    let preemptor = c.submit(vec![job(&c, "low", "preemptor")])[0];
    // Ages differ by a second; make priority ties exact by freezing age out.
    let mut config = c.state.config.clone();
    if let PriorityFormula::Multifactor(m) = &mut config.priority.formula {
        m.weight_age = 0;
    }
    c.ok(Command::SetConfig(Box::new(config)));
    let order = c.state.consideration_order(c.now);
    assert_eq!(
        order,
        vec![
            preemptor,
            tier_low,
            high_prio,
            first,
            same_time[0],
            same_time[1]
        ],
        "preemptor, then tier 100, then QOS priority, then submit time, then id"
    );
}

/// Usage accrues while jobs run, counts the partition's usage factor (IT4I's qexp is not
/// charged), halves every week, and the project's grant is charged in SUs at the end.
#[test]
fn usage_accrual_decay_and_charging() {
    let mut c = with_formula(PriorityFormula::Fcfs, FairshareAlgorithm::It4i);
    let mut qexp = Partition::new(name("qexp"), BTreeSet::from([name("n002")]));
    qexp.usage_factor = Milli::ZERO;
    qexp.charge_rate = Milli(3000);
    qexp.def_mem_per_cpu = Some(docket_core::quantity::MiB::gib(1));
    c.ok(Command::UpsertPartition(Box::new(qexp)));
    let grant = Grant {
        granted_milli_su: 100_000,
        used_milli_su: 0,
    };
    c.set_account("proj", AssocLimits::default(), Some(grant));
    let mut s = c.spec("alice");
    s.ntasks = 4;
    s.time = TimeRequest::Limit(Seconds::hours(3));
    let mut e = s.clone();
    e.partition = Some(name("qexp"));
    let ids = c.submit(vec![s, e]);
    c.start(jr(ids[0]), &["n001"]).unwrap();
    c.start(jr(ids[1]), &["n002"]).unwrap();
    c.apply_after(1800, Command::Tick).unwrap();
    let half_life = c.state.config.fairshare.half_life;
    let at = |c: &Cluster| {
        c.state
            .usage
            .usage(&name("proj"), &name("alice"), c.now, half_life)
    };
    // 4 cpus x 1800 s, decayed a little over 1800 s; qexp adds nothing.
    let after_tick = at(&c);
    assert!(after_tick > 7190.0 && after_tick <= 7200.0, "{after_tick}");
    c.apply_after(1800, Command::Tick).unwrap();
    c.end(ids[0], EndCause::Exited, 0);
    c.end(ids[1], EndCause::Exited, 0);
    // One hour at 4 cpus: 4 SU at rate 1, 12 SU in qexp at rate 3 (charged, though not
    // counted for fair-share).
    let grant = c.state.accounts.get(&name("proj")).unwrap().grant.unwrap();
    assert_eq!(grant.used_milli_su, 16_000);
    // A week later the usage has halved.
    let before = at(&c);
    c.apply_after(Seconds::hours(168).0, Command::Tick).unwrap();
    assert!((at(&c) - before / 2.0).abs() < 1e-6);
}

/// "bonus: jobs use of idle cpu cycles by projects with no grant left", charge 0.
#[test]
fn a_spent_grant_runs_as_bonus_or_waits() {
    let mut c = with_formula(PriorityFormula::Fcfs, FairshareAlgorithm::FairTree);
    let grant = Grant {
        granted_milli_su: 1_000,
        used_milli_su: 1_000,
    };
    c.set_account("proj", AssocLimits::default(), Some(grant));
    let id = c.submit(vec![c.spec("alice")])[0];
    assert_eq!(c.job(id).reason, Reason::AccountGrantExhausted);
    qos(&mut c, "bonus", 0);
    let mut config = c.state.config.clone();
    config.bonus_qos = Some(name("bonus"));
    c.ok(Command::SetConfig(Box::new(config)));
    assert_eq!(c.job(id).resolved.qos.as_str(), "bonus");
    assert_eq!(c.job(id).reason, Reason::None);
    c.start(jr(id), &["n001"]).unwrap();
    c.apply_after(3600, Command::Tick).unwrap();
    c.end(id, EndCause::Exited, 0);
    let grant = c.state.accounts.get(&name("proj")).unwrap().grant.unwrap();
    assert_eq!(grant.used_milli_su, 1_000, "bonus runs are not charged");
}

/// NCI: "the effect is to promote the queued jobs of users/projects with no running jobs and
/// demote those of a user/project with many (or large) running jobs".
#[test]
fn nci_shuffle_promotes_users_with_nothing_running() {
    use docket_core::config::{QueueOrdering, ShuffleBy};
    let mut c = with_formula(PriorityFormula::Fcfs, FairshareAlgorithm::FairTree);
    let mut config = c.state.config.clone();
    config.queue_ordering = QueueOrdering::Shuffle(ShuffleBy::User);
    c.ok(Command::SetConfig(Box::new(config)));
    let mut big = c.spec("alice");
    big.ntasks = 8;
    let running = c.submit(vec![big])[0];
    c.start(jr(running), &["n001"]).unwrap();
    let mut four = c.spec("alice");
    four.ntasks = 4;
    let a = c.submit(vec![four.clone(), four.clone(), four])[..].to_vec();
    let mut b4 = c.spec("bob");
    b4.ntasks = 4;
    let b = c.submit(vec![b4])[0];
    let scores = c.state.shuffle_scores(ShuffleBy::User);
    assert_eq!(
        [scores[&a[0]], scores[&a[1]], scores[&a[2]], scores[&b]],
        [8, 12, 16, 0]
    );
    assert_eq!(
        c.state.consideration_order(c.now),
        vec![b, a[0], a[1], a[2]]
    );
    // Plain FCFS would have taken alice's first.
    let mut config = c.state.config.clone();
    config.queue_ordering = QueueOrdering::Priority;
    c.ok(Command::SetConfig(Box::new(config)));
    assert_eq!(
        c.state.consideration_order(c.now),
        vec![a[0], a[1], a[2], b]
    );
}
