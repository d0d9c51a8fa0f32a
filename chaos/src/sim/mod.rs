//! Deterministic simulation of the replicated core.
//!
//! Three replicas of openraft running docket-controller's `CoreMachine` over in-memory stores
//! and a simulated network, on one thread with virtual time: every delay, loss, crash,
//! partition and election timeout comes from the seed, so a seed replays the same run — the
//! same messages in the same order, the same faults, the same outcome (checked by comparing
//! the trace of two runs of one seed). A client submits jobs through whichever replica leads,
//! recording what was acknowledged; faults are crashes (a replica's `Raft` dropped, its stores
//! kept, restarted later), partitions (a replica cut from the others), and lossy periods.
//! Then the network heals, everything restarts, and the checkers run: leader ids only move
//! forward (openraft identifies a leader by (term, replica), so a higher replica may win a
//! term a lower one has just won; a leader id lower than one already elected means a voter
//! granted out of order); every acknowledged submission applied exactly once, with the id it
//! was acknowledged with, on every replica; committed entries identical on every replica (log matching); every
//! replica's state the same.

mod net;
mod rt;
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use docket_core::{Actor, Command, Envelope, Response};
use docket_proto::v1 as pb;
use docket_raft::Batch;
use openraft::{BasicNode, Config, RaftTypeConfig, ServerState, SnapshotPolicy};

use self::net::{Factory, SimRaft, World};
use self::store::{LogStore, MachineStore};

/// openraft's types for the simulation: Docket's batches and responses, numeric ids, the
/// seeded runtime.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct SimConfig;

impl RaftTypeConfig for SimConfig {
    type D = Batch<Envelope>;
    type R = Vec<Result<Response, docket_core::Rejection>>;
    type NodeId = u64;
    type Node = BasicNode;
    type Entry = openraft::Entry<SimConfig>;
    type SnapshotData = Cursor<Vec<u8>>;
    type AsyncRuntime = rt::SimRuntime;
    type Responder = openraft::impls::OneshotResponder<SimConfig>;
}

/// What one seed did and found.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub acked: usize,
    pub unknown: usize,
    pub crashes: usize,
    pub partitions: usize,
    pub lossy_periods: usize,
    pub messages_dropped: u64,
    pub terms: usize,
    /// Broken promises; empty when the run passed.
    pub failures: Vec<String>,
    /// A hash of everything that happened, to compare two runs of one seed.
    pub trace: u64,
}

const SITE: &str = r#"
[[nodes]]
NodeName = "n[01-04]"
CPUs = 8
RealMemory = "16G"

[[partitions]]
PartitionName = "batch"
Nodes = "ALL"
Default = true

[[accounts]]
Name = "sim"

[[users]]
Name = "root"
DefaultAccount = "sim"
"#;

struct Sim {
    world: Arc<World>,
    config: Arc<Config>,
    stores: BTreeMap<u64, (LogStore, MachineStore)>,
    trace: std::collections::hash_map::DefaultHasher,
    now_ms: u64,
    /// Crashes lose unsynced writes (a deliberately broken store).
    broken: bool,
}

impl Sim {
    fn event(&mut self, e: impl Hash + std::fmt::Debug) {
        e.hash(&mut self.trace);
    }

