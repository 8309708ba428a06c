//! The floor under `bench ingress --floor`: the least that any ingress
//! answering only after an fsync can do on this machine.
//!
//! [`FloorQueue`] takes webhooks the way the embedded queue's writer does
//! (one thread, groups of whatever has queued up, the same linger for
//! small groups, the headers serialized on the caller's thread, the reply
//! only after the group's `fdatasync`), but instead of SQLite it writes
//! each group with one positioned write into a preallocated ring file
//! ([`RING_BYTES`], zero-filled and synced when it opens, so no
//! `fdatasync` has a file size or new blocks to record, as with SQLite's
//! WAL once it is rewound), and keeps nothing else: no index, no dedup, no
//! checkpoint, no claims. The real ingress (signature, parsing, routing)
//! runs in front of it unchanged.
//!
//! So its rate bounds from above what a queue can reach on this disk and
//! these two cores when it makes each webhook durable with a group
//! `fdatasync` from its own thread before the 202, as the embedded queue
//! does: what lies between the floor and phase 2 is the store's own cost.
//! (It does not bound designs it does not share: fsyncs issued from the
//! runtime's own threads, say, through io_uring.) It is a measuring
//! instrument, not a backend: it overwrites what it took, cannot hand it
//! out, and every other operation fails.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::config::QueueConfig;
use crate::queue::embedded::writer::{LINGER, LINGER_BELOW, drain, headers_json};
use crate::queue::{Delivery, Enqueued, NewMessage, Queue, QueueError, QueueStats, Receipt};

type Reply = oneshot::Sender<Result<Enqueued, QueueError>>;

/// Size of the ring file: a few hundred groups of 1 KiB webhooks.
pub const RING_BYTES: u64 = 64 << 20;

/// A webhook with its headers already serialized, as the writer gets it.
struct Pending {
    message: NewMessage,
    headers_json: String,
    reply: Reply,
}

/// A preallocated file written with group commit: see the module doc.
#[derive(Debug, Clone)]
pub struct FloorQueue {
    ops: mpsc::Sender<Pending>,
}

impl FloorQueue {
    /// Creates (truncating) the file at `path` and starts the thread that
    /// writes to it, with the embedded queue's `max_batch` and
    /// `max_pending` from `config`; the thread ends when the last clone is
    /// dropped.
    pub fn open(path: &Path, config: &QueueConfig) -> Result<Self, QueueError> {
        let file = preallocate(path, RING_BYTES)
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

/// Creates the file at `path` with `len` zero bytes on disk.
fn preallocate(path: &Path, len: u64) -> std::io::Result<std::fs::File> {
    let mut file = std::fs::File::create(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(file)
}

/// Where a group of `len` bytes goes after one that ended at `end`: on,
/// or back at the start when it would pass the ring's end. (A group
/// larger than the ring starts at 0 and grows the file.)
fn ring_offset(end: u64, len: u64) -> u64 {
    if end + len <= RING_BYTES { end } else { 0 }
}

/// Writes each group into the ring, `fdatasync`s, then answers it.
fn append_loop(file: std::fs::File, mut rx: mpsc::Receiver<Pending>, max_group: usize) {
    let mut group: Vec<Pending> = Vec::with_capacity(max_group);
    let mut bytes: Vec<u8> = Vec::new();
    let mut next_id: u64 = 0;
    let mut end: u64 = 0;
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        drain(&mut rx, &mut group, max_group);
        if group.len() < LINGER_BELOW {
            std::thread::sleep(LINGER);
            drain(&mut rx, &mut group, max_group);
        }
        bytes.clear();
        for p in &group {
            encode(&mut bytes, &p.message, &p.headers_json);
        }
        let at = ring_offset(end, bytes.len() as u64);
        end = at + bytes.len() as u64;
        let written = file
            .write_all_at(&bytes, at)
            .and_then(|()| file.sync_data());
        for p in group.drain(..) {
            next_id += 1;
            let outcome = match &written {
                Ok(()) => Ok(Enqueued::New {
                    id: next_id.to_string(),
                }),
                Err(e) => Err(QueueError::Storage(format!("floor write failed: {e}"))),
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
        let headers_json = headers_json(&message);
        let (reply, answer) = oneshot::channel();
        self.ops
            .try_send(Pending {
                message,
                headers_json,
                reply,
            })
            .map_err(|e| QueueError::not_taken(&e, self.ops.max_capacity()))?;
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
    async fn writes_every_webhook_before_answering_and_takes_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("floor.log");
        let queue = FloorQueue::open(&path, &QueueConfig::default()).expect("open");
        let first = queue.enqueue(webhook("evt_1", b"{\"a\":1}")).await;
        let second = queue.enqueue(webhook("evt_2", b"{\"b\":22}")).await;
        assert_eq!(first.expect("first"), Enqueued::New { id: "1".into() });
        assert_eq!(second.expect("second"), Enqueued::New { id: "2".into() });

        assert_eq!(std::fs::metadata(&path).expect("file").len(), RING_BYTES);
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
        let written = std::fs::read(&path).expect("read");
        assert_eq!(&written[..expected.len()], &expected[..]);
        assert!(written[expected.len()..].iter().all(|&b| b == 0));

        assert!(matches!(
            queue.claim(10, std::time::Duration::from_secs(1)).await,
            Err(QueueError::Storage(_))
        ));
    }

    #[test]
    fn groups_wrap_to_the_start_of_the_ring() {
        assert_eq!(ring_offset(0, 100), 0);
        assert_eq!(ring_offset(500, 100), 500);
        assert_eq!(ring_offset(RING_BYTES - 100, 100), RING_BYTES - 100);
        assert_eq!(ring_offset(RING_BYTES - 100, 101), 0);
        assert_eq!(ring_offset(10, RING_BYTES + 1), 0);
    }
}
