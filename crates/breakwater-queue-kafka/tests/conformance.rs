//! The queue contract's conformance suite on Kafka, against the broker at
//! `BREAKWATER_TEST_KAFKA_URL` (127.0.0.1:9092 by default; `scripts/test.sh`
//! starts a local one). Each check gets topics and a group of its own,
//! deleted when it ends. The broker being unreachable is a failure, never a
//! skip.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::conformance::Harness;
use breakwater_queue::{OpenMode, Queue};
use breakwater_queue_kafka::{KafkaConfig, KafkaQueue};

fn url() -> String {
    std::env::var("BREAKWATER_TEST_KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn config() -> KafkaConfig {
    KafkaConfig {
        partitions: 2,
        session_timeout_ms: 6_000,
        commit_interval_ms: 100,
        ..KafkaConfig::default()
    }
}

struct Kafka {
    name: String,
}

impl Kafka {
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

impl Drop for Kafka {
    fn drop(&mut self) {
        KafkaQueue::destroy_blocking(&url(), &self.name);
    }
}

#[async_trait]
impl Harness for Kafka {
    async fn open(&self) -> Arc<dyn Queue> {
        let queue = KafkaQueue::open(&url(), &self.name, &config(), OpenMode::Serve)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "Kafka at {} is unreachable ({e}); these tests need it (CI={})",
                    url(),
                    std::env::var("CI").unwrap_or_default()
                )
            });
        Arc::new(queue)
    }

    fn short_lease(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn keeps_key_order(&self) -> bool {
        true
    }

    fn tells_arrivals(&self) -> bool {
        true
    }
}

breakwater_queue::conformance_tests!(Kafka::new());
