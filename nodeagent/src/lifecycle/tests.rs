//! The run state machine, driven through the interleavings that matter, without root,
//! processes or time.

use super::*;
use pb::instruction::Kind;

const GRACE: Duration = Duration::from_secs(5);

fn runs() -> Runs {
    Runs::new(false, GRACE)
}

fn launch(job: u64, epoch: u64, limit_s: u64) -> Input {
    Input::Instruction(Box::new(Kind::Launch(pb::Launch {
        job_id: job,
        epoch,
        time_limit_seconds: limit_s,
        script: b"#!/bin/sh\nsleep 3\n".to_vec(),
        ..Default::default()
    })))
}

fn control(job: u64, epoch: u64) -> pb::JobControl {
    pb::JobControl {
        job_id: job,
        epoch,
        reason: String::new(),
    }
}

fn kill(job: u64, epoch: u64) -> Input {
    Input::Instruction(Box::new(Kind::Kill(control(job, epoch))))
}

fn suspend(job: u64, epoch: u64) -> Input {
    Input::Instruction(Box::new(Kind::Suspend(control(job, epoch))))
}

fn resume(job: u64, epoch: u64) -> Input {
    Input::Instruction(Box::new(Kind::Resume(control(job, epoch))))
}

fn exited(job: u64, epoch: u64, code: i32, signal: i32) -> Input {
    Input::Ended(
        (job, epoch),
        Outcome::Exited { code, signal },
        Observed::default(),
    )
}

/// The ends reported among `fx`: (job, epoch, cause).
fn ends(fx: &[Effect]) -> Vec<(u64, u64, pb::EndCause)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Report(pb::JobEvent {
                job_id,
                epoch,
                event: Some(pb::job_event::Event::Ended(end)),
            }) => Some((*job_id, *epoch, end.cause())),
            _ => None,
        })
        .collect()
}

fn signals(fx: &[Effect]) -> Vec<(RunId, Signal)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Signal(id, s) => Some((*id, *s)),
            _ => None,
        })
        .collect()
}

fn spawned(fx: &[Effect]) -> Vec<RunId> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Spawn(id, _) => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_launch_sent_twice_or_late_runs_once() {
    let mut r = runs();
    let fx = r.step(0, 0, launch(1, 5, 0));
    assert_eq!(spawned(&fx), [(1, 5)]);
    assert!(
        fx.contains(&Effect::Save),
        "the run is recorded before it is spawned"
    );
    assert_eq!(fx.first(), Some(&Effect::Save));
    assert!(
        r.step(1, 1, launch(1, 5, 0)).is_empty(),
        "the same run again"
    );
    assert!(r.step(2, 2, launch(1, 4, 0)).is_empty(), "an older epoch");
    // After it ended and the leader acknowledged it, it is still refused.
    r.step(3, 3, Input::Started((1, 5)));
    r.step(4, 4, exited(1, 5, 0, 0));
    r.step(5, 5, Input::Acknowledged((1, 5)));
    assert!(r.held().is_empty());
    assert!(r.step(6, 6, launch(1, 5, 0)).is_empty());
    // A newer epoch is a new run.
    assert_eq!(spawned(&r.step(7, 7, launch(1, 6, 0))), [(1, 6)]);
}

#[test]
fn a_newer_epoch_stops_the_older_run_of_the_same_job() {
    let mut r = runs();
    r.step(0, 0, launch(1, 1, 0));
    r.step(1, 1, Input::Started((1, 1)));
    let fx = r.step(2, 2, launch(1, 2, 0));
    assert_eq!(signals(&fx), [((1, 1), Signal::SIGTERM)]);
    assert_eq!(spawned(&fx), [(1, 2)]);
    // Both are held; each ends once, the old one as cancelled.
    assert_eq!(r.held().len(), 2);
    let fx = r.step(3, 3, exited(1, 1, 0, 15));
    assert_eq!(ends(&fx), [(1, 1, pb::EndCause::Cancelled)]);
    // Instructions for the old epoch are stale now.
    assert!(r.step(4, 4, kill(1, 1)).is_empty());
    assert!(r.step(4, 4, suspend(1, 1)).is_empty());
}

