//! The `docket.v1.Jobs` service: submit, act on, and look at jobs.
//!
//! Writes become docket-core commands proposed through the local replica (forwarded to the
//! leader when it is a follower) and are answered once applied; reads are linearizable by
//! default and stale on request. How outcomes map to status codes is in the proto file.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use docket_core::access::Data;
use docket_core::job::JobState;
use docket_core::{Actor, Command, Envelope, JobId, Rejection, Response, UserName};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_server::{Jobs, JobsServer};
use docket_raft::replica::Replica;
use tonic::{Request, Response as TonicResponse, Status};

use crate::convert;
use crate::identity::Authenticator;
use crate::machine::CoreMachine;
use crate::write::{read, write};

/// Most jobs one listing page holds.
pub const MAX_PAGE: usize = 10_000;
const DEFAULT_PAGE: usize = 1_000;

/// The jobs service of one replica.
#[derive(Debug, Clone)]
pub struct JobsService {
    replica: Replica<CoreMachine>,
    read_timeout: Duration,
    archive: Option<Arc<crate::archive::Archive>>,
    /// The leader's agent sessions, for signals.
    agents: Option<crate::agents::AgentHub>,
    /// Who is calling.
    auth: Authenticator,
    /// The site's ClusterName (what `sacctmgr show` prints).
    cluster: String,
}

/// Most job references one request may name.
pub const MAX_REFS: usize = 100_000;

impl JobsService {
    /// Who is calling, proven.
    pub(crate) async fn caller<T>(&self, request: &Request<T>) -> Result<Actor, Status> {
        self.auth.caller(request).await
    }

    pub(crate) fn replica(&self) -> &Replica<CoreMachine> {
        &self.replica
    }

    /// The leader's agent sessions (None in a controller without agents).
    pub(crate) fn agents(&self) -> Option<&crate::agents::AgentHub> {
        self.agents.as_ref()
    }

    pub fn new(
        replica: Replica<CoreMachine>,
        read_timeout: Duration,
        archive: Option<Arc<crate::archive::Archive>>,
        agents: Option<crate::agents::AgentHub>,
        auth: Authenticator,
        cluster: String,
    ) -> JobsServer<Self> {
        JobsServer::new(JobsService {
            replica,
            read_timeout,
            archive,
            agents,
            auth,
            cluster,
        })
    }

    async fn per_job(
        &self,
        request: Request<pb::JobsRequest>,
        make: fn(Vec<docket_core::job::JobRef>) -> Command,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let refs = job_refs(&request.get_ref().jobs)?;
        self.per_job_command(actor, make(refs.clone()), &refs).await
    }

    /// Proposes a command acting on `refs` and answers one result per job.
    async fn per_job_command(
        &self,
        actor: Actor,
        command: Command,
        refs: &[docket_core::job::JobRef],
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        let response = write(&self.replica, Envelope::new(actor, command)).await?;
        let Response::PerJob(results) = response else {
            return Err(Status::internal(format!("unexpected answer {response:?}")));
        };
        Ok(TonicResponse::new(pb::PerJobResponse {
            results: refs
                .iter()
                .zip(results)
                .map(|(r, result)| pb::JobResult {
                    job: Some(convert::job_ref_out(r)),
                    error: result.err().map(|e| e.to_string()).unwrap_or_default(),
                })
                .collect(),
        }))
    }
}

fn stale(consistency: i32) -> bool {
    consistency == pb::ReadConsistency::Stale as i32
}

/// The jobs a request names: at least one, at most [`MAX_REFS`].
fn job_refs(jobs: &[pb::JobRef]) -> Result<Vec<docket_core::job::JobRef>, Status> {
    if jobs.is_empty() {
        return Err(Status::invalid_argument("jobs: name at least one job"));
    }
    if jobs.len() > MAX_REFS {
        return Err(Status::invalid_argument(format!(
            "jobs: {} named; the limit is {MAX_REFS} per request",
            jobs.len()
        )));
    }
    Ok(jobs.iter().map(convert::job_ref).collect())
}

