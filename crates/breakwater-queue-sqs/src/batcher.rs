//! Batches single calls into SQS's batch calls (`SendMessageBatch`,
//! `DeleteMessageBatch`: at most 10 entries, at most the queue's message
//! size). A batch
//! goes as soon as a slot is free, holding whatever waited meanwhile, and
//! after lingering up to `linger` for more when it is not full: none for
//! sends (a webhook's answer waits for it; under heavy load the slots are
//! all busy, calls pile up and batches fill anyway), a little for deletes
//! (an ack can wait, and SQS bills each call, batch or not). Each caller
//! gets its own entry's outcome.

use std::sync::Arc;

use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::{Instant, timeout_at};

use breakwater_queue::QueueError;

/// SQS's most entries in one batch call.
pub(crate) const MAX_ENTRIES: usize = 10;

/// Sends one batch; answers one outcome per entry, in order (a message id
/// for a send, nothing for a delete).
pub(crate) type Flush<E> =
    Arc<dyn Fn(Vec<E>) -> BoxFuture<'static, Vec<Result<String, QueueError>>> + Send + Sync>;

struct Item<E> {
    entry: E,
    bytes: usize,
    reply: oneshot::Sender<Result<String, QueueError>>,
}

/// A handle to a batching task; the task ends when the last handle drops.
pub(crate) struct Batcher<E> {
    tx: mpsc::Sender<Item<E>>,
    capacity: usize,
}

impl<E: Send + 'static> Batcher<E> {
    /// Starts the task: at most `in_flight` batches at once, each at most
    /// [`MAX_ENTRIES`] entries and `max_bytes`; at most `capacity` calls
    /// waiting.
    pub(crate) fn spawn(
        flush: Flush<E>,
        in_flight: usize,
        max_bytes: usize,
        capacity: usize,
        linger: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        tokio::spawn(run(rx, flush, in_flight.max(1), max_bytes, linger));
        Self { tx, capacity }
    }

    /// Sends `entry` (of `bytes` toward the batch limit) in the next batch;
    /// returns its outcome. [`QueueError::Full`] when too many wait.
    pub(crate) async fn submit(&self, entry: E, bytes: usize) -> Result<String, QueueError> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .try_send(Item {
                entry,
                bytes,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => QueueError::Full {
                    pending: self.capacity,
                },
                mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
            })?;
        outcome.await.map_err(|_| QueueError::Closed)?
    }
}

async fn run<E: Send + 'static>(
    mut rx: mpsc::Receiver<Item<E>>,
    flush: Flush<E>,
    in_flight: usize,
    max_bytes: usize,
    linger: Duration,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut carried: Option<Item<E>> = None;
    loop {
        let first = match carried.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        // Wait for a slot before gathering: what arrives meanwhile joins.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        let until = Instant::now() + linger;
        while batch.len() < MAX_ENTRIES {
            let next = match rx.try_recv() {
                Ok(item) => Some(item),
                Err(_) if linger.is_zero() => None,
                Err(_) => timeout_at(until, rx.recv()).await.ok().flatten(),
            };
            match next {
                Some(item) if bytes + item.bytes > max_bytes => {
                    carried = Some(item);
                    break;
                }
                Some(item) => {
                    bytes += item.bytes;
                    batch.push(item);
                }
                None => break,
            }
        }
        let flush = Arc::clone(&flush);
        tokio::spawn(async move {
            let _slot = slot;
            let (entries, replies): (Vec<E>, Vec<_>) =
                batch.into_iter().map(|i| (i.entry, i.reply)).unzip();
            let n = entries.len();
            let mut outcomes = flush(entries).await.into_iter();
            for reply in replies {
                let outcome = outcomes.next().unwrap_or_else(|| {
                    Err(QueueError::Unavailable(format!(
                        "a batch of {n} answered fewer outcomes"
                    )))
                });
                let _ = reply.send(outcome);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Every batch a flush was given.
    type Seen = Arc<Mutex<Vec<Vec<u32>>>>;

    /// A flush that records each batch and takes 20 ms.
    fn recording() -> (Flush<u32>, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let flush: Flush<u32> = Arc::new(move |entries: Vec<u32>| {
            let log = Arc::clone(&log);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                log.lock().expect("log").push(entries.clone());
                entries
                    .iter()
                    .map(|e| {
                        if *e == 13 {
                            Err(QueueError::Unavailable("unlucky".into()))
                        } else {
                            Ok(format!("id-{e}"))
                        }
                    })
                    .collect()
            })
        });
        (flush, seen)
    }

    #[tokio::test]
    async fn calls_that_wait_go_together_and_each_gets_its_outcome() {
        let (flush, seen) = recording();
        let b = Arc::new(Batcher::spawn(flush, 1, 1_000, 100, Duration::ZERO));
        let calls: Vec<_> = (0..25u32)
            .map(|i| {
                let b = Arc::clone(&b);
                tokio::spawn(async move { (i, b.submit(i, 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("join");
            match outcome {
                Ok(id) => assert_eq!(id, format!("id-{i}")),
                Err(e) => assert_eq!(i, 13, "{e}"),
            }
        }
        let batches = seen.lock().expect("log").clone();
        assert!(
            batches.iter().all(|b| b.len() <= MAX_ENTRIES),
            "{batches:?}"
        );
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 25);
        assert!(batches.len() < 25, "nothing was batched: {batches:?}");
    }

    #[tokio::test]
    async fn a_lingering_batch_gathers_calls_that_come_one_by_one() {
        let (flush, seen) = recording();
        let b = Arc::new(Batcher::spawn(
            flush,
            4,
            1_000,
            100,
            Duration::from_millis(200),
        ));
        let mut calls = Vec::new();
        for i in 0..5u32 {
            let b = Arc::clone(&b);
            calls.push(tokio::spawn(async move { b.submit(i, 1).await }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for call in calls {
            call.await.expect("join").expect("sent");
        }
        let batches = seen.lock().expect("log").clone();
        assert_eq!(
            batches,
            vec![vec![0, 1, 2, 3, 4]],
            "slots were free: only the linger gathers"
        );
    }

    #[tokio::test]
    async fn a_batch_stays_under_its_byte_limit() {
        let (flush, seen) = recording();
        let b = Arc::new(Batcher::spawn(flush, 1, 100, 100, Duration::ZERO));
        let calls: Vec<_> = (0..6u32)
            .map(|i| {
                let b = Arc::clone(&b);
                tokio::spawn(async move { b.submit(i, 40).await })
            })
            .collect();
        for call in calls {
            call.await.expect("join").expect("sent");
        }
        let batches = seen.lock().expect("log").clone();
        assert!(batches.iter().all(|b| b.len() <= 2), "{batches:?}");
    }
}
