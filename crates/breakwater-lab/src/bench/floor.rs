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
//!
//! That floor does not bound designs it does not share, so it has a second
//! [`FloorMode`]: [`FloorMode::Leader`] writes the same records into the
//! same kind of ring with no thread of its own. A handler that finds no
//! group being written leads: it gives the others one turn of the runtime
//! to add theirs, writes and `fdatasync`s what gathered as one group from
//! its own worker thread (blocking it for the fsync), gives up the lead and
//! wakes the rest through a `watch` channel; one whose record came too late
//! for that group leads the next. No hand-off to another thread, no
//! wake-up from outside the runtime: about what a queue that fsyncs from
//! the runtime's own threads could reach (one that did not block them,
//! through io_uring say, would do a little better). It has no bound on
//! what gathers: the bench's connections bound it.
//!
//! It is a measuring instrument, not a backend: it overwrites what it took,
//! cannot hand it out, and every other operation fails.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch};

use breakwater::queue::{
    Capabilities, DeadLetter, Delivery, DlqPage, Enqueued, Flow, NewMessage, Queue, QueueError,
    QueueStats, Receipt,
};
use breakwater_queue_embedded::EmbeddedConfig;
use breakwater_queue_embedded::writer::{LINGER, LINGER_BELOW, drain, headers_json};

type Reply = oneshot::Sender<Result<Enqueued, QueueError>>;

/// Size of the ring file: a few hundred groups of 1 KiB webhooks.
pub const RING_BYTES: u64 = 64 << 20;

/// A webhook with its headers already serialized, as the writer gets it.
struct Pending {
    message: NewMessage,
    headers_json: String,
    reply: Reply,
}

/// Where a floor's group commit runs: see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorMode {
    /// On a thread of its own, like the embedded queue's writer.
    OwnThread,
    /// On the runtime's threads, led by the first waiting handler.
    Leader,
}

/// A preallocated file written with group commit: see the module doc.
#[derive(Debug, Clone)]
pub struct FloorQueue {
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    OwnThread(mpsc::Sender<Pending>),
    Leader(Arc<Leader>),
}

impl FloorQueue {
    /// Creates (truncating) the file at `path`. In [`FloorMode::OwnThread`]
    /// it starts the thread that writes to it, with the embedded queue's
    /// `max_batch` and `max_pending` from `config`; the thread ends when
    /// the last clone is dropped.
    pub fn open(path: &Path, config: &EmbeddedConfig, mode: FloorMode) -> Result<Self, QueueError> {
        let file = preallocate(path, RING_BYTES)
            .map_err(|e| QueueError::Storage(format!("cannot create {}: {e}", path.display())))?;
        let inner = match mode {
            FloorMode::OwnThread => {
                let (ops, rx) = mpsc::channel(config.max_pending.max(1));
                let max_group = config.max_batch.max(1);
                std::thread::Builder::new()
                    // "queue-" like the embedded queue's threads: the bench
                    // counts its CPU under the same column.
                    .name("queue-floor".into())
                    .spawn(move || append_loop(file, rx, max_group))
                    .map_err(|e| {
                        QueueError::Storage(format!("cannot start the floor thread: {e}"))
                    })?;
                Inner::OwnThread(ops)
            }
            FloorMode::Leader => Inner::Leader(Arc::new(Leader {
                file,
                gathered: Mutex::new(Gathered::default()),
                durable: watch::channel(Durable::default()).0,
            })),
        };
        Ok(Self { inner })
    }
}

/// The shared state of [`FloorMode::Leader`].
#[derive(Debug)]
struct Leader {
    file: std::fs::File,
    gathered: Mutex<Gathered>,
    /// How far the file is durable; waiters watch it.
    durable: watch::Sender<Durable>,
}

/// Records not yet written, and who is writing.
#[derive(Debug, Default)]
struct Gathered {
    bytes: Vec<u8>,
    /// Number of the last record in `bytes` (records count from 1).
    last: u64,
    /// A handler is leading: the others only wait.
    leading: bool,
    /// Where the last group ended in the ring.
    end: u64,
}

