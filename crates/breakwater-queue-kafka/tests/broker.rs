//! What the Kafka backend owes beyond the conformance suite, against a
//! real broker (`BREAKWATER_TEST_KAFKA_URL`, 127.0.0.1:9092 by default; the
//! outage test starts a tansu of its own, `BREAKWATER_TANSU`, behind a
//! fault proxy). Each test has topics and a group of its own, deleted when
//! it ends. A broker out of reach is a failure, never a skip.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use breakwater_faultproxy::Fault;
use breakwater_queue::{Flow, NewMessage, OpenMode, Queue};
use breakwater_queue_kafka::tansu::ProxiedBroker;
use breakwater_queue_kafka::{KafkaConfig, KafkaQueue};
use bytes::Bytes;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

fn url() -> String {
    std::env::var("BREAKWATER_TEST_KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Topics of the test's own, deleted when it ends.
struct Topic {
    name: String,
    url: String,
}

impl Topic {
    fn new() -> Self {
        Self::at(url())
    }

    fn at(url: String) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self {
            name: format!(
                "bwbroker-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            url,
        }
    }

    async fn open(&self, config: &KafkaConfig) -> KafkaQueue {
        KafkaQueue::open(&self.url, &self.name, config, OpenMode::Serve)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "Kafka at {} is unreachable ({e}); these tests need it (CI={})",
                    self.url,
                    std::env::var("CI").unwrap_or_default()
                )
            })
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        KafkaQueue::destroy_blocking(&self.url, &self.name);
    }
}

/// Without key order: these checks hold several records of one key at once
/// (the key order's own check is in the conformance suite).
fn config(partitions: i32) -> KafkaConfig {
    KafkaConfig {
        key_order: breakwater_queue::KeyOrder::None,
        partitions,
        session_timeout_ms: 6_000,
        max_poll_interval_ms: 6_000,
        commit_interval_ms: 100,
        ..KafkaConfig::default()
    }
}

fn message(event_id: &str, key: &str) -> NewMessage {
    NewMessage {
        source: "broker-test".into(),
        event_id: event_id.into(),
        entity_key: Some(key.into()),
        headers: Vec::new(),
        body: Bytes::from_static(b"{}"),
        received_at_ms: 1,
    }
}

const LEASE: Duration = Duration::from_secs(60);

/// One claim of up to `n`; when it brings nothing, a short pause before
/// the caller's next (a claim does not wait while claims are out).
async fn claim_some(q: &KafkaQueue, n: usize) -> Vec<breakwater_queue::Delivery> {
    let got = q.claim(n, LEASE).await.expect("claim");
    if got.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    got
}

/// Claims until `n` came back, within 15 s; returns their event ids.
async fn claim_n(q: &KafkaQueue, n: usize, ack: bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "claimed {} of {n}: {got:?}",
            got.len()
        );
        for d in claim_some(q, n - got.len()).await {
            if ack {
                q.ack(&d.receipt).await.expect("ack");
            }
            got.push(d.message.event_id);
        }
    }
    got
}

/// The group's members, as the broker describes it.
fn members(url: &str, group: &str) -> Vec<String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", url)
        .create()
        .expect("admin consumer");
    let list = c
        .fetch_group_list(Some(group), Duration::from_secs(5))
        .expect("describe group");
    list.groups()
        .iter()
        .find(|g| g.name() == group)
        .map(|g| g.members().iter().map(|m| m.id().to_owned()).collect())
        .unwrap_or_default()
}

