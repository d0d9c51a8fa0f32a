//! The checkers: from the history, the final queue of every replica and the jobs' own run
//! log, decide whether Docket kept its promises, and compute the figures.
//!
//! - Total queue: every acknowledged submission exists exactly once (in the queue or in the
//!   accounting archive, where purged jobs go) under its name with
//!   the id it was acknowledged with (none lost, none duplicated); nothing exists that no
//!   client submitted (an unknown-outcome submission may or may not exist).
//! - No double runs: a job started at most once more than it was requeued, and no two
//!   attempts of one job overlapped in time.
//! - Every job reached a final state.
//! - Raft safety as seen from outside. openraft (without its `single-term-leader` feature,
//!   which Docket does not use) identifies a leader by (term, replica), ordered by term and
//!   then replica: a candidate with a higher id may win a term another has just won, and
//!   log entries carry the whole leader id, so two leaders of one term are legal and are
//!   only counted. What must hold is that leader ids only move forward: no replica
//!   reports itself leader of a term older than one it has already led.
//! - Convergence: every replica's own (stale) view of the queue is the same.
//! - The agents' launch records agree (see [`crate::launches`]).

use std::collections::{BTreeMap, BTreeSet};

use docket_proto::v1 as pb;

use crate::history::{Op, OpKind, Outcome, Records};

/// A job's starts and ends, from `runs.log`: (start ms, end ms if it ended).
pub type Attempts = BTreeMap<u64, Vec<(u64, Option<u64>)>>;

/// Parses `ID NAME start MS` / `ID NAME end MS` lines.
pub fn attempts(log: &str) -> Attempts {
    let mut out: Attempts = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (id, what, ms) = match f.as_slice() {
            [id, _name, what, ms] | [id, _name, what, ms, _] => (id, what, ms),
            _ => continue,
        };
        let (Ok(id), Ok(ms)) = (id.parse::<u64>(), ms.parse::<u64>()) else {
            continue;
        };
        let runs = out.entry(id).or_default();
        match *what {
            "start" => runs.push((ms, None)),
            "end" => {
                if let Some(last) = runs.iter_mut().rev().find(|r| r.1.is_none()) {
                    last.1 = Some(ms);
                }
            }
            _ => {}
        }
    }
    out
}

/// The verdict and the figures.
#[derive(Debug, Default)]
pub struct Report {
    pub acked: usize,
    pub unknown: usize,
    pub lost: Vec<String>,
    pub duplicated: Vec<String>,
    pub unexpected: Vec<String>,
    pub changed_id: Vec<String>,
    pub double_runs: Vec<u64>,
    pub overlapping: Vec<u64>,
    pub not_final: Vec<u64>,
    /// Terms with more than one leader (legal with openraft's leader ids; a figure).
    pub split_terms: Vec<u64>,
    /// Replicas that reported leading an older term after a newer one.
    pub leader_regressions: Vec<u64>,
    pub diverged: bool,
    /// Replicas whose `sacct` answer (archive included) differs from the leader's.
    pub accounting_diverged: Vec<String>,
    /// Jobs the leader answers for from its archive (purged from the queue).
    pub archived: usize,
    pub faults: BTreeMap<&'static str, usize>,
    pub ops: BTreeMap<String, usize>,
    /// Per leader-removing fault: ms to the first acknowledged write and the first job start.
    pub to_write_ms: Vec<u64>,
    pub to_start_ms: Vec<u64>,
    /// The same, by the kind of fault that removed the leader: where a tail comes from.
    pub to_write_by_kind: BTreeMap<&'static str, Vec<u64>>,
    pub to_start_by_kind: BTreeMap<&'static str, Vec<u64>>,
    pub longest_unavailable_ms: u64,
    pub terms_seen: usize,
    /// The agents' launch records against the run log (filled by the caller, which knows
    /// where the agents keep them).
    pub launches: crate::launches::Findings,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.changed_id.is_empty()
            && self.double_runs.is_empty()
            && self.overlapping.is_empty()
            && self.not_final.is_empty()
            && self.launches.ok()
            && self.leader_regressions.is_empty()
            && !self.diverged
            && self.accounting_diverged.is_empty()
    }
}

pub use docket_deploy::stats::percentiles;

/// One line of a replica's `sacct` answer, as the replicas must agree on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountingRow {
    pub job: u64,
    pub state: String,
    pub charged_milli_su: u64,
    pub archived: bool,
}

