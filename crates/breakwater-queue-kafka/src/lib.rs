//! The Kafka backend of the queue contract (`[queue] backend = "kafka"`),
//! for fleets: every ingress process produces to one topic, every worker
//! process joins one consumer group whose partitions pause and resume with
//! the breaker.
//!
//! | contract | Kafka |
//! |---|---|
//! | `enqueue` | produce to `<name>` with `acks=all` and idempotence, keyed by the entity key; durable once the delivery report came |
//! | `claim` | take from what the pump thread fetched; the lease is kept here, and a lapsed one is handed out again |
//! | `extend_leases` | pushes the local lease out |
//! | `ack` | mark the offset finished; commits go up to the lowest unfinished offset of each partition |
//! | `retry_later` | key order and a keyed record: held here, unfinished, with the attempt count + 1 until it is due ([`keys`]); else produce to the retry tier with the attempt count + 1 and the time it is due, then mark finished |
//! | `release` | no delay: back to the front of the fetched records; a delay: as a retry, attempts unchanged |
//! | `dead_letter` | produce to `<name>.dlq` keyed by a new id, with class and reason, then mark finished |
//! | `set_flow` | paused: every assigned partition paused while the pump keeps polling (the consumer stays in its group); half-open: as many partitions of the topic as probes; flowing: all |
//! | `dlq_*` | read the compacted dead-letter topic; a replay or a purge writes a tombstone |
//! | `stats` | lag (high watermark minus what is finished or committed) of the topic as visible, of the tiers as delayed; this process's claims as in flight |
//!
//! **Leases.** Kafka has none: a record stays unfinished (and the commit
//! below it) until it is settled. Within a process a claim's lease is kept
//! here; one that runs out is handed out again at the next claim, and its
//! old receipt settles nothing. A crashed process's unfinished records are
//! read again by whoever gets the partition, from the last commit.
//!
//! **Key order** (`workers.order = "key"`, the default). The entity key
//! chooses the partition, and one consumer of the group owns a partition,
//! so a key's records reach one process in the order they were produced.
//! There only a key's head is handed out; its later records wait behind
//! it until it is applied or dead-lettered, and its retries and delayed
//! releases wait in the process rather than on a tier ([`keys`]). The
//! partition's commit holds at a record waiting for its retry, so a
//! crash or a rebalance reads the key's records again from it, in order;
//! its attempt count, kept in the process meanwhile, starts again there.
//!
//! **Retries.** Without key order, or for a record without a key, a
//! retry or a delayed release is a copy on the smallest
//! tier topic at least as long as its delay, carrying the time it is due;
//! the workers' group reads the tiers too, and holds a tier's partition
//! paused while the record at its head is not due. No partition of the
//! queue ever waits behind a retry.

mod client;
pub mod config;
mod dlq;
#[cfg(test)]
mod fuzz;
mod gate;
mod keys;
mod names;
mod offsets;
mod polled;
mod pump;
#[cfg(feature = "tansu")]
pub mod tansu;
mod wire;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use breakwater_queue::envelope::Meta;
use breakwater_queue::{
    Backend, Capabilities, ConfigProblem, DeadLetter, DeadLetterReason, Delivery, DlqPage,
    Enqueued, Flow, Message, NewMessage, OpenMode, Queue, QueueError, QueueSection, QueueStats,
    Receipt, StatKind,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

pub use self::config::KafkaConfig;
use self::gate::Tp;
pub use self::names::Names;
use self::names::TopicIx;
use self::polled::Polled;
use self::pump::{Claimed, PumpContext, Shared};

/// Longest a claim waits for a record when none is fetched and this
/// process has no claim out.
const CLAIM_WAIT: Duration = Duration::from_millis(20);
/// How long a dead-letter count read for the stats is used.
const DLQ_COUNT_TTL: Duration = Duration::from_secs(5);
/// librdkafka's default `message.max.bytes`.
const DEFAULT_MAX_MESSAGE: usize = 1_000_000;

fn unavailable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The token of a Kafka receipt: which claim, of which record.
struct Token {
    claim: u64,
    tp: Tp,
    offset: i64,
}

struct Inner {
    url: String,
    config: KafkaConfig,
    timeout: Duration,
    shared: Arc<Shared>,
    /// Replaced when librdkafka reports it fenced or otherwise failed for
    /// good (an idempotent producer whose epoch a broker refused after an
    /// outage): such a producer never sends again.
    producer: std::sync::RwLock<FutureProducer>,
    /// A consumer of the group that never joins it: committed offsets and
    /// watermarks for the stats.
    lone: Arc<BaseConsumer>,
    /// Partitions of each subscribed topic, and of the DLQ, as opened.
    partitions: Vec<(TopicIx, i32)>,
    dlq_partitions: i32,
    pump: Mutex<Option<std::thread::JoinHandle<()>>>,
    dlq_count: Mutex<Option<(Instant, u64)>>,
}

/// The Kafka queue.
pub struct KafkaQueue {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaQueue")
            .field("topic", &self.inner.shared.names.topic)
            .finish()
    }
}

