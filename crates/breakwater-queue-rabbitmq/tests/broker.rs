//! What the breaker asks of RabbitMQ, asserted from the broker's own
//! counters (`rabbitmqctl list_queues` / `list_consumers`, as root on the
//! test machine): while paused there is no consumer and nothing unacked
//! but what a worker was already applying; half-open the prefetch is the
//! probe count; the ramp raises it step by step. And a connection cut in
//! the middle (the fault proxy between the queue and the machine's broker,
//! which other tests share and must not be stopped) loses nothing: the
//! queue reconnects by itself, the cut delivery comes back, publishing
//! resumes. The broker being unreachable is a failure, never a skip.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use breakwater_faultproxy::{Fault, FaultProxy};
use breakwater_queue::{Enqueued, Flow, NewMessage, OpenMode, Queue, QueueError};
use breakwater_queue_rabbitmq::rabbitmqctl::{counts_become, prefetches, queue_counts};
use breakwater_queue_rabbitmq::{RabbitMqConfig, RabbitMqQueue};
use bytes::Bytes;

fn url() -> String {
    std::env::var("BREAKWATER_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Queues of the test's own, deleted on drop.
struct QueueName(String);

impl QueueName {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self(format!(
            "bwbroker-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }
}

impl Drop for QueueName {
    fn drop(&mut self) {
        RabbitMqQueue::destroy_blocking(&url(), &self.0);
    }
}

async fn open(url: &str, name: &QueueName, config: &RabbitMqConfig) -> RabbitMqQueue {
    RabbitMqQueue::open(url, &name.0, config, OpenMode::Serve)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RabbitMQ at {} is unreachable ({e}); these tests need it (CI={})",
                breakwater_queue_rabbitmq::redact(url),
                std::env::var("CI").unwrap_or_default()
            )
        })
}

fn message(event_id: &str) -> NewMessage {
    NewMessage {
        source: "broker-test".into(),
        event_id: event_id.into(),
        entity_key: None,
        headers: Vec::new(),
        body: Bytes::from_static(b"{}"),
        received_at_ms: 0,
    }
}

async fn claim_within(q: &RabbitMqQueue, n: usize) -> Vec<breakwater_queue::Delivery> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "claimed {} of {n}", got.len());
        got.extend(
            q.claim(n - got.len(), Duration::from_secs(60))
                .await
                .expect("claim"),
        );
    }
    got
}

/// Paused: the consumer is cancelled and what it had pushed and no worker
/// had started goes back (ready again, no attempt counted), while the one
/// being applied stays with its worker; nothing more is delivered while
/// webhooks keep arriving. Half-open the prefetch is the probes; the ramp
/// raises it step by step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_s_flow_as_the_broker_counts_it() {
    let name = QueueName::new();
    let config = RabbitMqConfig {
        prefetch_headroom: 0,
        ..RabbitMqConfig::default()
    };
    let q = open(&url(), &name, &config).await;
    for i in 0..6 {
        q.enqueue(message(&format!("before-{i}")))
            .await
            .expect("enqueue");
    }
    q.set_flow(Flow::Flowing { limit: 4 }).await.expect("flow");
    let applying = claim_within(&q, 1).await;
    // 4 pushed (the prefetch): 1 claimed, 3 buffered.
    counts_become(&name.0, (2, 4, 1), "flowing with a prefetch of 4").await;
    assert_eq!(prefetches(&name.0), vec![4]);

    q.set_flow(Flow::Paused).await.expect("pause");
    // The consumer is gone at once (a quorum queue still counts it in
    // `consumers` until the delivery it handed out is settled).
    assert!(prefetches(&name.0).is_empty(), "a consumer while paused");
    counts_become(&name.0, (5, 1, 1), "paused: only the applying one out").await;
    for i in 0..4 {
        q.enqueue(message(&format!("during-{i}")))
            .await
            .expect("enqueue");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            q.claim(10, Duration::from_secs(60))
                .await
                .expect("claim")
                .is_empty()
        );
        assert!(prefetches(&name.0).is_empty(), "a consumer while paused");
        let (_, unacked, _) = queue_counts(&name.0);
        assert_eq!(unacked, 1, "a delivery while paused");
    }
    counts_become(&name.0, (9, 1, 1), "arrivals wait in the queue").await;
    q.ack(&applying[0].receipt).await.expect("ack");
    counts_become(&name.0, (9, 0, 0), "the applied one acknowledged").await;

    q.set_flow(Flow::Probing { probes: 1 })
        .await
        .expect("probe");
    assert_eq!(prefetches(&name.0), vec![1], "half-open: the probes");
    let probe = claim_within(&q, 1).await;
    counts_become(&name.0, (8, 1, 1), "one probe out").await;
    q.ack(&probe[0].receipt).await.expect("ack");
    for limit in [2, 4, 8] {
        q.set_flow(Flow::Flowing { limit }).await.expect("ramp");
        assert_eq!(
            prefetches(&name.0),
            vec![u64::from(limit)],
            "the ramp's step"
        );
    }
    let rest = claim_within(&q, 8).await;
    assert!(
        rest.iter().all(|d| d.message.attempts == 0),
        "a release counted an attempt"
    );
}