impl AccountingRow {
    pub fn of(r: &pb::AccountingRecord) -> AccountingRow {
        AccountingRow {
            job: r.job.as_ref().map_or(0, |j| j.job_id),
            state: r.job.as_ref().map_or_else(String::new, |j| j.state.clone()),
            charged_milli_su: r.charged_milli_su,
            archived: r.archived,
        }
    }
}

/// The replicas whose `sacct` answer differs from the first's (the leader's), each with the
/// first job where it differs.
pub fn accounting_divergence(views: &[(String, Vec<AccountingRow>)]) -> Vec<String> {
    let Some((_, first)) = views.first() else {
        return Vec::new();
    };
    views[1..]
        .iter()
        .filter(|(_, rows)| rows != first)
        .map(|(addr, rows)| {
            let at = rows.iter().zip(first).find(|(a, b)| a != b).map_or_else(
                || format!("{} records against {}", rows.len(), first.len()),
                |(a, b)| format!("job {}: {a:?} against {b:?}", a.job),
            );
            format!("{addr}: {at}")
        })
        .collect()
}

/// Checks a finished run. `all_jobs` is every job the cluster knows, in the queue or
/// archived (a purged job is not lost); `queues` holds each replica's own view of the queue.
pub fn check(
    records: &Records,
    all_jobs: &[pb::JobInfo],
    queues: &[Vec<pb::JobInfo>],
    runs_log: &str,
    wall_start_ms: u64,
) -> Report {
    let mut r = Report::default();
    let final_queue = all_jobs;
    let mut by_name: BTreeMap<&str, Vec<&pb::JobInfo>> = BTreeMap::new();
    for j in final_queue {
        by_name.entry(j.name.as_str()).or_default().push(j);
    }
    r.check_total_queue(records, &by_name);
    r.not_final = final_queue
        .iter()
        .filter(|j| !docket_deploy::rpc::is_final(j))
        .map(|j| j.job_id)
        .collect();
    // Runs: starts beyond 1 + requeues, and overlapping attempts.
    r.check_runs(final_queue, runs_log);
    // Leader ids only move forward on each replica; leaders per term are counted.
    r.check_leaders(records);
    // Every replica's view alike.
    let view = |q: &[pb::JobInfo]| -> BTreeMap<u64, String> {
        q.iter().map(|j| (j.job_id, j.state_code.clone())).collect()
    };
    r.diverged = queues.windows(2).any(|w| view(&w[0]) != view(&w[1]));
    // Figures.
    r.compute_figures(records, runs_log, wall_start_ms);
    r
}

impl Report {
    /// Counts every operation by kind and outcome, and checks every submission against the
    /// jobs `by_name`; names no client submitted are unexpected.
    fn check_total_queue(
        &mut self,
        records: &Records,
        by_name: &BTreeMap<&str, Vec<&pb::JobInfo>>,
    ) {
        let mut attempted: BTreeSet<&str> = BTreeSet::new();
        for op in &records.ops {
            self.count_op(op);
            if op.kind != OpKind::Submit {
                continue;
            }
            attempted.insert(op.job_name.as_str());
            self.check_submission(op, by_name);
        }
        for name in by_name.keys() {
            if !attempted.contains(name) && !name.starts_with("failover-probe") {
                self.unexpected.push((*name).to_owned());
            }
        }
    }

    /// Counts one operation under its kind and outcome.
    fn count_op(&mut self, op: &Op) {
        let key = match &op.outcome {
            Outcome::Acked => "acked",
            Outcome::Refused(_) => "refused",
            Outcome::NotApplied => "not applied",
            Outcome::Unknown(_) => "unknown",
        };
        *self
            .ops
            .entry(format!("{:?} {key}", op.kind).to_lowercase())
            .or_default() += 1;
    }

    /// An acknowledged submission exists exactly once with its id; one of unknown outcome
    /// at most once.
    fn check_submission(&mut self, op: &Op, by_name: &BTreeMap<&str, Vec<&pb::JobInfo>>) {
        match &op.outcome {
            Outcome::Acked => {
                self.acked += 1;
                match by_name.get(op.job_name.as_str()).map(Vec::as_slice) {
                    None | Some([]) => self.lost.push(op.job_name.clone()),
                    Some([one]) => {
                        if Some(one.job_id) != op.job_id {
                            self.changed_id.push(op.job_name.clone());
                        }
                    }
                    Some(_) => self.duplicated.push(op.job_name.clone()),
                }
            }
            Outcome::Unknown(_) => {
                self.unknown += 1;
                if by_name
                    .get(op.job_name.as_str())
                    .is_some_and(|v| v.len() > 1)
                {
                    self.duplicated.push(op.job_name.clone());
                }
            }
            _ => {}
        }
    }

