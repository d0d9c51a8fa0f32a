//! Confinement proved on a real agent (root, cgroups): a job opens only the GPUs it was given
//! (fake GPU device nodes with the NVIDIA driver's major number: with no driver loaded, an
//! allowed one fails with ENXIO, a denied one with EPERM from the cgroup); a suspended job
//! uses no cpu; a job over its vmem is stopped and reported; a job cannot fork past its pids
//! limit; stale job cgroups are reaped at start. Run on the host (cgroup v1 here) and in a
//! cgroup v2 guest (`scripts/test-cgroup-v2`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use docket_proto::v1 as pb;

/// The NVIDIA driver's character-device major.
const NVIDIA_MAJOR: u64 = 195;

/// `/dev/nvidia0`.. look-alikes under `dir` (0666, as the driver makes them).
fn fake_gpus(dir: &Path, n: u64) -> Vec<std::path::PathBuf> {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    (0..n)
        .map(|i| {
            let p = dir.join(format!("nvidia{i}"));
            mknod(
                &p,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(NVIDIA_MAJOR, i),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
            p
        })
        .collect()
}

fn gpu_launch(job: u64, work: &Path, dev: &Path, gpus: u32, hold_s: u32) -> pb::instruction::Kind {
    let script = format!(
        "#!/bin/sh
echo \"gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES rocr=$ROCR_VISIBLE_DEVICES\"
for d in 0 1; do
  echo \"nvidia$d: $(head -c1 {dev}/nvidia$d 2>&1 >/dev/null)\"
done
cg=$(grep :devices: /proc/self/cgroup | cut -d: -f3)
echo 'a *:* rwm' > /sys/fs/cgroup/devices$cg/devices.allow 2>/dev/null && echo ESCAPED
echo 'c 195:* rwm' > /sys/fs/cgroup/devices$cg/devices.allow 2>/dev/null && echo ESCAPED
sleep {hold_s}
",
        dev = dev.display()
    );
    let pb::instruction::Kind::Launch(mut l) = launch(job, 1, work, &script, 60) else {
        unreachable!()
    };
    l.user = "nobody".into();
    l.cpus = 1;
    l.gpus = gpus;
    pb::instruction::Kind::Launch(l)
}

/// The line of `out` starting with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_opens_only_the_gpus_it_was_given() {
    if !privileged("device nodes, cgroups and jobs as another user need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = user_dir(dir.path(), "work", &nobody());
    let dev = dir.path().join("dev");
    let gpus = fake_gpus(&dev, 2);
    let devices = gpus
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let node = "n21";
    let _agent = agent(
        node,
        &addr,
        &dir.path().join("state"),
        &[
            "--cpus",
            "2",
            "--memory-mib",
            "1024",
            "--gpus",
            "2",
            "--gpu-devices",
            &devices,
            "--kill-grace-s",
            "1",
        ],
    );

    // Two jobs of one GPU each, at once: the first gets GPU 0, the second GPU 1. Each opens
    // its own (ENXIO: no driver behind it) and not the other's (EPERM: the cgroup), and is
    // told its GPU as Slurm tells it (the runtime numbers the visible ones from 0).
    leader.send(gpu_launch(1, &work, &dev, 1, 3)).await;
    wait_for("job 1 started", || leader.started(1)).await;
    leader.send(gpu_launch(2, &work, &dev, 1, 0)).await;
    // And one without GPUs: it opens none.
    leader.send(gpu_launch(3, &work, &dev, 0, 0)).await;
    for job in [1, 2, 3] {
        let (_, end) = leader.ended(job).await;
        assert_eq!(cause(&end), "completed", "job {job}: {end:?}");
    }
    let out = |job: u64| std::fs::read_to_string(work.join(format!("slurm-{job}.out"))).unwrap();
    let (one, two, three) = (out(1), out(2), out(3));
    eprintln!("job 1:\n{one}job 2:\n{two}job 3:\n{three}");
    const ENXIO: &str = "No such device or address";
    const EPERM: &str = "Operation not permitted";
    assert_eq!(line(&one, "gpus="), "gpus=0 cuda=0 rocr=0");
    assert!(line(&one, "nvidia0:").contains(ENXIO), "{one}");
    assert!(line(&one, "nvidia1:").contains(EPERM), "{one}");
    assert_eq!(line(&two, "gpus="), "gpus=1 cuda=0 rocr=0");
    assert!(line(&two, "nvidia0:").contains(EPERM), "{two}");
    assert!(line(&two, "nvidia1:").contains(ENXIO), "{two}");
    assert_eq!(line(&three, "gpus="), "gpus= cuda= rocr=");
    assert!(line(&three, "nvidia0:").contains(EPERM), "{three}");
    assert!(line(&three, "nvidia1:").contains(EPERM), "{three}");
    for text in [&one, &two, &three] {
        assert!(
            !text.contains("ESCAPED"),
            "a job lifted its device rules: {text}"
        );
    }
    // The agent itself (root, outside the jobs' cgroups) still reaches both.
    for p in &gpus {
        let e = std::fs::File::open(p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ENXIO), "{}", p.display());
    }
    server.abort();
    drop(_agent);
    remove_agent_cgroups(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_job_uses_no_cpu() {
    if !privileged("the cgroup freezer needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let node = "n22";
    let _agent = agent(
        node,
        &addr,
        &dir.path().join("state"),
        &["--cpus", "1", "--memory-mib", "512", "--kill-grace-s", "1"],
    );
    let mut l = launch(1, 1, &work, "#!/bin/sh\nwhile :; do :; done\n", 60);
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.cpus = 1;
    }
    leader.send(l).await;
    wait_for("the job started", || leader.started(1)).await;
    let usage = || job_cpu_usage_us(node, 1, 1).expect("the job's cpu usage");
    let over_a_second = || async {
        let before = usage();
        tokio::time::sleep(Duration::from_secs(1)).await;
        usage() - before
    };
    let running = over_a_second().await;

    leader
        .send(pb::instruction::Kind::Suspend(control(1, 1)))
        .await;
    wait_for("the job frozen", || job_frozen(node, 1, 1)).await;
    let suspended = over_a_second().await;

    leader
        .send(pb::instruction::Kind::Resume(control(1, 1)))
        .await;
    wait_for("the job thawed", || !job_frozen(node, 1, 1)).await;
    let resumed = over_a_second().await;
    eprintln!(
        "cpu used over one second: running {running} µs, suspended {suspended} µs, resumed \
         {resumed} µs"
    );
    // Running and resumed it gets what the shared machine spares; frozen, nothing at all.
    assert!(running > 50_000, "the busy job barely ran: {running} µs");
    assert_eq!(suspended, 0, "a suspended job used {suspended} µs of cpu");
    assert!(resumed > 50_000, "the resumed job barely ran: {resumed} µs");

    leader
        .send(pb::instruction::Kind::Kill(control(1, 1)))
        .await;
    let (_, end) = leader.ended(1).await;
    assert_eq!(cause(&end), "cancelled", "{end:?}");
    assert!(end.cpu_time_ms >= 100, "{end:?}");
    server.abort();
    drop(_agent);
    remove_agent_cgroups(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_vmem_is_stopped_and_reported() {
    if !privileged("memory cgroups need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let node = "n23";
    let _agent = agent(
        node,
        &addr,
        &dir.path().join("state"),
        &["--cpus", "2", "--memory-mib", "2048", "--kill-grace-s", "1"],
    );
    let with = |job, script: &str, vmem_mib, address_space_limit| {
        let mut l = launch(job, 1, &work, script, 60);
        if let pb::instruction::Kind::Launch(x) = &mut l {
            x.cpus = 1;
            x.memory_mib = 1024;
            x.vmem_mib = Some(vmem_mib);
            x.address_space_limit = address_space_limit;
        }
        l
    };
    // qsub -l vmem=96mb (the job's memory and swap together): the limit is in the job's
    // cgroup, memory and memory-plus-swap both.
    leader
        .send(with(
            1,
            "#!/bin/sh\nsleep 1\ndd if=/dev/zero of=/dev/null bs=300M count=1\n",
            96,
            false,
        ))
        .await;
    wait_for("the job started", || leader.started(1)).await;
    let memory = job_cgroup(node, "memory", 1, 1);
    let read = |f: &str| {
        std::fs::read_to_string(memory.join(f))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let limit = 96u64 << 20;
    if memory.join("memory.limit_in_bytes").exists() {
        assert_eq!(read("memory.limit_in_bytes"), limit.to_string());
        if memory.join("memory.memsw.limit_in_bytes").exists() {
            assert_eq!(read("memory.memsw.limit_in_bytes"), limit.to_string());
        }
    } else {
        assert_eq!(read("memory.max"), limit.to_string());
        assert_eq!(read("memory.swap.max"), "0");
    }
    let (_, end) = leader.ended(1).await;
    assert_eq!(cause(&end), "out_of_memory", "{end:?}");

    // Within its vmem it runs to completion.
    leader
        .send(with(
            2,
            "#!/bin/sh\ndd if=/dev/zero of=/dev/null bs=32M count=1\n",
            96,
            false,
        ))
        .await;
    let (_, end) = leader.ended(2).await;
    assert_eq!(cause(&end), "completed", "{end:?}");

    // With the address-space limit as well, each process's allocation beyond vmem fails
    // outright (ENOMEM, before the cgroup is reached) and the job reports its failure.
    leader
        .send(with(
            3,
            "#!/bin/sh\ndd if=/dev/zero of=/dev/null bs=300M count=1 || exit 7\n",
            96,
            true,
        ))
        .await;
    let (_, end) = leader.ended(3).await;
    assert_eq!((cause(&end), end.exit_code), ("failed", 7), "{end:?}");
    let out = std::fs::read_to_string(work.join("slurm-3.out")).unwrap();
    assert!(out.contains("memory exhausted"), "{out}");
    server.abort();
    drop(_agent);
    remove_agent_cgroups(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cannot_fork_past_its_pids_limit() {
    if !privileged("the pids controller needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let node = "n24";
    let _agent = agent(
        node,
        &addr,
        &dir.path().join("state"),
        &[
            "--cpus",
            "1",
            "--memory-mib",
            "512",
            "--job-pids-max",
            "16",
            "--kill-grace-s",
            "1",
        ],
    );
    let mut l = launch(
        1,
        1,
        &work,
        // The pause lets the test read the limit: a shell whose fork fails may exit at once,
        // and the job's cgroup goes with it.
        "#!/bin/sh\nsleep 2\nfor i in $(seq 40); do sleep 2 & done\nwait\necho done\n",
        60,
    );
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.cpus = 1;
    }
    leader.send(l).await;
    wait_for("the job started", || leader.started(1)).await;
    let pids = job_cgroup(node, "pids", 1, 1);
    let limit = std::fs::read_to_string(pids.join("pids.max")).unwrap_or_default();
    assert_eq!(limit.trim(), "16");
    let (_, end) = leader.ended(1).await;
    let out = std::fs::read_to_string(work.join("slurm-1.out")).unwrap();
    assert!(
        out.contains("fork"),
        "40 forks within a limit of 16: {out} {end:?}"
    );
    server.abort();
    drop(_agent);
    remove_agent_cgroups(node);
}

/// An agent killed mid-job leaves its job's cgroup behind; the next one kills what is in it
/// and removes it before it takes any job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_job_cgroups_are_reaped_at_start() {
    if !privileged("cgroups need root") {
        return;
    }
    let node = "n25";
    // Made as a dead agent would have left it (v2: under its service cgroup; v1: in the
    // freezer and memory hierarchies).
    let controllers: &[&str] = if cgroup_v2() {
        &["unified"]
    } else {
        &["freezer", "memory"]
    };
    let stale: Vec<std::path::PathBuf> = controllers
        .iter()
        .map(|c| job_cgroup(node, c, 99, 1))
        .collect();
    for d in &stale {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut straggler = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    for d in &stale {
        std::fs::write(d.join("cgroup.procs"), straggler.id().to_string()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let _agent = agent(
        node,
        &addr,
        &dir.path().join("state"),
        &["--cpus", "1", "--memory-mib", "512"],
    );
    wait_for("the agent registered", || {
        !leader.0.lock().unwrap().registered.is_empty()
    })
    .await;
    wait_for("the stale cgroups removed", || {
        stale.iter().all(|d| !d.exists())
    })
    .await;
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = straggler.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < DEADLINE, "the straggler still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    server.abort();
    drop(_agent);
    remove_agent_cgroups(node);
}
