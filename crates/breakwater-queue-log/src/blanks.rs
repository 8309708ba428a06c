//! Blank segments, zero-filled ahead while the writer idles, so that a
//! burst writes only its webhooks until they run out.
//!
//! A queue that keeps every webhook until it is consumed grows, and on
//! ext4 each new segment costs its size in zeros first (an `fallocate`d
//! one costs a journal commit per `fdatasync` instead:
//! docs/measurements.md). Settled segments kept free cost none, but only
//! once the store has drained; on a fresh store, or a queue that only
//! grows, every roll during a flood needs zeros written beside the group
//! commits, and they take half the disk's bandwidth from them. PostgreSQL
//! keeps its next WAL segments ready for the same reason (`min_wal_size`).
//!
//! So while there are fewer than `free_segments` free and blank segments
//! together, one thread at a time makes blank ones (`blank-<n>.log`,
//! [`segment::make_blank`]), a 256 KiB chunk at a time and only while the
//! writer has written nothing and had no group under way for [`IDLE`]: a
//! burst that starts meanwhile waits behind one chunk at most, a slow
//! sync never has zeros queued in front of it, and the zeroing waits for
//! the next quiet moment. A blank is made only while the disk keeps room
//! for a segment more besides it. At a roll with no free segment, a blank
//! becomes the next segment ([`segment::reuse_blank`]): renamed, a
//! header written, no zeros. A stop or a crash leaves at most a
//! `blank-<n>.part`, deleted at start.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::pace::WriterProgress;
use crate::{segment, telemetry};

/// How long the writer must have written nothing before a chunk of a
/// blank is written: longer than the gap between groups under any steady
/// load worth the name (150 webhooks/s makes a group every 7 ms).
const IDLE: Duration = Duration::from_millis(50);

/// The wait after a failed attempt (the disk full, say) before the next.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// The blank segments ready, and the thread making more.
pub(crate) struct Blanks {
    dir: PathBuf,
    size: u64,
    stock: Arc<Mutex<Stock>>,
    making: Option<Making>,
    /// No attempt before this, after one failed.
    retry_at: Option<Instant>,
}

/// What the writer and the thread making blanks share.
#[derive(Debug, Default)]
struct Stock {
    /// Ready, by number, oldest first.
    ready: Vec<u64>,
    /// The number of the next blank.
    next: u64,
    /// How many the writer wants ready.
    want: usize,
    /// A thread is making blanks. It stops only once `ready` holds `want`,
    /// checked under the same lock as a new `want` is set, so blanks taken
    /// while it works are made too. Until 2026-12-07 a thread made only
    /// those missing when it started, and the next top-up waited for the
    /// writer's next group: an idle store refilled one blank of eight
    /// after a flood.
    making: bool,
}

struct Making {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<io::Result<()>>,
}

impl Blanks {
    /// The blanks in `dir` at start: parts cut short are deleted, and so
    /// are blanks of another size than `size` and those past `keep`.
    pub(crate) fn open(dir: &Path, size: u64, keep: usize) -> Self {
        if let Err(e) = segment::remove_blank_parts(dir) {
            tracing::warn!(error = %e, "cannot delete the queue's unfinished blank segments");
        }
        let found = segment::list_blank(dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the queue's blank segments");
            Vec::new()
        });
        let next = found.last().map_or(1, |n| n + 1);
        let mut ready = Vec::new();
        for number in found {
            let path = segment::blank_path(dir, number);
            let usable =
                ready.len() < keep && std::fs::metadata(&path).is_ok_and(|m| m.len() == size);
            if usable {
                ready.push(number);
            } else if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(error = %e, path = %path.display(), "cannot delete a blank queue segment");
            }
        }
        Self {
            dir: dir.to_owned(),
            size,
            stock: Arc::new(Mutex::new(Stock {
                ready,
                next,
                ..Stock::default()
            })),
            making: None,
            retry_at: None,
        }
    }

    /// Blank segments ready.
    pub(crate) fn len(&self) -> usize {
        lock(&self.stock).ready.len()
    }

    /// The oldest blank segment ready, taken out of the pool.
    pub(crate) fn take(&mut self) -> Option<u64> {
        let mut stock = lock(&self.stock);
        (!stock.ready.is_empty()).then(|| stock.ready.remove(0))
    }

    /// Has blanks made until `want` are ready: a thread already at it
    /// goes on to the new count; else one starts, unless the last attempt
    /// failed less than [`RETRY_AFTER`] ago. Cheap enough for after every
    /// group.
    pub(crate) fn top_up(&mut self, want: usize, progress: &Arc<WriterProgress>) {
        {
            let mut stock = lock(&self.stock);
            stock.want = want;
            if stock.making || stock.ready.len() >= want {
                return;
            }
        }
        // The last thread, if any, has stopped (or is about to): hear
        // how it ended.
        if let Some(making) = self.making.take() {
            match making.handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.failed(&e.to_string()),
                Err(_) => self.failed("the blank segment thread panicked"),
            }
        }
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        lock(&self.stock).making = true;
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, size) = (self.dir.clone(), self.size);
        let stock = Arc::clone(&self.stock);
        let mut idle = IdleWait::new(Arc::clone(progress), Arc::clone(&stop));
        let made = std::thread::Builder::new()
            .name("queue-blank".into())
            .spawn(move || {
                let _done = Done(&stock);
                make(&dir, size, &stock, &mut idle)
            });
        match made {
            Ok(handle) => self.making = Some(Making { stop, handle }),
            Err(e) => {
                lock(&self.stock).making = false;
                self.failed(&e.to_string());
            }
        }
    }

    /// Stops the thread making blanks, if any, and waits for it (a chunk
    /// at most): what it was making is deleted.
    pub(crate) fn stop(&mut self) {
        if let Some(making) = self.making.take() {
            making.stop.store(true, Ordering::Relaxed);
            making.handle.thread().unpark();
            let _ = making.handle.join();
        }
    }

    fn failed(&mut self, error: &str) {
        tracing::warn!(
            error,
            retry_in_secs = RETRY_AFTER.as_secs(),
            "cannot make a blank queue segment ahead"
        );
        self.retry_at = Some(Instant::now() + RETRY_AFTER);
    }
}

