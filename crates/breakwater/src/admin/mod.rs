//! The admin listener: metrics and operator endpoints, answering the typed
//! requests and answers of `breakwater-admin-api`.
//!
//! - `GET /metrics`: Prometheus text format;
//! - `GET /queue/stats`: the queue's counts;
//! - `GET /queue`: the counts, the oldest age and the backlog's drain
//!   (rate, time left to drain; retention headroom when configured);
//! - `GET /dlq[?limit=N&after=ID&source=S&class=C&event_id=E]`, `GET
//!   /dlq/{id}`: dead letters, on every backend (through the queue
//!   contract; a filtered page reads at most [`DLQ_SCAN_MAX`] of them);
//! - `GET /events/{source}/{event_id}`: one webhook's story: applied (its
//!   inbox row) or dead-lettered (its reason) or pending, and each attempt
//!   this node made with its time, class and error (`crate::events`);
//! - `POST /dlq/replay` (JSON `{"ids": [...]}` or `{"all": true}`, `rate`
//!   per second (100), `max_replays` (3)): puts dead letters back in the
//!   background, one replay at a time, waiting while the breaker is open;
//!   202 with its status, 409 `replay_running` while another runs;
//!   `GET /dlq/replay` follows it (`replay.rs`);
//! - `POST /dlq/purge` (JSON `{"ids": [...]}` or `{"all": true}`): deletes
//!   dead letters, answers how many;
//! - `GET /breaker`: where the breaker runs and, in a process that runs it,
//!   its state, reason, limit, every signal with its value and threshold,
//!   recent transitions, parked hot keys;
//! - `POST /breaker/trip?ttl_secs=N&note=TEXT`: force open (manual trip);
//! - `POST /breaker/reset[?force_closed=true&ttl_secs=N]`: end the manual
//!   override (or force closed);
//! - `GET /healthz`;
//! - `GET /`: the live dashboard (`dashboard.html`, embedded in the binary;
//!   no build step): the breaker's state and transitions with their
//!   reasons, the limit, lock waiters and parked keys, the queue and its
//!   drain, applies per second by outcome (from `/metrics`), an event
//!   lookup (from a dead letter's row too) with each attempt, the DLQ
//!   filtered by source and class with replay and purge, trip and reset;
//!   polled every second. The page holds
//!   no data, so it is served without the token; its calls carry the token
//!   the operator types in when the API answers 401. It may not be framed.
//!
//! An ingress-only process runs no breaker (its ingress never consults
//! one): outside a fleet its `/breaker` says the breaker runs with the
//! workers, and trip and reset answer 409 `no_breaker`; in a fleet
//! (`[fleet]`) it follows the fleet's breaker, so `/breaker` shows it and
//! a trip or reset there is the fleet's. With `[fleet]`, `/breaker` adds
//! the fleet view (nodes, lease holder, this node's standing).
//!
//! Requests a browser could be made to send are refused (`guard`: a
//! write from any origin but the listener's own (scheme, host and port), a
//! write without a content type or with a form's, a `Host` that is not this
//! loopback listener when no token is set).
//!
//! When `[admin] token` is set every request needs
//! `Authorization: Bearer <token>` (required by `config check` when the
//! listener is not on loopback).

pub mod client;
mod guard;
mod replay;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use breakwater_admin_api::{
    BreakerLocation, BreakerView, DlqList, ErrorBody, PurgeAnswer, PurgeRequest, QueueView,
    ReplayRequest, ResetQuery, TransitionAnswer, TripQuery,
};
use breakwater_sink::Sink;
use http::{StatusCode, header};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::breaker::FleetLink;
use crate::events::journal::EventJournal;
use crate::queue::{DlqFilter, DlqPage, Queue, QueueError, dlq_search};
use crate::worker::{Controller, ParkedKeys};

