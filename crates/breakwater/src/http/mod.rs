//! The HTTP server of the ingress and the admin listener: hyper's HTTP/1
//! connection driver under limits that a listener facing the internet
//! needs, which `axum::serve` does not set.
//!
//! - **Connections**: at most `max_connections` at once, so a crowd of
//!   slow clients cannot take every file descriptor. When full, a listener
//!   either closes the new connection at accept (`WhenFull::Refuse`, the
//!   ingress: its peer sees a reset and retries) or makes room for it
//!   (`WhenFull::CloseIdlest`, the admin listener): the connection idle
//!   the longest, with no request in progress, is closed, so a crowd of
//!   idle sockets cannot lock the operator out. A request in progress is
//!   never cut for a newcomer; only when every connection has one is the
//!   newcomer refused.
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

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;
use tower::{Service, ServiceExt};

use crate::telemetry;

/// Longest wait for open connections at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What one listener allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub max_connections: usize,
    /// What a full listener does with one more connection.
    pub when_full: WhenFull,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_in_flight: usize,
}

/// What a listener with `max_connections` open does with one more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Close the new one at accept.
    Refuse,
    /// Close the connection idle the longest (no request in progress) and
    /// take the new one; refuse it only when every connection is busy.
    CloseIdlest,
}

/// A connection's state, for [`WhenFull::CloseIdlest`].
const IDLE: u8 = 0;
const BUSY: u8 = 1;
const CLOSED: u8 = 2;

/// One open connection of a listener that closes its idlest when full.
#[derive(Debug)]
struct Tracked {
    /// [`IDLE`], [`BUSY`] (a request in progress) or [`CLOSED`] (chosen to
    /// make room: it takes no more requests).
    state: AtomicU8,
    /// Since when it has been idle, in ms from the listener's start.
    idle_since_ms: AtomicU64,
    /// Woken when the connection is chosen to make room.
    close: Notify,
}