/// Open longer than `max.poll.interval.ms`: the consumer takes nothing
/// from the broker, hands out nothing, and stays the same member of its
/// group all along (it polls on; only its partitions are paused); resumed,
/// everything that arrived meanwhile flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_longer_than_the_poll_interval_the_consumer_stays_and_takes_nothing() {
    let topic = Topic::new();
    let q = topic.open(&config(2)).await;
    for i in 0..3 {
        q.enqueue(message(&format!("before-{i}"), &format!("k{i}")))
            .await
            .expect("enqueue");
    }
    claim_n(&q, 3, true).await;
    q.set_flow(Flow::Paused).await.expect("pause");
    let group = q.names().group.clone();
    let described = Instant::now();
    let member = loop {
        let member = members(&topic.url, &group);
        if !member.is_empty() || described.elapsed() > Duration::from_secs(10) {
            break member;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(member.len(), 1, "one member before: {member:?}");
    let fetched = q.fetched_total();
    let open_for = Duration::from_millis(9_000);
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < open_for {
        q.enqueue(message(&format!("during-{sent}"), &format!("k{sent}")))
            .await
            .expect("enqueue");
        sent += 1;
        let got = q.claim(10, LEASE).await.expect("claim");
        assert!(got.is_empty(), "delivered while paused: {got:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        q.fetched_total(),
        fetched,
        "records taken from the broker while paused"
    );
    assert_eq!(
        members(&topic.url, &group),
        member,
        "the consumer left or rejoined its group while paused"
    );
    q.set_flow(Flow::Flowing { limit: 16 })
        .await
        .expect("resume");
    let got: BTreeSet<String> = claim_n(&q, sent, true).await.into_iter().collect();
    assert_eq!(got.len(), sent);
    assert_eq!(q.fetched_total(), fetched + sent as u64);
}

/// A second consumer joins while both are paused: the rebalance hands out
/// partitions, and none of them starts flowing; resumed, every record is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_while_paused_does_not_resume_the_flow() {
    let topic = Topic::new();
    let config = config(4);
    let first = topic.open(&config).await;
    for i in 0..4 {
        first
            .enqueue(message(&format!("warm-{i}"), &format!("k{i}")))
            .await
            .expect("enqueue");
    }
    claim_n(&first, 4, true).await;
    first.set_flow(Flow::Paused).await.expect("pause");
    let second = topic.open(&config).await;
    second.set_flow(Flow::Paused).await.expect("pause");
    let group = first.names().group.clone();
    // The second joins at its first claim.
    let joined = Instant::now();
    while members(&topic.url, &group).len() < 2 {
        assert!(second.claim(1, LEASE).await.expect("claim").is_empty());
        assert!(
            joined.elapsed() < Duration::from_secs(20),
            "the second consumer never joined"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = (first.fetched_total(), second.fetched_total());
    for i in 0..12 {
        first
            .enqueue(message(&format!("during-{i}"), &format!("key-{i}")))
            .await
            .expect("enqueue");
    }
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(3) {
        assert!(first.claim(10, LEASE).await.expect("claim").is_empty());
        assert!(second.claim(10, LEASE).await.expect("claim").is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (first.fetched_total(), second.fetched_total()),
        before,
        "a partition flowed after the rebalance while paused"
    );
    for q in [&first, &second] {
        q.set_flow(Flow::Flowing { limit: 16 })
            .await
            .expect("resume");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = BTreeSet::new();
    while got.len() < 12 {
        assert!(Instant::now() < deadline, "got {got:?}");
        for q in [&first, &second] {
            for d in claim_some(q, 12).await {
                q.ack(&d.receipt).await.expect("ack");
                got.insert(d.message.event_id);
            }
        }
    }
    assert!(
        second.fetched_total() > 0,
        "the second consumer took no partition"
    );
}

/// Records finished out of order: the commit stays below the one not
/// finished, so the next consumer of the group reads it again (and those
/// after it, which the sink's inbox applies once); once it is finished the
/// commit passes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_never_passes_an_unfinished_record() {
    let topic = Topic::new();
    let config = config(1);
    {
        let q = topic.open(&config).await;
        for i in 0..5 {
            q.enqueue(message(&format!("e{i}"), "k"))
                .await
                .expect("enqueue");
        }
        let mut held = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while held.len() < 5 {
            assert!(Instant::now() < deadline);
            held.extend(claim_some(&q, 5).await);
        }
        for d in &held {
            if d.message.event_id != "e0" {
                q.ack(&d.receipt).await.expect("ack");
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Dropped with e0 unfinished, as a crash after the last commit.
    }
    let q = topic.open(&config).await;
    let again = claim_n(&q, 5, true).await;
    assert!(
        again.contains(&"e0".to_owned()),
        "e0 was skipped: {again:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(q);
    let q = topic.open(&config).await;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(3) {
        let got = q.claim(10, LEASE).await.expect("claim");
        assert!(got.is_empty(), "read again past a complete commit: {got:?}");
    }
}

/// The broker out of reach (connections cut, then nothing answering): an
/// enqueue fails, within the request timeout, and never answers success
/// for a record the broker did not acknowledge; back in reach, every
/// acknowledged record is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_succeeds_only_once_the_broker_acknowledged() {
    let broker = ProxiedBroker::start().await;
    let topic = Topic::at(broker.url());
    let config = KafkaConfig {
        request_timeout_ms: 1_500,
        ..config(2)
    };
    let q = topic.open(&config).await;
    let mut acknowledged = BTreeSet::new();
    for i in 0..5 {
        let id = format!("up-{i}");
        q.enqueue(message(&id, &format!("k{i}")))
            .await
            .expect("enqueue");
        acknowledged.insert(id);
    }
    broker.proxy.set(Fault::ResetAll);
    broker.proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let down = q.enqueue(message("down", "k0")).await;
    assert!(down.is_err(), "a success with the broker out of reach");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the failure took {:?}",
        started.elapsed()
    );
    broker.proxy.set(Fault::None);
    let back = Instant::now();
    let id = loop {
        let id = format!("back-{}", back.elapsed().as_millis());
        match q.enqueue(message(&id, "k1")).await {
            Ok(_) => break id,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "never back in reach"
        );
    };
    acknowledged.insert(id);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = BTreeSet::new();
    while !acknowledged.is_subset(&got) {
        assert!(
            Instant::now() < deadline,
            "missing {:?}",
            acknowledged.difference(&got).collect::<Vec<_>>()
        );
        for d in claim_some(&q, 16).await {
            q.ack(&d.receipt).await.expect("ack");
            got.insert(d.message.event_id);
        }
    }
    drop(q);
    drop(topic);
}

/// Dead letters produced at once leave in one batch, which a broker may
/// count as one record in its high watermark (tansu does): every one of
/// them is still listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_written_together_are_all_listed() {
    let topic = Topic::new();
    let q = topic.open(&config(1)).await;
    for i in 0..5 {
        q.enqueue(message(&format!("dead-{i}"), &format!("k{i}")))
            .await
            .expect("enqueue");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut held = Vec::new();
    while held.len() < 5 {
        assert!(Instant::now() < deadline, "claimed {}", held.len());
        held.extend(claim_some(&q, 5).await);
    }
    let reason = breakwater_queue::DeadLetterReason {
        class: "permanent".into(),
        error: "poison".into(),
    };
    let all = held.iter().map(|d| q.dead_letter(&d.receipt, &reason));
    for done in futures_util::future::join_all(all).await {
        done.expect("dead-letter");
    }
    let listed = q
        .dlq_list(&breakwater_queue::DlqPage::first(100))
        .await
        .expect("list");
    assert_eq!(listed.len(), 5, "{listed:?}");
}
