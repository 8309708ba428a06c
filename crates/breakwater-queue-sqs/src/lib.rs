//! The Amazon SQS backend of the queue contract (`[queue] backend =
//! "sqs"`), for fleets on AWS: every ingress process sends to one queue,
//! every worker process receives from it. Standard and FIFO queues (a name
//! ending in `.fifo`).
//!
//! | contract | SQS |
//! |---|---|
//! | `enqueue` | `SendMessageBatch` of the calls waiting ([`batcher`]), durable once SQS answered; FIFO: the entity key as group id, a hash of source and event id as deduplication id |
//! | `claim` | `ReceiveMessage` (up to 10 a call, `receive_concurrency` calls at once; a long poll of `wait_time_secs` while this process holds no claim, else a short one), the lease as `VisibilityTimeout`; **no receive at all while paused** |
//! | `extend_leases` | `ChangeMessageVisibilityBatch` |
//! | `ack` | `DeleteMessageBatch` of the acks waiting |
//! | `retry_later` | a copy with the attempt count + 1, delayed (`DelaySeconds` up to 15 min, beyond that or on FIFO held back by `bw-not-before`), then the original deleted |
//! | `release` | a visibility change (`ChangeMessageVisibilityBatch`) to the delay: handed back untried, nothing counted but SQS's receive count |
//! | `dead_letter` | a copy with class and reason to the DLQ queue, then the original deleted |
//! | `set_flow` | pull backend: no receive while paused (and the pause waits for the receives in flight), at most the window per claim |
//! | `dlq_*` | the DLQ's messages received (held invisible), the chosen ones settled, the rest handed back (`dlq.rs`) |
//! | `stats` | `ApproximateNumberOfMessages` (visible), `...NotVisible` (in flight), `...Delayed`; the DLQ's total |
//!
//! **Attempts and receives.** SQS counts receives (`ApproximateReceiveCount`)
//! and a release raises it as much as a failure does. So the attempt count
//! travels with the message (in its metadata, [`wire`]), and a retry is a
//! fresh copy carrying the count + 1, sent before the original is deleted
//! (a crash between the two leaves two copies, which the sink's inbox
//! applies once). A copy starts a fresh receive count, so the queue's
//! redrive policy (`maxReceiveCount`) counts only the receives since the
//! last attempt (the attempt's own, releases, lapsed leases, and the
//! receive that holds back a copy not yet due); it is read at start
//! ([`Queue::redelivery_limit`]).
//!
//! **Receipts** carry the message id and the receipt handle of their
//! receive. The lease is also kept in the process: a receipt settles once,
//! and not after its lease ran out (SQS may by then have handed the
//! message to another worker, and would take the stale handle's delete).

mod batcher;
mod client;
mod config;
mod dlq;
#[cfg(test)]
mod fuzz;
mod names;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use breakwater_queue::envelope::Meta;
use breakwater_queue::{
    Backend, Capabilities, ConfigProblem, DeadLetter, DeadLetterReason, Delivery, DlqPage,
    Enqueued, Flow, Message, NewMessage, OpenMode, Queue, QueueError, QueueSection, QueueStats,
    Receipt, StatKind,
};
use bytes::Bytes;
use futures_util::future::join_all;
use serde::Deserialize;

use self::batcher::{Batcher, Flush};
pub use self::client::Endpoint;
pub use self::config::SqsConfig;
use self::names::Names;
use self::wire::{Incoming, Outgoing};

/// SQS's longest `DelaySeconds`.
const MAX_DELAY: Duration = Duration::from_secs(900);
/// SQS's longest visibility timeout.
const MAX_VISIBILITY_SECS: i32 = 43_200;
/// SQS's message size limit when the queue does not say.
const DEFAULT_MAX_MESSAGE: usize = 262_144;
/// Most calls waiting for a send or delete batch.
const WAITING_CALLS: usize = 10_000;
/// How long an ack waits for others to share its `DeleteMessageBatch`.
const DELETE_LINGER: Duration = Duration::from_millis(20);
/// How long a `ready` answer is reused (it costs a call).
const READY_FOR: Duration = Duration::from_secs(1);

fn unavailable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

