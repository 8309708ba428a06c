//! The RabbitMQ backend of the queue contract (`[queue] backend =
//! "rabbitmq"`), for fleets: every ingress process publishes to one durable
//! queue, every worker process consumes from it with a prefetch that
//! follows the breaker.
//!
//! | contract | RabbitMQ |
//! |---|---|
//! | `enqueue` | persistent publish to `<name>` (default exchange, mandatory) on a confirm channel; durable once the broker confirmed |
//! | `claim` | take from what the consumer pushed (a pump task moves deliveries into a buffer); the lease is kept here, and a lapsed one is `nack`ed with requeue |
//! | `extend_leases` | pushes the local lease out (the broker keeps a delivery until it is settled or the channel closes) |
//! | `ack` | `basic.ack` |
//! | `retry_later` | publish to the delay tier with the attempt count + 1, then `basic.ack` |
//! | `release` | no delay: `basic.nack` with requeue; a delay: publish to the delay tier (attempts unchanged), then `basic.ack` |
//! | `dead_letter` | publish to `<name>.dlq` with class and reason, then `basic.ack` |
//! | `set_flow` | paused: `basic.cancel`, and every buffered delivery `nack`ed with requeue; half-open: consume with prefetch = probes; flowing: prefetch = the limit rounded up to a power of two + `prefetch_headroom` (a new prefetch takes a new consumer: rounded, the limiter's small moves keep it) |
//! | `dlq_*` | `basic.get` through the DLQ (RabbitMQ cannot address one message), settling the chosen ones and handing the rest back |
//! | `stats` | passive declares: ready of the queue (+ what this process has buffered), of the delay tiers, of the DLQ |
//!
//! **Leases.** RabbitMQ keeps a delivery with its channel until it is
//! settled; a crashed process's deliveries come back when its connection
//! closes. Within a process, a claim's lease is kept here: one that runs
//! out is handed back (`nack` with requeue) at the next claim, and its old
//! receipt settles nothing.
//!
//! **Connection loss.** A supervisor task watches the connection; when it
//! is gone it reconnects with full-jitter backoff, declares the topology
//! again and resumes consuming in the flow the breaker last set. Receipts of
//! the old connection answer `LeaseLost` (the broker requeued their
//! messages when the channel closed; the sink's inbox applies a redelivered
//! event once).

pub mod config;
mod dlq;
#[cfg(test)]
mod fuzz;
mod properties;
#[cfg(feature = "rabbitmqctl")]
pub mod rabbitmqctl;
mod session;
mod topology;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::envelope::{Meta, decode, encode};
use breakwater_queue::{
    Backend, Capabilities, ConfigProblem, DeadLetter, DeadLetterReason, Delivery, DlqPage,
    Enqueued, Flow, Message, NewMessage, OpenMode, Queue, QueueError, QueueSection, QueueStats,
    Receipt, StatKind,
};
use bytes::Bytes;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Acker, BasicProperties, Confirmation};
use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::config::{QueueType, RabbitMqConfig};
use self::properties::Counts;
pub use self::session::redact;
use self::session::{Session, SessionError};
pub use self::topology::Names;

/// Longest a claim waits for a delivery when none is buffered.
const CLAIM_WAIT: Duration = Duration::from_millis(20);
/// How often the supervisor looks at the connection.
const HEALTH_TICK: Duration = Duration::from_millis(250);
/// First pause before reconnecting.
const RECONNECT_BASE: Duration = Duration::from_millis(100);

fn unavailable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

