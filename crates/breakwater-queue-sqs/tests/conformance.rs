//! The queue contract's conformance suite on SQS, against the local
//! endpoint the test script starts (moto, `BREAKWATER_TEST_SQS_URL`,
//! http://127.0.0.1:4566 by default), on a standard queue and on a FIFO
//! queue. Each check gets queues of its own, deleted when it ends. The
//! endpoint being unreachable is a failure, never a skip.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::conformance::Harness;
use breakwater_queue::{OpenMode, Queue};
use breakwater_queue_sqs::{Endpoint, SqsConfig, SqsQueue};

fn endpoint() -> Endpoint {
    Endpoint::at(Some(
        std::env::var("BREAKWATER_TEST_SQS_URL").unwrap_or_else(|_| "http://127.0.0.1:4566".into()),
    ))
}

struct Sqs {
    name: String,
}

impl Sqs {
    fn new(fifo: bool) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "bwconf-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self {
            name: if fifo { format!("{name}.fifo") } else { name },
        }
    }
}

impl Drop for Sqs {
    fn drop(&mut self) {
        SqsQueue::destroy_blocking(&endpoint(), &self.name);
    }
}

#[async_trait]
impl Harness for Sqs {
    async fn open(&self) -> Arc<dyn Queue> {
        let queue = SqsQueue::open(
            &endpoint(),
            &self.name,
            &SqsConfig::default(),
            OpenMode::Serve,
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the SQS endpoint {:?} is unreachable ({e}); these tests need it: \
                     scripts/test.sh starts one (CI={})",
                endpoint().url,
                std::env::var("CI").unwrap_or_default()
            )
        });
        Arc::new(queue)
    }

    /// SQS counts visibility in whole seconds.
    fn short_lease(&self) -> Duration {
        Duration::from_secs(1)
    }
}

mod standard {
    use super::Sqs;
    breakwater_queue::conformance_tests!(Sqs::new(false));
}

/// On a FIFO queue, every check but one: one entity key's messages are one
/// group, which SQS hands out in order and not past an unsettled one, so
/// `durable_publish` (20 of one key claimed at once) cannot hold.
/// `tests/broker.rs` checks what a FIFO queue does instead. (`stats_follow`
/// runs on the stats a FIFO queue declares: a retry there is held back at
/// receive, so visible and delayed are not declared.)
mod fifo {
    use super::Sqs;
    breakwater_queue::conformance_tests!(@each Sqs::new(true);
        duplicates_as_declared, lease_expiry_redelivers, ack_removes,
        retry_delay_is_honoured, release_counts_no_attempt, dead_letter_keeps_reason,
        replay_puts_back, purge_deletes, pause_stops_delivery, probing_bounds_a_claim,
        a_settled_receipt_is_refused, stats_follow);
}