/// Longest a dropped queue waits for its consumer to commit and leave its
/// group.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

impl Drop for KafkaQueue {
    fn drop(&mut self) {
        // The pump commits what is finished and leaves the group. Wait for
        // it (a while at most): whoever dropped the queue may delete its
        // topics next, and librdkafka can crash when a topic goes away
        // under a consumer that is still closing (seen with tansu).
        self.inner.shared.stop();
        let pump = self
            .inner
            .pump
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(pump) = pump {
            let deadline = Instant::now() + CLOSE_WAIT;
            while !pump.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if pump.is_finished() {
                let _ = pump.join();
            } else {
                tracing::warn!("kafka: the consumer did not close within {CLOSE_WAIT:?}");
            }
        }
    }
}

impl KafkaQueue {
    /// Connects to the bootstrap servers `url` and opens the topic `name`:
    /// with [`OpenMode::Serve`] its topics are made where missing; with
    /// [`OpenMode::Inspect`] the topic must exist. The workers' consumer
    /// joins its group at the first claim, so a process that only
    /// produces never holds partitions.
    pub async fn open(
        url: &str,
        name: &str,
        config: &KafkaConfig,
        mode: OpenMode,
    ) -> Result<Self, QueueError> {
        let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
        let names = Names::of(name, &config.delay_tiers_ms, config.group.as_deref());
        if mode == OpenMode::Serve {
            client::create_topics(url, config, &names)
                .await
                .map_err(unavailable)?;
        }
        let lone = {
            let (url, config, group) = (url.to_owned(), config.clone(), names.group.clone());
            tokio::task::spawn_blocking(move || client::lone_consumer(&url, &config, &group))
                .await
                .map_err(unavailable)?
                .map_err(unavailable)?
        };
        let lone = Arc::new(lone);
        // Topics just created may be missing from the metadata for a moment
        // (the broker creates them asynchronously; seen on tansu): a
        // serving process waits for them, up to the request timeout.
        let deadline = std::time::Instant::now() + timeout;
        let (partitions, dlq_partitions) = loop {
            let (lone, names) = (Arc::clone(&lone), names.clone());
            let read = tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
                let mut counts = Vec::new();
                for (i, topic) in names.subscribed().into_iter().enumerate() {
                    counts.push((TopicIx(i), client::partitions_of(&lone, topic, timeout)?));
                }
                let dlq = client::partitions_of(&lone, &names.dlq, timeout)?;
                Ok((counts, dlq))
            })
            .await
            .map_err(unavailable)?
            .map_err(unavailable)?;
            let missing = read.0.iter().any(|(_, n)| n.is_none()) || read.1.is_none();
            if mode != OpenMode::Serve || !missing || std::time::Instant::now() >= deadline {
                break read;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if partitions.first().is_none_or(|(_, n)| n.is_none()) {
            return Err(QueueError::Missing {
                location: format!("Kafka topic {name} at {url}"),
            });
        }
        let partitions = partitions
            .into_iter()
            .filter_map(|(ix, n)| Some((ix, n?)))
            .collect();
        let producer = client::producer(url, config).map_err(unavailable)?;
        Ok(Self {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                config: config.clone(),
                timeout,
                shared: Arc::new(Shared::new(names, config.max_fetched, config.key_order)),
                producer: std::sync::RwLock::new(producer),
                lone,
                partitions,
                dlq_partitions: dlq_partitions.unwrap_or(1),
                pump: Mutex::new(None),
                dlq_count: Mutex::new(None),
            }),
        })
    }

    /// Deletes every topic of `name` and its group (for tests and the lab,
    /// which make their own); errors are ignored.
    pub async fn destroy(url: &str, name: &str, config: &KafkaConfig) {
        let names = Names::of(name, &config.delay_tiers_ms, config.group.as_deref());
        client::delete_topics(url, config, &names).await;
    }

    /// [`KafkaQueue::destroy`] from code that is not async (a test's
    /// `Drop`): on a thread and a runtime of its own.
    pub fn destroy_blocking(url: &str, name: &str) {
        let (url, name) = (url.to_owned(), name.to_owned());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(Self::destroy(&url, &name, &KafkaConfig::default()));
            }
        })
        .join();
    }

    /// The topic and group names on the broker.
    pub fn names(&self) -> &Names {
        &self.inner.shared.names
    }

    /// Records this process took from the broker since it opened the
    /// queue: while the breaker is open it does not move.
    pub fn fetched_total(&self) -> u64 {
        self.inner
            .shared
            .fetched
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Inner {
    /// Joins the group (once): the pump thread starts polling.
    fn ensure_pump(&self) -> Result<(), QueueError> {
        let mut pump = self.pump.lock().unwrap_or_else(PoisonError::into_inner);
        if pump.as_ref().is_some_and(|t| !t.is_finished()) {
            return Ok(());
        }
        let names = &self.shared.names;
        let consumer: BaseConsumer<PumpContext> =
            client::consumer_config(&self.url, &self.config, &names.group)
                .create_with_context(PumpContext {
                    shared: Arc::clone(&self.shared),
                })
                .map_err(unavailable)?;
        consumer
            .subscribe(&names.subscribed())
            .map_err(unavailable)?;
        let shared = Arc::clone(&self.shared);
        let every = Duration::from_millis(self.config.commit_interval_ms.max(1));
        let thread = std::thread::Builder::new()
            .name("breakwater-kafka".into())
            .spawn(move || pump::run(consumer, shared, every))
            .map_err(unavailable)?;
        *pump = Some(thread);
        Ok(())
    }

    fn pump_running(&self) -> bool {
        self.pump
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Produces one record and waits for its delivery report.
    async fn produce(
        &self,
        topic: &str,
        key: Option<&str>,
        meta: &Meta,
        body: &[u8],
        due: Due,
    ) -> Result<rdkafka::producer::future_producer::Delivery, QueueError> {
        let mut headers = OwnedHeaders::new();
        let mut header_bytes = 0;
        for (k, v) in wire::headers(meta, body, due.not_before_ms, due.releases) {
            header_bytes += k.len() + v.len();
            headers = headers.insert(Header {
                key: k,
                value: Some(&v),
            });
        }
        let mut record = FutureRecord::to(topic).payload(body).headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        let size = body.len() + header_bytes + key.map_or(0, str::len);
        let future = self
            .producer()
            .send_result(record)
            .map_err(|(e, _)| self.produce_error(&e, topic, size))?;
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), future).await {
            Ok(Ok(Ok(delivery))) => Ok(delivery),
            Ok(Ok(Err((e, _)))) => Err(self.produce_error(&e, topic, size)),
            Ok(Err(_)) => Err(QueueError::Closed),
            Err(_) => Err(unavailable(format!(
                "no delivery report from {topic} within {:?}",
                self.timeout
            ))),
        }
    }

    fn producer(&self) -> FutureProducer {
        self.producer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the producer when it failed for good: librdkafka says so,
    /// or the broker fenced its producer id.
    fn renew_producer_if_failed(&self, e: &KafkaError) {
        let mut producer = self
            .producer
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let fenced = matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
        );
        let Some((code, reason)) = producer
            .client()
            .fatal_error()
            .or_else(|| fenced.then(|| (RDKafkaErrorCode::ProducerFenced, e.to_string())))
        else {
            return;
        };
        match client::producer(&self.url, &self.config) {
            Ok(fresh) => {
                tracing::warn!(%code, %reason, "kafka: the producer failed for good; replaced");
                *producer = fresh;
            }
            Err(e) => {
                tracing::warn!(%code, error = %e, "kafka: the producer failed for good and cannot be replaced")
            }
        }
    }

    fn produce_error(&self, e: &KafkaError, topic: &str, size: usize) -> QueueError {
        self.renew_producer_if_failed(e);
        match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::QueueFull) => QueueError::Full {
                pending: usize::try_from(self.producer().in_flight_count()).unwrap_or(0),
            },
            Some(RDKafkaErrorCode::MessageSizeTooLarge) => QueueError::TooLarge {
                bytes: size,
                max: self
                    .config
                    .librdkafka
                    .get("message.max.bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(DEFAULT_MAX_MESSAGE),
            },
            _ => unavailable(format!("produce to {topic}: {e}")),
        }
    }

    /// The record a claim holds, while it holds it.
    fn claimed<'r>(&self, receipt: &'r Receipt) -> Result<(&'r Token, Polled), QueueError> {
        let token = receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)?;
        let st = self.shared.state();
        let polled = st
            .outstanding
            .get(&token.claim)
            .map(|c| c.polled.clone())
            .ok_or_else(|| lease_lost(token))?;
        Ok((token, polled))
    }

    /// The claim is settled: its record is finished.
    fn settle(&self, token: &Token) -> Result<(), QueueError> {
        let mut st = self.shared.state();
        let c = st
            .outstanding
            .remove(&token.claim)
            .ok_or_else(|| lease_lost(token))?;
        st.finish_claimed(&c.polled);
        drop(st);
        self.shared.settled.notify_waiters();
        self.shared.arrived.notify_waiters();
        Ok(())
    }

    /// Settles a claim by holding its record here, unfinished and still
    /// its key's head, until `delay` passed (key order: a retry or a
    /// delayed release of a keyed record). False, touching nothing, when
    /// the record is not held here ([`pump::State::holds_here`]).
    fn hold_here(
        &self,
        token: &Token,
        delay: Duration,
        change: impl FnOnce(&mut wire::Read),
    ) -> Result<bool, QueueError> {
        let mut st = self.shared.state();
        let c = st
            .outstanding
            .get(&token.claim)
            .ok_or_else(|| lease_lost(token))?;
        if !st.holds_here(&c.polled) {
            return Ok(false);
        }
        let mut c = st
            .outstanding
            .remove(&token.claim)
            .ok_or_else(|| lease_lost(token))?;
        if let Ok(read) = c.polled.read.as_mut() {
            change(read);
        }
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        let due = now_ms().saturating_add(delay_ms).saturating_add(1);
        st.here.insert((due, token.claim), c.polled);
        st.dirty = true;
        drop(st);
        self.shared.settled.notify_waiters();
        Ok(true)
    }

    /// Settles a claim by a copy elsewhere: on a tier (a retry or a delayed
    /// release) or the DLQ.
    async fn move_to(
        &self,
        receipt: &Receipt,
        to: Destination,
        change: impl FnOnce(&mut Meta),
    ) -> Result<(), QueueError> {
        let (token, polled) = self.claimed(receipt)?;
        let Ok(read) = &polled.read else {
            return Err(lease_lost(token));
        };
        let mut meta = read.meta.clone();
        change(&mut meta);
        let names = &self.shared.names;
        match to {
            Destination::After(delay) | Destination::ReleasedFor(delay) => {
                // Rounded up: `now_ms` truncates, and a retry is never early.
                let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
                let due_at = now_ms().saturating_add(delay_ms).saturating_add(1);
                let ix = names.for_delay(delay);
                let released = u32::from(matches!(to, Destination::ReleasedFor(_)));
                let due = Due {
                    not_before_ms: if ix.is_tier() { due_at } else { 0 },
                    releases: read.releases.saturating_add(released),
                };
                self.produce(
                    names.topic(ix),
                    meta.entity_key.as_deref(),
                    &meta,
                    &polled.body,
                    due,
                )
                .await?;
            }
            Destination::DeadLetters => {
                let id = dlq::new_id(meta.dead_at_ms.unwrap_or_else(now_ms));
                self.produce(&names.dlq, Some(&id), &meta, &polled.body, Due::NOW)
                    .await?;
                self.forget_dlq_count();
            }
        }
        self.settle(token)
    }

    /// A record Breakwater cannot read goes to the DLQ as it came.
    async fn dead_letter_foreign(&self, p: Polled, why: &wire::Foreign) {
        let names = &self.shared.names;
        let event_id = format!("{}/{}/{}", names.topic(p.tp.0), p.tp.1, p.offset);
        let meta = Meta {
            source: String::new(),
            event_id: event_id.clone(),
            entity_key: None,
            headers: Vec::new(),
            received_at_ms: p.timestamp_ms.unwrap_or_default(),
            replays: 0,
            attempts: 0,
            class: Some("permanent".into()),
            error: Some(why.to_string()),
            dead_at_ms: Some(now_ms()),
        };
        let id = dlq::new_id(now_ms());
        match self
            .produce(&names.dlq, Some(&id), &meta, &p.body, Due::NOW)
            .await
        {
            Ok(_) => {
                self.shared.state().finish(p.tp, p.offset);
                self.forget_dlq_count();
                tracing::warn!(record = %event_id, error = %why, "a record Breakwater cannot read; dead-lettered");
            }
            Err(e) => {
                tracing::warn!(record = %event_id, error = %e, "a record Breakwater cannot read could not be dead-lettered");
                self.shared.state().buffered.push_front(p);
            }
        }
    }

    /// Takes up to `max` fetched records under a lease; foreign ones apart.
    fn take(&self, max: usize, lease: Duration) -> (Vec<Delivery>, Vec<Polled>) {
        let mut st = self.shared.state();
        let flow = st.gate.flow();
        if !flow.delivers() {
            return (Vec::new(), Vec::new());
        }
        let now = Instant::now();
        // Lapsed leases go back to the front, oldest claim first.
        let mut lapsed: Vec<u64> = st
            .outstanding
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(claim, _)| *claim)
            .collect();
        lapsed.sort_unstable_by(|a, b| b.cmp(a));
        for claim in lapsed {
            if let Some(c) = st.outstanding.remove(&claim) {
                st.buffered.push_front(c.polled);
            }
        }
        let room = match flow {
            Flow::Probing { probes } => (probes as usize).saturating_sub(st.outstanding.len()),
            _ => max,
        };
        let names = &self.shared.names;
        let (mut got, mut foreign) = (Vec::new(), Vec::new());
        while got.len() < max.min(room) {
            let Some(p) = st.buffered.pop_front() else {
                break;
            };
            let Ok(read) = &p.read else {
                foreign.push(p);
                continue;
            };
            let claim = st.next_claim;
            st.next_claim += 1;
            let m = &read.meta;
            got.push(Delivery {
                message: Message {
                    id: format!("{}/{}/{}", names.topic(p.tp.0), p.tp.1, p.offset),
                    source: m.source.clone(),
                    event_id: m.event_id.clone(),
                    entity_key: m.entity_key.clone(),
                    headers: m.headers.clone(),
                    body: p.body.clone(),
                    received_at_ms: m.received_at_ms,
                    attempts: m.attempts,
                    // Not deliveries: releases + 1, which spreads a hot
                    // key's releases out (as on RabbitMQ).
                    receives: read.releases.saturating_add(1),
                },
                receipt: Receipt::new(Token {
                    claim,
                    tp: p.tp,
                    offset: p.offset,
                }),
            });
            st.outstanding.insert(
                claim,
                Claimed {
                    polled: p,
                    deadline: now + lease,
                },
            );
        }
        if !got.is_empty() || !foreign.is_empty() {
            st.dirty = true;
        }
        (got, foreign)
    }

    fn forget_dlq_count(&self) {
        *self
            .dlq_count
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Reads the dead-letter topic (on a blocking thread, with a consumer
    /// of its own).
    async fn scan_dlq(self: &Arc<Self>) -> Result<BTreeMap<String, dlq::Record>, QueueError> {
        let inner = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let group = format!("{}.dlq-reader", inner.shared.names.group);
            let consumer =
                client::lone_consumer(&inner.url, &inner.config, &group).map_err(unavailable)?;
            dlq::scan(
                &consumer,
                &inner.shared.names.dlq,
                inner.dlq_partitions,
                inner.config.dlq_scan_max,
                inner.timeout * 3,
            )
        })
        .await
        .map_err(unavailable)?
    }

    async fn tombstone(&self, id: &str) -> Result<(), QueueError> {
        let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&self.shared.names.dlq).key(id);
        let future = self
            .producer()
            .send_result(record)
            .map_err(|(e, _)| unavailable(e))?;
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), future).await {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err((e, _)))) => Err(self.produce_error(&e, &self.shared.names.dlq, 0)),
            Ok(Err(_)) => Err(QueueError::Closed),
            Err(_) => Err(unavailable("no delivery report for a tombstone")),
        }
    }

    /// Lag of every partition: (topic, partition) -> high watermark minus
    /// the group's committed offset (or the low watermark).
    fn lags(&self) -> Result<Vec<(Tp, i64, i64)>, QueueError> {
        let names = &self.shared.names;
        let mut ends = TopicPartitionList::new();
        let mut starts = TopicPartitionList::new();
        for (ix, n) in &self.partitions {
            for p in 0..*n {
                let topic = names.topic(*ix);
                ends.add_partition_offset(topic, p, Offset::End)
                    .map_err(unavailable)?;
                starts
                    .add_partition_offset(topic, p, Offset::Beginning)
                    .map_err(unavailable)?;
            }
        }
        let highs = self
            .lone
            .offsets_for_times(ends, self.timeout)
            .map_err(unavailable)?;
        let lows = self
            .lone
            .offsets_for_times(starts, self.timeout)
            .map_err(unavailable)?;
        let mut asked = TopicPartitionList::new();
        for (ix, n) in &self.partitions {
            asked.add_partition_range(names.topic(*ix), 0, n - 1);
        }
        let committed = self
            .lone
            .committed_offsets(asked, self.timeout)
            .map_err(unavailable)?;
        let mut out = Vec::new();
        for e in highs.elements() {
            let Some(ix) = names.ix(e.topic()) else {
                continue;
            };
            let tp = (ix, e.partition());
            let Offset::Offset(high) = e.offset() else {
                continue;
            };
            let low = lows
                .find_partition(e.topic(), e.partition())
                .and_then(|l| l.offset().to_raw())
                .filter(|o| *o >= 0)
                .unwrap_or(0);
            let done = committed
                .find_partition(e.topic(), e.partition())
                .and_then(|c| c.offset().to_raw())
                .filter(|o| *o >= 0)
                .unwrap_or(low)
                .max(low);
            out.push((tp, high, done));
        }
        Ok(out)
    }
}