impl From<SessionError> for QueueError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Missing { queue } => QueueError::Missing {
                location: format!("RabbitMQ queue {queue}"),
            },
            other => QueueError::Unavailable(other.to_string()),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What a delivery carries: its counts (properties) and its message (the
/// payload's envelope), or why Breakwater cannot read it.
fn read_delivery(
    props: &BasicProperties,
    payload: &Bytes,
) -> Result<(Counts, Meta, Bytes), String> {
    let counts = properties::counts(props).map_err(|e| e.to_string())?;
    let (meta, body) = decode(payload).map_err(|e| e.to_string())?;
    Ok((counts, meta, body))
}

/// A message id of Breakwater's own (RabbitMQ assigns none).
fn new_id() -> String {
    format!("{:016x}", rand::rng().random::<u64>())
}

/// The token of a RabbitMQ receipt: which claim it is, and the message as
/// it was delivered (a retry or a dead letter republishes it).
struct Token {
    claim: u64,
    id: String,
    meta: Meta,
    body: Bytes,
    counts: Counts,
}

/// A delivery claimed and not settled yet.
struct Held {
    acker: Acker,
    deadline: Instant,
}

/// The consumer, while there is one.
struct Pump {
    tag: String,
    prefetch: u16,
    generation: u64,
    channel: lapin::Channel,
    task: tokio::task::JoinHandle<()>,
}

impl Pump {
    /// Whether it still consumes, on the session of `generation`.
    fn alive(&self, generation: u64) -> bool {
        !self.task.is_finished() && self.generation == generation
    }
}

struct Consuming {
    flow: Flow,
    pump: Option<Pump>,
}

struct Inner {
    url: String,
    names: Names,
    config: RabbitMqConfig,
    timeout: Duration,
    session: RwLock<Arc<Session>>,
    /// Set by whoever sees the connection fail; wakes the supervisor.
    broken: Notify,
    consuming: tokio::sync::Mutex<Consuming>,
    /// Deliveries the consumer pushed, not claimed yet.
    buffered: Mutex<VecDeque<lapin::message::Delivery>>,
    arrived: Notify,
    /// Claimed deliveries not settled yet, by claim number.
    outstanding: Mutex<HashMap<u64, Held>>,
    next: AtomicU64,
}

/// The RabbitMQ queue.
pub struct RabbitMqQueue {
    inner: Arc<Inner>,
    supervisor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RabbitMqQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqQueue")
            .field("queue", &self.inner.names.queue)
            .finish()
    }
}

impl Drop for RabbitMqQueue {
    fn drop(&mut self) {
        self.supervisor.abort();
        // Close the connection so whatever it holds goes back to the queue
        // now, not when the socket times out.
        let session = self.inner.session();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = session.conn.close(200, "closing".into()).await;
            });
        }
    }
}

/// The prefetch for `flow`: the probes half-open; flowing, the limit
/// rounded up to a power of two, plus the headroom; never 0 (which
/// RabbitMQ reads as unlimited). A new prefetch takes a new consumer, and
/// the adaptive limiter moves the limit a little at a time (16 -> 14 ->
/// 16 on a noisy latency): rounded, those moves keep the consumer, and
/// the dispatcher still runs no more than the limit at once.
fn prefetch_for(flow: Flow, headroom: u32) -> u16 {
    let n = match flow {
        Flow::Paused => 1,
        Flow::Probing { probes } => probes,
        Flow::Flowing { limit } => limit
            .checked_next_power_of_two()
            .unwrap_or(u32::MAX)
            .saturating_add(headroom),
    };
    u16::try_from(n.max(1)).unwrap_or(u16::MAX)
}

impl RabbitMqQueue {
    /// Connects to `url` and opens the queue `name`: with
    /// [`OpenMode::Serve`] its topology is declared (idempotently); with
    /// [`OpenMode::Inspect`] the queue must exist.
    pub async fn open(
        url: &str,
        name: &str,
        config: &RabbitMqConfig,
        mode: OpenMode,
    ) -> Result<Self, QueueError> {
        let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
        let names = Names::of(name);
        let session = Session::connect(url, 0, timeout).await?;
        match mode {
            OpenMode::Serve => session.declare(&names, config).await?,
            OpenMode::Inspect => {
                session
                    .counts(std::slice::from_ref(&names.queue), timeout)
                    .await?;
            }
        }
        let inner = Arc::new(Inner {
            url: url.to_owned(),
            names,
            config: config.clone(),
            timeout,
            session: RwLock::new(Arc::new(session)),
            broken: Notify::new(),
            consuming: tokio::sync::Mutex::new(Consuming {
                // Until the breaker says otherwise: the headroom alone.
                flow: Flow::Flowing { limit: 0 },
                pump: None,
            }),
            buffered: Mutex::new(VecDeque::new()),
            arrived: Notify::new(),
            outstanding: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        });
        let supervisor = tokio::spawn(supervise(Arc::clone(&inner), mode));
        Ok(Self { inner, supervisor })
    }

