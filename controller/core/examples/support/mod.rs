//! What the benchmark examples share: a state driven by commands with a log index and a
//! clock of its own, and name parsing that may panic (benchmark setup is not input).

use docket_core::quantity::{Seconds, TimeMs};
use docket_core::{ApplyCtx, Command, Envelope, Response, State};

pub struct Bench {
    pub state: State,
    pub index: u64,
    pub now: TimeMs,
    /// How far the clock moves with each command.
    pub step: Seconds,
}

impl Bench {
    pub fn new(state: State, step: Seconds) -> Bench {
        Bench {
            state,
            index: 0,
            now: TimeMs(1_700_000_000_000),
            step,
        }
    }

    /// Applies a setup or measured command; a refusal is a bug in the benchmark.
    pub fn apply(&mut self, cmd: Command) -> Response {
        self.index += 1;
        self.now = self.now.plus(self.step);
        let ctx = ApplyCtx {
            index: self.index,
            time_ms: self.now,
        };
        match self.state.apply(&Envelope::new(cmd), ctx) {
            Ok(r) => r,
            Err(e) => panic!("setup command refused: {e}"),
        }
    }
}

pub fn name<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("valid name")
}
