//! The generated health service works end to end: a tonic server on loopback answers the
//! generated client.

// Integration tests: a panic is a failed test, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use docket_proto::v1::health_check_response::ServingStatus;
use docket_proto::v1::health_client::HealthClient;
use docket_proto::v1::health_server::{Health, HealthServer};
use docket_proto::v1::{HealthCheckRequest, HealthCheckResponse};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

struct Fixed(ServingStatus);

#[tonic::async_trait]
impl Health for Fixed {
    async fn check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            status: self.0 as i32,
            component: "test".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }
}

#[tokio::test]
async fn client_reads_status_from_server_on_loopback() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(Fixed(ServingStatus::Serving)))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stop_rx.await;
            }),
    );

    let mut client = tokio::time::timeout(
        Duration::from_secs(10),
        HealthClient::connect(format!("http://{addr}")),
    )
    .await
    .expect("no connection within 10 s")
    .expect("connect failed");
    let reply = tokio::time::timeout(Duration::from_secs(10), client.check(HealthCheckRequest {}))
        .await
        .expect("health check did not answer within 10 s")
        .expect("health check failed")
        .into_inner();

    assert_eq!(reply.status(), ServingStatus::Serving);
    assert_eq!(reply.component, "test");
    assert_eq!(reply.version, env!("CARGO_PKG_VERSION"));

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server did not stop within 10 s")
        .unwrap()
        .unwrap();
}

#[test]
fn unknown_status_numbers_decode_as_unspecified() {
    // A newer peer may send a status this build does not know; it must not be taken as SERVING.
    let reply = HealthCheckResponse {
        status: 42,
        ..Default::default()
    };
    assert_eq!(reply.status(), ServingStatus::Unspecified);
}
