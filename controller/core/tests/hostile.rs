//! Generated hostile input for every parser and decoder of docket-core that untrusted bytes
//! reach: time and size formats, array and dependency expressions, hostlists, SWF traces, the
//! site file, simulator policies, Raft payloads (a command envelope as it travels in the log)
//! and snapshots.
//!
//! Each target gets two kinds of case: arbitrary text or bytes, and *mutations* of valid
//! seeds (numbers swapped for absurd ones, separators inserted, slices deleted or repeated,
//! bytes flipped), which reach far deeper than random bytes do. Every case must return (no
//! panic), every rejection must say something, and the memory a call allocates must stay
//! within a bound proportional to the input (measured by a counting allocator on this
//! thread, so it is exact, not sampled): errors may quote the input (escaped, so a few times
//! its length), nothing may grow faster. The slowest case is printed, not asserted.
//!
//! `DOCKET_FUZZ_SEED` (a number, or `random`) picks the generator's seed, fixed by default.
//! `DOCKET_FUZZ_CASES` sets the cases per target (256 by default, what CI runs). A long run:
//! `DOCKET_FUZZ_CASES=200000 cargo test --release -p docket-core --test hostile -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Counts this thread's live and peak heap bytes.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn on_alloc(size: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(size);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn on_free(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are
// const-initialised thread locals (no allocation on access).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        on_alloc(layout.size());
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        on_free(layout.size());
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        on_alloc(layout.size());
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        on_free(layout.size());
        on_alloc(new_size);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most bytes `f` had allocated at once beyond what was live before it, and its time.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, Duration) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    let peak = PEAK.with(Cell::get).saturating_sub(base);
    (out, peak, took)
}

fn cases() -> u32 {
    std::env::var("DOCKET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// What one target saw, printed at its end.
#[derive(Default)]
struct Figures {
    cases: u64,
    accepted: u64,
    largest_input: usize,
    peak_bytes: usize,
    worst_ratio: f64,
    slowest: Duration,
    slowest_len: usize,
}

impl Figures {
    fn print(&self, target: &str) {
        println!(
            "{target}: {} cases ({} accepted), inputs up to {} B, peak allocation {} B \
             (at most {:.1} B per input byte beyond the base), slowest {:?} on {} B",
            self.cases,
            self.accepted,
            self.largest_input,
            self.peak_bytes,
            self.worst_ratio,
            self.slowest,
            self.slowest_len
        );
    }
}

/// Runs `parse` on every case `strategy` makes: it must not panic, an error must say
/// something, and it may allocate at most `base + per_byte * len` bytes.
fn hostile<S, T, E>(
    target: &str,
    strategy: S,
    base: usize,
    per_byte: usize,
    parse: impl Fn(&[u8]) -> Result<T, E>,
) where
    S: Strategy<Value = Vec<u8>>,
    E: std::fmt::Display,
{
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        rng_seed: rng_seed(),
        ..Config::default()
    });
    let figures = std::cell::RefCell::new(Figures::default());
    let result = runner.run(&strategy, |input| {
        let (outcome, peak, took) = measure(|| parse(&input).map_err(|e| e.to_string()));
        let mut f = figures.borrow_mut();
        f.cases += 1;
        f.largest_input = f.largest_input.max(input.len());
        f.peak_bytes = f.peak_bytes.max(peak);
        let ratio = peak.saturating_sub(base) as f64 / input.len().max(1) as f64;
        f.worst_ratio = f.worst_ratio.max(ratio);
        if took > f.slowest {
            (f.slowest, f.slowest_len) = (took, input.len());
        }
        match &outcome {
            Ok(_) => f.accepted += 1,
            Err(e) => prop_assert!(!e.trim().is_empty(), "a rejection that says nothing"),
        }
        prop_assert!(
            peak <= base + per_byte * input.len(),
            "{peak} B allocated for {} B of input (bound {base} + {per_byte}/B): {:?}",
            input.len(),
            String::from_utf8_lossy(&input)
        );
        Ok(())
    });
    figures.borrow().print(target);
    if let Err(e) = result {
        panic!("{target}: {e}");
    }
}

/// Tokens that break parsers: separators, absurd numbers, units, unicode.
const TOKENS: &[&str] = &[
    "-",
    ":",
    ",",
    "[",
    "]",
    "%",
    "+",
    "?",
    "=",
    "\"",
    "\\",
    "\n",
    " ",
    "\t",
    "\0",
    "0",
    "00",
    "-1",
    "1e9",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999",
    "NaN",
    "inf",
    "UNLIMITED",
    "K",
    "M",
    "G",
    "T",
    "P",
    "E",
    "afterok",
    "singleton",
    "#SBATCH",
    "é",
    "\u{202e}",
    "𝟘",
    "[0-4294967295]",
    "1-999999999",
];