    /// Removes every queue of `name` (for tests and the lab, which make
    /// their own).
    pub async fn destroy(url: &str, name: &str, config: &RabbitMqConfig) -> Result<(), QueueError> {
        let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
        let session = Session::connect(url, 0, timeout).await?;
        let names = Names::of(name);
        let mut queues = vec![names.queue.clone(), names.dlq.clone()];
        queues.extend(config.delay_tiers_ms.iter().map(|ms| names.delay(*ms)));
        for queue in queues {
            if let Ok(channel) = session.side_channel(timeout).await {
                let _ = channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
                let _ = channel.close(200, "deleted".into()).await;
            }
        }
        let _ = session.conn.close(200, "destroyed".into()).await;
        Ok(())
    }

    /// [`RabbitMqQueue::destroy`] from code that is not async (a test's
    /// `Drop`): on a thread and a runtime of its own; errors ignored.
    pub fn destroy_blocking(url: &str, name: &str) {
        let (url, name) = (url.to_owned(), name.to_owned());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(Self::destroy(&url, &name, &RabbitMqConfig::default()));
            }
        })
        .join();
    }

    /// The queue names on the broker.
    pub fn names(&self) -> &Names {
        &self.inner.names
    }
}

impl Inner {
    fn session(&self) -> Arc<Session> {
        Arc::clone(&self.session.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Something failed on the connection: wake the supervisor.
    fn failed(&self, e: impl std::fmt::Display) -> QueueError {
        self.broken.notify_one();
        unavailable(e)
    }

    fn buffered(&self) -> std::sync::MutexGuard<'_, VecDeque<lapin::message::Delivery>> {
        self.buffered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn outstanding(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes `payload` to `queue` and waits for the broker's confirm.
    async fn publish(
        &self,
        queue: &str,
        payload: &[u8],
        props: BasicProperties,
    ) -> Result<(), QueueError> {
        let session = self.session();
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = match tokio::time::timeout(
            self.timeout,
            session
                .publish
                .basic_publish("".into(), queue.into(), options, payload, props),
        )
        .await
        {
            Ok(Ok(confirm)) => confirm,
            Ok(Err(e)) => return Err(self.failed(format!("publish to {queue}: {e}"))),
            Err(_) => return Err(unavailable(format!("publish to {queue}: no answer"))),
        };
        match tokio::time::timeout(self.timeout, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(unavailable(format!(
                "no queue {queue} on the broker: the message came back ({})",
                returned.reply_text
            ))),
            Ok(Ok(Confirmation::Nack(_))) => Err(unavailable(format!(
                "the broker refused the message for {queue} (nack)"
            ))),
            Ok(Ok(Confirmation::NotRequested)) => Err(QueueError::Storage(
                "publisher confirms are not on: the message may not be durable".into(),
            )),
            Ok(Err(e)) => Err(self.failed(format!("confirm from {queue}: {e}"))),
            Err(_) => Err(unavailable(format!(
                "no confirm from {queue} within {:?}",
                self.timeout
            ))),
        }
    }

    /// Starts the consumer for `c.flow` on the current session.
    async fn start_pump(self: &Arc<Self>, c: &mut Consuming) -> Result<(), QueueError> {
        let session = self.session();
        let prefetch = prefetch_for(c.flow, self.config.prefetch_headroom);
        let channel = session.consume.clone();
        channel
            .basic_qos(prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|e| self.failed(format!("basic.qos: {e}")))?;
        let tag = format!(
            "breakwater-{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut consumer = channel
            .basic_consume(
                self.names.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| self.failed(format!("basic.consume on {}: {e}", self.names.queue)))?;
        let inner = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            while let Some(next) = consumer.next().await {
                let Some(inner) = inner.upgrade() else { return };
                match next {
                    Ok(delivery) => {
                        inner.buffered().push_back(delivery);
                        inner.arrived.notify_waiters();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "RabbitMQ consumer failed");
                        inner.broken.notify_one();
                        return;
                    }
                }
            }
        });
        c.pump = Some(Pump {
            tag,
            prefetch,
            generation: session.generation,
            channel,
            task,
        });
        Ok(())
    }

    /// Cancels the consumer (what it pushed before the cancel stays in the
    /// buffer); with `requeue`, hands every buffered delivery back.
    async fn stop_pump(&self, c: &mut Consuming, requeue: bool) {
        if let Some(pump) = c.pump.take() {
            let cancelled = tokio::time::timeout(
                self.timeout,
                pump.channel
                    .basic_cancel(pump.tag.as_str().into(), BasicCancelOptions::default()),
            )
            .await;
            let mut task = pump.task;
            // After cancel-ok the consumer's stream ends behind its last
            // delivery: wait for the pump to have buffered it.
            if !matches!(cancelled, Ok(Ok(())))
                || tokio::time::timeout(self.timeout, &mut task).await.is_err()
            {
                task.abort();
            }
        }
        if requeue {
            let held: Vec<_> = self.buffered().drain(..).collect();
            for d in held {
                let _ = self.bounded(d.acker.nack(REQUEUE)).await;
            }
        }
    }

    /// Hands back every claim whose lease ran out.
    async fn reap_expired(&self) {
        let now = Instant::now();
        let lapsed: Vec<Held> = {
            let mut out = self.outstanding();
            let ids: Vec<u64> = out
                .iter()
                .filter(|(_, h)| h.deadline <= now)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| out.remove(id)).collect()
        };
        for held in lapsed {
            let _ = self.bounded(held.acker.nack(REQUEUE)).await;
        }
    }

