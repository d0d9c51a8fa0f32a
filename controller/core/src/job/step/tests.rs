//! Placement follows Slurm's block distribution and its rules for `-N`, `-n`,
//! `--ntasks-per-node`, `-c`, `-w` and `--overlap` inside an allocation.

use super::*;
use crate::job::NodeShare;
use crate::quantity::MiB;

fn node(s: &str) -> NodeName {
    s.parse().unwrap()
}

/// An allocation of `cpus[i]` cpus on node `n{i+1}`.
fn alloc(cpus: &[u32]) -> Allocation {
    Allocation {
        shares: cpus
            .iter()
            .enumerate()
            .map(|(i, &c)| NodeShare {
                node: node(&format!("n{}", i + 1)),
                cpus: c,
                memory: MiB(1024),
                jobfs: MiB(0),
                gpus: 0,
            })
            .collect(),
        exclusive: false,
        epoch: 1,
        billing_milli: None,
    }
}

fn spec() -> StepSpec {
    StepSpec {
        name: "hostname".into(),
        ntasks: None,
        nodes: None,
        ntasks_per_node: None,
        cpus_per_task: 1,
        nodelist: Vec::new(),
        overlap: false,
        time_limit: None,
        io_key: vec![0; IO_KEY_BYTES],
    }
}

fn idle(_: &NodeName) -> u32 {
    0
}

/// (node, tasks) of a placement, or the outcome's debug text.
fn tasks(p: &Placement) -> Vec<(String, u32)> {
    match p {
        Placement::Placed(l) => l.iter().map(|s| (s.node.to_string(), s.tasks)).collect(),
        other => panic!("not placed: {other:?}"),
    }
}

fn pairs(v: &[(&str, u32)]) -> Vec<(String, u32)> {
    v.iter().map(|(n, t)| (n.to_string(), *t)).collect()
}

#[test]
fn no_options_run_one_task_on_every_node() {
    let p = place(&alloc(&[4, 4, 4]), &idle, &spec());
    assert_eq!(tasks(&p), pairs(&[("n1", 1), ("n2", 1), ("n3", 1)]));
}

#[test]
fn block_distribution_fills_nodes_in_order_after_one_task_each() {
    // Slurm: srun -N2 -n5 on 2 x 4 cpus gives 4 + 1.
    let s = StepSpec {
        ntasks: Some(5),
        nodes: Some(2),
        ..spec()
    };
    let p = place(&alloc(&[4, 4]), &idle, &s);
    assert_eq!(tasks(&p), pairs(&[("n1", 4), ("n2", 1)]));
    let Placement::Placed(l) = p else { panic!() };
    assert_eq!(l[1].first_task, 4);
    assert_eq!(l[0].cpus, 4);
}

#[test]
fn without_a_node_count_the_tasks_take_as_few_nodes_as_fit() {
    let s = StepSpec {
        ntasks: Some(3),
        ..spec()
    };
    assert_eq!(
        tasks(&place(&alloc(&[2, 2, 2]), &idle, &s)),
        pairs(&[("n1", 2), ("n2", 1)])
    );
}

#[test]
fn more_nodes_than_tasks_is_lowered_to_the_task_count() {
    let s = StepSpec {
        ntasks: Some(1),
        nodes: Some(2),
        ..spec()
    };
    assert_eq!(
        tasks(&place(&alloc(&[2, 2]), &idle, &s)),
        pairs(&[("n1", 1)])
    );
}

#[test]
fn tasks_per_node_are_exact_and_the_last_node_takes_the_rest() {
    let s = StepSpec {
        ntasks: Some(5),
        ntasks_per_node: Some(2),
        ..spec()
    };
    assert_eq!(
        tasks(&place(&alloc(&[4, 4, 4]), &idle, &s)),
        pairs(&[("n1", 2), ("n2", 2), ("n3", 1)])
    );
    // MPI launchers: one daemon per node on every node.
    let s = StepSpec {
        nodes: Some(3),
        ntasks_per_node: Some(1),
        ..spec()
    };
    assert_eq!(
        tasks(&place(&alloc(&[4, 4, 4]), &idle, &s)),
        pairs(&[("n1", 1), ("n2", 1), ("n3", 1)])
    );
}

#[test]
fn cpus_per_task_divide_each_nodes_cpus() {
    let s = StepSpec {
        ntasks: Some(4),
        cpus_per_task: 2,
        ..spec()
    };
    let p = place(&alloc(&[4, 4]), &idle, &s);
    assert_eq!(tasks(&p), pairs(&[("n1", 2), ("n2", 2)]));
    let s = StepSpec {
        ntasks: Some(5),
        cpus_per_task: 2,
        ..spec()
    };
    assert!(matches!(
        place(&alloc(&[4, 4]), &idle, &s),
        Placement::Never {
            field: "ntasks",
            ..
        }
    ));
}

