//! `squeue --json` and `sacct --json` in the shapes Slurm 22.05 prints (its data parser
//! `openapi/v0.0.38`): a `meta` block, `errors`, and `jobs` with Slurm's field names —
//! `job_state`, `user_name`, `state_reason`, times in seconds since the epoch and limits in
//! minutes for squeue; `state.current`, `exit_code.status`/`return_code`, `time.*`,
//! `tres.allocated`/`requested` and `steps[].step.id` for sacct. Portals and scripts
//! written against Slurm's JSON read these unchanged; fields Docket has no notion of are
//! left out rather than made up.

use docket_proto::v1 as pb;
use serde_json::{Value, json};

/// Slurm's INFINITE, what it prints for no time limit.
const INFINITE: u64 = 4_294_967_295;

/// The `meta` block: which shape this is, and who printed it.
pub fn meta(command: &str) -> Value {
    json!({
        "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
        "Slurm": {"version": {"major": 22, "micro": 0, "minor": 5}, "release": "22.05.0"},
        "client": {"source": command},
        "docket": {"version": env!("CARGO_PKG_VERSION")},
    })
}

fn seconds(ms: Option<u64>) -> u64 {
    ms.map_or(0, |ms| ms / 1000)
}

fn limit_minutes(seconds: u64) -> u64 {
    if seconds == 0 {
        INFINITE
    } else {
        seconds.div_ceil(60)
    }
}

/// One job as `squeue --json` prints it.
pub fn squeue_job(j: &pb::JobInfo) -> Value {
    let (array_job_id, array_task_id) = match j.array_task {
        Some(t) => (j.job_id, Some(t)),
        None => (0, None),
    };
    json!({
        "account": j.account,
        "array_job_id": array_job_id,
        "array_task_id": array_task_id,
        "array_task_string": if j.array_task.is_none() { j.array.clone() } else { String::new() },
        "batch_flag": true,
        "comment": j.comment,
        "cpus": j.cpus,
        "current_working_directory": j.work_dir,
        "dependency": j.dependency,
        "end_time": seconds(j.end_time_ms),
        "exit_code": j.exit_code.unwrap_or(0),
        "job_id": j.job_id,
        "job_state": j.state,
        "name": j.name,
        "node_count": j.nodes,
        "nodes": j.node_list,
        "partition": j.partition,
        "qos": j.qos,
        "restart_cnt": j.requeue_count,
        "start_time": seconds(j.start_time_ms),
        "state_reason": j.reason,
        "submit_time": seconds(Some(j.submit_time_ms)),
        "time_limit": limit_minutes(j.time_limit_seconds),
        "user_name": j.user,
    })
}

/// Slurm's exit code object: SUCCESS, FAILED (a non-zero code) or SIGNALED.
fn exit_code(code: Option<i32>, signal: Option<i32>) -> Value {
    match (code, signal) {
        (_, Some(s)) if s != 0 => json!({
            "status": "SIGNALED",
            "return_code": code.unwrap_or(0),
            "signal": {"signal_id": s},
        }),
        (Some(0), _) => json!({"status": "SUCCESS", "return_code": 0}),
        (Some(c), _) => json!({"status": "FAILED", "return_code": c}),
        (None, _) => json!({"status": "PENDING", "return_code": 0}),
    }
}

fn cpu_time(ms: u64) -> Value {
    json!({"seconds": ms / 1000, "microseconds": (ms % 1000) * 1000})
}

/// The TRES an allocation holds, in Slurm's list form (ids as Slurm numbers them).
fn tres_allocated(r: &pb::AccountingRecord) -> Value {
    if r.alloc_nodes == 0 {
        return json!([]);
    }
    let mut out = vec![
        json!({"type": "cpu", "name": "", "id": 1, "count": r.alloc_cpus}),
        json!({"type": "mem", "name": "", "id": 2, "count": r.alloc_mem_mib}),
        json!({"type": "node", "name": "", "id": 4, "count": r.alloc_nodes}),
        json!({"type": "billing", "name": "", "id": 5, "count": r.alloc_billing}),
    ];
    if r.alloc_gpus > 0 {
        out.push(json!({"type": "gres", "name": "gpu", "id": 1001, "count": r.alloc_gpus}));
    }
    Value::Array(out)
}

