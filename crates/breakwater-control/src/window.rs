//! Bucketed rolling window: O(1) per recorded event, bounded memory.
//!
//! A window of length `W` is a ring of `n` buckets, each covering `W / n`
//! milliseconds of the breaker's clock (milliseconds since the breaker was
//! built). Every slot remembers the bucket number ("epoch") it holds; a slot
//! whose epoch is not the one being written is stale and is reset on the
//! spot, so recording never sweeps the ring and an idle stretch costs nothing.
//! Reading sums the slots whose epoch lies in the last `n` buckets: O(n), done
//! by the controller tick, not per event.
//!
//! The window therefore covers between `(n - 1)/n * W` and `W` of history
//! (the current bucket is partial). Time that goes backwards is treated as
//! the latest time seen, so a clock hiccup can never corrupt the ring.

use std::time::{Duration, Instant};

/// Bucket count per window: 30 buckets keep the error under 1/30 of the window.
pub(crate) const BUCKETS: u64 = 30;

/// Milliseconds from `origin` to `now` (0 when `now` is earlier).
pub(crate) fn millis_since(origin: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX)
}

/// What one bucket accumulates.
pub(crate) trait Bucket: Copy + Default {
    /// Adds `other` into `self`.
    fn merge(&mut self, other: &Self);
}

#[derive(Debug, Clone, Copy)]
struct Slot<B> {
    epoch: u64,
    data: B,
}

/// A ring of `n` buckets covering a window; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct RollingWindow<B> {
    slots: Box<[Slot<B>]>,
    bucket_ms: u64,
    latest: u64,
}

const EMPTY: u64 = u64::MAX;

impl<B: Bucket> RollingWindow<B> {
    /// A window of `window` split into about [`BUCKETS`] buckets (at least 1 ms each).
    pub(crate) fn new(window: Duration) -> Self {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        let bucket_ms = (window_ms / BUCKETS).max(1);
        let n = window_ms.div_ceil(bucket_ms).max(1);
        let slots = (0..n)
            .map(|_| Slot {
                epoch: EMPTY,
                data: B::default(),
            })
            .collect();
        Self {
            slots,
            bucket_ms,
            latest: 0,
        }
    }

    fn epoch(&mut self, now_ms: u64) -> u64 {
        let e = now_ms / self.bucket_ms;
        self.latest = self.latest.max(e);
        self.latest
    }

    /// Applies `f` to the bucket of `now_ms`.
    pub(crate) fn record(&mut self, now_ms: u64, f: impl FnOnce(&mut B)) {
        let e = self.epoch(now_ms);
        let len = self.slots.len() as u64;
        // `e % len < len <= usize::MAX` because `slots` is a live allocation.
        let idx = usize::try_from(e % len).unwrap_or(0);
        if let Some(slot) = self.slots.get_mut(idx) {
            if slot.epoch != e {
                *slot = Slot {
                    epoch: e,
                    data: B::default(),
                };
            }
            f(&mut slot.data);
        }
    }

    /// Sum of the buckets inside the window ending at `now_ms`.
    pub(crate) fn sum(&self, now_ms: u64) -> B {
        let cur = (now_ms / self.bucket_ms).max(self.latest);
        let len = self.slots.len() as u64;
        let mut acc = B::default();
        for s in self.slots.iter() {
            if s.epoch != EMPTY && s.epoch <= cur && cur - s.epoch < len {
                acc.merge(&s.data);
            }
        }
        acc
    }

    /// Forgets everything recorded.
    pub(crate) fn clear(&mut self) {
        for s in self.slots.iter_mut() {
            s.epoch = EMPTY;
            s.data = B::default();
        }
    }
}

/// A plain counter bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Count(pub(crate) u64);

impl Bucket for Count {
    fn merge(&mut self, other: &Self) {
        self.0 = self.0.saturating_add(other.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> RollingWindow<Count> {
        RollingWindow::new(Duration::from_secs(60)) // 2 s buckets, 30 slots
    }

    #[test]
    fn sums_inside_the_window_only() {
        let mut w = w();
        w.record(0, |c| c.0 += 1);
        w.record(1_000, |c| c.0 += 2);
        w.record(30_000, |c| c.0 += 4);
        assert_eq!(w.sum(30_000), Count(7));
        // At 60 s the bucket of t = 0..2 s has left the window.
        assert_eq!(w.sum(60_000), Count(4));
        assert_eq!(w.sum(200_000), Count(0));
    }

    #[test]
    fn stale_slots_are_reset_on_write() {
        let mut w = w();
        w.record(0, |c| c.0 += 5);
        // Same slot index one full ring later.
        w.record(60_000, |c| c.0 += 1);
        assert_eq!(w.sum(60_000), Count(1));
    }

    #[test]
    fn time_going_backwards_counts_as_latest() {
        let mut w = w();
        w.record(10_000, |c| c.0 += 1);
        w.record(0, |c| c.0 += 1);
        assert_eq!(w.sum(10_000), Count(2));
        assert_eq!(w.sum(0), Count(2));
    }

    #[test]
    fn clear_forgets() {
        let mut w = w();
        w.record(10, |c| c.0 += 1);
        w.clear();
        assert_eq!(w.sum(10), Count(0));
    }

    #[test]
    fn tiny_windows_still_work() {
        let mut w: RollingWindow<Count> = RollingWindow::new(Duration::ZERO);
        w.record(5, |c| c.0 += 1);
        assert_eq!(w.sum(5), Count(1));
        assert_eq!(w.sum(6), Count(0));
    }
}