/// An SDK error with its causes, for `Unavailable`.
fn sdk(what: &str, e: impl std::error::Error) -> QueueError {
    QueueError::Unavailable(format!("SQS {what}: {}", DisplayErrorContext(e)))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whole seconds, rounded up (SQS counts in seconds; a delay must never
/// end early), within SQS's limits.
fn secs_up(d: Duration, max: i32) -> i32 {
    let secs = d.as_millis().div_ceil(1000);
    i32::try_from(secs).unwrap_or(max).min(max)
}

/// How many messages each of a claim's receives asks for: shares that add
/// up to `max` (or to what `concurrency` receives of 10 can take), each at
/// most 10.
fn receive_sizes(max: usize, concurrency: usize) -> Vec<usize> {
    let calls = max.div_ceil(batcher::MAX_ENTRIES).min(concurrency.max(1));
    (0..calls)
        .map(|i| (max * (i + 1) / calls - max * i / calls).min(batcher::MAX_ENTRIES))
        .collect()
}

/// A message going to SQS: what to send and how.
struct Send {
    out: Outgoing,
    delay_secs: i32,
    group: Option<String>,
    dedup: Option<String>,
}

impl Send {
    fn entry(self, id: usize) -> Result<SendMessageBatchRequestEntry, QueueError> {
        let mut b = SendMessageBatchRequestEntry::builder()
            .id(id.to_string())
            .message_body(self.out.body)
            .message_attributes(
                wire::META,
                MessageAttributeValue::builder()
                    .data_type("Binary")
                    .binary_value(Blob::new(self.out.meta))
                    .build()
                    .map_err(unavailable)?,
            );
        if let Some(encoding) = self.out.body_encoding {
            b = b.message_attributes(wire::BODY_ENCODING, string_attribute("String", encoding)?);
        }
        if let Some(at) = self.out.not_before_ms {
            b = b.message_attributes(
                wire::NOT_BEFORE,
                string_attribute("Number", &at.to_string())?,
            );
        }
        if self.delay_secs > 0 {
            b = b.delay_seconds(self.delay_secs);
        }
        if let Some(group) = self.group {
            b = b.message_group_id(group);
        }
        if let Some(dedup) = self.dedup {
            b = b.message_deduplication_id(dedup);
        }
        b.build().map_err(unavailable)
    }
}

fn string_attribute(ty: &str, value: &str) -> Result<MessageAttributeValue, QueueError> {
    MessageAttributeValue::builder()
        .data_type(ty)
        .string_value(value)
        .build()
        .map_err(unavailable)
}

/// One batch call's outcome per entry, in order: the message id or the
/// entry's failure (`sender_fault` on a delete: the handle is stale).
fn outcomes(
    n: usize,
    ok: impl Iterator<Item = (String, String)>,
    failed: impl Iterator<Item = (String, bool, String)>,
    stale_is_lease_lost: bool,
) -> Vec<Result<String, QueueError>> {
    let mut out: Vec<Result<String, QueueError>> = (0..n)
        .map(|_| Err(unavailable("SQS did not answer for this entry")))
        .collect();
    for (id, value) in ok {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
            *slot = Ok(value);
        }
    }
    for (id, sender_fault, why) in failed {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
            *slot = Err(if sender_fault && stale_is_lease_lost {
                QueueError::LeaseLost { id: why }
            } else {
                unavailable(format!("SQS refused the entry: {why}"))
            });
        }
    }
    out
}

/// Every entry of a batch of `n` failed for one reason (the call itself).
fn all_failed(n: usize, why: &str) -> Vec<Result<String, QueueError>> {
    (0..n).map(|_| Err(unavailable(why))).collect()
}

fn send_flush(client: aws_sdk_sqs::Client, url: String) -> Flush<Send> {
    Arc::new(move |batch: Vec<Send>| {
        let (client, url) = (client.clone(), url.clone());
        Box::pin(async move {
            let n = batch.len();
            let entries: Result<Vec<_>, _> = batch
                .into_iter()
                .enumerate()
                .map(|(i, s)| s.entry(i))
                .collect();
            let entries = match entries {
                Ok(e) => e,
                Err(e) => return all_failed(n, &e.to_string()),
            };
            match client
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(o) => outcomes(
                    n,
                    o.successful()
                        .iter()
                        .map(|s| (s.id().to_owned(), s.message_id().to_owned())),
                    o.failed().iter().map(|f| {
                        let why = format!("{}: {}", f.code(), f.message().unwrap_or_default());
                        (f.id().to_owned(), f.sender_fault(), why)
                    }),
                    false,
                ),
                Err(e) => all_failed(n, &sdk("send", e).to_string()),
            }
        })
    })
}

fn delete_flush(client: aws_sdk_sqs::Client, url: String) -> Flush<String> {
    Arc::new(move |handles: Vec<String>| {
        let (client, url) = (client.clone(), url.clone());
        Box::pin(async move {
            let n = handles.len();
            let entries: Result<Vec<_>, _> = handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(h)
                        .build()
                })
                .collect();
            let entries = match entries {
                Ok(e) => e,
                Err(e) => return all_failed(n, &e.to_string()),
            };
            match client
                .delete_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(o) => outcomes(
                    n,
                    o.successful()
                        .iter()
                        .map(|s| (s.id().to_owned(), String::new())),
                    o.failed()
                        .iter()
                        .map(|f| (f.id().to_owned(), f.sender_fault(), f.code().to_owned())),
                    true,
                ),
                Err(e) => all_failed(n, &sdk("delete", e).to_string()),
            }
        })
    })
}

/// A claim's lease as this process keeps it.
struct Lease {
    handle: String,
    until: Instant,
}

/// The token of an SQS receipt.
struct Token {
    message_id: String,
    handle: String,
    meta: Meta,
    body: Bytes,
}

/// The SQS queue.
pub struct SqsQueue {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    client: aws_sdk_sqs::Client,
    names: Names,
    queue_url: String,
    dlq_url: String,
    config: SqsConfig,
    max_message_bytes: usize,
    redelivery_limit: Option<u32>,
    sends: Batcher<Send>,
    deletes: Batcher<String>,
    /// Live claims of this process: message id -> lease.
    outstanding: Mutex<HashMap<String, Lease>>,
    window: AtomicU32,
    /// Held (shared) by each claim's receives; a pause takes it to wait
    /// for the receives in flight.
    receiving: tokio::sync::RwLock<()>,
    ready: Mutex<Option<(Instant, Result<(), String>)>>,
}

