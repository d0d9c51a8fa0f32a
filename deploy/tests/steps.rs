//! Job steps for real: a two-node job submitted by an unprivileged user (`nobody`) on a
//! `docket-local` cluster (three controllers, two real agents) runs `srun` in its script the
//! way launchers write it. The tasks start on both nodes with Slurm's step variables, each
//! in a step cgroup under the job's; output comes back labelled or into `-o` pattern files;
//! stdin reaches task 0; srun's exit code is the highest task's; a step's time limit, a
//! task left behind by its step, and `scancel JOBID.STEP` all end what they should.
//!
//! Then the agents' step port is attacked with what every user of the cluster has (the CA
//! certificate): launching tasks of a step without its secret is refused, and so is an
//! oversized launch, each with a message naming what was wrong.
//!
//! And the Python tools that drive Slurm and PBS through their commands run unchanged:
//! submitit, and dask-jobqueue with both dialects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use docket_proto::v1 as pb;

fn bin_dir() -> PathBuf {
    docket_deploy::testing::bin_dir(
        env!("CARGO_BIN_EXE_docket-local"),
        &[
            "docket-controller",
            "docket-nodeagent",
            "docket-authd",
            "docket",
        ],
    )
}

fn local(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_docket-local"))
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .output()
        .unwrap()
}

use docket_deploy::testing::output_text as text;

/// The job script: one srun per line of what the issue asks of steps, each followed by its
/// exit code so the test reads them from the job's output.
const SCRIPT: &str = r#"#!/bin/sh
srun -l sh -c 'echo "vars task=$SLURM_PROCID local=$SLURM_LOCALID node=$SLURM_NODEID ntasks=$SLURM_NTASKS nnodes=$SLURM_NNODES step=$SLURM_STEP_ID nodes=$SLURM_STEP_NODELIST tasks=$SLURM_STEP_NUM_TASKS tpn=$SLURM_TASKS_PER_NODE"; if grep -q "/job_${SLURM_JOB_ID}_[0-9]*/step_${SLURM_STEP_ID}\$" /proc/self/cgroup; then echo cgroup=step; else echo cgroup=other; fi'
echo "step0=$?"
srun sh -c 'exit $((SLURM_PROCID + 3))'
echo "step1=$?"
echo piped-in | srun -n 1 cat
echo "step2=$?"
srun -o 'task-%t-%N-%j.%s.out' sh -c 'echo "file $SLURM_PROCID $SLURM_NODEID"'
echo "step3=$?"
srun -n 1 -t 0:02 sleep 60
echo "step4=$?"
srun -n 1 sh -c 'sleep 300 & echo $! > orphan.pid; exit 0'
echo "step5=$?"
sleep 1
pid=$(cat orphan.pid)
if [ -e /proc/$pid ] && ! grep -q '^State:.*Z' /proc/$pid/status 2>/dev/null; then
  echo orphan=alive
else
  echo orphan=gone
fi
srun -n 1 sleep 300 &
sleep 3
scancel "$SLURM_JOB_ID.6"
wait $!
echo "step6=$?"
echo to-all | srun -l cat
echo "step7=$?"
"#;

/// A cluster started for one test, and a work directory owned by `nobody`.
struct Site {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    nobody: nix::unistd::User,
}

