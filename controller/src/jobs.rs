//! The `docket.v1.Jobs` service: submit, act on, and look at jobs.
//!
//! Writes become docket-core commands proposed through the local replica (forwarded to the
//! leader when it is a follower) and are answered once applied; reads are linearizable by
//! default and stale on request. How outcomes map to status codes is in the proto file.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use docket_core::job::JobState;
use docket_core::{Actor, Command, Envelope, JobId, Rejection, Response, UserName};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_server::{Jobs, JobsServer};
use docket_raft::replica::Replica;
use tokio::sync::Notify;
use tonic::{Request, Response as TonicResponse, Status};

use crate::convert;
use crate::identity::caller;
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
    /// Woken after a submission so the leader runs its direct pass.
    submitted: Arc<Notify>,
}

impl JobsService {
    pub fn new(
        replica: Replica<CoreMachine>,
        read_timeout: Duration,
        submitted: Arc<Notify>,
    ) -> JobsServer<Self> {
        JobsServer::new(JobsService {
            replica,
            read_timeout,
            submitted,
        })
    }

    async fn per_job(
        &self,
        request: Request<pb::JobsRequest>,
        make: fn(Actor, Vec<docket_core::job::JobRef>) -> Command,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        let actor = caller(&request)?;
        let refs: Vec<_> = request
            .get_ref()
            .jobs
            .iter()
            .map(convert::job_ref)
            .collect();
        if refs.is_empty() {
            return Err(Status::invalid_argument("jobs: name at least one job"));
        }
        let response = write(&self.replica, Envelope::new(make(actor, refs.clone()))).await?;
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

#[tonic::async_trait]
impl Jobs for JobsService {
    async fn submit_jobs(
        &self,
        request: Request<pb::SubmitJobsRequest>,
    ) -> Result<TonicResponse<pb::SubmitJobsResponse>, Status> {
        let actor = caller(&request)?;
        let user: UserName = match &actor {
            Actor::User(u) => u.clone(),
            Actor::Operator => "root"
                .parse()
                .map_err(|e| Status::internal(format!("root is not a user name: {e}")))?,
        };
        let specs = &request.get_ref().jobs;
        if specs.is_empty() {
            return Err(Status::invalid_argument("jobs: submit at least one job"));
        }
        let max_array_index = self
            .replica
            .read_stale(|a| a.machine.state.config.max_array_size.saturating_sub(1));
        let mut blobs = Vec::new();
        let jobs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| convert::job_spec(i, s, user.clone(), max_array_index, &mut blobs))
            .collect::<Result<Vec<_>, _>>()?;
        let command = Command::SubmitJobs { actor, blobs, jobs };
        let response = write(&self.replica, Envelope::new(command)).await?;
        let Response::Submitted(results) = response else {
            return Err(Status::internal(format!("unexpected answer {response:?}")));
        };
        self.submitted.notify_one();
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
        self.per_job(request, |actor, jobs| Command::CancelJobs { actor, jobs })
            .await
    }

    async fn hold_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |actor, jobs| Command::HoldJobs { actor, jobs })
            .await
    }

    async fn release_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |actor, jobs| Command::ReleaseJobs { actor, jobs })
            .await
    }

    async fn suspend_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |actor, jobs| Command::SuspendJobs { actor, jobs })
            .await
    }

    async fn resume_jobs(
        &self,
        request: Request<pb::JobsRequest>,
    ) -> Result<TonicResponse<pb::PerJobResponse>, Status> {
        self.per_job(request, |actor, jobs| Command::ResumeJobs { actor, jobs })
            .await
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<TonicResponse<pb::JobInfo>, Status> {
        caller(&request)?;
        let id = JobId(request.get_ref().job_id);
        let stale = stale(request.get_ref().consistency);
        let info = read(&self.replica, stale, self.read_timeout, |state| {
            state.jobs.get(&id).map(|j| convert::job_info(j))
        })
        .await?;
        info.map(TonicResponse::new)
            .ok_or_else(|| Status::not_found(format!("job {id} is not in the queue")))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<TonicResponse<pb::ListJobsResponse>, Status> {
        caller(&request)?;
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
                    if !filter.admits(job) {
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
            .collect::<Result<_, _>>()?;
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
    }
}
