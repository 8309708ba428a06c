//! The queue contract's conformance suite on NATS JetStream, against the
//! server on 127.0.0.1:4222 (`BREAKWATER_TEST_NATS_URL` overrides it). Each
//! check gets streams, a consumer and a bucket of its own, removed when it
//! ends. The server being unreachable is a failure, never a skip.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::conformance::Harness;
use breakwater_queue::{OpenMode, Queue};
use breakwater_queue_nats::{NatsConfig, NatsQueue};

fn url() -> String {
    std::env::var("BREAKWATER_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// The consumer's ack wait: every claim's lease (JetStream has one per
/// consumer, not per claim), short enough for the lease check to see it
/// lapse.
const LEASE: Duration = Duration::from_millis(1500);

struct Nats {
    name: String,
}

impl Nats {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self {
            name: format!(
                "bwtest_{}_{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        NatsQueue::destroy_blocking(&url(), &self.name);
    }
}

#[async_trait]
impl Harness for Nats {
    async fn open(&self) -> Arc<dyn Queue> {
        let queue = NatsQueue::open(
            &url(),
            &self.name,
            LEASE,
            &NatsConfig::default(),
            OpenMode::Serve,
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "NATS at {} is unreachable ({e}); these tests need it (CI={})",
                url(),
                std::env::var("CI").unwrap_or_default()
            )
        });
        Arc::new(queue)
    }

    fn short_lease(&self) -> Duration {
        LEASE
    }
}

breakwater_queue::conformance_tests!(Nats::new());
