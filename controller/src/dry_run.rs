//! What applying a configuration would do, without doing it.
//!
//! A dry run applies the commands to a copy of the replicated state, at the next log
//! positions and the current time, exactly as the replicas would; so its per-command errors
//! are the rejections the real apply would give, and the pending jobs' order of consideration
//! before and after can be compared. Nothing is proposed to Raft.

use docket_core::quantity::TimeMs;
use docket_core::{Actor, ApplyCtx, Command, Envelope, JobId, State};

/// At most this many order changes are listed; the rest are counted.
pub const MAX_ORDER_LINES: usize = 50;

/// The outcome of a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryRun {
    /// Per command: empty when it would apply, else the rejection.
    pub errors: Vec<String>,
    /// "job 12: 5 -> 1" for each pending job whose place would change.
    pub order_changes: Vec<String>,
    pub pending_jobs: usize,
}

/// Applies `commands` to a copy of `state` at `now_ms` and compares the order of
/// consideration of the pending jobs. Each command is applied as `actor` asks it, so the
/// dry run refuses what the real one would.
pub fn dry_run(state: &State, actor: &Actor, commands: &[Command], now_ms: u64) -> DryRun {
    let now = TimeMs(now_ms.max(state.applied.now.0));
    let before = state.consideration_order(now);
    let mut copy = state.clone();
    let mut index = copy.applied.index;
    let errors = commands
        .iter()
        .map(|c| {
            index += 1;
            match copy.apply(
                Envelope::new(actor.clone(), c.clone()),
                ApplyCtx {
                    index,
                    time_ms: now,
                },
            ) {
                Ok(_) => String::new(),
                Err(e) => e.to_string(),
            }
        })
        .collect();
    let after = copy.consideration_order(now);
    DryRun {
        errors,
        order_changes: order_changes(&before, &after, MAX_ORDER_LINES),
        pending_jobs: before.len().max(after.len()),
    }
}

/// One line per job whose place (1-based) differs between `before` and `after`, in the
/// order of `after`, then jobs that leave the order; at most `limit` lines and a count of
/// the rest.
pub fn order_changes(before: &[JobId], after: &[JobId], limit: usize) -> Vec<String> {
    let place = |order: &[JobId]| -> std::collections::HashMap<JobId, usize> {
        order.iter().enumerate().map(|(i, j)| (*j, i + 1)).collect()
    };
    let was = place(before);
    let will = place(after);
    let mut lines: Vec<String> = Vec::new();
    for (i, job) in after.iter().enumerate() {
        match was.get(job) {
            Some(&p) if p == i + 1 => {}
            Some(&p) => lines.push(format!("job {}: {p} -> {}", job.0, i + 1)),
            None => lines.push(format!("job {}: not considered -> {}", job.0, i + 1)),
        }
    }
    for (i, job) in before.iter().enumerate() {
        if !will.contains_key(job) {
            lines.push(format!("job {}: {} -> not considered", job.0, i + 1));
        }
    }
    if lines.len() > limit {
        let more = lines.len() - limit;
        lines.truncate(limit);
        lines.push(format!("... and {more} more"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> Vec<JobId> {
        v.iter().map(|&i| JobId(i)).collect()
    }

    #[test]
    fn only_moved_jobs_are_listed() {
        let lines = order_changes(&ids(&[1, 2, 3, 4]), &ids(&[3, 2, 1, 5]), 50);
        assert_eq!(
            lines,
            [
                "job 3: 3 -> 1",
                "job 1: 1 -> 3",
                "job 5: not considered -> 4",
                "job 4: 4 -> not considered"
            ]
        );
        assert!(order_changes(&ids(&[1, 2]), &ids(&[1, 2]), 50).is_empty());
    }

    #[test]
    fn long_lists_are_cut_and_counted() {
        let before: Vec<u64> = (1..=100).collect();
        let after: Vec<u64> = (1..=100).rev().collect();
        let lines = order_changes(&ids(&before), &ids(&after), 10);
        assert_eq!(lines.len(), 11);
        assert_eq!(lines[10], "... and 90 more");
    }
}