#[test]
fn a_kill_before_the_processes_started_is_carried_out_when_they_do() {
    let mut r = runs();
    r.step(0, 0, launch(1, 1, 0));
    let fx = r.step(10, 10, kill(1, 1));
    assert!(signals(&fx).is_empty(), "nothing to signal yet: {fx:?}");
    let fx = r.step(20, 20, Input::Started((1, 1)));
    assert_eq!(signals(&fx), [((1, 1), Signal::SIGTERM)]);
    // SIGKILL after the grace, counted from the SIGTERM.
    assert_eq!(r.next_deadline(20), Some(20 + GRACE.as_millis() as u64));
    assert!(signals(&r.step(1000, 1000, Input::Tick)).is_empty());
    let fx = r.step(5020, 5020, Input::Tick);
    assert_eq!(signals(&fx), [((1, 1), Signal::SIGKILL)]);
    let fx = r.step(5030, 5030, exited(1, 1, 0, 9));
    assert_eq!(ends(&fx), [(1, 1, pb::EndCause::Cancelled)]);
    assert_eq!(
        fx[..2],
        [Effect::Release((1, 1)), Effect::Save],
        "released and saved before it is reported"
    );
}

#[test]
fn every_run_ends_exactly_once() {
    let mut r = runs();
    r.step(0, 0, launch(1, 1, 0));
    r.step(1, 1, Input::Started((1, 1)));
    let first = r.step(2, 2, exited(1, 1, 3, 0));
    assert_eq!(ends(&first), [(1, 1, pb::EndCause::Failed)]);
    assert!(r.step(3, 3, exited(1, 1, 0, 0)).is_empty(), "a second exit");
    assert!(r.step(3, 3, kill(1, 1)).is_empty(), "a kill after the end");
    assert!(
        r.step(3, 3, exited(2, 1, 0, 0)).is_empty(),
        "an exit of a run never held"
    );
    // Reported again to every new leader until acknowledged.
    assert_eq!(r.unreported().len(), 1);
    assert_eq!(r.unreported().len(), 1);
    r.step(4, 4, Input::Acknowledged((1, 1)));
    assert!(r.unreported().is_empty());
    // Acknowledging a running run does not forget it.
    r.step(5, 5, launch(2, 1, 0));
    r.step(6, 6, Input::Acknowledged((2, 1)));
    assert_eq!(r.held().len(), 1);
}

#[test]
fn a_kill_for_a_run_never_held_reports_it_cancelled() {
    let mut r = runs();
    let fx = r.step(0, 0, kill(9, 7));
    assert_eq!(ends(&fx), [(9, 7, pb::EndCause::Cancelled)]);
    assert!(r.held().is_empty());
}

#[test]
fn walltime_stops_while_suspended() {
    let mut r = runs();
    r.step(0, 0, launch(1, 1, 2));
    r.step(0, 0, Input::Started((1, 1)));
    assert_eq!(r.next_deadline(0), Some(2000));
    let frozen = |r: &Runs| r.held().iter().map(|h| h.suspended).collect::<Vec<_>>();
    assert_eq!(frozen(&r), [false]);
    let fx = r.step(1000, 1000, suspend(1, 1));
    assert_eq!(fx[0], Effect::Freeze((1, 1), true));
    // A new leader learns of the suspension from what the agent holds.
    assert_eq!(frozen(&r), [true]);
    assert_eq!(
        r.next_deadline(1000),
        None,
        "a suspended run's clock is stopped"
    );
    assert!(r.step(9000, 9000, Input::Tick).is_empty());
    let fx = r.step(9000, 9000, resume(1, 1));
    assert_eq!(fx[0], Effect::Freeze((1, 1), false));
    assert_eq!(frozen(&r), [false]);
    assert_eq!(r.next_deadline(9000), Some(10_000));
    let fx = r.step(10_000, 10_000, Input::Tick);
    assert_eq!(signals(&fx), [((1, 1), Signal::SIGTERM)]);
    let fx = r.step(10_100, 10_100, exited(1, 1, 0, 15));
    assert_eq!(ends(&fx), [(1, 1, pb::EndCause::Timeout)]);
}

