//! How long a pass may run, decided by its caller.
//!
//! The core has no clock. The controller hands a pass an object that knows its deadline
//! (`max_sched_time`, `bf_max_time`, `bf_yield_interval`) and the count of RPCs in flight
//! (`max_rpc_cnt`); the pass polls it before each job and, told to stop, returns what it has
//! decided with a continuation to resume from. Tests and `docket sim` count jobs instead.

/// Polled by a pass before it considers each job.
pub trait Budget {
    /// `true`: stop now and return a continuation.
    fn exhausted(&mut self) -> bool;
}

/// Never stops a pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

impl Budget for Unlimited {
    fn exhausted(&mut self) -> bool {
        false
    }
}

/// Stops a pass after it has considered a given number of jobs.
#[derive(Debug, Clone, Copy)]
pub struct JobCount {
    left: u64,
}

impl JobCount {
    pub fn new(jobs: u64) -> JobCount {
        JobCount { left: jobs }
    }
}

impl Budget for JobCount {
    fn exhausted(&mut self) -> bool {
        if self.left == 0 {
            return true;
        }
        self.left -= 1;
        false
    }
}
