//! Job steps through the `docket.v1.Jobs` service: `srun` creates them, `scancel JOBID.STEP`
//! stops them.
//!
//! A step is created by a command through the log like any other write, so two `srun`s
//! racing for the same cpus are ordered by the log and never both placed on them. A step
//! that fits only once running steps end answers RESOURCE_EXHAUSTED: `srun` waits and asks
//! again (Slurm's "step creation temporarily disabled, retrying"), or gives up with
//! `--immediate`. The step's tasks are then started by the agents of its nodes, told through
//! their instruction streams like a job's launch.

use docket_core::job::{StepId, StepRef};
use docket_core::{Actor, Command, Envelope, JobId, Response};
use docket_proto::v1 as pb;
use tonic::{Request, Response as TonicResponse, Status};

use crate::convert;
use crate::jobs::{JobsService, MAX_REFS};
use crate::write::write;

impl JobsService {
    pub(crate) async fn create_step_rpc(
        &self,
        request: Request<pb::CreateStepRequest>,
    ) -> Result<TonicResponse<pb::CreateStepResponse>, Status> {
        let actor = self.caller(&request).await?;
        if matches!(actor, Actor::Node(_) | Actor::Controller) {
            return Err(Status::permission_denied("only users create steps"));
        }
        // The answer names the agents of the step's nodes, which only the leader knows.
        if let Some(agents) = self.agents() {
            agents.require_leader_to("steps are created by the leader")?;
        }
        let req = request.into_inner();
        let spec = convert::step_spec(&req)?;
        let command = Command::CreateStep {
            job: JobId(req.job_id),
            spec,
        };
        match write(self.replica(), Envelope::new(actor, command)).await? {
            Response::StepCreated { step, layout } => {
                let nodes: Vec<_> = layout.iter().map(|s| s.node.clone()).collect();
                let addresses = match self.agents() {
                    Some(agents) => {
                        agents.wake();
                        agents.step_addresses(&nodes)
                    }
                    None => Default::default(),
                };
                Ok(TonicResponse::new(pb::CreateStepResponse {
                    step_id: step.0,
                    layout: layout
                        .into_iter()
                        .map(|s| pb::StepTasks {
                            node: s.node.to_string(),
                            tasks: s.tasks,
                            first_task: s.first_task,
                            cpus: s.cpus,
                            agent_address: addresses.get(&s.node).cloned().unwrap_or_default(),
                        })
                        .collect(),
                }))
            }
            other => Err(Status::internal(format!("unexpected answer {other:?}"))),
        }
    }

    pub(crate) async fn complete_job_rpc(
        &self,
        request: Request<pb::CompleteJobRequest>,
    ) -> Result<TonicResponse<pb::CompleteJobResponse>, Status> {
        let actor = self.caller(&request).await?;
        if matches!(actor, Actor::Node(_) | Actor::Controller) {
            return Err(Status::permission_denied("only users complete jobs"));
        }
        let req = request.into_inner();
        let command = Command::CompleteJob {
            job: JobId(req.job_id),
            exit: docket_core::job::ExitStatus {
                code: req.exit_code,
                signal: req.signal,
                ..Default::default()
            },
        };
        write(self.replica(), Envelope::new(actor, command)).await?;
        if let Some(agents) = self.agents() {
            agents.wake();
        }
        Ok(TonicResponse::new(pb::CompleteJobResponse {}))
    }

    pub(crate) async fn cancel_steps_rpc(
        &self,
        request: Request<pb::CancelStepsRequest>,
    ) -> Result<TonicResponse<pb::PerStepResponse>, Status> {
        let actor = self.caller(&request).await?;
        let steps = &request.get_ref().steps;
        if steps.is_empty() {
            return Err(Status::invalid_argument("steps: name at least one step"));
        }
        if steps.len() > MAX_REFS {
            return Err(Status::invalid_argument(format!(
                "steps: {} named; the limit is {MAX_REFS} per request",
                steps.len()
            )));
        }
        let refs: Vec<StepRef> = steps
            .iter()
            .map(|s| StepRef {
                job: JobId(s.job_id),
                step: StepId(s.step_id),
            })
            .collect();
        let command = Command::CancelSteps {
            steps: refs.clone(),
        };
        let Response::PerJob(results) =
            write(self.replica(), Envelope::new(actor, command)).await?
        else {
            return Err(Status::internal("unexpected answer to CancelSteps"));
        };
        Ok(TonicResponse::new(pb::PerStepResponse {
            results: refs
                .iter()
                .zip(results)
                .map(|(r, result)| pb::StepResult {
                    step: Some(pb::StepRef {
                        job_id: r.job.0,
                        step_id: r.step.0,
                    }),
                    error: result.err().map(|e| e.to_string()).unwrap_or_default(),
                })
                .collect(),
        }))
    }
}
