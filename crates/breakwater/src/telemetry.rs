//! Every metric name Breakwater emits, in one place.
//!
//! Names follow Prometheus conventions (`_total` for counters, base units).
//! Handles for hot paths are registered once (see `ingress::routes`), so a
//! request pays an atomic add, not a label lookup.

/// Webhooks received, by `source`, `status` (the HTTP status answered)
/// and `outcome` (accepted, duplicate, unauthorized, stale, too_large,
/// unavailable, ...).
pub const INGRESS_REQUESTS: &str = "breakwater_ingress_requests_total";
/// Connections closed at accept because the listener had its most, by
/// `listener` (ingress, admin).
pub const HTTP_CONNECTIONS_REFUSED: &str = "breakwater_http_connections_refused_total";
/// Idle connections closed to make room for a new one on a full listener
/// that does so (the admin listener), by `listener`.
pub const HTTP_CONNECTIONS_EVICTED: &str = "breakwater_http_connections_evicted_total";
/// Time from request to answer for accepted webhooks, by `source`, in
/// seconds (histogram).
pub const INGRESS_SECONDS: &str = "breakwater_ingress_latency_seconds";
/// The embedded queue's own: group commit time and size, enqueue wait, the
/// dedup index's size.
pub use breakwater_queue_embedded::telemetry::*;
/// The segment log's own: segments reclaimed, recycled, made ahead.
pub use breakwater_queue_log::telemetry::{
    QUEUE_SEGMENTS_MADE_AHEAD, QUEUE_SEGMENTS_RECLAIMED, QUEUE_SEGMENTS_RECYCLED,
};
/// Queue gauges, by `state` (visible, in_flight, delayed, dead_lettered).
pub const QUEUE_MESSAGES: &str = "breakwater_queue_messages";
/// Messages ready to be claimed (the same as `QUEUE_MESSAGES{state="visible"}`).
pub const QUEUE_VISIBLE: &str = "breakwater_queue_visible";
/// Time left before the oldest queued message expires on the broker
/// (`queue.retention_secs` minus its age), seconds.
pub const RETENTION_HEADROOM_SECONDS: &str = "breakwater_retention_headroom_seconds";
/// Messages claimed and not settled.
pub const QUEUE_INFLIGHT: &str = "breakwater_queue_inflight";
/// Age of the oldest visible message, in seconds (0 when none is visible).
pub const QUEUE_OLDEST_AGE_SECONDS: &str = "breakwater_queue_oldest_age_seconds";
/// Worker outcomes, by `outcome`
/// (applied, duplicate, superseded, retried, dead_lettered, released).
pub const WORKER_MESSAGES: &str = "breakwater_worker_messages_total";
/// Events settled as superseded (older than the newest version their
/// entity key already holds: their statements did not run), by `source`.
pub const EVENTS_SUPERSEDED: &str = "breakwater_events_superseded_total";
/// Sink apply latency, in seconds (histogram).
pub const SINK_APPLY_SECONDS: &str = "breakwater_apply_latency_seconds";
/// Applies, by `source` and `outcome` (success, dependency, permanent,
/// contention: a hot key's lock or one forward target's trouble).
pub const APPLY_TOTAL: &str = "breakwater_apply_total";
/// Messages dead-lettered by the workers, by `class` (permanent,
/// exhausted, ...).
pub const DLQ_TOTAL: &str = "breakwater_dlq_total";
/// Worker slots, by `state` (idle, applying, lock_wait).
pub const WORKERS: &str = "breakwater_workers";
/// Sink failures by `class` (dependency, permanent) and `kind`.
pub const SINK_FAILURES: &str = "breakwater_sink_failures_total";
/// Breaker state as a number: 0 closed, 1 open, 2 half-open, 3 ramping.
pub const BREAKER_STATE: &str = "breakwater_breaker_state";
/// The concurrency limit workers obey (the breaker's, or the limiter's
/// while closed).
pub const BREAKER_LIMIT: &str = "breakwater_concurrency_limit";
/// Moves of the adaptive limiter, by `reason` (`failures`,
/// `latency_rising`, `latency_at_baseline`, `slow_start`, `resumed`).
pub const LIMITER_CHANGES: &str = "breakwater_limiter_changes_total";
/// Breaker transitions, by `to` and `reason` (the reason's kind).
pub const BREAKER_TRANSITIONS: &str = "breakwater_breaker_transitions_total";
/// Database sessions waiting on a lock (PostgreSQL sink).
pub const DB_LOCK_WAITERS: &str = "breakwater_db_lock_waiters";
/// 1 while this node decides alone because the fleet store cannot be reached.
pub const FLEET_FALLBACK: &str = "breakwater_fleet_fallback";
/// 1 while this node holds the fleet's controller lease.
pub const FLEET_LEADER: &str = "breakwater_fleet_leader";

/// Bucket bounds of every `_seconds` histogram, in seconds: 0.5 ms to 10 s.
pub const SECONDS_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The Prometheus exporter as `serve` installs it: every metric whose name
/// ends in `_seconds` rendered as a histogram (buckets
/// [`SECONDS_BUCKETS`]); the others (a group commit's size) as summaries.
pub fn prometheus() -> metrics_exporter_prometheus::PrometheusBuilder {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
            &SECONDS_BUCKETS,
        )
        // Bounds are fixed and non-empty: this cannot fail.
        .unwrap_or_else(|_| metrics_exporter_prometheus::PrometheusBuilder::new())
}
