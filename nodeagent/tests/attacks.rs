//! Attacks on the node agent's privilege boundary, each made by a job of an unprivileged user
//! (`nobody`) against a real agent running as root with cgroup confinement, each of which
//! must fail: root running the job's `LD_PRELOAD`; output files that point at root's files
//! (`-o` at one, or a symlink planted at `slurm-%j.out`); writing, planting symlinks in, or
//! even listing the agent's bookkeeping (to forge the job's exit or aim a kill at process
//! group 1); a process that leaves the job's process group and session to dodge a signal
//! or to outlive the job; regaining root; and another user reading a job's scratch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use docket_proto::v1 as pb;

/// A launch of `script` as nobody in `work`, with `env` exported (plus a PATH).
fn launch_as_nobody(job: u64, work: &Path, script: &str, env: &[(&str, &str)]) -> pb::Launch {
    let pb::instruction::Kind::Launch(mut l) = launch(job, 1, work, script, 120) else {
        unreachable!()
    };
    l.user = "nobody".into();
    l.cpus = 1;
    let mut block = b"PATH=/usr/local/bin:/usr/bin:/bin\0".to_vec();
    for (k, v) in env {
        block.extend_from_slice(format!("{k}={v}\0").as_bytes());
    }
    l.environment = Some(block);
    l
}

/// A real agent `node` (as root, confined: one cpu, 512 MiB, and `extra`) with a fake leader
/// serving it, its state directory, and a work directory of nobody's, all in a fresh
/// temporary directory (bind `dir`: the directory goes when it is dropped).
struct NobodysAgent {
    dir: tempfile::TempDir,
    leader: FakeLeader,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    agent: Agent,
    state: std::path::PathBuf,
    work: std::path::PathBuf,
}

