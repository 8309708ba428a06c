//! What the breaker and the ingress ask of SQS beyond the contract, read
//! from SQS's own answers (the local endpoint the test script starts,
//! `BREAKWATER_TEST_SQS_URL`): no receive while paused, and a pause waits
//! for a receive under way and hands back what it took; the redrive
//! policy's count read at start; a message past the queue's size limit
//! refused as too large; a message that is not Breakwater's dead-lettered
//! with its reason; bodies SQS cannot carry as text round-trip; a FIFO
//! queue keeps one key's messages in order. The endpoint being
//! unreachable is a failure, never a skip.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use breakwater_queue::{
    Delivery, DlqPage, Enqueued, Flow, NewMessage, OpenMode, Queue, QueueError,
};
use breakwater_queue_sqs::{Endpoint, SqsConfig, SqsQueue};
use bytes::Bytes;

fn endpoint() -> Endpoint {
    Endpoint::at(Some(
        std::env::var("BREAKWATER_TEST_SQS_URL").unwrap_or_else(|_| "http://127.0.0.1:4566".into()),
    ))
}

/// Queues of the test's own, deleted on drop.
struct QueueName(String);

impl QueueName {
    fn new(suffix: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self(format!(
            "bwbroker-{}-{}{suffix}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }
}

impl Drop for QueueName {
    fn drop(&mut self) {
        SqsQueue::destroy_blocking(&endpoint(), &self.0);
    }
}

async fn open(name: &QueueName, config: &SqsConfig) -> SqsQueue {
    SqsQueue::open(&endpoint(), &name.0, config, OpenMode::Serve)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the SQS endpoint {:?} is unreachable ({e}); these tests need it: \
                 scripts/test.sh starts one (CI={})",
                endpoint().url,
                std::env::var("CI").unwrap_or_default()
            )
        })
}

fn message(event_id: &str, key: &str, body: &[u8]) -> NewMessage {
    NewMessage {
        source: "broker-test".into(),
        event_id: event_id.into(),
        entity_key: Some(key.into()),
        headers: vec![],
        body: Bytes::copy_from_slice(body),
        received_at_ms: 1,
    }
}

async fn enqueue(q: &SqsQueue, m: NewMessage) {
    let r = q.enqueue(m).await.expect("enqueue");
    assert!(matches!(r, Enqueued::New { .. }), "{r:?}");
}

async fn claim_within(q: &SqsQueue, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "claimed {} of {n}", got.len());
        got.extend(
            q.claim(n - got.len(), Duration::from_secs(30))
                .await
                .expect("claim"),
        );
    }
    got
}