impl Site {
    /// Root for real, or None after printing why (a failure under DOCKET_REQUIRE_PRIVILEGED).
    fn start(replicas: u32) -> Option<Site> {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
                "DOCKET_REQUIRE_PRIVILEGED is set but this test runs without root"
            );
            eprintln!("skipped: real agents confine steps in cgroups, which needs root");
            return None;
        }
        let bins = bin_dir();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let state = dir.path().join("cluster");
        let o = local(
            &state,
            &[
                "up",
                "--replicas",
                &replicas.to_string(),
                "--agents",
                "2",
                "--bin-dir",
                bins.to_str().unwrap(),
            ],
        );
        let out = text(&o);
        if !o.status.success() {
            let _ = local(&state, &["down"]);
            panic!("{out}");
        }
        let env: Vec<(String, String)> = out
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| *k != "PATH")
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert!(env.iter().any(|(k, _)| k == "DOCKET_ADDR"), "{out}");
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        let site = Site { dir, env, nobody };
        std::fs::create_dir(site.work()).unwrap();
        site.give(&site.work());
        Some(site)
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("cluster")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Hands `path` to nobody.
    fn give(&self, path: &Path) {
        std::os::unix::fs::chown(
            path,
            Some(self.nobody.uid.as_raw()),
            Some(self.nobody.gid.as_raw()),
        )
        .unwrap();
    }

    /// Writes `name` in the work directory, nobody's.
    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.work().join(name);
        std::fs::write(&path, content).unwrap();
        self.give(&path);
        path
    }

    /// `sbatch args` as nobody in the work directory, with the cluster's commands first on
    /// PATH (the job inherits it, and finds srun there); 180 s at most.
    fn sbatch(&self, args: &[&str]) -> Output {
        self.command("sbatch", args)
    }

    /// One of the cluster's commands (`srun`, `salloc`, ...) run so.
    fn command(&self, name: &str, args: &[&str]) -> Output {
        self.user_command(name, args).output().unwrap()
    }

    /// The command line of one of the cluster's commands as nobody, in the work directory,
    /// standard input closed, 180 s at most (to spawn with other streams).
    fn user_command(&self, name: &str, args: &[&str]) -> Command {
        let path = format!("{}:/usr/bin:/bin", self.state().join("bin").display());
        let mut cmd = Command::new("/usr/bin/timeout");
        cmd.args(["180", self.state().join("bin").join(name).to_str().unwrap()])
            .args(args)
            .current_dir(self.work())
            .env_clear()
            .env("PATH", &path)
            .env("HOME", "/nonexistent")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .uid(self.nobody.uid.as_raw())
            .gid(self.nobody.gid.as_raw())
            .stdin(Stdio::null());
        cmd
    }

    /// Writes `driver` as `name/drive.py` under the site's directory and runs it with the
    /// Python of the tools from PyPI, as root (the virtual environment is root's), there,
    /// `seconds` at most, with the cluster's commands on PATH: its output, also printed.
    fn python(
        &self,
        python: &OsStr,
        name: &str,
        driver: &str,
        seconds: u32,
        args: &[&OsStr],
    ) -> Output {
        let folder = self.dir.path().join(name);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("drive.py"), driver).unwrap();
        let path = format!("{}:/usr/bin:/bin", self.state().join("bin").display());
        let o = Command::new("/usr/bin/timeout")
            .arg(seconds.to_string())
            .arg(python)
            .arg(folder.join("drive.py"))
            .args(args)
            .current_dir(&folder)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        println!("{}", text(&o));
        o
    }

    /// `sbatch --parsable args`, which must succeed: the job's id.
    fn submit(&self, args: &[&str]) -> String {
        let mut all = vec!["--parsable"];
        all.extend_from_slice(args);
        let o = self.sbatch(&all);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    /// Waits (90 s at most) until every file of `names` exists in the work directory: the
    /// tasks that touch them have started. `why` says what is missing otherwise.
    fn wait_for_files(&self, names: &[&str], why: impl Fn() -> String) {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while !names.iter().all(|f| self.work().join(f).exists()) {
            assert!(std::time::Instant::now() < deadline, "{}", why());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `sacct -n -P -j job -o JobID,State,ExitCode` once the job has COMPLETED (120 s at
    /// most; `why` adds to the failure).
    fn sacct_until_completed(&self, job: &str, why: impl Fn() -> String) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let out = text(&self.command(
                "sacct",
                &["-n", "-P", "-j", job, "-o", "JobID,State,ExitCode"],
            ));
            if out
                .lines()
                .next()
                .is_some_and(|l| l.contains("|COMPLETED|"))
            {
                return out;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "job {job} did not end: {out}\n{}",
                why()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// `sacct args` once nothing it lists is still running or completing (60 s at most).
    fn sacct_settled(&self, args: &[&str]) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let out = text(&self.command("sacct", args));
            let busy = ["|COMPLETING|", "|RUNNING|", "|PENDING|"];
            if !busy.iter().any(|b| out.contains(b)) || std::time::Instant::now() > deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `sbatch --parsable --wait args`: the job's id and its output file (`-o out`), after
    /// checking that it completed.
    fn run(&self, args: &[&str], out: &str) -> (String, String) {
        let mut all = vec!["--parsable", "--wait", "-o", out];
        all.extend_from_slice(args);
        let submit = self.sbatch(&all);
        let job_out = std::fs::read_to_string(self.work().join(out)).unwrap_or_default();
        assert!(
            submit.status.success(),
            "sbatch --wait: {}\njob output:\n{job_out}\n{}",
            text(&submit),
            text(&local(&self.state(), &["logs", "-n", "40"]))
        );
        let job = String::from_utf8_lossy(&submit.stdout).trim().to_owned();
        println!("job {job} output:\n{job_out}");
        (job, job_out)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = local(&self.state(), &["down"]);
    }
}

#[test]
fn srun_runs_steps_across_the_allocation_and_the_step_port_refuses_strangers() {
    let Some(site) = Site::start(3) else {
        return;
    };
    let (state, work) = (site.state(), site.work());
    site.write("steps.sh", SCRIPT);
    let (job, job_out) = site.run(&["-N", "2", "-n", "2", "-t", "5", "steps.sh"], "job.out");

    // Step 0: both nodes, one task each, labelled, with Slurm's variables, in step cgroups.
    step0_ran_on_both_nodes_in_step_cgroups(&state, &job_out);
    // Step 1: the highest task exit code, and Slurm's report of each failed task.
    assert!(job_out.contains("step1=4\n"), "{job_out}");
    assert!(
        job_out.contains("task 1: Exited with exit code 4"),
        "{job_out}"
    );
    // Step 2: stdin reaches task 0.
    assert!(job_out.contains("piped-in\nstep2=0\n"), "{job_out}");
    // Step 3: -o patterns, one file per task.
    step3_wrote_one_file_per_task_as_the_user(&site, &job, &job_out);
    // Step 4: the step's time limit ends it, and srun says it failed.
    let step4 = line_value(&job_out, "step4=");
    assert_ne!(step4, "0", "{job_out}");
    // Step 5: a task that outlives its step is killed with it.
    assert!(job_out.contains("step5=0\n"), "{job_out}");
    assert!(job_out.contains("orphan=gone"), "{job_out}");
    // Step 6: scancel JOBID.6 ends srun with a failure.
    assert_ne!(line_value(&job_out, "step6="), "0", "{job_out}");
    // Step 7: srun's standard input reaches every task, as Slurm's default --input=all.
    for task in [0, 1] {
        let line = format!("{task}: to-all\n");
        assert!(job_out.contains(&line), "missing {line:?} in\n{job_out}");
    }
    assert!(job_out.contains("step7=0\n"), "{job_out}");
    // sacct: the allocation, the batch script and every step, each with its own outcome.
    sacct_lists_every_step_with_its_outcome(&site, &job);

    // A second job whose step stays up on both nodes, for the attacks.
    let live = start_a_live_two_node_step(&site);
    attack_the_step_port(&state, &live);
    // Nothing the attacks did ended the step: both tasks still run.
    let live_out = std::fs::read_to_string(work.join("live.out")).unwrap_or_default();
    assert!(live_out.is_empty(), "{live_out}");
    let o = site.command("scancel", &[&live]);
    assert!(o.status.success(), "{}", text(&o));

    interactive_allocations(&site);
    terminals(&site);
    pbs_interactive_and_pbsdsh(&site);
    steps_across_an_agent_restart(&site);
    steps_survive_a_failover(&site);
    flood_the_step_port(&state);
}

/// Step 0 of [`SCRIPT`]: a labelled task on each node with Slurm's step variables, each in
/// its step's cgroup.
fn step0_ran_on_both_nodes_in_step_cgroups(state: &Path, job_out: &str) {
    for task in [0, 1] {
        let line = format!(
            "{task}: vars task={task} local=0 node={task} ntasks=2 nnodes=2 step=0 \
             nodes=n[01-02] tasks=2 tpn=1(x2)"
        );
        assert!(
            job_out.contains(&line),
            "missing {line:?} in\n{job_out}\n{}",
            text(&local(state, &["logs", "-n", "80"]))
        );
        assert!(
            job_out.contains(&format!("{task}: cgroup=step")),
            "task {task} is not in its step cgroup:\n{job_out}"
        );
    }
    assert!(job_out.contains("step0=0\n"), "{job_out}");
}

/// Step 3 of [`SCRIPT`]: `-o` patterns expanded into one file per task, written as the user.
fn step3_wrote_one_file_per_task_as_the_user(site: &Site, job: &str, job_out: &str) {
    assert!(job_out.contains("step3=0\n"), "{job_out}");
    for (task, node) in [(0, "n01"), (1, "n02")] {
        let file = site.work().join(format!("task-{task}-{node}-{job}.3.out"));
        let content = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}\n{job_out}", file.display()));
        assert_eq!(content, format!("file {task} {task}\n"));
        let meta = std::fs::metadata(&file).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.uid(), site.nobody.uid.as_raw(), "written as the user");
    }
}

/// `sacct -j job`: the allocation, the batch script and each step of [`SCRIPT`], each with
/// its node count, state and exit code.
fn sacct_lists_every_step_with_its_outcome(site: &Site, job: &str) {
    let o = site.command(
        "sacct",
        &[
            "-P",
            "-n",
            "-j",
            job,
            "-o",
            "JobID,JobName,NNodes,State,ExitCode",
        ],
    );
    let out = text(&o);
    let expected = [
        format!("{job}|steps.sh|2|COMPLETED|0:0"),
        format!("{job}.batch|batch|1|COMPLETED|0:0"),
        format!("{job}.0|sh|2|COMPLETED|0:0"),
        format!("{job}.1|sh|2|FAILED|4:0"),
        format!("{job}.2|cat|1|COMPLETED|0:0"),
        format!("{job}.3|sh|2|COMPLETED|0:0"),
        format!("{job}.4|sleep|1|TIMEOUT|"),
        format!("{job}.5|sh|1|COMPLETED|0:0"),
        format!("{job}.6|sleep|1|CANCELLED|"),
        format!("{job}.7|cat|2|COMPLETED|0:0"),
    ];
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{out}");
    for (line, want) in lines.iter().zip(&expected) {
        assert!(
            line.starts_with(want.as_str()),
            "{want:?} expected in\n{out}"
        );
    }
}

/// Submits a two-node job whose step 0 sleeps on both nodes, waits until both tasks run,
/// and checks that `squeue -s` lists the step on both nodes; the job's id.
fn start_a_live_two_node_step(site: &Site) -> String {
    let live = site.submit(&[
        "-N",
        "2",
        "-n",
        "2",
        "-t",
        "5",
        "-o",
        "live.out",
        "--wrap",
        "srun sh -c 'touch up.$SLURM_PROCID; exec sleep 300'",
    ]);
    site.wait_for_files(&["up.0", "up.1"], || {
        format!(
            "the live step never started: {}",
            std::fs::read_to_string(site.work().join("live.out")).unwrap_or_default()
        )
    });
    // squeue -s lists the running step on both nodes.
    let o = site.command("squeue", &["-s"]);
    let out = text(&o);
    assert!(
        out.starts_with("         STEPID     NAME PARTITION     USER      TIME NODELIST\n"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with(&format!("{live}.0 ")) && l.ends_with(" n[01-02]")),
        "{out}"
    );
    live
}

fn line_value<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in\n{out}"))
}

/// The agents' step addresses and names, from the cluster record.
fn agents(state: &Path) -> Vec<(String, String)> {
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("cluster.json")).unwrap())
            .unwrap();
    record["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| {
            Some((
                a["spec"]["name"].as_str()?.to_owned(),
                a["step_address"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// With only what every user has (the CA certificate), the step port of an agent refuses a
/// launch into the running step 0 of `job` without its secret, refuses an absurd launch
/// naming the field and its limit, and answers bytes that are no message as the caller's
/// error (not as a fault of its own).
fn attack_the_step_port(state: &Path, job: &str) {
    let agents = agents(state);
    assert_eq!(agents.len(), 2, "{agents:?}");
    let job_id: u64 = job.parse().unwrap();
    let tls = ca_only(state);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for (node, addr) in &agents {
            let launch = |secret: Vec<u8>, argv: Vec<String>| pb::StepInput {
                kind: Some(pb::step_input::Kind::Launch(pb::LaunchTasks {
                    job_id,
                    step_id: 0,
                    secret,
                    argv,
                    ..Default::default()
                })),
            };
            // The live step, a guessed secret: refused.
            let status = attach(addr, node, &tls, launch(vec![7; 32], vec!["id".into()]))
                .await
                .unwrap_err();
            assert_eq!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{node}: {status:?}"
            );
            // An argv of a million arguments: refused before any grant is looked at.
            let huge = vec!["x".to_owned(); 1_000_000];
            let status = attach(addr, node, &tls, launch(vec![7; 32], huge))
                .await
                .unwrap_err();
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{node}: {status:?}"
            );
            assert!(status.message().contains("argv"), "{status:?}");
            // Bytes that decode to no StepInput: INVALID_ARGUMENT, and the port goes on.
            let status = attach_raw(addr, node, &tls, vec![0xff; 16]).await;
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{node}: {status:?}"
            );
            let status = attach(addr, node, &tls, launch(vec![7; 32], vec!["id".into()]))
                .await
                .unwrap_err();
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{node}");
        }
    });
}

