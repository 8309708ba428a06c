//! The floor under `bench ingress --floor`: the least that any ingress
//! answering only after an fsync can do on this machine.
//!
//! [`FloorQueue`] takes webhooks the way the embedded queue's writer does
//! (one thread, groups of whatever has queued up, the same linger for
//! small groups, the headers serialized on the caller's thread, the reply
//! only after the group's `fdatasync`), but instead of SQLite it appends
//! each group to one file with one `write`, and keeps nothing else: no
//! index, no dedup, no checkpoint, no claims. The real ingress (signature,
//! parsing, routing) runs in front of it unchanged.
//!
//! So its rate is an upper bound for any store that makes each webhook
//! durable before the 202 on this disk and these two cores, whatever its
//! format: if the floor does not reach a target, no queue will. It is a
//! measuring instrument, not a backend: it cannot hand out what it took,
//! and every other operation fails.

use std::io::Write;
use std::path::Path;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::config::QueueConfig;
use crate::queue::embedded::writer::{LINGER, LINGER_BELOW};
use crate::queue::{Delivery, Enqueued, NewMessage, Queue, QueueError, QueueStats, Receipt};

type Reply = oneshot::Sender<Result<Enqueued, QueueError>>;

/// A webhook with its headers already serialized, as the writer gets it.
struct Pending {
    message: NewMessage,
    headers_json: String,
    reply: Reply,
}

/// An append-only file with group commit: see the module doc.
#[derive(Debug, Clone)]
pub struct FloorQueue {
    ops: mpsc::Sender<Pending>,
}

impl FloorQueue {
    /// Creates (truncating) the file at `path` and starts the thread that
    /// appends to it, with the embedded queue's `max_batch` and
    /// `max_pending` from `config`; the thread ends when the last clone is
    /// dropped.
    pub fn open(path: &Path, config: &QueueConfig) -> Result<Self, QueueError> {
        let file = std::fs::File::create(path)
            .map_err(|e| QueueError::Storage(format!("cannot create {}: {e}", path.display())))?;
        let (ops, rx) = mpsc::channel(config.max_pending.max(1));
        let max_group = config.max_batch.max(1);
        std::thread::Builder::new()
            // "queue-" like the embedded queue's threads: the bench counts
            // its CPU under the same column.
            .name("queue-floor".into())
            .spawn(move || append_loop(file, rx, max_group))
            .map_err(|e| QueueError::Storage(format!("cannot start the floor thread: {e}")))?;
        Ok(Self { ops })
    }
}

/// Appends each group with one `write`, `fdatasync`s, then answers it.
fn append_loop(mut file: std::fs::File, mut rx: mpsc::Receiver<Pending>, max_group: usize) {
    let mut group: Vec<Pending> = Vec::with_capacity(max_group);
    let mut bytes: Vec<u8> = Vec::new();
    let mut next_id: u64 = 0;
    let drain = |rx: &mut mpsc::Receiver<Pending>, group: &mut Vec<Pending>| {
        while group.len() < max_group {
            match rx.try_recv() {
                Ok(p) => group.push(p),
                Err(_) => break,
            }
        }
    };
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        drain(&mut rx, &mut group);
        if group.len() < LINGER_BELOW {
            std::thread::sleep(LINGER);
            drain(&mut rx, &mut group);
        }
        bytes.clear();
        for p in &group {
            encode(&mut bytes, &p.message, &p.headers_json);
        }
        let written = file.write_all(&bytes).and_then(|()| file.sync_data());
        for p in group.drain(..) {
            next_id += 1;
            let outcome = match &written {
                Ok(()) => Ok(Enqueued::New {
                    id: next_id.to_string(),
                }),
                Err(e) => Err(QueueError::Storage(format!("floor append failed: {e}"))),
            };
            let _ = p.reply.send(outcome);
        }
    }
}

/// One record: each field length-prefixed, as a real log would need to
/// read it back.
fn encode(out: &mut Vec<u8>, m: &NewMessage, headers_json: &str) {
    let fields: [&[u8]; 5] = [
        m.source.as_bytes(),
        m.event_id.as_bytes(),
        m.entity_key.as_deref().unwrap_or("").as_bytes(),
        headers_json.as_bytes(),
        &m.body,
    ];
    out.extend_from_slice(&m.received_at_ms.to_le_bytes());
    for field in fields {
        out.extend_from_slice(&(field.len() as u32).to_le_bytes());
        out.extend_from_slice(field);
    }
}

fn not_a_backend() -> QueueError {
    QueueError::Storage("the bench's floor queue only takes webhooks".to_owned())
}

#[async_trait]
impl Queue for FloorQueue {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError> {
        let headers_json = serde_json::to_string(&message.headers)
            .map_err(|e| QueueError::Storage(format!("cannot serialize the headers: {e}")))?;
        let (reply, answer) = oneshot::channel();
        self.ops
            .try_send(Pending {
                message,
                headers_json,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => QueueError::Full {
                    pending: self.ops.max_capacity(),
                },
                mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
            })?;
        answer.await.map_err(|_| QueueError::Closed)?
    }

    async fn claim(
        &self,
        _max: usize,
        _lease: std::time::Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        Err(not_a_backend())
    }

    async fn ack(&self, _receipt: &Receipt) -> Result<(), QueueError> {
        Err(not_a_backend())
    }

    async fn retry_later(
        &self,
        _receipt: &Receipt,
        _delay: std::time::Duration,
        _error: &str,
    ) -> Result<(), QueueError> {
        Err(not_a_backend())
    }

    async fn release(
        &self,
        _receipt: &Receipt,
        _delay: std::time::Duration,
    ) -> Result<(), QueueError> {
        Err(not_a_backend())
    }

    async fn dead_letter(
        &self,
        _receipt: &Receipt,
        _reason: &crate::queue::DeadLetterReason,
    ) -> Result<(), QueueError> {
        Err(not_a_backend())
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        Ok(QueueStats::default())
    }

    async fn ready(&self) -> Result<(), QueueError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook(event_id: &str, body: &'static [u8]) -> NewMessage {
        NewMessage {
            source: "stripe".to_owned(),
            event_id: event_id.to_owned(),
            entity_key: Some("order-1".to_owned()),
            headers: vec![("stripe-signature".to_owned(), "t=1,v1=ab".to_owned())],
            body: bytes::Bytes::from_static(body),
            received_at_ms: 7,
        }
    }

    #[tokio::test]
    async fn appends_every_webhook_before_answering_and_takes_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("floor.log");
        let queue = FloorQueue::open(&path, &QueueConfig::default()).expect("open");
        let first = queue.enqueue(webhook("evt_1", b"{\"a\":1}")).await;
        let second = queue.enqueue(webhook("evt_2", b"{\"b\":22}")).await;
        assert_eq!(first.expect("first"), Enqueued::New { id: "1".into() });
        assert_eq!(second.expect("second"), Enqueued::New { id: "2".into() });

        let mut expected = Vec::new();
        encode(
            &mut expected,
            &webhook("evt_1", b"{\"a\":1}"),
            "[[\"stripe-signature\",\"t=1,v1=ab\"]]",
        );
        encode(
            &mut expected,
            &webhook("evt_2", b"{\"b\":22}"),
            "[[\"stripe-signature\",\"t=1,v1=ab\"]]",
        );
        assert_eq!(std::fs::read(&path).expect("read"), expected);

        assert!(matches!(
            queue.claim(10, std::time::Duration::from_secs(1)).await,
            Err(QueueError::Storage(_))
        ));
    }
}
