//! The job's world: its output file names (Slurm's patterns) and its environment (the
//! `DOCKET_*`, Slurm and PBS variables users' scripts read). Pure functions of the launch
//! instruction, so they are tested without running anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use docket_proto::v1::Launch;

/// Slurm's step id of a batch script (`SLURM_BATCH_SCRIPT`, 0xfffffffb), what `%s` and `%J`
/// print in a batch job's file names.
const BATCH_STEP: u32 = 0xffff_fffb;

/// Expands a Slurm output pattern as slurmd does for a batch script: `%j` job id, `%J`
/// `jobid.stepid` (the batch step's id, as Slurm prints it), `%s` step id, `%A` array job
/// id, `%a` array index, `%x` job name, `%u` user, `%N` short host name, `%n` node index and
/// `%t` task id (0: the script runs once, on the first node), `%%` a percent sign. Unknown
/// tokens stay as they are. A relative result is relative to the job's working directory.
pub fn expand_pattern(pattern: &str, launch: &Launch, node: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('j') => out.push_str(&launch.job_id.to_string()),
            Some('J') => out.push_str(&format!("{}.{BATCH_STEP}", launch.job_id)),
            Some('s') => out.push_str(&BATCH_STEP.to_string()),
            Some('n' | 't') => out.push('0'),
            Some('A') => out.push_str(&launch.array_job_id.unwrap_or(launch.job_id).to_string()),
            Some('a') => match launch.array_task_id {
                Some(i) => out.push_str(&i.to_string()),
                None => out.push_str("4294967294"),
            },
            Some('x') => out.push_str(&launch.name),
            Some('u') => out.push_str(&launch.user),
            Some('N') => out.push_str(node.split('.').next().unwrap_or(node)),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Where stdout and stderr go: the job's patterns, or Slurm's defaults (`slurm-%j.out`, and
/// `slurm-%A_%a.out` for array tasks), stderr joining stdout when not given.
pub fn output_paths(launch: &Launch, node: &str) -> (PathBuf, PathBuf) {
    let default = if launch.array_task_id.is_some() {
        "slurm-%A_%a.out"
    } else {
        "slurm-%j.out"
    };
    let out_pattern = if launch.stdout.is_empty() {
        default
    } else {
        &launch.stdout
    };
    let err_pattern = if launch.stderr.is_empty() {
        out_pattern
    } else {
        &launch.stderr
    };
    let resolve = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            Path::new(&launch.work_dir).join(p)
        }
    };
    (
        resolve(expand_pattern(out_pattern, launch, node)),
        resolve(expand_pattern(err_pattern, launch, node)),
    )
}

/// Who the job runs as, for the environment.
#[derive(Debug, Clone)]
pub struct Identity {
    pub user: String,
    pub home: String,
    pub shell: String,
}

/// The job's environment: its exported variables (if any) first, then what the scheduler
/// sets, which wins. `nodefile` is PBS's node file, `jobfs` the job's scratch directory.
pub fn environment(
    launch: &Launch,
    node: &str,
    who: &Identity,
    nodefile: &Path,
    jobfs: Option<&Path>,
    cluster: &str,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if let Some(exported) = &launch.environment {
        env.extend(crate::shim::decode_environment(exported));
    } else {
        env.insert(
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
        );
    }
    let id = launch.job_id.to_string();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("HOME", who.home.clone());
    set("USER", who.user.clone());
    set("LOGNAME", who.user.clone());
    set("SHELL", who.shell.clone());
    // Docket's own.
    set("DOCKET_JOB_ID", id.clone());
    set("DOCKET_JOB_NAME", launch.name.clone());
    set("DOCKET_JOB_NODELIST", launch.node_list.clone());
    set("DOCKET_CPUS_ON_NODE", launch.cpus.to_string());
    set("DOCKET_SUBMIT_DIR", launch.submit_host_dir.clone());
    set("DOCKET_EPOCH", launch.epoch.to_string());
    // Slurm's.
    set("SLURM_JOB_ID", id.clone());
    set("SLURM_JOBID", id.clone());
    set("SLURM_JOB_NAME", launch.name.clone());
    set("SLURM_JOB_NODELIST", launch.node_list.clone());
    set("SLURM_NODELIST", launch.node_list.clone());
    set("SLURM_JOB_NUM_NODES", launch.node_count.to_string());
    set("SLURM_NNODES", launch.node_count.to_string());
    set("SLURM_CPUS_ON_NODE", launch.cpus.to_string());
    set("SLURM_NTASKS", launch.ntasks.to_string());
    set("SLURM_NPROCS", launch.ntasks.to_string());
    if !launch.tasks_per_node.is_empty() {
        set("SLURM_TASKS_PER_NODE", launch.tasks_per_node.clone());
    }
    set("SLURM_CPUS_PER_TASK", launch.cpus_per_task.to_string());
    set("SLURM_MEM_PER_NODE", launch.memory_mib.to_string());
    set("SLURM_SUBMIT_DIR", launch.submit_host_dir.clone());
    set("SLURM_JOB_PARTITION", launch.partition.clone());
    set("SLURM_JOB_ACCOUNT", launch.account.clone());
    set("SLURM_JOB_USER", launch.user.clone());
    set("SLURM_CLUSTER_NAME", cluster.to_owned());
    set("SLURMD_NODENAME", node.to_owned());
    set("SLURM_PROCID", "0".into());
    set("SLURM_LOCALID", "0".into());
    set("SLURM_NODEID", "0".into());
    if let (Some(array), Some(task)) = (launch.array_job_id, launch.array_task_id) {
        set("SLURM_ARRAY_JOB_ID", array.to_string());
        set("SLURM_ARRAY_TASK_ID", task.to_string());
        set("PBS_ARRAY_INDEX", task.to_string());
        set("PBS_ARRAY_ID", array.to_string());
    }
    // PBS's.
    set("PBS_JOBID", id);
    set("PBS_JOBNAME", launch.name.clone());
    set("PBS_O_WORKDIR", launch.submit_host_dir.clone());
    set("PBS_QUEUE", launch.partition.clone());
    set("PBS_NODEFILE", nodefile.display().to_string());
    set("PBS_ENVIRONMENT", "PBS_BATCH".into());
    set("PBS_O_HOST", node.to_owned());
    if let Some(dir) = jobfs {
        let dir = dir.display().to_string();
        set("TMPDIR", dir.clone());
        set("PBS_JOBFS", dir.clone());
        set("DOCKET_JOBFS", dir);
    }
    env
}

