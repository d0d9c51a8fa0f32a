//! `sbatch`, `squeue` and `scancel` (the `docket` binary through symlinks) against three real
//! `docket-controller` processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{DEADLINE, auth_env, free_addr, run, start_cluster, text};

const SITE: &str = r#"
[[nodes]]
NodeName = "n[01-02]"
CPUs = 4
RealMemory = "8G"

[[partitions]]
PartitionName = "batch"
Nodes = "ALL"
Default = true
MaxTime = "1-00:00:00"

[[accounts]]
Name = "ops"

[[users]]
Name = "root"
DefaultAccount = "ops"
"#;

#[test]
fn sbatch_squeue_and_scancel_speak_slurm() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test site defines only the user root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_procs, addr) = start_cluster(d, SITE);

    // sbatch: directives, command line over directives, --parsable; retried through the
    // first election without the user noticing.
    let script = "#!/bin/sh\n#SBATCH -J hello\n#SBATCH --hold\n#SBATCH -t 10\necho hi\n";
    std::fs::write(d.join("job.sh"), script).unwrap();
    let id = sbatch_through_the_first_election(d, &addr);
    let second = sbatch_second_from_stdin(d, &addr, script);

    // squeue: Slurm's columns, pending with the hold reason.
    squeue_shows_both_pending(d, &addr, id, second);
    // The comment: squeue's %k (and "(null)" without one), scontrol show and update, sacct.
    the_comment_is_shown_updated_and_accounted(d, &addr, id, second);
    // scancel: by id; then it is gone from the queue and shown among the cancelled; and by
    // filter.
    scancel_by_id_and_by_filter(d, &addr, id, second);
    // Errors: one line on stderr saying what is wrong; a non-zero exit.
    errors_are_one_line_and_a_failure(d, &addr);
    // `squeue | head -1`: a reader that goes away ends the command quietly.
    a_reader_that_goes_away_ends_the_command_quietly(d, &addr);
    // sinfo: partitions with their nodes folded; -N one line per node.
    sinfo_folds_nodes_and_lists_them(d, &addr);
    // scontrol: ping in Slurm's words, show job, update, hold/release.
    scontrol_pings_shows_updates_and_releases(d, &addr);
    // sacct: Slurm's default columns, code:signal, -P.
    sacct_shows_the_cancelled_job(d, &addr, id);
    // PBS: qsub with #PBS directives and -l, qstat, qdel.
    pbs_submits_lists_and_deletes(d, &addr);
    // sprio: the pending jobs' priority, factor by factor.
    sprio_shows_the_factors(d, &addr);
    // docket cluster status: every replica, one leader.
    cluster_status_shows_every_replica(d, &addr);
    // install-aliases makes the links.
    install_aliases_makes_the_links(d);
}