    async fn start(&mut self, id: u64) {
        let (log, sm) = self.stores.get(&id).cloned().unwrap_or_default();
        let factory = Factory {
            world: self.world.clone(),
            from: id,
        };
        match SimRaft::new(id, self.config.clone(), factory, log, sm).await {
            Ok(raft) => {
                self.world
                    .nodes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, raft);
            }
            Err(e) => self.event(format!("start {id} failed: {e}")),
        }
    }

    async fn crash(&mut self, id: u64) {
        let raft = self
            .world
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(raft) = raft {
            let _ = raft.shutdown().await;
        }
        if self.broken
            && let Some((log, _)) = self.stores.get(&id)
        {
            log.lose_unsynced(3);
        }
    }

    fn up(&self) -> Vec<u64> {
        self.world
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    fn raft(&self, id: u64) -> Option<SimRaft> {
        self.world
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Replicas that say they lead, with their terms.
    fn leaders(&self) -> Vec<(u64, u64)> {
        self.up()
            .into_iter()
            .filter_map(|id| {
                let m = self.raft(id)?.metrics().borrow().clone();
                (m.state == ServerState::Leader).then_some((m.current_term, id))
            })
            .collect()
    }

    /// Proposes `commands` through the replica that leads; None when none accepts it in time.
    async fn write(
        &mut self,
        commands: Vec<Envelope>,
    ) -> Option<Result<Vec<Result<Response, docket_core::Rejection>>, String>> {
        let leader = self.leaders().into_iter().max()?.1;
        let raft = self.raft(leader)?;
        let batch = Batch {
            time_ms: 1_790_000_000_000 + self.now_ms,
            commands,
        };
        match tokio::time::timeout(Duration::from_secs(3), raft.client_write(batch)).await {
            Ok(Ok(r)) => Some(Ok(r.data)),
            Ok(Err(e)) => Some(Err(e.to_string())),
            Err(_) => Some(Err("timeout".into())),
        }
    }
}

fn submit_command(name: &str) -> Option<Envelope> {
    let spec = pb::JobSpec {
        name: name.into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        time_limit_seconds: Some(600),
        script: b"#!/bin/sh\nsleep 60\n".to_vec(),
        work_dir: "/tmp".into(),
        ..Default::default()
    };
    let user = "root".parse().ok()?;
    let mut blobs = docket_controller::convert::Blobs::default();
    let job = docket_controller::convert::job_spec(0, &spec, user, 1000, &mut blobs).ok()?;
    Some(Envelope::new(
        Actor::Operator,
        Command::SubmitJobs {
            blobs: blobs.into_vec(),
            jobs: vec![job],
        },
    ))
}

/// Runs seed `seed` for `steps` client steps.
pub fn run_seed(seed: u64, steps: u32) -> SimReport {
    run(seed, steps, false)
}

/// Like [`run_seed`] with replicas whose crashes lose the vote and the last log entries —
/// the durability bug a store that acknowledges before it syncs has: the checkers must
/// catch it on some seeds.
pub fn run_seed_broken(seed: u64, steps: u32) -> SimReport {
    run(seed, steps, true)
}

fn run(seed: u64, steps: u32, broken: bool) -> SimReport {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return SimReport {
                failures: vec![format!("runtime: {e}")],
                ..Default::default()
            };
        }
    };
    rt::seed(seed);
    runtime.block_on(simulate(seed, steps, broken))
}

