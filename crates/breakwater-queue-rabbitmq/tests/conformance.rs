//! The queue contract's conformance suite on RabbitMQ, against the broker
//! on 127.0.0.1:5672 (`BREAKWATER_TEST_AMQP_URL` overrides it). Each check
//! gets queues of its own, deleted when it ends. The broker being
//! unreachable is a failure, never a skip.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::conformance::Harness;
use breakwater_queue::{OpenMode, Queue};
use breakwater_queue_rabbitmq::{RabbitMqConfig, RabbitMqQueue};

fn url() -> String {
    std::env::var("BREAKWATER_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

struct Rabbit {
    name: String,
}

impl Rabbit {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self {
            name: format!(
                "bwtest-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        RabbitMqQueue::destroy_blocking(&url(), &self.name);
    }
}

#[async_trait]
impl Harness for Rabbit {
    async fn open(&self) -> Arc<dyn Queue> {
        let queue = RabbitMqQueue::open(
            &url(),
            &self.name,
            &RabbitMqConfig::default(),
            OpenMode::Serve,
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RabbitMQ at {} is unreachable ({e}); these tests need it (CI={})",
                breakwater_queue_rabbitmq::redact(&url()),
                std::env::var("CI").unwrap_or_default()
            )
        });
        Arc::new(queue)
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(500)
    }
}

breakwater_queue::conformance_tests!(Rabbit::new());