#[test]
fn a_suspended_run_is_thawed_before_it_is_stopped() {
    let mut r = runs();
    r.step(0, 0, launch(1, 1, 0));
    r.step(0, 0, Input::Started((1, 1)));
    r.step(10, 10, suspend(1, 1));
    assert!(r.step(11, 11, suspend(1, 1)).is_empty(), "suspended twice");
    let fx = r.step(20, 20, kill(1, 1));
    let order: Vec<&Effect> = fx
        .iter()
        .filter(|e| matches!(e, Effect::Freeze(..) | Effect::Signal(..)))
        .collect();
    assert_eq!(
        order,
        [
            &Effect::Freeze((1, 1), false),
            &Effect::Signal((1, 1), Signal::SIGTERM)
        ]
    );
    assert!(!r.get((1, 1)).unwrap().suspended());
}

#[test]
fn a_suspend_before_the_processes_started_freezes_them_when_they_do() {
    let mut r = runs();
    r.step(0, 0, launch(1, 1, 0));
    let fx = r.step(1, 1, suspend(1, 1));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Freeze(..))));
    let fx = r.step(2, 2, Input::Started((1, 1)));
    assert!(matches!(fx[0], Effect::Report(_)));
    assert_eq!(fx[1], Effect::Freeze((1, 1), true));
}

#[test]
fn the_fence_stops_every_running_job_as_a_node_failure() {
    let mut r = runs();
    for job in 1..=3 {
        r.step(0, 0, launch(job, 1, 0));
        r.step(0, 0, Input::Started((job, 1)));
    }
    r.step(1, 1, exited(3, 1, 0, 0));
    let fx = r.step(2, 2, Input::Fence);
    assert_eq!(
        signals(&fx),
        [((1, 1), Signal::SIGTERM), ((2, 1), Signal::SIGTERM)]
    );
    let fx = r.step(3, 3, exited(1, 1, 0, 15));
    assert_eq!(ends(&fx), [(1, 1, pb::EndCause::NodeFailure)]);
}

#[test]
fn how_a_run_ended_decides_its_cause() {
    let cases = [
        (
            Outcome::Exited { code: 0, signal: 0 },
            Observed::default(),
            pb::EndCause::Completed,
        ),
        (
            Outcome::Exited { code: 2, signal: 0 },
            Observed::default(),
            pb::EndCause::Failed,
        ),
        (
            Outcome::Exited { code: 0, signal: 9 },
            Observed {
                oom_killed: true,
                ..Observed::default()
            },
            pb::EndCause::OutOfMemory,
        ),
        (
            Outcome::Exited { code: 1, signal: 0 },
            Observed {
                jobfs_full: true,
                ..Observed::default()
            },
            pb::EndCause::JobfsExceeded,
        ),
        (
            Outcome::Exited { code: 0, signal: 0 },
            Observed {
                jobfs_full: true,
                ..Observed::default()
            },
            pb::EndCause::Completed,
        ),
        (
            Outcome::LaunchFailed("no such user".into()),
            Observed::default(),
            pb::EndCause::LaunchFailed,
        ),
        (
            Outcome::Lost,
            Observed::default(),
            pb::EndCause::NodeFailure,
        ),
    ];
    for (outcome, seen, want) in cases {
        let mut r = runs();
        r.step(0, 0, launch(1, 1, 0));
        let fx = r.step(1, 1, Input::Ended((1, 1), outcome.clone(), seen));
        assert_eq!(ends(&fx), [(1, 1, want)], "{outcome:?} {seen:?}");
    }
}