/// Valid seeds, mutated: each mutation replaces, inserts, deletes or repeats a slice.
fn mutated(seeds: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    let op = (
        0u8..5,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        any::<u8>(),
    );
    (
        any::<prop::sample::Index>(),
        proptest::collection::vec(op, 1..6),
    )
        .prop_map(move |(seed, ops)| {
            let mut s = seeds[seed.index(seeds.len())].as_bytes().to_vec();
            for (kind, at, len, token, byte) in ops {
                let at = at.index(s.len() + 1);
                match kind {
                    0 => {
                        let t = TOKENS[token.index(TOKENS.len())].as_bytes();
                        s.splice(at..at, t.iter().copied());
                    }
                    1 => {
                        let end = (at + len.index(8)).min(s.len());
                        s.drain(at..end);
                    }
                    2 => {
                        let end = (at + len.index(16)).min(s.len());
                        let slice: Vec<u8> = s[at..end].to_vec();
                        for _ in 0..(token.index(64) + 1) {
                            s.splice(at..at, slice.iter().copied());
                        }
                    }
                    3 => {
                        if at < s.len() {
                            s[at] = byte;
                        }
                    }
                    _ => {
                        let t = TOKENS[token.index(TOKENS.len())].as_bytes();
                        let end = (at + len.index(4)).min(s.len());
                        s.splice(at..end, t.iter().copied());
                    }
                }
            }
            s
        })
}

/// Arbitrary bytes (half the time printable) or a mutated seed.
fn inputs(seeds: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        "\\PC{0,200}".prop_map(String::into_bytes),
        mutated(seeds),
        mutated(seeds),
    ]
}

fn text(bytes: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))
}

#[test]
fn time_formats() {
    use docket_core::quantity::parse_duration;
    const SEEDS: &[&str] = &[
        "1-02:03:04",
        "02:03:04",
        "30",
        "5:00",
        "UNLIMITED",
        "2-0",
        "0",
    ];
    hostile("durations", inputs(SEEDS), 1024, 32, |b| {
        parse_duration(text(b)?).map_err(|e| e.to_string())
    });
}

#[test]
fn size_formats() {
    use docket_core::quantity::parse_size;
    const SEEDS: &[&str] = &["4G", "100M", "1T", "512", "1.5G", "64KB", "0"];
    hostile("sizes", inputs(SEEDS), 1024, 32, |b| {
        parse_size(text(b)?).map_err(|e| e.to_string())
    });
}

#[test]
fn array_expressions() {
    use docket_core::job::ArraySpec;
    const SEEDS: &[&str] = &["0-15", "1,3,5-9:2", "0-999%10", "7", "0-1000:100%4"];
    hostile("arrays", inputs(SEEDS), 4096, 64, |b| {
        ArraySpec::parse(text(b)?, 1001).map_err(|e| e.to_string())
    });
}

#[test]
fn dependency_expressions() {
    use docket_core::job::Dependency;
    const SEEDS: &[&str] = &[
        "afterok:12",
        "afterany:1:2:3,afternotok:4",
        "after:5+10?afterok:6",
        "singleton",
        "aftercorr:9_3",
        "afterok:12_[1-3]",
    ];
    hostile("dependencies", inputs(SEEDS), 4096, 64, |b| {
        Dependency::parse(text(b)?).map_err(|e| e.to_string())
    });
}

#[test]
fn hostlists() {
    use docket_core::hostlist::{MAX_HOSTS, MAX_NAME_BYTES, expand};
    const SEEDS: &[&str] = &[
        "n[001-128]",
        "gpu[1-4,7],login1",
        "rack[1-2]-n[01-16]",
        "a,b,c",
    ];
    // A hostlist may name up to MAX_HOSTS names of MAX_NAME_BYTES in all whatever its
    // length; each is a String (with the allocator's rounding), in a Vec that may double.
    let names = MAX_HOSTS as usize * (2 * std::mem::size_of::<String>() + 16);
    hostile(
        "hostlists",
        inputs(SEEDS),
        2 * (names + MAX_NAME_BYTES as usize),
        64,
        |b| expand(text(b)?).map_err(|e| e.to_string()),
    );
}

#[test]
fn swf_traces() {
    use docket_core::sim::swf::parse;
    const SEEDS: &[&str] = &[
        "; MaxProcs: 128\n1 0 10 100 4 -1 -1 4 200 -1 1 1 1 -1 1 -1 -1 -1\n2 5 0 50 8 -1 -1 8 60 -1 1 2 1 -1 1 -1 -1 -1\n",
        "1 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n",
    ];
    hostile("swf", inputs(SEEDS), 4096, 64, |b| {
        parse(text(b)?).map_err(|e| e.to_string())
    });
}

#[test]
fn simulator_policies() {
    use docket_core::sim::Policy;
    const SEEDS: &[&str] = &[
        "easy",
        "easy++",
        "conservative+starve=86400",
        "fcfs",
        "sjf+bf=shortest",
    ];
    hostile("policies", inputs(SEEDS), 4096, 64, |b| {
        Policy::parse(text(b)?)
    });
}