impl std::fmt::Debug for SqsQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsQueue")
            .field("queue", &self.inner.names.queue)
            .finish()
    }
}

/// The redrive policy of a queue, as SQS keeps it (a JSON string).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RedrivePolicy {
    dead_letter_target_arn: String,
    #[serde(deserialize_with = "number_or_string")]
    max_receive_count: u32,
}

fn number_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        Number(u32),
        Text(String),
    }
    match N::deserialize(d)? {
        N::Number(n) => Ok(n),
        N::Text(s) => s.trim().parse().map_err(serde::de::Error::custom),
    }
}

impl SqsQueue {
    /// Opens the queue `name`: with [`OpenMode::Serve`] it and its DLQ are
    /// created if missing (the queue with a redrive policy into the DLQ);
    /// with [`OpenMode::Inspect`] they must exist.
    pub async fn open(
        endpoint: &Endpoint,
        name: &str,
        config: &SqsConfig,
        mode: OpenMode,
    ) -> Result<Self, QueueError> {
        let client = endpoint.client().await;
        let names = Names::of(name, config.dlq_name.as_deref());
        let where_ = endpoint.url.as_deref().unwrap_or("AWS");
        let dlq_url = match (queue_url(&client, &names.dlq).await?, mode) {
            (Some(url), _) => url,
            (None, OpenMode::Inspect) => {
                return Err(QueueError::Missing {
                    location: format!("SQS queue {} at {where_}", names.dlq),
                });
            }
            (None, OpenMode::Serve) => create(&client, &names.dlq, names.fifo, None).await?,
        };
        let dlq_arn = attribute(&client, &dlq_url, QueueAttributeName::QueueArn).await?;
        let queue_url = match (queue_url(&client, &names.queue).await?, mode) {
            (Some(url), _) => url,
            (None, OpenMode::Inspect) => {
                return Err(QueueError::Missing {
                    location: format!("SQS queue {} at {where_}", names.queue),
                });
            }
            (None, OpenMode::Serve) => {
                let policy = serde_json::json!({
                    "deadLetterTargetArn": dlq_arn.clone().unwrap_or_default(),
                    "maxReceiveCount": config.max_receive_count.to_string(),
                });
                create(&client, &names.queue, names.fifo, Some(policy.to_string())).await?
            }
        };
        let attributes = client
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .attribute_names(QueueAttributeName::MaximumMessageSize)
            .send()
            .await
            .map_err(|e| sdk("get queue attributes", e))?;
        let attrs = attributes.attributes();
        let max_message_bytes = attrs
            .and_then(|a| a.get(&QueueAttributeName::MaximumMessageSize))
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MAX_MESSAGE);
        let policy: Option<RedrivePolicy> = attrs
            .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
            .and_then(|p| serde_json::from_str(p).ok());
        if let Some(p) = &policy
            && dlq_arn.as_deref() != Some(p.dead_letter_target_arn.as_str())
        {
            tracing::warn!(
                queue = %names.queue,
                redrive_target = %p.dead_letter_target_arn,
                dlq = %names.dlq,
                "the queue's redrive policy moves messages to another queue than Breakwater's \
                 DLQ: what SQS moves there is not seen by `breakwater dlq`"
            );
        }
        let sends = Batcher::spawn(
            send_flush(client.clone(), queue_url.clone()),
            config.batches_in_flight,
            max_message_bytes,
            WAITING_CALLS,
            Duration::ZERO,
        );
        let deletes = Batcher::spawn(
            delete_flush(client.clone(), queue_url.clone()),
            config.batches_in_flight,
            usize::MAX,
            WAITING_CALLS,
            DELETE_LINGER,
        );
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                names,
                queue_url,
                dlq_url,
                config: config.clone(),
                max_message_bytes,
                redelivery_limit: policy.map(|p| p.max_receive_count),
                sends,
                deletes,
                outstanding: Mutex::new(HashMap::new()),
                window: AtomicU32::new(u32::MAX),
                receiving: tokio::sync::RwLock::new(()),
                ready: Mutex::new(None),
            }),
        })
    }

    /// Deletes the queue `name` and its DLQ (for tests and the lab, which
    /// make their own).
    pub async fn destroy(
        endpoint: &Endpoint,
        name: &str,
        config: &SqsConfig,
    ) -> Result<(), QueueError> {
        let client = endpoint.client().await;
        let names = Names::of(name, config.dlq_name.as_deref());
        for queue in [&names.queue, &names.dlq] {
            if let Some(url) = queue_url(&client, queue).await? {
                client
                    .delete_queue()
                    .queue_url(url)
                    .send()
                    .await
                    .map_err(|e| sdk("delete queue", e))?;
            }
        }
        Ok(())
    }

    /// [`SqsQueue::destroy`] from code that is not async (a test's `Drop`):
    /// on a thread and a runtime of its own; errors are ignored.
    pub fn destroy_blocking(endpoint: &Endpoint, name: &str) {
        let (endpoint, name) = (endpoint.clone(), name.to_owned());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(Self::destroy(&endpoint, &name, &SqsConfig::default()));
            }
        })
        .join();
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.inner.queue_url
    }
}