/// `sbatch --parsable job.sh`, retried until the first leader knows the user; the job's id.
fn sbatch_through_the_first_election(d: &Path, addr: &str) -> u64 {
    let start = Instant::now();
    loop {
        let o = run(d, addr, "sbatch", &["--parsable", "job.sh"], None);
        if o.status.success() {
            return text(&o).trim().parse().unwrap();
        }
        // Before the first leader has applied the site, the user is unknown: wait.
        assert!(
            start.elapsed() < DEADLINE,
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `script` on sbatch's stdin, its name and a comment on the command line; the job's id,
/// read from Slurm's "Submitted batch job" words.
fn sbatch_second_from_stdin(d: &Path, addr: &str, script: &str) -> u64 {
    let o = run(
        d,
        addr,
        "sbatch",
        &["-J", "second", "--comment", "sweep 3 of 12"],
        Some(script),
    );
    assert!(o.status.success(), "{o:?}");
    text(&o)
        .trim()
        .strip_prefix("Submitted batch job ")
        .expect("Slurm's words")
        .parse()
        .unwrap()
}

/// squeue's header is Slurm's; `id` is pending and held; `second` is listed, and its name
/// and comment are in `squeue --json`.
fn squeue_shows_both_pending(d: &Path, addr: &str, id: u64, second: u64) {
    let o = run(d, addr, "squeue", &[], None);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        [
            "JOBID",
            "PARTITION",
            "NAME",
            "USER",
            "ST",
            "TIME",
            "NODES",
            "NODELIST(REASON)"
        ]
    );
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[1..5], ["batch", "hello", "root", "PD"], "{row}");
    assert!(
        cols[7].starts_with("(Job") || cols[7].contains("Held"),
        "{row}"
    );
    assert!(out.contains("second"), "{out}");
    let o = run(
        d,
        addr,
        "squeue",
        &["--json", "-j", &second.to_string()],
        None,
    );
    let v: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    assert_eq!(v["jobs"][0]["name"], "second");
    assert_eq!(v["jobs"][0]["comment"], "sweep 3 of 12");
}

/// `second`'s comment in squeue's %k (`id` has none: "(null)") and scontrol show; changed by
/// scontrol update, and the new one in sacct.
fn the_comment_is_shown_updated_and_accounted(d: &Path, addr: &str, id: u64, second: u64) {
    let o = run(d, addr, "squeue", &["-h", "-o", "%i|%k"], None);
    let out = text(&o);
    assert!(out.contains(&format!("{second}|sweep 3 of 12")), "{out}");
    assert!(out.contains(&format!("{id}|(null)")), "{out}");
    let o = run(
        d,
        addr,
        "scontrol",
        &["show", "job", &second.to_string()],
        None,
    );
    assert!(
        text(&o).contains("   Comment=sweep 3 of 12\n"),
        "{}",
        text(&o)
    );
    let o = run(
        d,
        addr,
        "scontrol",
        &[
            "update",
            &format!("JobId={second}"),
            "Comment=sweep 4 of 12",
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    let o = run(
        d,
        addr,
        "sacct",
        &[
            "-n",
            "-P",
            "-X",
            "-j",
            &second.to_string(),
            "-o",
            "JobID,Comment",
        ],
        None,
    );
    assert_eq!(text(&o).trim(), format!("{second}|sweep 4 of 12"));
}

/// The first column (the job ids) of each line of `o`'s output.
fn first_columns(o: &Output) -> Vec<String> {
    text(o)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// scancel `id`: it leaves the queue and is listed among the cancelled (`-t CA`) and in
/// `-t all` next to `second`; then `second` is cancelled by name and user.
fn scancel_by_id_and_by_filter(d: &Path, addr: &str, id: u64, second: u64) {
    let o = run(d, addr, "scancel", &[&id.to_string()], None);
    assert!(o.status.success(), "{o:?}");
    let o = run(d, addr, "squeue", &["-h", "-t", "CA"], None);
    assert_eq!(first_columns(&o), vec![id.to_string()], "{}", text(&o));
    let o = run(d, addr, "squeue", &["-h", "-t", "all"], None);
    let every = first_columns(&o);
    assert!(
        every.contains(&id.to_string()) && every.contains(&second.to_string()),
        "{}",
        text(&o)
    );
    let o = run(d, addr, "squeue", &["-h"], None);
    assert!(!first_columns(&o).contains(&id.to_string()), "{}", text(&o));
    // ... and by filter.
    let o = run(d, addr, "scancel", &["-n", "second", "-u", "root"], None);
    assert!(o.status.success(), "{o:?}");
}

/// A bad --time and an unknown job: a non-zero exit and one line on stderr naming what is
/// wrong.
fn errors_are_one_line_and_a_failure(d: &Path, addr: &str) {
    let o = run(d, addr, "sbatch", &["-t", "5 days", "job.sh"], None);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("sbatch: error:") && err.contains("--time"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let o = run(d, addr, "scancel", &["999999"], None);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("999999"));
}

/// Each listing command, its stdout a pipe whose reader has already closed it (as
/// `squeue | head -1` does once it has its line): no panic, no backtrace, nothing on stderr,
/// and the status a shell shows for death by SIGPIPE.
fn a_reader_that_goes_away_ends_the_command_quietly(d: &Path, addr: &str) {
    for (name, args) in [
        ("squeue", &[][..]),
        ("sinfo", &[][..]),
        ("sacct", &["-a"][..]),
    ] {
        ended_quietly_for_a_reader_gone(d, addr, &d.join(name), args);
    }
}

/// Runs `program args` with its stdout a pipe whose reader is gone before the command
/// prints its first line: it must end as a command killed by SIGPIPE (141), saying nothing.
fn ended_quietly_for_a_reader_gone(d: &Path, addr: &str, program: &Path, args: &[&str]) {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(d)
        .env("DOCKET_ADDR", addr)
        .envs(auth_env(d))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let what = program.display();
    assert_eq!(o.status.code(), Some(141), "{what}: {:?} {err}", o.status);
    assert!(err.is_empty(), "{what} said on stderr: {err}");
}

/// sinfo folds the partition's nodes into `n[01-02]`; `sinfo -N` has a line per node.
fn sinfo_folds_nodes_and_lists_them(d: &Path, addr: &str) {
    let o = run(d, addr, "sinfo", &[], None);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o);
    assert!(out.starts_with("PARTITION"), "{out}");
    assert!(out.contains("n[01-02]"), "{out}");
    let o = run(d, addr, "sinfo", &["-N", "-h"], None);
    assert_eq!(text(&o).lines().count(), 2, "{}", text(&o));
}

/// scontrol ping names one primary and three replicas up; a held job's limit and name are
/// updated (and shown so), then it is released.
fn scontrol_pings_shows_updates_and_releases(d: &Path, addr: &str) {
    let o = run(d, addr, "scontrol", &["ping"], None);
    let out = text(&o);
    assert_eq!(out.matches("Slurmctld(primary) at ").count(), 1, "{out}");
    assert_eq!(out.matches("is UP").count(), 3, "{out}");
    let o = run(
        d,
        addr,
        "sbatch",
        &["--parsable", "-t", "30", "job.sh"],
        None,
    );
    let third = text(&o).trim().to_owned();
    let o = run(
        d,
        addr,
        "scontrol",
        &[
            "update",
            &format!("job={third}"),
            "TimeLimit=20",
            "Name=renamed",
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    let o = run(d, addr, "scontrol", &["show", "job", &third], None);
    let out = text(&o);
    assert!(
        out.contains("JobName=renamed") && out.contains("TimeLimit=20:00"),
        "{out}"
    );
    let o = run(d, addr, "scontrol", &["release", &third], None);
    assert!(o.status.success(), "{o:?}");
}

/// `sacct -P -j id`: Slurm's default columns, and the cancelled job with exit code 0:0.
fn sacct_shows_the_cancelled_job(d: &Path, addr: &str, id: u64) {
    let o = run(d, addr, "sacct", &["-P", "-j", &id.to_string()], None);
    let out = text(&o);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode")
    );
    assert_eq!(
        lines.next(),
        Some(format!("{id}|hello|batch|ops|0|CANCELLED|0:0").as_str())
    );
}

/// qsub of a held script with #PBS directives; qstat lists it held; qdel ends it and
/// `qstat -x` shows it finished.
fn pbs_submits_lists_and_deletes(d: &Path, addr: &str) {
    let pbs_script = "#PBS -N pbsjob -h\n#PBS -l select=1:ncpus=2,walltime=00:10:00\necho hi\n";
    std::fs::write(d.join("pbs.sh"), pbs_script).unwrap();
    let o = run(d, addr, "qsub", &["pbs.sh"], None);
    assert!(o.status.success(), "{o:?}");
    let pbs_id = text(&o).trim().to_owned();
    assert!(pbs_id.ends_with(".docket"), "{pbs_id}");
    let o = run(d, addr, "qstat", &[], None);
    let out = text(&o);
    let row = out
        .lines()
        .find(|l| l.starts_with(&pbs_id))
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[1..], ["pbsjob", "root", "0", "H", "batch"], "{row}");
    let o = run(d, addr, "qdel", &[&pbs_id], None);
    assert!(o.status.success(), "{o:?}");
    let o = run(d, addr, "qstat", &["-x", &pbs_id], None);
    assert!(
        text(&o)
            .lines()
            .any(|l| l.starts_with(&pbs_id) && l.contains(" F ")),
        "{}",
        text(&o)
    );
}

/// sprio lists a newly submitted pending job with its priority and factor columns.
fn sprio_shows_the_factors(d: &Path, addr: &str) {
    let o = run(d, addr, "sbatch", &["--parsable", "job.sh"], None);
    let fourth = text(&o).trim().to_owned();
    let o = run(d, addr, "sprio", &[], None);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o);
    let head: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&head[..3], ["JOBID", "PARTITION", "PRIORITY"], "{out}");
    assert!(head.len() > 3, "no factor columns: {out}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().next() == Some(fourth.as_str())),
        "{out}"
    );
}

/// `docket cluster status` lists the three replicas, one leader and two followers (asked
/// again for a few seconds: on two busy cores a replica may be between terms when first
/// asked).
fn cluster_status_shows_every_replica(d: &Path, addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let o = Command::new(env!("CARGO_BIN_EXE_docket"))
            .args(["cluster", "status"])
            .env("DOCKET_ADDR", addr)
            .envs(auth_env(d))
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let out = text(&o);
        let settled =
            out.matches(" leader ").count() == 1 && out.matches(" follower ").count() == 2;
        if settled || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(out.starts_with("ID"), "{out}");
    assert_eq!(out.lines().count(), 4, "{out}");
    assert_eq!(out.matches(" leader ").count(), 1, "{out}");
    assert_eq!(out.matches(" follower ").count(), 2, "{out}");
}

/// `docket install-aliases d/bin` links every command name there.
fn install_aliases_makes_the_links(d: &Path) {
    let links = d.join("bin");
    let o = Command::new(env!("CARGO_BIN_EXE_docket"))
        .arg("install-aliases")
        .arg(&links)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    for name in [
        "sbatch", "squeue", "scancel", "sinfo", "scontrol", "sacct", "qsub", "qdel",
    ] {
        assert!(
            std::fs::symlink_metadata(links.join(name))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
}

/// Two partitions over the same nodes, so the order of consideration can change with a
/// partition's tier.
const TWO_PARTITIONS: &str = r#"
[[nodes]]
NodeName = "n[01-02]"
CPUs = 4
RealMemory = "8G"

[[partitions]]
PartitionName = "batch"
Nodes = "ALL"
Default = true
MaxTime = "1-00:00:00"

[[partitions]]
PartitionName = "high"
Nodes = "ALL"

[[accounts]]
Name = "ops"

[[users]]
Name = "root"
DefaultAccount = "ops"
"#;

/// Waits (up to [`DEADLINE`]) until a leader has applied the site: sshare lists ops with root.
fn wait_for_leader(dir: &Path, addr: &str) {
    let start = Instant::now();
    loop {
        // The site's configuration applied: account ops with its user root.
        let o = run(dir, addr, "sshare", &["-a", "-n"], None);
        if o.status.success()
            && text(&o)
                .lines()
                .any(|l| l.trim_start().starts_with("ops") && l.contains(" root "))
        {
            return;
        }
        assert!(start.elapsed() < DEADLINE, "{o:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The standard output of `o`, after checking that it succeeded.
fn ok(o: Output) -> String {
    assert!(o.status.success(), "{o:?}");
    text(&o)
}

#[test]
fn admins_look_and_act_in_slurm_and_pbs_words() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test site defines only the user root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_procs, addr) = start_cluster(d, TWO_PARTITIONS);
    wait_for_leader(d, &addr);

    // sshare: the tree with the account and its user.
    sshare_shows_the_tree(d, &addr);
    // scontrol show: nodes, partitions and config as Key=Value; -o one line each.
    scontrol_shows_nodes_partitions_and_config(d, &addr);
    // Drain with a reason, see it in sinfo -R and pbsnodes, resume.
    drain_with_a_reason_and_resume(d, &addr);
    // `docket node drain n[01-02] | head -1`: the reader going away stops the printing only.
    a_reader_that_goes_away_does_not_stop_a_drain(d, &addr);
    // Reservations: create, show, delete.
    reservations_are_created_shown_and_deleted(d, &addr);

    // A job takes every cpu; two more wait, the older first.
    std::fs::write(d.join("job.sh"), "#!/bin/sh\nsleep 1000\n").unwrap();
    let big = submit_sleeper(d, &addr, &["-N", "2", "-n", "8", "-J", "big"]);
    let older = submit_sleeper(d, &addr, &["-J", "older"]);
    let newer = submit_sleeper(d, &addr, &["-J", "newer", "-p", "high"]);
    wait_until_running(d, &addr, &big);

    // squeue -o and -O.
    squeue_formats_chosen_columns(d, &addr, &big, &newer);
    // A dry run of raising `high`'s tier shows the new order and changes nothing.
    a_dry_run_shows_the_new_order_and_changes_nothing(d, &addr, &older, &newer);
    // sinfo -l and pbsnodes see the busy nodes; no agent runs here, so they do not respond.
    let out = ok(run(d, &addr, "sinfo", &["-l", "-p", "batch"], None));
    assert!(out.contains("allocated*"), "{out}");
    let out = ok(run(d, &addr, "pbsnodes", &["-a"], None));
    assert!(out.contains("state = job-busy,state-unknown"), "{out}");
    // scontrol suspend and resume (root is the operator here).
    ok(run(d, &addr, "scontrol", &["suspend", &big], None));
    assert_eq!(state_code(d, &addr, &big), "S");
    ok(run(d, &addr, "scontrol", &["resume", &big], None));
    assert_eq!(state_code(d, &addr, &big), "R");

    // sbatch -W waits for its job and exits with its outcome (cancelled: 1).
    let waited = sbatch_wait_exits_with_the_outcome(d, &addr);
    // sacct: chosen fields over a window.
    let out = ok(run(
        d,
        &addr,
        "sacct",
        &[
            "-P",
            "-n",
            "-S",
            "now-1hours",
            "-o",
            "JobID,JobName,State",
            "-j",
            &waited,
        ],
        None,
    ));
    assert_eq!(out, format!("{waited}|job.sh|CANCELLED\n"));

    // Exit statuses: refused 1, usage 2, no controller 3.
    exit_statuses_say_what_went_wrong(d, &addr);
    // A first endpoint that never answers is passed over, by reads and writes.
    a_silent_endpoint_is_passed_over(d, &addr);
}

/// sshare -a -l: the long header, and the account ops with its user root.
fn sshare_shows_the_tree(d: &Path, addr: &str) {
    let out = ok(run(d, addr, "sshare", &["-a", "-l"], None));
    assert!(out.starts_with("Account "), "{out}");
    assert!(out.contains("LevelFS"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("ops") && l.contains(" root ")),
        "{out}"
    );
}

/// scontrol show node, partition (-o: one line each), config, and node in JSON.
fn scontrol_shows_nodes_partitions_and_config(d: &Path, addr: &str) {
    let out = ok(run(d, addr, "scontrol", &["show", "node", "n01"], None));
    assert!(
        out.starts_with("NodeName=n01\n   CPUAlloc=0 CPUTot=4"),
        "{out}"
    );
    let out = ok(run(d, addr, "scontrol", &["-o", "show", "partition"], None));
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains("PartitionName=batch ") && out.contains("Default=YES"),
        "{out}"
    );
    assert!(out.contains("MaxTime=1-00:00:00"), "{out}");
    let out = ok(run(d, addr, "scontrol", &["show", "config"], None));
    assert!(out.starts_with("Configuration data as of"), "{out}");
    let out = ok(run(d, addr, "scontrol", &["--json", "show", "node"], None));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2);
}

/// A drain without a reason is a usage error; with one, sinfo -R and pbsnodes show it; a
/// resume clears it.
fn drain_with_a_reason_and_resume(d: &Path, addr: &str) {
    let o = run(
        d,
        addr,
        "scontrol",
        &["update", "NodeName=n02", "State=DRAIN"],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "a drain needs a reason: {o:?}");
    ok(run(
        d,
        addr,
        "scontrol",
        &["update", "NodeName=n02", "State=DRAIN", "Reason=new dimm"],
        None,
    ));
    let out = ok(run(d, addr, "sinfo", &["-R", "-h"], None));
    assert!(out.starts_with("new dimm") && out.contains("n02"), "{out}");
    let out = ok(run(d, addr, "pbsnodes", &["-a", "n02"], None));
    assert!(out.contains("     state = offline"), "{out}");
    assert!(out.contains("     comment = new dimm"), "{out}");
    ok(run(
        d,
        addr,
        "scontrol",
        &["update", "NodeName=n02", "State=RESUME"],
        None,
    ));
    let out = ok(run(d, addr, "sinfo", &["-R", "-h"], None));
    assert!(out.is_empty(), "{out}");
}

/// `docket node drain` with its stdout a pipe already closed drains every node it names,
/// then ends as a command killed by SIGPIPE would (141), quietly; `docket node resume`
/// returns them.
fn a_reader_that_goes_away_does_not_stop_a_drain(d: &Path, addr: &str) {
    let docket = Path::new(env!("CARGO_BIN_EXE_docket"));
    let drain = ["node", "drain", "n[01-02]", "--reason", "rack power"];
    ended_quietly_for_a_reader_gone(d, addr, docket, &drain);
    let out = ok(run(d, addr, "sinfo", &["-R", "-h"], None));
    assert!(
        out.starts_with("rack power") && out.contains("n[01-02]"),
        "both nodes drained: {out}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["node", "resume", "n[01-02]"])
        .current_dir(d)
        .env("DOCKET_ADDR", addr)
        .envs(auth_env(d))
        .output()
        .unwrap();
    assert_eq!(text(&o), "n01: resumed\nn02: resumed\n", "{o:?}");
    let out = ok(run(d, addr, "sinfo", &["-R", "-h"], None));
    assert!(out.is_empty(), "{out}");
}

/// A reservation created with scontrol is shown with its nodes, duration and state, and is
/// gone once deleted.
fn reservations_are_created_shown_and_deleted(d: &Path, addr: &str) {
    ok(run(
        d,
        addr,
        "scontrol",
        &[
            "create",
            "reservation",
            "ReservationName=maint",
            "Nodes=n01",
            "StartTime=now+2hours",
            "Duration=60",
            "Users=root",
        ],
        None,
    ));
    let out = ok(run(
        d,
        addr,
        "scontrol",
        &["show", "reservation", "maint"],
        None,
    ));
    assert!(out.contains("Nodes=n01 NodeCnt=1"), "{out}");
    assert!(
        out.contains("Duration=1:00:00") && out.contains("State=INACTIVE"),
        "{out}"
    );
    ok(run(
        d,
        addr,
        "scontrol",
        &["delete", "ReservationName=maint"],
        None,
    ));
    let out = ok(run(d, addr, "scontrol", &["show", "reservation"], None));
    assert_eq!(out.trim(), "No reservations in the system");
}

/// `sbatch --parsable -t 10 --mem-per-cpu=100M args job.sh`; the job's id.
fn submit_sleeper(d: &Path, addr: &str, args: &[&str]) -> String {
    let mut all = vec!["--parsable", "-t", "10", "--mem-per-cpu=100M"];
    all.extend_from_slice(args);
    all.push("job.sh");
    ok(run(d, addr, "sbatch", &all, None)).trim().to_owned()
}

/// Waits (up to [`DEADLINE`]) until `job` runs.
fn wait_until_running(d: &Path, addr: &str, job: &str) {
    let start = Instant::now();
    loop {
        let out = ok(run(
            d,
            addr,
            "squeue",
            &["-h", "-o", "%i %T", "-j", job],
            None,
        ));
        if out.trim() == format!("{job} RUNNING") {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{out}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `job`'s compact state code (`squeue -o %t`).
fn state_code(d: &Path, addr: &str, job: &str) -> String {
    let out = ok(run(d, addr, "squeue", &["-h", "-o", "%t", "-j", job], None));
    out.trim().to_owned()
}

/// squeue -o with a header and -O with widths and alignment, on the running `big` and the
/// pending `newer`.
fn squeue_formats_chosen_columns(d: &Path, addr: &str, big: &str, newer: &str) {
    let out = ok(run(
        d,
        addr,
        "squeue",
        &["-o", "%i|%j|%t|%C", "-j", big],
        None,
    ));
    assert_eq!(out, format!("JOBID|NAME|ST|CPUS\n{big}|big|R|8\n"));
    let out = ok(run(
        d,
        addr,
        "squeue",
        &["-h", "-O", "JobID:8,Name:.8,Partition", "-j", newer],
        None,
    ));
    assert_eq!(out, format!("{newer:<8}    newer high\n"));
}

/// `docket config apply --dry-run` of `high` with a higher tier: `newer` would go first and
/// `older` second, and the partition keeps its tier.
fn a_dry_run_shows_the_new_order_and_changes_nothing(
    d: &Path,
    addr: &str,
    older: &str,
    newer: &str,
) {
    let raised = TWO_PARTITIONS.replace(
        "PartitionName = \"high\"\n",
        "PartitionName = \"high\"\nPriorityTier = 10\n",
    );
    std::fs::write(d.join("raised.toml"), raised).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["config", "apply", "--dry-run", "raised.toml"])
        .current_dir(d)
        .env("DOCKET_ADDR", addr)
        .envs(auth_env(d))
        .output()
        .unwrap();
    let out = ok(o);
    assert!(out.contains("  would    upsert partition high"), "{out}");
    assert!(out.contains(&format!("job {newer}: 2 -> 1")), "{out}");
    assert!(out.contains(&format!("job {older}: 1 -> 2")), "{out}");
    assert!(out.ends_with("dry run: nothing was changed\n"), "{out}");
    let out = ok(run(
        d,
        addr,
        "scontrol",
        &["show", "partition", "high"],
        None,
    ));
    assert!(out.contains("PriorityTier=1 "), "{out}");
}

/// `sbatch -W` prints its job's id, keeps waiting while it is queued, and exits 1 once the
/// job is cancelled; the job's id.
fn sbatch_wait_exits_with_the_outcome(d: &Path, addr: &str) -> String {
    let mut waiting = Command::new(d.join("sbatch"))
        .args(["-W", "--parsable", "-t", "5", "job.sh"])
        .current_dir(d)
        .env("DOCKET_ADDR", addr)
        .envs(auth_env(d))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(waiting.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let waited = first.trim().to_owned();
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "sbatch -W returned early"
    );
    ok(run(d, addr, "scancel", &[&waited], None));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = waiting.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < DEADLINE, "sbatch -W did not return");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(1));
    waited
}

/// Refused: exit 1; a usage error: 2; no controller answering: 3, saying so.
fn exit_statuses_say_what_went_wrong(d: &Path, addr: &str) {
    let o = run(d, addr, "scancel", &["999999"], None);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let o = run(d, addr, "scontrol", &["frobnicate"], None);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = Command::new(d.join("squeue"))
        .env("DOCKET_ADDR", free_addr())
        .envs(auth_env(d))
        .env("DOCKET_RETRY_SECONDS", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no controller answered"), "{err}");
}

/// A first endpoint that accepts connections but never answers (a stopped replica: the
/// kernel completes the handshake) is passed over by a read, which the next one answers, and
/// by a write, which finds the leader.
fn a_silent_endpoint_is_passed_over(d: &Path, addr: &str) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let through_silent = format!("{},{addr}", silent.local_addr().unwrap());
    let o = Command::new(d.join("squeue"))
        .args(["-h", "-o", "%i"])
        .env("DOCKET_ADDR", &through_silent)
        .envs(auth_env(d))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // A write finds the leader through the replicas that answer and goes straight to it.
    let o = run(
        d,
        &through_silent,
        "sbatch",
        &["--parsable", "-J", "past-silent", "-t", "1"],
        Some("#!/bin/sh\ntrue\n"),
    );
    assert!(o.status.success(), "{o:?}");
    assert!(text(&o).trim().parse::<u64>().is_ok(), "{o:?}");
    drop(silent);
}
