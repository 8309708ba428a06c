//! A ceiling on the bytes of webhooks waiting for the writer: the channel
//! to it is bounded in messages (`max_pending`), and `max_pending` bodies of
//! the largest allowed size could otherwise wait in memory at once (16,384
//! x 1 MiB = 16 GiB at the defaults). Past the ceiling an enqueue is
//! refused as full, which the ingress answers with 503 and `Retry-After`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes that may wait for the writer, shared by every enqueue.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    used: Arc<AtomicUsize>,
    max: usize,
}

/// Bytes held by one waiting enqueue, given back when it is dropped (once
/// the writer has taken the message, or the enqueue was refused).
#[derive(Debug)]
pub struct Reserved {
    used: Arc<AtomicUsize>,
    bytes: usize,
}

impl ByteBudget {
    pub fn new(max: usize) -> Self {
        Self {
            used: Arc::new(AtomicUsize::new(0)),
            max: max.max(1),
        }
    }

    /// Reserves `bytes`, or `None` when they would pass the ceiling.
    pub fn reserve(&self, bytes: usize) -> Option<Reserved> {
        let before = self.used.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > self.max {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        }
        Some(Reserved {
            used: Arc::clone(&self.used),
            bytes,
        })
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_ceiling_and_come_back_when_dropped() {
        let budget = ByteBudget::new(1000);
        let a = budget.reserve(600).expect("room");
        assert!(budget.reserve(500).is_none(), "past the ceiling");
        assert_eq!(budget.used(), 600, "a refusal holds nothing");
        let b = budget.reserve(400).expect("room to the ceiling");
        drop(a);
        assert_eq!(budget.used(), 400);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