fn lock(stock: &Mutex<Stock>) -> MutexGuard<'_, Stock> {
    stock.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks the stock as no longer being made when the thread making it
/// ends, however it ends.
struct Done<'a>(&'a Mutex<Stock>);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        lock(self.0).making = false;
    }
}

/// Makes blanks one after another until the stock holds as many as the
/// writer wants (read before each, so blanks taken meanwhile are made
/// too), each only while the disk keeps a segment's room more besides
/// it.
fn make(dir: &Path, size: u64, stock: &Mutex<Stock>, idle: &mut IdleWait) -> io::Result<()> {
    loop {
        {
            let mut stock = lock(stock);
            if stock.ready.len() >= stock.want {
                // Under the lock a top-up raising `want` also reads: it
                // starts the next thread, this one is done.
                stock.making = false;
                return Ok(());
            }
        }
        if !idle.wait() {
            return Ok(());
        }
        let number = {
            let mut stock = lock(stock);
            stock.next += 1;
            stock.next - 1
        };
        let available = available_bytes(dir)?;
        if available < size.saturating_mul(2) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("{available} bytes available, less than two segments"),
            ));
        }
        if !segment::make_blank(dir, number, size, || idle.wait())? {
            return Ok(());
        }
        lock(stock).ready.push(number);
        metrics::counter!(telemetry::QUEUE_SEGMENTS_MADE_AHEAD).increment(1);
    }
}

/// Bytes an unprivileged writer may still use on the file system of
/// `dir`.
fn available_bytes(dir: &Path) -> io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Waits for the writer to be idle: its position unmoved and no group
/// under way for [`IDLE`]. A group whose `fdatasync` is slow leaves the
/// position unmoved too: zeros written then would queue in front of that
/// sync and make it slower still, and until 2026-12-07 they did, a chunk
/// after another for as long as the sync lasted (a 55 ms group grew into
/// 159 and 575 ms ones under `bench ingress` at half load).
struct IdleWait {
    progress: Arc<WriterProgress>,
    stop: Arc<AtomicBool>,
    /// The writer's position when it was last seen idle.
    idle_at: Option<u64>,
}

impl IdleWait {
    fn new(progress: Arc<WriterProgress>, stop: Arc<AtomicBool>) -> Self {
        Self {
            progress,
            stop,
            idle_at: None,
        }
    }