/// The URL of `name`, `None` when there is no such queue.
async fn queue_url(client: &aws_sdk_sqs::Client, name: &str) -> Result<Option<String>, QueueError> {
    match client.get_queue_url().queue_name(name).send().await {
        Ok(o) => Ok(o.queue_url().map(str::to_owned)),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_queue_does_not_exist()) =>
        {
            Ok(None)
        }
        Err(e) => Err(sdk(&format!("get the URL of {name}"), e)),
    }
}

async fn create(
    client: &aws_sdk_sqs::Client,
    name: &str,
    fifo: bool,
    redrive: Option<String>,
) -> Result<String, QueueError> {
    let mut call = client.create_queue().queue_name(name);
    if fifo {
        call = call.attributes(QueueAttributeName::FifoQueue, "true");
    }
    if let Some(policy) = redrive {
        call = call.attributes(QueueAttributeName::RedrivePolicy, policy);
    }
    let made = call
        .send()
        .await
        .map_err(|e| sdk(&format!("create queue {name}"), e))?;
    made.queue_url()
        .map(str::to_owned)
        .ok_or_else(|| unavailable(format!("SQS made {name} but gave no URL")))
}

async fn attribute(
    client: &aws_sdk_sqs::Client,
    url: &str,
    name: QueueAttributeName,
) -> Result<Option<String>, QueueError> {
    let o = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(name.clone())
        .send()
        .await
        .map_err(|e| sdk("get queue attributes", e))?;
    Ok(o.attributes().and_then(|a| a.get(&name)).cloned())
}

/// A message SQS handed over, read.
pub(crate) struct Received {
    pub(crate) message_id: String,
    pub(crate) handle: String,
    pub(crate) receives: u32,
    /// The metadata and body, or why they cannot be read.
    pub(crate) decoded: Result<(Meta, Bytes), wire::Foreign>,
    pub(crate) not_before_ms: Option<i64>,
    /// The SQS body as it came, kept only for a message that is not
    /// Breakwater's (empty otherwise).
    pub(crate) raw_body: String,
    pub(crate) sent_at_ms: Option<i64>,
}

impl Received {
    fn read(m: &aws_sdk_sqs::types::Message) -> Option<Self> {
        let attrs = m.message_attributes();
        let string = |name: &str| {
            attrs
                .and_then(|a| a.get(name))
                .and_then(|v| v.string_value())
        };
        let system = |name: MessageSystemAttributeName| {
            m.attributes()
                .and_then(|a| a.get(&name))
                .map(String::as_str)
        };
        let incoming = Incoming {
            body: m.body().unwrap_or_default(),
            meta: attrs
                .and_then(|a| a.get(wire::META))
                .and_then(|v| v.binary_value())
                .map(Blob::as_ref),
            body_encoding: string(wire::BODY_ENCODING),
            not_before: string(wire::NOT_BEFORE),
        };
        let decoded = incoming.decode();
        let raw_body = if decoded.is_err() {
            incoming.body.to_owned()
        } else {
            String::new()
        };
        Some(Self {
            message_id: m.message_id()?.to_owned(),
            handle: m.receipt_handle()?.to_owned(),
            receives: system(MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
            decoded,
            not_before_ms: incoming.not_before_ms(),
            raw_body,
            sent_at_ms: system(MessageSystemAttributeName::SentTimestamp)
                .and_then(|v| v.parse().ok()),
        })
    }
}

impl Inner {
    /// One receive of at most `max` (≤ 10), each held for `visibility`
    /// seconds, waiting up to `wait` seconds for the first.
    pub(crate) async fn receive(
        &self,
        url: &str,
        max: usize,
        visibility: i32,
        wait: u32,
    ) -> Result<Vec<Received>, QueueError> {
        let wait = wait.min(20);
        let timeout = Duration::from_secs(u64::from(wait))
            + Duration::from_millis(self.config.request_timeout_ms.max(1));
        let o = self
            .client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(i32::try_from(max.clamp(1, 10)).unwrap_or(10))
            .visibility_timeout(visibility)
            .wait_time_seconds(i32::try_from(wait).unwrap_or(20))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_attribute_names("All")
            .customize()
            .config_override(
                aws_sdk_sqs::config::Builder::default().timeout_config(
                    aws_config::timeout::TimeoutConfig::builder()
                        .operation_attempt_timeout(timeout)
                        .build(),
                ),
            )
            .send()
            .await
            .map_err(|e| sdk("receive", e))?;
        Ok(o.messages().iter().filter_map(Received::read).collect())
    }

