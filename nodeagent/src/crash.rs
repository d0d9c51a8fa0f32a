//! Named crash points, for fault drills.
//!
//! An agent that dies at the wrong moment — after it accepted a launch but before the job
//! started, after the job started but before the agent recorded where, after the job ended
//! but before the end was recorded or reported — must still never lose a job nor run one
//! twice. A `kill -9` at a random time rarely lands in those windows, so the agent marks
//! them with [fail-rs] points, and `--crash-at POINT` makes the agent SIGKILL itself the
//! first time it reaches one. The chaos harness restarts an agent armed this way to aim a
//! crash exactly at a launch or an exit. Unarmed, a point costs one lookup in an empty map;
//! built without the `crash-points` feature (on by default), the points compile to nothing.
//!
//! [fail-rs]: https://github.com/tikv/fail-rs

use clap::ValueEnum;

/// Where an agent can be made to crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CrashPoint {
    /// The run is recorded in the state file; nothing has started.
    LaunchRecorded,
    /// The job's monitor process has been started; the agent has not yet recorded it.
    LaunchSpawned,
    /// The job has ended (its monitor exited); the agent has not yet recorded the end.
    ExitObserved,
    /// The end is recorded in the state file; it has not yet been reported.
    ExitRecorded,
}

impl CrashPoint {
    /// The fail point's name.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::LaunchRecorded => "launch-recorded",
            CrashPoint::LaunchSpawned => "launch-spawned",
            CrashPoint::ExitObserved => "exit-observed",
            CrashPoint::ExitRecorded => "exit-recorded",
        }
    }

    /// Every point, in the order a run passes them.
    pub const ALL: [CrashPoint; 4] = [
        CrashPoint::LaunchRecorded,
        CrashPoint::LaunchSpawned,
        CrashPoint::ExitObserved,
        CrashPoint::ExitRecorded,
    ];
}

/// Makes this process SIGKILL itself when it first reaches `point`; refused when the agent
/// was built without the `crash-points` feature.
pub fn arm(point: CrashPoint) -> Result<(), String> {
    if !fail::has_failpoints() {
        return Err(format!(
            "--crash-at {}: this agent was built without the crash-points feature",
            point.name()
        ));
    }
    let name = point.name();
    tracing::warn!(point = name, "armed: this agent will kill itself at {name}");
    // cfg_callback only fails on a malformed action string, which a callback has none of.
    let _ = fail::cfg_callback(name, move || {
        tracing::warn!(point = name, "crash point reached: SIGKILL to myself");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    });
    Ok(())
}

/// Marks that a run has reached `point` (and dies there when armed for it).
#[cfg_attr(not(feature = "crash-points"), allow(unused_variables))]
pub fn reached(point: CrashPoint) {
    fail::fail_point!(point.name());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_unarmed_points_do_nothing() {
        let names: std::collections::BTreeSet<_> =
            CrashPoint::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), CrashPoint::ALL.len());
        for p in CrashPoint::ALL {
            reached(p);
            // The command-line value is the point's name.
            let value = p.to_possible_value().map(|v| v.get_name().to_string());
            assert_eq!(value.as_deref(), Some(p.name()));
        }
    }
}
