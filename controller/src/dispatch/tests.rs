//! The dispatcher's decisions on hand-built states: what each agent is told, and that
//! asking again without a change tells it nothing.

use std::collections::BTreeSet;

use docket_core::account::{AssocLimits, User, UserAssoc};
use docket_core::command::{EndCause, EndReport, StartDecision};
use docket_core::config::SchedConfig;
use docket_core::job::{BlobId, ExitStatus, JobRef, JobSpec, TimeRequest};
use docket_core::node::NodeSpec;
use docket_core::partition::Partition;
use docket_core::qos::Qos;
use docket_core::quantity::{MiB, Seconds, TimeMs};
use docket_core::{ApplyCtx, Command, Envelope, JobId, NodeName, Response, State};
use docket_proto::v1 as pb;
use pb::instruction::Kind;

use super::*;

const SCRIPT: &[u8] = b"#!/bin/sh\ntrue\n";

struct Site {
    state: State,
    index: u64,
}

fn name<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("a valid name")
}

impl Site {
    /// Two nodes of 4 cpus in partition `work`; user alice in account `proj`.
    fn new() -> Site {
        let mut s = Site {
            state: State::new(SchedConfig::default()),
            index: 0,
        };
        let nodes: BTreeSet<NodeName> = ["n1", "n2"].iter().map(|n| name(n)).collect();
        for n in &nodes {
            s.ok(Command::UpsertNode(NodeSpec {
                name: n.clone(),
                cpus: 4,
                memory: MiB::gib(8),
                jobfs: MiB(0),
                gpus: 0,
                features: BTreeSet::new(),
            }));
        }
        s.ok(Command::UpsertQos(Box::new(Qos::new(name("normal")))));
        let mut p = Partition::new(name("work"), nodes);
        p.is_default = true;
        p.def_mem_per_cpu = Some(MiB(100));
        s.ok(Command::UpsertPartition(Box::new(p)));
        s.ok(Command::UpsertAccount {
            name: name("proj"),
            parent: name("root"),
            shares: 1,
            limits: AssocLimits::default(),
            grant: None,
        });
        s.ok(Command::UpsertUser {
            user: User {
                name: name("alice"),
                default_account: name("proj"),
                admin: false,
            },
            assocs: vec![(
                name("proj"),
                UserAssoc {
                    shares: 1,
                    priority: 0,
                    limits: AssocLimits::default(),
                },
            )],
        });
        s
    }

    fn ok(&mut self, command: Command) -> Response {
        self.index += 1;
        self.state
            .apply(
                Envelope::controller(command),
                ApplyCtx {
                    index: self.index,
                    time_ms: TimeMs(1_700_000_000_000 + self.index),
                },
            )
            .expect("applied")
    }

    /// A job of `nodes` nodes started on the first `nodes` of n1, n2.
    fn running(&mut self, nodes: u32) -> JobId {
        let mut spec = JobSpec::simple(name("alice"), BlobId::of(SCRIPT));
        spec.time = TimeRequest::Limit(Seconds(600));
        spec.nodes = nodes;
        spec.ntasks = nodes;
        let id = match self.ok(Command::SubmitJobs {
            blobs: vec![SCRIPT.to_vec()],
            jobs: vec![spec],
        }) {
            Response::Submitted(mut r) => r.remove(0).expect("accepted"),
            other => panic!("unexpected {other:?}"),
        };
        let on = ["n1", "n2"][..nodes as usize].iter().map(|n| name(n));
        self.ok(Command::StartJobs(vec![StartDecision {
            job: jr(id),
            nodes: on.collect(),
        }]));
        id
    }

    fn epoch(&self, id: JobId) -> u64 {
        self.state.jobs[&id].alloc.as_ref().expect("running").epoch
    }

    /// What `node`'s agent is told now.
    fn tell(&self, node: &str, link: &mut Link) -> Vec<Kind> {
        let wanted = Wanted::of(&self.state);
        instruct(&self.state, &wanted, &name(node), link)
            .into_iter()
            .filter_map(|i| i.kind)
            .collect()
    }
}

