//! The `dlq` commands on a RabbitMQ queue. RabbitMQ cannot address one
//! message in a queue or read one without taking it, so a [`Scan`] takes
//! the DLQ's messages (`basic.get`, unacknowledged, at most
//! `dlq_scan_max`) on a channel of its own, settles the ones a command
//! chose (replayed, purged), and hands the rest back by closing the
//! channel: the broker requeues what a closed channel had not settled.
//! Dead letters carry ids that sort by the time they died, so a listing is
//! oldest first whatever order the broker hands them back in.

use bytes::Bytes;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::{Acker, Channel};
use rand::Rng;

use breakwater_queue::envelope::{Meta, decode, encode};
use breakwater_queue::{DeadLetter, DlqPage, QueueError};

use crate::properties::{self, Counts};
use crate::{Inner, new_id, unavailable};

/// The id of a dead letter that died at `dead_at_ms`: sortable by time.
pub(crate) fn dead_letter_id(dead_at_ms: i64) -> String {
    format!(
        "{:013}-{:08x}",
        dead_at_ms.max(0),
        rand::rng().random::<u32>()
    )
}

struct Entry {
    id: String,
    /// `None` for a message that is not an envelope (put there by hand).
    meta: Option<Meta>,
    body: Bytes,
    acker: Acker,
}

impl Entry {
    fn record(&self, with_body: bool) -> DeadLetter {
        let body = with_body.then(|| String::from_utf8_lossy(&self.body).into_owned());
        match &self.meta {
            Some(m) => m.dead_letter(self.id.clone(), body),
            None => DeadLetter {
                id: self.id.clone(),
                source: String::new(),
                event_id: String::new(),
                entity_key: None,
                attempts: 0,
                replays: 0,
                class: "unreadable".into(),
                error: "not a Breakwater message".into(),
                received_at_ms: 0,
                dead_at_ms: 0,
                body,
            },
        }
    }
}

/// The DLQ's messages, taken and not settled.
pub(crate) struct Scan {
    channel: Channel,
    entries: Vec<Entry>,
}

impl Scan {
    /// Takes up to `dlq_scan_max` dead letters, sorted by id.
    pub(crate) async fn read(inner: &Inner) -> Result<Self, QueueError> {
        let channel = inner.session().side_channel(inner.timeout).await?;
        let mut entries = Vec::new();
        while entries.len() < inner.config.dlq_scan_max {
            let got = tokio::time::timeout(
                inner.timeout,
                channel.basic_get(inner.names.dlq.as_str().into(), BasicGetOptions::default()),
            )
            .await;
            let message = match got {
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    let _ = channel.close(200, "failed".into()).await;
                    return Err(unavailable(format!("reading {}: {e}", inner.names.dlq)));
                }
                Err(_) => {
                    let _ = channel.close(200, "timed out".into()).await;
                    return Err(unavailable(format!(
                        "reading {}: no answer",
                        inner.names.dlq
                    )));
                }
            };
            let d = message.delivery;
            let id = properties::id(&d.properties, new_id);
            let payload = Bytes::from(d.data);
            let (meta, body) = match decode(&payload) {
                Ok((meta, body)) => (Some(meta), body),
                Err(_) => (None, payload),
            };
            entries.push(Entry {
                id,
                meta,
                body,
                acker: d.acker,
            });
        }
        entries.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Self { channel, entries })
    }

    /// Hands back every message not settled.
    pub(crate) async fn hand_back(self) {
        let _ = self.channel.close(200, "scanned".into()).await;
    }

    pub(crate) fn page(&self, page: &DlqPage) -> Vec<DeadLetter> {
        self.entries
            .iter()
            .filter(|e| page.after.as_ref().is_none_or(|after| &e.id > after))
            .take(page.limit)
            .map(|e| e.record(false))
            .collect()
    }

    pub(crate) fn show(&self, id: &str) -> Option<DeadLetter> {
        self.entries
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.record(true))
    }

    fn chosen<'a>(&'a self, ids: &'a [String]) -> impl Iterator<Item = &'a Entry> + 'a {
        self.entries
            .iter()
            .filter(move |e| ids.is_empty() || ids.contains(&e.id))
    }

    /// Publishes the chosen dead letters back to the queue (attempts reset,
    /// replays + 1), then removes them from the DLQ.
    pub(crate) async fn replay(
        &self,
        inner: &Inner,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let mut done = Vec::new();
        for entry in self.chosen(ids) {
            if done.len() >= limit {
                break;
            }
            let Some(meta) = &entry.meta else { continue };
            if meta.replays >= max_replays {
                continue;
            }
            let meta = Meta {
                replays: meta.replays + 1,
                attempts: 0,
                class: None,
                error: None,
                dead_at_ms: None,
                ..meta.clone()
            };
            inner
                .publish(
                    &inner.names.queue,
                    &encode(&meta, &entry.body),
                    properties::build(&new_id(), Counts::default()),
                )
                .await?;
            settle(&entry.acker).await?;
            done.push(entry.id.clone());
        }
        Ok(done)
    }

    /// Removes the chosen dead letters.
    pub(crate) async fn purge(&self, ids: &[String]) -> Result<usize, QueueError> {
        let mut n = 0;
        for entry in self.chosen(ids) {
            settle(&entry.acker).await?;
            n += 1;
        }
        Ok(n)
    }
}

/// Removes a dead letter the scan took.
async fn settle(acker: &Acker) -> Result<(), QueueError> {
    match acker.ack(BasicAckOptions::default()).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(unavailable("the DLQ scan's channel closed")),
        Err(e) => Err(unavailable(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::dead_letter_id;

    #[test]
    fn dead_letter_ids_sort_by_time() {
        let early = dead_letter_id(9_999);
        let late = dead_letter_id(1_700_000_000_000);
        assert!(early < late, "{early} {late}");
        assert_eq!(late.len(), 13 + 1 + 8);
    }
}
