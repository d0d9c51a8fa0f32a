//! Generated hostile input for what the commands parse from scripts and options: `#SBATCH`
//! and `#PBS` directives all the way to the job spec, time expressions (`--begin`), and
//! `squeue`'s `-o`/`-O` formats. Valid inputs are mutated (absurd numbers, separators,
//! quotes, deleted and repeated slices); nothing may panic and every rejection must say
//! something. `DOCKET_FUZZ_CASES` sets the cases per target (256 by default).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn cases() -> u32 {
    std::env::var("DOCKET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

const TOKENS: &[&str] = &[
    "-",
    "--",
    "=",
    ":",
    ",",
    "%",
    "\"",
    "'",
    "\\",
    "\n",
    " ",
    "\0",
    "-1",
    "0",
    "4294967296",
    "18446744073709551616",
    "99999999999999999999",
    "#SBATCH",
    "#PBS",
    "--mem=",
    "-l",
    "select=",
    "walltime=",
    "now+",
    "é",
    "\u{202e}",
    "[",
    "]",
];

/// `seeds`, mutated.
fn mutated(seeds: &'static [&'static str]) -> impl Strategy<Value = String> {
    let edit = (
        0u8..4,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        1usize..32,
    );
    (
        any::<prop::sample::Index>(),
        proptest::collection::vec(edit, 0..6),
    )
        .prop_map(move |(seed, edits)| {
            let mut s: Vec<char> = seeds[seed.index(seeds.len())].chars().collect();
            for (kind, at, token, n) in edits {
                let at = at.index(s.len() + 1);
                match kind {
                    0 => {
                        let t = TOKENS[token.index(TOKENS.len())];
                        s.splice(at..at, t.chars());
                    }
                    1 => {
                        let end = (at + n).min(s.len());
                        s.drain(at..end);
                    }
                    2 => {
                        let end = (at + n).min(s.len());
                        let slice: Vec<char> = s[at..end].to_vec();
                        for _ in 0..n {
                            s.splice(at..at, slice.iter().copied());
                        }
                    }
                    _ => {
                        let t = TOKENS[token.index(TOKENS.len())];
                        let end = (at + 2).min(s.len());
                        s.splice(at..end, t.chars());
                    }
                }
            }
            s.into_iter().collect()
        })
}

fn hostile<T>(
    target: &str,
    seeds: &'static [&'static str],
    parse: impl Fn(&str) -> anyhow::Result<T>,
) {
    let strategy = prop_oneof!["\\PC{0,300}", mutated(seeds), mutated(seeds)];
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        rng_seed: rng_seed(),
        ..Config::default()
    });
    let accepted = std::cell::Cell::new(0u32);
    let result = runner.run(&strategy, |input| {
        match parse(&input) {
            Ok(_) => accepted.set(accepted.get() + 1),
            Err(e) => {
                let message = format!("{e:#}");
                prop_assert!(!message.trim().is_empty(), "a rejection that says nothing");
            }
        }
        Ok(())
    });
    println!("{target}: {} cases, {} accepted", cases(), accepted.get());
    if let Err(e) = result {
        panic!("{target}: {e}");
    }
}

#[test]
fn sbatch_scripts() {
    use clap::Parser;
    const SEEDS: &[&str] = &[
        "#!/bin/bash\n#SBATCH -J sim -p big\n#SBATCH --time=1-02:00:00 --mem=4G\n#SBATCH -N 2 --ntasks-per-node=4\n#SBATCH --array=0-15%4 -d afterok:12\nsrun hostname\n",
        "#!/bin/sh\n#SBATCH --begin=now+1hour --signal=B:USR1@60 --gres=gpu:2\n#SBATCH -o out_%A_%a.txt --open-mode=append\ntrue\n",
    ];
    hostile("#SBATCH", SEEDS, |script| {
        let args = crate::sbatch::directives(script)?;
        let o = crate::sbatch::SbatchArgs::try_parse_from(
            std::iter::once("sbatch".to_owned()).chain(args),
        )?;
        crate::sbatch::job_spec(&o, script, "/tmp", 1_700_000_000_000)
    });
}

#[test]
fn pbs_scripts() {
    use clap::Parser;
    const SEEDS: &[&str] = &[
        "#!/bin/bash\n#PBS -N sim -q normal\n#PBS -l select=2:ncpus=4:mem=8gb,walltime=01:00:00\n#PBS -J 1-10\ntrue\n",
        "#!/bin/sh\n#PBS -l ncpus=48,mem=190GB,jobfs=100GB,vmem=200GB,ngpus=0\n#PBS -o /tmp/ -j oe\ntrue\n",
    ];
    hostile("#PBS", SEEDS, |script| {
        let cli = crate::pbs::QsubArgs::try_parse_from(["qsub"])?;
        crate::pbs::job_spec(&cli, script, "/tmp")
    });
}

#[test]
fn begin_times() {
    const SEEDS: &[&str] = &[
        "now+1hour",
        "16:00",
        "2026-12-01T08:30:00",
        "tomorrow",
        "now+60",
        "midnight",
    ];
    hostile("--begin", SEEDS, |t| {
        crate::slurmtime::parse_instant(t, 1_700_000_000_000)
    });
}

#[test]
fn squeue_formats() {
    const SEEDS: &[&str] = &["%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R", "%i|%T|%r"];
    hostile("squeue -o", SEEDS, crate::squeue_format::parse_o);
    const BIG: &[&str] = &["JobID:.10,Name:30,State,Reason", "jobid,partition:.9"];
    hostile("squeue -O", BIG, crate::squeue_format::parse_big_o);
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
