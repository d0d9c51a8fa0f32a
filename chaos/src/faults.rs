//! Faults on a seeded schedule against a local cluster: the leader or a follower killed
//! with SIGKILL and restarted on its data, the leader stopped with SIGSTOP for longer than
//! the election timeout and continued, an agent killed with SIGKILL at a random moment and
//! restarted to re-adopt its jobs, or killed exactly at a launch or an exit (restarted armed
//! with one of its crash points, `docket-nodeagent --crash-at`, it dies when a run reaches
//! it); with the replicas in network namespaces, the leader or a follower partitioned from the
//! other replicas, or from the agents and clients (packets dropped by blackhole routes), and
//! healed; with the replicas' data on small disks of their own, the leader's disk filled
//! until its writes fail, then freed and the replica restarted; under libfaketime, one
//! replica's wall clock jumped minutes to hours forwards or backwards, then set right.
//!
//! The schedule is a pure function of the seed and the kinds allowed, so a run is
//! reproduced by its seed (up to the timing of the processes themselves).

use std::time::Duration;

use docket_deploy::{LocalCluster, rpc};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::history::{Fault, FaultKind, History};

/// One planned fault: what, how long until it, how long it lasts before healing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub kind: FaultKind,
    pub after_ms: u64,
    pub lasts_ms: u64,
    /// Picks the follower or agent (index modulo the candidates).
    pub pick: u32,
}

/// `count` faults of the allowed `kinds` (drawn at random, or in turn with `each`), `gap_ms`
/// apart (a range; 1.5–4 s in a short run), from `seed`.
pub fn plan(
    seed: u64,
    count: usize,
    kinds: &[FaultKind],
    each: bool,
    gap_ms: (u64, u64),
) -> Vec<Planned> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let drawn = rng.random_range(0..kinds.len());
            let kind = kinds[if each { i % kinds.len() } else { drawn }];
            let lasts_ms = match kind {
                // Longer than the leader lease plus the election timeout (600 + 300..600 ms),
                // so the others elect a new leader; sometimes not (the leader returns first).
                FaultKind::PauseLeader
                | FaultKind::PartitionLeader
                | FaultKind::PartitionFollower
                | FaultKind::PartitionLeaderFromAgents
                | FaultKind::PartitionFollowerFromAgents
                | FaultKind::DiskFullLeader
                | FaultKind::ClockJump => rng.random_range(1_500..3_000),
                FaultKind::KillLeader => rng.random_range(800..3_000),
                _ => rng.random_range(300..1_500),
            };
            Planned {
                kind,
                after_ms: rng.random_range(gap_ms.0..gap_ms.1.max(gap_ms.0 + 1)),
                lasts_ms,
                pick: rng.random(),
            }
        })
        .collect()
}

/// A follower (by `pick`), if there is one.
fn follower(cluster: &LocalCluster, leader: Option<u64>, pick: u32) -> Option<u64> {
    let followers: Vec<u64> = cluster
        .record
        .replicas
        .iter()
        .map(|r| r.id)
        .filter(|id| Some(*id) != leader)
        .collect();
    (!followers.is_empty()).then(|| followers[pick as usize % followers.len()])
}

/// An agent running real jobs (by `pick`), if there is one.
fn real_agent(cluster: &LocalCluster, pick: u32) -> Option<String> {
    let agents: Vec<&str> = cluster
        .record
        .agents
        .iter()
        .filter(|a| !a.spec.simulated)
        .map(|a| a.spec.name.as_str())
        .collect();
    (!agents.is_empty()).then(|| agents[pick as usize % agents.len()].to_owned())
}

/// How long an armed agent may wait for a run to reach its crash point.
const CRASH_POINT_WAIT: Duration = Duration::from_secs(20);

