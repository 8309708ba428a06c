//! The NATS JetStream backend of the queue contract (`[queue] backend =
//! "nats"`), for fleets: every ingress process publishes to one stream,
//! every worker process pulls from one durable consumer.
//!
//! | contract | JetStream |
//! |---|---|
//! | `enqueue` | publish to `breakwater.<name>` with `Nats-Msg-Id` (a hash of source and event id), durable once the publish ack came back; a duplicate ack (within `dedup_window_secs`) is `Duplicate` |
//! | `claim` | fetch (no wait) from the durable pull consumer `<name>-workers`; the lease is the consumer's `ack_wait` (`queue.lease_ms`) |
//! | `extend_leases` | an in-progress ack (`+WPI`) per message |
//! | `ack` | `+ACK` (the stream is a work queue: acked messages leave it) |
//! | `retry_later` | the attempt count + 1 in the attempts stream, then `-NAK` with the delay |
//! | `release` | `-NAK` with the delay; the attempt count untouched |
//! | `dead_letter` | publish to the DLQ stream `BW_<name>_DLQ` with class and reason, then `+ACK` |
//! | `set_flow` | pull backend: no fetch while paused, at most the window per fetch |
//! | `dlq_*` | the DLQ stream's messages by sequence: get, republish, delete, purge |
//! | `stats` | consumer info: `num_pending` (visible), `num_ack_pending` (in flight, retries waiting for their delay included), the DLQ stream's size |
//!
//! **Attempts and receives.** JetStream counts deliveries (`receives`), not
//! attempts: a release and a retry both redeliver. So failed attempts live in
//! a stream kept like a key-value bucket (`BW_<name>_ATTEMPTS`, the last
//! message of each subject `breakwater.<name>.attempts.<sequence>`), written
//! by `retry_later` and read only for a redelivered message (a first
//! delivery has none), so the common path pays nothing for it. A count that
//! is not a number dead-letters its message (never taken for 0, which
//! would let a poison message retry for ever).
//!
//! **Receipts** carry the stream sequence and the delivery count they were
//! claimed at. A process settles a delivery once, and not after the same
//! message was handed to it again (a lapsed lease); across processes,
//! JetStream accepts a late ack, and the sink's inbox applies a duplicate
//! delivery once.
//!
//! The message's metadata travels in the payload ([`breakwater_queue::envelope`]), not in
//! headers, since event ids and keys come from senders; it is sealed over
//! the body, so a payload changed in the stream is refused (terminated,
//! with a warning) rather than read as another message.

pub mod config;
#[cfg(test)]
mod fuzz;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::message::PublishMessage as Publish;
use async_nats::jetstream::stream::{RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind};
use async_trait::async_trait;
use breakwater_queue::{
    Backend, Capabilities, ConfigProblem, DeadLetter, DeadLetterReason, Delivery, DlqPage,
    Enqueued, Flow, Message, NewMessage, OpenMode, Queue, QueueError, QueueSection, QueueStats,
    Receipt, StatKind,
};
use bytes::Bytes;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

pub use self::config::NatsConfig;
use breakwater_queue::envelope::{Meta, decode, encode};

/// The names one `[queue] name` gives on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub stream: String,
    pub subject: String,
    pub consumer: String,
    pub dlq_stream: String,
    pub dlq_subject: String,
    /// A stream keeping the last attempt count of each message (one per
    /// subject `<attempts_prefix>.<stream sequence>`).
    pub attempts_stream: String,
    pub attempts_prefix: String,
}

impl Names {
    /// The names for `name` (letters, digits, `-` and `_`).
    pub fn of(name: &str) -> Self {
        Self {
            stream: format!("BW_{name}"),
            subject: format!("breakwater.{name}"),
            consumer: format!("{name}-workers"),
            dlq_stream: format!("BW_{name}_DLQ"),
            dlq_subject: format!("breakwater.{name}.dlq"),
            attempts_stream: format!("BW_{name}_ATTEMPTS"),
            attempts_prefix: format!("breakwater.{name}.attempts"),
        }
    }
}

/// The token of a NATS receipt.
struct Token {
    seq: u64,
    delivered: i64,
    attempts: u32,
    /// The envelope as stored, for the DLQ.
    payload: Bytes,
    acker: Acker,
}

