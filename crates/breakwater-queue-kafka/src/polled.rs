//! A record as the pump took it from the consumer: where it is (partition
//! and offset), what Breakwater read of it, and its body. The pump's
//! buffers, the key lines and the claims all hold these.

use bytes::Bytes;

use crate::gate::Tp;
use crate::wire::{Foreign, Read};

/// A record taken from the consumer.
#[derive(Debug, Clone)]
pub(crate) struct Polled {
    pub(crate) tp: Tp,
    pub(crate) offset: i64,
    pub(crate) read: Result<Read, Foreign>,
    pub(crate) body: Bytes,
    pub(crate) timestamp_ms: Option<i64>,
}

impl Polled {
    /// When a retry tier's record is due (ms since the epoch; 0: now).
    pub(crate) fn due_at_ms(&self) -> i64 {
        self.read.as_ref().map_or(0, |r| r.not_before_ms)
    }

    /// Its entity key, when it has one (and could be read).
    pub(crate) fn entity_key(&self) -> Option<&str> {
        self.read.as_ref().ok()?.meta.entity_key.as_deref()
    }
}