    /// Jobs of the run log started more than once beyond their requeues, and jobs with two
    /// attempts overlapping in time.
    fn check_runs(&mut self, final_queue: &[pb::JobInfo], runs_log: &str) {
        let requeues: BTreeMap<u64, u32> = final_queue
            .iter()
            .map(|j| (j.job_id, j.requeue_count))
            .collect();
        for (id, runs) in attempts(runs_log) {
            let allowed = 1 + requeues.get(&id).copied().unwrap_or(0) as usize;
            if runs.len() > allowed {
                self.double_runs.push(id);
            }
            let mut sorted = runs.clone();
            sorted.sort_unstable();
            if sorted
                .windows(2)
                .any(|w| w[0].1.is_some_and(|end| end > w[1].0))
            {
                self.overlapping.push(id);
            }
        }
    }

    /// Replicas seen leading an older term after a newer one; the terms seen, and those with
    /// more than one leader.
    fn check_leaders(&mut self, records: &Records) {
        let mut per_term: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        let mut sightings = records.leaders.clone();
        sightings.sort_by_key(|l| l.at_ms);
        let mut led: BTreeMap<u64, u64> = BTreeMap::new();
        for l in &sightings {
            per_term.entry(l.term).or_default().insert(l.replica);
            let newest = led.entry(l.replica).or_insert(l.term);
            if l.term < *newest && !self.leader_regressions.contains(&l.replica) {
                self.leader_regressions.push(l.replica);
            }
            *newest = (*newest).max(l.term);
        }
        self.terms_seen = per_term.len();
        self.split_terms = per_term
            .iter()
            .filter(|(_, leaders)| leaders.len() > 1)
            .map(|(t, _)| *t)
            .collect();
    }

    /// The faults by kind, the recovery after each leader-removing fault (to the first
    /// acknowledged submission and the first job start), and the longest stretch without an
    /// acknowledged submission.
    fn compute_figures(&mut self, records: &Records, runs_log: &str, wall_start_ms: u64) {
        for f in &records.faults {
            *self.faults.entry(f.kind.name()).or_default() += 1;
        }
        let mut acks: Vec<u64> = records
            .ops
            .iter()
            .filter(|o| o.kind == OpKind::Submit && o.outcome == Outcome::Acked)
            .map(|o| o.end_ms)
            .collect();
        acks.sort_unstable();
        // Starts as the nodes saw them (their own clocks: a replica's clock jump moves the
        // cluster's time, not the nodes').
        let mut starts: Vec<u64> = attempts(runs_log)
            .values()
            .flatten()
            .map(|(start, _)| start.saturating_sub(wall_start_ms))
            .collect();
        starts.sort_unstable();
        for f in records.faults.iter().filter(|f| f.kind.removes_leader()) {
            let kind = f.kind.name();
            if let Some(a) = acks.iter().find(|a| **a > f.at_ms) {
                self.to_write_ms.push(a - f.at_ms);
                self.to_write_by_kind
                    .entry(kind)
                    .or_default()
                    .push(a - f.at_ms);
            }
            let at = f.at_wall_ms.saturating_sub(wall_start_ms);
            if let Some(s) = starts.iter().find(|s| **s > at) {
                self.to_start_ms.push(s - at);
                self.to_start_by_kind.entry(kind).or_default().push(s - at);
            }
        }
        self.longest_unavailable_ms = acks.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    }
}

/// The figures, printed at the end of every run.
pub fn render(r: &Report, seed: u64) -> String {
    let mut s = String::from("\n=== docket-chaos: figures ===\n");
    render_operations(&mut s, r);
    render_agreement(&mut s, r);
    render_recovery(&mut s, r);
    s.push_str(&format!(
        "seed: {seed}   verdict: {}\n",
        if r.ok() { "PASS" } else { "FAIL" }
    ));
    if !r.ok() {
        render_failures(&mut s, r);
    }
    s
}

