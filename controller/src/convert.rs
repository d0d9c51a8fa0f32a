//! Between the public protobuf messages and docket-core's types.
//!
//! Incoming: every field is checked for shape here (names, numbers that must not be
//! negative, array and dependency syntax) and the error names the field, `jobs[3].array:
//! ...`; limits that depend on state (sizes, partitions, accounts) are docket-core's, checked
//! when the command applies, with errors that name the field and the limit as well.

use std::collections::BTreeSet;
use std::str::FromStr;

use docket_core::job::array::ArraySpec;
use docket_core::job::dependency::Dependency;
use docket_core::job::spec::{
    BlobId, JobSpec, MAX_COMMENT, MemoryRequest, TimeRequest, WarnSignal,
};
use docket_core::job::{ArrayPart, Job, JobRef};
use docket_core::quantity::{MiB, Seconds, TimeMs};
use docket_core::{JobId, UserName};
use docket_proto::v1 as pb;
use smol_str::SmolStr;
use tonic::Status;

fn bad(field: &str, problem: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {problem}"))
}

fn name<T: FromStr>(field: &str, text: &str) -> Result<Option<T>, Status>
where
    T::Err: std::fmt::Display,
{
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|e| bad(field, e))
}

fn names<T: FromStr + Ord>(field: &str, texts: &[String]) -> Result<BTreeSet<T>, Status>
where
    T::Err: std::fmt::Display,
{
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| t.parse().map_err(|e| bad(&format!("{field}[{i}]"), e)))
        .collect()
}