    /// Makes the messages behind `handles` visible after `secs` (0: now).
    /// Returns how many SQS took.
    pub(crate) async fn change_visibility(
        &self,
        url: &str,
        handles: &[&str],
        secs: i32,
    ) -> Result<Vec<bool>, QueueError> {
        let mut took = Vec::with_capacity(handles.len());
        for chunk in handles.chunks(batcher::MAX_ENTRIES) {
            let entries: Result<Vec<_>, _> = chunk
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(*h)
                        .visibility_timeout(secs)
                        .build()
                })
                .collect();
            let o = self
                .client
                .change_message_visibility_batch()
                .queue_url(url)
                .set_entries(Some(entries.map_err(unavailable)?))
                .send()
                .await
                .map_err(|e| sdk("change visibility", e))?;
            let mut ok = vec![false; chunk.len()];
            for s in o.successful() {
                if let Some(slot) = s.id().parse::<usize>().ok().and_then(|i| ok.get_mut(i)) {
                    *slot = true;
                }
            }
            took.extend(ok);
        }
        Ok(took)
    }

    /// Sends `meta` and `body` to the queue at `url` (the DLQ, or a copy to
    /// the queue itself), directly.
    pub(crate) async fn send_to(&self, url: &str, send: Send) -> Result<String, QueueError> {
        let entry = send.entry(0)?;
        let mut call = self
            .client
            .send_message()
            .queue_url(url)
            .message_body(entry.message_body())
            .set_message_attributes(entry.message_attributes().cloned());
        if let Some(d) = entry.delay_seconds() {
            call = call.delay_seconds(d);
        }
        if let Some(g) = entry.message_group_id() {
            call = call.message_group_id(g);
        }
        if let Some(d) = entry.message_deduplication_id() {
            call = call.message_deduplication_id(d);
        }
        let o = call.send().await.map_err(|e| sdk("send", e))?;
        Ok(o.message_id().unwrap_or_default().to_owned())
    }

    /// Deletes one message of the queue at `url` directly (the DLQ's).
    pub(crate) async fn delete_from(&self, url: &str, handle: &str) -> Result<(), QueueError> {
        self.client
            .delete_message()
            .queue_url(url)
            .receipt_handle(handle)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk("delete", e))
    }

    /// How a message goes to the queue (or its DLQ, same kind): on FIFO,
    /// its group and a deduplication id with `dedup_suffix`.
    fn send_of(&self, meta: &Meta, body: &[u8], delay: Duration, dedup_suffix: &str) -> Send {
        let (delay_secs, not_before_ms) = if delay.is_zero() {
            (0, None)
        } else if self.names.fifo || delay > MAX_DELAY {
            let until =
                now_ms().saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
            // SQS holds it as long as it can, the rest at receive.
            let secs = if self.names.fifo {
                0
            } else {
                secs_up(MAX_DELAY, 900)
            };
            (secs, Some(until))
        } else {
            (secs_up(delay, 900), None)
        };
        let fifo = self.names.fifo;
        Send {
            out: Outgoing::new(meta, body, not_before_ms),
            delay_secs,
            group: fifo
                .then(|| names::group_id(meta.entity_key.as_deref(), &meta.source, &meta.event_id)),
            dedup: fifo.then(|| names::dedup_id(&meta.source, &meta.event_id, dedup_suffix)),
        }
    }
}

impl SqsQueue {
    fn token<'r>(&self, receipt: &'r Receipt) -> Result<&'r Token, QueueError> {
        receipt.token::<Token>().ok_or(QueueError::ForeignReceipt)
    }

    fn outstanding(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        self.inner
            .outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends this process's hold on a live claim: refused for a claim
    /// already settled, received again since, or whose lease ran out.
    fn settle(&self, token: &Token) -> Result<(), QueueError> {
        let mut live = self.outstanding();
        match live.get(&token.message_id) {
            Some(l) if l.handle == token.handle && l.until > Instant::now() => {
                live.remove(&token.message_id);
                Ok(())
            }
            _ => Err(QueueError::LeaseLost {
                id: token.message_id.clone(),
            }),
        }
    }

    async fn delete(&self, token: &Token) -> Result<(), QueueError> {
        match self.inner.deletes.submit(token.handle.clone(), 0).await {
            Ok(_) => Ok(()),
            Err(QueueError::LeaseLost { .. }) => Err(QueueError::LeaseLost {
                id: token.message_id.clone(),
            }),
            Err(e) => Err(e),
        }
    }

    /// A message Breakwater cannot read goes to the DLQ as it came, with
    /// the reason, rather than coming back for ever.
    async fn dead_letter_foreign(&self, r: &Received, why: &wire::Foreign) {
        let meta = Meta {
            source: String::new(),
            event_id: r.message_id.clone(),
            entity_key: None,
            headers: Vec::new(),
            received_at_ms: r.sent_at_ms.unwrap_or_default(),
            replays: 0,
            attempts: 0,
            class: Some("permanent".into()),
            error: Some(why.to_string()),
            dead_at_ms: Some(now_ms()),
        };
        let send = self
            .inner
            .send_of(&meta, r.raw_body.as_bytes(), Duration::ZERO, "-foreign");
        let sent = self.inner.send_to(&self.inner.dlq_url, send).await;
        match sent {
            Ok(_) => {
                let _ = self.inner.deletes.submit(r.handle.clone(), 0).await;
                tracing::warn!(id = %r.message_id, error = %why, "a message Breakwater cannot read; dead-lettered");
            }
            Err(e) => {
                tracing::warn!(id = %r.message_id, error = %e, "a message Breakwater cannot read could not be dead-lettered")
            }
        }
    }
}