/// One accounting record as `sacct --json` prints it, with its steps.
pub fn sacct_job(r: &pb::AccountingRecord, j: &pb::JobInfo) -> Value {
    let elapsed = r.elapsed_seconds;
    let steps: Vec<Value> = j
        .steps
        .iter()
        .map(|s| {
            json!({
                "step": {"id": format!("{}.{}", j.job_id, s.step_id), "name": s.name},
                "state": s.state,
                "exit_code": exit_code(s.exit_code, s.exit_signal),
                "nodes": {"count": s.nodes, "range": s.node_list},
                "tasks": {"count": s.ntasks},
                "time": {
                    "start": s.start_time_ms / 1000,
                    "end": seconds(s.end_time_ms),
                    "elapsed": seconds(s.end_time_ms).saturating_sub(s.start_time_ms / 1000),
                    "total": cpu_time(s.cpu_time_ms),
                },
                "tres": {"allocated": [{"type": "cpu", "name": "", "id": 1, "count": s.cpus}]},
                "statistics": {"max_rss_mib": s.max_rss_mib},
            })
        })
        .collect();
    json!({
        "account": j.account,
        "allocation_nodes": r.alloc_nodes,
        "array": {
            "job_id": if j.array_task.is_some() { j.job_id } else { 0 },
            "task_id": j.array_task,
            "task": if j.array_task.is_none() { j.array.clone() } else { String::new() },
        },
        "association": {"account": j.account, "partition": j.partition, "user": j.user},
        "comment": {"administrator": "", "job": j.comment, "system": ""},
        "exit_code": exit_code(j.exit_code, j.exit_signal),
        "job_id": j.job_id,
        "name": j.name,
        "nodes": j.node_list,
        "partition": j.partition,
        "qos": j.qos,
        "required": {"CPUs": j.cpus, "memory": r.req_mem_mib},
        "state": {"current": j.state, "reason": j.reason},
        "steps": steps,
        "time": {
            "elapsed": elapsed,
            "submission": j.submit_time_ms / 1000,
            "start": seconds(j.start_time_ms),
            "end": seconds(j.end_time_ms),
            "limit": limit_minutes(j.time_limit_seconds),
            "total": cpu_time(r.total_cpu_ms),
        },
        "tres": {"allocated": tres_allocated(r), "requested": [
            {"type": "cpu", "name": "", "id": 1, "count": j.cpus},
            {"type": "mem", "name": "", "id": 2, "count": r.req_mem_mib},
            {"type": "node", "name": "", "id": 4, "count": j.nodes},
        ]},
        "user": j.user,
        "working_directory": j.work_dir,
        "docket": {
            "charged_su": r.charged_milli_su as f64 / 1000.0,
            "archived": r.archived,
            "max_rss_mib": r.max_rss_mib,
            "restarts": j.requeue_count,
        },
    })
}

/// The document: meta, no errors, the jobs.
pub fn document(command: &str, jobs: Vec<Value>) -> Value {
    json!({"meta": meta(command), "errors": [], "jobs": jobs})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running() -> pb::JobInfo {
        pb::JobInfo {
            job_id: 12,
            name: "relax".into(),
            user: "alice".into(),
            account: "physics".into(),
            partition: "batch".into(),
            qos: "normal".into(),
            state: "RUNNING".into(),
            state_code: "R".into(),
            reason: "None".into(),
            submit_time_ms: 1_700_000_000_500,
            start_time_ms: Some(1_700_000_010_000),
            time_limit_seconds: 3601,
            nodes: 1,
            cpus: 4,
            node_list: "n01".into(),
            work_dir: "/home/alice".into(),
            ..Default::default()
        }
    }

    #[test]
    fn squeue_json_has_slurms_field_names_and_units() {
        let v = document("squeue", vec![squeue_job(&running())]);
        assert_eq!(v["meta"]["plugin"]["type"], "openapi/v0.0.38");
        assert_eq!(v["errors"], json!([]));
        let j = &v["jobs"][0];
        assert_eq!(j["job_id"], 12);
        assert_eq!(j["job_state"], "RUNNING");
        assert_eq!(j["user_name"], "alice");
        assert_eq!(j["state_reason"], "None");
        assert_eq!(j["submit_time"], 1_700_000_000);
        assert_eq!(j["start_time"], 1_700_000_010);
        assert_eq!(j["end_time"], 0);
        assert_eq!(j["time_limit"], 61, "minutes, rounded up");
        assert_eq!(j["nodes"], "n01");
        assert_eq!(j["array_task_id"], Value::Null);
        let mut unlimited = running();
        unlimited.time_limit_seconds = 0;
        assert_eq!(squeue_job(&unlimited)["time_limit"], INFINITE);
    }

    #[test]
    fn sacct_json_nests_state_exit_code_time_and_tres() {
        let mut j = running();
        j.state = "FAILED".into();
        j.exit_code = Some(3);
        j.exit_signal = Some(0);
        j.end_time_ms = Some(1_700_000_070_000);
        j.steps = vec![pb::StepInfo {
            step_id: 0,
            name: "hostname".into(),
            state: "COMPLETED".into(),
            start_time_ms: 1_700_000_020_000,
            end_time_ms: Some(1_700_000_050_000),
            ntasks: 4,
            node_list: "n01".into(),
            exit_code: Some(0),
            exit_signal: Some(0),
            cpu_time_ms: 1_500,
            cpus: 4,
            nodes: 1,
            ..Default::default()
        }];
        let r = pb::AccountingRecord {
            alloc_cpus: 4,
            elapsed_seconds: 60,
            total_cpu_ms: 2_250,
            req_mem_mib: 4096,
            alloc_mem_mib: 4096,
            alloc_nodes: 1,
            alloc_gpus: 1,
            ..Default::default()
        };
        let v = sacct_job(&r, &j);
        assert_eq!(v["state"]["current"], "FAILED");
        assert_eq!(
            v["exit_code"],
            json!({"status": "FAILED", "return_code": 3})
        );
        assert_eq!(v["time"]["elapsed"], 60);
        assert_eq!(v["time"]["end"], 1_700_000_070);
        assert_eq!(
            v["time"]["total"],
            json!({"seconds": 2, "microseconds": 250_000})
        );
        let allocated = v["tres"]["allocated"].as_array().unwrap();
        let kinds: Vec<&str> = allocated
            .iter()
            .map(|t| t["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["cpu", "mem", "node", "billing", "gres"]);
        assert_eq!(v["required"]["memory"], 4096);
        assert_eq!(v["steps"][0]["step"]["id"], "12.0");
        assert_eq!(v["steps"][0]["exit_code"]["status"], "SUCCESS");
        assert_eq!(v["steps"][0]["time"]["elapsed"], 30);
        j.exit_signal = Some(9);
        assert_eq!(sacct_job(&r, &j)["exit_code"]["status"], "SIGNALED");
    }
}
