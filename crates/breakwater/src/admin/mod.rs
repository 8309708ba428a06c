//! The admin listener: metrics and operator endpoints.
//!
//! - `GET /metrics`: Prometheus text format;
//! - `GET /queue/stats`: the queue's counts as JSON;
//! - `GET /breaker`: state, reason, limit, every signal with its value and
//!   threshold, recent transitions, parked hot keys;
//! - `POST /breaker/trip?ttl_secs=N&note=TEXT`: force open (manual trip);
//! - `POST /breaker/reset[?force_closed=true&ttl_secs=N]`: end the manual
//!   override (or force closed);
//! - `GET /healthz`.
//!
//! When `[admin] token` is set every request needs
//! `Authorization: Bearer <token>` (required by `config check` when the
//! listener is not on loopback).

pub mod client;

use std::sync::Arc;

use std::time::Duration;

use axum::extract::{Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{StatusCode, header};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::queue::Queue;
use crate::worker::{Controller, ParkedKeys};

/// State of the admin handlers.
pub struct Admin {
    pub metrics: Option<PrometheusHandle>,
    pub queue: Arc<dyn Queue>,
    pub token: Option<String>,
    pub controller: Arc<Controller>,
    /// Hot keys parked by the lanes (workers role only).
    pub parked: Option<ParkedKeys>,
}

impl Admin {
    /// The admin router.
    pub fn router(self) -> Router {
        let state = Arc::new(self);
        Router::new()
            .route("/metrics", get(render_metrics))
            .route("/queue/stats", get(queue_stats))
            .route("/breaker", get(breaker_status))
            .route("/breaker/trip", post(breaker_trip))
            .route("/breaker/reset", post(breaker_reset))
            .route("/healthz", get(|| async { "ok\n" }))
            .layer(middleware::from_fn_with_state(
                Arc::clone(&state),
                authorize,
            ))
            .with_state(state)
    }
}

async fn authorize(State(admin): State<Arc<Admin>>, request: Request, next: Next) -> Response {
    if let Some(token) = &admin.token {
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
            return (
                StatusCode::UNAUTHORIZED,
                Json(
                    serde_json::json!({"error": "unauthorized", "detail": "admin token required"}),
                ),
            )
                .into_response();
        }
    }
    next.run(request).await
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

async fn queue_stats(State(admin): State<Arc<Admin>>) -> Response {
    match admin.queue.stats().await {
        Ok(stats) => Json(stats).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": "queue", "detail": e.to_string()})),
        )
            .into_response(),
    }
}

async fn breaker_status(State(admin): State<Arc<Admin>>) -> Response {
    let parked = admin
        .parked
        .as_ref()
        .and_then(|p| p.lock().ok().map(|p| p.clone()))
        .unwrap_or_default();
    Json(serde_json::json!({
        "breaker": admin.controller.status(),
        "parked_keys": parked,
        "db_lock_waiters": admin.controller.last_lock_waiters(),
    }))
    .into_response()
}

/// Query of `POST /breaker/trip` and `/breaker/reset`.
#[derive(Debug, serde::Deserialize)]
struct OverrideQuery {
    ttl_secs: Option<u64>,
    note: Option<String>,
    #[serde(default)]
    force_closed: bool,
}

async fn breaker_trip(State(admin): State<Arc<Admin>>, Query(q): Query<OverrideQuery>) -> Response {
    let note = q.note.unwrap_or_else(|| "manual trip".to_owned());
    let t = admin
        .controller
        .trip(&note, q.ttl_secs.map(Duration::from_secs));
    Json(serde_json::json!({"transition": t.to_string(), "state": t.to.as_str()})).into_response()
}

async fn breaker_reset(
    State(admin): State<Arc<Admin>>,
    Query(q): Query<OverrideQuery>,
) -> Response {
    let t = admin
        .controller
        .reset(q.force_closed, q.ttl_secs.map(Duration::from_secs));
    Json(serde_json::json!({
        "transition": t.as_ref().map(ToString::to_string),
        "state": admin.controller.gate().state.as_str(),
    }))
    .into_response()
}