async fn nobodys_agent(node: &str, extra: &[&str]) -> NobodysAgent {
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let (addr, server) = serve(&leader).await;
    let state = dir.path().join("state");
    let flags: Vec<&str> = ["--cpus", "1", "--memory-mib", "512"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let agent = agent(node, &addr, &state, &flags);
    let work = user_dir(dir.path(), "work", &nobody());
    NobodysAgent {
        dir,
        leader,
        server,
        agent,
        state,
        work,
    }
}

/// A file of root's, 0644, that no job may write, own or replace.
fn victim(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("victim");
    std::fs::write(&p, "precious\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

fn assert_untouched(victim: &Path) {
    let meta = std::fs::symlink_metadata(victim).unwrap();
    assert!(
        meta.file_type().is_file(),
        "{} was replaced",
        victim.display()
    );
    assert_eq!(meta.uid(), 0, "{} was given away", victim.display());
    assert_eq!(std::fs::read_to_string(victim).unwrap(), "precious\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_environment_never_reaches_a_root_process_and_the_job_cannot_regain_root() {
    if !privileged("an agent running jobs as nobody needs root") {
        return;
    }
    if std::process::Command::new("cc")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("a C compiler (cc) is needed to build the LD_PRELOAD library of this attack");
    }
    let NobodysAgent {
        dir,
        leader,
        server,
        agent,
        work,
        ..
    } = nobodys_agent("a01", &[]).await;
    // Where the library records every process that loads it, by euid: writable by all.
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let library = build_marking_library(dir.path(), &marks);

    let script = "#!/bin/sh\ngrep -E '^(Uid|Gid|Groups|NoNewPrivs):' /proc/self/status\n";
    let lib = library.display().to_string();
    let env = [
        ("LD_PRELOAD", lib.as_str()),
        ("LD_LIBRARY_PATH", dir.path().to_str().unwrap()),
    ];
    leader
        .send(pb::instruction::Kind::Launch(launch_as_nobody(
            21, &work, script, &env,
        )))
        .await;
    let (_, end) = leader.ended(21).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
    let loaded: Vec<String> = std::fs::read_dir(&marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let uid = nobody().uid.as_raw();
    // The job's own processes loaded it (the environment did reach the job) ...
    assert!(
        loaded.contains(&format!("loaded-by-{uid}")),
        "the job never loaded its LD_PRELOAD: {loaded:?}"
    );
    // ... and no process of root's did.
    assert!(
        !loaded.contains(&"loaded-by-0".to_owned()),
        "a root process ran the job's LD_PRELOAD: {loaded:?}"
    );
    let out = std::fs::read_to_string(work.join("slurm-21.out")).unwrap();
    assert_never_regained_root(&out, uid);
    drop(agent);
    server.abort();
    remove_agent_cgroups("a01");
}

/// Builds `dir/evil.so` (mode 0755) with cc: a library whose constructor creates
/// `marks/loaded-by-EUID` in every process that loads it; its path.
fn build_marking_library(dir: &Path, marks: &Path) -> std::path::PathBuf {
    let source = dir.join("evil.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n#include <unistd.h>\n#include <fcntl.h>\n\
             __attribute__((constructor)) static void evil(void) {{\n\
               char p[4096]; snprintf(p, sizeof p, \"{}/loaded-by-%d\", (int)geteuid());\n\
               close(open(p, O_CREAT | O_WRONLY, 0644));\n}}\n",
            marks.display()
        ),
    )
    .unwrap();
    let library = dir.join("evil.so");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .unwrap();
    assert!(built.status.success(), "{built:?}");
    std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o755)).unwrap();
    library
}

/// The job's /proc/self/status lines in `out`: every uid is `uid`, no new privileges, and
/// root's group is not among its groups.
fn assert_never_regained_root(out: &str, uid: u32) {
    assert!(
        out.contains(&format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}")),
        "{out}"
    );
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    let groups = out
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap_or_default();
    assert!(
        !groups.split_whitespace().any(|g| g == "0"),
        "the job kept root's group: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_files_are_opened_as_the_user_and_never_through_a_symlink() {
    if !privileged("an agent running jobs as nobody needs root") {
        return;
    }
    let NobodysAgent {
        dir,
        leader,
        server,
        agent,
        work,
        ..
    } = nobodys_agent("a02", &[]).await;
    let victim = victim(dir.path());

    // `sbatch -o /etc/passwd`: an absolute output path at a file of root's.
    let mut l = launch_as_nobody(22, &work, "#!/bin/sh\necho OWNED\n", &[]);
    l.stdout = victim.display().to_string();
    leader.send(pb::instruction::Kind::Launch(l)).await;
    let (_, end) = leader.ended(22).await;
    assert_eq!(cause(&end), "launch_failed", "{end:?}");
    assert_untouched(&victim);

    // A symlink planted where the default output goes.
    std::os::unix::fs::symlink(&victim, work.join("slurm-23.out")).unwrap();
    leader
        .send(pb::instruction::Kind::Launch(launch_as_nobody(
            23,
            &work,
            "#!/bin/sh\necho OWNED\n",
            &[],
        )))
        .await;
    let (_, end) = leader.ended(23).await;
    assert_eq!(cause(&end), "launch_failed", "{end:?}");
    assert_untouched(&victim);

    // An honest job's output is its user's.
    leader
        .send(pb::instruction::Kind::Launch(launch_as_nobody(
            24,
            &work,
            "#!/bin/sh\necho hello\n",
            &[],
        )))
        .await;
    let (_, end) = leader.ended(24).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
    let out = work.join("slurm-24.out");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "hello\n");
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(meta.uid(), nobody().uid.as_raw());
    // Created with the default umask (the agent's own is not the job's).
    assert_eq!(meta.mode() & 0o777, 0o644);

    // With the submitter's umask (sbatch sends SLURM_UMASK), the job's files get it, and an
    // output name starting with '-' is a file, not an option of root's processes.
    let mut l = launch_as_nobody(
        25,
        &work,
        "#!/bin/sh
echo hello
touch made
",
        &[("SLURM_UMASK", "0077")],
    );
    l.stdout = "-o".into();
    leader.send(pb::instruction::Kind::Launch(l)).await;
    let (_, end) = leader.ended(25).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
    for name in ["-o", "made"] {
        let mode = std::fs::metadata(work.join(name)).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600, "{name}");
    }
    drop(agent);
    server.abort();
    remove_agent_cgroups("a02");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_can_neither_reach_the_agents_records_nor_forge_its_exit_nor_dodge_a_signal() {
    if !privileged("an agent running jobs as nobody needs root") {
        return;
    }
    let NobodysAgent {
        dir,
        leader,
        server,
        agent,
        state,
        work,
    } = nobodys_agent("a03", &["--kill-grace-s", "1", "--runtime-tmpfs-mib", "8"]).await;
    // On a tmpfs of the agent's own, as in production, whose ACLs the job's files rely on.
    let _unmount = Unmount(state.join("run"));
    let victim = victim(dir.path());

    // It tries to write its own exit and process group, to plant symlinks where root writes
    // them, to grow its own script and node file, and to list the agent's directories; then
    // fails with 3.
    let script = r#"#!/bin/sh
runs="$RUNTIME/runs"
for f in exit .exit.tmp pgid .pgid.tmp state.json state.0 state.1; do
  echo '{"code":0,"signal":0}' > "$runs/31.1/$f" 2>/dev/null && echo "WROTE $f"
  ln -s "$VICTIM" "$runs/31.1/$f" 2>/dev/null && echo "LINKED $f"
  echo 1 > "$STATE/$f" 2>/dev/null && echo "WROTE state/$f"
  echo 1 > "$RUNTIME/$f" 2>/dev/null && echo "WROTE runtime/$f"
done
ls "$runs" >/dev/null 2>&1 && echo "LISTED runs"
ls "$RUNTIME/jobs" >/dev/null 2>&1 && echo "LISTED jobs"
ls "$RUNTIME" >/dev/null 2>&1 && echo "LISTED runtime"
ls "$STATE" >/dev/null 2>&1 && echo "LISTED state"
mkdir "$(dirname "$PBS_NODEFILE")/tree" 2>/dev/null && echo "WROTE job directory"
for f in "$0" "$PBS_NODEFILE"; do
  chmod u+w "$f" 2>/dev/null && echo "CHMODDED $f"
  echo grow >> "$f" 2>/dev/null && echo "WROTE $f"
  truncate -s 1G "$f" 2>/dev/null && echo "WROTE (truncate) $f"
  [ -r "$f" ] || echo "UNREADABLE $f"
  echo "STAT $(stat -c '%a %u %g' "$f")"
done
head -c 9 "$0" | grep -q '^#!/bin/sh' || echo "UNREADABLE script"
for f in /proc/self/fd/*; do echo forged-launch-failure >> "$f"; done 2>/dev/null
exit 3
"#;
    let runtime = state.join("run");
    let env = [
        ("STATE", state.to_str().unwrap()),
        ("RUNTIME", runtime.to_str().unwrap()),
        ("VICTIM", victim.to_str().unwrap()),
    ];
    leader
        .send(pb::instruction::Kind::Launch(launch_as_nobody(
            31, &work, script, &env,
        )))
        .await;
    let (_, end) = leader.ended(31).await;
    assert_eq!((cause(&end), end.exit_code), ("failed", 3), "{end:?}");
    let out = std::fs::read_to_string(work.join("slurm-31.out")).unwrap();
    for word in ["WROTE", "LINKED", "LISTED", "CHMODDED", "UNREADABLE"] {
        assert!(!out.contains(word), "the job got in: {out}");
    }
    // Its script and node file are root's, lent to it read-only, so it cannot grow them
    // until the runtime tmpfs is full.
    // (The group's bits are the ACL's mask; its group entry gives the group nothing.)
    let gid = nobody().gid;
    assert!(out.contains(&format!("STAT 550 0 {gid}\n")), "{out}");
    assert!(out.contains(&format!("STAT 440 0 {gid}\n")), "{out}");
    assert_untouched(&victim);
    assert_eq!(
        mounts_at(&runtime),
        1,
        "the runtime directory is not the agent's tmpfs"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&state), 0o711);
    assert_eq!(mode(&runtime), 0o711);
    assert_eq!(mode(&runtime.join("runs")), 0o700);
    assert_eq!(std::fs::metadata(runtime.join("runs")).unwrap().uid(), 0);

    // A process that leaves the job's process group and session still gets the job's
    // signals (they go to the job's cgroup), and a process of the same user outside the job
    // does not.
    let bystander = std::process::Command::new("sleep")
        .arg("60")
        .uid(nobody().uid.as_raw())
        .gid(nobody().gid.as_raw())
        .process_group(0)
        .spawn()
        .unwrap();
    let bystander = KillOnDrop(bystander);
    // The main shell's trap is set before the escaped process exists: the test signals once
    // that process has written its pid, which could come before a trap set after it.
    let script = r#"#!/bin/sh
cd "$WORK"
trap 'echo main-got-usr1 >> marks' USR1
setsid sh -c 'trap "echo escaped-got-usr1 >> marks; exit 0" USR1; echo $$ > escaped.pid; while :; do sleep 0.1; done' &
while :; do sleep 0.1; done
"#;
    leader
        .send(pb::instruction::Kind::Launch(launch_as_nobody(
            32,
            &work,
            script,
            &[("WORK", work.to_str().unwrap())],
        )))
        .await;
    wait_for("the escaped process", || work.join("escaped.pid").exists()).await;
    leader
        .send(pb::instruction::Kind::Signal(pb::SignalJob {
            job_id: 32,
            epoch: 1,
            signal: nix::sys::signal::Signal::SIGUSR1 as i32,
        }))
        .await;
    wait_for("both processes got SIGUSR1", || {
        std::fs::read_to_string(work.join("marks"))
            .is_ok_and(|m| m.contains("escaped-got-usr1") && m.contains("main-got-usr1"))
    })
    .await;
    leader
        .send(pb::instruction::Kind::Kill(control(32, 1)))
        .await;
    let (_, end) = leader.ended(32).await;
    assert_eq!(cause(&end), "cancelled", "{end:?}");
    let mut bystander = bystander;
    assert!(
        bystander.0.try_wait().unwrap().is_none(),
        "a process outside the job was killed"
    );
    drop(agent);
    server.abort();
    remove_agent_cgroups("a03");
}

/// A job whose script ends while a process it started in a session of its own lives on:
/// the job's end takes that process too (it is still in the job's cgroups), and the cgroups
/// go. The agent first tries to remove each cgroup as it is; a removal the kernel refuses
/// because of that process must fall back to killing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_a_job_leaves_behind_ends_with_the_job() {
    if !privileged("an agent running jobs as nobody needs root") {
        return;
    }
    let NobodysAgent {
        dir: _dir,
        leader,
        server,
        agent,
        work,
        ..
    } = nobodys_agent("a05", &[]).await;
    let script = r#"#!/bin/sh
cd "$WORK"
setsid sh -c 'trap "" HUP TERM; echo $$ > left.pid; while :; do sleep 0.1; done' </dev/null >/dev/null 2>&1 &
while [ ! -s left.pid ]; do sleep 0.05; done
sleep 1
exit 0
"#;
    leader
        .send(pb::instruction::Kind::Launch(launch_as_nobody(
            51,
            &work,
            script,
            &[("WORK", work.to_str().unwrap())],
        )))
        .await;
    let pid_file = work.join("left.pid");
    wait_for("the process left behind", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'))
    })
    .await;
    let left: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Should this test fail, the process must not outlive it either.
    struct KillPid(i32);
    impl Drop for KillPid {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let left_guard = KillPid(left);
    // While the script still runs, the process is in the job's cgroups (every hierarchy).
    let cgroups = std::fs::read_to_string(format!("/proc/{left}/cgroup")).unwrap();
    let confined: Vec<&str> = cgroups
        .lines()
        .filter(|l| l.contains("/job_51_1"))
        .collect();
    assert!(!confined.is_empty(), "not in the job's cgroups: {cgroups}");
    let mut dirs: Vec<std::path::PathBuf> =
        ["cpuacct", "cpuset", "devices", "freezer", "memory", "pids"]
            .into_iter()
            .map(|c| job_cgroup("a05", c, 51, 1))
            .filter(|d| d.exists())
            .collect();
    dirs.dedup();
    assert!(!dirs.is_empty(), "the job has no cgroup directory");
    let (_, end) = leader.ended(51).await;
    assert_eq!(cause(&end), "completed", "{end:?}");
    // Alive (or a zombie not yet reaped by init) until the agent releases the run.
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
    };
    wait_for("the process left behind is killed", || gone(left)).await;
    // Gone: its pid may be another process's by now.
    std::mem::forget(left_guard);
    for dir in &dirs {
        wait_for("the job's cgroups are removed", || !dir.exists()).await;
    }
    drop(agent);
    server.abort();
    remove_agent_cgroups("a05");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_scratch_is_private_to_it() {
    if !privileged("jobfs mounts need root") {
        return;
    }
    let NobodysAgent {
        dir: _dir,
        leader,
        server,
        agent,
        state,
        work,
        ..
    } = nobodys_agent("a04", &[]).await;
    let mut l = launch_as_nobody(
        41,
        &work,
        "#!/bin/sh\necho secret > \"$TMPDIR/secret\"\necho \"jobfs=$TMPDIR\"\nsleep 60\n",
        &[],
    );
    l.jobfs_mib = 16;
    leader.send(pb::instruction::Kind::Launch(l)).await;
    let out = work.join("slurm-41.out");
    wait_for("the job's scratch", || {
        std::fs::read_to_string(&out).is_ok_and(|o| o.contains("jobfs="))
    })
    .await;
    let mount = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("jobfs="))
        .unwrap()
        .to_owned();
    let meta = std::fs::metadata(&mount).unwrap();
    assert_eq!(meta.uid(), nobody().uid.as_raw(), "{mount}");
    assert_eq!(meta.mode() & 0o7777, 0o700, "{mount}");
    let images = state.join("jobfs/.images");
    assert_eq!(std::fs::metadata(&images).unwrap().mode() & 0o7777, 0o700);
    let image = images.join("41.1.img");
    let image_meta = std::fs::metadata(&image).unwrap();
    assert_eq!((image_meta.mode() & 0o7777, image_meta.uid()), (0o600, 0));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mount.as_str()))
        .unwrap();
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    // Another unprivileged user can read neither the scratch nor its image.
    let daemon = nix::unistd::User::from_name("daemon").unwrap().unwrap();
    for probe in [
        vec!["cat".to_owned(), format!("{mount}/secret")],
        vec!["ls".to_owned(), mount.clone()],
        vec!["cat".to_owned(), image.display().to_string()],
    ] {
        let got = std::process::Command::new(&probe[0])
            .args(&probe[1..])
            .uid(daemon.uid.as_raw())
            .gid(daemon.gid.as_raw())
            .output()
            .unwrap();
        assert!(!got.status.success(), "{probe:?} as daemon: {got:?}");
    }
    leader
        .send(pb::instruction::Kind::Kill(control(41, 1)))
        .await;
    let (_, end) = leader.ended(41).await;
    assert_eq!(cause(&end), "cancelled", "{end:?}");
    drop(agent);
    server.abort();
    remove_agent_cgroups("a04");
}

struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use std::os::unix::process::CommandExt;

/// A user who could rename a directory above the agent's state or runtime directory could
/// swap the tree root writes in (the jobs' scripts, the runs' records): the agent refuses to
/// start there, and writes nothing.
#[test]
fn the_agent_refuses_a_state_or_runtime_directory_a_user_could_replace() {
    if !privileged("the agent runs as root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let theirs = user_dir(dir.path(), "theirs", &nobody());
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ours = dir.path().join("ours");
    for (flag, state, runtime) in [
        ("--state-dir", theirs.join("state"), ours.join("run")),
        ("--runtime-dir", ours.join("state"), theirs.join("run")),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_docket-nodeagent"))
            .args(["run", "--node", "n31", "--controllers", "127.0.0.1:9"])
            .args(["--cpus", "1", "--memory-mib", "64"])
            .arg("--state-dir")
            .arg(&state)
            .arg("--runtime-dir")
            .arg(&runtime)
            .args(tls_flags("n31"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: the agent started: {err}");
        assert!(
            err.contains(flag) && err.contains(&format!("uid {}", nobody().uid)),
            "{flag}: {err}"
        );
        assert!(
            !state.exists() && !runtime.exists(),
            "{flag}: the agent wrote something"
        );
    }
}
