//! Readiness, as seen from outside: the `docket.v1.Health` service and the
//! `docket_controller_ready` gauge.
//!
//! A replica starts NOT_SERVING, becomes SERVING once it can answer the API (it has joined
//! its cluster and caught up), and goes back to NOT_SERVING when it begins shutting down, so
//! clients and load balancers move to another replica before this one stops answering.
//! Status is kept in a watch channel: the service always answers with the latest value and
//! other tasks (systemd notification) can wait for a change.

use docket_proto::v1::health_check_response::ServingStatus;
use docket_proto::v1::health_server::{Health, HealthServer};
use docket_proto::v1::{HealthCheckRequest, HealthCheckResponse};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Name this process reports as its component.
pub const COMPONENT: &str = "docket-controller";

/// The writable side: whoever owns the replica's lifecycle flips readiness here.
#[derive(Debug, Clone)]
pub struct Readiness {
    tx: watch::Sender<ServingStatus>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Starts NOT_SERVING.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(ServingStatus::NotServing);
        metrics::gauge!("docket_controller_ready").set(0.0);
        Readiness { tx }
    }

    pub fn set_serving(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.tx.send_replace(status);
        metrics::gauge!("docket_controller_ready").set(if serving { 1.0 } else { 0.0 });
    }

    pub fn status(&self) -> ServingStatus {
        *self.tx.borrow()
    }

    /// Waits for the next change of status.
    pub fn subscribe(&self) -> watch::Receiver<ServingStatus> {
        self.tx.subscribe()
    }

    /// The gRPC service answering with this readiness.
    pub fn service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService {
            rx: self.tx.subscribe(),
        })
    }
}

/// `docket.v1.Health` for a controller replica.
#[derive(Debug)]
pub struct HealthService {
    rx: watch::Receiver<ServingStatus>,
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = *self.rx.borrow();
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
            component: COMPONENT.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }
}