#[derive(Debug, Clone, Default)]
struct Durable {
    /// Records up to this one are on disk.
    upto: u64,
    /// A write failed: every record from then on fails.
    failed: Option<String>,
}

impl Leader {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError> {
        let headers_json = headers_json(&message);
        let mut durable = self.durable.subscribe();
        let mine = {
            let mut g = self.gathered.lock().map_err(|_| QueueError::Closed)?;
            encode(&mut g.bytes, &message, &headers_json);
            g.last += 1;
            g.last
        };
        loop {
            {
                let d = durable.borrow_and_update();
                if d.upto >= mine {
                    return Ok(Enqueued::New {
                        id: mine.to_string(),
                    });
                }
                if let Some(e) = &d.failed {
                    return Err(QueueError::Storage(format!("floor write failed: {e}")));
                }
            }
            if self.try_lead()? {
                // The leader's linger: one turn of the runtime for the
                // others. Should this future be dropped meanwhile, the
                // group is written on the way out, or nobody would.
                let mut on_drop = WriteOnDrop(Some(self));
                tokio::task::yield_now().await;
                on_drop.0 = None;
                self.write_group()?;
            } else {
                durable.changed().await.map_err(|_| QueueError::Closed)?;
            }
        }
    }

    /// Takes the lead if nobody has it and something waits to be written.
    fn try_lead(&self) -> Result<bool, QueueError> {
        let mut g = self.gathered.lock().map_err(|_| QueueError::Closed)?;
        let lead = !g.leading && !g.bytes.is_empty();
        g.leading |= lead;
        Ok(lead)
    }

    /// Writes what has gathered as one group, gives up the lead, then wakes
    /// the waiters: one whose record came too late for this group leads
    /// the next (so no handler leads for longer than one group).
    fn write_group(&self) -> Result<(), QueueError> {
        let (bytes, upto, at) = {
            let mut g = self.gathered.lock().map_err(|_| QueueError::Closed)?;
            let bytes = std::mem::take(&mut g.bytes);
            let at = ring_offset(g.end, bytes.len() as u64);
            g.end = at + bytes.len() as u64;
            (bytes, g.last, at)
        };
        // Blocks this worker thread for the fsync: the design measured.
        let written = self
            .file
            .write_all_at(&bytes, at)
            .and_then(|()| self.file.sync_data());
        self.gathered
            .lock()
            .map_err(|_| QueueError::Closed)?
            .leading = false;
        // `max`: a leader that took the lead after this one cleared it
        // may have published a later group first.
        self.durable.send_modify(|d| match written {
            Ok(()) => d.upto = d.upto.max(upto),
            Err(e) => d.failed = Some(e.to_string()),
        });
        Ok(())
    }
}

/// Writes the group of a leader dropped before it could.
struct WriteOnDrop<'a>(Option<&'a Leader>);

impl Drop for WriteOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(leader) = self.0 {
            // Nobody is left to hear of a failure: the waiters see it.
            let _ = leader.write_group();
        }
    }
}

/// Creates the file at `path` with `len` zero bytes on disk, written as
/// the log writes its segments' zeros (a page at a time, so a group's
/// `fdatasync` writes back only the pages it dirtied).
pub(crate) fn preallocate(path: &Path, len: u64) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    breakwater_queue_log::zero_fill(&file, 0, len)?;
    file.sync_all()?;
    Ok(file)
}