fn jr(job: JobId) -> JobRef {
    JobRef { job, task: None }
}

fn launch_of(kinds: &[Kind]) -> &pb::Launch {
    match kinds {
        [Kind::Launch(l)] => l,
        other => panic!("expected one launch, got {other:?}"),
    }
}

#[test]
fn a_run_is_launched_once_per_stream_and_not_again_once_held() {
    let mut site = Site::new();
    let id = site.running(1);
    let mut link = Link::default();
    let told = site.tell("n1", &mut link);
    let l = launch_of(&told);
    assert_eq!((l.job_id, l.epoch, l.cpus), (id.0, site.epoch(id), 1));
    assert_eq!(l.script, SCRIPT);
    assert!(!l.extern_only);
    // Nothing changed: nothing more, however often the dispatcher is woken.
    assert!(site.tell("n1", &mut link).is_empty());
    assert!(site.tell("n2", &mut Link::default()).is_empty());
    // A new stream is told again, unless the agent said it runs that epoch.
    link.new_stream();
    assert_eq!(launch_of(&site.tell("n1", &mut link)).job_id, id.0);
    link.new_stream();
    link.held.insert(id, running(site.epoch(id)));
    assert!(site.tell("n1", &mut link).is_empty());
}

fn running(epoch: u64) -> Held {
    Held {
        epoch,
        running: true,
        suspended: false,
    }
}

#[test]
fn a_run_suspended_before_any_stream_launched_it_is_launched_then_suspended() {
    let mut site = Site::new();
    let id = site.running(1);
    let epoch = site.epoch(id);
    // Started and suspended while its agent had no stream.
    site.ok(Command::SuspendJobs { jobs: vec![jr(id)] });
    let mut link = Link::default();
    match &site.tell("n1", &mut link)[..] {
        [Kind::Launch(l), Kind::Suspend(s)] => {
            assert_eq!((l.job_id, l.epoch), (id.0, epoch));
            assert_eq!((s.job_id, s.epoch), (id.0, epoch));
        }
        other => panic!("expected a launch then a suspension, got {other:?}"),
    }
    assert!(site.tell("n1", &mut link).is_empty());
    site.ok(Command::ResumeJobs { jobs: vec![jr(id)] });
    assert!(matches!(site.tell("n1", &mut link)[..], [Kind::Resume(_)]));
    // Resumed before any stream reached the agent: a plain launch.
    let mut site = Site::new();
    let id = site.running(1);
    site.ok(Command::SuspendJobs { jobs: vec![jr(id)] });
    site.ok(Command::ResumeJobs { jobs: vec![jr(id)] });
    assert!(matches!(
        site.tell("n1", &mut Link::default())[..],
        [Kind::Launch(_)]
    ));
}

#[test]
fn a_run_suspended_by_an_earlier_stream_and_resumed_meanwhile_is_resumed_on_the_next() {
    let mut site = Site::new();
    let id = site.running(1);
    let epoch = site.epoch(id);
    let mut link = Link::default();
    site.tell("n1", &mut link);
    site.ok(Command::SuspendJobs { jobs: vec![jr(id)] });
    assert!(matches!(site.tell("n1", &mut link)[..], [Kind::Suspend(_)]));
    // The stream breaks; the resume commits while no stream reaches the agent, which
    // registers again holding the run frozen.
    site.ok(Command::ResumeJobs { jobs: vec![jr(id)] });
    let mut next = Link::default();
    next.held.insert(
        id,
        Held {
            suspended: true,
            ..running(epoch)
        },
    );
    match &site.tell("n1", &mut next)[..] {
        [Kind::Resume(c)] => assert_eq!((c.job_id, c.epoch), (id.0, epoch)),
        other => panic!("expected a resume, got {other:?}"),
    }
    // Told once, even while its heartbeats still say frozen.
    assert!(site.tell("n1", &mut next).is_empty());
    // Wanted suspended, a frozen run is told to suspend on a new stream (harmless), and a run
    // held as running on a new stream is not told anything.
    site.ok(Command::SuspendJobs { jobs: vec![jr(id)] });
    next.new_stream();
    assert!(matches!(site.tell("n1", &mut next)[..], [Kind::Suspend(_)]));
    site.ok(Command::ResumeJobs { jobs: vec![jr(id)] });
    assert!(matches!(site.tell("n1", &mut next)[..], [Kind::Resume(_)]));
    next.new_stream();
    next.held.insert(id, running(epoch));
    assert!(site.tell("n1", &mut next).is_empty());
}