    /// Turns a pushed delivery into a claimed one (or dead-letters what
    /// Breakwater cannot read, [`read_delivery`]: nothing is dropped).
    async fn take(&self, d: lapin::message::Delivery, lease: Duration) -> Option<Delivery> {
        let payload = Bytes::from(d.data);
        let id = properties::id(&d.properties, new_id);
        let (counts, meta, body) = match read_delivery(&d.properties, &payload) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, id, "a message Breakwater cannot read; dead-lettered");
                let meta = Meta {
                    source: String::new(),
                    event_id: id.clone(),
                    entity_key: None,
                    headers: Vec::new(),
                    received_at_ms: now_ms(),
                    replays: 0,
                    attempts: 0,
                    class: Some("permanent".into()),
                    error: Some(e),
                    dead_at_ms: Some(now_ms()),
                };
                // Settled best effort: an unsettled delivery comes back.
                let _ = match self.publish_dead(&meta, &payload).await {
                    Ok(()) => self.bounded(d.acker.ack(BasicAckOptions::default())).await,
                    Err(_) => self.bounded(d.acker.nack(REQUEUE)).await,
                };
                return None;
            }
        };
        let claim = self.next.fetch_add(1, Ordering::Relaxed);
        self.outstanding().insert(
            claim,
            Held {
                acker: d.acker,
                deadline: Instant::now() + lease,
            },
        );
        Some(Delivery {
            message: Message {
                id: id.clone(),
                source: meta.source.clone(),
                event_id: meta.event_id.clone(),
                entity_key: meta.entity_key.clone(),
                headers: meta.headers.clone(),
                body: body.clone(),
                received_at_ms: meta.received_at_ms,
                attempts: counts.attempts,
                // Not counted by the broker: the delayed releases stand in,
                // so a hot key's backlog comes back less and less often.
                receives: counts.releases.saturating_add(1),
            },
            receipt: Receipt::new(Token {
                claim,
                id,
                meta,
                body,
                counts,
            }),
        })
    }

    /// Publishes a dead letter to the DLQ under an id sortable by time.
    async fn publish_dead(&self, meta: &Meta, body: &[u8]) -> Result<(), QueueError> {
        let dead_at = meta.dead_at_ms.unwrap_or_else(now_ms);
        let id = dlq::dead_letter_id(dead_at);
        self.publish(
            &self.names.dlq,
            &encode(meta, body),
            properties::build(&id, Counts::default()),
        )
        .await
    }

    /// Ends this process's hold on a claim: its acker, or `LeaseLost` when
    /// it was settled, its lease ran out, or the connection was replaced.
    fn settle(&self, token: &Token) -> Result<Acker, QueueError> {
        self.outstanding()
            .remove(&token.claim)
            .map(|h| h.acker)
            .ok_or_else(|| QueueError::LeaseLost {
                id: token.id.clone(),
            })
    }

    /// Publishes the claimed message to the delay tier for `delay` with
    /// `counts`, then acknowledges the delivery.
    async fn delay(
        &self,
        token: &Token,
        acker: Acker,
        delay: Duration,
        counts: Counts,
    ) -> Result<(), QueueError> {
        let tier = topology::tier_for(&self.config.delay_tiers_ms, delay);
        let published = self
            .publish(
                &self.names.delay(tier),
                &encode(&token.meta, &token.body),
                properties::build(&token.id, counts),
            )
            .await;
        if let Err(e) = published {
            // Not delayed: hand it back now rather than hold it.
            let _ = self.bounded(acker.nack(REQUEUE)).await;
            return Err(e);
        }
        let acked = self.bounded(acker.ack(BasicAckOptions::default())).await;
        self.settled(acked, &token.id)
    }

    /// After a new session: the old one's deliveries are void (the broker
    /// requeued them), and the consumer resumes in the breaker's flow.
    async fn resume(self: &Arc<Self>) -> Result<(), QueueError> {
        let mut c = self.consuming.lock().await;
        if let Some(pump) = c.pump.take() {
            pump.task.abort();
        }
        self.buffered().clear();
        self.outstanding().clear();
        if c.flow.delivers() {
            self.start_pump(&mut c).await?;
        }
        Ok(())
    }
}