/// The stats this backend fills in (approximate, as SQS counts them).
const STATS: &[StatKind] = &[
    StatKind::Visible,
    StatKind::InFlight,
    StatKind::Delayed,
    StatKind::DeadLettered,
];
/// On a FIFO queue a retry is held back at receive, not delayed by SQS:
/// it counts as visible until then, and nothing counts as delayed.
const FIFO_STATS: &[StatKind] = &[StatKind::InFlight, StatKind::DeadLettered];

#[async_trait]
impl Queue for SqsQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_delay: true,
            // A FIFO queue drops a duplicate send silently (5 minutes),
            // without saying it was one.
            native_dedup: false,
            counts_attempts: false,
            counts_receives: true,
            filters_keys: false,
            push: false,
            stats: if self.inner.names.fifo {
                FIFO_STATS
            } else {
                STATS
            },
        }
    }

    fn redelivery_limit(&self) -> Option<u32> {
        self.inner.redelivery_limit
    }

    async fn enqueue(&self, mut message: NewMessage) -> Result<Enqueued, QueueError> {
        let meta = Meta::of(&mut message);
        let send = self.inner.send_of(&meta, &message.body, Duration::ZERO, "");
        let bytes = send.out.size();
        if bytes > self.inner.max_message_bytes {
            return Err(QueueError::TooLarge {
                bytes,
                max: self.inner.max_message_bytes,
            });
        }
        let id = self.inner.sends.submit(send, bytes).await?;
        Ok(Enqueued::New { id })
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Delivery>, QueueError> {
        let inner = &self.inner;
        let max = max.min(inner.window.load(Ordering::Acquire) as usize);
        if max == 0 {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        // Held until what the receives took is delivered or handed back,
        // so a pause returns only after both.
        let receiving = inner.receiving.read().await;
        let received = {
            // Paused while this claim waited for the lock: no receive.
            if inner.window.load(Ordering::Acquire) == 0 {
                return Ok(Vec::new());
            }
            let visibility = secs_up(lease, MAX_VISIBILITY_SECS).max(1);
            let sizes = receive_sizes(max, inner.config.receive_concurrency);
            // Long-poll only while this process holds no claim: a worker
            // with messages applying or held behind their key must come
            // back to them (a hot key's next message, a lease to extend)
            // rather than wait in a poll.
            let wait = if self.outstanding().is_empty() {
                inner.config.wait_time_secs
            } else {
                0
            };
            let results = join_all(
                sizes
                    .iter()
                    .map(|n| inner.receive(&inner.queue_url, *n, visibility, wait)),
            )
            .await;
            let mut received = Vec::new();
            let mut failure = None;
            for r in results {
                match r {
                    Ok(batch) => received.extend(batch),
                    Err(e) => failure = Some(e),
                }
            }
            if received.is_empty()
                && let Some(e) = failure
            {
                return Err(e);
            }
            received
        };
        // Paused while the receives were under way: hand back, untried.
        if inner.window.load(Ordering::Acquire) == 0 {
            let handles: Vec<&str> = received.iter().map(|r| r.handle.as_str()).collect();
            if let Err(e) = inner.change_visibility(&inner.queue_url, &handles, 0).await {
                tracing::warn!(error = %e, "messages received as the breaker opened stay held until their lease ends");
            }
            return Ok(Vec::new());
        }
        let until = started + lease;
        let now = now_ms();
        let mut out = Vec::with_capacity(received.len());
        let mut early = Vec::new();
        let mut taken = Vec::with_capacity(received.len());
        for r in received {
            if let Some(at) = r.not_before_ms.filter(|at| *at > now) {
                let wait = Duration::from_millis(u64::try_from(at - now).unwrap_or(0));
                early.push((r.handle, secs_up(wait, MAX_VISIBILITY_SECS)));
                continue;
            }
            match r.decoded {
                Ok((meta, body)) => taken.push((r.message_id, r.handle, r.receives, meta, body)),
                Err(ref why) => self.dead_letter_foreign(&r, why).await,
            }
        }
        {
            let mut outstanding = self.outstanding();
            for (message_id, handle, _, _, _) in &taken {
                outstanding.insert(
                    message_id.clone(),
                    Lease {
                        handle: handle.clone(),
                        until,
                    },
                );
            }
        }
        for (message_id, handle, receives, meta, body) in taken {
            out.push(Delivery {
                message: Message {
                    id: message_id.clone(),
                    source: meta.source.clone(),
                    event_id: meta.event_id.clone(),
                    entity_key: meta.entity_key.clone(),
                    headers: meta.headers.clone(),
                    body: body.clone(),
                    received_at_ms: meta.received_at_ms,
                    attempts: meta.attempts,
                    receives,
                },
                receipt: Receipt::new(Token {
                    message_id,
                    handle,
                    meta,
                    body,
                }),
            });
        }
        for (handle, secs) in early {
            // Held back: out of sight until its time (it comes back if
            // this fails, and is held back again).
            if let Err(e) = inner
                .change_visibility(&inner.queue_url, &[&handle], secs)
                .await
            {
                tracing::debug!(error = %e, "a held-back retry is visible again early");
            }
        }
        drop(receiving);
        Ok(out)
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        self.delete(token).await
    }

    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let now = Instant::now();
        let live: Vec<&Token> = {
            let outstanding = self.outstanding();
            receipts
                .iter()
                .filter_map(|r| r.token::<Token>())
                .filter(|t| {
                    outstanding
                        .get(&t.message_id)
                        .is_some_and(|l| l.handle == t.handle && l.until > now)
                })
                .collect()
        };
        if live.is_empty() {
            return Ok(0);
        }
        let handles: Vec<&str> = live.iter().map(|t| t.handle.as_str()).collect();
        let took = self
            .inner
            .change_visibility(
                &self.inner.queue_url,
                &handles,
                secs_up(lease, MAX_VISIBILITY_SECS).max(1),
            )
            .await?;
        let mut outstanding = self.outstanding();
        let mut extended = 0;
        for (token, ok) in live.iter().zip(took) {
            if let Some(l) = outstanding.get_mut(&token.message_id).filter(|_| ok) {
                l.until = now + lease;
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
        let mut meta = token.meta.clone();
        meta.attempts += 1;
        let suffix = format!("-a{}-r{}", meta.attempts, meta.replays);
        let copy = self.inner.send_of(&meta, &token.body, delay, &suffix);
        // The copy first: a crash between the two leaves two, never none.
        let bytes = copy.out.size();
        self.inner.sends.submit(copy, bytes).await?;
        self.delete(token).await
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        let took = self
            .inner
            .change_visibility(
                &self.inner.queue_url,
                &[&token.handle],
                secs_up(delay, MAX_VISIBILITY_SECS),
            )
            .await?;
        if took.first() == Some(&true) {
            Ok(())
        } else {
            Err(QueueError::LeaseLost {
                id: token.message_id.clone(),
            })
        }
    }

    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError> {
        let token = self.token(receipt)?;
        self.settle(token)?;
        let mut meta = token.meta.clone();
        meta.class = Some(reason.class.clone());
        meta.error = Some(reason.error.clone());
        let dead_at = now_ms();
        meta.dead_at_ms = Some(dead_at);
        let send = self.inner.send_of(
            &meta,
            &token.body,
            Duration::ZERO,
            &format!("-dead-{dead_at}"),
        );
        // In the DLQ before it leaves the queue: a crash between the two
        // leaves a copy in each, never in neither.
        self.inner.send_to(&self.inner.dlq_url, send).await?;
        self.delete(token).await
    }

    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError> {
        self.inner.window.store(flow.window(), Ordering::Release);
        if flow == Flow::Paused {
            // Returns once no receive is under way: none starts after.
            drop(self.inner.receiving.write().await);
        }
        Ok(())
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        let count = |attrs: Option<&HashMap<QueueAttributeName, String>>, name| {
            attrs
                .and_then(|a| a.get(&name))
                .and_then(|v| v.parse::<u64>().ok())
        };
        let get = |url: String| {
            self.inner
                .client
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
                .send()
        };
        let (main, dlq) = futures_util::join!(
            get(self.inner.queue_url.clone()),
            get(self.inner.dlq_url.clone())
        );
        let main = main.map_err(|e| sdk("get queue attributes", e))?;
        let dlq = dlq.map_err(|e| sdk("get queue attributes", e))?;
        let (m, d) = (main.attributes(), dlq.attributes());
        let dead = [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ]
        .into_iter()
        .map(|n| count(d, n).unwrap_or(0))
        .sum();
        Ok(QueueStats {
            visible: count(m, QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: count(m, QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            delayed: count(m, QueueAttributeName::ApproximateNumberOfMessagesDelayed),
            dead_lettered: Some(dead),
            ..QueueStats::default()
        })
    }

    async fn ready(&self) -> Result<(), QueueError> {
        if let Some((at, answer)) = self
            .inner
            .ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            && at.elapsed() < READY_FOR
        {
            return answer.clone().map_err(QueueError::Unavailable);
        }
        let answer = attribute(
            &self.inner.client,
            &self.inner.queue_url,
            QueueAttributeName::QueueArn,
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
        *self
            .inner
            .ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), answer.clone()));
        answer.map_err(QueueError::Unavailable)
    }

    async fn dlq_list(&self, page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
        let scan = dlq::Scan::read(&self.inner).await?;
        let out = scan.page(page);
        scan.hand_back(&self.inner).await;
        Ok(out)
    }

    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError> {
        let scan = dlq::Scan::read(&self.inner).await?;
        let found = scan.show(id);
        scan.hand_back(&self.inner).await;
        found.ok_or_else(|| QueueError::NotFound { id: id.to_owned() })
    }

    async fn dlq_replay(
        &self,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let mut scan = dlq::Scan::read(&self.inner).await?;
        let done = scan.replay(&self.inner, ids, max_replays, limit).await;
        scan.hand_back(&self.inner).await;
        done
    }

    async fn dlq_purge(&self, ids: &[String]) -> Result<usize, QueueError> {
        let mut purged = 0;
        loop {
            let mut scan = dlq::Scan::read(&self.inner).await?;
            let n = scan.purge(&self.inner, ids).await;
            let more = ids.is_empty() && scan.was_full();
            scan.hand_back(&self.inner).await;
            purged += n?;
            if !more {
                return Ok(purged);
            }
        }
    }
}

/// Builds the SQS queue from `[queue]`: `backend = "sqs"`, `url` (the
/// endpoint; unset: AWS's for the region), `name`, `lease_ms`, and the
/// keys of [`SqsConfig`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SqsBackend;

impl SqsBackend {
    fn config(section: &QueueSection) -> Result<(Endpoint, String, SqsConfig), ConfigProblem> {
        let config: SqsConfig = section.own()?;
        // The characters and length; `names::problem` adds where `.fifo` may
        // stand.
        let name = section.required_name("-_.", Some(names::MAX_NAME))?;
        if let Some(problem) = names::problem(name) {
            return Err(ConfigProblem::key("name", problem));
        }
        let derived = Names::of(name, config.dlq_name.as_deref());
        if let Some(problem) = names::problem(&derived.dlq) {
            let key = if config.dlq_name.is_some() {
                "dlq_name"
            } else {
                "name"
            };
            return Err(ConfigProblem::key(
                key,
                format!("the DLQ's name {:?} {problem}", derived.dlq),
            ));
        }
        if derived.fifo != derived.dlq.ends_with(".fifo") {
            return Err(ConfigProblem::key(
                "dlq_name",
                "a FIFO queue's DLQ is a FIFO queue (ending in \".fifo\"), and a standard \
                 queue's is not",
            ));
        }
        if config.wait_time_secs > 20 {
            return Err(ConfigProblem::key(
                "wait_time_secs",
                "must be 0 to 20 (SQS's limit)",
            ));
        }
        if !(1..=1000).contains(&config.max_receive_count) {
            return Err(ConfigProblem::key(
                "max_receive_count",
                "must be 1 to 1000 (SQS's limit)",
            ));
        }
        for (key, value) in [
            ("receive_concurrency", config.receive_concurrency),
            ("batches_in_flight", config.batches_in_flight),
            ("dlq_scan_max", config.dlq_scan_max),
        ] {
            if value == 0 {
                return Err(ConfigProblem::key(key, "must be at least 1"));
            }
        }
        let endpoint = Endpoint {
            url: section.url.clone(),
            region: config.region.clone(),
            request_timeout: Duration::from_millis(config.request_timeout_ms.max(1)),
        };
        Ok((endpoint, name.to_owned(), config))
    }
}

#[async_trait]
impl Backend for SqsBackend {
    fn name(&self) -> &'static str {
        "sqs"
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
        let (endpoint, name, config) =
            Self::config(section).map_err(|e| QueueError::Storage(e.to_string()))?;
        Ok(Arc::new(
            SqsQueue::open(&endpoint, &name, &config, mode).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(extra: &str) -> QueueSection {
        toml::from_str(&format!("backend = \"sqs\"\nname = \"orders\"\n{extra}")).expect("toml")
    }

    #[test]
    fn the_config_names_what_is_wrong() {
        assert!(SqsBackend.check(&section("")).is_ok());
        for (extra, key) in [
            ("wait_time_secs = 21", "wait_time_secs"),
            ("max_receive_count = 0", "max_receive_count"),
            ("receive_concurrency = 0", "receive_concurrency"),
            ("dlq_name = \"dead.fifo\"", "dlq_name"),
            ("waittime = 1", "waittime"),
        ] {
            let e = SqsBackend.check(&section(extra)).expect_err(extra);
            assert_eq!(e.key.as_deref(), Some(key), "{extra}: {e}");
        }
        let long: QueueSection = toml::from_str(&format!(
            "backend = \"sqs\"\nname = \"{}\"\n",
            "a".repeat(78)
        ))
        .expect("toml");
        let e = SqsBackend
            .check(&long)
            .expect_err("the DLQ's name is too long");
        assert_eq!(e.key.as_deref(), Some("name"));
    }

    #[test]
    fn seconds_round_up_so_nothing_comes_back_early() {
        assert_eq!(secs_up(Duration::ZERO, 900), 0);
        assert_eq!(secs_up(Duration::from_millis(1), 900), 1);
        assert_eq!(secs_up(Duration::from_millis(1500), 900), 2);
        assert_eq!(secs_up(Duration::from_secs(5000), 900), 900);
    }

    #[test]
    fn a_claim_never_asks_for_more_than_its_window() {
        for max in 1..=60 {
            let sizes = receive_sizes(max, 4);
            assert!(
                sizes.iter().all(|n| (1..=10).contains(n)),
                "{max}: {sizes:?}"
            );
            assert_eq!(sizes.iter().sum::<usize>(), max.min(40), "{max}: {sizes:?}");
        }
    }

    #[test]
    fn batch_outcomes_land_on_their_entries() {
        let got = outcomes(
            3,
            [
                ("2".to_owned(), "m2".to_owned()),
                ("0".to_owned(), "m0".to_owned()),
            ]
            .into_iter(),
            [("1".to_owned(), true, "ReceiptHandleIsInvalid".to_owned())].into_iter(),
            true,
        );
        assert_eq!(got[0].as_deref().ok(), Some("m0"));
        assert!(matches!(got[1], Err(QueueError::LeaseLost { .. })));
        assert_eq!(got[2].as_deref().ok(), Some("m2"));
    }
}
