//! A request body that is not a valid protobuf message is the caller's error, on every
//! docket server (the controller's services, the agents' step port).
//!
//! tonic answers a request it cannot decode with `INTERNAL` ("failed to decode Protobuf
//! message: ..."), the code of a server fault. Operators alert on `INTERNAL`, and clients
//! treat it as retryable trouble on our side; a malformed request is neither. This layer
//! turns exactly those answers into `INVALID_ARGUMENT`, keeping tonic's message (which names
//! what did not decode), and likewise a message frame cut short. A frame whose compressed
//! flag is set without an encoding stays `INTERNAL`: the gRPC compression specification
//! requires that code for it.

use std::task::{Context, Poll};

use tonic::codegen::http::{HeaderValue, Request, Response};
use tower::{Layer, Service};

/// What tonic's messages for undecodable requests start with, percent-encoded as they travel
/// in `grpc-message`: a body that is not the method's protobuf message, a frame cut short.
const DECODE_FAILURES: [&[u8]; 2] = [
    b"failed%20to%20decode%20Protobuf%20message",
    b"Unexpected%20EOF%20decoding%20stream",
];

/// Wraps a service so that decode failures are answered as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MalformedLayer;

impl<S> Layer<S> for MalformedLayer {
    type Service = Malformed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Malformed { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Malformed<S> {
    inner: S,
}

/// Rewrites `response` if it is tonic's answer to an undecodable request.
pub fn reclassify<B>(response: &mut Response<B>) {
    let headers = response.headers_mut();
    let is_decode_failure = headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() == b"13")
        && headers
            .get("grpc-message")
            .is_some_and(|m| DECODE_FAILURES.iter().any(|f| m.as_bytes().starts_with(f)));
    if is_decode_failure {
        headers.insert("grpc-status", HeaderValue::from_static("3"));
    }
}

impl<S, B, RB> Service<Request<B>> for Malformed<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut result = future.await;
            if let Ok(response) = &mut result {
                reclassify(response);
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: &'static str, message: &'static str) -> Response<()> {
        let mut r = Response::new(());
        r.headers_mut()
            .insert("grpc-status", HeaderValue::from_static(status));
        r.headers_mut()
            .insert("grpc-message", HeaderValue::from_static(message));
        r
    }

    #[test]
    fn only_decode_failures_become_invalid_argument() {
        let mut r = answer(
            "13",
            "failed%20to%20decode%20Protobuf%20message%3A%20invalid%20varint",
        );
        reclassify(&mut r);
        assert_eq!(r.headers()["grpc-status"], "3");
        let mut r = answer("13", "Unexpected%20EOF%20decoding%20stream.");
        reclassify(&mut r);
        assert_eq!(r.headers()["grpc-status"], "3");
        for (status, message) in [
            (
                "13",
                "protocol%20error%3A%20received%20message%20with%20compressed-flag%20but%20no%20grpc-encoding%20was%20specified",
            ),
            ("13", "archive%20unreadable"),
            ("5", "failed%20to%20decode%20Protobuf%20message"),
        ] {
            let mut r = answer(status, message);
            reclassify(&mut r);
            assert_eq!(r.headers()["grpc-status"], status);
        }
    }
}
