//! The page cache the log leaves behind (`queue.cache_bytes`): what lies
//! far behind the writer leaves the cache, at start too; a backlog let go
//! of drains whole, read back from disk; and a segment let go of is never
//! written into again. Residency is read with util-linux's `fincore`.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use breakwater_queue::{NewMessage, Queue};
use breakwater_queue_log::LogConfig;
use bytes::Bytes;

mod common;

use common::{LEASE, open, queued};

const SEGMENT: u64 = 64 << 10;
/// About 36 segments of 1 KiB webhooks.
const WEBHOOKS: usize = 2_000;

fn config(dir: &Path, cache_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT,
        cache_bytes,
        ..LogConfig::at(dir)
    }
}

/// A body that says whose it is, so a record read back from the wrong
/// place shows.
fn body(event: &str) -> Bytes {
    let mut b = format!("{event};").repeat(1024 / (event.len() + 1) + 1);
    b.truncate(1024);
    Bytes::from(b)
}

fn message(event: &str) -> NewMessage {
    NewMessage {
        source: "stripe".into(),
        event_id: event.into(),
        entity_key: None,
        headers: vec![],
        body: body(event),
        received_at_ms: 1_700_000_000_000,
    }
}

async fn enqueue(q: &impl Queue, events: std::ops::Range<usize>) {
    for i in events {
        q.enqueue(message(&format!("e{i}"))).await.expect("enqueue");
    }
}

/// The store's segment files, oldest first.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("segment-"))
        })
        .collect();
    files.sort();
    files
}

/// Bytes of each file in the page cache, by `fincore`.
fn resident(files: &[PathBuf]) -> Vec<u64> {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "--output", "RES"])
        .args(files)
        .output()
        .expect("fincore (util-linux) runs");
    assert!(out.status.success(), "fincore: {out:?}");
    let resident: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().expect("a byte count"))
        .collect();
    assert_eq!(resident.len(), files.len(), "one line a file");
    resident
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_lies_far_behind_the_writer_leaves_the_page_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = open(&config(dir.path(), 256 << 10)).await;
    enqueue(&q, 0..WEBHOOKS).await;

    let files = segment_files(dir.path());
    assert!(files.len() > 30, "{} segments", files.len());
    let cached = resident(&files);
    let oldest = &cached[..10];
    let newest = &cached[cached.len() - 4..];
    assert!(
        oldest.iter().all(|&r| r == 0),
        "the oldest segments, megabytes behind the writer, are out of the cache: {cached:?}"
    );
    assert!(
        newest.iter().all(|&r| r > 0),
        "the newest 256 KiB stay cached: {cached:?}"
    );
    let total: u64 = cached.iter().sum();
    assert!(
        total < (256 << 10) + (1 << 20) + 4 * SEGMENT,
        "about cache_bytes cached, a step over at most: {total} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_bound_everything_written_stays_cached_until_a_start_with_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = open(&config(dir.path(), 0)).await;
    enqueue(&q, 0..WEBHOOKS).await;
    let files = segment_files(dir.path());
    let cached = resident(&files);
    assert!(
        cached.iter().all(|&r| r > 0),
        "cache_bytes = 0 lets go of nothing: {cached:?}"
    );
    drop(q);

    // Start reads every segment; a bound then lets go of the old ones.
    let q = open(&config(dir.path(), 256 << 10)).await;
    let cached = resident(&files);
    assert!(
        cached[..10].iter().all(|&r| r == 0),
        "after a start with a bound, the oldest are out of the cache: {cached:?}"
    );
    let all: BTreeSet<String> = (0..WEBHOOKS).map(|i| format!("e{i}")).collect();
    assert_eq!(queued(&q).await, all, "every webhook is still queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_let_go_of_drains_whole_and_its_segments_are_never_reused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = open(&config(dir.path(), 256 << 10)).await;
    enqueue(&q, 0..WEBHOOKS).await;
    let files = segment_files(dir.path());
    let cached = resident(&files);
    let let_go: BTreeSet<(u64, std::time::SystemTime)> = files
        .iter()
        .zip(&cached)
        .filter(|(_, r)| **r == 0)
        .map(|(f, _)| {
            let meta = std::fs::metadata(f).expect("metadata");
            (meta.ino(), meta.created().expect("creation time"))
        })
        .collect();
    assert!(let_go.len() >= 10, "{cached:?}");

    // The drain reads the let-go records back from disk: every body is
    // its own, every webhook once.
    let mut seen = BTreeSet::new();
    loop {
        let batch = q.claim(500, LEASE).await.expect("claim");
        if batch.is_empty() {
            break;
        }
        for d in batch {
            assert_eq!(
                d.message.body,
                body(&d.message.event_id),
                "{}",
                d.message.event_id
            );
            assert!(seen.insert(d.message.event_id.clone()), "twice");
            q.ack(&d.receipt).await.expect("ack");
        }
    }
    assert_eq!(seen.len(), WEBHOOKS);

    // A burst after the drain: settled segments are recycled or kept
    // free for it, but none that was let go of.
    enqueue(&q, 10_000..10_400).await;
    let alive: BTreeSet<(u64, std::time::SystemTime)> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").metadata().expect("metadata"))
        .map(|m| (m.ino(), m.created().expect("creation time")))
        .collect();
    let reused: Vec<_> = let_go.intersection(&alive).collect();
    assert!(
        reused.is_empty(),
        "a segment let go of lives on under another name: {reused:?}"
    );
}