/// One Attach call whose first message is `bytes` as they are; how it was refused.
async fn attach_raw(
    addr: &str,
    node: &str,
    tls: &docket_auth::tls::TlsContext,
    bytes: Vec<u8>,
) -> tonic::Status {
    let channel =
        docket_auth::tls::connect::node_channel(addr, node, tls, Duration::from_secs(5)).unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let call = grpc.streaming(
        tonic::Request::new(tokio_stream::iter(vec![bytes])),
        tonic::codegen::http::uri::PathAndQuery::from_static("/docket.v1.StepIo/Attach"),
        docket_proto::raw::RawCodec,
    );
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(response)) => {
            let mut stream = response.into_inner();
            match stream.message().await {
                Err(status) => status,
                Ok(answer) => panic!("{node} answered bytes that are no message: {answer:?}"),
            }
        }
        Ok(Err(status)) => status,
        Err(_) => panic!("{node} did not answer in 10 s"),
    }
}

/// One Attach call carrying `first`; the agent's first answer, or its refusal.
async fn attach(
    addr: &str,
    node: &str,
    tls: &docket_auth::tls::TlsContext,
    first: pb::StepInput,
) -> Result<pb::StepOutput, tonic::Status> {
    let channel =
        docket_auth::tls::connect::node_channel(addr, node, tls, Duration::from_secs(5)).unwrap();
    let mut client =
        pb::step_io_client::StepIoClient::new(channel).max_encoding_message_size(64 << 20);
    let input = tokio_stream::iter(vec![first]);
    let mut stream = client.attach(input).await?.into_inner();
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Ok(Ok(Some(m))) => Ok(m),
        Ok(Ok(None)) => Err(tonic::Status::unknown("stream ended with no answer")),
        Ok(Err(s)) => Err(s),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer in 10 s")),
    }
}