/// Most messages one claim hands out when no flow was set.
const UNBOUNDED: u32 = u32::MAX;
/// Longest a claim waits for the server's answer to its fetch.
const FETCH_DEADLINE: Duration = Duration::from_secs(1);
/// Delay of a message whose attempt count could not be read.
const RELOOK_DELAY: Duration = Duration::from_secs(1);

/// The NATS JetStream queue.
pub struct NatsQueue {
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    consumer: PullConsumer,
    stream: jetstream::stream::Stream,
    dlq: jetstream::stream::Stream,
    attempts: jetstream::stream::Stream,
    /// Live deliveries of this process: stream sequence -> delivery count.
    outstanding: Mutex<HashMap<u64, i64>>,
    window: AtomicU32,
}

impl std::fmt::Debug for NatsQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsQueue")
            .field("stream", &self.names.stream)
            .finish()
    }
}

fn unavailable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The `Nats-Msg-Id` of an event: the server deduplicates on it.
fn msg_id(source: &str, event_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0]);
    h.update(event_id.as_bytes());
    hex::encode(&h.finalize()[..16])
}

impl NatsQueue {
    /// Connects to `url` and opens the queue `name`: with
    /// [`OpenMode::Serve`] the streams, consumer and attempts bucket are
    /// declared if missing (idempotently); with [`OpenMode::Inspect`] they
    /// must exist.
    pub async fn open(
        url: &str,
        name: &str,
        lease: Duration,
        config: &NatsConfig,
        mode: OpenMode,
    ) -> Result<Self, QueueError> {
        let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(timeout)
            .request_timeout(Some(timeout))
            .connect(url)
            .await
            .map_err(|e| unavailable(format!("cannot connect to NATS at {url}: {e}")))?;
        let js = jetstream::new(client.clone());
        let names = Names::of(name);
        let (stream, dlq, attempts) = match mode {
            OpenMode::Serve => Self::declare(&js, &names, config).await?,
            OpenMode::Inspect => {
                let missing = || QueueError::Missing {
                    location: format!("stream {} on {url}", names.stream),
                };
                let stream = js.get_stream(&names.stream).await.map_err(|_| missing())?;
                let dlq = js
                    .get_stream(&names.dlq_stream)
                    .await
                    .map_err(|_| missing())?;
                let attempts = js
                    .get_stream(&names.attempts_stream)
                    .await
                    .map_err(|_| missing())?;
                (stream, dlq, attempts)
            }
        };
        let consumer: PullConsumer = match mode {
            // A read-only command looks the consumer up; it never makes one
            // (with its own lease) for `serve` to inherit.
            OpenMode::Inspect => {
                stream
                    .get_consumer(&names.consumer)
                    .await
                    .map_err(|_| QueueError::Missing {
                        location: format!("consumer {} on {url}", names.consumer),
                    })?
            }
            OpenMode::Serve => stream
                .get_or_create_consumer(
                    &names.consumer,
                    pull::Config {
                        durable_name: Some(names.consumer.clone()),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: lease,
                        // Unlimited: a release or a lapsed lease redelivers,
                        // and a message must never be dropped for being
                        // released often (retries are counted apart and end
                        // in the DLQ).
                        max_deliver: -1,
                        max_ack_pending: config.max_ack_pending,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| unavailable(format!("consumer {}: {e}", names.consumer)))?,
        };
        // An existing consumer keeps the settings it was made with: say so
        // when they differ from the config (a lease shorter than the
        // workers think would hand slow applies to a second worker).
        let made = &consumer.cached_info().config;
        if mode == OpenMode::Serve
            && (made.ack_wait != lease || made.max_ack_pending != config.max_ack_pending)
        {
            tracing::warn!(
                consumer = %names.consumer,
                ack_wait_ms = made.ack_wait.as_millis() as u64,
                lease_ms = lease.as_millis() as u64,
                max_ack_pending = made.max_ack_pending,
                configured_max_ack_pending = config.max_ack_pending,
                "the existing consumer was made with other settings than the config's, and \
                 keeps them: delete it (nats consumer rm) to have it made anew"
            );
        }
        Ok(Self {
            client,
            js,
            names,
            consumer,
            stream,
            dlq,
            attempts,
            outstanding: Mutex::new(HashMap::new()),
            window: AtomicU32::new(UNBOUNDED),
        })
    }

    async fn declare(
        js: &jetstream::Context,
        names: &Names,
        config: &NatsConfig,
    ) -> Result<
        (
            jetstream::stream::Stream,
            jetstream::stream::Stream,
            jetstream::stream::Stream,
        ),
        QueueError,
    > {
        let stream = js
            .get_or_create_stream(jetstream::stream::Config {
                name: names.stream.clone(),
                subjects: vec![names.subject.clone()],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                duplicate_window: Duration::from_secs(config.dedup_window_secs.max(1)),
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(format!("stream {}: {e}", names.stream)))?;
        let dlq = js
            .get_or_create_stream(jetstream::stream::Config {
                name: names.dlq_stream.clone(),
                subjects: vec![names.dlq_subject.clone()],
                storage: StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(format!("stream {}: {e}", names.dlq_stream)))?;
        // What a key-value bucket is, declared as a plain stream: the
        // client's bucket call asks for more than a 2.9 server answers.
        let attempts = js
            .get_or_create_stream(jetstream::stream::Config {
                name: names.attempts_stream.clone(),
                subjects: vec![format!("{}.*", names.attempts_prefix)],
                max_messages_per_subject: 1,
                storage: StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(format!("stream {}: {e}", names.attempts_stream)))?;
        Ok((stream, dlq, attempts))
    }

    /// Removes every stream, consumer and bucket of the queue `name` (for
    /// tests and the lab, which make their own).
    pub async fn destroy(url: &str, name: &str) -> Result<(), QueueError> {
        let client = async_nats::connect(url).await.map_err(unavailable)?;
        let js = jetstream::new(client);
        let names = Names::of(name);
        for stream in [&names.stream, &names.dlq_stream, &names.attempts_stream] {
            let _ = js.delete_stream(stream).await;
        }
        Ok(())
    }

    /// [`NatsQueue::destroy`] from code that is not async (a test's `Drop`,
    /// which may run while its runtime shuts down): on a thread and a
    /// runtime of its own. Errors are ignored, as in `destroy`'s callers.
    pub fn destroy_blocking(url: &str, name: &str) {
        let (url, name) = (url.to_owned(), name.to_owned());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(Self::destroy(&url, &name));
            }
        })
        .join();
    }

    /// The names this queue uses on the server.
    pub fn names(&self) -> &Names {
        &self.names
    }

    fn token<'r>(&self, receipt: &'r Receipt) -> Result<&'r Token, QueueError> {
        receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)
    }

    /// Ends this process's hold on a live delivery: refused for a delivery
    /// already settled, or handed out again since.
    fn settle(&self, token: &Token) -> Result<(), QueueError> {
        let mut live = self
            .outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match live.get(&token.seq) {
            Some(delivered) if *delivered == token.delivered => {
                live.remove(&token.seq);
                Ok(())
            }
            _ => Err(QueueError::LeaseLost {
                id: token.seq.to_string(),
            }),
        }
    }

    fn is_live(&self, token: &Token) -> bool {
        self.outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&token.seq)
            == Some(&token.delivered)
    }

    fn attempts_subject(&self, seq: u64) -> String {
        format!("{}.{seq}", self.names.attempts_prefix)
    }

    /// Failed attempts of the message at `seq` so far.
    async fn attempts_of(&self, seq: u64) -> Result<u32, Unread> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .attempts
            .get_last_raw_message_by_subject(&self.attempts_subject(seq))
            .await
        {
            Ok(m) => attempt_count(&m.payload).ok_or(Unread::NotACount),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => {
                tracing::warn!(error = %e, seq, "attempt count unreadable; message handed back");
                Err(Unread::NotNow)
            }
        }
    }

    async fn forget_attempts(&self, token: &Token) {
        if token.attempts > 0
            && let Err(e) = self
                .attempts
                .purge()
                .filter(self.attempts_subject(token.seq))
                .await
        {
            tracing::debug!(error = %e, seq = token.seq, "attempt count not removed");
        }
    }

    async fn publish(&self, subject: &str, publish: Publish) -> Result<u64, QueueError> {
        let ack = self
            .js
            .send_publish(subject.to_owned(), publish)
            .await
            .map_err(unavailable)?
            .await
            .map_err(unavailable)?;
        Ok(ack.sequence)
    }

    /// One DLQ message by sequence; `None` if it is gone.
    async fn dead_letter_at(
        &self,
        seq: u64,
    ) -> Result<Option<(DeadLetter, Meta, Bytes)>, QueueError> {
        let raw = match self.dlq.get_raw_message(seq).await {
            Ok(raw) => raw,
            Err(e) => {
                use async_nats::jetstream::stream::RawMessageErrorKind;
                return match e.kind() {
                    RawMessageErrorKind::NoMessageFound => Ok(None),
                    _ => Err(unavailable(e)),
                };
            }
        };
        let (meta, body) = decode(&raw.payload).map_err(|e| QueueError::Storage(e.to_string()))?;
        let dl = meta.dead_letter(seq.to_string(), None);
        Ok(Some((dl, meta, body)))
    }

    async fn dlq_bounds(&self) -> Result<(u64, u64, u64), QueueError> {
        let mut dlq = self.dlq.clone();
        let info = dlq.info().await.map_err(unavailable)?;
        Ok((
            info.state.first_sequence,
            info.state.last_sequence,
            info.state.messages,
        ))
    }
}

