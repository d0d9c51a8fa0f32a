//! What the commands print, and a reader that stopped reading.
//!
//! `squeue | head -3`, `sacct ... | grep -m1 ...`: the reader closes the pipe before the
//! command has printed everything. C tools such as Slurm's die quietly of SIGPIPE there; a
//! Rust program ignores SIGPIPE (so that a write to a closed socket is an error, not death),
//! and std's `println!` panics on the error with a backtrace. The crate's `println!` and
//! `print!` (defined in `main.rs` over these functions) end the command quietly instead,
//! with the status a shell shows for a command killed by SIGPIPE (128 + 13). Any other
//! failure to write is said on stderr and is a failure.

// The unit tests print with std's macros (see `main.rs`), so `text` has no caller there.
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

/// Does `act` to each of `items` in turn, up to the first that fails, and only then prints
/// the line each one that succeeded has to say (if any): a reader that stops early (`docket
/// node drain n[01-64] | head -1`) ends the printing, never the acting. The first failure is
/// the command's error, after the lines of the items done before it.
pub fn act_then_say<T>(
    items: &[T],
    mut act: impl FnMut(&T) -> anyhow::Result<Option<String>>,
) -> anyhow::Result<()> {
    let mut said = Vec::with_capacity(items.len());
    let mut failed = None;
    for item in items {
        match act(item) {
            Ok(l) => said.extend(l),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    for l in said {
        line(format_args!("{l}"));
    }
    failed.map_or(Ok(()), Err)
}

/// Ends the command after a failed write to stdout.
fn stop(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(READER_GONE);
    }
    eprintln!("error: cannot write to stdout: {e}");
    std::process::exit(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acting_stops_at_the_first_failure_which_is_the_error() {
        let mut acted = Vec::new();
        let r = act_then_say(&[1, 2, 3], |&i| {
            acted.push(i);
            if i == 2 {
                anyhow::bail!("item {i} refused");
            }
            Ok(None)
        });
        assert_eq!(acted, [1, 2]);
        assert_eq!(r.unwrap_err().to_string(), "item 2 refused");
        let mut acted = Vec::new();
        act_then_say(&["a", "b"], |&s| {
            acted.push(s);
            Ok(None)
        })
        .unwrap();
        assert_eq!(acted, ["a", "b"]);
    }
}