/// The connection cut under a claimed message: its receipt no longer
/// settles it, the queue reconnects by itself, the message comes back, and
/// a publish while the broker cannot be reached fails (the ingress's 503)
/// rather than answering a false success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_replaced_and_loses_nothing() {
    let name = QueueName::new();
    let broker: SocketAddr = "127.0.0.1:5672".parse().expect("addr");
    let proxy = FaultProxy::start("127.0.0.1:0".parse().expect("addr"), broker)
        .await
        .expect("proxy");
    let via_proxy = format!("amqp://guest:guest@{}/%2f", proxy.local_addr());
    let config = RabbitMqConfig {
        request_timeout_ms: 1_000,
        reconnect_max_ms: 500,
        ..RabbitMqConfig::default()
    };
    let q = open(&via_proxy, &name, &config).await;
    assert!(matches!(
        q.enqueue(message("cut")).await,
        Ok(Enqueued::New { .. })
    ));
    let first = claim_within(&q, 1).await;

    proxy.set(Fault::Refuse);
    proxy.set(Fault::ResetAll);
    proxy.set(Fault::Refuse);
    let refused = q.enqueue(message("while-cut")).await;
    assert!(
        matches!(refused, Err(QueueError::Unavailable(_))),
        "a publish with no broker: {refused:?}"
    );
    // lapin marks the connection down from its I/O loop, a moment after
    // the failed publish may have seen the reset itself.
    let deadline = Instant::now() + Duration::from_secs(5);
    while q.ready().await.is_ok() {
        assert!(Instant::now() < deadline, "ready with no connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        q.ack(&first[0].receipt).await.is_err(),
        "a receipt of the cut connection settled its message"
    );

    proxy.set(Fault::None);
    let deadline = Instant::now() + Duration::from_secs(15);
    while q.ready().await.is_err() {
        assert!(Instant::now() < deadline, "never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = claim_within(&q, 1).await;
    assert_eq!(again[0].message.event_id, "cut");
    q.ack(&again[0].receipt).await.expect("ack");
    assert!(matches!(
        q.enqueue(message("after")).await,
        Ok(Enqueued::New { .. })
    ));
    let after = claim_within(&q, 1).await;
    assert_eq!(after[0].message.event_id, "after");
    q.ack(&after[0].receipt).await.expect("ack");
    drop(q);
    proxy.shutdown().await;
}

/// A queue deleted under a running node: a publish comes back unroutable
/// and is refused (the ingress's 503), never confirmed as durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_a_deleted_queue_is_refused() {
    let name = QueueName::new();
    let q = open(&url(), &name, &RabbitMqConfig::default()).await;
    assert!(matches!(
        q.enqueue(message("before")).await,
        Ok(Enqueued::New { .. })
    ));
    RabbitMqQueue::destroy(&url(), &name.0, &RabbitMqConfig::default())
        .await
        .expect("delete the queues");
    let refused = q.enqueue(message("after")).await;
    assert!(
        matches!(&refused, Err(QueueError::Unavailable(m)) if m.contains("no queue")),
        "a publish to a deleted queue: {refused:?}"
    );
}