/// Where a group of `len` bytes goes after one that ended at `end`: on,
/// or back at the start when it would pass the ring's end. (A group
/// larger than the ring starts at 0 and grows the file.)
pub(crate) fn ring_offset(end: u64, len: u64) -> u64 {
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
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_delay: false,
            native_dedup: false,
            counts_attempts: false,
            counts_receives: false,
            filters_keys: false,
            push: false,
            stats: &[],
        }
    }

    async fn set_flow(&self, _flow: Flow) -> Result<(), QueueError> {
        Ok(())
    }

    async fn dlq_list(&self, _page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
        Err(not_a_backend())
    }

    async fn dlq_show(&self, _id: &str) -> Result<DeadLetter, QueueError> {
        Err(not_a_backend())
    }

    async fn dlq_replay(
        &self,
        _ids: &[String],
        _max_replays: u32,
        _limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        Err(not_a_backend())
    }

    async fn dlq_purge(&self, _ids: &[String]) -> Result<usize, QueueError> {
        Err(not_a_backend())
    }

    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError> {
        let ops = match &self.inner {
            Inner::OwnThread(ops) => ops,
            Inner::Leader(leader) => return leader.enqueue(message).await,
        };
        let headers_json = headers_json(&message);
        let (reply, answer) = oneshot::channel();
        ops.try_send(Pending {
            message,
            headers_json,
            reply,
        })
        .map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => QueueError::Full {
                pending: ops.max_capacity(),
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
        _reason: &breakwater::queue::DeadLetterReason,
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
        for mode in [FloorMode::OwnThread, FloorMode::Leader] {
            writes_every_webhook_before_answering(mode).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_writes_every_concurrent_webhook_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("floor.log");
        let queue =
            FloorQueue::open(&path, &EmbeddedConfig::default(), FloorMode::Leader).expect("open");
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..500 {
            let queue = queue.clone();
            tasks.spawn(async move { queue.enqueue(webhook(&format!("evt_{i}"), b"{}")).await });
        }
        let mut ids = std::collections::BTreeSet::new();
        while let Some(done) = tasks.join_next().await {
            match done.expect("join").expect("enqueue") {
                Enqueued::New { id } => ids.insert(id.parse::<u64>().expect("number")),
                other => panic!("{other:?}"),
            };
        }
        assert_eq!(ids, (1..=500).collect(), "every record numbered once");
        // The groups lie one after another from the start of the ring.
        let written = std::fs::read(&path).expect("read");
        let mut events = std::collections::BTreeSet::new();
        let mut at = 0;
        while written[at..at + 8] != [0; 8] {
            at += 8;
            let mut fields = Vec::new();
            for _ in 0..5 {
                let len = u32::from_le_bytes(written[at..at + 4].try_into().expect("4")) as usize;
                fields.push(&written[at + 4..at + 4 + len]);
                at += 4 + len;
            }
            let event = String::from_utf8(fields[1].to_vec()).expect("utf8");
            assert!(events.insert(event), "a record written twice");
        }
        let expected: std::collections::BTreeSet<String> =
            (0..500).map(|i| format!("evt_{i}")).collect();
        assert_eq!(events, expected);
        let leader = match &queue.inner {
            Inner::Leader(leader) => leader,
            Inner::OwnThread(_) => unreachable!(),
        };
        assert_eq!(leader.durable.borrow().upto, 500);
        assert!(!leader.gathered.lock().expect("lock").leading);
    }

    #[tokio::test]
    async fn a_leader_dropped_before_writing_still_writes_its_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("floor.log");
        let queue =
            FloorQueue::open(&path, &EmbeddedConfig::default(), FloorMode::Leader).expect("open");
        let leader = match &queue.inner {
            Inner::Leader(leader) => Arc::clone(leader),
            Inner::OwnThread(_) => unreachable!(),
        };
        let first = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.enqueue(webhook("evt_1", b"{}")).await })
        };
        // One runtime thread: this lets the task run to its linger, leading.
        tokio::task::yield_now().await;
        assert!(leader.gathered.lock().expect("lock").leading, "it leads");
        first.abort();
        let second = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            queue.enqueue(webhook("evt_2", b"{}")),
        )
        .await
        .expect("the lead was not lost with the dropped leader")
        .expect("enqueue");
        assert_eq!(second, Enqueued::New { id: "2".into() });
        assert_eq!(leader.durable.borrow().upto, 2, "both records written");
    }

    async fn writes_every_webhook_before_answering(mode: FloorMode) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("floor.log");
        let queue = FloorQueue::open(&path, &EmbeddedConfig::default(), mode).expect("open");
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
