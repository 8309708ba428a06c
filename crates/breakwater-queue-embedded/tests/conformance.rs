//! The queue contract's conformance suite on the embedded backend: each
//! check gets a store of its own in a temporary directory, reopened where
//! the check restarts the queue.

use std::sync::Arc;

use async_trait::async_trait;
use breakwater_queue::Queue;
use breakwater_queue::conformance::Harness;
use breakwater_queue_embedded::{EmbeddedConfig, EmbeddedQueue};

struct Embedded {
    dir: tempfile::TempDir,
}

impl Embedded {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
}

#[async_trait]
impl Harness for Embedded {
    async fn open(&self) -> Arc<dyn Queue> {
        Arc::new(EmbeddedQueue::open(&EmbeddedConfig::at(self.dir.path())).expect("open"))
    }
}

breakwater_queue::conformance_tests!(Embedded::new());