/// An MPI program across the allocation's two nodes, as users run one: MPICH's `mpiexec`
/// inside the batch script finds the allocation in Slurm's variables and starts its proxy
/// on each node with `srun --input none`; the ranks reduce over TCP between the proxies.
/// MPICH's Hydra and Open MPI's mpirun, as Debian packages them, inside a two-node job:
/// each starts its daemons on both nodes with srun, and the ranks reduce across them.
#[test]
fn mpich_and_open_mpi_run_ranks_on_both_nodes_through_srun() {
    let have = |compiler: &str| {
        Command::new(compiler)
            .arg("-show")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(have("mpicc.mpich") && have("mpicc.openmpi")) {
        assert!(
            std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
            "mpicc.mpich or mpicc.openmpi is missing (the test command installs Debian's \
             mpich, libmpich-dev, openmpi-bin and libopenmpi-dev)"
        );
        eprintln!("skipped: Debian's MPICH and Open MPI are not both installed");
        return;
    }
    let Some(site) = Site::start(1) else {
        return;
    };
    let source = site.write("hello.c", MPI_HELLO);
    // The two agents share this host, where Open MPI's shared-memory transport would take
    // them for one node: its ranks talk TCP over loopback instead (a real cluster needs
    // none of this).
    let open_mpi = "export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo \
                    OMPI_MCA_oob_tcp_if_include=lo\nmpirun.openmpi -n 4 ./hello.openmpi";
    for (mpi, launch) in [
        ("mpich", "mpiexec.mpich -n 4 ./hello.mpich"),
        ("openmpi", open_mpi),
    ] {
        let program = site.work().join(format!("hello.{mpi}"));
        let o = Command::new(format!("mpicc.{mpi}"))
            .arg("-o")
            .arg(&program)
            .arg(&source)
            .output()
            .unwrap();
        assert!(o.status.success(), "mpicc.{mpi}: {}", text(&o));
        site.give(&program);
        site.write(
            &format!("{mpi}.sh"),
            &format!("#!/bin/sh\necho \"tasks per node $SLURM_TASKS_PER_NODE\"\n{launch} | sort\n"),
        );
        let (_, out) = site.run(
            &["-N", "2", "-n", "4", "-t", "5", &format!("{mpi}.sh")],
            &format!("{mpi}.out"),
        );
        assert!(out.contains("tasks per node 2(x2)\n"), "{mpi}: {out}");
        for rank in 0..4 {
            let line = format!("rank {rank} of 4 on node {} sum 6\n", rank / 2);
            assert!(out.contains(&line), "{mpi}: missing {line:?} in\n{out}");
        }
    }
}

/// Each rank names its node (SLURM_NODEID, from the proxy srun started there) and the sum of
/// all ranks, which only a working MPI_Allreduce across both nodes gives.
const MPI_HELLO: &str = r#"#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *node = getenv("SLURM_NODEID");
    printf("rank %d of %d on node %s sum %d\n", rank, size, node ? node : "?", sum);
    MPI_Finalize();
    return 0;
}
"#;