#[test]
fn simulated_runs_last_their_sleep_and_end_at_once_when_stopped() {
    let mut r = Runs::new(true, GRACE);
    r.step(0, 0, launch(1, 1, 0));
    let fx = r.step(0, 0, Input::Started((1, 1)));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Freeze(..))));
    assert_eq!(r.next_deadline(0), Some(3000));
    r.step(1000, 1000, suspend(1, 1));
    r.step(2000, 2000, resume(1, 1));
    assert_eq!(
        r.next_deadline(2000),
        Some(4000),
        "suspension does not count"
    );
    let fx = r.step(4000, 4000, Input::Tick);
    assert_eq!(ends(&fx), [(1, 1, pb::EndCause::Completed)]);
    r.step(5000, 5000, launch(2, 1, 0));
    let fx = r.step(5001, 5001, kill(2, 1));
    assert_eq!(ends(&fx), [(2, 1, pb::EndCause::Cancelled)]);
    assert!(
        signals(&fx).is_empty(),
        "a simulated run has nothing to signal"
    );
}

/// The agent may die between any two steps: a new one restores what the old one saved (its
/// last save, through the state file's JSON) and goes on with what happens next. Every run
/// still ends exactly once with the cause it would have had.
#[test]
fn a_restart_after_any_step_changes_no_outcome() {
    let script: Vec<(Millis, Input)> = vec![
        (0, launch(1, 1, 10)),
        (0, launch(2, 1, 0)),
        (0, launch(3, 1, 0)),
        (5, Input::Started((1, 1))),
        (5, Input::Started((2, 1))),
        (6, Input::Started((3, 1))),
        (100, suspend(2, 1)),
        (200, kill(3, 1)),
        (300, exited(3, 1, 0, 15)),
        (400, resume(2, 1)),
        (500, exited(2, 1, 4, 0)),
        (10_005, Input::Tick),
        (10_100, exited(1, 1, 0, 15)),
        (10_200, launch(1, 1, 0)),
        (10_300, Input::Acknowledged((3, 1))),
    ];
    let want = {
        let mut r = runs();
        let mut all = Vec::new();
        for (t, input) in script.clone() {
            all.extend(ends(&r.step(t, t, input)));
        }
        all.sort();
        all
    };
    assert_eq!(
        want,
        [
            (1, 1, pb::EndCause::Timeout),
            (2, 1, pb::EndCause::Failed),
            (3, 1, pb::EndCause::Cancelled)
        ]
    );
    for crash in 0..=script.len() {
        let mut r = runs();
        let mut reported = Vec::new();
        let mut saved = Vec::new();
        for (t, input) in script[..crash].iter().cloned() {
            let fx = r.step(t, t, input);
            if fx.contains(&Effect::Save) {
                saved = r.records(t);
            }
            reported.extend(ends(&fx));
        }
        // The restart: only what was saved survives.
        let at = script.get(crash).map_or(20_000, |(t, _)| *t);
        let text = serde_json::to_string(&saved).unwrap();
        let records: Vec<(RunId, RunRecord)> = serde_json::from_str(&text).unwrap();
        let mut r = runs();
        let mut fx = Vec::new();
        r.restore(at, at, records, &mut fx);
        // The new agent reports the ends the leader has not acknowledged.
        reported.extend(r.unreported().iter().filter_map(|e| match &e.event {
            Some(pb::job_event::Event::Ended(end)) => Some((e.job_id, e.epoch, end.cause())),
            _ => None,
        }));
        for (t, input) in script[crash..].iter().cloned() {
            reported.extend(ends(&r.step(t, t, input)));
        }
        reported.sort();
        reported.dedup();
        assert_eq!(reported, want, "a restart after step {crash}");
        assert!(
            r.held().iter().all(|h| !h.running || h.job_id == 1),
            "after step {crash} a run is still running: {:?}",
            r.held()
        );
    }
}
