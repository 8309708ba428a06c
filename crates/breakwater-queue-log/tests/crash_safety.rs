//! The log store against what a crash or a disk leaves behind: a torn
//! last group (cut at every byte), a flipped bit mid-segment, a segment
//! whose creation was cut short, a group write that fails while it
//! carries messages forward, and a full filesystem (a small tmpfs, so
//! this one needs root; it fails, not skips, without it). Power loss is
//! `power_loss.rs`.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use breakwater_queue::{Enqueued, NewMessage, Queue, QueueError};
use breakwater_queue_log::disk::{FileSystem, GroupDisk};
use breakwater_queue_log::{LogConfig, LogQueue};
use bytes::Bytes;

mod common;

use common::{LEASE, open, queued};

fn config(dir: &Path) -> LogConfig {
    LogConfig {
        segment_bytes: 64 << 10,
        ..LogConfig::at(dir)
    }
}

fn message(event: &str, body: usize) -> NewMessage {
    NewMessage {
        source: "stripe".into(),
        event_id: event.into(),
        entity_key: Some(format!("order-{event}")),
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from(vec![b'x'; body]),
        received_at_ms: 1_700_000_000_000,
    }
}

/// Waits until no writer holds the store in `dir`: a dropped queue's
/// writer thread lets go of the lock last, once its files are closed.
async fn wait_released(dir: &Path) {
    let lock = std::fs::File::open(dir.join("lock")).expect("lock file");
    for _ in 0..500 {
        if lock.try_lock().is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store's lock was never released");
}

fn segment_file(dir: &Path) -> PathBuf {
    dir.join("segment-0000000000000001.log")
}

/// Where the written data of the first segment ends (every frame ends in
/// a non-zero byte).
fn data_end(dir: &Path) -> usize {
    let bytes = std::fs::read(segment_file(dir)).expect("segment");
    bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1)
}

fn copy_store(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name()))
            .unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
    }
}

fn ids(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("e{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_group_cut_at_every_byte_opens_with_only_whole_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = config(dir.path());
    {
        let q = open(&store).await;
        for i in 0..3 {
            q.enqueue(message(&format!("e{i}"), 64))
                .await
                .expect("enqueue");
        }
    }
    // Once the writer has let go: where the last group starts.
    wait_released(dir.path()).await;
    let before = data_end(dir.path());
    {
        let q = open(&store).await;
        let (a, b) = tokio::join!(q.enqueue(message("e3", 64)), q.enqueue(message("e4", 64)));
        a.expect("enqueue");
        b.expect("enqueue");
    }
    // Wait for the last writer to let go before reading its files.
    wait_released(dir.path()).await;
    let after = data_end(dir.path());
    let frame = (after - before) / 2;
    assert!(frame > 64, "two frames of one size: {before}..{after}");
    let whole = std::fs::read(segment_file(dir.path())).expect("segment");

    for cut in before..after {
        let scratch = tempfile::tempdir().expect("scratch");
        copy_store(dir.path(), scratch.path());
        let mut torn = whole.clone();
        torn[cut..after].fill(0);
        std::fs::write(segment_file(scratch.path()), &torn).expect("tear");

        let scratch_config = config(scratch.path());
        let q = open(&scratch_config).await;
        let expected = ids(0..3 + (cut - before) / frame);
        assert_eq!(queued(&q).await, expected, "cut at byte {}", cut - before);
        assert_eq!(
            q.open_report().torn_bytes > 0,
            !(cut - before).is_multiple_of(frame),
            "cut at byte {}: {:?}",
            cut - before,
            q.open_report()
        );
        // The store takes new records after the cut, and reads them back.
        let new = q.enqueue(message("e9", 64)).await.expect("enqueue after");
        assert!(matches!(new, Enqueued::New { .. }), "{new:?}");
        drop(q);
        let q = open(&scratch_config).await;
        let mut expected = expected;
        expected.insert("e9".to_owned());
        assert_eq!(queued(&q).await, expected, "reopened after cut at {cut}");
        assert_eq!(q.open_report().torn_bytes, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_mid_segment_costs_that_record_alone_and_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    {
        let q = open(&config).await;
        for i in 0..5 {
            q.enqueue(message(&format!("e{i}"), 200))
                .await
                .expect("enqueue");
        }
    }
    wait_released(dir.path()).await;
    let start = 16;
    let frame = (data_end(dir.path()) - start) / 5;
    let mut bytes = std::fs::read(segment_file(dir.path())).expect("segment");
    bytes[start + 2 * frame + frame / 2] ^= 0x04;
    std::fs::write(segment_file(dir.path()), &bytes).expect("flip");

    let q = open(&config).await;
    assert_eq!(q.open_report().corrupt_frames, 1, "{:?}", q.open_report());
    let mut expected = ids(0..5);
    expected.remove("e2");
    assert_eq!(queued(&q).await, expected);
    drop(q);
    wait_released(dir.path()).await;
    let inspected = breakwater_queue_log::inspect(dir.path()).expect("inspect");
    assert_eq!(inspected.corrupt_frames, 1);
}

/// A tmpfs of `size` mounted for the test, unmounted after.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        Self(dir)
    }

    fn resize(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.0.path())
            .status()
            .expect("run mount");
        assert!(status.success());
    }
}