/// Watches the connection; replaces a lost one (full-jitter backoff), then
/// resumes consuming.
async fn supervise(inner: Arc<Inner>, mode: OpenMode) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(HEALTH_TICK) => {}
            () = inner.broken.notified() => {}
        }
        if inner.session().healthy() {
            continue;
        }
        let generation = inner.session().generation + 1;
        let cap = Duration::from_millis(inner.config.reconnect_max_ms.max(1));
        let mut attempt = 0u32;
        loop {
            let made = async {
                let session = Session::connect(&inner.url, generation, inner.timeout).await?;
                if mode == OpenMode::Serve {
                    session.declare(&inner.names, &inner.config).await?;
                }
                Ok::<_, SessionError>(session)
            }
            .await;
            match made {
                Ok(session) => {
                    *inner
                        .session
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = Arc::new(session);
                    match inner.resume().await {
                        Ok(()) => {
                            tracing::info!(generation, "reconnected to RabbitMQ");
                            break;
                        }
                        Err(e) => tracing::warn!(error = %e, "resuming after reconnect failed"),
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "RabbitMQ unreachable; retrying");
                }
            }
            let ceiling = RECONNECT_BASE
                .saturating_mul(1u32 << attempt.min(16))
                .min(cap);
            let pause = rand::rng().random_range(Duration::ZERO..=ceiling);
            tokio::time::sleep(pause).await;
            attempt = attempt.saturating_add(1);
        }
    }
}