#[tonic::async_trait]
impl Jobs for JobsService {
    async fn submit_jobs(
        &self,
        request: Request<pb::SubmitJobsRequest>,
    ) -> Result<TonicResponse<pb::SubmitJobsResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let user: UserName = match &actor {
            Actor::User(u) => u.clone(),
            Actor::Operator => "root"
                .parse()
                .map_err(|e| Status::internal(format!("root is not a user name: {e}")))?,
            Actor::Controller | Actor::Node(_) => {
                return Err(Status::permission_denied("only users submit jobs"));
            }
        };
        let (max_array_index, max_batch) = self.replica.read_stale(|a| {
            let c = &a.machine.state.config;
            (c.max_array_size.saturating_sub(1), c.max_batch)
        });
        let specs = request.into_inner().jobs;
        if specs.is_empty() {
            return Err(Status::invalid_argument("jobs: submit at least one job"));
        }
        // Before any per-job work: the batch limit (MaxSubmitBatch) the core would apply.
        if specs.len() as u64 > u64::from(max_batch) {
            return Err(Status::invalid_argument(format!(
                "jobs: {} in one request exceeds the limit of {max_batch} (MaxSubmitBatch)",
                specs.len()
            )));
        }
        // Hashing scripts is linear in the request's bytes, but a large request's is still
        // milliseconds: off the async workers.
        let bytes: usize = specs
            .iter()
            .map(|s| s.script.len() + s.environment.as_ref().map_or(0, Vec::len))
            .sum();
        let large = specs.len() > 64 || bytes > 256 << 10;
        let convert = move || {
            let mut blobs = convert::Blobs::default();
            let jobs = specs
                .iter()
                .enumerate()
                .map(|(i, s)| convert::job_spec(i, s, user.clone(), max_array_index, &mut blobs))
                .collect::<Result<Vec<_>, _>>()?;
            Ok::<_, Status>((jobs, blobs.into_vec()))
        };
        let (jobs, blobs) = if large {
            tokio::task::spawn_blocking(convert)
                .await
                .map_err(|e| Status::internal(format!("reading the jobs: {e}")))??
        } else {
            convert()?
        };
        let command = Command::SubmitJobs { blobs, jobs };
        let response = write(&self.replica, Envelope::new(actor, command)).await?;
        let Response::Submitted(results) = response else {
            return Err(Status::internal(format!("unexpected answer {response:?}")));
        };
        Ok(TonicResponse::new(pb::SubmitJobsResponse {
            results: results
                .into_iter()
                .map(|r| pb::SubmitResult {
                    result: Some(match r {
                        Ok(id) => pb::submit_result::Result::JobId(id.0),
                        Err(e) => pb::submit_result::Result::Error(e.to_string()),
                    }),
                })
                .collect(),
        }))
    }

    async fn cancel_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |jobs| Command::CancelJobs { jobs })
            .await
    }

    async fn hold_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |jobs| Command::HoldJobs { jobs })
            .await
    }

    async fn release_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |jobs| Command::ReleaseJobs { jobs })
            .await
    }

    async fn requeue_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |jobs| Command::RequeueJobs { jobs })
            .await
    }

    async fn update_jobs(
        &self,
        request: Request<pb::UpdateJobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        use docket_core::job::spec::TimeRequest;
        let actor = self.auth.caller(&request).await?;
        let req = request.into_inner();
        let refs = job_refs(&req.jobs)?;
        let time_limit = match req.time_limit_seconds {
            None => None,
            Some(0) => Some(TimeRequest::Unlimited),
            Some(s) if s < 0 => {
                return Err(Status::invalid_argument(format!(
                    "time_limit_seconds: {s} is negative; give seconds > 0, or 0 for no limit"
                )));
            }
            Some(s) => Some(TimeRequest::Limit(docket_core::quantity::Seconds(s as u64))),
        };
        if time_limit.is_none() && req.name.is_none() && req.nice.is_none() && req.comment.is_none()
        {
            return Err(Status::invalid_argument(
                "nothing to update: give time_limit_seconds, name, nice or comment",
            ));
        }
        // Bounded before anything is proposed: the log carries only what apply could accept.
        let name = req
            .name
            .map(|n| crate::convert::text("name", &n, docket_core::apply::MAX_NAME_BYTES))
            .transpose()?;
        let comment = req
            .comment
            .map(|c| crate::convert::text("comment", &c, docket_core::job::spec::MAX_COMMENT))
            .transpose()?;
        let update = docket_core::apply::update::JobUpdate {
            time_limit,
            name,
            nice: req.nice,
            comment,
        };
        let command = Command::UpdateJobs {
            jobs: refs.clone(),
            update,
        };
        self.per_job_command(actor, command, &refs).await
    }

    async fn signal_jobs(
        &self,
        request: Request<pb::SignalJobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let req = request.into_inner();
        if !(1..=64).contains(&req.signal) {
            return Err(Status::invalid_argument(format!(
                "signal: {} is not a signal number (1..64)",
                req.signal
            )));
        }
        let refs = job_refs(&req.jobs)?;
        let Some(agents) = &self.agents else {
            return Err(Status::unimplemented(
                "this controller runs no agent sessions",
            ));
        };
        agents.require_leader()?;
        let targets = self
            .replica
            .read_stale(|a| a.machine.state.signal_targets(&actor, &refs));
        let results = refs
            .iter()
            .zip(targets)
            .map(|(r, t)| pb::JobResult {
                job: Some(convert::job_ref_out(r)),
                error: match t {
                    Err(e) => e.to_string(),
                    Ok(runs) => runs
                        .iter()
                        .filter_map(|run| agents.signal(run, req.signal).err())
                        .collect::<Vec<_>>()
                        .join("; "),
                },
            })
            .collect();
        Ok(TonicResponse::new(pb::PerJobResponse { results }))
    }

    async fn create_step(
        &self,
        request: Request<pb::CreateStepRequest>,
    ) -> Result<TonicResponse<pb::CreateStepResponse>, Status> {
        self.create_step_rpc(request).await
    }

    async fn cancel_steps(
        &self,
        request: Request<pb::CancelStepsRequest>,
    ) -> Result<TonicResponse<pb::PerStepResponse>, Status> {
        self.cancel_steps_rpc(request).await
    }

    async fn complete_job(
        &self,
        request: Request<pb::CompleteJobRequest>,
    ) -> Result<TonicResponse<pb::CompleteJobResponse>, Status> {
        self.complete_job_rpc(request).await
    }

    async fn associations(
        &self,
        request: Request<pb::AssociationsRequest>,
    ) -> Result<TonicResponse<pb::AssociationsResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let cluster = self.cluster.clone();
        let response = read(&self.replica, false, self.read_timeout, move |state| {
            crate::associations::associations(state, &actor, &cluster)
        })
        .await?;
        Ok(TonicResponse::new(response))
    }

    async fn share_tree(
        &self,
        request: Request<pb::ShareTreeRequest>,
    ) -> Result<TonicResponse<pb::ShareTreeResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let req = request.into_inner();
        let users: BTreeSet<String> = req.users.iter().cloned().collect();
        let accounts: BTreeSet<String> = req.accounts.iter().cloned().collect();
        let response = read(&self.replica, false, self.read_timeout, |state| {
            // An account and every account above it.
            let lineage = |account: &docket_core::AccountName| -> Vec<String> {
                let mut out = vec![account.to_string()];
                let mut at = state.accounts.accounts.get(account);
                while let Some(parent) = at.and_then(|a| a.parent.as_ref()) {
                    out.push(parent.to_string());
                    at = state.accounts.accounts.get(parent);
                    if out.len() > 64 {
                        break;
                    }
                }
                out
            };
            let lines = state.share_tree(state.applied.now);
            // Accounts above a shown user stay, so the tree reads as a tree.
            let above_users: BTreeSet<String> = lines
                .iter()
                .filter(|l| {
                    l.row
                        .user
                        .as_ref()
                        .is_some_and(|u| users.contains(u.as_str()))
                })
                .flat_map(|l| lineage(&l.row.account))
                .collect();
            let rows = lines
                .iter()
                .filter(|l| state.may_see_usage(&actor, &l.row.account, l.row.user.as_ref()))
                .filter(|l| {
                    users.is_empty()
                        || match &l.row.user {
                            Some(u) => users.contains(u.as_str()),
                            None => above_users.contains(l.row.account.as_str()),
                        }
                })
                .filter(|l| {
                    accounts.is_empty()
                        || lineage(&l.row.account).iter().any(|a| accounts.contains(a))
                })
                .map(|l| pb::ShareRow {
                    account: l.row.account.to_string(),
                    user: l
                        .row
                        .user
                        .as_ref()
                        .map(|u| u.to_string())
                        .unwrap_or_default(),
                    depth: l.depth,
                    raw_shares: l.row.raw_shares,
                    norm_shares: l.row.norm_shares,
                    raw_usage: l.row.raw_usage,
                    effective_usage: l.row.effective_usage,
                    level_fs: l.row.level_fs,
                    fairshare: l.row.fairshare,
                })
                .collect();
            pb::ShareTreeResponse {
                algorithm: match state.config.fairshare.algorithm {
                    docket_core::fairshare::FairshareAlgorithm::FairTree => "fair_tree",
                    docket_core::fairshare::FairshareAlgorithm::Classic => "classic",
                    docket_core::fairshare::FairshareAlgorithm::It4i => "it4i",
                }
                .to_owned(),
                rows,
            }
        })
        .await?;
        Ok(TonicResponse::new(response))
    }

    async fn explain_priority(
        &self,
        request: Request<pb::ExplainPriorityRequest>,
    ) -> Result<TonicResponse<pb::ExplainPriorityResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let req = request.into_inner();
        let ids: BTreeSet<u64> = req.job_ids.iter().copied().collect();
        let users: BTreeSet<String> = req.users.iter().cloned().collect();
        let response = read(&self.replica, false, self.read_timeout, |state| {
            let inputs = state.priority_inputs(state.applied.now);
            let jobs = state
                .jobs
                .values()
                .filter(|j| j.state == JobState::Pending)
                .filter(|j| ids.is_empty() || ids.contains(&j.id.0))
                .filter(|j| users.is_empty() || users.contains(j.spec.user.as_str()))
                .filter(|j| state.may_see_job(&actor, j, Data::Jobs))
                .take(MAX_PAGE)
                .map(|j| {
                    let e = docket_core::priority::explain(&inputs, j);
                    pb::JobPriority {
                        job_id: j.id.0,
                        user: j.spec.user.to_string(),
                        partition: j.resolved.partition.to_string(),
                        priority: e.priority,
                        factors: e
                            .factors
                            .iter()
                            .map(|f| pb::PriorityFactor {
                                name: f.name.to_owned(),
                                value: f.value,
                                weight: f.weight,
                                contribution: f.contribution,
                            })
                            .collect(),
                    }
                })
                .collect();
            pb::ExplainPriorityResponse {
                formula: state.config.priority.formula.name().to_owned(),
                jobs,
            }
        })
        .await?;
        Ok(TonicResponse::new(response))
    }

    async fn suspend_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |jobs| Command::SuspendJobs { jobs })
            .await
    }

    async fn resume_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |jobs| Command::ResumeJobs { jobs })
            .await
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<TonicResponse<pb::JobInfo>, Status> {
        let actor = self.auth.caller(&request).await?;
        let id = JobId(request.get_ref().job_id);
        let stale = stale(request.get_ref().consistency);
        // A job the caller may not see is, to them, not there.
        let info = read(&self.replica, stale, self.read_timeout, |state| {
            state
                .jobs
                .get(&id)
                .filter(|j| state.may_see_job(&actor, j, Data::Jobs))
                .map(convert::job_info)
        })
        .await?;
        info.map(TonicResponse::new)
            .ok_or_else(|| Status::not_found(format!("job {id} is not in the queue")))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<TonicResponse<pb::ListJobsResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let req = request.get_ref();
        let filter = Filter::new(req)?;
        let page = match req.page_size as usize {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => {
                return Err(Status::invalid_argument(format!(
                    "page_size: {n} exceeds the limit of {MAX_PAGE}"
                )));
            }
            n => n,
        };
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(JobId(req.page_token.parse().map_err(|_| {
                Status::invalid_argument(format!(
                    "page_token: {:?} is not a token this service returned",
                    req.page_token
                ))
            })?))
        };
        let (jobs, more) = read(
            &self.replica,
            stale(req.consistency),
            self.read_timeout,
            |state| {
                let start = after.map_or(Bound::Unbounded, Bound::Excluded);
                let mut jobs = Vec::new();
                let mut more = false;
                for job in state.jobs.range((start, Bound::Unbounded)).map(|(_, j)| j) {
                    if !filter.admits(job) || !state.may_see_job(&actor, job, Data::Jobs) {
                        continue;
                    }
                    if jobs.len() == page {
                        more = true;
                        break;
                    }
                    jobs.push(convert::job_info(job));
                }
                (jobs, more)
            },
        )
        .await?;
        let next_page_token = match (more, jobs.last()) {
            (true, Some(last)) => last.job_id.to_string(),
            _ => String::new(),
        };
        Ok(TonicResponse::new(pb::ListJobsResponse {
            jobs,
            next_page_token,
        }))
    }

    async fn accounting(
        &self,
        request: Request<pb::AccountingRequest>,
    ) -> Result<TonicResponse<pb::AccountingResponse>, Status> {
        let actor = self.auth.caller(&request).await?;
        let q = AccountingQuery::of(&request.into_inner())?;
        // The queue's part (linearizable), then the archive's, merged by job id.
        let (mut records, now, sees_all) = read(&self.replica, false, self.read_timeout, |state| {
            let now = state.applied.now;
            // Who may see archived jobs: the archive holds them outside the state, so the
            // rule is taken now (admins and public accounting see all; coordinators, the
            // accounts they coordinate; others, their own).
            let private = state.config.private_data.jobs || state.config.private_data.accounting;
            let sees_all = !private || state.is_admin(&actor);
            let start_bound = q.after.map_or(Bound::Unbounded, Bound::Excluded);
            let records: Vec<(u64, pb::AccountingRecord)> = state
                .jobs
                .range((start_bound, Bound::Unbounded))
                .map(|(_, j)| j)
                .filter(|j| q.admits(j, now))
                .filter(|j| state.may_see_job(&actor, j, Data::Accounting))
                .take(q.page + 1)
                .map(|j| {
                    let charged = state.charged_milli_su(&j.id);
                    (j.id.0, accounting_record(j, charged, false, now))
                })
                .collect();
            (records, now, sees_all)
        })
        .await?;
        if let Some(archive) = &self.archive {
            let visible = self.archived_visibility(&actor, sees_all);
            let mut taken = 0;
            archive
                .scan(q.after, |a| {
                    if q.admits(&a.job, now) && visible.admits(&a.job) {
                        records.push((
                            a.job.id.0,
                            accounting_record(&a.job, a.charged_milli_su, true, now),
                        ));
                        taken += 1;
                    }
                    taken <= q.page
                })
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        records.sort_by_key(|(id, _)| *id);
        records.dedup_by_key(|(id, _)| *id);
        let more = records.len() > q.page;
        records.truncate(q.page);
        let next_page_token = match (more, records.last()) {
            (true, Some((id, _))) => id.to_string(),
            _ => String::new(),
        };
        Ok(TonicResponse::new(pb::AccountingResponse {
            records: records.into_iter().map(|(_, r)| r).collect(),
            next_page_token,
        }))
    }
}