/// Restarts agent `name` armed to crash at `point` and waits for it to die there (the
/// workload keeps launching and ending jobs on every node); whether it did. An agent no run
/// brought there in time is stopped. Either way it is down when this returns.
async fn crash_at(cluster: &mut LocalCluster, name: &str, point: &str) -> anyhow::Result<bool> {
    cluster.stop_agent(name)?;
    cluster.start_agent_crashing_at(name, Some(point))?;
    let deadline = tokio::time::Instant::now() + CRASH_POINT_WAIT;
    while cluster.agent_alive(name) {
        if tokio::time::Instant::now() >= deadline {
            cluster.stop_agent(name)?;
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(true)
}

/// Injects the planned faults one after the other, healing each before the next; stops at
/// `until` if given.
pub async fn inject(
    cluster: &mut LocalCluster,
    planned: &[Planned],
    history: &History,
    until: Option<std::time::Instant>,
) -> anyhow::Result<()> {
    for (i, p) in planned.iter().enumerate() {
        if until.is_some_and(|u| std::time::Instant::now() + Duration::from_millis(p.after_ms) >= u)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(p.after_ms)).await;
        let leader = rpc::leader(&cluster.addrs()).await.map(|(id, _)| id);
        let at_ms = history.now_ms();
        let at_wall_ms = docket_proto::unix_ms();
        let Some(target) = perform(cluster, planned, i, leader).await? else {
            continue;
        };
        let healed_ms = history.now_ms();
        println!(
            "[{:>6.1}s] {} ({target}), healed after {} ms",
            at_ms as f64 / 1000.0,
            p.kind.name(),
            healed_ms - at_ms
        );
        history.fault(Fault {
            kind: p.kind,
            target,
            at_ms,
            at_wall_ms,
            healed_ms,
        });
    }
    Ok(())
}

/// Performs the `i`th planned fault and heals it; what it struck, or None when there was
/// nothing to strike (no leader, no follower, no agent running real jobs).
async fn perform(
    cluster: &mut LocalCluster,
    planned: &[Planned],
    i: usize,
    leader: Option<u64>,
) -> anyhow::Result<Option<String>> {
    let p = &planned[i];
    match p.kind {
        FaultKind::KillLeader | FaultKind::PauseLeader => stop_leader(cluster, p, leader).await,
        FaultKind::PartitionLeader
        | FaultKind::PartitionLeaderFromAgents
        | FaultKind::PartitionFollower
        | FaultKind::PartitionFollowerFromAgents => partition(cluster, p, leader).await,
        FaultKind::DiskFullLeader => fill_leader_disk(cluster, p, leader).await,
        FaultKind::ClockJump => jump_clock(cluster, p, leader).await,
        FaultKind::KillFollower => kill_follower(cluster, p, leader).await,
        FaultKind::KillAgent => kill_agent(cluster, p).await,
        FaultKind::AgentCrashAtLaunch | FaultKind::AgentCrashAtExit => {
            crash_agent_at_point(cluster, planned, i).await
        }
    }
}

/// Kills the leader with SIGKILL or stops it with SIGSTOP, then restarts or continues it.
async fn stop_leader(
    cluster: &mut LocalCluster,
    p: &Planned,
    leader: Option<u64>,
) -> anyhow::Result<Option<String>> {
    let Some(id) = leader else {
        // No leader right now: the previous fault has not healed yet; skip.
        return Ok(None);
    };
    if p.kind == FaultKind::KillLeader {
        cluster.kill_replica(id)?;
    } else {
        cluster.pause_replica(id, true)?;
    }
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    if p.kind == FaultKind::KillLeader {
        cluster.start_replica(id, false)?;
    } else {
        cluster.pause_replica(id, false)?;
    }
    Ok(Some(format!("replica {id}")))
}

/// Cuts the leader or a follower off from the other replicas or from the host's side, then
/// heals the cut.
async fn partition(
    cluster: &mut LocalCluster,
    p: &Planned,
    leader: Option<u64>,
) -> anyhow::Result<Option<String>> {
    let on_leader = matches!(
        p.kind,
        FaultKind::PartitionLeader | FaultKind::PartitionLeaderFromAgents
    );
    let target = if on_leader {
        leader
    } else {
        follower(cluster, leader, p.pick)
    };
    let Some(id) = target else {
        return Ok(None);
    };
    // Cut from the other replicas, or from the host's side (agents and clients).
    if matches!(
        p.kind,
        FaultKind::PartitionLeader | FaultKind::PartitionFollower
    ) {
        cluster.partition_replica(id)?;
    } else {
        cluster.partition_from_host(id)?;
    }
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    cluster.heal(id)?;
    Ok(Some(format!("replica {id}")))
}

/// Fills the leader's disk and restarts it on the full disk, then frees the disk and
/// restarts it again.
async fn fill_leader_disk(
    cluster: &mut LocalCluster,
    p: &Planned,
    leader: Option<u64>,
) -> anyhow::Result<Option<String>> {
    let Some(id) = leader else {
        return Ok(None);
    };
    // The disk fills up; RocksDB keeps writing into the WAL space it preallocated,
    // so the replica then crashes and must not come back on a full disk.
    let filled = cluster.fill_disk(id)?;
    cluster.kill_replica(id)?;
    cluster.start_replica(id, false)?;
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    let refused = !cluster.replica_alive(id);
    cluster.free_disk(id)?;
    cluster.kill_replica(id)?;
    cluster.start_replica(id, false)?;
    Ok(Some(format!(
        "replica {id}, {} MiB written; restart on the full disk {}",
        filled >> 20,
        if refused { "refused" } else { "succeeded" }
    )))
}

/// Jumps one replica's wall clock 10 minutes to 2 hours either way, then sets it right.
async fn jump_clock(
    cluster: &mut LocalCluster,
    p: &Planned,
    leader: Option<u64>,
) -> anyhow::Result<Option<String>> {
    let ids: Vec<u64> = cluster.record.replicas.iter().map(|r| r.id).collect();
    let id = ids[p.pick as usize % ids.len()];
    // 10 minutes to 2 hours, either way.
    let minutes = 10 + (p.pick >> 8) % 111;
    let sign = if (p.pick >> 16).is_multiple_of(2) {
        '+'
    } else {
        '-'
    };
    cluster.set_clock(id, &format!("{sign}{minutes}m"))?;
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    cluster.set_clock(id, "+0")?;
    Ok(Some(format!(
        "replica {id}{}, {sign}{minutes} min",
        if Some(id) == leader { " (leader)" } else { "" }
    )))
}

/// Kills a follower with SIGKILL, then restarts it on its data.
async fn kill_follower(
    cluster: &mut LocalCluster,
    p: &Planned,
    leader: Option<u64>,
) -> anyhow::Result<Option<String>> {
    let Some(id) = follower(cluster, leader, p.pick) else {
        return Ok(None);
    };
    cluster.kill_replica(id)?;
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    cluster.start_replica(id, false)?;
    Ok(Some(format!("replica {id}")))
}

/// Kills an agent running real jobs with SIGKILL, then restarts it.
async fn kill_agent(cluster: &mut LocalCluster, p: &Planned) -> anyhow::Result<Option<String>> {
    let Some(name) = real_agent(cluster, p.pick) else {
        return Ok(None);
    };
    cluster.kill_agent(&name)?;
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    cluster.start_agent(&name)?;
    Ok(Some(format!("agent {name}")))
}

/// Restarts an agent running real jobs armed to crash at a launch or exit point (the `i`th
/// planned fault's kind, its points in turn), then restarts it unarmed.
async fn crash_agent_at_point(
    cluster: &mut LocalCluster,
    planned: &[Planned],
    i: usize,
) -> anyhow::Result<Option<String>> {
    let p = &planned[i];
    let Some(name) = real_agent(cluster, p.pick) else {
        return Ok(None);
    };
    let points = if p.kind == FaultKind::AgentCrashAtLaunch {
        ["launch-recorded", "launch-spawned"]
    } else {
        ["exit-observed", "exit-recorded"]
    };
    // In turn, so that two faults of a kind cover both of its points.
    let before = planned[..i].iter().filter(|q| q.kind == p.kind).count();
    let point = points[before % points.len()];
    let crashed = crash_at(cluster, &name, point).await?;
    tokio::time::sleep(Duration::from_millis(p.lasts_ms)).await;
    cluster.start_agent(&name)?;
    Ok(Some(format!(
        "agent {name} at {point}: {}",
        if crashed {
            "crashed there"
        } else {
            "no run reached it in time; restarted"
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule() {
        let kinds = [
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
            FaultKind::KillAgent,
        ];
        assert_eq!(
            plan(7, 20, &kinds, false, (1_500, 4_000)),
            plan(7, 20, &kinds, false, (1_500, 4_000))
        );
        assert_ne!(
            plan(7, 20, &kinds, false, (1_500, 4_000)),
            plan(8, 20, &kinds, false, (1_500, 4_000))
        );
        let each: Vec<FaultKind> = plan(3, 6, &kinds, true, (1_500, 4_000))
            .iter()
            .map(|p| p.kind)
            .collect();
        assert_eq!(each, [kinds, kinds].concat());
        let p = plan(1, 200, &kinds, false, (1_500, 4_000));
        for k in kinds {
            assert!(p.iter().any(|x| x.kind == k), "{k:?} never planned");
        }
        assert!(
            p.iter()
                .filter(|x| x.kind == FaultKind::PauseLeader)
                .all(|x| x.lasts_ms >= 1_500)
        );
    }
}
