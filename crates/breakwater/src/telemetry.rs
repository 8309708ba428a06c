//! Every metric name Breakwater emits, in one place.
//!
//! Names follow Prometheus conventions (`_total` for counters, base units).
//! Handles for hot paths are registered once (see `ingress::routes`), so a
//! request pays an atomic add, not a label lookup.

/// Webhooks received, by `source` and `outcome`
/// (accepted, duplicate, unauthorized, stale, too_large, unavailable).
pub const INGRESS_REQUESTS: &str = "breakwater_ingress_requests_total";
/// Connections closed at accept because the listener had its most, by
/// `listener` (ingress, admin).
pub const HTTP_CONNECTIONS_REFUSED: &str = "breakwater_http_connections_refused_total";
/// Time from request to answer for accepted webhooks, in seconds.
pub const INGRESS_SECONDS: &str = "breakwater_ingress_request_seconds";
/// The embedded queue's own: group commit time and size, enqueue wait, the
/// dedup index's size.
pub use breakwater_queue_embedded::telemetry::*;
/// Queue gauges, by `state` (visible, in_flight, delayed, dead_lettered).
pub const QUEUE_MESSAGES: &str = "breakwater_queue_messages";
/// Age of the oldest visible message, in seconds.
pub const QUEUE_OLDEST_AGE_SECONDS: &str = "breakwater_queue_oldest_visible_age_seconds";
/// Worker outcomes, by `outcome`
/// (applied, duplicate, retried, dead_lettered, released).
pub const WORKER_MESSAGES: &str = "breakwater_worker_messages_total";
/// Sink apply latency, in seconds.
pub const SINK_APPLY_SECONDS: &str = "breakwater_sink_apply_seconds";
/// Sink failures by `class` (dependency, permanent) and `kind`.
pub const SINK_FAILURES: &str = "breakwater_sink_failures_total";
/// Breaker state as a number: 0 closed, 1 open, 2 half-open, 3 ramping.
pub const BREAKER_STATE: &str = "breakwater_breaker_state";
/// Breaker concurrency limit.
pub const BREAKER_LIMIT: &str = "breakwater_breaker_concurrency_limit";
/// Moves of the adaptive limiter, by `reason` (`failures`,
/// `latency_rising`, `latency_at_baseline`, `resumed`).
pub const LIMITER_CHANGES: &str = "breakwater_limiter_changes_total";
/// Breaker transitions, by `to`.
pub const BREAKER_TRANSITIONS: &str = "breakwater_breaker_transitions_total";
/// Database sessions waiting on a lock (PostgreSQL sink).
pub const DB_LOCK_WAITERS: &str = "breakwater_db_lock_waiters";
/// 1 while this node decides alone because the fleet store cannot be reached.
pub const FLEET_FALLBACK: &str = "breakwater_fleet_fallback";
/// 1 while this node holds the fleet's controller lease.
pub const FLEET_LEADER: &str = "breakwater_fleet_leader";