/// Nack with requeue: the message goes back at once, no attempt counted.
const REQUEUE: BasicNackOptions = BasicNackOptions {
    multiple: false,
    requeue: true,
};

impl Inner {
    /// What settling a delivery of message `id` came to: `false` from lapin
    /// means its channel is gone, and the broker requeued the message.
    fn settled(
        &self,
        done: Result<lapin::Result<bool>, tokio::time::error::Elapsed>,
        id: &str,
    ) -> Result<(), QueueError> {
        match done {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(QueueError::LeaseLost { id: id.to_owned() }),
            Ok(Err(e)) => Err(self.failed(e)),
            Err(_) => Err(self.failed(format!(
                "no answer to the settle of {id} within {:?}",
                self.timeout
            ))),
        }
    }

    /// An ack or a nack, bounded by the request timeout: on a connection
    /// going down lapin may never answer one.
    async fn bounded<F: std::future::Future<Output = lapin::Result<bool>>>(
        &self,
        op: F,
    ) -> Result<lapin::Result<bool>, tokio::time::error::Elapsed> {
        tokio::time::timeout(self.timeout, op).await
    }
}

fn token(receipt: &Receipt) -> Result<&Token, QueueError> {
    receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)
}

/// The stats this backend fills in as the contract defines them.
const STATS: &[StatKind] = &[StatKind::Visible, StatKind::Delayed, StatKind::DeadLettered];

