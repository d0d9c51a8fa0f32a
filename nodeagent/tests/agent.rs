//! The agent binary against a small in-test leader speaking the agents protocol: real
//! processes run as the user with Slurm's and PBS's environment, exit codes and signals are
//! reported, walltime, kill, suspend/resume (walltime paused), stale epochs refused, a kill
//! of a run never held reported as cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use docket_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_reports_and_controls_real_jobs() {
    if !privileged("running jobs as another user needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let _agent = agent(
        "n01",
        &addr,
        &dir.path().join("state"),
        &["--cpus", "2", "--memory-mib", "1024", "--kill-grace-s", "1"],
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();

    // 1. A job runs in its directory with the scheduler's environment; its output goes to
    //    slurm-%j.out; exit 0 is completed.
    runs_with_the_schedulers_environment(&leader, &work).await;

    // 2. A failing script: failed, with its exit code.
    leader
        .send(launch(2, 1, &work, "#!/bin/sh\nexit 3\n", 60))
        .await;
    let (_, end) = leader.ended(2).await;
    assert_eq!((cause(&end), end.exit_code), ("failed", 3));

    // 3. Walltime: SIGTERM at the limit (the script ignores nothing): timeout.
    leader
        .send(launch(3, 1, &work, "#!/bin/sh\nsleep 30\n", 1))
        .await;
    let (_, end) = leader.ended(3).await;
    assert_eq!(cause(&end), "timeout", "{end:?}");

    // 4. Kill: cancelled, the whole process group (a child that ignores SIGTERM dies by the
    //    SIGKILL after the grace); a stale kill (older epoch) is refused.
    kill_ends_the_group_and_refuses_a_stale_epoch(&leader, &work).await;

    // 5. Suspend stops the clock: a 2 s limit survives 3 s of suspension.
    suspend_stops_the_clock(&leader, &work).await;

    // 6. A kill for a run this node never had is reported as cancelled at once.
    leader
        .send(pb::instruction::Kind::Kill(control(99, 7)))
        .await;
    let (epoch, end) = leader.ended(99).await;
    assert_eq!((epoch, cause(&end)), (7, "cancelled"));

    // 7. A second launch of a run already held does nothing.
    a_second_launch_of_a_held_run_does_nothing(&leader, &work).await;

    // 8. Confinement (cgroups; v1 on the build machine): the job's cgroup exists while it
    //    runs, with its exclusive cpuset, memory limit and pids limit, and is gone after.
    the_job_is_confined_in_its_cgroup(&leader, &work).await;

    // 9. Over its memory: killed by the OOM killer, reported as out of memory.
    let mut l = launch(
        9,
        1,
        &work,
        "#!/bin/sh
dd if=/dev/zero of=/dev/null bs=300M count=1
",
        60,
    );
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.cpus = 1;
        x.memory_mib = 64;
    }
    leader.send(l).await;
    let (_, end) = leader.ended(9).await;
    assert_eq!(cause(&end), "out_of_memory", "{end:?}");
    assert!(end.max_rss_mib <= 64, "{end:?}");

    // 10. jobfs: a 16 MiB scratch exported as TMPDIR/PBS_JOBFS; 8 MiB fit, filling it fails
    //     with ENOSPC and the job is reported as jobfs exceeded; the mount is gone after.
    jobfs_is_a_capped_scratch_removed_after(&leader, &work).await;

    // 11. The job runs as its user, not as the agent's root, in a directory of its user's
    //     (it reaches its script through the state directory, which lets others pass).
    runs_as_its_user(&leader, dir.path()).await;
    server.abort();
    drop(_agent);
    remove_agent_cgroups("n01");
}

/// Whether the agent has reported an end of `job`.
fn has_ended(leader: &FakeLeader, job: u64) -> bool {
    leader
        .0
        .lock()
        .unwrap()
        .events
        .iter()
        .any(|e| e.job_id == job && matches!(e.event, Some(pb::job_event::Event::Ended(_))))
}