/// The faults, the operations, and what became of the submissions and their runs.
fn render_operations(s: &mut String, r: &Report) {
    let faults: Vec<String> = r.faults.iter().map(|(k, v)| format!("{v} {k}")).collect();
    s.push_str(&format!(
        "faults injected:        {} ({})\n",
        r.faults.values().sum::<usize>(),
        faults.join(", ")
    ));
    let ops: Vec<String> = r.ops.iter().map(|(k, v)| format!("{v} {k}")).collect();
    s.push_str(&format!("operations:             {}\n", ops.join(", ")));
    s.push_str(&format!(
        "submissions acked:      {} (+{} with unknown outcome)\n",
        r.acked, r.unknown
    ));
    s.push_str(&format!(
        "lost: {}   duplicated: {}   unexpected: {}   id changed: {}\n",
        r.lost.len(),
        r.duplicated.len(),
        r.unexpected.len(),
        r.changed_id.len()
    ));
    s.push_str(&format!(
        "double runs: {}   overlapping attempts: {}   not final: {}\n",
        r.double_runs.len(),
        r.overlapping.len(),
        r.not_final.len()
    ));
}

/// The agents' launch records, the leaders and terms, and whether the replicas agree.
fn render_agreement(s: &mut String, r: &Report) {
    let l = &r.launches;
    s.push_str(&format!(
        "agent launch records:   {} ({} started, {} abandoned); starts not backed: {}   abandoned yet started: {}   started beyond 1 + requeues: {}\n",
        l.records,
        l.started,
        l.abandoned,
        l.unbacked.len(),
        l.abandoned_started.len(),
        l.started_too_often.len()
    ));
    s.push_str(&format!(
        "terms seen: {}   terms with two leaders (allowed by openraft's leader ids): {}   leaders gone back a term: {}   replicas diverged: {}\n",
        r.terms_seen,
        r.split_terms.len(),
        r.leader_regressions.len(),
        r.diverged
    ));
    s.push_str(&format!(
        "replicas whose sacct differs from the leader's: {}   jobs sacct answers from the archive: {}\n",
        r.accounting_diverged.len(),
        r.archived
    ));
    for d in &r.accounting_diverged {
        s.push_str(&format!("  sacct differs: {d}\n"));
    }
}

/// How fast writes and scheduling came back after the leader went, and the longest stretch
/// without a write.
fn render_recovery(s: &mut String, r: &Report) {
    s.push_str(&format!(
        "leader loss -> first committed write:     {}\n",
        latencies(&r.to_write_ms)
    ));
    s.push_str(&format!(
        "leader loss -> first scheduling decision: {}\n",
        latencies(&r.to_start_ms)
    ));
    for (kind, write) in &r.to_write_by_kind {
        let start = r.to_start_by_kind.get(kind).map_or(&[][..], Vec::as_slice);
        s.push_str(&format!(
            "  after {kind}: first write {}; first start {}\n",
            latencies(write),
            latencies(start)
        ));
    }
    s.push_str(&format!(
        "longest write-unavailable window:         {} ms\n",
        r.longest_unavailable_ms
    ));
}

/// Latencies as their percentiles, or `n/a` when there are none.
fn latencies(v: &[u64]) -> String {
    match percentiles(v) {
        Some((p50, p99, max)) => {
            format!("p50 {p50} ms, p99 {p99} ms, max {max} ms (n={})", v.len())
        }
        None => "n/a".into(),
    }
}

/// What broke each promise, for a failed run.
fn render_failures(s: &mut String, r: &Report) {
    s.push_str(&format!(
        "  lost {}\n  duplicated {}\n  unexpected {}\n  id changed {}\n  double runs {}\n  overlapping {}\n  not final {}\n  leaders gone back a term {}\n  starts not backed by a launch {}\n  abandoned yet started {}\n  started by agents beyond 1 + requeues {}\n",
        few(&r.lost),
        few(&r.duplicated),
        few(&r.unexpected),
        few(&r.changed_id),
        few(&ids(&r.double_runs)),
        few(&ids(&r.overlapping)),
        few(&ids(&r.not_final)),
        few(&ids(&r.leader_regressions)),
        few(&ids(&r.launches.unbacked)),
        few(&ids(&r.launches.abandoned_started)),
        few(&ids(&r.launches.started_too_often)),
    ));
}