/// An accounting request, checked: which jobs, which window, which page.
struct AccountingQuery {
    filter: Filter,
    page: usize,
    start: Option<u64>,
    end: Option<u64>,
    /// The page starts after this job.
    after: Option<JobId>,
}

impl AccountingQuery {
    fn of(req: &pb::AccountingRequest) -> Result<Self, Status> {
        let filter = Filter::new(&pb::ListJobsRequest {
            users: req.users.clone(),
            states: req.states.clone(),
            job_states: req.job_states.clone(),
            job_ids: req.job_ids.clone(),
            ..Default::default()
        })?;
        let page = match req.page_size as usize {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => {
                return Err(Status::invalid_argument(format!(
                    "page_size: {n} exceeds the limit of {MAX_PAGE}"
                )));
            }
            n => n,
        };
        let bound = |field: &str, v: Option<i64>| -> Result<Option<u64>, Status> {
            match v {
                Some(ms) if ms < 0 => Err(Status::invalid_argument(format!(
                    "{field}: {ms} is before 1970"
                ))),
                other => Ok(other.map(|ms| ms as u64)),
            }
        };
        let (start, end) = (
            bound("start_unix_ms", req.start_unix_ms)?,
            bound("end_unix_ms", req.end_unix_ms)?,
        );
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(JobId(req.page_token.parse().map_err(|_| {
                Status::invalid_argument(format!(
                    "page_token: {:?} is not a token this service returned",
                    req.page_token
                ))
            })?))
        };
        Ok(AccountingQuery {
            filter,
            page,
            start,
            end,
            after,
        })
    }

    /// Whether `job` is one asked for, in the window as of `now`.
    fn admits(&self, job: &docket_core::job::Job, now: docket_core::quantity::TimeMs) -> bool {
        self.filter.admits(job) && in_window(job, self.start, self.end, now.0)
    }
}