#[test]
fn a_job_of_two_nodes_runs_its_script_on_the_first_and_holds_the_second() {
    let mut site = Site::new();
    let id = site.running(2);
    let first = site.tell("n1", &mut Link::default());
    let second = site.tell("n2", &mut Link::default());
    let (first, second) = (launch_of(&first), launch_of(&second));
    assert!(!first.extern_only && second.extern_only);
    assert_eq!(second.script, b"#!/bin/sh\nexec sleep infinity\n");
    assert_eq!((first.node_count, first.node_list.as_str()), (2, "n[1-2]"));
    assert_eq!(first.tasks_per_node, "1(x2)");
    assert_eq!(first.job_id, id.0);
}

#[test]
fn suspend_then_resume_is_told_as_such_not_as_a_new_launch() {
    let mut site = Site::new();
    let id = site.running(1);
    let mut link = Link::default();
    site.tell("n1", &mut link);
    site.ok(Command::SuspendJobs { jobs: vec![jr(id)] });
    assert!(matches!(site.tell("n1", &mut link)[..], [Kind::Suspend(_)]));
    assert!(site.tell("n1", &mut link).is_empty());
    site.ok(Command::ResumeJobs { jobs: vec![jr(id)] });
    assert!(matches!(site.tell("n1", &mut link)[..], [Kind::Resume(_)]));
    assert!(site.tell("n1", &mut link).is_empty());
}

#[test]
fn a_cancelled_run_is_killed_once_and_a_run_nobody_wants_is_killed_as_stale() {
    let mut site = Site::new();
    let id = site.running(1);
    let epoch = site.epoch(id);
    let mut link = Link::default();
    site.tell("n1", &mut link);
    site.ok(Command::CancelJobs { jobs: vec![jr(id)] });
    match &site.tell("n1", &mut link)[..] {
        [Kind::Kill(c)] => assert_eq!((c.job_id, c.epoch), (id.0, epoch)),
        other => panic!("expected a kill, got {other:?}"),
    }
    assert!(site.tell("n1", &mut link).is_empty());
    // Its end recorded, the agent still says it runs it (an older run, say): killed as stale.
    site.ok(Command::EndJobs(vec![EndReport {
        job: id,
        epoch,
        cause: EndCause::Cancelled,
        exit: ExitStatus::default(),
    }]));
    let mut other = Link::default();
    other.held.insert(id, running(epoch));
    match &site.tell("n2", &mut other)[..] {
        [Kind::Kill(c)] => assert!(c.reason.starts_with("stale"), "{c:?}"),
        other => panic!("expected a stale kill, got {other:?}"),
    }
    assert!(site.tell("n2", &mut other).is_empty());
}

#[test]
fn a_changed_time_limit_is_told_once() {
    let mut site = Site::new();
    let id = site.running(1);
    let mut link = Link::default();
    site.tell("n1", &mut link);
    site.ok(Command::UpdateJobs {
        jobs: vec![jr(id)],
        update: docket_core::apply::update::JobUpdate {
            time_limit: Some(TimeRequest::Limit(Seconds(300))),
            name: None,
            nice: None,
            comment: None,
        },
    });
    match &site.tell("n1", &mut link)[..] {
        [Kind::TimeLimit(t)] => assert_eq!((t.job_id, t.time_limit_seconds), (id.0, 300)),
        other => panic!("expected a time limit, got {other:?}"),
    }
    assert!(site.tell("n1", &mut link).is_empty());
}
