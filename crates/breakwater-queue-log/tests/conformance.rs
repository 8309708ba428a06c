//! The queue contract's conformance suite on the segment-log backend: each
//! check gets a store of its own in a temporary directory, reopened where
//! the check restarts the queue.

use std::sync::Arc;

use async_trait::async_trait;
use breakwater_queue::Queue;
use breakwater_queue::conformance::Harness;
use breakwater_queue_log::{LogConfig, LogQueue};

struct Log {
    dir: tempfile::TempDir,
}

impl Log {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
}

#[async_trait]
impl Harness for Log {
    async fn open(&self) -> Arc<dyn Queue> {
        // Small segments, so the checks also cross segment boundaries.
        let config = LogConfig {
            segment_bytes: 64 << 10,
            ..LogConfig::at(self.dir.path())
        };
        // A reopen may race the previous writer's exit: it holds the lock.
        for _ in 0..100 {
            match LogQueue::open(&config) {
                Ok(q) => return Arc::new(q),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        Arc::new(LogQueue::open(&config).expect("open"))
    }

    /// `LogConfig`'s default, `workers.order = "key"`'s.
    fn keeps_key_order(&self) -> bool {
        true
    }

    fn tells_arrivals(&self) -> bool {
        true
    }
}

breakwater_queue::conformance_tests!(Log::new());
