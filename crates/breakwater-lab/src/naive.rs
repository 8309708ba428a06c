//! The naive consumer's habit, kept with the lab that shows what it costs:
//! a dependency failure is retried at once inside the worker, sleeping the
//! backoff while it holds the worker (and, through the pool, often a
//! connection), instead of going back to the queue.
//!
//! [`RetryInPlace`] wraps the real sink, so the lab's naive mode runs the
//! same service with this one habit added. It also counts every apply it
//! sends (a transaction on the database), in both modes, for the lab's
//! "transactions during the fault" figure.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use breakwater_control::BackoffPolicy;
use breakwater_sink::{Applied, Event, FailureClass, LockSnapshot, Sink, SinkError};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// A sink that retries dependency failures in place, up to
/// `max_attempts` applies in all (1: no retry, just counting).
pub struct RetryInPlace {
    inner: Arc<dyn Sink>,
    max_attempts: u32,
    backoff: BackoffPolicy,
    applies: Arc<AtomicU64>,
}

impl RetryInPlace {
    /// Wraps `inner`; `applies` counts every apply sent to it.
    pub fn new(
        inner: Arc<dyn Sink>,
        max_attempts: u32,
        backoff: BackoffPolicy,
        applies: Arc<AtomicU64>,
    ) -> Self {
        Self {
            inner,
            max_attempts: max_attempts.max(1),
            backoff,
            applies,
        }
    }
}

#[async_trait]
impl Sink for RetryInPlace {
    async fn apply(&self, event: &Event<'_>) -> Result<Applied, SinkError> {
        let mut attempt = 0;
        loop {
            self.applies.fetch_add(1, Ordering::Relaxed);
            let result = self.inner.apply(event).await;
            attempt += 1;
            match &result {
                Err(e) if e.class == FailureClass::Dependency && attempt < self.max_attempts => {
                    let mut rng = SmallRng::from_os_rng();
                    tokio::time::sleep(self.backoff.delay(attempt, None, &mut rng)).await;
                }
                _ => return result,
            }
        }
    }

    fn pool_usage(&self) -> (usize, usize) {
        self.inner.pool_usage()
    }

    async fn lock_snapshot(&self) -> Option<LockSnapshot> {
        self.inner.lock_snapshot().await
    }

    async fn reachable(&self) -> Option<bool> {
        self.inner.reachable().await
    }
}