#[test]
fn site_files() {
    use docket_core::hostlist::MAX_HOSTS;
    const SEEDS: &[&str] = &[
        "ClusterName = \"c\"\nMinJobAge = 300\n[SchedulerParameters]\nbf_window = 1440\n\
         [[nodes]]\nNodeName = \"n[01-04]\"\nCPUs = 8\nRealMemory = \"16G\"\n\
         [[partitions]]\nPartitionName = \"batch\"\nNodes = \"n[01-04]\"\nDefault = true\n\
         MaxTime = \"1-00:00:00\"\n[[accounts]]\nName = \"a\"\n[[users]]\nName = \"u\"\n\
         DefaultAccount = \"a\"\n",
        "PurgeJobAfter = \"12months\"\nPriorityType = \"priority/multifactor\"\n\
         PriorityWeightAge = 1000\n[[qos]]\nName = \"normal\"\nMaxWall = \"2:00:00\"\n",
    ];
    // Nodes and partitions name up to MAX_HOSTS nodes each, whatever the file's length.
    let nodes = MAX_HOSTS as usize * 512;
    let load = |b: &[u8]| -> Result<docket_core::State, String> {
        let file = docket_core::site::parse(text(b)?).map_err(|e| e.to_string())?;
        file.site
            .to_state(docket_core::quantity::TimeMs(0))
            .map_err(|e| e.to_string())
    };
    for seed in SEEDS {
        load(seed.as_bytes()).unwrap();
    }
    hostile("site files", inputs(SEEDS), 2 * nodes, 4096, load);
}

/// The Raft payload: a command envelope as postcard bytes, seeds from real commands.
#[test]
fn raft_payloads() {
    use docket_core::job::{BlobId, JobSpec};
    use docket_core::{Command, Envelope};
    let spec = JobSpec::simple("alice".parse().unwrap(), BlobId::of(b"#!/bin/sh\n"));
    let seeds: Vec<Vec<u8>> = [
        Envelope::controller(Command::Tick),
        Envelope::controller(Command::SubmitJobs {
            blobs: vec![b"#!/bin/sh\ntrue\n".to_vec()],
            jobs: vec![spec.clone(), spec],
        }),
        Envelope::controller(Command::EndJobs(Vec::new())),
    ]
    .iter()
    .map(|e| postcard::to_stdvec(e).unwrap())
    .collect();
    let seeds: &'static [Vec<u8>] = Box::leak(seeds.into_boxed_slice());
    let flipped = (
        any::<prop::sample::Index>(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    )
        .prop_map(move |(seed, edits)| {
            let mut b = seeds[seed.index(seeds.len())].clone();
            for (at, byte, kind) in edits {
                let at = at.index(b.len() + 1);
                match kind {
                    0 if at < b.len() => b[at] = byte,
                    1 => b.truncate(at),
                    // A varint that claims a huge length.
                    _ => {
                        b.splice(at..at, [0xff, 0xff, 0xff, 0xff, 0x0f]);
                    }
                }
            }
            b
        });
    let strategy = prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), flipped];
    // serde preallocates at most about 1 MiB for a claimed length, then grows with the input.
    hostile("raft payloads", strategy, 2 << 20, 256, |b| {
        postcard::from_bytes::<Envelope>(b)
    });
}

/// Snapshots: a real one mutated, and noise; a restored state passes every invariant.
#[test]
fn snapshots() {
    use docket_core::State;
    use docket_core::config::SchedConfig;
    let seed = State::new(SchedConfig::default()).to_snapshot().unwrap();
    let seed: &'static [u8] = Box::leak(seed.into_boxed_slice());
    let mutated =
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)
            .prop_map(move |edits| {
                let mut b = seed.to_vec();
                for (at, byte, kind) in edits {
                    let at = at.index(b.len() + 1);
                    match kind {
                        0 if at < b.len() => b[at] = byte,
                        1 => b.truncate(at.max(6)),
                        _ => {
                            b.splice(at..at, [0xff, 0xff, 0xff, 0x7f]);
                        }
                    }
                }
                b
            });
    let strategy = prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), mutated];
    hostile("snapshots", strategy, 2 << 20, 1024, |b| {
        State::from_snapshot(b)
    });
}

/// The generator's seed: fixed unless `DOCKET_FUZZ_SEED` names one (or `random`), so a CI
/// failure reproduces; long runs pass `random` or a seed of their own.
fn rng_seed() -> proptest::test_runner::RngSeed {
    use proptest::test_runner::RngSeed;
    match std::env::var("DOCKET_FUZZ_SEED").as_deref() {
        Ok("random") => RngSeed::Random,
        Ok(n) => n.parse().map_or(RngSeed::Fixed(20_261_126), RngSeed::Fixed),
        Err(_) => RngSeed::Fixed(20_261_126),
    }
}