#[async_trait]
impl Queue for RabbitMqQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_delay: false,
            native_dedup: false,
            counts_attempts: false,
            counts_receives: false,
            filters_keys: false,
            push: true,
            stats: STATS,
        }
    }

    async fn enqueue(&self, mut message: NewMessage) -> Result<Enqueued, QueueError> {
        let meta = Meta::of(&mut message);
        let id = new_id();
        self.inner
            .publish(
                &self.inner.names.queue,
                &encode(&meta, &message.body),
                properties::build(&id, Counts::default()),
            )
            .await?;
        Ok(Enqueued::New { id })
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Delivery>, QueueError> {
        let inner = &self.inner;
        inner.reap_expired().await;
        let mut waited = false;
        loop {
            let taken: Vec<lapin::message::Delivery> = {
                let mut c = inner.consuming.lock().await;
                let max = max.min(c.flow.window().max(1) as usize);
                if !c.flow.delivers() || max == 0 {
                    return Ok(Vec::new());
                }
                let generation = inner.session().generation;
                if !c.pump.as_ref().is_some_and(|p| p.alive(generation)) {
                    if let Some(pump) = c.pump.take() {
                        pump.task.abort();
                    }
                    inner.start_pump(&mut c).await?;
                }
                let mut buffered = inner.buffered();
                let n = max.min(buffered.len());
                buffered.drain(..n).collect()
            };
            if !taken.is_empty() || waited {
                let mut out = Vec::with_capacity(taken.len());
                for d in taken {
                    if let Some(d) = inner.take(d, lease).await {
                        out.push(d);
                    }
                }
                return Ok(out);
            }
            let _ = tokio::time::timeout(CLAIM_WAIT, inner.arrived.notified()).await;
            waited = true;
        }
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError> {
        let token = token(receipt)?;
        let acker = self.inner.settle(token)?;
        let acked = self
            .inner
            .bounded(acker.ack(BasicAckOptions::default()))
            .await;
        self.inner.settled(acked, &token.id)
    }

    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let deadline = Instant::now() + lease;
        let mut out = self.inner.outstanding();
        let mut extended = 0;
        for receipt in receipts {
            if let Some(held) = out.get_mut(&token(receipt)?.claim) {
                held.deadline = deadline;
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
        let token = token(receipt)?;
        let acker = self.inner.settle(token)?;
        let counts = Counts {
            attempts: token.counts.attempts.saturating_add(1),
            ..token.counts
        };
        self.inner.delay(token, acker, delay, counts).await
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError> {
        let token = token(receipt)?;
        let acker = self.inner.settle(token)?;
        if delay.is_zero() {
            let nacked = self.inner.bounded(acker.nack(REQUEUE)).await;
            return self.inner.settled(nacked, &token.id);
        }
        let counts = Counts {
            releases: token.counts.releases.saturating_add(1),
            ..token.counts
        };
        self.inner.delay(token, acker, delay, counts).await
    }

    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError> {
        let token = token(receipt)?;
        let acker = self.inner.settle(token)?;
        let meta = Meta {
            attempts: token.counts.attempts,
            class: Some(reason.class.clone()),
            error: Some(reason.error.clone()),
            dead_at_ms: Some(now_ms()),
            ..token.meta.clone()
        };
        // In the DLQ before it leaves the queue: a crash between the two
        // leaves a copy in each, never in neither.
        if let Err(e) = self.inner.publish_dead(&meta, &token.body).await {
            let _ = self.inner.bounded(acker.nack(REQUEUE)).await;
            return Err(e);
        }
        let acked = self
            .inner
            .bounded(acker.ack(BasicAckOptions::default()))
            .await;
        self.inner.settled(acked, &token.id)
    }

    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError> {
        let inner = &self.inner;
        let mut c = inner.consuming.lock().await;
        c.flow = flow;
        if !flow.delivers() {
            inner.stop_pump(&mut c, true).await;
            return Ok(());
        }
        let prefetch = prefetch_for(flow, inner.config.prefetch_headroom);
        let generation = inner.session().generation;
        let same = c
            .pump
            .as_ref()
            .is_some_and(|p| p.prefetch == prefetch && p.alive(generation));
        if same {
            return Ok(());
        }
        // A new prefetch needs a new consumer (RabbitMQ applies basic.qos
        // to consumers made after it). What the old one pushed stays
        // buffered and claimable: it was within the old prefetch.
        inner.stop_pump(&mut c, false).await;
        inner.start_pump(&mut c).await
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        let inner = &self.inner;
        let session = inner.session();
        let mut queues = vec![inner.names.queue.clone(), inner.names.dlq.clone()];
        queues.extend(
            inner
                .config
                .delay_tiers_ms
                .iter()
                .map(|ms| inner.names.delay(*ms)),
        );
        let counts = session.counts(&queues, inner.timeout).await?;
        let ready = |i: usize| counts.get(i).map_or(0, |(n, _)| u64::from(*n));
        let delayed: u64 = (2..counts.len()).map(ready).sum();
        let buffered = inner.buffered().len() as u64;
        Ok(QueueStats {
            visible: Some(ready(0) + buffered),
            // This process's claims only: the broker's unacked count needs
            // the management API.
            in_flight: Some(inner.outstanding().len() as u64),
            delayed: Some(delayed),
            dead_lettered: Some(ready(1)),
            ..QueueStats::default()
        })
    }

    async fn ready(&self) -> Result<(), QueueError> {
        if self.inner.session().healthy() {
            Ok(())
        } else {
            self.inner.broken.notify_one();
            Err(QueueError::Unavailable(
                "the RabbitMQ connection is down; reconnecting".into(),
            ))
        }
    }

    async fn dlq_list(&self, page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
        let scan = dlq::Scan::read(&self.inner).await?;
        let out = scan.page(page);
        scan.hand_back().await;
        Ok(out)
    }

    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError> {
        let scan = dlq::Scan::read(&self.inner).await?;
        let found = scan.show(id);
        scan.hand_back().await;
        found.ok_or_else(|| QueueError::NotFound { id: id.to_owned() })
    }

    async fn dlq_replay(
        &self,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let scan = dlq::Scan::read(&self.inner).await?;
        let result = scan.replay(&self.inner, ids, max_replays, limit).await;
        scan.hand_back().await;
        result
    }

    async fn dlq_purge(&self, ids: &[String]) -> Result<usize, QueueError> {
        if ids.is_empty() {
            let inner = &self.inner;
            let channel = inner.session().side_channel(inner.timeout).await?;
            let purged = channel
                .queue_purge(inner.names.dlq.as_str().into(), Default::default())
                .await
                .map_err(unavailable);
            let _ = channel.close(200, "purged".into()).await;
            return Ok(purged? as usize);
        }
        let scan = dlq::Scan::read(&self.inner).await?;
        let result = scan.purge(ids).await;
        scan.hand_back().await;
        result
    }
}

/// Builds the RabbitMQ queue from `[queue]`: `backend = "rabbitmq"`, `url`
/// (`amqp://user:password@host:5672/%2f`), `name`, and the keys of
/// [`RabbitMqConfig`]. (`lease_ms` is each claim's lease, kept here.)
#[derive(Debug, Clone, Copy, Default)]
pub struct RabbitMqBackend;

impl RabbitMqBackend {
    fn config(section: &QueueSection) -> Result<(String, String, RabbitMqConfig), ConfigProblem> {
        let config: RabbitMqConfig = section.own()?;
        let url = section.required_url()?.to_owned();
        if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
            return Err(ConfigProblem::key(
                "url",
                "must be an AMQP URL: amqp://user:password@host:5672/%2f (or amqps://)",
            ));
        }
        let name = section.required_name("-_.", Some(200))?.to_owned();
        let tiers = &config.delay_tiers_ms;
        if tiers.is_empty() || tiers.contains(&0) || tiers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ConfigProblem::key(
                "delay_tiers_ms",
                "must list at least one delay, each above 0 ms, in ascending order",
            ));
        }
        if config.dlq_scan_max == 0 {
            return Err(ConfigProblem::key("dlq_scan_max", "must be at least 1"));
        }
        Ok((url, name, config))
    }
}

