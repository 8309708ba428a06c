//! `queue migrate`: an embedded SQLite store moved into a log store keeps
//! its queued messages (with their attempts), its dead letters (with their
//! reasons) and its applied event ids; a second run moves nothing twice.

use std::time::Duration;

use breakwater_queue::{DeadLetterReason, DlqPage, Enqueued, NewMessage, Queue};
use breakwater_queue_embedded::{EmbeddedConfig, EmbeddedQueue};
use breakwater_queue_log::{LogConfig, LogQueue, Migrated};

const LEASE: Duration = Duration::from_secs(60);

fn message(event: &str) -> NewMessage {
    NewMessage {
        source: "stripe".into(),
        event_id: event.into(),
        entity_key: Some(format!("order-{event}")),
        headers: vec![("content-type".into(), "application/json".into())],
        body: bytes::Bytes::from(format!("{{\"id\":\"{event}\"}}")),
        received_at_ms: 1_700_000_000_000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_store_moves_in_whole_and_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let old = EmbeddedQueue::open(&EmbeddedConfig::at(dir.path())).expect("embedded");
        for i in 0..5 {
            old.enqueue(message(&format!("e{i}")))
                .await
                .expect("enqueue");
        }
        let claimed = old.claim(3, LEASE).await.expect("claim");
        old.ack(&claimed[0].receipt).await.expect("ack");
        let reason = DeadLetterReason {
            class: "permanent".into(),
            error: "22P02 bad input".into(),
        };
        old.dead_letter(&claimed[1].receipt, &reason)
            .await
            .expect("dlq");
        old.retry_later(&claimed[2].receipt, Duration::ZERO, "lock timeout")
            .await
            .expect("retry");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let log = LogQueue::open(&LogConfig::at(dir.path())).expect("log");
    let sqlite = dir.path().join("queue.db");
    let mut seen_progress = 0;
    let moved = log
        .migrate_from_embedded(&sqlite, |_| seen_progress += 1)
        .await
        .expect("migrate");
    assert_eq!(
        moved,
        Migrated {
            queued: 3,
            dead: 1,
            applied_ids: 1,
            skipped: 0
        }
    );
    assert_eq!(seen_progress, 1, "one chunk");

    let again = log
        .migrate_from_embedded(&sqlite, |_| {})
        .await
        .expect("again");
    assert_eq!((again.queued, again.dead, again.skipped), (0, 0, 5));

    let mut got = log.claim(10, LEASE).await.expect("claim");
    got.sort_by(|a, b| a.message.event_id.cmp(&b.message.event_id));
    let ids: Vec<(&str, u32)> = got
        .iter()
        .map(|d| (d.message.event_id.as_str(), d.message.attempts))
        .collect();
    assert_eq!(ids, vec![("e2", 1), ("e3", 0), ("e4", 0)]);
    assert_eq!(&got[1].message.body[..], b"{\"id\":\"e3\"}");
    assert_eq!(got[1].message.headers, message("e3").headers);

    let dead = log.dlq_list(&DlqPage::first(10)).await.expect("dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].event_id.as_str(), dead[0].class.as_str()),
        ("e1", "permanent")
    );
    for applied_or_dead in ["e0", "e1"] {
        let r = log
            .enqueue(message(applied_or_dead))
            .await
            .expect("enqueue");
        assert!(
            matches!(r, Enqueued::Duplicate { .. }),
            "{applied_or_dead}: {r:?}"
        );
    }
}