/// srun outside a job asks for an allocation of its step's shape and completes it with the
/// step's status; salloc runs its command here with the allocation's variables, srun inside
/// it starts tasks on the allocated nodes, and the allocation ends with the command's status.
fn interactive_allocations(site: &Site) {
    let o = site.command(
        "srun",
        &[
            "-N",
            "2",
            "-n",
            "4",
            "-l",
            "sh",
            "-c",
            "echo node=$SLURM_NODEID",
        ],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for (task, node) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        assert!(out.contains(&format!("{task}: node={node}\n")), "{out}");
    }
    let o = site.command("srun", &["-n", "1", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));

    let o = site.command(
        "salloc",
        &[
            "-N",
            "2",
            "-n",
            "2",
            "-t",
            "5",
            "sh",
            "-c",
            "echo inside $SLURM_NNODES $SLURM_JOB_NODELIST; srun -l sh -c 'echo step $SLURM_STEP_ID'; exit 5",
        ],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(5), "{out}");
    for line in [
        "salloc: Granted job allocation",
        "inside 2 n[01-02]\n",
        "0: step 0\n",
        "1: step 0\n",
        "salloc: Relinquishing job allocation",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    // Accounting has each allocation ended as its command ended (once the agents have
    // stopped its holder: COMPLETING until then).
    let out = site.sacct_settled(&["-X", "-n", "-P", "-o", "JobName,State,ExitCode"]);
    for line in [
        "sh|COMPLETED|0:0",
        "sh|FAILED|7:0",
        "interactive|FAILED|5:0",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
}

/// `srun --pty`: task 0 on a terminal of its own, owned by the user, as the leader of its
/// session; what srun reads reaches it through the terminal's line discipline (a ^C becomes
/// SIGINT for its foreground job), and its size is srun's (80x24 without a terminal).
fn terminals(site: &Site) {
    use std::io::{BufRead, BufReader, Write};
    let script = "tty; [ -t 0 ] && echo stdin-is-a-terminal; stat -c owner=%U \"$(tty)\"; \
                  [ \"$(cut -d' ' -f6 /proc/$$/stat)\" = \"$$\" ] && echo session-leader; \
                  stty size; trap 'echo caught-sigint; exit 3' INT; echo ready; \
                  while :; do sleep 0.1; done";
    let mut child = site
        .user_command("srun", &["-n", "1", "--pty", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let done = line.trim_end() == "ready";
        seen.push(line.trim_end().to_owned());
        if done {
            break;
        }
    }
    // ^C typed at srun: the terminal turns it into SIGINT for the shell.
    stdin.write_all(b"\x03").unwrap();
    stdin.flush().unwrap();
    seen.extend(lines.map_while(Result::ok).map(|l| l.trim_end().to_owned()));
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let all = format!("{}\n{err}", seen.join("\n"));
    assert!(
        seen.first().is_some_and(|l| l.starts_with("/dev/pts/")),
        "{all}"
    );
    for line in [
        "stdin-is-a-terminal",
        "owner=nobody",
        "session-leader",
        "24 80",
        "ready",
        "caught-sigint",
    ] {
        // The terminal echoes the ^C just before the trap's line.
        assert!(
            seen.iter().any(|l| l == line || l == &format!("^C{line}")),
            "missing {line:?} in\n{all}"
        );
    }
    assert_eq!(status.code(), Some(3), "{all}");
    through_a_terminal(site);
}

/// `srun --pty` on a terminal, as a person runs it: the remote terminal takes srun's size
/// and follows it when it changes, a ^C typed reaches the remote shell through srun's raw
/// terminal, and srun leaves its terminal as it found it.
fn through_a_terminal(site: &Site) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut pty, pts) = pty_process::open().unwrap();
        pty.resize(pty_process::Size::new(33, 101)).unwrap();
        let before = rustix::termios::tcgetattr(&pts).unwrap();
        let script = "stty size; echo ready; read x; stty size; \
                      trap 'echo caught-sigint; exit 3' INT; echo armed; \
                      while :; do sleep 0.1; done";
        let path = format!("{}:/usr/bin:/bin", site.state().join("bin").display());
        let mut srun = pty_process::Command::new(site.state().join("bin/srun"))
            .args(["-n", "1", "--pty", "sh", "-c", script])
            .current_dir(site.work())
            .env_clear()
            .env("PATH", &path)
            .env("HOME", "/nonexistent")
            .envs(site.env.iter().map(|(k, v)| (k, v)))
            .uid(site.nobody.uid.as_raw())
            .gid(site.nobody.gid.as_raw())
            .spawn_borrowed(&pts)
            .unwrap();
        let mut seen = String::new();
        // Reads the terminal until `want` appears (30 s at most).
        async fn until(pty: &mut pty_process::Pty, seen: &mut String, want: &str) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let mut buf = [0u8; 4096];
            while !seen.contains(want) {
                match tokio::time::timeout_at(deadline, pty.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                    other => panic!("waiting for {want:?} ({other:?}) in\n{seen}"),
                }
            }
        }
        until(&mut pty, &mut seen, "ready").await;
        assert!(seen.contains("33 101"), "{seen}");
        // The window grows: the kernel tells srun (SIGWINCH), srun tells the remote terminal.
        pty.resize(pty_process::Size::new(40, 120)).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        pty.write_all(b"go\r").await.unwrap();
        until(&mut pty, &mut seen, "40 120").await;
        until(&mut pty, &mut seen, "armed").await;
        pty.write_all(b"\x03").await.unwrap();
        until(&mut pty, &mut seen, "caught-sigint").await;
        let status = tokio::time::timeout(Duration::from_secs(30), srun.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.code(), Some(3), "{seen}");
        let after = rustix::termios::tcgetattr(&pts).unwrap();
        assert_eq!(
            after.local_modes, before.local_modes,
            "srun left its terminal raw"
        );
        assert_eq!(
            after.input_modes, before.input_modes,
            "srun left its terminal raw"
        );
    });
}