#[async_trait]
impl Backend for RabbitMqBackend {
    fn name(&self) -> &'static str {
        "rabbitmq"
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
        Ok(Arc::new(
            RabbitMqQueue::open(&url, &name, &config, mode).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefetch_follows_the_flow_and_is_never_unlimited() {
        assert_eq!(prefetch_for(Flow::Probing { probes: 2 }, 64), 2);
        assert_eq!(prefetch_for(Flow::Flowing { limit: 16 }, 64), 80);
        // The limiter's moves within a power of two keep the consumer.
        for limit in 9..=16 {
            assert_eq!(prefetch_for(Flow::Flowing { limit }, 64), 80, "{limit}");
        }
        assert_eq!(prefetch_for(Flow::Flowing { limit: 8 }, 64), 72);
        assert_eq!(prefetch_for(Flow::Flowing { limit: 17 }, 64), 96);
        assert_eq!(prefetch_for(Flow::Flowing { limit: 0 }, 0), 1);
        assert_eq!(prefetch_for(Flow::Flowing { limit: u32::MAX }, 1), u16::MAX);
    }

    fn section(extra: &str) -> QueueSection {
        toml::from_str(&format!(
            "backend = \"rabbitmq\"\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\nname = \"orders\"\n{extra}"
        ))
        .expect("toml")
    }

    #[test]
    fn the_config_names_what_is_wrong() {
        let key = |extra: &str| {
            RabbitMqBackend::config(&section(extra))
                .expect_err(extra)
                .key
        };
        assert_eq!(
            key("delay_tiers_ms = [500, 100]").as_deref(),
            Some("delay_tiers_ms")
        );
        assert_eq!(
            key("queue_type = \"stream\"").as_deref(),
            Some("queue_type")
        );
        assert_eq!(key("prefetch = 3").as_deref(), Some("prefetch"));
        let mut s = section("");
        s.url = Some("nats://127.0.0.1:4222".into());
        assert_eq!(
            RabbitMqBackend::config(&s)
                .expect_err("scheme")
                .key
                .as_deref(),
            Some("url")
        );
        assert!(RabbitMqBackend::config(&section("")).is_ok());
    }
}