/// State of the admin handlers.
pub struct Admin {
    pub metrics: Option<PrometheusHandle>,
    pub queue: Arc<dyn Queue>,
    pub token: Option<String>,
    /// The address the admin listener is bound to: its origin is the only
    /// one whose browser writes it takes (`guard`).
    pub listen: SocketAddr,
    /// The breaker, in a process that runs workers (or any fleet node).
    pub controller: Option<Arc<Controller>>,
    /// The fleet link, with `[fleet]`.
    pub fleet: Option<Arc<FleetLink>>,
    /// Hot keys parked by the lanes (workers role only).
    pub parked: Option<ParkedKeys>,
    /// What the queue's own settings could do to the workers' messages,
    /// found at start (`GET /breaker` shows them).
    pub queue_warnings: Vec<String>,
    /// The DLQ replay running now, or the last one.
    pub replays: replay::Replays,
    /// What this process's workers did with each event lately.
    pub journal: Arc<EventJournal>,
    /// The workers' sink, once it has connected (never, on a node without
    /// workers): the event lookup reads its inbox.
    pub sink: SinkSlot,
}

/// The workers' sink, set once it connects (after the admin API is up).
pub type SinkSlot = Arc<OnceLock<Arc<dyn Sink>>>;

/// Most dead letters one `GET /dlq` returns.
const DLQ_PAGE_MAX: usize = 1000;

impl Admin {
    /// The admin router.
    pub fn router(self) -> Router {
        let gate = Arc::new(Gate {
            guard: guard::Guard::new(self.listen, self.token.is_some()),
            token: self.token.clone(),
        });
        let state = Arc::new(self);
        Router::new()
            .route("/metrics", get(render_metrics))
            .route("/queue/stats", get(queue_stats))
            .route("/queue", get(queue_view))
            .route("/dlq", get(dlq_list))
            .route("/dlq/replay", get(dlq_replay_status).post(dlq_replay_start))
            .route("/dlq/purge", post(dlq_purge))
            .route("/dlq/{id}", get(dlq_show))
            .route("/events/{source}/{event_id}", get(event_story))
            .route("/breaker", get(breaker_status))
            .route("/breaker/trip", post(breaker_trip))
            .route("/breaker/reset", post(breaker_reset))
            .route("/healthz", get(healthy))
            .layer(middleware::from_fn_with_state(gate, authorize))
            // After the layer: the page itself needs no token.
            .route("/", get(dashboard))
            .with_state(state)
    }
}

/// The dashboard's page.
const DASHBOARD: &str = include_str!("dashboard.html");

/// `GET /`: the dashboard, never inside another site's frame.
async fn dashboard() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'; form-action 'none'",
            ),
        ],
        DASHBOARD,
    )
        .into_response()
}

fn error(status: StatusCode, code: &str, detail: impl Into<String>) -> Response {
    (status, Json(ErrorBody::new(code, detail))).into_response()
}

fn queue_error(e: &QueueError) -> Response {
    match e {
        QueueError::NotFound { .. } => error(StatusCode::NOT_FOUND, "not_found", e.to_string()),
        _ => error(StatusCode::SERVICE_UNAVAILABLE, "queue", e.to_string()),
    }
}

/// What every request of the API passes: the browser guard, the token.
struct Gate {
    guard: guard::Guard,
    token: Option<String>,
}

async fn authorize(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    if let Some(why) = gate.guard.refuse(request.method(), request.headers()) {
        return error(StatusCode::FORBIDDEN, "forbidden", why);
    }
    if let Some(token) = &gate.token {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = presented.is_some_and(|p| {
            use subtle::ConstantTimeEq;
            bool::from(p.as_bytes().ct_eq(token.as_bytes()))
        });
        if !ok {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "admin token required",
            );
        }
    }
    next.run(request).await
}

/// `GET /healthz`: as the ingress's, 503 once the queue is closed for good.
async fn healthy(State(admin): State<Arc<Admin>>) -> Response {
    match admin.queue.ready().await {
        Err(QueueError::Closed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "queue closed: restart the process\n",
        )
            .into_response(),
        _ => (StatusCode::OK, "ok\n").into_response(),
    }
}