/// PBS: `qsub -I` runs its command (a shell by default) on the job's node on a terminal,
/// with PBS's variables, and the job ends with its status; `pbsdsh` inside a two-node job
/// runs a copy per task slot on both nodes, one node's with `-n`, and copies in turn with
/// `-s`.
fn pbs_interactive_and_pbsdsh(site: &Site) {
    let o = site.command(
        "qsub",
        &[
            "-I",
            "-l",
            "select=1:ncpus=1,walltime=00:05:00",
            "--",
            "sh",
            "-c",
            "echo env=$PBS_ENVIRONMENT job=$PBS_JOBID; [ -t 1 ] && echo on-a-terminal; exit 4",
        ],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(4), "{out}");
    let job = out
        .lines()
        .find_map(|l| l.strip_prefix("qsub: job ")?.strip_suffix(".docket ready"))
        .unwrap_or_else(|| panic!("no ready line in\n{out}"))
        .to_owned();
    for line in [
        format!("qsub: waiting for job {job}.docket to start"),
        format!("env=PBS_INTERACTIVE job={job}"),
        "on-a-terminal".to_owned(),
        format!("qsub: job {job}.docket completed"),
    ] {
        assert!(
            out.lines().any(|l| l.trim_end() == line),
            "missing {line:?} in\n{out}"
        );
    }
    let out = site.sacct_settled(&["-n", "-P", "-j", &job, "-o", "JobID,JobName,State,ExitCode"]);
    assert_eq!(
        out,
        format!("{job}|STDIN|FAILED|4:0\n{job}.0|sh|FAILED|4:0\n"),
        "an interactive job has no batch step"
    );

    site.write(
        "dsh.sh",
        "#!/bin/sh\n\
         pbsdsh -- sh -c 'echo copy $PBS_TASKNUM on $PBS_NODENUM'\n\
         echo all=$?\n\
         pbsdsh -n 1 -- sh -c 'echo only $(hostname) $SLURMD_NODENAME'\n\
         pbsdsh -s -c 2 -- sh -c 'echo serial $SLURMD_NODENAME; exit 2'\n\
         echo serial=$?\n",
    );
    let o = site.command(
        "qsub",
        // -V: the job's PATH is this one, where pbsdsh is.
        &[
            "-V",
            "-l",
            "select=2:ncpus=1",
            "-o",
            "dsh.out",
            "-j",
            "oe",
            "dsh.sh",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let id = text(&o).trim().trim_end_matches(".docket").to_owned();
    site.sacct_until_completed(&id, || {
        std::fs::read_to_string(site.work().join("dsh.out")).unwrap_or_default()
    });
    let out = std::fs::read_to_string(site.work().join("dsh.out")).unwrap();
    for line in [
        "copy 0 on 0",
        "copy 1 on 1",
        "all=0",
        "serial n01",
        "serial n02",
        "serial=2",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("only ") && l.ends_with(" n02")),
        "{out}"
    );
}

/// An agent restarted under a running step: the step cannot go on (its srun's stream went
/// with the old process), its tasks are killed and it ends; the restarted agent re-adopts
/// the job and starts the job's next step as any other.
fn steps_across_an_agent_restart(site: &Site) {
    site.write(
        "restart.sh",
        "#!/bin/sh\n\
         srun sh -c 'touch alive.$SLURM_PROCID; exec sleep 300'\n\
         echo first=$?\n\
         srun -l sh -c 'echo again $SLURM_NODEID'\n\
         echo second=$?\n",
    );
    let job = site.submit(&[
        "-N",
        "2",
        "-n",
        "2",
        "-t",
        "5",
        "-o",
        "restart.out",
        "restart.sh",
    ]);
    let work = site.work();
    site.wait_for_files(&["alive.0", "alive.1"], || "the step never started".into());
    let mut cluster = docket_deploy::LocalCluster::open(&site.state()).unwrap();
    cluster.stop_agent("n02").unwrap();
    cluster.start_agent("n02").unwrap();
    cluster.save().unwrap();
    let out = site.sacct_until_completed(&job, || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(work.join("restart.out")).unwrap_or_default(),
            text(&local(&site.state(), &["logs", "-n", "40"]))
        )
    });
    let job_out = std::fs::read_to_string(work.join("restart.out")).unwrap_or_default();
    assert_ne!(line_value(&job_out, "first="), "0", "{job_out}");
    for line in ["0: again 0", "1: again 1", "second=0"] {
        assert!(
            job_out.lines().any(|l| l == line),
            "missing {line:?} in\n{job_out}\n{out}"
        );
    }
    let step0 = out
        .lines()
        .find(|l| l.starts_with(&format!("{job}.0|")))
        .unwrap_or_else(|| panic!("no step 0 in\n{out}"));
    assert!(
        step0.contains("|CANCELLED|") || step0.contains("|NODE_FAIL|"),
        "{out}"
    );
    assert!(out.contains(&format!("{job}.1|COMPLETED|0:0")), "{out}");
    // The restarted agent killed what the first step left on its node.
    let log = std::fs::read_to_string(site.state().join("logs/agent-n02.log")).unwrap_or_default();
    assert!(
        log.contains("ended a step left by the agent before its restart"),
        "{log}"
    );
}

