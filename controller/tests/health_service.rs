//! The controller's health service reports readiness changes to a client on loopback.

// Integration tests: a panic is a failed test, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use docket_controller::health::{COMPONENT, Readiness};
use docket_proto::v1::HealthCheckRequest;
use docket_proto::v1::health_check_response::ServingStatus;
use docket_proto::v1::health_client::HealthClient;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn readiness_flips_are_visible_to_clients() {
    let readiness = Readiness::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(readiness.service())
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stop_rx.await;
            }),
    );
    let mut client =
        tokio::time::timeout(DEADLINE, HealthClient::connect(format!("http://{addr}")))
            .await
            .unwrap()
            .unwrap();
    let mut check = async || {
        tokio::time::timeout(DEADLINE, client.check(HealthCheckRequest {}))
            .await
            .unwrap()
            .unwrap()
            .into_inner()
    };

    let first = check().await;
    assert_eq!(first.status(), ServingStatus::NotServing);
    assert_eq!(first.component, COMPONENT);

    let mut changes = readiness.subscribe();
    readiness.set_serving(true);
    tokio::time::timeout(DEADLINE, changes.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(check().await.status(), ServingStatus::Serving);

    readiness.set_serving(false);
    assert_eq!(check().await.status(), ServingStatus::NotServing);
    assert_eq!(readiness.status(), ServingStatus::NotServing);

    stop_tx.send(()).unwrap();
    tokio::time::timeout(DEADLINE, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
