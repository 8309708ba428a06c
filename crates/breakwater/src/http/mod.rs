//! The HTTP server of the ingress and the admin listener: hyper's HTTP/1
//! connection driver under limits that a listener facing the internet
//! needs, which `axum::serve` does not set.
//!
//! - **Connections**: at most `max_connections` at once; one more is
//!   closed at accept (its peer sees a reset and retries), so a crowd of
//!   slow clients cannot take every file descriptor.
//! - **Header read timeout**: a client that does not send a whole request
//!   head within `header_timeout` (also between requests of a kept-alive
//!   connection) is disconnected (hyper's `header_read_timeout`).
//! - **Request deadline**: the body read and the handling of one request
//!   together within `request_timeout`, or 408 `timeout` (a body trickled a
//!   byte at a time is cut off; a webhook answered late is retried by its
//!   sender, and nothing is acknowledged without a 2xx).
//! - **Requests in flight**: at most `max_in_flight` handled at once; more
//!   are answered 503 `busy` with `Retry-After` at once.
//!
//! Shutdown stops accepting, asks every connection to finish its request
//! in progress, and drops those still open after [`SHUTDOWN_GRACE`], so a
//! half-sent request cannot hold the process.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::{Service, ServiceExt};

use crate::telemetry;

/// Longest wait for open connections at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What one listener allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_in_flight: usize,
}

fn json_error(status: StatusCode, code: &str, detail: &str, retry_after: bool) -> Response<Body> {
    // The body every refusal of both listeners has.
    let body = serde_json::to_string(&breakwater_admin_api::ErrorBody::new(code, detail))
        .unwrap_or_default();
    let mut response = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json");
    if retry_after {
        response = response.header(header::RETRY_AFTER, crate::ingress::RETRY_AFTER_SECS);
    }
    response
        .body(Body::from(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Serves `service` (an axum router, or the ingress's own service) on
/// `listener` under `limits` until `stop`, then drains (see the module
/// doc). `name` labels its metrics and logs.
pub async fn serve<S>(
    name: &'static str,
    listener: TcpListener,
    service: S,
    limits: ServerLimits,
    mut stop: watch::Receiver<bool>,
) where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
    let mut open = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        while open.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most often: pause rather than spin.
                tracing::warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            metrics::counter!(telemetry::HTTP_CONNECTIONS_REFUSED, "listener" => name).increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let per_connection = service.clone();
        let in_flight = Arc::clone(&in_flight);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let service = per_connection.clone();
            let in_flight = Arc::clone(&in_flight);
            async move {
                let Ok(_slot) = in_flight.try_acquire_owned() else {
                    return Ok::<_, Infallible>(json_error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "busy",
                        "too many requests in flight; retry later",
                        true,
                    ));
                };
                match tokio::time::timeout(limits.request_timeout, service.oneshot(req)).await {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(never)) => match never {},
                    Err(_) => Ok(json_error(
                        StatusCode::REQUEST_TIMEOUT,
                        "timeout",
                        "the request was not received and handled in time",
                        false,
                    )),
                }
            }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let mut stop = stop.clone();
        open.spawn(async move {
            let _permit = permit;
            let mut connection = std::pin::pin!(connection);
            let stopped = async {
                let _ = stop.wait_for(|s| *s).await;
            };
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stopped => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
                }
            }
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), async {
        while open.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            listener = name,
            "connections still open after the grace period: dropped"
        );
        open.abort_all();
    }
}