/// Why a message's attempt count was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unread {
    /// The attempts stream did not answer: look again later.
    NotNow,
    /// It holds something that is not a count.
    NotACount,
}

/// The attempt count `payload` holds, as `retry_later` writes it (decimal
/// digits).
fn attempt_count(payload: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(payload).ok()?;
    text.parse::<u32>().ok().filter(|n| n.to_string() == text)
}

fn parse_seq(id: &str) -> Result<u64, QueueError> {
    id.parse()
        .map_err(|_| QueueError::NotFound { id: id.to_owned() })
}

/// The stats this backend fills in as the contract defines them. In flight
/// is filled in too, but counts retries waiting for their delay.
const STATS: &[StatKind] = &[StatKind::Visible, StatKind::DeadLettered];

#[async_trait]
impl Queue for NatsQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_delay: true,
            native_dedup: true,
            counts_attempts: false,
            counts_receives: true,
            filters_keys: false,
            push: false,
            stats: STATS,
        }
    }

    async fn enqueue(&self, mut message: NewMessage) -> Result<Enqueued, QueueError> {
        let id = msg_id(&message.source, &message.event_id);
        let meta = Meta::of(&mut message);
        let publish = Publish::build()
            .payload(encode(&meta, &message.body))
            .message_id(id);
        let ack = self
            .js
            .send_publish(self.names.subject.clone(), publish)
            .await
            .map_err(unavailable)?
            .await
            .map_err(unavailable)?;
        let id = ack.sequence.to_string();
        Ok(if ack.duplicate {
            Enqueued::Duplicate { id }
        } else {
            Enqueued::New { id }
        })
    }

    async fn claim(&self, max: usize, _lease: Duration) -> Result<Vec<Delivery>, QueueError> {
        let max = max.min(self.window.load(Ordering::Acquire) as usize);
        if max == 0 {
            return Ok(Vec::new());
        }
        // No wait, and bounded here: the server parks a request (even a
        // no-wait one) while the consumer has max_ack_pending outstanding,
        // and a claim that never returned would stop the dispatcher (no
        // settling, no lease extension, no shutdown). No server-side
        // expiry either: a request lingering there would take messages
        // published after the breaker opened.
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(unavailable)?;
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + FETCH_DEADLINE;
        loop {
            let next = match tokio::time::timeout_at(deadline, batch.next()).await {
                Ok(Some(next)) => next,
                Ok(None) | Err(_) => break,
            };
            let m = match next {
                Ok(m) => m,
                Err(e) => {
                    // What came before the error is claimed and held.
                    tracing::debug!(error = %e, "fetch ended early");
                    break;
                }
            };
            let (seq, delivered) = match m.info() {
                Ok(info) => (info.stream_sequence, info.delivered),
                Err(e) => {
                    tracing::warn!(error = %e, "a delivery without JetStream metadata; skipped");
                    continue;
                }
            };
            let (meta, body) = match decode(&m.payload) {
                Ok(decoded) => decoded,
                Err(e) => {
                    // Not ours: stop its redelivery rather than loop on it.
                    tracing::warn!(error = %e, seq, "a message Breakwater cannot read; terminated");
                    let _ = m.ack_with(AckKind::Term).await;
                    continue;
                }
            };
            // A first delivery has failed no attempt: only a redelivery
            // pays for the look-up.
            let attempts = if delivered > 1 {
                match self.attempts_of(seq).await {
                    Ok(n) => n,
                    Err(Unread::NotNow) => {
                        // Unknown: taking it for 0 would let a poison
                        // message retry for ever. Hand it back untried.
                        let _ = m.ack_with(AckKind::Nak(Some(RELOOK_DELAY))).await;
                        continue;
                    }
                    Err(Unread::NotACount) => {
                        // Never readable: dead-lettered, with its message.
                        tracing::warn!(seq, "an attempt count that is not one; dead-lettered");
                        let mut meta = meta;
                        meta.class = Some("permanent".into());
                        meta.error = Some("its attempt count is not a number".into());
                        meta.dead_at_ms = Some(now_ms());
                        let dead = Publish::build().payload(encode(&meta, &body));
                        if self.publish(&self.names.dlq_subject, dead).await.is_ok() {
                            let _ = m.ack().await;
                            let _ = self
                                .attempts
                                .purge()
                                .filter(self.attempts_subject(seq))
                                .await;
                        } else {
                            let _ = m.ack_with(AckKind::Nak(Some(RELOOK_DELAY))).await;
                        }
                        continue;
                    }
                }
            } else {
                0
            };
            let payload = m.payload.clone();
            let (_, acker) = m.split();
            self.outstanding
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(seq, delivered);
            out.push(Delivery {
                message: Message {
                    id: seq.to_string(),
                    source: meta.source,
                    event_id: meta.event_id,
                    entity_key: meta.entity_key,
                    headers: meta.headers,
                    body,
                    received_at_ms: meta.received_at_ms,
                    attempts,
                    receives: u32::try_from(delivered).unwrap_or(u32::MAX),
                },
                receipt: Receipt::new(Token {
                    seq,
                    delivered,
                    attempts,
                    payload,
                    acker,
                }),
            });
        }
        Ok(out)
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        token.acker.ack().await.map_err(unavailable)?;
        self.forget_attempts(token).await;
        Ok(())
    }

    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        _lease: Duration,
    ) -> Result<usize, QueueError> {
        let mut extended = 0;
        for receipt in receipts {
            let token = self.token(receipt)?;
            if self.is_live(token) {
                token
                    .acker
                    .ack_with(AckKind::Progress)
                    .await
                    .map_err(unavailable)?;
                extended += 1;
            }
        }
        Ok(extended)
    }

    async fn retry_later(
        &self,
        receipt: &Receipt,
        delay: Duration,
        _error: &str,
    ) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        // Counted before the nak: the redelivery must find it.
        self.publish(
            &self.attempts_subject(token.seq),
            Publish::build().payload(Bytes::from((token.attempts + 1).to_string())),
        )
        .await?;
        token
            .acker
            .ack_with(AckKind::Nak((!delay.is_zero()).then_some(delay)))
            .await
            .map_err(unavailable)
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        token
            .acker
            .ack_with(AckKind::Nak((!delay.is_zero()).then_some(delay)))
            .await
            .map_err(unavailable)
    }

    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        let (mut meta, body) =
            decode(&token.payload).map_err(|e| QueueError::Storage(e.to_string()))?;
        meta.attempts = token.attempts;
        meta.class = Some(reason.class.clone());
        meta.error = Some(reason.error.clone());
        meta.dead_at_ms = Some(now_ms());
        // In the DLQ before it leaves the queue: a crash between the two
        // leaves a copy in each, never in neither.
        self.publish(
            &self.names.dlq_subject,
            Publish::build().payload(encode(&meta, &body)),
        )
        .await?;
        token.acker.ack().await.map_err(unavailable)?;
        self.forget_attempts(token).await;
        Ok(())
    }

    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError> {
        self.window.store(flow.window(), Ordering::Release);
        Ok(())
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        let info = self
            .stream
            .consumer_info(&self.names.consumer)
            .await
            .map_err(unavailable)?;
        let (_, _, dead) = self.dlq_bounds().await?;
        Ok(QueueStats {
            visible: Some(info.num_pending),
            in_flight: Some(info.num_ack_pending as u64),
            dead_lettered: Some(dead),
            ..QueueStats::default()
        })
    }

    async fn ready(&self) -> Result<(), QueueError> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            other => Err(QueueError::Unavailable(format!(
                "NATS connection {other:?}"
            ))),
        }
    }

    async fn dlq_list(&self, page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
        let (first, last, count) = self.dlq_bounds().await?;
        let mut out = Vec::new();
        if count == 0 {
            return Ok(out);
        }
        let after = page.after.as_deref().map(parse_seq).transpose()?;
        let start = after.map_or(first, |a| a.saturating_add(1)).max(first);
        for seq in start..=last {
            if out.len() >= page.limit {
                break;
            }
            if let Some((dl, _, _)) = self.dead_letter_at(seq).await? {
                out.push(dl);
            }
        }
        Ok(out)
    }

    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError> {
        let seq = parse_seq(id)?;
        let (mut dl, _, body) = self
            .dead_letter_at(seq)
            .await?
            .ok_or_else(|| QueueError::NotFound { id: id.to_owned() })?;
        dl.body = Some(String::from_utf8_lossy(&body).into_owned());
        Ok(dl)
    }

    async fn dlq_replay(
        &self,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let seqs: Vec<u64> = if ids.is_empty() {
            let (first, last, count) = self.dlq_bounds().await?;
            if count == 0 {
                Vec::new()
            } else {
                (first..=last).collect()
            }
        } else {
            ids.iter()
                .map(|id| parse_seq(id))
                .collect::<Result<_, _>>()?
        };
        let mut done = Vec::new();
        for seq in seqs {
            if done.len() >= limit {
                break;
            }
            let Some((_, mut meta, body)) = self.dead_letter_at(seq).await? else {
                continue;
            };
            if meta.replays >= max_replays {
                continue;
            }
            meta.replays += 1;
            meta.attempts = 0;
            meta.class = None;
            meta.error = None;
            meta.dead_at_ms = None;
            // A message id of its own: the original's may still be in the
            // duplicate window.
            let id = format!(
                "{}-replay-{}",
                msg_id(&meta.source, &meta.event_id),
                meta.replays
            );
            self.publish(
                &self.names.subject,
                Publish::build()
                    .payload(encode(&meta, &body))
                    .message_id(id),
            )
            .await?;
            self.dlq.delete_message(seq).await.map_err(unavailable)?;
            done.push(seq.to_string());
        }
        Ok(done)
    }

    async fn dlq_purge(&self, ids: &[String]) -> Result<usize, QueueError> {
        if ids.is_empty() {
            let purged = self.dlq.purge().await.map_err(unavailable)?;
            return Ok(usize::try_from(purged.purged).unwrap_or(usize::MAX));
        }
        let mut n = 0;
        for id in ids {
            if self
                .dlq
                .delete_message(parse_seq(id)?)
                .await
                .unwrap_or(false)
            {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Builds the NATS queue from `[queue]`: `backend = "nats"`, `url`
/// (`nats://host:4222`), `name`, `lease_ms`, and the keys of
/// [`NatsConfig`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NatsBackend;

impl NatsBackend {
    fn config(section: &QueueSection) -> Result<(String, String, NatsConfig), ConfigProblem> {
        let config: NatsConfig = section.own()?;
        let url = section.required_url()?.to_owned();
        // It names streams and subjects.
        let name = section.required_name("-_", None)?.to_owned();
        if config.max_ack_pending < 1 {
            return Err(ConfigProblem::key("max_ack_pending", "must be at least 1"));
        }
        Ok((url, name, config))
    }
}

#[async_trait]
impl Backend for NatsBackend {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn check(&self, section: &QueueSection) -> Result<toml::Table, ConfigProblem> {
        let (_, _, config) = Self::config(section)?;
        breakwater_queue::own_keys_table(&config)
    }

    async fn open(
        &self,
        section: &QueueSection,
        mode: OpenMode,
    ) -> Result<Arc<dyn Queue>, QueueError> {
        let (url, name, config) =
            Self::config(section).map_err(|e| QueueError::Storage(e.to_string()))?;
        let lease = Duration::from_millis(section.lease_ms.max(1));
        Ok(Arc::new(
            NatsQueue::open(&url, &name, lease, &config, mode).await?,
        ))
    }
}