/// Which archived jobs a caller who does not see all may see: their own, and those of the
/// accounts they coordinate.
struct ArchivedVisibility {
    /// None: all.
    coordinated: Option<BTreeSet<String>>,
    me: Option<String>,
}

impl ArchivedVisibility {
    fn admits(&self, job: &docket_core::job::Job) -> bool {
        match &self.coordinated {
            None => true,
            Some(accounts) => {
                self.me.as_deref() == Some(job.spec.user.as_str())
                    || accounts.contains(job.resolved.account.as_str())
            }
        }
    }
}

impl JobsService {
    /// For archived jobs the visibility rule needs the state's accounts: read once.
    fn archived_visibility(&self, actor: &Actor, sees_all: bool) -> ArchivedVisibility {
        let coordinated = match (actor, sees_all) {
            (_, true) => None,
            (Actor::User(u), false) => Some(self.replica.read_stale(|a| {
                let s = &a.machine.state;
                s.accounts
                    .accounts
                    .keys()
                    .filter(|acct| s.is_coordinator(u, acct))
                    .map(|acct| acct.to_string())
                    .collect()
            })),
            _ => Some(BTreeSet::new()),
        };
        let me = match actor {
            Actor::User(u) => Some(u.to_string()),
            _ => None,
        };
        ArchivedVisibility { coordinated, me }
    }
}