/// The leader killed while a batch job's step and an interactive srun's step run: both go on
/// (srun talks to the agents for their I/O), their ends are recorded by the next leader, and
/// the interactive srun completes its allocation through it.
fn steps_survive_a_failover(site: &Site) {
    let work = site.work();
    site.write(
        "failover.sh",
        "#!/bin/sh\n\
         srun -l sh -c 'touch batch.$SLURM_PROCID; sleep 8; echo survived $SLURM_PROCID'\n\
         echo rc=$?\n",
    );
    let job = site.submit(&[
        "-N",
        "2",
        "-n",
        "2",
        "-t",
        "5",
        "-o",
        "failover.out",
        "failover.sh",
    ]);
    let interactive = site
        .user_command(
            "srun",
            &[
                "-N",
                "2",
                "-n",
                "2",
                "-l",
                "sh",
                "-c",
                "touch inter.$SLURM_PROCID; sleep 8; echo interactive $SLURM_PROCID",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    site.wait_for_files(&["batch.0", "batch.1", "inter.0", "inter.1"], || {
        "the steps never started".into()
    });
    let mut cluster = docket_deploy::LocalCluster::open(&site.state()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (leader, _) = runtime
        .block_on(cluster.wait_ready(Duration::from_secs(30)))
        .unwrap();
    cluster.kill_replica(leader).unwrap();
    let o = interactive.wait_with_output().unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for line in ["0: interactive 0", "1: interactive 1"] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    cluster.start_replica(leader, false).unwrap();
    cluster.save().unwrap();
    let out = site.sacct_until_completed(&job, String::new);
    assert!(out.contains(&format!("{job}.0|COMPLETED|0:0")), "{out}");
    let job_out = std::fs::read_to_string(work.join("failover.out")).unwrap_or_default();
    for line in ["0: survived 0", "1: survived 1", "rc=0"] {
        assert!(
            job_out.lines().any(|l| l == line),
            "missing {line:?} in\n{job_out}"
        );
    }
}

/// submitit (PyPI), as machine-learning users drive Slurm: it writes an sbatch script with
/// `--open-mode=append --wckey --signal` and an `srun --unbuffered --output ... --error ...`
/// line, polls `sacct`, and reads each task's pickled result. One single-task job and one
/// over two nodes (two tasks, SLURM_PROCID 0 and 1), run as root (the test command installs
/// the tools in a virtual environment under the target directory, which only root reaches).
#[test]
fn submitit_runs_a_job_and_a_two_node_job() {
    let Some(python) = python_tools() else {
        return;
    };
    let Some(site) = Site::start(1) else {
        return;
    };
    let logs = site.dir.path().join("submitit").join("log_%j");
    let o = site.python(
        &python,
        "submitit",
        SUBMITIT_DRIVER,
        150,
        &[logs.as_os_str()],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("single (49, '0')"), "{out}");
    assert!(out.contains("multi [(9, '0'), (9, '1')]"), "{out}");
}

/// The Python with the tools from PyPI (`DOCKET_TEST_PYTHON`, a virtual environment
/// scripts/test makes), or None after printing why (a failure under
/// DOCKET_REQUIRE_PRIVILEGED, which CI sets).
fn python_tools() -> Option<std::ffi::OsString> {
    let python = std::env::var_os("DOCKET_TEST_PYTHON");
    if python.is_none() {
        assert!(
            std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
            "DOCKET_TEST_PYTHON is unset (scripts/test installs submitit and dask-jobqueue and sets it)"
        );
        eprintln!("skipped: no DOCKET_TEST_PYTHON (scripts/test sets it)");
    }
    python
}

/// dask-jobqueue (PyPI), as notebook users get workers from a batch system: its
/// `SLURMCluster` writes `#SBATCH -J -e DIR/dask-worker-%J.err -o ... -n 1
/// --cpus-per-task --mem=954M -t` and its `PBSCluster` `#PBS -N -l select=1:ncpus=1:mem=954MB
/// -l walltime -e DIR/ -o DIR/`; each submits two workers with `sbatch`/`qsub`, reads the job
/// ids they print, and cancels them with `scancel`/`qdel` when closed. The workers connect
/// back and compute a sum; their logs land where each dialect names them. First, the checks
/// workflow managers make of a user's accounts: `sacctmgr` and `sshare -U`.
#[test]
fn dask_jobqueue_computes_on_workers_from_both_dialects() {
    let Some(python) = python_tools() else {
        return;
    };
    // Declared before the site: it sweeps after the site is down and the workers are gone.
    let _leaks = SemaphoreSweep::begin();
    let Some(site) = Site::start(1) else {
        return;
    };
    // What workflow managers ask before they submit: the user's accounts, both ways.
    let o = site.command(
        "sacctmgr",
        &[
            "-n",
            "-P",
            "show",
            "assoc",
            "where",
            "user=nobody",
            "format=account",
        ],
    );
    assert_eq!(text(&o).trim(), "demo", "{}", text(&o));
    let o = site.command("sshare", &["-U", "-u", "nobody", "-n", "-P"]);
    assert!(text(&o).starts_with("demo|nobody|"), "{}", text(&o));
    assert_eq!(text(&o).lines().count(), 1, "{}", text(&o));
    // Removing needs an administrator, as in Slurm.
    let o = site.command("sacctmgr", &["-i", "delete", "user", "nobody"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("sacctmgr: error:"), "{}", text(&o));
    let logs = site.dir.path().join("dask").join("logs");
    for dialect in ["slurm", "pbs"] {
        let o = site.python(
            &python,
            "dask",
            DASK_DRIVER,
            50,
            &[OsStr::new(dialect), logs.as_os_str()],
        );
        let out = text(&o);
        assert!(o.status.success(), "{dialect}: {out}");
        assert!(
            out.contains(&format!("{dialect} sum of squares 285")),
            "{out}"
        );
    }
    // Both workers of each ended (cancelled when the cluster closed), and their logs are
    // named as Slurm and PBS name them: `%J` is `jobid.4294967291` (Slurm's batch step),
    // and a directory gets `<name>.o<id>` / `.e<id>`.
    let mut names: Vec<String> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "dask-worker-1.4294967291.err",
            "dask-worker-1.4294967291.out",
            "dask-worker-2.4294967291.err",
            "dask-worker-2.4294967291.out",
            "dask-worker.e3",
            "dask-worker.e4",
            "dask-worker.o3",
            "dask-worker.o4",
        ],
        "{names:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = text(&site.command("squeue", &["-h", "-o", "%i %T"]));
        if left.trim().is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "workers left in the queue: {left}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes, when dropped, the POSIX semaphores (`/dev/shm/sem.mp-*`) that appeared since
/// [`SemaphoreSweep::begin`] and that no process has mapped any more.
///
/// A dask worker's `multiprocessing` names its semaphores in the host's `/dev/shm`, and its
/// resource tracker unlinks them when the worker's processes have gone. A cancelled job's
/// processes are killed together (a batch system ends the whole job), the tracker with them,
/// so the names stay behind: 5 to 18 files a run. A semaphore some process still uses
/// (another test's Python, running beside this one) is mapped by it and left alone. What
/// this cannot see: a name Python has made for a child that has not opened it yet (between
/// `Process.start` and the child's `sem_open`, when no process maps it); in this test
/// suite only the submitit test runs Python beside this one, and it leaves no semaphores.
struct SemaphoreSweep {
    before: std::collections::HashSet<std::ffi::OsString>,
}

impl SemaphoreSweep {
    const DIR: &'static str = "/dev/shm";

    fn begin() -> Self {
        SemaphoreSweep {
            before: Self::names(),
        }
    }

    fn names() -> std::collections::HashSet<std::ffi::OsString> {
        std::fs::read_dir(Self::DIR)
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.file_name()))
                    .filter(|n| n.to_string_lossy().starts_with("sem.mp-"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The inode of every file of `/dev/shm` (device `dev`) some process has mapped now. By
    /// inode, not by name: glibc's `sem_open` maps a temporary file it then links under the
    /// name, so a live semaphore's mapping names the temporary, deleted.
    fn mapped(dev: u64) -> std::collections::HashSet<u64> {
        // /proc/PID/maps writes the device as hexadecimal major:minor.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let device = format!("{major:02x}:{minor:02x}");
        let mut mapped = std::collections::HashSet::new();
        for proc in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(maps) = std::fs::read_to_string(proc.path().join("maps")) else {
                continue;
            };
            for line in maps.lines() {
                // address perms offset device inode path
                let fields: Vec<&str> = line.split_whitespace().take(5).collect();
                if let [_, _, _, d, inode] = fields[..]
                    && d == device
                    && let Ok(inode) = inode.parse()
                {
                    mapped.insert(inode);
                }
            }
        }
        mapped
    }
}

impl Drop for SemaphoreSweep {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let Ok(dir) = std::fs::metadata(Self::DIR) else {
            return;
        };
        // The new names and their files first, the mappings after: glibc maps a semaphore
        // before it links its name, so one listed here and in use is mapped by then.
        let new: Vec<(PathBuf, u64)> = Self::names()
            .difference(&self.before)
            .filter_map(|name| {
                let path = Path::new(Self::DIR).join(name);
                let m = std::fs::symlink_metadata(&path).ok()?;
                m.is_file().then(|| (path, m.ino()))
            })
            .collect();
        let mapped = Self::mapped(dir.dev());
        for (path, inode) in new {
            let unchanged = std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == inode);
            if unchanged && !mapped.contains(&inode) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Two workers, a map and a reduce; the scheduler listens on loopback, where the agents'
/// jobs reach it.
const DASK_DRIVER: &str = r#"import sys
from dask.distributed import Client
from dask_jobqueue import PBSCluster, SLURMCluster

dialect, logs = sys.argv[1], sys.argv[2]
Cluster = SLURMCluster if dialect == "slurm" else PBSCluster
with Cluster(cores=1, processes=1, memory="1GB", walltime="00:10:00", log_directory=logs,
             scheduler_options={"host": "127.0.0.1"}, death_timeout=30) as cluster:
    cluster.scale(jobs=2)
    with Client(cluster) as client:
        client.wait_for_workers(2, timeout=30)
        squares = client.map(lambda x: x * x, range(10))
        print(dialect, "sum of squares", client.submit(sum, squares).result(timeout=30), flush=True)
"#;

const SUBMITIT_DRIVER: &str = r#"import os, sys
import submitit

def work(x):
    return (x * x, os.environ.get("SLURM_PROCID"))

ex = submitit.AutoExecutor(folder=sys.argv[1], cluster="slurm")
ex.update_parameters(timeout_min=5, nodes=1, tasks_per_node=1)
print("single", ex.submit(work, 7).result(), flush=True)
ex.update_parameters(nodes=2, tasks_per_node=1)
print("multi", ex.submit(work, 3).results(), flush=True)
"#;

/// Connections that never send their launch hold a place for at most 10 s each, and only
/// `MAX_PENDING_ATTACHES` (256) of them at once: the next is refused at once, naming the
/// limit, instead of piling up. (Last: the flood's places are held for 10 s.)
fn flood_the_step_port(state: &Path) {
    let (node, addr) = agents(state).into_iter().next().unwrap();
    let tls = ca_only(state);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut held = Vec::new();
        // 16 streams per connection at most: 17 connections carry the 256 and more.
        for _ in 0..17 {
            let channel =
                docket_auth::tls::connect::node_channel(&addr, &node, &tls, Duration::from_secs(5))
                    .unwrap();
            for _ in 0..16 {
                let mut client = pb::step_io_client::StepIoClient::new(channel.clone());
                held.push(tokio::spawn(async move {
                    let _ = client
                        .attach(tokio_stream::pending::<pb::StepInput>())
                        .await;
                }));
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let launch = pb::StepInput {
            kind: Some(pb::step_input::Kind::Launch(pb::LaunchTasks {
                job_id: 1,
                step_id: 0,
                secret: vec![7; 32],
                argv: vec!["id".into()],
                ..Default::default()
            })),
        };
        let status = attach(&addr, &node, &tls, launch).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("256"), "{status:?}");
        for h in held {
            h.abort();
        }
    });
}

/// A TLS context with what every user has: the cluster's CA certificate, no identity.
fn ca_only(state: &Path) -> docket_auth::tls::TlsContext {
    docket_auth::tls::TlsContext::load(docket_auth::tls::TlsFiles {
        ca: state.join("ca.pem"),
        identity: None,
    })
    .unwrap()
}
