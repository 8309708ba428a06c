//! The `dlq` commands on an SQS queue. SQS cannot address one message in a
//! queue or read one without receiving it, so a [`Scan`] receives the
//! DLQ's messages (at most `dlq_scan_max`, each held invisible for
//! [`SCAN_HOLD`]), settles the ones a command chose (replayed: sent back
//! to the queue, then deleted; purged: deleted), and hands the rest back
//! at once. Ids sort by the time a message died (`<dead_at_ms>-<SQS
//! message id>`), so a listing is oldest first whatever order SQS hands
//! them over in, and paging after an id works even once it is gone.
//!
//! Two scans at once (two operators) each see what the other does not
//! hold. A message SQS moved there itself (the redrive policy) shows with
//! class `redrive`.

use std::time::Duration;

use bytes::Bytes;

use breakwater_queue::envelope::Meta;
use breakwater_queue::{DeadLetter, DlqPage, QueueError};

use crate::{Inner, Received};

/// How long a scan holds what it received before SQS shows it again, should
/// the command die before handing it back.
const SCAN_HOLD: i32 = 60;

struct Entry {
    /// Its id is `record.id`.
    record: DeadLetter,
    meta: Option<Meta>,
    body: Bytes,
    handle: String,
}

impl Entry {
    fn of(r: Received) -> Self {
        let (meta, body) = match r.decoded {
            Ok((meta, body)) => (Some(meta), body),
            Err(_) => (None, Bytes::from(r.raw_body)),
        };
        let record = match &meta {
            Some(m) => DeadLetter {
                id: String::new(),
                source: m.source.clone(),
                event_id: m.event_id.clone(),
                entity_key: m.entity_key.clone(),
                attempts: m.attempts,
                replays: m.replays,
                class: m.class.clone().unwrap_or_else(|| "redrive".into()),
                error: m.error.clone().unwrap_or_else(|| {
                    "moved by the queue's redrive policy (maxReceiveCount): received too \
                     often without being settled"
                        .into()
                }),
                received_at_ms: m.received_at_ms,
                dead_at_ms: m.dead_at_ms.or(r.sent_at_ms).unwrap_or_default(),
                body: None,
            },
            None => DeadLetter {
                id: String::new(),
                source: String::new(),
                event_id: r.message_id.clone(),
                entity_key: None,
                attempts: 0,
                replays: 0,
                class: "unreadable".into(),
                error: "not a Breakwater message".into(),
                received_at_ms: r.sent_at_ms.unwrap_or_default(),
                dead_at_ms: r.sent_at_ms.unwrap_or_default(),
                body: None,
            },
        };
        let id = format!("{:013}-{}", record.dead_at_ms.max(0), r.message_id);
        Self {
            record: DeadLetter { id, ..record },
            meta,
            body,
            handle: r.handle,
        }
    }

    fn record(&self, with_body: bool) -> DeadLetter {
        DeadLetter {
            body: with_body.then(|| String::from_utf8_lossy(&self.body).into_owned()),
            ..self.record.clone()
        }
    }
}

/// The DLQ's messages, received and not settled.
pub(crate) struct Scan {
    entries: Vec<Entry>,
    /// The scan stopped at `dlq_scan_max`: there may be more.
    full: bool,
}

impl Scan {
    /// Receives up to `dlq_scan_max` dead letters, sorted by id.
    pub(crate) async fn read(inner: &Inner) -> Result<Self, QueueError> {
        let expected = approximate_count(inner).await?;
        let max = inner.config.dlq_scan_max;
        let mut entries = Vec::new();
        loop {
            let want = (max - entries.len()).min(crate::batcher::MAX_ENTRIES);
            if want == 0 {
                break;
            }
            // Long-poll only while SQS's count says more are there: a
            // short poll on real SQS may miss some, a long one waits.
            let wait = u32::from(entries.len() < expected);
            let got = inner.receive(&inner.dlq_url, want, SCAN_HOLD, wait).await;
            let got = match got {
                Ok(got) => got,
                Err(e) => {
                    let scan = Self {
                        entries,
                        full: false,
                    };
                    scan.hand_back(inner).await;
                    return Err(e);
                }
            };
            if got.is_empty() {
                break;
            }
            entries.extend(got.into_iter().map(Entry::of));
        }
        entries.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        entries.dedup_by(|a, b| a.record.id == b.record.id);
        let full = entries.len() >= max;
        Ok(Self { entries, full })
    }

