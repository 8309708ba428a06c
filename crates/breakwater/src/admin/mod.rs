//! The admin listener: metrics and operator endpoints.
//!
//! - `GET /metrics`: Prometheus text format;
//! - `GET /queue/stats`: the queue's counts as JSON;
//! - `GET /healthz`.
//!
//! When `[admin] token` is set every request needs
//! `Authorization: Bearer <token>` (required by `config check` when the
//! listener is not on loopback).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http::{StatusCode, header};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::queue::Queue;

/// State of the admin handlers.
pub struct Admin {
    pub metrics: Option<PrometheusHandle>,
    pub queue: Arc<dyn Queue>,
    pub token: Option<String>,
}

impl Admin {
    /// The admin router.
    pub fn router(self) -> Router {
        let state = Arc::new(self);
        Router::new()
            .route("/metrics", get(render_metrics))
            .route("/queue/stats", get(queue_stats))
            .route("/healthz", get(|| async { "ok\n" }))
            .layer(middleware::from_fn_with_state(Arc::clone(&state), authorize))
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
                Json(serde_json::json!({"error": "unauthorized", "detail": "admin token required"})),
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
