//! How the `docket` command is linked on Linux with glibc (`build.rs`): gcc's unwinder is
//! inside the executable, and `libgcc_s.so.1` is not loaded at all.
//!
//! Cargo links every target of this package with the build script's `rustc-link-lib` (it has
//! no library target, so the instruction reaches the tests too): this test process unwinds
//! with the same unwinder, linked in, and checks that `libgcc_s` was never loaded. It is
//! linked position-independent (`-no-pie` is for the command alone), which the unwinder does
//! not depend on.

#![cfg(all(target_os = "linux", target_env = "gnu"))]
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The libraries the dynamic loader maps for `docket`, as `ldd` asks for them: with
/// `LD_TRACE_LOADED_OBJECTS` set the loader lists them and stops before `main`.
#[test]
fn the_command_loads_no_libgcc_s() {
    let o = Command::new(env!("CARGO_BIN_EXE_docket"))
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{listed}");
    // The listing is the loader's: libc is in it.
    assert!(listed.contains("libc.so.6"), "{listed}");
    assert!(!listed.contains("libgcc_s"), "{listed}");
}

static DROPPED: AtomicUsize = AtomicUsize::new(0);

struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

#[inline(never)]
fn descend(depth: u32) -> u32 {
    let _guard = Guard;
    if depth == 0 {
        panic!("the bottom");
    }
    descend(depth - 1) + 1
}

#[test]
fn a_panic_unwinds_every_frame_and_is_caught() {
    let before = DROPPED.load(Ordering::SeqCst);
    let caught = std::panic::catch_unwind(|| descend(3));
    assert!(caught.is_err());
    assert_eq!(
        DROPPED.load(Ordering::SeqCst) - before,
        4,
        "a frame was not unwound"
    );
    // A thread's panic reaches whoever joins it.
    assert!(std::thread::spawn(|| descend(2)).join().is_err());
    // Backtraces walk the stack with the same unwinder.
    let trace = std::backtrace::Backtrace::force_capture();
    assert_eq!(trace.status(), std::backtrace::BacktraceStatus::Captured);
    assert!(
        trace
            .to_string()
            .contains("a_panic_unwinds_every_frame_and_is_caught"),
        "{trace}"
    );
    // And all of it without libgcc_s, which nothing loaded meanwhile either.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains("libgcc_s"),
        "this test must unwind with the linked-in unwinder, not libgcc_s:\n{maps}"
    );
}