/// PBS's node file: one line per cpu slot on each node. Only this node's slots are known
/// here (the batch script runs on the first node).
pub fn nodefile_contents(launch: &Launch, node: &str) -> String {
    let mut s = String::new();
    for _ in 0..launch.cpus.max(1) {
        s.push_str(node);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            job_id: 42,
            epoch: 3,
            name: "sim".into(),
            user: "alice".into(),
            work_dir: "/home/alice/run".into(),
            node_list: "n[01-02]".into(),
            node_count: 2,
            cpus: 4,
            ntasks: 8,
            cpus_per_task: 1,
            ..Default::default()
        }
    }

    #[test]
    fn patterns_expand_like_slurms() {
        let mut l = launch();
        assert_eq!(
            expand_pattern("out-%j-%x-%u-%N-%%.log", &l, "n01.cluster"),
            "out-42-sim-alice-n01-%.log"
        );
        l.array_job_id = Some(40);
        l.array_task_id = Some(7);
        assert_eq!(expand_pattern("%A_%a", &l, "n01"), "40_7");
        // dask-jobqueue's `-e worker-%J.err`: Slurm prints the batch step's id.
        assert_eq!(
            expand_pattern("worker-%J.err %s %n %t", &l, "n01"),
            "worker-42.4294967291.err 4294967291 0 0"
        );
        assert_eq!(expand_pattern("%q%", &l, "n01"), "%q%");
    }

    #[test]
    fn default_output_goes_to_the_working_directory() {
        let mut l = launch();
        let (out, err) = output_paths(&l, "n01");
        assert_eq!(out, PathBuf::from("/home/alice/run/slurm-42.out"));
        assert_eq!(err, out);
        l.stdout = "/tmp/%j.o".into();
        l.stderr = "e/%j.e".into();
        let (out, err) = output_paths(&l, "n01");
        assert_eq!(out, PathBuf::from("/tmp/42.o"));
        assert_eq!(err, PathBuf::from("/home/alice/run/e/42.e"));
        l.stdout.clear();
        l.array_job_id = Some(40);
        l.array_task_id = Some(2);
        assert_eq!(
            output_paths(&l, "n01").0,
            PathBuf::from("/home/alice/run/slurm-40_2.out")
        );
    }

    #[test]
    fn the_environment_speaks_slurm_and_pbs_and_the_scheduler_wins() {
        let mut l = launch();
        l.environment = Some(b"FOO=bar\0SLURM_JOB_ID=999\0PATH=/opt/bin".to_vec());
        let who = Identity {
            user: "alice".into(),
            home: "/home/alice".into(),
            shell: "/bin/bash".into(),
        };
        let env = environment(
            &l,
            "n01",
            &who,
            Path::new("/var/nodefile"),
            Some(Path::new("/jobfs/42")),
            "c1",
        );
        assert_eq!(env["FOO"], "bar");
        assert_eq!(env["PATH"], "/opt/bin");
        assert_eq!(env["SLURM_JOB_ID"], "42");
        assert_eq!(env["SLURM_JOB_NODELIST"], "n[01-02]");
        assert_eq!(env["SLURM_CPUS_ON_NODE"], "4");
        assert_eq!(env["PBS_JOBID"], "42");
        assert_eq!(env["PBS_NODEFILE"], "/var/nodefile");
        assert_eq!(env["TMPDIR"], "/jobfs/42");
        assert_eq!(env["PBS_JOBFS"], "/jobfs/42");
        assert_eq!(env["HOME"], "/home/alice");
        assert!(!env.contains_key("SLURM_ARRAY_TASK_ID"));
        assert_eq!(nodefile_contents(&l, "n01"), "n01\nn01\nn01\nn01\n");
    }
}