/// One accounting record of `job` at `now`.
///
/// The agent of the first node measures the job's cgroup there, steps included; the other
/// nodes run only steps, whose cpu time their agents report per step. So the job's TotalCPU
/// is the first node's job cgroup plus every step's share elsewhere, and the batch step's is
/// the first node's less the steps' share there (Slurm's sacct: the allocation's row sums
/// its steps).
fn accounting_record(
    job: &docket_core::job::Job,
    charged_milli_su: u64,
    archived: bool,
    now: docket_core::quantity::TimeMs,
) -> pb::AccountingRecord {
    let first = job.allocation_record().and_then(|a| a.shares.first());
    let (mut steps_here, mut steps_elsewhere) = (0u64, 0u64);
    for step in job.steps.list.values() {
        for (node, end) in &step.ends {
            let cpu = end.exit.cpu_time_ms;
            if first.is_some_and(|f| &f.node == node) {
                steps_here = steps_here.saturating_add(cpu);
            } else {
                steps_elsewhere = steps_elsewhere.saturating_add(cpu);
            }
        }
    }
    let first_node_cpu = job.exit.map_or(0, |e| e.cpu_time_ms);
    let batch = match first {
        Some(share) if job.start_time.is_some() && !job.spec.interactive => Some(pb::BatchStep {
            cpus: u64::from(share.cpus),
            total_cpu_ms: first_node_cpu.saturating_sub(steps_here),
            max_rss_mib: job.exit.map_or(0, |e| e.max_rss_mib),
            node: share.node.to_string(),
        }),
        _ => None,
    };
    let alloc = job.allocation_record();
    let alloc_mem_mib = alloc.map_or(0, |a| a.memory().0);
    let req_mem_mib = match job.resolved.memory {
        docket_core::job::MemoryRequest::PerNode(m) => {
            m.0.saturating_mul(u64::from(job.spec.nodes.max(1)))
        }
        docket_core::job::MemoryRequest::PerCpu(m) => m.0.saturating_mul(job.cpus()),
        docket_core::job::MemoryRequest::WholeNode => alloc_mem_mib,
    };
    pb::AccountingRecord {
        job: Some(convert::job_info(job)),
        alloc_cpus: alloc.map_or(0, |a| a.cpus()),
        req_mem_mib,
        alloc_mem_mib,
        alloc_gpus: alloc.map_or(0, |a| a.gpus()),
        alloc_nodes: alloc.map_or(0, |a| a.shares.len() as u32),
        // Allocations made before billing was recorded: the default weights, one per cpu.
        alloc_billing: alloc.map_or(0, |a| a.billing_milli.map_or(a.cpus(), |b| b / 1000)),
        elapsed_seconds: job.run_time(job.end_time.unwrap_or(now)).0,
        charged_milli_su,
        archived,
        total_cpu_ms: first_node_cpu.saturating_add(steps_elsewhere),
        max_rss_mib: job.exit.map_or(0, |e| e.max_rss_mib),
        batch,
    }
}