/// Job 1 (epoch 5) in `work` sees Slurm's and PBS's variables and its directory, writes
/// slurm-1.out, and completes; the agent registered as n01.
async fn runs_with_the_schedulers_environment(leader: &FakeLeader, work: &Path) {
    leader
        .send(launch(
            1,
            5,
            work,
            "#!/bin/sh\necho \"id=$SLURM_JOB_ID pbs=$PBS_JOBID cpus=$SLURM_CPUS_ON_NODE nodes=$SLURM_JOB_NODELIST pwd=$(pwd)\"\ncat \"$PBS_NODEFILE\" | wc -l\n",
            60,
        ))
        .await;
    let (epoch, end) = leader.ended(1).await;
    assert_eq!(epoch, 5);
    assert_eq!(
        (cause(&end), end.exit_code, end.signal),
        ("completed", 0, 0)
    );
    assert!(leader.started(1));
    let out = std::fs::read_to_string(work.join("slurm-1.out")).unwrap();
    assert!(
        out.contains(&format!(
            "id=1 pbs=1 cpus=2 nodes=n01 pwd={}",
            work.display()
        )),
        "{out}"
    );
    assert!(out.contains('2'), "{out}");
    assert_eq!(leader.0.lock().unwrap().registered[0].node, "n01");
}

/// Job 4 (epoch 2) with a child that ignores SIGTERM: a kill at epoch 1 does nothing, the
/// one at epoch 2 cancels it.
async fn kill_ends_the_group_and_refuses_a_stale_epoch(leader: &FakeLeader, work: &Path) {
    leader
        .send(launch(
            4,
            2,
            work,
            "#!/bin/sh\n(trap '' TERM; sleep 30) &\nwait\n",
            60,
        ))
        .await;
    let start = Instant::now();
    while !leader.started(4) {
        assert!(start.elapsed() < DEADLINE);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A stale kill (older epoch) is refused; the current one works.
    leader
        .send(pb::instruction::Kind::Kill(control(4, 1)))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!has_ended(leader, 4));
    leader
        .send(pb::instruction::Kind::Kill(control(4, 2)))
        .await;
    let (_, end) = leader.ended(4).await;
    assert_eq!(cause(&end), "cancelled");
}

/// Job 5 (a 2 s limit, 1 s of work) suspended for 3 s neither ends nor times out, and
/// completes once resumed.
async fn suspend_stops_the_clock(leader: &FakeLeader, work: &Path) {
    leader
        .send(launch(5, 1, work, "#!/bin/sh\nsleep 1\necho done\n", 2))
        .await;
    leader
        .send(pb::instruction::Kind::Suspend(control(5, 1)))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!has_ended(leader, 5), "ran or timed out while suspended");
    leader
        .send(pb::instruction::Kind::Resume(control(5, 1)))
        .await;
    let (_, end) = leader.ended(5).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
}

/// Launches of job 1 again (its epoch and an older one) report nothing of job 1.
async fn a_second_launch_of_a_held_run_does_nothing(leader: &FakeLeader, work: &Path) {
    let before = leader.0.lock().unwrap().events.len();
    leader
        .send(launch(1, 5, work, "#!/bin/sh\nexit 0\n", 60))
        .await;
    leader
        .send(launch(1, 4, work, "#!/bin/sh\nexit 0\n", 60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: BTreeMap<u64, usize> =
        leader.0.lock().unwrap().events[before..]
            .iter()
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e.job_id).or_default() += 1;
                m
            });
    assert!(!after.contains_key(&1), "relaunched: {after:?}");
}