/// Where [`Inner::move_to`] puts a copy.
enum Destination {
    /// A retry: back after the delay.
    After(Duration),
    /// Handed back untried: back after the delay, one more release.
    ReleasedFor(Duration),
    DeadLetters,
}

/// When a produced record is due, and how often it was released.
#[derive(Debug, Clone, Copy)]
struct Due {
    /// Ms since the epoch; 0: at once.
    not_before_ms: i64,
    releases: u32,
}

impl Due {
    const NOW: Self = Self {
        not_before_ms: 0,
        releases: 0,
    };
}

fn lease_lost(token: &Token) -> QueueError {
    QueueError::LeaseLost {
        id: format!("{}/{}", token.tp.1, token.offset),
    }
}

const STATS: &[StatKind] = &[
    StatKind::Visible,
    StatKind::InFlight,
    StatKind::Delayed,
    StatKind::DeadLettered,
];

#[async_trait]
impl Queue for KafkaQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_delay: false,
            native_dedup: false,
            counts_attempts: false,
            counts_receives: false,
            filters_keys: false,
            // Claims take from a buffer, but what the workers hold (a
            // parked key's messages) costs no broker window: they may hold
            // them, as on a pull backend, rather than send copies through
            // the retry tiers.
            push: false,
            stats: STATS,
        }
    }

    async fn start_consuming(&self, within: Duration) -> Result<(), QueueError> {
        self.inner.ensure_pump()?;
        let deadline = Instant::now() + within;
        while self.inner.shared.state().offsets.is_empty() {
            if Instant::now() >= deadline {
                return Err(unavailable(format!(
                    "the consumer got no partition of {} within {within:?}",
                    self.inner.shared.names.topic
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Moves when the pump put fetched records in the claim buffer.
    fn arrivals(&self) -> Option<breakwater_queue::Arrivals> {
        Some(self.inner.shared.arrivals.subscribe())
    }

    async fn enqueue(&self, mut message: NewMessage) -> Result<Enqueued, QueueError> {
        let meta = Meta::of(&mut message);
        let topic = &self.inner.shared.names.topic;
        let d = self
            .inner
            .produce(
                topic,
                meta.entity_key.as_deref(),
                &meta,
                &message.body,
                Due::NOW,
            )
            .await?;
        Ok(Enqueued::New {
            id: format!("{topic}/{}/{}", d.partition, d.offset),
        })
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.inner.ensure_pump()?;
        let deadline = tokio::time::Instant::now() + CLAIM_WAIT;
        loop {
            let arrived = self.inner.shared.arrived.notified();
            let settled = self.inner.shared.settled.notified();
            let (got, foreign) = self.inner.take(max, lease);
            for p in foreign {
                if let Err(why) = &p.read {
                    let why = why.clone();
                    self.inner.dead_letter_foreign(p, &why).await;
                }
            }
            // A caller with claims out (applies running) returns to them
            // at once: it comes back when one is settled or when records
            // arrive (`arrivals`), and waiting here would hold up reaping
            // its finished applies (a held key's backlog drained at one
            // message per wait).
            let busy = !self.inner.shared.state().outstanding.is_empty();
            if !got.is_empty() || busy || tokio::time::Instant::now() >= deadline {
                return Ok(got);
            }
            // Wait for a record, or for a claim of this process to be
            // settled: the caller may then start what waited behind it (a
            // hot key's next message starts when the one before is done,
            // not a claim's wait later).
            tokio::select! {
                _ = arrived => {}
                _ = settled => return Ok(got),
                _ = tokio::time::sleep_until(deadline) => return Ok(got),
            }
        }
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError> {
        let token = receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)?;
        self.inner.settle(token)
    }

    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let deadline = Instant::now() + lease;
        let mut st = self.inner.shared.state();
        let mut extended = 0;
        for r in receipts {
            if let Some(c) = r
                .token::<Token>()
                .and_then(|t| st.outstanding.get_mut(&t.claim))
            {
                c.deadline = deadline;
                extended += 1;
            }
        }
        Ok(extended)
    }

    async fn retry_later(
        &self,
        receipt: &Receipt,
        delay: Duration,
        error: &str,
    ) -> Result<(), QueueError> {
        let _ = error;
        let token = receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)?;
        let count = |read: &mut wire::Read| {
            read.meta.attempts = read.meta.attempts.saturating_add(1);
        };
        if self.inner.hold_here(token, delay, count)? {
            return Ok(());
        }
        self.inner
            .move_to(receipt, Destination::After(delay), |m| {
                m.attempts = m.attempts.saturating_add(1);
            })
            .await
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError> {
        let token = receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)?;
        let count = |read: &mut wire::Read| read.releases = read.releases.saturating_add(1);
        if !delay.is_zero() && self.inner.hold_here(token, delay, count)? {
            return Ok(());
        }
        if !delay.is_zero() {
            return self
                .inner
                .move_to(receipt, Destination::ReleasedFor(delay), |_| {})
                .await;
        }
        let mut st = self.inner.shared.state();
        let c = st
            .outstanding
            .remove(&token.claim)
            .ok_or_else(|| lease_lost(token))?;
        st.buffered.push_front(c.polled);
        st.dirty = true;
        drop(st);
        self.inner.shared.arrived.notify_waiters();
        self.inner.shared.settled.notify_waiters();
        Ok(())
    }

    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError> {
        self.inner
            .move_to(receipt, Destination::DeadLetters, |m| {
                m.class = Some(reason.class.clone());
                m.error = Some(reason.error.clone());
                m.dead_at_ms = Some(now_ms());
            })
            .await
    }

    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError> {
        let wanted = {
            let mut st = self.inner.shared.state();
            st.gate.set_flow(flow);
            st.wanted += 1;
            st.dirty = true;
            st.wanted
        };
        if !self.inner.pump_running() {
            return Ok(());
        }
        // Returns once the pump applied it to the consumer's partitions.
        let mut applied = self.inner.shared.applied.subscribe();
        match tokio::time::timeout(self.inner.timeout, applied.wait_for(|a| *a >= wanted)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(QueueError::Closed),
            Err(_) => Err(unavailable(
                "the Kafka consumer did not take the new flow in time",
            )),
        }
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        let inner = Arc::clone(&self.inner);
        let lags = tokio::task::spawn_blocking(move || inner.lags())
            .await
            .map_err(unavailable)??;
        let dead = self.dlq_count().await?;
        let st = self.inner.shared.state();
        let (mut visible, mut delayed) = (0u64, 0u64);
        let held_by_partition = st.held_by_partition();
        for (tp, high, committed) in lags {
            let held = held_by_partition.get(&tp).copied().unwrap_or_default();
            // Here: what is fetched and not claimed, and what is not
            // fetched yet; elsewhere: everything past the commit.
            let (held, unread) = match st.offsets.get(&tp).and_then(|o| o.next()) {
                Some(next) => (held, (high - next).max(0) as u64),
                None => (pump::Held::default(), (high - committed).max(0) as u64),
            };
            // A retry waiting here is delayed, on whichever topic.
            delayed += held.here;
            if tp.0.is_tier() {
                visible += held.ready;
                delayed += held.waiting + unread;
            } else {
                visible += held.ready + held.waiting + unread;
            }
        }
        Ok(QueueStats {
            visible: Some(visible),
            in_flight: Some(st.outstanding.len() as u64),
            delayed: Some(delayed),
            dead_lettered: Some(dead),
            ..QueueStats::default()
        })
    }

    async fn ready(&self) -> Result<(), QueueError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let topic = &inner.shared.names.topic;
            match client::partitions_of(&inner.lone, topic, inner.timeout) {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(unavailable(format!("no topic {topic} on the broker"))),
                Err(e) => Err(unavailable(e)),
            }
        })
        .await
        .map_err(unavailable)?
    }

    async fn dlq_list(&self, page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
        let live = self.inner.scan_dlq().await?;
        let after = page.after.as_deref().unwrap_or("");
        Ok(live
            .iter()
            .filter(|(id, _)| id.as_str() > after)
            .take(page.limit)
            .map(|(id, r)| r.to_dead_letter(id, false))
            .collect())
    }

    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError> {
        let live = self.inner.scan_dlq().await?;
        live.get(id)
            .map(|r| r.to_dead_letter(id, true))
            .ok_or_else(|| QueueError::NotFound { id: id.to_owned() })
    }

    async fn dlq_replay(
        &self,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let live = self.inner.scan_dlq().await?;
        let chosen: Vec<(&String, &dlq::Record)> = live
            .iter()
            .filter(|(id, _)| ids.is_empty() || ids.contains(id))
            .filter(|(_, r)| r.meta.replays < max_replays)
            .take(limit)
            .collect();
        let mut put_back = Vec::new();
        for (id, r) in chosen {
            let meta = Meta {
                replays: r.meta.replays + 1,
                attempts: 0,
                class: None,
                error: None,
                dead_at_ms: None,
                ..r.meta.clone()
            };
            let topic = &self.inner.shared.names.topic;
            self.inner
                .produce(topic, meta.entity_key.as_deref(), &meta, &r.body, Due::NOW)
                .await?;
            self.inner.tombstone(id).await?;
            put_back.push(id.clone());
        }
        self.inner.forget_dlq_count();
        Ok(put_back)
    }

    async fn dlq_purge(&self, ids: &[String]) -> Result<usize, QueueError> {
        let live = self.inner.scan_dlq().await?;
        let mut purged = 0;
        for id in live.keys().filter(|id| ids.is_empty() || ids.contains(id)) {
            self.inner.tombstone(id).await?;
            purged += 1;
        }
        self.inner.forget_dlq_count();
        Ok(purged)
    }
}

