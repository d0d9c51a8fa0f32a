//! Counting the RPCs a replica is serving, for `max_rpc_cnt`: the scheduling loops yield
//! while more than that many are in flight, so a submission storm is answered before the
//! leader spends its time planning. The same layer records each RPC's latency
//! (`docket_rpc_duration_seconds{method}`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tower::{Layer, Service};

/// A tower layer counting requests in flight in a shared counter, and those of the users'
/// services (jobs and administration, not Raft's nor the agents') in a second.
#[derive(Debug, Clone)]
pub struct InflightLayer {
    count: Arc<AtomicUsize>,
    users: Arc<AtomicUsize>,
}

impl InflightLayer {
    pub fn new(count: Arc<AtomicUsize>, users: Arc<AtomicUsize>) -> Self {
        InflightLayer { count, users }
    }
}

impl<S> Layer<S> for InflightLayer {
    type Service = Inflight<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Inflight {
            inner,
            count: self.count.clone(),
            users: self.users.clone(),
        }
    }
}

/// The service [`InflightLayer`] wraps.
#[derive(Debug, Clone)]
pub struct Inflight<S> {
    inner: S,
    count: Arc<AtomicUsize>,
    users: Arc<AtomicUsize>,
}

/// Whether an RPC's path is one of the users' services.
fn is_users(path: &str) -> bool {
    path.starts_with("/docket.v1.Jobs/") || path.starts_with("/docket.v1.Admin/")
}

/// Decrements the counter when the response future finishes or is dropped.
struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S, B, RB> Service<tonic::codegen::http::Request<B>> for Inflight<S>
where
    S: Service<tonic::codegen::http::Request<B>, Response = tonic::codegen::http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        self.count.fetch_add(1, Ordering::Relaxed);
        let guard = Guard(self.count.clone());
        let users = is_users(request.uri().path()).then(|| {
            self.users.fetch_add(1, Ordering::Relaxed);
            Guard(self.users.clone())
        });
        // `/docket.v1.Jobs/SubmitJobs` -> `docket.v1.Jobs/SubmitJobs`; a path no service
        // serves is answered UNIMPLEMENTED and counted as `unimplemented`, so whoever
        // reaches the port cannot mint label values (series) at will.
        let method = request.uri().path().trim_start_matches('/').to_owned();
        let began = std::time::Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            let served = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .is_none_or(|s| s.as_bytes() != b"12"),
                Err(_) => true,
            };
            let method = if served {
                method
            } else {
                "unimplemented".to_owned()
            };
            metrics::histogram!("docket_rpc_duration_seconds", "method" => method)
                .record(began.elapsed().as_secs_f64());
            drop((guard, users));
            result
        })
    }
}