/// SQS's own count of messages received and not settled.
async fn not_visible(q: &SqsQueue) -> u64 {
    let client = endpoint().client().await;
    let o = client
        .get_queue_attributes()
        .queue_url(q.queue_url())
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("attributes");
    o.attributes()
        .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible))
        .and_then(|v| v.parse().ok())
        .expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_paused_nothing_is_received_and_a_pause_waits_for_a_receive_under_way() {
    let name = QueueName::new("");
    let q = std::sync::Arc::new(open(&name, &SqsConfig::default()).await);
    // A claim long-polling an empty queue when the pause comes: the pause
    // returns only once that receive is over, and what it took (a message
    // sent meanwhile) is handed back, not delivered.
    let polling = {
        let q = std::sync::Arc::clone(&q);
        tokio::spawn(async move { q.claim(10, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pausing = {
        let q = std::sync::Arc::clone(&q);
        tokio::spawn(async move { q.set_flow(Flow::Paused).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    enqueue(&q, message("during-poll", "k", b"{}")).await;
    pausing.await.expect("join").expect("pause");
    assert!(
        polling.is_finished(),
        "the pause returned with a receive under way"
    );
    let taken = polling.await.expect("join").expect("claim");
    assert!(
        taken.is_empty(),
        "delivered as the breaker opened: {taken:?}"
    );

    for i in 0..5 {
        enqueue(&q, message(&format!("paused-{i}"), "k", b"{}")).await;
    }
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        let got = q.claim(10, Duration::from_secs(30)).await.expect("claim");
        assert!(got.is_empty(), "delivered while paused: {got:?}");
        assert_eq!(
            not_visible(&q).await,
            0,
            "SQS handed a message out while paused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    q.set_flow(Flow::Flowing { limit: 16 })
        .await
        .expect("resume");
    let got = claim_within(&q, 6).await;
    for d in &got {
        let expected = if d.message.event_id == "during-poll" {
            2
        } else {
            1
        };
        assert_eq!(
            d.message.receives, expected,
            "{} was received while paused",
            d.message.event_id
        );
        q.ack(&d.receipt).await.expect("ack");
    }
}

#[tokio::test]
async fn the_redrive_policy_is_read_at_start() {
    let name = QueueName::new("");
    let config = SqsConfig {
        max_receive_count: 7,
        ..SqsConfig::default()
    };
    let q = open(&name, &config).await;
    assert_eq!(q.redelivery_limit(), Some(7));
    // An existing queue keeps its policy, whatever the config says now.
    let again = open(&name, &SqsConfig::default()).await;
    assert_eq!(again.redelivery_limit(), Some(7));
}

#[tokio::test]
async fn a_message_past_the_queue_s_size_limit_is_refused_as_too_large() {
    let name = QueueName::new("");
    let q = open(&name, &SqsConfig::default()).await;
    endpoint()
        .client()
        .await
        .set_queue_attributes()
        .queue_url(q.queue_url())
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .expect("set the size limit");
    let q = open(&name, &SqsConfig::default()).await;
    enqueue(&q, message("small", "k", &[b'a'; 500])).await;
    let refused = q.enqueue(message("big", "k", &[b'a'; 2000])).await;
    assert!(
        matches!(refused, Err(QueueError::TooLarge { max: 1024, .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_message_that_is_not_breakwater_s_is_dead_lettered_with_its_reason() {
    let name = QueueName::new("");
    let q = open(&name, &SqsConfig::default()).await;
    endpoint()
        .client()
        .await
        .send_message()
        .queue_url(q.queue_url())
        .message_body("hello from elsewhere")
        .send()
        .await
        .expect("send by hand");
    let got = q.claim(10, Duration::from_secs(30)).await.expect("claim");
    assert!(got.is_empty(), "a foreign message was delivered: {got:?}");
    let dead = q.dlq_list(&DlqPage::first(10)).await.expect("dlq list");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0].error.contains("not a Breakwater message"),
        "{:?}",
        dead[0]
    );
    let shown = q.dlq_show(&dead[0].id).await.expect("show");
    assert_eq!(shown.body.as_deref(), Some("hello from elsewhere"));
}

#[tokio::test]
async fn bodies_sqs_cannot_carry_as_text_round_trip() {
    let name = QueueName::new("");
    let q = open(&name, &SqsConfig::default()).await;
    let bodies: [&[u8]; 4] = [
        b"{\"a\":1}",
        b"\x00\x01\xff binary",
        b"",
        "\u{FFFF}".as_bytes(),
    ];
    for (i, body) in bodies.iter().enumerate() {
        enqueue(&q, message(&format!("body-{i}"), &format!("k{i}"), body)).await;
    }
    let got = claim_within(&q, bodies.len()).await;
    for d in got {
        let i: usize = d.message.event_id["body-".len()..].parse().expect("index");
        assert_eq!(&d.message.body[..], bodies[i], "body {i}");
    }
}

/// A FIFO queue hands one key's messages out in order, the next only once
/// the one before is settled, while another key's flow past it; and what
/// was sent is there after a reopen.
#[tokio::test]
async fn a_fifo_queue_keeps_one_key_in_order() {
    let name = QueueName::new(".fifo");
    {
        let q = open(&name, &SqsConfig::default()).await;
        for (id, key) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a")] {
            enqueue(&q, message(id, key, b"{}")).await;
        }
    }
    let q = open(&name, &SqsConfig::default()).await;
    // One key's message unsettled: none of that key comes out meanwhile,
    // while the other key's does.
    let first = claim_within(&q, 1).await.remove(0);
    let key = first.message.entity_key.clone().expect("a key");
    let meanwhile = q.claim(10, Duration::from_secs(30)).await.expect("claim");
    assert!(
        meanwhile
            .iter()
            .all(|d| d.message.entity_key.as_deref() != Some(key.as_str())),
        "key {key} handed out past its unsettled {}: {meanwhile:?}",
        first.message.event_id
    );
    if key == "a" {
        assert!(
            meanwhile.iter().any(|d| d.message.event_id == "b1"),
            "key b waited behind key a: {meanwhile:?}"
        );
    }
    let mut order = vec![first.message.event_id.clone()];
    q.ack(&first.receipt).await.expect("ack");
    for d in meanwhile {
        order.push(d.message.event_id.clone());
        q.ack(&d.receipt).await.expect("ack");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while order.len() < 4 {
        assert!(Instant::now() < deadline, "claimed {order:?}");
        for d in q.claim(1, Duration::from_secs(30)).await.expect("claim") {
            order.push(d.message.event_id.clone());
            q.ack(&d.receipt).await.expect("ack");
        }
    }
    let a: Vec<&String> = order.iter().filter(|id| id.starts_with('a')).collect();
    assert_eq!(a, ["a1", "a2", "a3"], "key a out of order: {order:?}");
    assert!(order.contains(&"b1".to_owned()));
}
