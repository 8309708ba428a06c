//! How fast the next segment's zeros are written: no faster than needed
//! to have it ready well before the writer reaches the end of the
//! current one.
//!
//! Zeros written at the disk's full speed put megabytes of writeback in
//! front of every group commit's `fdatasync` while they last. Spread over
//! the time the current segment takes to fill, they put about one chunk
//! (`segment::ZEROS`, 256 KiB) there at a time. The rule, after each
//! chunk: at the writer's rate (the faster of its rate since the zeroing
//! began and since the last chunk), the current segment fills in
//! `time_left`; the zeroing aims to end in half of that, so it waits after
//! a chunk for whatever the chunk took less than its share
//! (`time_left / 2 / chunks_left`), never more than [`MAX_DELAY`]. A
//! writer that has to roll before the zeros are done asks for them at full
//! speed ([`Pacer::hurry`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest wait after a chunk: an idle writer still gets its next
/// 64 MiB segment within about 256 x 5 ms (256 KiB chunks).
const MAX_DELAY: Duration = Duration::from_millis(5);

/// The wait after a chunk of zeros that took `took`, when the writer is
/// `remaining` bytes from the end of the current segment and has written
/// `rate` bytes a second, with `chunks_left` chunks still to write.
fn chunk_delay(remaining: u64, rate: f64, chunks_left: u64, took: Duration) -> Duration {
    if chunks_left == 0 {
        return Duration::ZERO;
    }
    let time_left = if rate > 0.0 {
        remaining as f64 / rate
    } else {
        f64::INFINITY
    };
    let share = time_left / 2.0 / chunks_left as f64;
    let wait = (share - took.as_secs_f64()).max(0.0);
    Duration::from_secs_f64(wait.min(MAX_DELAY.as_secs_f64()))
}

/// What the writer shares with the threads writing zeros beside it: the
/// one making its next segment, and the one making blanks
/// ([`crate::blanks`]).
#[derive(Debug, Default)]
pub(crate) struct WriterProgress {
    /// Where the writer's next group starts in the current segment.
    at: AtomicU64,
    /// A group is being applied, written or synced: its position has not
    /// moved yet, but the writer is not idle.
    in_group: AtomicBool,
    /// The writer is waiting for the segment: no more pacing.
    hurry: AtomicBool,
}

impl WriterProgress {
    /// Records where the writer's next group starts, its group done.
    pub(crate) fn set(&self, at: u64) {
        self.at.store(at, Ordering::Relaxed);
        self.in_group.store(false, Ordering::Relaxed);
    }

    /// Records that the writer has started a group; [`Self::set`] ends it.
    pub(crate) fn begin_group(&self) {
        self.in_group.store(true, Ordering::Relaxed);
    }

    /// Whether a group is under way: a slow `fdatasync` leaves the
    /// position unmoved for as long as it takes.
    pub(crate) fn in_group(&self) -> bool {
        self.in_group.load(Ordering::Relaxed)
    }

    /// Where the writer's next group starts: it moves with every group
    /// written.
    pub(crate) fn at(&self) -> u64 {
        self.at.load(Ordering::Relaxed)
    }

    /// Asks the segment being made to be finished at full speed.
    pub(crate) fn hurry(&self) {
        self.hurry.store(true, Ordering::Relaxed);
    }
}

/// Paces one segment's zeros against the writer's progress in a current
/// segment of `size` bytes. The writer's rate is the faster of its rate
/// since the zeroing began and since the last chunk, so a burst that
/// starts meanwhile speeds the zeros up at the next chunk.
pub(crate) struct Pacer {
    progress: Arc<WriterProgress>,
    size: u64,
    started: (Instant, u64),
    last: (Instant, u64),
}

impl Pacer {
    pub(crate) fn new(progress: Arc<WriterProgress>, size: u64) -> Self {
        progress.hurry.store(false, Ordering::Relaxed);
        let now = (Instant::now(), progress.at.load(Ordering::Relaxed));
        Self {
            progress,
            size,
            started: now,
            last: now,
        }
    }

    /// The wait the rule asks for after a chunk that took `took`, with
    /// `chunks_left` to go: none once the writer is in a hurry.
    pub(crate) fn delay(&mut self, took: Duration, chunks_left: u64) -> Duration {
        if self.progress.hurry.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let now = (Instant::now(), self.progress.at.load(Ordering::Relaxed));
        let rate = rate(self.started, now).max(rate(self.last, now));
        self.last = now;
        chunk_delay(self.size.saturating_sub(now.1), rate, chunks_left, took)
    }
}

/// Bytes a second the writer moved from `from` to `to`.
fn rate(from: (Instant, u64), to: (Instant, u64)) -> f64 {
    let secs = to.0.saturating_duration_since(from.0).as_secs_f64();
    if secs > 0.0 {
        to.1.saturating_sub(from.1) as f64 / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn zeros_end_in_half_the_time_the_writer_takes_to_fill_the_segment() {
        // 48 MiB left at 96 MiB/s: 0.5 s left, so 64 chunks share 0.25 s.
        let d = chunk_delay(48 * MIB, 96.0 * MIB as f64, 64, Duration::from_millis(2));
        let share = 0.25 / 64.0;
        assert!((d.as_secs_f64() - (share - 0.002)).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn a_chunk_slower_than_its_share_waits_for_nothing() {
        let d = chunk_delay(8 * MIB, 64.0 * MIB as f64, 64, Duration::from_millis(5));
        assert_eq!(d, Duration::ZERO);
    }

    #[test]
    fn an_idle_writer_gets_its_zeros_at_the_longest_wait_at_most() {
        assert_eq!(chunk_delay(60 * MIB, 0.0, 10, Duration::ZERO), MAX_DELAY);
        assert_eq!(
            chunk_delay(60 * MIB, 1.0, 10, Duration::from_millis(1)),
            MAX_DELAY
        );
        assert_eq!(chunk_delay(0, 0.0, 0, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_writer_rate_is_bytes_over_the_time_between_two_readings() {
        let t = Instant::now();
        let later = t + Duration::from_millis(500);
        assert_eq!(rate((t, 0), (later, 32 * MIB)), 64.0 * MIB as f64);
        assert_eq!(rate((t, 8), (t, 4096)), 0.0, "no time, no rate");
        assert_eq!(rate((t, 4096), (later, 16)), 0.0, "a roll is not a rate");
    }

    #[test]
    fn a_hurried_pacer_never_waits() {
        let progress = Arc::new(WriterProgress::default());
        progress.set(16 * MIB);
        let mut pacer = Pacer::new(Arc::clone(&progress), 64 * MIB);
        // The writer has not moved: an idle writer, the longest wait.
        assert_eq!(pacer.delay(Duration::ZERO, 48), MAX_DELAY);
        progress.hurry();
        assert_eq!(pacer.delay(Duration::ZERO, 48), Duration::ZERO);
        // A new segment's pacer starts unhurried.
        let mut next = Pacer::new(Arc::clone(&progress), 64 * MIB);
        assert_eq!(next.delay(Duration::ZERO, 48), MAX_DELAY);
    }
}
