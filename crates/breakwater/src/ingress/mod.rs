//! HTTP intake: `POST /webhooks/{source}`, `GET /healthz`, `GET /readyz`.
//!
//! The flow of one request, in the order the checks run:
//!
//! 1. look up the source (404 `unknown_source`; any path the router does
//!    not serve answers 404 `not_found`, and a known path with another
//!    method 405 `method_not_allowed`, JSON like the rest);
//! 2. read the body within `max_body_bytes` (413 `too_large`);
//! 3. verify the signature with the source's scheme and secrets
//!    (401 `unauthorized`, or 401 `stale` outside the replay window);
//! 4. refuse a body that is not JSON when the source takes only JSON (400
//!    `bad_json`: the default for every scheme but generic HMAC, whose
//!    sources choose with `body = "json" | "any"`);
//! 5. extract the event id and entity key: a missing or empty id falls
//!    back to a hash of the body, but one longer than
//!    [`MAX_EVENT_ID_BYTES`] is refused (400 `event_id_too_long`), and so
//!    is an entity key longer than [`MAX_ENTITY_KEY_BYTES`] (400
//!    `entity_key_too_long`): every id and key is held in memory (the
//!    queue's indexes, the lanes, the attempt history) and in every log
//!    line about its event, so its size is bounded here, not hashed
//!    silently into another identity;
//! 6. enqueue and wait until the queue says it is durable: 202 `accepted`,
//!    or 200 `duplicate` for an event id already queued or applied; if the
//!    queue cannot take it, 503 `unavailable` with `Retry-After`; if it is
//!    larger than the broker takes (SQS's message size), 413 `too_large`.
//!
//! The ingress never touches the sink, so a slow database cannot make it
//! answer 5xx.

mod error;
mod service;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};
use metrics::{Counter, Histogram};
use serde::Serialize;

pub use self::error::{IngressError, RETRY_AFTER_SECS};
pub use self::service::IngressService;
use crate::queue::{Enqueued, NewMessage, Queue, QueueError};
use crate::source::{Source, Sources};
use crate::telemetry;

/// A source with its pre-registered metric handles.
struct Route {
    source: Arc<Source>,
    accepted: Counter,
    duplicate: Counter,
    latency: Histogram,
}

/// The longest event id taken, in bytes: far above every provider's (a
/// Stripe `evt_...` or a UUID is under 40 bytes; the body-hash fallback
/// is 71).
pub const MAX_EVENT_ID_BYTES: usize = 1024;

/// The longest entity key taken, in bytes (a resource id, an email, a
/// composite key).
pub const MAX_ENTITY_KEY_BYTES: usize = 1024;

/// Shared state of the ingress handlers.
pub struct Ingress {
    routes: HashMap<String, Route>,
    queue: Arc<dyn Queue>,
    max_body_bytes: usize,
    /// Whether the workers beside this ingress apply what it accepts (a
    /// process that runs them); `/readyz` reports it.
    applying: Option<Arc<dyn ApplyStatus>>,
}

/// Whether the workers of this process are applying webhooks, for
/// `/readyz`: `None` when they are, else why not (the breaker is open, the
/// sink cannot be reached).
pub trait ApplyStatus: Send + Sync {
    fn not_applying(&self) -> Option<String>;
}

/// `GET /readyz`'s body.
#[derive(Debug, Serialize)]
struct Readiness {
    /// `ready` while webhooks are accepted (status 200), else
    /// `unavailable` (503).
    status: &'static str,
    /// The queue takes webhooks.
    accepting: bool,
    /// The workers of this process apply them; `null` where this process
    /// runs no workers (`serve --role ingress`).
    applying: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

impl Ingress {
    pub fn new(sources: &Sources, queue: Arc<dyn Queue>, max_body_bytes: usize) -> Self {
        let routes = sources
            .iter()
            .map(|(name, source)| {
                let counter = |status: StatusCode, outcome: &'static str| {
                    metrics::counter!(telemetry::INGRESS_REQUESTS,
                        "source" => name.clone(), "status" => status.as_str().to_owned(),
                        "outcome" => outcome)
                };
                let route = Route {
                    source: Arc::clone(source),
                    accepted: counter(StatusCode::ACCEPTED, "accepted"),
                    duplicate: counter(StatusCode::OK, "duplicate"),
                    latency: metrics::histogram!(telemetry::INGRESS_SECONDS, "source" => name.clone()),
                };
                (name.clone(), route)
            })
            .collect();
        Self {
            routes,
            queue,
            max_body_bytes,
            applying: None,
        }
    }

    /// Reports in `/readyz` whether the workers beside it apply.
    pub fn with_apply_status(mut self, status: Arc<dyn ApplyStatus>) -> Self {
        self.applying = Some(status);
        self
    }

    /// The ingress as the listener serves it: webhooks straight from
    /// hyper's request, the rest through [`Self::router`] (see
    /// [`service`]).
    pub fn service(self) -> IngressService {
        IngressService::new(self)
    }

