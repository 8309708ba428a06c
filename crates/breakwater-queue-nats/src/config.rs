//! The NATS backend's own keys of the `[queue]` table (beside `backend`,
//! `url`, `name` and `lease_ms`).

use serde::{Deserialize, Serialize};

/// `[queue]` keys of the `nats` backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// JetStream's duplicate window, in seconds: a redelivered event id
    /// within it answers 200 duplicate at the ingress. Shorter than the
    /// embedded queue's (it is held in the server's memory); past it the
    /// sink's inbox still applies each event once.
    pub dedup_window_secs: u64,
    /// Most messages the consumer hands out before any is acknowledged
    /// (`max_ack_pending`), across every worker process.
    pub max_ack_pending: i64,
    /// Longest wait for the server to answer a publish or an API call, in
    /// milliseconds.
    pub request_timeout_ms: u64,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            dedup_window_secs: 120,
            max_ack_pending: 10_000,
            request_timeout_ms: 5_000,
        }
    }
}