pub(crate) fn text(field: &str, value: &str, limit: usize) -> Result<SmolStr, Status> {
    if value.len() > limit {
        return Err(bad(
            field,
            format!("{} bytes long; the limit is {limit}", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(bad(field, "contains a NUL byte"));
    }
    Ok(SmolStr::new(value))
}

/// Longest path or name text accepted (PATH_MAX).
const PATH_LIMIT: usize = 4096;

/// The distinct scripts and environments of one submission, each hashed once.
#[derive(Debug, Default)]
pub struct Blobs {
    seen: std::collections::HashSet<BlobId>,
    data: Vec<Vec<u8>>,
}

impl Blobs {
    /// Adds `data` unless an equal blob is already in; its id either way.
    pub fn add(&mut self, data: &[u8]) -> BlobId {
        let id = BlobId::of(data);
        if self.seen.insert(id) {
            self.data.push(data.to_vec());
        }
        id
    }

    pub fn into_vec(self) -> Vec<Vec<u8>> {
        self.data
    }
}

/// A submitted job as docket-core's spec, owned by `user`, with its script and environment
/// added to `blobs` (each distinct blob once). `max_array_index` bounds array indexes.
pub fn job_spec(
    index: usize,
    spec: &pb::JobSpec,
    user: UserName,
    max_array_index: u32,
    blobs: &mut Blobs,
) -> Result<JobSpec, Status> {
    let f = |field: &str| format!("jobs[{index}].{field}");
    let mut add_blob = |data: &[u8]| -> BlobId { blobs.add(data) };
    if spec.script.is_empty() {
        return Err(bad(&f("script"), "empty; a batch job needs a script"));
    }
    let memory = memory_request(spec.memory);
    let time = time_request(&f, spec.time_limit_seconds)?;
    let begin = match spec.begin_unix_ms {
        None => None,
        Some(ms) if ms < 0 => {
            return Err(bad(&f("begin_unix_ms"), format!("{ms} is before 1970")));
        }
        Some(ms) => Some(TimeMs(ms as u64)),
    };
    let array = if spec.array.is_empty() {
        None
    } else {
        Some(ArraySpec::parse(&spec.array, max_array_index).map_err(|e| bad(&f("array"), e))?)
    };
    let dependency = if spec.dependency.is_empty() {
        None
    } else {
        Some(Dependency::parse(&spec.dependency).map_err(|e| bad(&f("dependency"), e))?)
    };
    let signal = warn_signal(&f, spec.signal.as_ref())?;
    let script = add_blob(&spec.script);
    let env = spec.environment.as_deref().map(&mut add_blob);
    Ok(JobSpec {
        name: text(&f("name"), or_default(&spec.name, "job"), 256)?,
        user,
        account: name(&f("account"), &spec.account)?,
        partition: name(&f("partition"), &spec.partition)?,
        qos: name(&f("qos"), &spec.qos)?,
        nodes: spec.nodes.max(1),
        ntasks: spec.ntasks.max(1),
        cpus_per_task: spec.cpus_per_task.max(1),
        ntasks_per_node: spec.ntasks_per_node,
        memory,
        vmem: spec.vmem_mib.map(MiB),
        address_space_limit: spec.address_space_limit,
        gpus_per_node: spec.gpus_per_node,
        jobfs: spec.jobfs_mib.map(MiB),
        time,
        nice: spec.nice,
        user_factor_pct: 100,
        array,
        dependency,
        begin,
        hold: spec.hold,
        requeue: spec.requeue,
        exclusive: spec.exclusive,
        features: features(&f, &spec.features)?,
        nodelist: names(&f("nodelist"), &spec.nodelist)?,
        exclude: names(&f("exclude"), &spec.exclude)?,
        work_dir: text(&f("work_dir"), or_default(&spec.work_dir, "/"), PATH_LIMIT)?,
        stdout: non_empty(&f("stdout"), &spec.stdout)?,
        stderr: non_empty(&f("stderr"), &spec.stderr)?,
        script,
        env,
        signal,
        reservation: name(&f("reservation"), &spec.reservation)?,
        interactive: spec.interactive,
        comment: if spec.comment.is_empty() {
            None
        } else {
            Some(text(&f("comment"), &spec.comment, MAX_COMMENT)?)
        },
    })
}

/// `value`, or `default` when it is empty.
fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() { default } else { value }
}

/// The node features asked for, each bounded.
fn features(
    f: &dyn Fn(&str) -> String,
    features: &[String],
) -> Result<std::collections::BTreeSet<String>, Status> {
    features
        .iter()
        .enumerate()
        .map(|(i, x)| text(&f(&format!("features[{i}]")), x, 256).map(String::from))
        .collect()
}

/// The memory asked for: per node, per cpu, a whole node, or the partition's default.
fn memory_request(memory: Option<pb::job_spec::Memory>) -> Option<MemoryRequest> {
    match memory {
        None => None,
        Some(pb::job_spec::Memory::MemPerNodeMib(m)) => Some(MemoryRequest::PerNode(MiB(m))),
        Some(pb::job_spec::Memory::MemPerCpuMib(m)) => Some(MemoryRequest::PerCpu(MiB(m))),
        Some(pb::job_spec::Memory::MemWholeNode(true)) => Some(MemoryRequest::WholeNode),
        Some(pb::job_spec::Memory::MemWholeNode(false)) => None,
    }
}

/// The time limit asked for: none (the default), 0 for no limit, or seconds.
fn time_request(f: &dyn Fn(&str) -> String, seconds: Option<i64>) -> Result<TimeRequest, Status> {
    match seconds {
        None => Ok(TimeRequest::Default),
        Some(0) => Ok(TimeRequest::Unlimited),
        Some(s) if s < 0 => Err(bad(
            &f("time_limit_seconds"),
            format!("{s} is negative; give seconds > 0, or 0 for no limit"),
        )),
        Some(s) => Ok(TimeRequest::Limit(Seconds(s as u64))),
    }
}

/// The signal to send before the time limit (`--signal`), a real signal number.
fn warn_signal(
    f: &dyn Fn(&str) -> String,
    signal: Option<&pb::WarnSignal>,
) -> Result<Option<WarnSignal>, Status> {
    match signal {
        None => Ok(None),
        Some(s) if !(1..=64).contains(&s.signal) => Err(bad(
            &f("signal.signal"),
            format!("{} is not a signal number (1-64)", s.signal),
        )),
        Some(s) => Ok(Some(WarnSignal {
            signal: s.signal,
            before: Seconds(s.seconds_before),
            batch_only: s.batch_only,
        })),
    }
}

fn non_empty(field: &str, value: &str) -> Result<Option<SmolStr>, Status> {
    if value.is_empty() {
        Ok(None)
    } else {
        text(field, value, PATH_LIMIT).map(Some)
    }
}

/// A job reference from the wire.
pub fn job_ref(r: &pb::JobRef) -> JobRef {
    JobRef {
        job: JobId(r.job_id),
        task: r.task,
    }
}

/// A job reference for the wire.
pub fn job_ref_out(r: &JobRef) -> pb::JobRef {
    pb::JobRef {
        job_id: r.job.0,
        task: r.task,
    }
}

/// A job as the API shows it.
pub fn job_info(job: &Job) -> pb::JobInfo {
    let nodes: Vec<&str> = job
        .allocation_record()
        .map(|a| a.shares.iter().map(|s| s.node.as_str()).collect())
        .unwrap_or_default();
    let (array, array_task) = match &job.array {
        Some(ArrayPart::Master { .. }) => (
            job.spec
                .array
                .as_ref()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            None,
        ),
        Some(ArrayPart::Task { index, .. }) => (String::new(), Some(*index)),
        None => (String::new(), None),
    };
    pb::JobInfo {
        job_id: job.id.0,
        name: job.spec.name.to_string(),
        user: job.spec.user.to_string(),
        account: job.resolved.account.to_string(),
        partition: job.resolved.partition.to_string(),
        qos: job.resolved.qos.to_string(),
        state: job.state.name().to_owned(),
        job_state: crate::typed::job_state(job.state).into(),
        state_code: job.state.code().to_owned(),
        reason: job.reason.name().to_owned(),
        submit_time_ms: job.submit_time.0,
        start_time_ms: job.start_time.map(|t| t.0),
        end_time_ms: job.end_time.map(|t| t.0),
        time_limit_seconds: job.resolved.time_limit.map_or(0, |s| s.0),
        nodes: if nodes.is_empty() {
            job.spec.nodes
        } else {
            nodes.len() as u32
        },
        cpus: job
            .allocation_record()
            .map_or_else(|| job.cpus(), |a| a.cpus()),
        node_list: docket_core::hostlist::compress(&nodes),
        exit_code: job.exit.map(|e| e.code),
        exit_signal: job.exit.map(|e| e.signal),
        work_dir: job.spec.work_dir.to_string(),
        array,
        array_task,
        requeue_count: job.requeue_count,
        held: job.hold.is_some(),
        dependency: job
            .spec
            .dependency
            .as_ref()
            .map(|d| d.to_string())
            .unwrap_or_default(),
        steps: job.steps.list.values().map(step_info).collect(),
        comment: job.spec.comment.as_deref().unwrap_or_default().to_string(),
    }
}

/// A step as `squeue -s` and `sacct` show it.
pub fn step_info(step: &docket_core::job::step::Step) -> pb::StepInfo {
    let nodes: Vec<&str> = step.layout.iter().map(|s| s.node.as_str()).collect();
    pb::StepInfo {
        step_id: step.id.0,
        name: step.name.clone(),
        state: step.state.name().to_owned(),
        step_state: crate::typed::job_state(step.state).into(),
        start_time_ms: step.start_time.0,
        end_time_ms: step.end_time.map(|t| t.0),
        ntasks: step.ntasks(),
        node_list: docket_core::hostlist::compress(&nodes),
        exit_code: step.exit.map(|e| e.code),
        exit_signal: step.exit.map(|e| e.signal),
        cpu_time_ms: step.exit.map_or(0, |e| e.cpu_time_ms),
        max_rss_mib: step.exit.map_or(0, |e| e.max_rss_mib),
        cpus: step
            .layout
            .iter()
            .map(|s| s.cpus)
            .fold(0, u32::saturating_add),
        nodes: step.layout.len() as u32,
    }
}

/// A step request as the core takes it; node names are checked here, everything else at
/// apply.
pub fn step_spec(r: &pb::CreateStepRequest) -> Result<docket_core::job::StepSpec, Status> {
    const MAX_NODELIST: usize = 65_536;
    if r.nodelist.len() > MAX_NODELIST {
        return Err(bad(
            "nodelist",
            format!(
                "{} nodes named; the limit is {MAX_NODELIST}",
                r.nodelist.len()
            ),
        ));
    }
    let nodelist = r
        .nodelist
        .iter()
        .map(|n| {
            n.parse::<docket_core::NodeName>()
                .map_err(|e| bad("nodelist", e))
        })
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(docket_core::job::StepSpec {
        name: text("name", &r.name, docket_core::job::step::MAX_STEP_NAME_BYTES)?.to_string(),
        ntasks: r.ntasks,
        nodes: r.nodes,
        ntasks_per_node: r.ntasks_per_node,
        cpus_per_task: r.cpus_per_task.max(1),
        nodelist,
        overlap: r.overlap,
        time_limit: (r.time_limit_seconds > 0).then_some(Seconds(r.time_limit_seconds)),
        io_key: r.io_key.clone(),
    })
}
