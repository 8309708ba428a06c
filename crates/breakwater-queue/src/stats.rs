//! Counts a backend can report, and what it can do natively.

use serde::{Deserialize, Serialize};

/// Counts of a queue, for `queue stats`, the breaker's signals and metrics.
/// A field the backend cannot tell (no broker but the embedded queue
/// counts acknowledgements; Kafka reports lag as visible and only this
/// process's claims as in flight) is `None`, and the signals that need it
/// stay quiet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Ready to be claimed now.
    pub visible: Option<u64>,
    /// Claimed under a live lease.
    pub in_flight: Option<u64>,
    /// Waiting for a retry delay to pass.
    pub delayed: Option<u64>,
    /// In the dead-letter queue.
    pub dead_lettered: Option<u64>,
    /// Age, since it was received, of the visible message at the head of
    /// the queue (the next one a worker takes), in milliseconds; 0 when
    /// none is visible.
    pub oldest_visible_age_ms: Option<u64>,
    /// Messages acknowledged since the queue was created.
    pub acked_total: Option<u64>,
    /// Messages dead-lettered since the queue was created.
    pub dead_lettered_total: Option<u64>,
}

/// One field of [`QueueStats`], for [`Capabilities::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatKind {
    Visible,
    InFlight,
    Delayed,
    DeadLettered,
    OldestVisibleAge,
    AckedTotal,
    DeadLetteredTotal,
}

impl QueueStats {
    /// Whether the field `kind` is known.
    pub fn has(&self, kind: StatKind) -> bool {
        match kind {
            StatKind::Visible => self.visible.is_some(),
            StatKind::InFlight => self.in_flight.is_some(),
            StatKind::Delayed => self.delayed.is_some(),
            StatKind::DeadLettered => self.dead_lettered.is_some(),
            StatKind::OldestVisibleAge => self.oldest_visible_age_ms.is_some(),
            StatKind::AckedTotal => self.acked_total.is_some(),
            StatKind::DeadLetteredTotal => self.dead_lettered_total.is_some(),
        }
    }
}

/// What a backend does natively; the rest the workers do around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// `retry_later`'s delay is kept by the backend (visibility, nak delay);
    /// false where retries go through delay tiers (RabbitMQ, Kafka).
    pub native_delay: bool,
    /// `enqueue` answers [`crate::Enqueued::Duplicate`] for a known event id
    /// (within the backend's own window).
    pub native_dedup: bool,
    /// The backend counts attempts itself; false where the count travels in
    /// [`crate::ATTEMPTS_HEADER`].
    pub counts_attempts: bool,
    /// [`crate::Message::receives`] is counted.
    pub counts_receives: bool,
    /// `claim_skipping` leaves the skipped keys' messages queued.
    pub filters_keys: bool,
    /// The backend pushes deliveries into a buffer (RabbitMQ prefetch, the
    /// Kafka poll buffer): flow control matters even between claims.
    pub push: bool,
    /// The stats fields this backend fills in.
    pub stats: &'static [StatKind],
}