async fn simulate(seed: u64, steps: u32, broken: bool) -> SimReport {
    let mut report = SimReport::default();
    let config = Config {
        cluster_name: "sim".into(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(50),
        max_in_snapshot_log_to_keep: 10,
        ..Default::default()
    };
    let config = match config.validate() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            report.failures.push(format!("config: {e}"));
            return report;
        }
    };
    let ids = [1u64, 2, 3];
    let mut sim = Sim {
        world: Arc::new(World::default()),
        config,
        stores: ids.iter().map(|id| (*id, Default::default())).collect(),
        trace: Default::default(),
        now_ms: 0,
        broken,
    };
    for id in ids {
        sim.start(id).await;
    }
    let members: BTreeMap<u64, BasicNode> =
        ids.iter().map(|id| (*id, BasicNode::default())).collect();
    if let Some(r) = sim.raft(1)
        && let Err(e) = r.initialize(members).await
    {
        report.failures.push(format!("initialize: {e}"));
        return report;
    }
    let mut leaders = LeaderIds::default();
    let observe = |sim: &Sim, leaders: &mut LeaderIds| leaders.observe(&sim.leaders());
    // The site, until it is in.
    let site = match docket_core::site::parse(SITE) {
        Ok(s) => s.site.commands(),
        Err(e) => {
            report.failures.push(format!("site: {e}"));
            return report;
        }
    };
    let mut configured = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sim.now_ms += 200;
        let commands = site.iter().cloned().map(Envelope::controller).collect();
        if let Some(Ok(_)) = sim.write(commands).await {
            configured = true;
            break;
        }
    }
    if !configured {
        report
            .failures
            .push("the site configuration never committed".into());
        return report;
    }
    // The workload and the faults.
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut attempted: BTreeSet<String> = BTreeSet::new();
    let mut down: BTreeMap<u64, u32> = BTreeMap::new();
    let mut cut: Option<(u64, u32)> = None;
    let mut lossy_until = 0u32;
    for step in 0..steps {
        let roll = rt::next_u64() % 100;
        let pick = ids[(rt::next_u64() % ids.len() as u64) as usize];
        if roll < 4 && down.is_empty() {
            sim.crash(pick).await;
            down.insert(pick, step + 5 + (rt::next_u64() % 20) as u32);
            report.crashes += 1;
            sim.event(("crash", pick, step));
        } else if roll < 8 && cut.is_none() {
            let mut c = sim.world.cut.lock().unwrap_or_else(|p| p.into_inner());
            for other in ids.iter().filter(|o| **o != pick) {
                c.insert((pick, *other));
            }
            drop(c);
            cut = Some((pick, step + 5 + (rt::next_u64() % 20) as u32));
            report.partitions += 1;
            sim.event(("partition", pick, step));
        } else if roll < 10 && lossy_until <= step {
            *sim.world.loss.lock().unwrap_or_else(|p| p.into_inner()) = 50 + rt::next_u64() % 250;
            lossy_until = step + 10;
            report.lossy_periods += 1;
            sim.event(("lossy", step));
        }
        // Heal what is due.
        let due: Vec<u64> = down
            .iter()
            .filter(|(_, until)| **until <= step)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            down.remove(&id);
            sim.start(id).await;
            sim.event(("restart", id, step));
        }
        if let Some((id, until)) = cut
            && until <= step
        {
            sim.world
                .cut
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(a, b)| *a != id && *b != id);
            cut = None;
            sim.event(("heal", id, step));
        }
        if lossy_until == step {
            *sim.world.loss.lock().unwrap_or_else(|p| p.into_inner()) = 0;
        }
        // One submission.
        let name = format!("s{seed}-{step}");
        attempted.insert(name.clone());
        if let Some(command) = submit_command(&name) {
            let outcome = sim.write(vec![command]).await;
            match outcome {
                Some(Ok(responses)) => match responses.first() {
                    Some(Ok(Response::Submitted(results))) => match results.first() {
                        Some(Ok(id)) => {
                            acked.insert(name.clone(), id.0);
                            sim.event(("acked", name.as_str(), id.0));
                        }
                        other => sim.event(("refused", format!("{other:?}"))),
                    },
                    other => sim.event(("answer", format!("{other:?}"))),
                },
                Some(Err(e)) => {
                    report.unknown += 1;
                    sim.event(("error", name.as_str(), e.len()));
                }
                None => sim.event(("no leader", step)),
            }
        }
        observe(&sim, &mut leaders);
        let pause = 10 + rt::next_u64() % 90;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        sim.now_ms += pause;
    }
    // Heal everything and let the replicas converge.
    sim.world
        .cut
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    *sim.world.loss.lock().unwrap_or_else(|p| p.into_inner()) = 0;
    for id in down.keys().copied().collect::<Vec<_>>() {
        sim.start(id).await;
    }
    // A last write through the final leader commits everything before it.
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        observe(&sim, &mut leaders);
        if let Some(Ok(_)) = sim.write(Vec::new()).await {
            break;
        }
    }
    let mut converged = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        observe(&sim, &mut leaders);
        let prints: BTreeSet<_> = sim
            .stores
            .values()
            .map(|(_, sm)| sm.fingerprint())
            .collect();
        if prints.len() == 1 {
            converged = true;
            break;
        }
    }
    // The checks.
    report.acked = acked.len();
    report.terms = leaders.terms();
    report.failures.extend(leaders.backwards);
    if !converged {
        report
            .failures
            .push("the replicas' states did not converge".into());
    }
    for (id, (_, sm)) in &sim.stores {
        let jobs = sm.jobs();
        let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (name, job) in &jobs {
            by_name.entry(name.as_str()).or_default().push(*job);
        }
        for (name, job) in &acked {
            match by_name.get(name.as_str()).map(Vec::as_slice) {
                Some([one]) if one == job => {}
                Some([one]) => report.failures.push(format!(
                    "replica {id}: {name} acknowledged as job {job} is job {one}"
                )),
                None | Some([]) => report.failures.push(format!(
                    "replica {id}: acknowledged {name} (job {job}) lost"
                )),
                Some(many) => report
                    .failures
                    .push(format!("replica {id}: {name} applied {} times", many.len())),
            }
        }
        for name in by_name.keys() {
            if !attempted.contains(*name) {
                report
                    .failures
                    .push(format!("replica {id}: {name} was never submitted"));
            }
        }
    }
    // Log matching: below every replica's commit point, the same entries.
    let committed = sim
        .stores
        .values()
        .map(|(log, _)| log.committed().map_or(0, |c| c.index))
        .min()
        .unwrap_or(0);
    let mut at: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for (log, _) in sim.stores.values() {
        for e in log.entries() {
            let index = openraft::RaftLogId::get_log_id(&e).index;
            if index <= committed {
                at.entry(index)
                    .or_default()
                    .insert(serde_json::to_string(&e).unwrap_or_default());
            }
        }
    }
    for (index, versions) in &at {
        if versions.len() > 1 {
            report
                .failures
                .push(format!("committed entry {index} differs between replicas"));
        }
    }
    report.messages_dropped = *sim.world.dropped.lock().unwrap_or_else(|p| p.into_inner());
    let prints: Vec<_> = sim
        .stores
        .values()
        .map(|(_, sm)| sm.fingerprint())
        .collect();
    for print in prints {
        sim.event((print.0.map(|l| l.index), print.1));
    }
    sim.event(&report.failures);
    report.trace = sim.trace.finish();
    for id in sim.up() {
        sim.crash(id).await;
    }
    report
}