    /// The ingress router: every path, webhooks included, through axum.
    pub fn router(self) -> Router {
        Self::router_on(Arc::new(self))
    }

    /// The router over shared `state`.
    fn router_on(state: Arc<Self>) -> Router {
        let limit = state.max_body_bytes;
        Router::new()
            .route("/webhooks/{source}", post(receive))
            .route("/healthz", get(healthy))
            .route("/readyz", get(ready))
            // After the routes: it applies to those registered before it.
            .method_not_allowed_fallback(wrong_method)
            .fallback(no_route)
            .layer(DefaultBodyLimit::max(limit))
            .with_state(state)
    }
}

/// The answer to an accepted or duplicate webhook.
#[derive(Debug, Serialize)]
struct Accepted<'a> {
    status: &'static str,
    id: String,
    event_id: &'a str,
}

/// Stands in for a source name that is not valid UTF-8 (no source can
/// have it).
const NOT_UTF8: &str = "<not UTF-8>";

async fn receive(
    State(ingress): State<Arc<Ingress>>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let name = name.map_or_else(|_| NOT_UTF8.to_owned(), |Path(name)| name);
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            IngressError::TooLarge {
                limit: ingress.max_body_bytes,
            }
        } else {
            IngressError::BadBody(rejection.body_text())
        }
    });
    take(&ingress, &name, &headers, body).await
}

/// One webhook to source `name`, its body read (or why it could not be):
/// the answer, every refusal counted.
async fn take(
    ingress: &Ingress,
    name: &str,
    headers: &HeaderMap,
    body: Result<Bytes, IngressError>,
) -> Response {
    match accept(ingress, name, headers, body).await {
        Ok(response) => response,
        Err(e) => {
            let source = if ingress.routes.contains_key(name) {
                name.to_owned()
            } else {
                "unknown".to_owned()
            };
            metrics::counter!(telemetry::INGRESS_REQUESTS,
                "source" => source, "status" => e.status().as_str().to_owned(),
                "outcome" => e.code())
            .increment(1);
            tracing::debug!(error = %e, status = %e.status(), "webhook refused");
            e.into_response()
        }
    }
}

/// Any other path: JSON like every other refusal. A POST under
/// `/webhooks/` (a name with a slash in it, or none) names no source.
async fn no_route(method: Method, uri: Uri) -> Response {
    let path = uri.path();
    match path.strip_prefix("/webhooks/") {
        Some(rest) if method == Method::POST => IngressError::UnknownSource(rest.to_owned()),
        _ => IngressError::NoRoute(format!("{method} {path}")),
    }
    .into_response()
}

/// A known path with another method (`GET /webhooks/stripe`): 405 in JSON
/// too; axum adds the `Allow` header.
async fn wrong_method(method: Method, uri: Uri) -> Response {
    IngressError::WrongMethod(format!("{method} {}", uri.path())).into_response()
}

async fn accept(
    ingress: &Ingress,
    name: &str,
    headers: &HeaderMap,
    body: Result<Bytes, IngressError>,
) -> Result<Response, IngressError> {
    let started = Instant::now();
    let route = ingress
        .routes
        .get(name)
        .ok_or_else(|| IngressError::UnknownSource(name.to_owned()))?;
    let body = body?;
    let source = &route.source;
    source
        .verifier
        .verify(headers, &body, unix_now())
        .map_err(|e| {
            if e.is_stale() {
                IngressError::Stale(e.to_string())
            } else {
                IngressError::Unauthorized(e.to_string())
            }
        })?;
    // After the signature: an unsigned caller learns nothing from it.
    let identity = source
        .read(headers, &body)
        .map_err(|e| IngressError::BadJson(e.to_string()))?;
    if identity.event_id.len() > MAX_EVENT_ID_BYTES {
        return Err(IngressError::EventIdTooLong {
            len: identity.event_id.len(),
            limit: MAX_EVENT_ID_BYTES,
        });
    }
    if let Some(key) = identity
        .entity_key
        .as_ref()
        .filter(|k| k.len() > MAX_ENTITY_KEY_BYTES)
    {
        return Err(IngressError::EntityKeyTooLong {
            len: key.len(),
            limit: MAX_ENTITY_KEY_BYTES,
        });
    }
    let message = NewMessage {
        source: source.name.to_string(),
        event_id: identity.event_id,
        entity_key: identity.entity_key,
        headers: source.keep_headers(headers),
        body,
        received_at_ms: unix_now_ms(),
    };
    let event_id = message.event_id.clone();
    let outcome = ingress.queue.enqueue(message).await.map_err(|e| match e {
        QueueError::Full { .. } | QueueError::Closed | QueueError::Storage(_) => {
            tracing::warn!(error = %e, source = %name, "queue refused a webhook; answering 503");
            IngressError::Unavailable(e.to_string())
        }
        // Within max_body_bytes, past what the broker takes (SQS).
        QueueError::TooLarge { max, .. } => IngressError::TooLarge { limit: max },
        other => IngressError::Unavailable(other.to_string()),
    })?;
    route.latency.record(started.elapsed().as_secs_f64());
    let (status, body) = match outcome {
        Enqueued::New { id } => {
            route.accepted.increment(1);
            (
                StatusCode::ACCEPTED,
                Accepted {
                    status: "accepted",
                    id,
                    event_id: &event_id,
                },
            )
        }
        Enqueued::Duplicate { id } => {
            route.duplicate.increment(1);
            (
                StatusCode::OK,
                Accepted {
                    status: "duplicate",
                    id,
                    event_id: &event_id,
                },
            )
        }
    };
    Ok(json_response(status, &body))
}