async fn render_metrics(State(admin): State<Arc<Admin>>) -> Response {
    match &admin.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics recorder not installed\n").into_response(),
    }
}

/// `GET /queue`: the counts, the oldest message's age, and how fast the
/// backlog drains (with the retention headroom when it is configured).
async fn queue_view(State(admin): State<Arc<Admin>>) -> Response {
    match admin.queue.stats().await {
        Ok(stats) => {
            let drain = admin.controller.as_ref().and_then(|c| c.drain());
            Json(QueueView {
                visible: stats.visible,
                in_flight: stats.in_flight,
                delayed: stats.delayed,
                dead_lettered: stats.dead_lettered,
                oldest_age_secs: stats.oldest_visible_age_ms.map(|ms| ms as f64 / 1000.0),
                net_drain_per_sec: drain.as_ref().and_then(|d| d.net_drain_per_sec),
                drain_secs: drain.as_ref().and_then(|d| d.drain_secs),
                retention: drain.filter(|d| d.retention_secs.is_some()),
            })
            .into_response()
        }
        Err(e) => queue_error(&e),
    }
}

async fn queue_stats(State(admin): State<Arc<Admin>>) -> Response {
    match admin.queue.stats().await {
        Ok(stats) => Json(stats).into_response(),
        Err(e) => queue_error(&e),
    }
}

/// Query of `GET /dlq`.
#[derive(Debug, serde::Deserialize)]
struct DlqQuery {
    /// At most this many (100 by default, at most [`DLQ_PAGE_MAX`]).
    limit: Option<usize>,
    /// The id of the last dead letter of the previous page.
    after: Option<String>,
    /// Only this source's, this class's (`permanent`, `exhausted`), this
    /// event id's, this entity key's.
    #[serde(flatten)]
    filter: DlqFilter,
}

/// Dead letters one filtered `GET /dlq` reads at most before it answers
/// with what it found and where to go on.
const DLQ_SCAN_MAX: usize = 10_000;

async fn dlq_list(State(admin): State<Arc<Admin>>, Query(q): Query<DlqQuery>) -> Response {
    let page = DlqPage {
        limit: q.limit.unwrap_or(100).clamp(1, DLQ_PAGE_MAX),
        after: q.after,
    };
    match dlq_search(admin.queue.as_ref(), &q.filter, &page, DLQ_SCAN_MAX).await {
        Ok(found) => Json(DlqList {
            items: found.items,
            next_after: found.next_after,
            scanned: (!q.filter.is_empty()).then_some(found.scanned),
        })
        .into_response(),
        Err(e) => queue_error(&e),
    }
}

/// `GET /events/{source}/{event_id}`: the event's story.
async fn event_story(
    State(admin): State<Arc<Admin>>,
    Path((source, event_id)): Path<(String, String)>,
) -> Response {
    let sink = admin.sink.get().map(|s| s.as_ref());
    Json(
        crate::events::look_up(
            &source,
            &event_id,
            &admin.journal,
            sink,
            admin.queue.as_ref(),
        )
        .await,
    )
    .into_response()
}

/// A request's JSON body, or the 400 `bad_request` saying what is wrong
/// with it.
fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, (StatusCode, Json<ErrorBody>)> {
    body.map(|Json(t)| t).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            Json(ErrorBody::new("bad_request", e.body_text())),
        )
    })
}

/// `POST /dlq/replay`.
async fn dlq_replay_start(
    State(admin): State<Arc<Admin>>,
    body: Result<Json<ReplayRequest>, JsonRejection>,
) -> Response {
    let request = match json_body(body) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    if let Err(why) = replay::check(&request) {
        return error(StatusCode::BAD_REQUEST, "bad_request", why);
    }
    match admin
        .replays
        .start(Arc::clone(&admin.queue), admin.controller.clone(), request)
    {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(running) => error(
            StatusCode::CONFLICT,
            "replay_running",
            format!(
                "a replay is running ({} put back so far): follow it at GET /dlq/replay",
                running.replayed
            ),
        ),
    }
}