#[test]
fn the_nodelist_comes_first_and_must_be_in_the_allocation() {
    let s = StepSpec {
        nodelist: vec![node("n3")],
        ..spec()
    };
    assert_eq!(
        tasks(&place(&alloc(&[1, 1, 1]), &idle, &s)),
        pairs(&[("n3", 1)])
    );
    let s = StepSpec {
        nodelist: vec![node("n9")],
        ..spec()
    };
    match place(&alloc(&[1, 1]), &idle, &s) {
        Placement::Never { field, why } => {
            assert_eq!(field, "nodelist");
            assert!(why.contains("n9") && why.contains("n1,n2"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_step_waits_for_cpus_other_steps_hold_unless_it_overlaps() {
    let held = |n: &NodeName| if n.as_str() == "n1" { 4 } else { 0 };
    let s = StepSpec {
        ntasks: Some(4),
        nodelist: vec![node("n1")],
        ..spec()
    };
    assert!(matches!(
        place(&alloc(&[4, 4]), &held, &s),
        Placement::Busy(_)
    ));
    // Without naming n1, the free node takes it.
    let s = StepSpec {
        ntasks: Some(4),
        ..spec()
    };
    assert_eq!(
        tasks(&place(&alloc(&[4, 4]), &held, &s)),
        pairs(&[("n2", 4)])
    );
    // Every cpu held: it waits; with --overlap it shares.
    let all = |_: &NodeName| 4;
    assert!(matches!(
        place(&alloc(&[4, 4]), &all, &s),
        Placement::Busy(_)
    ));
    let s = StepSpec { overlap: true, ..s };
    assert_eq!(
        tasks(&place(&alloc(&[4, 4]), &all, &s)),
        pairs(&[("n1", 4)])
    );
}

#[test]
fn requests_larger_than_the_allocation_are_refused_not_queued() {
    for (s, field) in [
        (
            StepSpec {
                nodes: Some(3),
                ..spec()
            },
            "nodes",
        ),
        (
            StepSpec {
                ntasks: Some(9),
                ..spec()
            },
            "ntasks",
        ),
        (
            StepSpec {
                ntasks_per_node: Some(5),
                ..spec()
            },
            "ntasks_per_node",
        ),
        (
            StepSpec {
                nodes: Some(0),
                ..spec()
            },
            "nodes",
        ),
        (
            StepSpec {
                ntasks: Some(0),
                ..spec()
            },
            "ntasks",
        ),
    ] {
        match place(&alloc(&[4, 4]), &idle, &s) {
            Placement::Never { field: f, .. } => assert_eq!(f, field, "{s:?}"),
            other => panic!("{s:?}: {other:?}"),
        }
    }
}

#[test]
fn step_references_parse_as_slurm_writes_them() {
    let r: StepRef = "1234.7".parse().unwrap();
    assert_eq!((r.job, r.step), (JobId(1234), StepId(7)));
    assert_eq!(r.to_string(), "1234.7");
    for bad in [
        "1234",
        "1234.",
        ".3",
        "12.3.4",
        "a.1",
        "1.-1",
        "1.batch",
        "99999999999999999999.1",
    ] {
        assert!(bad.parse::<StepRef>().is_err(), "{bad}");
    }
}

#[test]
fn a_step_ends_with_its_worst_cause_and_highest_exit_code() {
    let mut step = Step {
        id: StepId(0),
        name: "x".into(),
        layout: Vec::new(),
        cpus_per_task: 1,
        overlap: false,
        time_limit: None,
        io_key: Vec::new(),
        state: JobState::Running,
        start_time: TimeMs(0),
        end_time: None,
        cancelled: false,
        ends: BTreeMap::new(),
        exit: None,
    };
    let end = |cause, code, cpu| NodeEnd {
        cause,
        exit: ExitStatus {
            code,
            signal: 0,
            cpu_time_ms: cpu,
            max_rss_mib: code as u64,
        },
    };
    step.ends.insert(node("n1"), end(EndCause::Exited, 0, 10));
    assert_eq!(step.conclusion().0, JobState::Completed);
    step.ends.insert(node("n2"), end(EndCause::Exited, 3, 5));
    let (state, exit) = step.conclusion();
    assert_eq!(
        (state, exit.code, exit.cpu_time_ms, exit.max_rss_mib),
        (JobState::Failed, 3, 15, 3)
    );
    step.ends
        .insert(node("n3"), end(EndCause::OutOfMemory, 0, 0));
    assert_eq!(step.conclusion().0, JobState::OutOfMemory);
    step.cancelled = true;
    assert_eq!(step.conclusion().0, JobState::Cancelled);
}
