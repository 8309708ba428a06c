//! The queue contract: what the ingress, the workers, the breaker and the
//! operator need of a queue backend, shaped by the strictest broker rather
//! than the easiest (see `DESIGN.md`, "The queue contract, per broker", and
//! ARCHITECTURE.md, "The queue contract").
//!
//! - **Publishing**: [`Queue::enqueue`] returns only once the message is
//!   durable (group commit, publisher confirm, `acks=all`, publish ack). It
//!   reports a redelivered event id as [`Enqueued::Duplicate`] where the
//!   backend can tell ([`Capabilities::native_dedup`]).
//! - **Consuming**: [`Queue::claim`] takes up to N messages under a lease. A
//!   message whose lease runs out becomes visible again, so a crashed worker
//!   loses nothing. Every settlement ([`Queue::ack`], [`Queue::retry_later`],
//!   [`Queue::release`], [`Queue::dead_letter`]) names its delivery by the
//!   [`Receipt`] it came with; a receipt whose lease was lost answers
//!   [`QueueError::LeaseLost`] and changes nothing. `retry_later` counts an
//!   attempt, `release` does not (the message never ran): **attempts and
//!   receives are different counts**. Where a broker keeps no attempt count,
//!   the attempt travels with the message in the [`ATTEMPTS_HEADER`].
//! - **Arrivals**: a backend that knows when messages became durable says
//!   so ([`Queue::arrivals`]), and the workers, idle, claim at once rather
//!   than at their next poll.
//! - **Flow control**: [`Queue::set_flow`] follows the breaker's gate. Once
//!   it returned [`Flow::Paused`], no claim hands out a message: a push
//!   broker cancels its consumer and hands back what it had buffered
//!   (released, never left to time out, never counted as attempts); a pull
//!   backend refuses to claim. [`Flow::Probing`] and [`Flow::Flowing`] bound
//!   how many messages may be outstanding (a push broker's prefetch).
//! - **Dead letters** are part of the contract, so the CLI and the admin
//!   API work on every backend: [`Queue::dlq_list`], [`Queue::dlq_show`],
//!   [`Queue::dlq_replay`] (paced by [`replay_at_rate`]), [`Queue::dlq_purge`].
//! - **Capabilities** a backend declares ([`Capabilities`]), and stats whose
//!   every field is optional ([`QueueStats`]): a broker tells some counts
//!   and not others (Kafka: lag, read as visible).
//! - **Building**: each backend implements [`Backend`] and builds itself
//!   from the `[queue]` table ([`QueueSection`]): `backend`, `url`, `name`
//!   and `lease_ms` are the keys every backend reads, the rest are its own.
//!
//! With the `conformance` feature, [`conformance`] is the one generic suite
//! every backend runs against a live instance.

mod backend;
mod dead_letter;
mod dlq_search;
pub mod envelope;
mod error;
mod flow;
mod message;
mod replay;
mod stats;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "conformance")]
pub mod fuzz;

pub use backend::{
    Backend, ConfigProblem, DEFAULT_BACKEND, KeyOrder, OpenMode, QueueSection,
    SINGLE_NODE_BACKENDS, own_keys_table,
};
pub use dead_letter::{DeadLetter, DeadLetterReason, DlqPage};
pub use dlq_search::{DlqFilter, DlqSearch, dlq_search};
pub use error::QueueError;
pub use flow::Flow;
pub use message::{
    ATTEMPTS_HEADER, Delivery, Enqueued, Message, NewMessage, Receipt, attempts_from_headers,
};
pub use replay::{ReplayProgress, replay_at_rate};
pub use stats::{Capabilities, QueueStats, StatKind};

use std::time::Duration;

use async_trait::async_trait;

/// What [`Queue::arrivals`] hands out: it changes when messages arrived.
pub type Arrivals = tokio::sync::watch::Receiver<u64>;

/// The operations the ingress, the workers and the operator need of a queue
/// backend. Every method may be called from many tasks at once.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// What this backend can do natively; the workers and the breaker read
    /// it once at start.
    fn capabilities(&self) -> Capabilities;

    /// How many times the broker hands a message out before it moves it
    /// to a dead-letter queue by itself (SQS `maxReceiveCount`), if it
    /// does, as read when the queue was opened. Releases count toward it,
    /// so the service warns when it leaves little room.
    fn redelivery_limit(&self) -> Option<u32> {
        None
    }

    /// Starts consuming now rather than at the first claim (a Kafka
    /// consumer joins its group, which takes seconds) and returns once a
    /// claim can be served, or fails after `within`. For a process about to
    /// run workers that wants them ready before load arrives (the lab);
    /// the rest never call it.
    async fn start_consuming(&self, within: Duration) -> Result<(), QueueError> {
        let _ = within;
        Ok(())
    }

    /// Makes a message durable; returns once it is.
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError>;

    /// A counter that moves whenever messages became claimable in this
    /// process's view (an enqueue made durable), so idle workers claim at
    /// once instead of at their next poll; `None` where the backend cannot
    /// tell (the workers poll). A change may be spurious, and changes
    /// between two looks are seen as one.
    fn arrivals(&self) -> Option<Arrivals> {
        None
    }

    /// Claims up to `max` visible messages under a lease of `lease`. While
    /// paused ([`Flow::Paused`]) it hands out nothing.
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Delivery>, QueueError>;

    /// Like [`Queue::claim`], leaving messages of `skip_keys` (entity keys
    /// the caller cannot run now: parked, or with a full lane) in the queue.
    /// A backend that cannot filter ([`Capabilities::filters_keys`] false)
    /// ignores `skip_keys`; the caller releases what it cannot run.
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

    /// The attempt failed: make the message visible again after `delay`,
    /// counting an attempt.
    async fn retry_later(
        &self,
        receipt: &Receipt,
        delay: Duration,
        error: &str,
    ) -> Result<(), QueueError>;

    /// Hand the message back untried (the breaker opened, its key is
    /// parked): visible after `delay`, no attempt counted.
    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError>;

    /// Move the message to the dead-letter queue with its reason.
    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError>;

    /// Follows the breaker's gate: stop delivering ([`Flow::Paused`]), or
    /// deliver at most so many at once. Pull backends need do nothing but
    /// refuse claims while paused; push backends cancel or re-arm their
    /// consumer and set its prefetch. Returns once the new flow holds.
    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError>;

    /// Current counts; a field the backend cannot tell is `None`.
    async fn stats(&self) -> Result<QueueStats, QueueError>;

    /// Whether the queue can take messages now: cheap, for `/readyz`.
    async fn ready(&self) -> Result<(), QueueError>;

    /// Dead-lettered messages, oldest first, without their bodies.
    async fn dlq_list(&self, page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError>;

    /// One dead-lettered message with its body.
    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError>;

    /// Puts dead-lettered messages back in the queue (all when `ids` is
    /// empty, at most `limit`), with their attempts reset, except those
    /// replayed `max_replays` times already. Returns the ids put back.
    async fn dlq_replay(
        &self,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError>;

    /// Deletes dead-lettered messages (all when `ids` is empty); returns how
    /// many.
    async fn dlq_purge(&self, ids: &[String]) -> Result<usize, QueueError>;
}
