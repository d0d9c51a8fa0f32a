//! Replay speed, printing figures (never asserting them):
//!
//!   cargo run --release -p docket-core --example sim_bench [-- JOBS PROCS POLICY...]
//!   cargo run --release -p docket-core --example sim_bench -- TRACE.swf [POLICY...]
//!
//! `--repetitive` generates a workload whose users repeat themselves instead (see
//! `repetitive`: what runtime predictions need). `--write FILE.swf` saves the trace instead (scripts/reference-sim.py replays it
//! for the side-by-side figures in the README).
//!
//! With a trace file, replays it (on its header's processors). Otherwise generates a synthetic trace (seeded, so every run replays the same one): JOBS jobs
//! (default 100,000) for a machine of PROCS processors (default 1,000), sizes mostly small
//! powers of two with some wide jobs, runtimes log-uniform from a minute to a day, estimates
//! 1-5x the runtime, and arrivals paced for an offered load near 0.9, so queues form. Then
//! replays it with each POLICY (any `docket sim --policy` name; default easy and conservative)
//! and prints one JSON line each. Under FCFS the queue grows without bound at that load;
//! the replay keeps it in order (`queue_index`) rather than ordering it at every pass.

use std::time::Instant;

use docket_core::sim::swf::{SwfJob, Trace};
use docket_core::sim::{Policy, SimOptions, replay};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One generated job before it is given a submit time.
struct Drawn {
    procs: u64,
    runtime: u64,
    estimate: u64,
    user: i64,
    group: i64,
}

/// Submit times for `drawn`, exponential gaps paced so that the offered load on `procs`
/// is about 0.9 (drawn from `r` after the jobs, so each generator's trace stays the same).
fn paced(drawn: Vec<Drawn>, procs: u64, r: &mut Lcg) -> Trace {
    let work: f64 = drawn
        .iter()
        .map(|d| d.procs as f64 * d.runtime as f64)
        .sum();
    let mean_gap = work / (procs as f64 * 0.9) / drawn.len().max(1) as f64;
    let mut submit = 0.0;
    let mut out = Vec::with_capacity(drawn.len());
    for (i, d) in drawn.into_iter().enumerate() {
        submit += -mean_gap * (1.0 - r.next()).ln();
        out.push(SwfJob {
            id: i as u64 + 1,
            submit: submit as u64,
            runtime: d.runtime,
            procs: d.procs,
            estimate: d.estimate,
            user: d.user,
            group: d.group,
            queue: -1,
            partition: -1,
        });
    }
    Trace {
        jobs: out,
        max_procs: Some(procs),
        ..Trace::default()
    }
}

fn synthetic(jobs: usize, procs: u64, seed: u64) -> Trace {
    let mut r = Lcg(seed);
    let mut drawn = Vec::with_capacity(jobs);
    for i in 0..jobs {
        let size = if r.next() < 0.1 {
            (procs as f64 * (0.1 + 0.4 * r.next())) as u64
        } else {
            1u64 << (r.next() * 7.0) as u32
        }
        .clamp(1, procs);
        let runtime = (60.0 * 1440f64.powf(r.next())) as u64;
        let estimate = (runtime as f64 * (1.0 + 4.0 * r.next())) as u64;
        drawn.push(Drawn {
            procs: size,
            runtime,
            estimate,
            user: (i % 97) as i64,
            group: (i % 7) as i64,
        });
    }
    paced(drawn, procs, &mut r)
}