/// Whether `job` was queued, running or ended within `[start, end]`.
fn in_window(job: &docket_core::job::Job, start: Option<u64>, end: Option<u64>, now: u64) -> bool {
    let began = job.submit_time.0;
    let ended = job.end_time.map_or(now, |t| t.0);
    start.is_none_or(|s| ended >= s) && end.is_none_or(|e| began <= e)
}

/// The filters of a listing.
struct Filter {
    users: BTreeSet<String>,
    partitions: BTreeSet<String>,
    states: BTreeSet<JobState>,
    ids: BTreeSet<u64>,
}

impl Filter {
    fn new(req: &pb::ListJobsRequest) -> Result<Self, Status> {
        let states = req
            .states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                JobState::parse(s).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "states[{i}]: {s:?} is not a job state; use {}",
                        JobState::ALL
                            .iter()
                            .map(|s| format!("{}/{}", s.name(), s.code()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })
            })
            .collect::<Result<std::collections::BTreeSet<JobState>, _>>()?;
        let mut states = states;
        for (i, value) in req.job_states.iter().enumerate() {
            let state = crate::typed::job_state_of(*value).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "job_states[{i}]: {value} is not a job state (1 to {})",
                    JobState::ALL.len()
                ))
            })?;
            states.insert(state);
        }
        Ok(Filter {
            users: req.users.iter().cloned().collect(),
            partitions: req.partitions.iter().cloned().collect(),
            states,
            ids: req.job_ids.iter().copied().collect(),
        })
    }

    fn admits(&self, job: &docket_core::job::Job) -> bool {
        (self.users.is_empty() || self.users.contains(job.spec.user.as_str()))
            && (self.partitions.is_empty()
                || self.partitions.contains(job.resolved.partition.as_str()))
            && (self.states.is_empty() || self.states.contains(&job.state))
            && (self.ids.is_empty() || self.ids.contains(&job.id.0))
    }
}

/// The status a rejected command maps to.
pub fn rejection_status(r: &Rejection) -> Status {
    match r {
        Rejection::NotPermitted(_) => Status::permission_denied(r.to_string()),
        Rejection::WrongState { .. } | Rejection::InUse { .. } | Rejection::Stale { .. } => {
            Status::failed_precondition(r.to_string())
        }
        Rejection::UnsupportedVersion { .. } | Rejection::AlreadyApplied { .. } => {
            Status::internal(r.to_string())
        }
        Rejection::Invalid { .. } | Rejection::TooLarge { .. } | Rejection::Unknown { .. } => {
            Status::invalid_argument(r.to_string())
        }
        // A step that fits once running steps end: `srun` waits and asks again, as it does
        // when its requests are rate-limited (the same status).
        Rejection::Busy { .. } => Status::resource_exhausted(r.to_string()),
    }
}