impl Tracked {
    /// A request begins; false if the connection was chosen to close.
    fn begin(&self) -> bool {
        self.state
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The request's answer is made: idle from `now_ms`.
    fn end(&self, now_ms: u64) {
        self.idle_since_ms.store(now_ms, Ordering::Relaxed);
        let _ = self
            .state
            .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The open connections of a [`WhenFull::CloseIdlest`] listener.
#[derive(Debug)]
struct Tracker {
    max: usize,
    started: Instant,
    open: Mutex<TrackerInner>,
}

#[derive(Debug, Default)]
struct TrackerInner {
    next_id: u64,
    open: HashMap<u64, Arc<Tracked>>,
}

/// What [`Tracker::admit`] did.
#[derive(Debug)]
enum Admission {
    /// In, as `id`; `evicted` is true if another connection was closed for it.
    In {
        id: u64,
        tracked: Arc<Tracked>,
        evicted: bool,
    },
    /// Full of busy connections: refused.
    Full,
}

impl Tracker {
    fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            started: Instant::now(),
            open: Mutex::new(TrackerInner::default()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Takes a new connection, closing the idlest one if the listener is
    /// full.
    fn admit(&self) -> Admission {
        let now_ms = self.now_ms();
        let mut inner = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut evicted = false;
        if inner.open.len() >= self.max {
            // The idlest first; one that turns busy meanwhile is skipped.
            let mut idle: Vec<(u64, u64)> = inner
                .open
                .iter()
                .filter(|(_, t)| t.state.load(Ordering::Acquire) == IDLE)
                .map(|(id, t)| (t.idle_since_ms.load(Ordering::Relaxed), *id))
                .collect();
            idle.sort_unstable();
            let chosen = idle.into_iter().find_map(|(_, id)| {
                let t = inner.open.get(&id)?;
                t.state
                    .compare_exchange(IDLE, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                    .then_some(id)
            });
            let Some(id) = chosen else {
                return Admission::Full;
            };
            if let Some(t) = inner.open.remove(&id) {
                t.close.notify_one();
            }
            evicted = true;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let tracked = Arc::new(Tracked {
            state: AtomicU8::new(IDLE),
            idle_since_ms: AtomicU64::new(now_ms),
            close: Notify::new(),
        });
        inner.open.insert(id, Arc::clone(&tracked));
        Admission::In {
            id,
            tracked,
            evicted,
        }
    }

    /// The connection `id` ended.
    fn leave(&self, id: u64) {
        let mut inner = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        inner.open.remove(&id);
    }
}

/// A connection's place on its listener, given back when it ends.
enum Place {
    Permit {
        _permit: tokio::sync::OwnedSemaphorePermit,
    },
    Tracked(Arc<Tracker>, u64),
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Self::Tracked(tracker, id) = self {
            tracker.leave(*id);
        }
    }
}

/// Ends a tracked request when its answer is made or it is dropped.
struct Busy<'a>(&'a Tracker, &'a Tracked);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.1.end(self.0.now_ms());
    }
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
    let tracker = Arc::new(Tracker::new(limits.max_connections));
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
        let (place, tracked) = match limits.when_full {
            WhenFull::Refuse => match Arc::clone(&connections).try_acquire_owned() {
                Ok(permit) => (Place::Permit { _permit: permit }, None),
                Err(_) => {
                    metrics::counter!(telemetry::HTTP_CONNECTIONS_REFUSED, "listener" => name)
                        .increment(1);
                    drop(stream);
                    continue;
                }
            },
            WhenFull::CloseIdlest => match tracker.admit() {
                Admission::In {
                    id,
                    tracked,
                    evicted,
                } => {
                    if evicted {
                        metrics::counter!(telemetry::HTTP_CONNECTIONS_EVICTED, "listener" => name)
                            .increment(1);
                    }
                    (Place::Tracked(Arc::clone(&tracker), id), Some(tracked))
                }
                Admission::Full => {
                    metrics::counter!(telemetry::HTTP_CONNECTIONS_REFUSED, "listener" => name)
                        .increment(1);
                    drop(stream);
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let per_connection = service.clone();
        let in_flight = Arc::clone(&in_flight);
        let per_request = tracked.clone();
        let tracker_of_requests = Arc::clone(&tracker);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let service = per_connection.clone();
            let in_flight = Arc::clone(&in_flight);
            let tracked = per_request.clone();
            let tracker = Arc::clone(&tracker_of_requests);
            async move {
                if let Some(t) = &tracked
                    && !t.begin()
                {
                    // Chosen to make room just now: it is closing.
                    return Ok(json_error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "busy",
                        "too many connections; retry later",
                        true,
                    ));
                }
                let _busy = tracked.as_deref().map(|t| Busy(&tracker, t));
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
            let _place = place;
            let mut connection = std::pin::pin!(connection);
            let stopped = async {
                let _ = stop.wait_for(|s| *s).await;
            };
            let made_room = async {
                match &tracked {
                    Some(t) => t.close.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stopped => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
                }
                // Idle (no request in progress): dropped at once.
                () = made_room => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(a: Admission) -> (u64, Arc<Tracked>, bool) {
        match a {
            Admission::In {
                id,
                tracked,
                evicted,
            } => (id, tracked, evicted),
            Admission::Full => panic!("refused"),
        }
    }

    #[test]
    fn a_full_listener_closes_its_idlest_connection_and_never_a_busy_one() {
        let tracker = Tracker::new(3);
        let (a, ta, _) = admitted(tracker.admit());
        let (_, tb, _) = admitted(tracker.admit());
        let (_, tc, _) = admitted(tracker.admit());
        // `a` is busy; `c` was idle longer than `b` (b answered later).
        assert!(ta.begin());
        assert!(tb.begin());
        tb.end(1_000);
        tc.idle_since_ms.store(500, Ordering::Relaxed);
        let (_, td, evicted) = admitted(tracker.admit());
        assert!(evicted);
        assert_eq!(tc.state.load(Ordering::Acquire), CLOSED, "the idlest");
        assert!(!tc.begin(), "a closed connection takes no request");
        assert_eq!(tb.state.load(Ordering::Acquire), IDLE);
        // With `d` busy, `b` next, then only busy ones: refused.
        assert!(td.begin());
        let (_, te, evicted) = admitted(tracker.admit());
        assert!(evicted);
        assert_eq!(tb.state.load(Ordering::Acquire), CLOSED);
        assert!(te.begin());
        assert!(matches!(tracker.admit(), Admission::Full));
        // One ends: room again without closing anything.
        tracker.leave(a);
        let (_, _, evicted) = admitted(tracker.admit());
        assert!(!evicted);
    }
}
