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
    let (_procs, addr) = start_cluster(dir.path(), SITE);

    // sbatch: directives, command line over directives, --parsable; retried through the
    // first election without the user noticing.
    let script = "#!/bin/sh\n#SBATCH -J hello\n#SBATCH --hold\n#SBATCH -t 10\necho hi\n";
    std::fs::write(dir.path().join("job.sh"), script).unwrap();
    let start = Instant::now();
    let id: u64 = loop {
        let o = run(dir.path(), &addr, "sbatch", &["--parsable", "job.sh"], None);
        if o.status.success() {
            break text(&o).trim().parse().unwrap();
        }
        // Before the first leader has applied the site, the user is unknown: wait.
        assert!(
            start.elapsed() < DEADLINE,
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let o = run(
        dir.path(),
        &addr,
        "sbatch",
        &["-J", "second", "--comment", "sweep 3 of 12"],
        Some(script),
    );
    assert!(o.status.success(), "{o:?}");
    let second: u64 = text(&o)
        .trim()
        .strip_prefix("Submitted batch job ")
        .expect("Slurm's words")
        .parse()
        .unwrap();

    // squeue: Slurm's columns, pending with the hold reason.
    let o = run(dir.path(), &addr, "squeue", &[], None);
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
        dir.path(),
        &addr,
        "squeue",
        &["--json", "-j", &second.to_string()],
        None,
    );
    let v: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    assert_eq!(v["jobs"][0]["name"], "second");
    assert_eq!(v["jobs"][0]["comment"], "sweep 3 of 12");

    // The comment: squeue's %k (and "(null)" without one), scontrol show and update, sacct.
    let o = run(dir.path(), &addr, "squeue", &["-h", "-o", "%i|%k"], None);
    let out = text(&o);
    assert!(out.contains(&format!("{second}|sweep 3 of 12")), "{out}");
    assert!(out.contains(&format!("{id}|(null)")), "{out}");
    let o = run(
        dir.path(),
        &addr,
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
        dir.path(),
        &addr,
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
        dir.path(),
        &addr,
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

    // scancel: by id; then it is gone from the queue and shown among the cancelled.
    let o = run(dir.path(), &addr, "scancel", &[&id.to_string()], None);
    assert!(o.status.success(), "{o:?}");
    let first_columns = |o: &Output| -> Vec<String> {
        text(o)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(String::from))
            .collect()
    };
    let o = run(dir.path(), &addr, "squeue", &["-h", "-t", "CA"], None);
    assert_eq!(first_columns(&o), vec![id.to_string()], "{}", text(&o));
    let o = run(dir.path(), &addr, "squeue", &["-h", "-t", "all"], None);
    let every = first_columns(&o);
    assert!(
        every.contains(&id.to_string()) && every.contains(&second.to_string()),
        "{}",
        text(&o)
    );
    let o = run(dir.path(), &addr, "squeue", &["-h"], None);
    assert!(!first_columns(&o).contains(&id.to_string()), "{}", text(&o));
    // ... and by filter.
    let o = run(
        dir.path(),
        &addr,
        "scancel",
        &["-n", "second", "-u", "root"],
        None,
    );
    assert!(o.status.success(), "{o:?}");

    // Errors: one line on stderr saying what is wrong; a non-zero exit.
    let o = run(
        dir.path(),
        &addr,
        "sbatch",
        &["-t", "5 days", "job.sh"],
        None,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("sbatch: error:") && err.contains("--time"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let o = run(dir.path(), &addr, "scancel", &["999999"], None);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("999999"));

    // sinfo: partitions with their nodes folded; -N one line per node.
    let o = run(dir.path(), &addr, "sinfo", &[], None);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o);
    assert!(out.starts_with("PARTITION"), "{out}");
    assert!(out.contains("n[01-02]"), "{out}");
    let o = run(dir.path(), &addr, "sinfo", &["-N", "-h"], None);
    assert_eq!(text(&o).lines().count(), 2, "{}", text(&o));

    // scontrol: ping in Slurm's words, show job, update, hold/release.
    let o = run(dir.path(), &addr, "scontrol", &["ping"], None);
    let out = text(&o);
    assert_eq!(out.matches("Slurmctld(primary) at ").count(), 1, "{out}");
    assert_eq!(out.matches("is UP").count(), 3, "{out}");
    let o = run(
        dir.path(),
        &addr,
        "sbatch",
        &["--parsable", "-t", "30", "job.sh"],
        None,
    );
    let third = text(&o).trim().to_owned();
    let o = run(
        dir.path(),
        &addr,
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
    let o = run(
        dir.path(),
        &addr,
        "scontrol",
        &["show", "job", &third],
        None,
    );
    let out = text(&o);
    assert!(
        out.contains("JobName=renamed") && out.contains("TimeLimit=20:00"),
        "{out}"
    );
    let o = run(dir.path(), &addr, "scontrol", &["release", &third], None);
    assert!(o.status.success(), "{o:?}");

    // sacct: Slurm's default columns, code:signal, -P.
    let o = run(
        dir.path(),
        &addr,
        "sacct",
        &["-P", "-j", &id.to_string()],
        None,
    );
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

    // PBS: qsub with #PBS directives and -l, qstat, qdel.
    let pbs_script = "#PBS -N pbsjob -h\n#PBS -l select=1:ncpus=2,walltime=00:10:00\necho hi\n";
    std::fs::write(dir.path().join("pbs.sh"), pbs_script).unwrap();
    let o = run(dir.path(), &addr, "qsub", &["pbs.sh"], None);
    assert!(o.status.success(), "{o:?}");
    let pbs_id = text(&o).trim().to_owned();
    assert!(pbs_id.ends_with(".docket"), "{pbs_id}");
    let o = run(dir.path(), &addr, "qstat", &[], None);
    let out = text(&o);
    let row = out
        .lines()
        .find(|l| l.starts_with(&pbs_id))
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[1..], ["pbsjob", "root", "0", "H", "batch"], "{row}");
    let o = run(dir.path(), &addr, "qdel", &[&pbs_id], None);
    assert!(o.status.success(), "{o:?}");
    let o = run(dir.path(), &addr, "qstat", &["-x", &pbs_id], None);
    assert!(
        text(&o)
            .lines()
            .any(|l| l.starts_with(&pbs_id) && l.contains(" F ")),
        "{}",
        text(&o)
    );

    // sprio: the pending jobs' priority, factor by factor.
    let o = run(dir.path(), &addr, "sbatch", &["--parsable", "job.sh"], None);
    let fourth = text(&o).trim().to_owned();
    let o = run(dir.path(), &addr, "sprio", &[], None);
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

    // docket cluster status: every replica, one leader (asked again for a few seconds: on
    // two busy cores a replica may be between terms when first asked).
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let o = Command::new(env!("CARGO_BIN_EXE_docket"))
            .args(["cluster", "status"])
            .env("DOCKET_ADDR", &addr)
            .envs(auth_env(dir.path()))
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

    // install-aliases makes the links.
    let links = dir.path().join("bin");
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
    let out = ok(run(d, &addr, "sshare", &["-a", "-l"], None));
    assert!(out.starts_with("Account "), "{out}");
    assert!(out.contains("LevelFS"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("ops") && l.contains(" root ")),
        "{out}"
    );

    // scontrol show: nodes, partitions and config as Key=Value; -o one line each.
    let out = ok(run(d, &addr, "scontrol", &["show", "node", "n01"], None));
    assert!(
        out.starts_with("NodeName=n01\n   CPUAlloc=0 CPUTot=4"),
        "{out}"
    );
    let out = ok(run(
        d,
        &addr,
        "scontrol",
        &["-o", "show", "partition"],
        None,
    ));
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains("PartitionName=batch ") && out.contains("Default=YES"),
        "{out}"
    );
    assert!(out.contains("MaxTime=1-00:00:00"), "{out}");
    let out = ok(run(d, &addr, "scontrol", &["show", "config"], None));
    assert!(out.starts_with("Configuration data as of"), "{out}");
    let out = ok(run(d, &addr, "scontrol", &["--json", "show", "node"], None));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2);

    // Drain with a reason, see it in sinfo -R and pbsnodes, resume.
    let o = run(
        d,
        &addr,
        "scontrol",
        &["update", "NodeName=n02", "State=DRAIN"],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "a drain needs a reason: {o:?}");
    ok(run(
        d,
        &addr,
        "scontrol",
        &["update", "NodeName=n02", "State=DRAIN", "Reason=new dimm"],
        None,
    ));
    let out = ok(run(d, &addr, "sinfo", &["-R", "-h"], None));
    assert!(out.starts_with("new dimm") && out.contains("n02"), "{out}");
    let out = ok(run(d, &addr, "pbsnodes", &["-a", "n02"], None));
    assert!(out.contains("     state = offline"), "{out}");
    assert!(out.contains("     comment = new dimm"), "{out}");
    ok(run(
        d,
        &addr,
        "scontrol",
        &["update", "NodeName=n02", "State=RESUME"],
        None,
    ));
    let out = ok(run(d, &addr, "sinfo", &["-R", "-h"], None));
    assert!(out.is_empty(), "{out}");

    // Reservations: create, show, delete.
    ok(run(
        d,
        &addr,
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
        &addr,
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
        &addr,
        "scontrol",
        &["delete", "ReservationName=maint"],
        None,
    ));
    let out = ok(run(d, &addr, "scontrol", &["show", "reservation"], None));
    assert_eq!(out.trim(), "No reservations in the system");

    // A job takes every cpu; two more wait, the older first.
    let job = "#!/bin/sh\nsleep 1000\n";
    std::fs::write(d.join("job.sh"), job).unwrap();
    let submit = |args: &[&str]| -> String {
        let mut all = vec!["--parsable", "-t", "10", "--mem-per-cpu=100M"];
        all.extend_from_slice(args);
        all.push("job.sh");
        ok(run(d, &addr, "sbatch", &all, None)).trim().to_owned()
    };
    let big = submit(&["-N", "2", "-n", "8", "-J", "big"]);
    let older = submit(&["-J", "older"]);
    let newer = submit(&["-J", "newer", "-p", "high"]);
    let start = Instant::now();
    loop {
        let out = ok(run(
            d,
            &addr,
            "squeue",
            &["-h", "-o", "%i %T", "-j", &big],
            None,
        ));
        if out.trim() == format!("{big} RUNNING") {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{out}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // squeue -o and -O.
    let out = ok(run(
        d,
        &addr,
        "squeue",
        &["-o", "%i|%j|%t|%C", "-j", &big],
        None,
    ));
    assert_eq!(out, format!("JOBID|NAME|ST|CPUS\n{big}|big|R|8\n"));
    let out = ok(run(
        d,
        &addr,
        "squeue",
        &["-h", "-O", "JobID:8,Name:.8,Partition", "-j", &newer],
        None,
    ));
    assert_eq!(out, format!("{newer:<8}    newer high\n"));

    // A dry run of raising `high`'s tier shows the new order and changes nothing.
    let raised = TWO_PARTITIONS.replace(
        "PartitionName = \"high\"\n",
        "PartitionName = \"high\"\nPriorityTier = 10\n",
    );
    std::fs::write(d.join("raised.toml"), raised).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["config", "apply", "--dry-run", "raised.toml"])
        .current_dir(d)
        .env("DOCKET_ADDR", &addr)
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
        &addr,
        "scontrol",
        &["show", "partition", "high"],
        None,
    ));
    assert!(out.contains("PriorityTier=1 "), "{out}");

    // sinfo -l and pbsnodes see the busy nodes; no agent runs here, so they do not respond.
    let out = ok(run(d, &addr, "sinfo", &["-l", "-p", "batch"], None));
    assert!(out.contains("allocated*"), "{out}");
    let out = ok(run(d, &addr, "pbsnodes", &["-a"], None));
    assert!(out.contains("state = job-busy,state-unknown"), "{out}");

    // scontrol suspend and resume (root is the operator here).
    ok(run(d, &addr, "scontrol", &["suspend", &big], None));
    let out = ok(run(
        d,
        &addr,
        "squeue",
        &["-h", "-o", "%t", "-j", &big],
        None,
    ));
    assert_eq!(out.trim(), "S");
    ok(run(d, &addr, "scontrol", &["resume", &big], None));
    let out = ok(run(
        d,
        &addr,
        "squeue",
        &["-h", "-o", "%t", "-j", &big],
        None,
    ));
    assert_eq!(out.trim(), "R");

    // sbatch -W waits for its job and exits with its outcome (cancelled: 1).
    let mut waiting = Command::new(d.join("sbatch"))
        .args(["-W", "--parsable", "-t", "5", "job.sh"])
        .current_dir(d)
        .env("DOCKET_ADDR", &addr)
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
    ok(run(d, &addr, "scancel", &[&waited], None));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = waiting.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < DEADLINE, "sbatch -W did not return");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(1));

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
    let o = run(d, &addr, "scancel", &["999999"], None);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let o = run(d, &addr, "scontrol", &["frobnicate"], None);
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

    // A first endpoint that accepts connections but never answers (a stopped replica: the
    // kernel completes the handshake) is passed over by a read, which the next one answers.
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