    pub(crate) fn was_full(&self) -> bool {
        self.full
    }

    pub(crate) fn page(&self, page: &DlqPage) -> Vec<DeadLetter> {
        self.entries
            .iter()
            .filter(|e| {
                page.after
                    .as_deref()
                    .is_none_or(|after| e.record.id.as_str() > after)
            })
            .take(page.limit)
            .map(|e| e.record(false))
            .collect()
    }

    pub(crate) fn show(&self, id: &str) -> Option<DeadLetter> {
        self.entries
            .iter()
            .find(|e| e.record.id == id)
            .map(|e| e.record(true))
    }

    /// Sends the chosen ones (all when `ids` is empty, at most `limit`)
    /// back to the queue with their attempts reset, then deletes them here.
    pub(crate) async fn replay(
        &mut self,
        inner: &Inner,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let mut done = Vec::new();
        let mut kept = Vec::new();
        let mut failure = None;
        for entry in std::mem::take(&mut self.entries) {
            let chosen = ids.is_empty() || ids.contains(&entry.record.id);
            let meta = match (
                &entry.meta,
                chosen && done.len() < limit && failure.is_none(),
            ) {
                (Some(meta), true) if meta.replays < max_replays => meta.clone(),
                _ => {
                    kept.push(entry);
                    continue;
                }
            };
            let mut meta = meta;
            meta.replays += 1;
            meta.attempts = 0;
            meta.class = None;
            meta.error = None;
            meta.dead_at_ms = None;
            let suffix = format!("-r{}", meta.replays);
            let send = inner.send_of(&meta, &entry.body, Duration::ZERO, &suffix);
            let sent = match inner.send_to(&inner.queue_url, send).await {
                Ok(_) => inner.delete_from(&inner.dlq_url, &entry.handle).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(()) => done.push(entry.record.id),
                Err(e) => {
                    failure = Some(e);
                    kept.push(entry);
                }
            }
        }
        self.entries = kept;
        match failure {
            Some(e) if done.is_empty() => Err(e),
            _ => Ok(done),
        }
    }

    /// Deletes the chosen ones (all when `ids` is empty).
    pub(crate) async fn purge(
        &mut self,
        inner: &Inner,
        ids: &[String],
    ) -> Result<usize, QueueError> {
        let mut n = 0;
        let mut kept = Vec::new();
        let mut failure = None;
        for entry in std::mem::take(&mut self.entries) {
            if failure.is_none() && (ids.is_empty() || ids.contains(&entry.record.id)) {
                match inner.delete_from(&inner.dlq_url, &entry.handle).await {
                    Ok(()) => {
                        n += 1;
                        continue;
                    }
                    Err(e) => failure = Some(e),
                }
            }
            kept.push(entry);
        }
        self.entries = kept;
        match failure {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Makes what the scan holds and did not settle visible again.
    pub(crate) async fn hand_back(self, inner: &Inner) {
        let handles: Vec<&str> = self.entries.iter().map(|e| e.handle.as_str()).collect();
        if handles.is_empty() {
            return;
        }
        if let Err(e) = inner.change_visibility(&inner.dlq_url, &handles, 0).await {
            tracing::warn!(error = %e, "dead letters read by a dlq command stay hidden until their hold ends");
        }
    }
}

/// All the DLQ holds, as SQS counts it (approximately).
async fn approximate_count(inner: &Inner) -> Result<usize, QueueError> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let o = inner
        .client
        .get_queue_attributes()
        .queue_url(&inner.dlq_url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .map_err(|e| crate::sdk("get queue attributes", e))?;
    Ok([
        A::ApproximateNumberOfMessages,
        A::ApproximateNumberOfMessagesNotVisible,
    ]
    .iter()
    .filter_map(|n| o.attributes().and_then(|a| a.get(n)))
    .filter_map(|v| v.parse::<usize>().ok())
    .sum())
}