impl KafkaQueue {
    /// Dead letters on the topic, read again at most every
    /// [`DLQ_COUNT_TTL`] (reading means scanning the topic).
    async fn dlq_count(&self) -> Result<u64, QueueError> {
        let cached = *self
            .inner
            .dlq_count
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, n)) = cached.filter(|(at, _)| at.elapsed() < DLQ_COUNT_TTL) {
            return Ok(n);
        }
        let n = self.inner.scan_dlq().await?.len() as u64;
        *self
            .inner
            .dlq_count
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), n));
        Ok(n)
    }
}

/// Builds the Kafka queue from `[queue]`: `backend = "kafka"`, `url` (the
/// bootstrap servers, `host:9092[,host:9092...]`), `name` (the topic), and
/// the keys of [`KafkaConfig`]. (`lease_ms` is each claim's lease, kept
/// here.)
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaBackend;

impl KafkaBackend {
    fn config(section: &QueueSection) -> Result<(String, String, KafkaConfig), ConfigProblem> {
        let config: KafkaConfig = section.own()?;
        let url = section.required_url()?.to_owned();
        if url.contains("://") {
            return Err(ConfigProblem::key(
                "url",
                "must be the bootstrap servers, host:port[,host:port...] (no scheme)",
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
        if config.partitions < 1 {
            return Err(ConfigProblem::key("partitions", "must be at least 1"));
        }
        if config.dlq_scan_max == 0 {
            return Err(ConfigProblem::key("dlq_scan_max", "must be at least 1"));
        }
        if config.max_poll_interval_ms < config.session_timeout_ms {
            return Err(ConfigProblem::key(
                "max_poll_interval_ms",
                "must be at least session_timeout_ms",
            ));
        }
        Ok((url, name, config))
    }
}

#[async_trait]
impl Backend for KafkaBackend {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn check(&self, section: &QueueSection) -> Result<toml::Table, ConfigProblem> {
        let (_, _, config) = Self::config(section)?;
        breakwater_queue::own_keys_table(&config)
    }

    fn secret_keys(&self) -> &'static [&'static str] {
        &["librdkafka"]
    }

    /// The key chooses the partition, one consumer of the group owns a
    /// partition, and a keyed record's retry waits in that consumer ahead
    /// of its key's later records (`keys.rs`).
    fn keeps_key_order(&self, _section: &QueueSection) -> Result<(), String> {
        Ok(())
    }

    async fn open(
        &self,
        section: &QueueSection,
        mode: OpenMode,
    ) -> Result<Arc<dyn Queue>, QueueError> {
        let (url, name, mut config) =
            Self::config(section).map_err(|e| QueueError::Storage(e.to_string()))?;
        config.key_order = section.key_order;
        Ok(Arc::new(
            KafkaQueue::open(&url, &name, &config, mode).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(extra: &str) -> QueueSection {
        toml::from_str(&format!(
            "backend = \"kafka\"\nurl = \"127.0.0.1:9092\"\nname = \"orders\"\n{extra}"
        ))
        .expect("toml")
    }

    #[test]
    fn the_config_names_what_is_wrong() {
        let key = |extra: &str| KafkaBackend::config(&section(extra)).expect_err(extra).key;
        assert_eq!(
            key("delay_tiers_ms = [500, 100]").as_deref(),
            Some("delay_tiers_ms")
        );
        assert_eq!(key("partitions = 0").as_deref(), Some("partitions"));
        assert_eq!(key("prefetch = 3").as_deref(), Some("prefetch"));
        assert_eq!(
            key("session_timeout_ms = 60000\nmax_poll_interval_ms = 10000").as_deref(),
            Some("max_poll_interval_ms")
        );
        let mut s = section("");
        s.url = Some("kafka://127.0.0.1:9092".into());
        assert_eq!(
            KafkaBackend::config(&s).expect_err("scheme").key.as_deref(),
            Some("url")
        );
        let (url, name, config) = KafkaBackend::config(&section("")).expect("defaults");
        assert_eq!((url.as_str(), name.as_str()), ("127.0.0.1:9092", "orders"));
        assert_eq!(config, KafkaConfig::default());
    }
}