/// The leader ids (term, replica) seen, in the order they were first seen.
#[derive(Debug, Default)]
struct LeaderIds {
    seen: BTreeSet<(u64, u64)>,
    /// One line per leader id first seen below one seen at an earlier observation.
    backwards: Vec<String>,
}

impl LeaderIds {
    /// One observation: the leaders every replica that is up reports now. Leader ids
    /// elected between two observations may be seen together in either order; one seen
    /// first after a higher one was seen before was elected after it, which openraft's
    /// vote order forbids.
    fn observe(&mut self, now: &[(u64, u64)]) {
        let highest = self.seen.last().copied();
        for &id in now {
            if self.seen.insert(id)
                && let Some(h) = highest
                && id < h
            {
                self.backwards.push(format!(
                    "leader (term {}, replica {}) elected after (term {}, replica {})",
                    id.0, id.1, h.0, h.1
                ));
            }
        }
    }

    fn terms(&self) -> usize {
        self.seen
            .iter()
            .map(|(t, _)| t)
            .collect::<BTreeSet<_>>()
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few hundred seeds of crashes, partitions, loss and reordering: every promise kept.
    #[test]
    fn two_hundred_seeds_keep_every_promise() {
        let mut acked = 0;
        let mut faults = 0;
        for seed in 1_000..1_200 {
            let r = run_seed(seed, 80);
            assert!(
                r.failures.is_empty(),
                "seed {seed}: {:?} (reproduce: docket-chaos sim --from {seed} --seeds 1 --steps 80)",
                r.failures
            );
            acked += r.acked;
            faults += r.crashes + r.partitions + r.lossy_periods;
        }
        assert!(
            acked > 5_000,
            "the workload hardly ran: {acked} acknowledged"
        );
        assert!(faults > 300, "hardly any faults: {faults}");
    }

    #[test]
    fn a_seed_replays_exactly() {
        for seed in [3, 17, 99] {
            let a = run_seed(seed, 60);
            let b = run_seed(seed, 60);
            assert_eq!(a.trace, b.trace, "seed {seed}");
            assert_eq!(a.acked, b.acked);
            assert_eq!(a.crashes, b.crashes);
        }
        assert_ne!(run_seed(3, 60).trace, run_seed(4, 60).trace);
    }

    /// The checkers are not vacuous: a store that loses unsynced writes on a crash breaks
    /// the promises, the checkers say so, and the failing seed fails the same way again.
    #[test]
    fn the_checkers_catch_a_store_that_loses_unsynced_writes() {
        let failing: Vec<(u64, SimReport)> = (0..10)
            .map(|seed| (seed, run_seed_broken(seed, 100)))
            .filter(|(_, r)| !r.failures.is_empty())
            .collect();
        assert!(!failing.is_empty(), "no seed caught the broken store");
        let (seed, first) = &failing[0];
        let again = run_seed_broken(*seed, 100);
        assert_eq!(again.failures, first.failures);
        assert_eq!(again.trace, first.trace);
    }
}