    /// Returns at once while the writer has neither moved nor begun a
    /// group since it was last seen idle, else once it has done neither
    /// for [`IDLE`]; false when asked to stop (the stopper unparks this
    /// thread).
    fn wait(&mut self) -> bool {
        let mut at = self.progress.at();
        if self.idle_at == Some(at) && !self.progress.in_group() {
            return !self.stopped();
        }
        loop {
            let since = Instant::now();
            while since.elapsed() < IDLE && !self.stopped() {
                std::thread::park_timeout(IDLE.saturating_sub(since.elapsed()));
            }
            if self.stopped() {
                return false;
            }
            let now = self.progress.at();
            if now == at && !self.progress.in_group() {
                self.idle_at = Some(now);
                return true;
            }
            at = now;
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_writer_lets_the_zeros_go_on_and_a_busy_one_holds_them() {
        let progress = Arc::new(WriterProgress::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut idle = IdleWait::new(Arc::clone(&progress), Arc::clone(&stop));
        let started = Instant::now();
        assert!(idle.wait());
        assert!(
            started.elapsed() >= IDLE,
            "it waited for the writer to idle"
        );
        let again = Instant::now();
        assert!(idle.wait());
        assert!(again.elapsed() < IDLE, "still idle: no wait");

        // The writer moves: the next chunk waits until it stops moving.
        let writer = {
            let progress = Arc::clone(&progress);
            std::thread::spawn(move || {
                for at in 1..=10 {
                    progress.set(at * 100);
                    std::thread::sleep(IDLE / 10);
                }
            })
        };
        std::thread::sleep(IDLE / 10);
        assert!(idle.wait());
        assert!(writer.is_finished(), "no chunk while the writer moved");
        writer.join().expect("writer");
        assert_eq!(progress.at(), 1000);
    }

    #[test]
    fn a_group_stuck_in_its_sync_holds_the_zeros_though_its_position_is_unmoved() {
        let progress = Arc::new(WriterProgress::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut idle = IdleWait::new(Arc::clone(&progress), Arc::clone(&stop));
        assert!(idle.wait(), "an idle writer lets a chunk go");

        // A group begins and its sync takes 4 x IDLE: the position stays
        // where it was, as the writer's does until the sync returns.
        progress.begin_group();
        let writer = {
            let progress = Arc::clone(&progress);
            std::thread::spawn(move || {
                std::thread::sleep(IDLE * 4);
                progress.set(4096);
            })
        };
        let started = Instant::now();
        assert!(idle.wait());
        assert_eq!(
            progress.at(),
            4096,
            "no chunk while the group was under way"
        );
        assert!(
            started.elapsed() >= IDLE * 5,
            "then the writer had to idle for IDLE: {:?}",
            started.elapsed()
        );
        writer.join().expect("writer");
    }

    #[test]
    fn a_stop_ends_the_wait() {
        let progress = Arc::new(WriterProgress::default());
        let stop = Arc::new(AtomicBool::new(true));
        assert!(!IdleWait::new(progress, stop).wait());
    }

    #[test]
    fn blanks_of_another_size_parts_and_those_past_the_count_are_deleted_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let size = 8192;
        for (number, len) in [(1, size), (2, size), (3, 4096), (4, size)] {
            std::fs::write(segment::blank_path(dir.path(), number), vec![0; len]).expect("write");
        }
        std::fs::write(dir.path().join("blank-0000000000000005.part"), b"").expect("write");
        let mut blanks = Blanks::open(dir.path(), size as u64, 2);
        assert_eq!(blanks.len(), 2);
        assert_eq!(blanks.take(), Some(1));
        assert_eq!(blanks.take(), Some(2));
        assert_eq!(blanks.take(), None);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            left.len(),
            2,
            "only the two kept are left (taken is not deleted): {left:?}"
        );
        assert_eq!(
            lock(&blanks.stock).next,
            5,
            "numbers go on after the last found"
        );
    }

    #[test]
    fn blanks_are_made_up_to_the_count_while_the_writer_idles() {
        let dir = tempfile::tempdir().expect("tempdir");
        let progress = Arc::new(WriterProgress::default());
        let mut blanks = Blanks::open(dir.path(), 64 << 10, 2);
        blanks.top_up(2, &progress);
        let deadline = Instant::now() + Duration::from_secs(10);
        while blanks.len() < 2 && Instant::now() < deadline {
            std::thread::sleep(IDLE);
        }
        blanks.stop();
        assert_eq!(blanks.len(), 2);
        for number in [1, 2] {
            let bytes = std::fs::read(segment::blank_path(dir.path(), number)).expect("blank");
            assert_eq!(bytes.len(), 64 << 10);
            assert!(bytes.iter().all(|&b| b == 0), "a blank is zeros");
        }
        blanks.top_up(2, &progress);
        assert!(blanks.making.is_none(), "none missing, none made");
    }

    #[test]
    fn blanks_taken_while_the_thread_waits_are_made_too_with_no_later_top_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let size = 64 << 10;
        for number in 1..=3 {
            std::fs::write(segment::blank_path(dir.path(), number), vec![0; size]).expect("write");
        }
        let progress = Arc::new(WriterProgress::default());
        let mut blanks = Blanks::open(dir.path(), size as u64, 3);
        assert_eq!(blanks.len(), 3);

        // A flood: the writer takes all three, topping up after each
        // group, while busy, so the thread started at the first waits.
        progress.begin_group();
        for taken in 1..=3 {
            assert_eq!(blanks.take(), Some(taken));
            blanks.top_up(3, &progress);
        }
        // Then it idles for good: no group, no top-up.
        progress.set(4096);
        let deadline = Instant::now() + Duration::from_secs(10);
        while blanks.len() < 3 && Instant::now() < deadline {
            std::thread::sleep(IDLE);
        }
        assert_eq!(blanks.len(), 3, "the whole stock is made again");
        blanks.stop();
        assert_eq!(blanks.take(), Some(4), "numbered after the ones taken");
    }
}