/// `body` in JSON with `status`: what `(status, Json(body))` answers,
/// without the trip through axum's response parts.
fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut response = Response::new(axum::body::Body::from(bytes));
            *response.status_mut() = status;
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => {
            IngressError::Unavailable(format!("cannot write the answer: {e}")).into_response()
        }
    }
}

/// `GET /healthz`: 200 while the process can work, 503 once its queue is
/// closed for good (the embedded store's writer thread died): a process
/// to restart, not one to wait for.
async fn healthy(State(ingress): State<Arc<Ingress>>) -> Response {
    match ingress.queue.ready().await {
        Err(QueueError::Closed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "queue closed: restart the process\n",
        )
            .into_response(),
        _ => (StatusCode::OK, "ok\n").into_response(),
    }
}

/// `GET /readyz`: 200 while the queue takes webhooks (what a load
/// balancer needs: a webhook sent here is kept), 503 when it cannot. The
/// body tells "accepting, not applying" (the database is down or the
/// breaker open: webhooks wait in the queue) apart from healthy.
async fn ready(State(ingress): State<Arc<Ingress>>) -> Response {
    let not_applying = ingress.applying.as_ref().map(|a| a.not_applying());
    let applying = not_applying.as_ref().map(Option::is_none);
    match ingress.queue.ready().await {
        Ok(()) => (
            StatusCode::OK,
            Json(Readiness {
                status: "ready",
                accepting: true,
                applying,
                detail: not_applying.flatten(),
            }),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Readiness {
                status: "unavailable",
                accepting: false,
                applying,
                detail: Some(format!("queue: {e}")),
            }),
        )
            .into_response(),
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Milliseconds since the Unix epoch.
pub fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use tower::ServiceExt;

    use super::*;
    use crate::queue::{
        Capabilities, DeadLetter, DeadLetterReason, Delivery, DlqPage, Flow, QueueStats, Receipt,
    };

    /// A queue whose writer is gone: every call answers `Closed`.
    struct ClosedQueue;

    fn closed<T>() -> Result<T, QueueError> {
        Err(QueueError::Closed)
    }

    #[async_trait]
    impl Queue for ClosedQueue {
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                native_delay: false,
                native_dedup: false,
                counts_attempts: false,
                counts_receives: false,
                filters_keys: false,
                push: false,
                stats: &[],
            }
        }
        async fn enqueue(&self, _: NewMessage) -> Result<Enqueued, QueueError> {
            closed()
        }
        async fn claim(&self, _: usize, _: Duration) -> Result<Vec<Delivery>, QueueError> {
            closed()
        }
        async fn ack(&self, _: &Receipt) -> Result<(), QueueError> {
            closed()
        }
        async fn retry_later(&self, _: &Receipt, _: Duration, _: &str) -> Result<(), QueueError> {
            closed()
        }
        async fn release(&self, _: &Receipt, _: Duration) -> Result<(), QueueError> {
            closed()
        }
        async fn dead_letter(&self, _: &Receipt, _: &DeadLetterReason) -> Result<(), QueueError> {
            closed()
        }
        async fn set_flow(&self, _: Flow) -> Result<(), QueueError> {
            closed()
        }
        async fn stats(&self) -> Result<QueueStats, QueueError> {
            closed()
        }
        async fn ready(&self) -> Result<(), QueueError> {
            closed()
        }
        async fn dlq_list(&self, _: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
            closed()
        }
        async fn dlq_show(&self, _: &str) -> Result<DeadLetter, QueueError> {
            closed()
        }
        async fn dlq_replay(
            &self,
            _: &[String],
            _: u32,
            _: usize,
        ) -> Result<Vec<String>, QueueError> {
            closed()
        }
        async fn dlq_purge(&self, _: &[String]) -> Result<usize, QueueError> {
            closed()
        }
    }

    #[tokio::test]
    async fn a_closed_queue_is_unhealthy_not_ok() {
        let router = Ingress::new(&Sources::default(), Arc::new(ClosedQueue), 1024).router();
        let request = http::Request::get("/healthz")
            .body(axum::body::Body::empty())
            .expect("request");
        let response = router.oneshot(request).await.expect("response");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