/// `GET /dlq/replay`.
async fn dlq_replay_status(State(admin): State<Arc<Admin>>) -> Response {
    match admin.replays.status() {
        Some(status) => Json(status).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no replay has run since the process started",
        ),
    }
}

/// `POST /dlq/purge`.
async fn dlq_purge(
    State(admin): State<Arc<Admin>>,
    body: Result<Json<PurgeRequest>, JsonRejection>,
) -> Response {
    let request = match json_body(body) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    if let Err(why) = replay::names_or_all(&request.ids, request.all) {
        return error(StatusCode::BAD_REQUEST, "bad_request", why);
    }
    let ids = if request.all { &[][..] } else { &request.ids };
    match admin.queue.dlq_purge(ids).await {
        Ok(purged) => {
            tracing::info!(purged, "DLQ purged through the admin API");
            Json(PurgeAnswer { purged }).into_response()
        }
        Err(e) => queue_error(&e),
    }
}

async fn dlq_show(State(admin): State<Arc<Admin>>, Path(id): Path<String>) -> Response {
    match admin.queue.dlq_show(&id).await {
        Ok(d) => Json(d).into_response(),
        Err(e) => queue_error(&e),
    }
}

async fn breaker_status(State(admin): State<Arc<Admin>>) -> Response {
    let fleet = match (&admin.fleet, &admin.controller) {
        (Some(link), Some(controller)) => Some(link.info(controller).await),
        _ => None,
    };
    let view = match &admin.controller {
        Some(controller) => BreakerView {
            location: if fleet.is_some() {
                BreakerLocation::Fleet
            } else {
                BreakerLocation::Local
            },
            fleet,
            breaker: Some(controller.status()),
            parked_keys: admin
                .parked
                .as_ref()
                .and_then(|p| p.lock().ok().map(|p| p.clone()))
                .unwrap_or_default(),
            db_lock_waiters: controller.last_lock_waiters(),
            queue_warnings: admin.queue_warnings.clone(),
            retention: controller.retention(),
        },
        None => BreakerView {
            location: ingress_only(),
            breaker: None,
            parked_keys: Vec::new(),
            db_lock_waiters: None,
            queue_warnings: Vec::new(),
            fleet: None,
            retention: None,
        },
    };
    Json(view).into_response()
}

/// What an ingress-only process says of the breaker.
const RUNS_WITH_THE_WORKERS: &str = "this process runs only the ingress, which never waits on \
     the breaker; the breaker runs in the worker processes (ask their admin API)";

fn ingress_only() -> BreakerLocation {
    BreakerLocation::WithTheWorkers {
        detail: RUNS_WITH_THE_WORKERS.to_owned(),
    }
}

fn no_breaker() -> Response {
    error(StatusCode::CONFLICT, "no_breaker", RUNS_WITH_THE_WORKERS)
}

async fn breaker_trip(State(admin): State<Arc<Admin>>, Query(q): Query<TripQuery>) -> Response {
    let Some(controller) = &admin.controller else {
        return no_breaker();
    };
    let note = q.note.unwrap_or_else(|| "manual trip".to_owned());
    let t = controller.trip(&note, q.ttl_secs.map(Duration::from_secs));
    Json(TransitionAnswer {
        transition: Some(t.to_string()),
        state: t.to,
    })
    .into_response()
}

async fn breaker_reset(State(admin): State<Arc<Admin>>, Query(q): Query<ResetQuery>) -> Response {
    let Some(controller) = &admin.controller else {
        return no_breaker();
    };
    let t = controller.reset(q.force_closed, q.ttl_secs.map(Duration::from_secs));
    Json(TransitionAnswer {
        transition: t.as_ref().map(ToString::to_string),
        state: controller.gate().state,
    })
    .into_response()
}