/// Job 8 (1 cpu, 256 MiB): its cgroup appears with the memory limit, the job sees only cpu
/// 0, completes, and the cgroup is removed.
async fn the_job_is_confined_in_its_cgroup(leader: &FakeLeader, work: &Path) {
    let (memory_base, limit_file) = memory_cgroup_base();
    let mut l = launch(
        8,
        1,
        work,
        "#!/bin/sh
grep Cpus_allowed_list /proc/self/status
sleep 2
",
        60,
    );
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.cpus = 1;
        x.memory_mib = 256;
    }
    leader.send(l).await;
    let job_dir = memory_base.join("job_8_1");
    let start = Instant::now();
    while !job_dir.exists() {
        assert!(
            start.elapsed() < DEADLINE,
            "no cgroup {}",
            job_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The agent makes the cgroup, then writes its limits (before the job starts in it): poll
    // through the gap, which a slow (emulated) host makes long.
    let want = (256u64 << 20).to_string();
    loop {
        let limit = std::fs::read_to_string(job_dir.join(limit_file)).unwrap_or_default();
        if limit.trim() == want {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{limit_file} of {} is {limit:?}, not {want}",
            job_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, end) = leader.ended(8).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
    let out = std::fs::read_to_string(work.join("slurm-8.out")).unwrap();
    assert!(out.contains("Cpus_allowed_list:\t0\n"), "{out:?}");
    assert!(!job_dir.exists(), "the job's cgroup was not removed");
    assert!(end.cpu_time_ms < 60_000);
}

/// Job 10 with a 16 MiB jobfs: TMPDIR and PBS_JOBFS name it, 8 MiB fit, more ends the job
/// as jobfs exceeded, and the mount is gone after.
async fn jobfs_is_a_capped_scratch_removed_after(leader: &FakeLeader, work: &Path) {
    let script = "#!/bin/sh
[ \"$TMPDIR\" = \"$PBS_JOBFS\" ] || exit 9
echo \"jobfs=$TMPDIR\"
dd if=/dev/zero of=$TMPDIR/a bs=1M count=8 2>/dev/null || exit 8
dd if=/dev/zero of=$TMPDIR/b bs=1M count=32 2>/dev/null
";
    let mut l = launch(10, 1, work, script, 60);
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.cpus = 1;
        x.jobfs_mib = 16;
    }
    leader.send(l).await;
    let (_, end) = leader.ended(10).await;
    assert_eq!(cause(&end), "jobfs_exceeded", "{end:?}");
    let out = std::fs::read_to_string(work.join("slurm-10.out")).unwrap();
    let mount = out
        .lines()
        .find_map(|l| l.strip_prefix("jobfs="))
        .expect("the job saw its jobfs")
        .to_owned();
    assert!(mount.ends_with("/10.1"), "{mount}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&mount), "jobfs {mount} still mounted");
    assert!(!std::path::Path::new(&mount).exists());
}

/// Job 11 of nobody's, in a directory of nobody's under `tmp`, runs with nobody's uid and
/// USER.
async fn runs_as_its_user(leader: &FakeLeader, tmp: &Path) {
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let theirs = user_dir(tmp, "theirs", &nobody);
    let mut l = launch(
        11,
        1,
        &theirs,
        "#!/bin/sh\necho \"uid=$(id -u) user=$USER\"\n",
        60,
    );
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.user = "nobody".into();
        x.cpus = 1;
    }
    leader.send(l).await;
    let (_, end) = leader.ended(11).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
    let out = std::fs::read_to_string(theirs.join("slurm-11.out")).unwrap();
    assert!(
        out.contains(&format!("uid={} user=nobody", nobody.uid)),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_runs_occupy_their_time_without_processes() {
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    // Simulated agents need neither root nor cgroups, and many can share a host.
    let _agent = agent(
        "sim001",
        &addr,
        &dir.path().join("state"),
        &[
            "--cpus",
            "128",
            "--memory-mib",
            "524288",
            "--execution",
            "simulated",
        ],
    );
    let work = dir.path();
    let began = Instant::now();
    leader
        .send(launch(1, 1, work, "#!/bin/sh\nsleep 1\n", 60))
        .await;
    let (_, end) = leader.ended(1).await;
    assert_eq!(cause(&end), "completed");
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "ended before its simulated runtime"
    );
    assert!(
        !work.join("slurm-1.out").exists(),
        "a simulated run wrote output"
    );
    // Killed, and timed out, like real runs.
    leader
        .send(launch(2, 1, work, "#!/bin/sh\nsleep 600\n", 60))
        .await;
    leader
        .send(pb::instruction::Kind::Kill(control(2, 1)))
        .await;
    assert_eq!(cause(&leader.ended(2).await.1), "cancelled");
    leader
        .send(launch(3, 1, work, "#!/bin/sh\nsleep 600\n", 1))
        .await;
    assert_eq!(cause(&leader.ended(3).await.1), "timeout");
    server.abort();
}

/// One agent per state directory: a second one started on it (a unit started twice, a
/// mistyped node name) exits after a short wait for the lock, naming the directory, and leaves
/// the first one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_state_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let simulated = [
        "--cpus",
        "4",
        "--memory-mib",
        "4096",
        "--execution",
        "simulated",
    ];
    let mut first = agent("lock01", &addr, &state, &simulated);
    // Its runtime directory is made after the lock is taken.
    wait_for("the first agent's runtime directory", || {
        state.join("run").exists()
    })
    .await;
    let second = Command::new(env!("CARGO_BIN_EXE_docket-nodeagent"))
        .args(["run", "--node", "lock02", "--controllers", &addr])
        .args(simulated)
        .arg("--state-dir")
        .arg(&state)
        .arg("--runtime-dir")
        .arg(state.join("run"))
        .args(tls_flags("lock02"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut second = Agent(second);
    let began = Instant::now();
    let status = loop {
        if let Some(status) = second.0.try_wait().unwrap() {
            break status;
        }
        assert!(began.elapsed() < DEADLINE, "the second agent kept running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("one agent per state directory") && err.contains(state.to_str().unwrap()),
        "{err}"
    );
    assert!(
        first.0.try_wait().unwrap().is_none(),
        "the first agent stopped"
    );
    // And the first one still runs jobs (a simulated run lasts its script's first sleep).
    leader
        .send(launch(1, 1, dir.path(), "#!/bin/sh\nsleep 0\n", 60))
        .await;
    assert_eq!(cause(&leader.ended(1).await.1), "completed");
    drop(first);
    server.abort();
}

/// A local user who takes the step port first does not keep the agent from starting: it
/// registers with the step address and runs jobs, and binds the port once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatted_step_port_delays_steps_but_not_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let listen = format!("127.0.0.1:{port}");
    let _agent = agent(
        "sim002",
        &addr,
        &dir.path().join("state"),
        &[
            "--cpus",
            "4",
            "--memory-mib",
            "4096",
            "--execution",
            "simulated",
            "--step-listen",
            &listen,
        ],
    );
    wait_for("the agent to register", || {
        !leader.0.lock().unwrap().registered.is_empty()
    })
    .await;
    let registered = leader.0.lock().unwrap().registered[0].clone();
    assert_eq!(registered.step_address, listen);
    leader
        .send(launch(1, 1, dir.path(), "#!/bin/sh\nsleep 0\n", 60))
        .await;
    assert_eq!(cause(&leader.ended(1).await.1), "completed");
    // The port freed, the agent takes it.
    drop(squatter);
    wait_for("the agent to bind its step port", || {
        std::net::TcpStream::connect(&listen).is_ok()
    })
    .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_a_leader_past_its_fence_stops_its_jobs_and_reports_later() {
    if !privileged("running jobs needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    leader.0.lock().unwrap().fence_ms = 1_000;
    let (addr, server) = serve(&leader).await;
    let _agent = agent(
        "n02",
        &addr,
        &dir.path().join("state"),
        &[
            "--cpus",
            "1",
            "--memory-mib",
            "1024",
            "--kill-grace-s",
            "1",
            "--confinement",
            "none",
        ],
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    leader
        .send(launch(
            1,
            1,
            &work,
            "#!/bin/sh\necho $$ > pid\nexec sleep 60\n",
            0,
        ))
        .await;
    let pid_file = work.join("pid");
    let start = Instant::now();
    while std::fs::read_to_string(&pid_file).map_or(true, |s| s.trim().is_empty()) {
        assert!(start.elapsed() < DEADLINE, "the job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = |pid: i32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    assert!(alive(pid));

    // The leader goes away (every call fails, its stream ends): past the 1 s fence the agent
    // stops the job itself.
    {
        let mut shared = leader.0.lock().unwrap();
        shared.dark = true;
        shared.tx = None;
    }
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < DEADLINE, "the job outlived the fence");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "stopped before the fence"
    );

    // A leader comes back: the agent reports the run's end (node failure) to it.
    leader.0.lock().unwrap().dark = false;
    let (epoch, end) = leader.ended(1).await;
    assert_eq!((epoch, cause(&end)), (1, "node_failure"), "{end:?}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_re_adopts_running_jobs_and_reports_what_ended_meanwhile() {
    if !privileged("running jobs needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let spawn_agent = || {
        agent(
            "n03",
            &addr,
            &dir.path().join("state"),
            &["--cpus", "2", "--memory-mib", "1024", "--kill-grace-s", "1"],
        )
    };
    let agent = spawn_agent();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut a = launch(1, 3, &work, "#!/bin/sh\nsleep 3\nexit 7\n", 60);
    let mut b = launch(2, 1, &work, "#!/bin/sh\nsleep 1\nexit 5\n", 60);
    for l in [&mut a, &mut b] {
        if let pb::instruction::Kind::Launch(x) = l {
            x.cpus = 1;
        }
    }
    leader.send(a).await;
    leader.send(b).await;
    let start = Instant::now();
    while !(leader.started(1) && leader.started(2)) {
        assert!(start.elapsed() < DEADLINE, "the jobs never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The agent dies hard; job 2 ends while it is down.
    drop(agent);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    leader.0.lock().unwrap().tx = None;
    let before = leader.0.lock().unwrap().registered.len();
    let _agent = spawn_agent();
    // It registers holding job 1's run, and reports job 2's end and, later, job 1's.
    let start = Instant::now();
    while leader.0.lock().unwrap().registered.len() == before {
        assert!(
            start.elapsed() < DEADLINE,
            "the restarted agent never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = leader
        .0
        .lock()
        .unwrap()
        .registered
        .last()
        .unwrap()
        .jobs
        .clone();
    assert!(
        held.iter()
            .any(|h| h.job_id == 1 && h.epoch == 3 && h.running),
        "{held:?}"
    );
    let (epoch, end) = leader.ended(2).await;
    assert_eq!(
        (epoch, cause(&end), end.exit_code),
        (1, "failed", 5),
        "{end:?}"
    );
    let (epoch, end) = leader.ended(1).await;
    assert_eq!(
        (epoch, cause(&end), end.exit_code),
        (3, "failed", 7),
        "{end:?}"
    );
    server.abort();
    drop(_agent);
    remove_agent_cgroups("n03");
}

fn tmpfs(path: &std::path::Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Sends `launch` and waits for job `job` to start.
async fn started(leader: &FakeLeader, launch: pb::instruction::Kind, job: u64) {
    leader.send(launch).await;
    let start = Instant::now();
    while !leader.started(job) {
        assert!(start.elapsed() < DEADLINE, "job {job} never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The agent keeps its runs' records and its jobs' scripts on a tmpfs of its own, capped in
/// size and inodes, mounted on the runtime directory; a restarted agent uses the mount it
/// finds. A reboot ends the jobs and that tmpfs, but not the state file: the agent after it
/// mounts a fresh one, holds its runs from the state file, finds their records gone, and
/// reports each lost (a node failure, which the leader requeues or fails by policy), even
/// one whose exit its monitor had recorded there. It then runs jobs as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_tmpfs_is_the_agents_own_and_after_a_reboot_held_runs_are_lost() {
    if !privileged("running jobs and mounting need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (state, runtime) = (dir.path().join("state"), dir.path().join("tmpfs"));
    // Unmounted whatever happens below, so the test leaves no mount behind.
    let _unmount = Unmount(runtime.clone());
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let flags = [
        "--cpus",
        "2",
        "--memory-mib",
        "1024",
        "--kill-grace-s",
        "1",
        "--runtime-dir",
        runtime.to_str().unwrap(),
        "--runtime-tmpfs-mib",
        "8",
    ];
    let agent1 = agent("n07", &addr, &state, &flags);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let ends_with_7 = "#!/bin/sh\nsleep 1\nexit 7\n";
    started(&leader, launch(1, 2, &work, ends_with_7, 60), 1).await;
    // On its own tmpfs: 8 MiB, 256 inodes per MiB.
    let fs = nix::sys::statfs::statfs(&runtime).unwrap();
    assert!(tmpfs(&runtime) && mounts_at(&runtime) == 1);
    assert_eq!(fs.blocks() as u64 * fs.block_size() as u64, 8 << 20);
    assert_eq!(fs.files() as u64, 8 * 256);
    assert!(runtime.join("runs/1.2").is_dir() && runtime.join("jobs/1.2").is_dir());
    assert!(!state.join("runs").exists() && !state.join("jobs").exists());
    // The agent dies hard and comes back: it uses the mount it finds (one, not two), and
    // reports the job's end as its monitor recorded it there.
    drop(agent1);
    leader.0.lock().unwrap().tx = None;
    let agent2 = agent("n07", &addr, &state, &flags);
    let (epoch, end) = leader.ended(1).await;
    assert_eq!(
        (epoch, cause(&end), end.exit_code),
        (2, "failed", 7),
        "{end:?}"
    );
    assert_eq!(mounts_at(&runtime), 1);
    // Job 3 runs; the agent dies, the job ends, and the "reboot" takes the tmpfs with it.
    started(&leader, launch(3, 1, &work, ends_with_7, 60), 3).await;
    drop(agent2);
    let start = Instant::now();
    while !runtime.join("runs/3.1/exit").exists() {
        assert!(start.elapsed() < DEADLINE, "the monitor recorded no exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nix::mount::umount2(&runtime, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert!(mounts_at(&runtime) == 0 && !runtime.join("runs").exists());
    leader.0.lock().unwrap().tx = None;
    let agent3 = agent("n07", &addr, &state, &flags);
    let (epoch, end) = leader.ended(3).await;
    assert_eq!((epoch, cause(&end)), (1, "node_failure"), "{end:?}");
    // A fresh tmpfs, and the next job runs.
    leader
        .send(launch(4, 1, &work, "#!/bin/sh\nexit 0\n", 60))
        .await;
    let (epoch, end) = leader.ended(4).await;
    assert_eq!((epoch, cause(&end)), (1, "completed"), "{end:?}");
    assert!(mounts_at(&runtime) == 1 && runtime.join("runs/4.1").is_dir());
    server.abort();
    drop(agent3);
    remove_agent_cgroups("n07");
}

/// The launcher of the agent keeping `state`: the process with the launcher's command line
/// whose parent has another (its forked monitors have the same command line, and the
/// launcher for a parent).
fn launchers(state: &std::path::Path) -> Vec<i32> {
    let want = format!("--state-dir={}", state.display());
    let named: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.contains(&&b"launcher"[..]) && args.contains(&want.as_bytes())
            })
        })
        .collect();
    let parent = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse::<i32>().ok())
            })
    };
    named
        .iter()
        .copied()
        .filter(|pid| parent(*pid).is_none_or(|p| !named.contains(&p)))
        .collect()
}

/// Monitors are forked by the agent's launcher. A launcher killed under a running job costs
/// nothing: the agent watches that run by its monitor's lock and reports its end, and the
/// next launch starts another launcher; when the agent goes, so does its launcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launcher_killed_under_a_running_job_loses_nothing_and_goes_with_its_agent() {
    if !privileged("running jobs needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let agent = agent(
        "n06",
        &addr,
        &state,
        &["--cpus", "2", "--memory-mib", "1024", "--kill-grace-s", "1"],
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    leader
        .send(launch(
            1,
            1,
            &work,
            "#!/bin/sh
sleep 2
exit 4
",
            60,
        ))
        .await;
    wait_for("job 1 to start", || leader.started(1)).await;
    let first = launchers(&state);
    assert_eq!(first.len(), 1, "one launcher: {first:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (_, end) = leader.ended(1).await;
    assert_eq!((cause(&end), end.exit_code), ("failed", 4), "{end:?}");
    leader
        .send(launch(
            2,
            1,
            &work,
            "#!/bin/sh
exit 6
",
            60,
        ))
        .await;
    let (_, end) = leader.ended(2).await;
    assert_eq!((cause(&end), end.exit_code), ("failed", 6), "{end:?}");
    let second = launchers(&state);
    assert!(
        second.len() == 1 && second != first,
        "a new launcher: {first:?} then {second:?}"
    );
    drop(agent);
    wait_for("the launcher to go with its agent", || {
        launchers(&state).is_empty()
    })
    .await;
    server.abort();
    remove_agent_cgroups("n06");
}

/// An agent killed at each of its crash points (after recording a launch, after starting the
/// job's monitor but before recording it, after the job ended but before the end was
/// recorded, after recording but before reporting it) and restarted: the job runs at most
/// once, and its end is reported exactly as it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_crashing_at_a_launch_or_an_exit_never_loses_nor_repeats_a_run() {
    if !privileged("running jobs needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let flags = ["--cpus", "2", "--memory-mib", "1024", "--kill-grace-s", "1"];
    let points = [
        "launch-recorded",
        "launch-spawned",
        "exit-observed",
        "exit-recorded",
    ];
    for (i, point) in points.into_iter().enumerate() {
        let job = 10 + i as u64;
        let work = dir.path().join(format!("work{job}"));
        std::fs::create_dir_all(&work).unwrap();
        let marker = work.join("runs");
        let script = format!(
            "#!/bin/sh\necho ran >> {}\nsleep 1\nexit 3\n",
            marker.display()
        );
        leader.0.lock().unwrap().tx = None;
        let mut armed = agent(
            "n05",
            &addr,
            &state,
            &[&flags[..], &["--crash-at", point]].concat(),
        );
        leader.send(launch(job, 1, &work, &script, 60)).await;
        let start = Instant::now();
        while armed.0.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < DEADLINE,
                "the agent never crashed at {point}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        leader.0.lock().unwrap().tx = None;
        let restarted = agent("n05", &addr, &state, &flags);
        let (epoch, end) = leader.ended(job).await;
        // Give a monitor that should not start the job every chance to do so anyway.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let runs = std::fs::read_to_string(&marker)
            .unwrap_or_default()
            .lines()
            .count();
        let expected = if point == "launch-recorded" {
            ("node_failure", 0)
        } else {
            ("failed", 3)
        };
        assert_eq!(
            (epoch, cause(&end), end.exit_code),
            (1, expected.0, expected.1),
            "crash at {point}: {end:?}"
        );
        assert_eq!(
            runs,
            usize::from(point != "launch-recorded"),
            "crash at {point}: the job ran {runs} times"
        );
        let reported = leader
            .0
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| e.job_id == job && matches!(e.event, Some(pb::job_event::Event::Ended(_))))
            .count();
        assert!(reported >= 1, "crash at {point}: no end reported");
        drop(restarted);
    }
    server.abort();
    remove_agent_cgroups("n05");
}

#[test]
fn without_writable_cgroups_the_agent_refuses_to_start_unless_told_not_to_confine() {
    if !privileged("needs root to start the agent as another user") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    // Everyone's, sticky like /tmp (without the sticky bit the agent refuses it as a parent).
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    // A copy nobody can execute (the build directory may be private to root).
    let bin = dir.path().join("docket-nodeagent");
    std::fs::copy(env!("CARGO_BIN_EXE_docket-nodeagent"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Its certificate, readable by nobody (the key its own, 0600).
    let files = secrets()
        .issue(&docket_auth::tls::Role::Node("n09".into()), &[])
        .unwrap();
    let (cert, key) = files.identity.unwrap();
    let mut tls = Vec::new();
    for (flag, from, mode) in [
        ("--tls-ca", files.ca, 0o644),
        ("--tls-cert", cert, 0o644),
        ("--tls-key", key, 0o600),
    ] {
        let to = dir.path().join(from.file_name().unwrap());
        std::fs::copy(&from, &to).unwrap();
        std::os::unix::fs::chown(&to, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw()))
            .unwrap();
        std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        tls.push(flag.to_owned());
        tls.push(to.display().to_string());
    }
    // As an unprivileged user no cgroup is writable: a clear error, not a silent agent.
    let out = Command::new(&bin)
        .args([
            "run",
            "--node",
            "n09",
            "--controllers",
            "127.0.0.1:1",
            "--cpus",
            "1",
        ])
        .args(["--memory-mib", "64"])
        .args(&tls)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--runtime-dir")
        .arg(dir.path().join("run"))
        .args(["--runtime-tmpfs-mib", "0"])
        .uid(nobody.uid.as_raw())
        .gid(nobody.gid.as_raw())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--confinement none"), "{err}");
    assert!(err.contains("cgroup"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmpfs_jobfs_is_capped_too() {
    if !privileged("mounting needs root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let _agent = agent(
        "n04",
        &addr,
        &dir.path().join("state"),
        &[
            "--cpus",
            "1",
            "--memory-mib",
            "1024",
            "--jobfs",
            "tmpfs",
            "--confinement",
            "none",
        ],
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = "#!/bin/sh\nstat -f -c 'type=%T' \"$TMPDIR\"\ndd if=/dev/zero of=$TMPDIR/big bs=1M count=16 2>/dev/null\n";
    let mut l = launch(1, 1, &work, script, 60);
    if let pb::instruction::Kind::Launch(x) = &mut l {
        x.cpus = 1;
        x.jobfs_mib = 8;
    }
    leader.send(l).await;
    let (_, end) = leader.ended(1).await;
    assert_eq!(cause(&end), "jobfs_exceeded", "{end:?}");
    let out = std::fs::read_to_string(work.join("slurm-1.out")).unwrap();
    assert!(out.contains("type=tmpfs"), "{out}");
    server.abort();
}
