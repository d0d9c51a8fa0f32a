//! What the commands print, and a reader that stopped reading.
//!
//! `squeue | head -3`, `sacct ... | grep -m1 ...`: the reader closes the pipe before the
//! command has printed everything. C tools such as Slurm's die quietly of SIGPIPE there; a
//! Rust program ignores SIGPIPE (so that a write to a closed socket is an error, not death),
//! and std's `println!` panics on the error with a backtrace. The crate's `println!` and
//! `print!` (defined in `main.rs` over these functions) end the command quietly instead,
//! with the status a shell shows for a command killed by SIGPIPE (128 + 13). Any other
//! failure to write is said on stderr and is a failure.

// The unit tests print with std's macros (see `main.rs`), so nothing calls these there.
#![cfg_attr(test, allow(dead_code))]

use std::fmt;
use std::io::{self, Write};

/// The exit status of a command whose reader went away: a shell's for death by SIGPIPE.
pub const READER_GONE: i32 = 128 + 13;

/// Prints `args` and a newline on stdout.
pub fn line(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}") {
        stop(&e);
    }
}

/// Prints `args` on stdout.
pub fn text(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = write!(out, "{args}").and_then(|()| out.flush()) {
        stop(&e);
    }
}

/// Ends the command after a failed write to stdout.
fn stop(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(READER_GONE);
    }
    eprintln!("error: cannot write to stdout: {e}");
    std::process::exit(1);
}
