//! Helpers the log store's integration tests share: opening a store whose
//! previous owner may still be letting go of it, and reading what it
//! holds queued.

use std::collections::BTreeSet;
use std::time::Duration;

use breakwater_queue::{Queue, QueueError};
use breakwater_queue_log::{LogConfig, LogQueue};

/// How long a claim made to look at the queue holds what it took.
pub(crate) const LEASE: Duration = Duration::from_secs(60);

/// Opens the store, waiting out the previous owner's writer thread, which
/// holds the lock until it has ended.
pub(crate) async fn open(config: &LogConfig) -> LogQueue {
    for _ in 0..500 {
        match LogQueue::open(config) {
            Ok(q) => return q,
            Err(QueueError::Storage(e)) if e.contains("another process") => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("open: {e}"),
        }
    }
    panic!("the store's lock was never released");
}

/// Event ids of every queued message, claimed (and so left to lapse).
pub(crate) async fn queued(q: &LogQueue) -> BTreeSet<String> {
    q.claim(100_000, LEASE)
        .await
        .expect("claim")
        .into_iter()
        .map(|d| d.message.event_id)
        .collect()
}