impl Drop for Tmpfs {
    /// Unmounts, waiting a little for the store's threads (which a dropped
    /// queue lets finish on their own) to let go of their files.
    fn drop(&mut self) {
        for _ in 0..50 {
            let unmounted = std::process::Command::new("umount")
                .arg(self.0.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if unmounted {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_enqueues_loses_nothing_and_recovers_when_it_grows() {
    let disk = Tmpfs::mount("1m");
    let config = config(&disk.0.path().join("queue"));
    let q = LogQueue::open(&config).expect("open");
    let mut acknowledged = BTreeSet::new();
    let mut refused = 0;
    for i in 0..2_000 {
        let id = format!("e{i}");
        match q.enqueue(message(&id, 1024)).await {
            Ok(Enqueued::New { .. }) => {
                acknowledged.insert(id);
            }
            Ok(other) => panic!("{id}: {other:?}"),
            Err(QueueError::Storage(e)) => {
                refused += 1;
                assert!(e.contains("No space") || e.contains("space"), "{e}");
            }
            Err(e) => panic!("{id}: {e}"),
        }
    }
    assert!(refused > 0, "the disk never filled");
    assert!(!acknowledged.is_empty());
    // Room again: enqueues are taken.
    disk.resize("16m");
    q.enqueue(message("after", 1024))
        .await
        .expect("taken once there is room");
    acknowledged.insert("after".to_owned());
    drop(q);
    let q = open(&config).await;
    assert_eq!(
        queued(&q).await,
        acknowledged,
        "every acknowledged webhook is there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_whose_creation_was_cut_short_is_dropped_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    {
        let q = open(&config).await;
        q.enqueue(message("e0", 64)).await.expect("enqueue");
    }
    wait_released(dir.path()).await;
    // A crash between creating the next segment's file and its header.
    for stub in [Vec::new(), b"BWQLOG".to_vec()] {
        let next = dir.path().join("segment-0000000000000009.log");
        std::fs::write(&next, &stub).expect("stub");
        let q = open(&config).await;
        assert_eq!(queued(&q).await, ids(0..1));
        drop(q);
        wait_released(dir.path()).await;
        assert!(!next.exists(), "the unfinished segment is deleted");
    }
}

/// Writes that fail while `failing` is set, as a disk that returns EIO.
#[derive(Debug, Default)]
struct FailingDisk {
    failing: AtomicBool,
}

impl GroupDisk for FailingDisk {
    fn write_at(&self, segment: u64, file: &File, buf: &[u8], at: u64) -> std::io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected EIO"));
        }
        FileSystem.write_at(segment, file, buf, at)
    }

    fn sync_data(&self, segment: u64, file: &File) -> std::io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected EIO"));
        }
        FileSystem.sync_data(segment, file)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_that_carried_messages_forward_leaves_them_where_they_were() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let disk = Arc::new(FailingDisk::default());
    let q = LogQueue::open_on(&config, disk.clone()).expect("open");
    // 12 KiB bodies: five to a 64 KiB segment. Two live in the first keep
    // it over a quarter live (no carry); one live is carried forward.
    for i in 0..8 {
        q.enqueue(message(&format!("e{i}"), 12 << 10))
            .await
            .expect("enqueue");
    }
    let claimed = q.claim(100, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 8);
    let (keep, last) = (&claimed[0], &claimed[1]);
    for d in &claimed[2..] {
        q.ack(&d.receipt).await.expect("ack");
    }
    q.release(&keep.receipt, Duration::ZERO)
        .await
        .expect("release");
    // The ack that leaves `keep` alone in its segment: its group carries
    // `keep` forward, and its write fails.
    disk.failing.store(true, Ordering::SeqCst);
    let failed = q.ack(&last.receipt).await;
    assert!(matches!(failed, Err(QueueError::Storage(_))), "{failed:?}");
    disk.failing.store(false, Ordering::SeqCst);
    q.enqueue(message("after", 64)).await.expect("enqueue");
    let expected = BTreeSet::from(["e0".to_owned(), "after".to_owned()]);
    let got = q.claim(10, LEASE).await.expect("claim");
    let events: BTreeSet<String> = got.iter().map(|d| d.message.event_id.clone()).collect();
    assert_eq!(events, expected);
    let kept = got
        .iter()
        .find(|d| d.message.event_id == "e0")
        .expect("kept");
    assert_eq!(kept.message.body, keep.message.body);
    drop(got);
    drop(q);
    let q = open(&config).await;
    assert_eq!(queued(&q).await, expected, "after a restart too");
}