/// A workload whose users repeat themselves, as real users do (Tsafrir et al. found the
/// last two jobs of a user the best predictor of the next): 200 users, each with a typical
/// size (a power of two up to 64, a tenth of them wide) and a typical run time
/// (log-uniform from a minute to a day), each job within a factor of 1.5 of it; limits as
/// users set them, rounded up to whole hours and 1-10x the typical run time; arrivals
/// paced for an offered load near 0.9. Users submit in bursts of 1-10 jobs.
fn repetitive(jobs: usize, procs: u64, seed: u64) -> Trace {
    let mut r = Lcg(seed);
    let users: Vec<(u64, f64, u64)> = (0..200)
        .map(|_| {
            let size = if r.next() < 0.1 {
                (procs as f64 * (0.1 + 0.3 * r.next())) as u64
            } else {
                1u64 << (r.next() * 7.0) as u32
            }
            .clamp(1, procs);
            let typical = 60.0 * 1440f64.powf(r.next());
            let limit = ((typical * (1.0 + 9.0 * r.next())) / 3600.0).ceil() as u64 * 3600;
            (size, typical, limit)
        })
        .collect();
    let mut drawn = Vec::with_capacity(jobs);
    while drawn.len() < jobs {
        let u = (r.next() * users.len() as f64) as usize;
        let (size, typical, limit) = users[u];
        let burst = 1 + (r.next() * 10.0) as usize;
        for _ in 0..burst.min(jobs - drawn.len()) {
            let runtime = ((typical * 1.5f64.powf(2.0 * r.next() - 1.0)) as u64).min(limit);
            drawn.push(Drawn {
                procs: size,
                runtime,
                estimate: limit,
                user: u as i64,
                group: (u % 7) as i64,
            });
        }
    }
    paced(drawn, procs, &mut r)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let jobs = args.first().copied().unwrap_or(100_000) as usize;
    let procs = args.get(1).copied().unwrap_or(1000);
    let mut policies: Vec<Policy> = std::env::args()
        .skip(1)
        .filter(|a| {
            a.parse::<u64>().is_err()
                && !a.ends_with(".swf")
                && a != "--write"
                && a != "--repetitive"
        })
        .map(|a| Policy::parse(&a).expect("a policy name (docket sim --policy's)"))
        .collect();
    if policies.is_empty() {
        policies = vec![Policy::EASY, Policy::CONSERVATIVE];
    }
    let written = std::env::args().skip_while(|a| a != "--write").nth(1);
    let file = std::env::args()
        .skip(1)
        .find(|a| a.ends_with(".swf") && Some(a) != written.as_ref());
    let trace = match &file {
        Some(path) => {
            let text = std::fs::read_to_string(path).expect("reading the trace");
            docket_core::sim::swf::parse(&text).expect("parsing the trace")
        }
        None if std::env::args().any(|a| a == "--repetitive") => repetitive(jobs, procs, 42),
        None => synthetic(jobs, procs, 42),
    };
    // `--write FILE.swf`: save the trace (for another simulator to replay) and stop.
    let argv: Vec<String> = std::env::args().collect();
    if let Some(k) = argv.iter().position(|a| a == "--write") {
        let path = argv.get(k + 1).expect("--write FILE.swf");
        let mut text = format!("; MaxProcs: {}\n", trace.max_procs.unwrap_or(procs));
        for j in &trace.jobs {
            text.push_str(&format!(
                "{} {} -1 {} {} -1 -1 {} {} -1 1 {} {} -1 -1 -1 -1 -1\n",
                j.id, j.submit, j.runtime, j.procs, j.procs, j.estimate, j.user, j.group
            ));
        }
        std::fs::write(path, text).expect("writing the trace");
        return;
    }
    for policy in policies {
        let options = SimOptions {
            policy: Some(policy),
            procs: None,
            max_jobs: None,
            site: None,
        };
        let t = Instant::now();
        let r = replay(&trace, &options, &mut |_, _| {}).expect("replay");
        let wall = t.elapsed().as_secs_f64();
        let s = &r.summary;
        println!(
            "{{\"policy\":\"{}\",\"jobs\":{},\"procs\":{},\"sim_wall_s\":{wall:.2},\
             \"utilization\":{:.3},\"mean_wait_s\":{:.0},\"mean_bsld\":{:.2}}}",
            policy.name(),
            s.jobs,
            s.procs,
            s.utilization,
            s.mean_wait_s,
            s.mean_bsld
        );
    }
}
