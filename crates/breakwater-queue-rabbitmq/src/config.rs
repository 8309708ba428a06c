//! The RabbitMQ backend's own keys of the `[queue]` table (beside
//! `backend`, `url`, `name` and `lease_ms`).

use serde::{Deserialize, Serialize};

/// `[queue]` keys of the `rabbitmq` backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitMqConfig {
    /// `quorum` (replicated, the default) or `classic`: the type of every
    /// queue Breakwater declares. An existing queue keeps its type.
    pub queue_type: QueueType,
    /// Messages the broker may push beyond the breaker's concurrency limit
    /// while flowing (the consumer's prefetch is the limit rounded up to a
    /// power of two, `+ headroom`): room
    /// for messages waiting behind a busy key and for the next claim.
    /// Half-open, the prefetch is the probe count alone.
    pub prefetch_headroom: u32,
    /// The delay tiers, in milliseconds, ascending: one queue each, whose
    /// TTL dead-letters a message back into the queue. A retry or a
    /// delayed release waits in the smallest tier at least as long as its
    /// delay (the longest tier caps it).
    pub delay_tiers_ms: Vec<u64>,
    /// Longest wait for the broker to confirm a publish or answer a call,
    /// in milliseconds.
    pub request_timeout_ms: u64,
    /// Longest pause between two reconnection attempts, in milliseconds
    /// (full jitter below it, from 100 ms, doubling).
    pub reconnect_max_ms: u64,
    /// Most dead letters a `dlq` command reads through (RabbitMQ cannot
    /// address a message in a queue: listing reads them and hands them
    /// back).
    pub dlq_scan_max: usize,
}

/// Which RabbitMQ queue type Breakwater declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    Quorum,
    Classic,
}

impl QueueType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quorum => "quorum",
            Self::Classic => "classic",
        }
    }
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        Self {
            queue_type: QueueType::Quorum,
            prefetch_headroom: 64,
            delay_tiers_ms: vec![
                100, 250, 500, 1_000, 2_000, 4_000, 8_000, 15_000, 30_000, 60_000, 120_000,
                300_000, 600_000, 1_800_000, 3_600_000,
            ],
            request_timeout_ms: 5_000,
            reconnect_max_ms: 5_000,
            dlq_scan_max: 10_000,
        }
    }
}