/// The first 20 of `v`, and how many more there are.
fn few(v: &[String]) -> String {
    let shown: Vec<&str> = v.iter().take(20).map(String::as_str).collect();
    let more = v.len().saturating_sub(20);
    format!(
        "{shown:?}{}",
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// Job ids as strings, for [`few`].
fn ids(v: &[u64]) -> Vec<String> {
    v.iter().map(u64::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{LeaderSeen, Op};

    fn job(id: u64, name: &str, state: &str) -> pb::JobInfo {
        pb::JobInfo {
            job_id: id,
            name: name.into(),
            state_code: state.into(),
            ..Default::default()
        }
    }

    fn submit(name: &str, id: Option<u64>, outcome: Outcome) -> Op {
        Op {
            client: 0,
            kind: OpKind::Submit,
            job_name: name.into(),
            job_id: id,
            outcome,
            start_ms: 0,
            end_ms: 1,
            tries: Vec::new(),
        }
    }

    #[test]
    fn a_replica_whose_sacct_differs_is_named_with_the_first_difference() {
        let row = |job: u64, archived: bool| AccountingRow {
            job,
            state: "COMPLETED".into(),
            charged_milli_su: 10,
            archived,
        };
        let leader = vec![row(1, true), row(2, false)];
        let views = vec![
            ("l".to_owned(), leader.clone()),
            ("same".to_owned(), leader.clone()),
            ("lost".to_owned(), vec![row(2, false)]),
            ("short".to_owned(), vec![row(1, true)]),
        ];
        let d = accounting_divergence(&views);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("lost: job 2"), "{d:?}");
        assert_eq!(d[1], "short: 1 records against 2");
        assert!(accounting_divergence(&views[..2]).is_empty());
    }

    #[test]
    fn the_checkers_catch_each_broken_promise() {
        let records = Records {
            ops: vec![
                submit("a", Some(1), Outcome::Acked),
                submit("b", Some(2), Outcome::Acked),
                submit("c", Some(3), Outcome::Acked),
                submit("d", None, Outcome::Unknown("aborted".into())),
                submit("e", Some(5), Outcome::Acked),
            ],
            faults: Vec::new(),
            leaders: vec![
                LeaderSeen {
                    term: 2,
                    replica: 1,
                    at_ms: 0,
                },
                LeaderSeen {
                    term: 3,
                    replica: 2,
                    at_ms: 5,
                },
                LeaderSeen {
                    term: 3,
                    replica: 3,
                    at_ms: 6,
                },
                LeaderSeen {
                    term: 1,
                    replica: 2,
                    at_ms: 7,
                },
            ],
        };
        // b lost, c twice, d (unknown) present once: fine, x never submitted, e still running.
        let queue = vec![
            job(1, "a", "CD"),
            job(3, "c", "CD"),
            job(4, "c", "CD"),
            job(6, "d", "CD"),
            job(7, "x", "CD"),
            job(5, "e", "R"),
        ];
        let log = "1 a start 10\n1 a start 12\n1 a end 20\n3 c start 5\n3 c end 9\n";
        let r = check(&records, &queue, &[queue.clone(), queue.clone()], log, 0);
        assert_eq!(r.lost, ["b"]);
        assert_eq!(r.duplicated, ["c"]);
        assert_eq!(r.unexpected, ["x"]);
        assert_eq!(r.double_runs, [1]);
        assert_eq!(r.not_final, [5]);
        // Two leaders of term 3 are legal (leader ids (3, 2) < (3, 3)); replica 2 leading
        // term 1 after term 3 is not.
        assert_eq!(r.split_terms, [3]);
        assert_eq!(r.leader_regressions, [2]);
        assert!(!r.diverged);
        assert!(!r.ok());
    }

    #[test]
    fn a_clean_history_passes_and_percentiles_are_nearest_rank() {
        let records = Records {
            ops: vec![submit("a", Some(1), Outcome::Acked)],
            ..Default::default()
        };
        let q = vec![job(1, "a", "CD")];
        let r = check(
            &records,
            &q,
            &[q.clone(), q.clone()],
            "1 a start 1\n1 a end 2\n",
            0,
        );
        assert!(r.ok(), "{r:?}");
        assert_eq!(percentiles(&[5, 1, 3, 2, 4]), Some((3, 5, 5)));
        assert_eq!(percentiles(&[]), None);
    }
}
