//! Segment recycling: a segment whose every message is settled becomes the
//! next segment (the same file, renamed, its header rewritten) instead of
//! a new zero-filled one, and its earlier life never reads as data: not
//! while the store runs, not after a restart, not after a recycling cut
//! short by a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use breakwater_queue::{NewMessage, Queue};
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

fn message(event: &str) -> NewMessage {
    NewMessage {
        source: "stripe".into(),
        event_id: event.into(),
        entity_key: Some(format!("order-{event}")),
        headers: vec![],
        body: Bytes::from(vec![b'x'; 1024]),
        received_at_ms: 1_700_000_000_000,
    }
}

/// The segment files in `dir`, by name: the file's inode and when it was
/// created (an inode number alone may be reused by a new file).
fn segments(dir: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_name().to_string_lossy().starts_with("segment-"))
        .map(|e| {
            let meta = e.metadata().expect("metadata");
            let born = meta.created().expect("creation time");
            (
                e.file_name().to_string_lossy().into_owned(),
                (meta.ino(), born),
            )
        })
        .collect()
}

/// Enqueues `events` and acks every one of them.
async fn enqueue_and_ack(q: &LogQueue, events: std::ops::Range<usize>) {
    for i in events {
        q.enqueue(message(&format!("e{i}"))).await.expect("enqueue");
    }
    for d in q.claim(100_000, LEASE).await.expect("claim") {
        q.ack(&d.receipt).await.expect("ack");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_segments_are_recycled_and_their_earlier_life_never_reads_as_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let q = open(&config).await;

    // Each round fills about two 64 KiB segments and settles them; every
    // segment file seen is remembered by inode and creation time.
    let mut inodes: BTreeMap<(u64, std::time::SystemTime), BTreeSet<String>> = BTreeMap::new();
    for round in 0..8 {
        enqueue_and_ack(&q, round * 100..round * 100 + 100).await;
        for (name, ino) in segments(dir.path()) {
            inodes.entry(ino).or_default().insert(name);
        }
    }
    let reused: Vec<_> = inodes.values().filter(|names| names.len() > 1).collect();
    assert!(
        !reused.is_empty(),
        "no file was recycled under another segment's name: {inodes:?}"
    );
    assert!(
        segments(dir.path()).len() <= 3,
        "settled segments are not left behind: {:?}",
        segments(dir.path())
    );

    // Some left queued, written into recycled files over their old frames.
    for i in 1000..1040 {
        q.enqueue(message(&format!("e{i}"))).await.expect("enqueue");
    }
    let live: BTreeSet<String> = (1000..1040).map(|i| format!("e{i}")).collect();
    drop(q);

    let q = open(&config).await;
    assert_eq!(queued(&q).await, live, "after a restart: only what is live");
    // Every settled id is still known: a redelivery is a duplicate.
    let again = q.enqueue(message("e17")).await.expect("enqueue");
    assert!(
        matches!(again, breakwater_queue::Enqueued::Duplicate { .. }),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycling_cut_short_before_the_new_header_is_dropped_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    {
        let q = open(&config).await;
        for i in 0..150 {
            q.enqueue(message(&format!("e{i}"))).await.expect("enqueue");
        }
    }
    let q = open(&config).await;
    let before = queued(&q).await;
    assert_eq!(before.len(), 150);
    drop(q);
    // A crash after the rename, before the header: the newest file holds
    // an older segment's header and frames.
    let names: Vec<String> = segments(dir.path()).into_keys().collect();
    let oldest = dir.path().join(&names[0]);
    let newest = dir.path().join("segment-0000000000000099.log");
    std::fs::copy(&oldest, &newest).expect("copy");

    let q = open(&config).await;
    assert_eq!(queued(&q).await, before, "nothing read twice or lost");
    drop(q);
    let q = open(&config).await;
    drop(q);
    assert!(!newest.exists(), "the cut-short segment is deleted");
}
