//! The queue contract and its backends.
//!
//! One trait, [`Queue`], shaped by the strictest broker rather than the
//! easiest (see ARCHITECTURE.md, "The queue contract"):
//!
//! - `enqueue` returns only once the message is durable (group commit,
//!   publisher confirm, `acks=all`, ...). It reports a redelivered event id as
//!   [`Enqueued::Duplicate`] where the backend can tell.
//! - `claim` takes up to N messages under a lease (visibility timeout). A
//!   message whose lease runs out becomes visible again: a crashed worker
//!   loses nothing.
//! - every settlement (`ack`, `retry_later`, `release`, `dead_letter`) names
//!   the delivery by its [`Receipt`]; a receipt whose lease was lost answers
//!   [`QueueError::LeaseLost`] and changes nothing.
//! - `retry_later` counts a failed attempt; `release` does not (the breaker
//!   opened: the message never ran).
//! - `extend_leases` keeps the claims a worker still holds from running
//!   out.
//! - `pause`/`resume` exist for push-style brokers (RabbitMQ, Kafka); pull
//!   backends simply stop claiming.
//!
//! Backends: [`embedded`] (SQLite in WAL mode, the single-node default).

pub mod embedded;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

/// A webhook as the ingress hands it to the queue.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Milliseconds since the Unix epoch.
    pub received_at_ms: i64,
}

/// A message as a worker sees it.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub received_at_ms: i64,
    /// Failed attempts so far (not counting releases).
    pub attempts: u32,
    /// Times the message was handed out, this one included.
    pub receives: u32,
}

/// Proof of a claim, needed to settle it. Opaque to workers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Receipt {
    Embedded { id: i64, lease: i64 },
}

/// A claimed message and the receipt that settles it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message: Message,
    pub receipt: Receipt,
}

/// What `enqueue` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// Newly queued under this id.
    New { id: String },
    /// The event id is already queued, applied or dead-lettered.
    Duplicate { id: String },
}

/// Why a message left for the DLQ.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterReason {
    /// `permanent` (poison) or `exhausted` (retries used up).
    pub class: String,
    pub error: String,
}

/// Counts of a queue, for `queue stats`, the breaker and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Ready to be claimed now.
    pub visible: u64,
    /// Claimed under a live lease.
    pub in_flight: u64,
    /// Waiting for a retry delay to pass.
    pub delayed: u64,
    /// In the dead-letter queue.
    pub dead_lettered: u64,
    /// Age, since it was received, of the visible message at the head of
    /// the queue (the next one a worker takes), in milliseconds; 0 when
    /// none is visible. Messages are taken oldest first, so this is the
    /// oldest visible one, except that a message retried or released
    /// rejoins at its new visible time and may wait, older, behind it.
    pub oldest_visible_age_ms: u64,
    /// Messages acknowledged since the store was created.
    pub acked_total: u64,
    /// Messages dead-lettered since the store was created.
    pub dead_lettered_total: u64,
}

/// One dead-lettered message, for `dlq list|show`.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    pub id: String,
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub attempts: u32,
    pub replays: u32,
    pub class: String,
    pub error: String,
    pub received_at_ms: i64,
    pub dead_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// Why a queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue cannot take more right now; the caller should retry.
    #[error("queue is full ({pending} operations pending)")]
    Full { pending: usize },
    /// The queue is shutting down or its writer died.
    #[error("queue is closed")]
    Closed,
    /// The lease behind a receipt ran out (or the message was settled).
    #[error("lease lost for message {id}")]
    LeaseLost { id: String },
    #[error("no such message {id}")]
    NotFound { id: String },
    #[error("queue storage error: {0}")]
    Storage(String),
}

impl QueueError {
    /// Why a writer thread's channel (of `capacity`) did not take an
    /// operation: full (the caller should retry) or closed.
    pub fn not_taken<T>(e: &tokio::sync::mpsc::error::TrySendError<T>, capacity: usize) -> Self {
        match e {
            tokio::sync::mpsc::error::TrySendError::Full(_) => Self::Full { pending: capacity },
            tokio::sync::mpsc::error::TrySendError::Closed(_) => Self::Closed,
        }
    }
}

/// The operations workers, the ingress and the CLI need of a queue backend.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Makes a message durable; returns once it is.
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError>;
    /// Claims up to `max` visible messages under a lease of `lease`.
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Delivery>, QueueError>;
    /// Like `claim`, leaving messages of `skip_keys` (entity keys the caller
    /// cannot run now: parked, or with a full lane) in the queue. A backend
    /// that cannot filter may ignore `skip_keys`; the caller hands back
    /// what it cannot run.
    async fn claim_skipping(
        &self,
        max: usize,
        lease: Duration,
        skip_keys: &[String],
    ) -> Result<Vec<Delivery>, QueueError> {
        let _ = skip_keys;
        self.claim(max, lease).await
    }
    /// The message was applied: remove it.
    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError>;
    /// Claims still being worked on (applying, or held behind their key):
    /// push each lease out to `lease` from now, so none runs out and is
    /// handed to a second worker meanwhile (SQS: ChangeMessageVisibility;
    /// JetStream: an in-progress ack). Returns how many were extended; a
    /// lease already lost stays lost. A backend without leases has nothing
    /// to extend.
    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let _ = lease;
        Ok(receipts.len())
    }
    /// The attempt failed: make it visible again after `delay`, counting an attempt.
    async fn retry_later(
        &self,
        receipt: &Receipt,
        delay: Duration,
        error: &str,
    ) -> Result<(), QueueError>;
    /// Hand the message back untried (breaker opened): visible after `delay`,
    /// no attempt counted.
    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError>;
    /// Move the message to the dead-letter queue.
    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError>;
    /// Current counts.
    async fn stats(&self) -> Result<QueueStats, QueueError>;
    /// Whether the queue can take messages now: cheap, for `/readyz`.
    async fn ready(&self) -> Result<(), QueueError>;
}
