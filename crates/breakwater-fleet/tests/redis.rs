//! The fleet store against the Redis on 127.0.0.1:6379
//! (`BREAKWATER_TEST_REDIS_URL` overrides it). Each test works under a
//! prefix of its own and deletes its keys. Redis being unreachable is a
//! failure, never a skip.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use breakwater_control::{
    BreakerRecord, BreakerStore, OutcomeTally, ProbeSlots, Reason, SharedBreaker, State, Version,
};
use breakwater_fleet::{NodeBeat, NodeRole, RedisFleet, now_ms};
use futures_util::StreamExt;

fn url() -> String {
    std::env::var("BREAKWATER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A prefix of this test's own; its keys are deleted on drop.
struct Prefix(String);

impl Prefix {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self(format!(
            "bwtest:{}:{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn node(&self, node: &str) -> RedisFleet {
        RedisFleet::open(&url(), &self.0, node).expect("open")
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(url())
            && let Ok(mut c) = client.get_connection()
        {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}:*", self.0))
                .query(&mut c)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(keys).query(&mut c);
            }
        }
    }
}

fn record(generation: u64, node: &str, state: State) -> BreakerRecord {
    BreakerRecord {
        epoch: 1,
        generation,
        node: node.into(),
        written_at_ms: now_ms(),
        breaker: SharedBreaker {
            state,
            reason: Reason::ForcedOpen {
                note: "test".into(),
                ttl_ms: None,
            },
            limit: 0,
            in_state_ms: 0,
            period: 0,
            ramp_step: 0,
            cool_down_ms: 10_000,
            opens_since_close: 1,
            manual: None,
        },
    }
}

fn beat(node: &str) -> NodeBeat {
    NodeBeat {
        node: node.into(),
        role: NodeRole::Worker,
        at_ms: now_ms(),
        state: Some(State::Closed),
        generation: 0,
        fallback: false,
        slots: Vec::new(),
        outcomes: OutcomeTally::default(),
    }
}

#[tokio::test]
async fn the_record_changes_by_compare_and_set_and_every_change_is_published() {
    let p = Prefix::new();
    let (a, b) = (p.node("a"), p.node("b"));
    let mut changes = b.changes().await.expect("subscribe (is Redis running?)");
    assert_eq!(a.load().await.expect("load"), None);
    assert!(
        a.compare_and_set(None, record(1, "a", State::Open))
            .await
            .expect("cas")
    );
    // b read nothing, so it loses.
    assert!(
        !b.compare_and_set(None, record(1, "b", State::Closed))
            .await
            .expect("cas")
    );
    let v = |generation| Version {
        epoch: 1,
        generation,
    };
    assert!(
        b.compare_and_set(Some(v(1)), record(2, "b", State::HalfOpen))
            .await
            .expect("cas")
    );
    assert!(
        !a.compare_and_set(Some(v(1)), record(2, "a", State::Open))
            .await
            .expect("cas")
    );
    // Generation 2 of another epoch is another record.
    let other_epoch = Version {
        epoch: 2,
        generation: 2,
    };
    assert!(
        !a.compare_and_set(Some(other_epoch), record(3, "a", State::Open))
            .await
            .expect("cas")
    );
    let stored = a.load().await.expect("load").expect("a record");
    assert_eq!((stored.generation, stored.node.as_str()), (2, "b"));

    let first = tokio::time::timeout(Duration::from_secs(2), changes.next())
        .await
        .expect("published")
        .expect("a record");
    assert_eq!((first.generation, first.breaker.state), (1, State::Open));
    let second = tokio::time::timeout(Duration::from_secs(2), changes.next())
        .await
        .expect("published")
        .expect("a record");
    assert_eq!(
        (second.generation, second.breaker.state),
        (2, State::HalfOpen)
    );
}

#[tokio::test]
async fn one_node_holds_the_lease_until_it_lapses_or_is_given_up() {
    let p = Prefix::new();
    let (a, b, ingress) = (p.node("a"), p.node("b"), p.node("i"));
    let ttl = Some(Duration::from_millis(600));
    let got = a.sync(&beat("a"), true, ttl).await.expect("sync");
    assert!(got.leader, "the first to ask takes it");
    assert_eq!(got.beats.len(), 1, "the holder reads every beat");
    let got = b.sync(&beat("b"), true, ttl).await.expect("sync");
    assert!(!got.leader);
    assert_eq!(got.lease.as_ref().map(|l| l.holder.as_str()), Some("a"));
    assert!(got.beats.is_empty(), "a follower reads no beats");
    // A node that runs no breaker never takes it.
    assert!(
        !ingress
            .sync(&beat("i"), true, None)
            .await
            .expect("sync")
            .leader
    );
    // The holder renews; the follower still cannot take it.
    assert!(a.sync(&beat("a"), true, ttl).await.expect("sync").leader);
    let got = a.sync(&beat("a"), true, ttl).await.expect("sync");
    assert_eq!(got.beats.len(), 3, "a, b and the ingress beat");
    // a stops renewing (dies): b takes it once it lapses, not before.
    let died = Instant::now();
    assert!(!b.sync(&beat("b"), true, ttl).await.expect("sync").leader);
    loop {
        if b.sync(&beat("b"), true, ttl).await.expect("sync").leader {
            break;
        }
        assert!(
            died.elapsed() < Duration::from_secs(2),
            "b never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        died.elapsed() >= Duration::from_millis(400),
        "{:?}",
        died.elapsed()
    );
    // Given up cleanly: a takes it at once.
    b.release_lease().await.expect("release");
    assert!(a.sync(&beat("a"), true, ttl).await.expect("sync").leader);
}

#[tokio::test]
async fn probe_slots_are_bounded_fleet_wide_and_lapse() {
    let p = Prefix::new();
    let nodes = [p.node("a"), p.node("b"), p.node("c")];
    let now = Instant::now();
    let ttl = Duration::from_millis(400);
    for limit in [1u32, 3] {
        let period = u64::from(limit);
        let mut held = Vec::new();
        for round in 0..3 {
            for n in &nodes {
                if let Some(slot) = n.try_take(period, limit, ttl, now).await.expect("take") {
                    held.push(slot);
                }
            }
            assert_eq!(held.len(), limit as usize, "round {round}, limit {limit}");
        }
        // A success frees its slot and is counted.
        let first = held.remove(0);
        assert_eq!(nodes[0].succeeded(first).await.expect("succeeded"), 1);
        assert!(
            nodes[1]
                .try_take(period, limit, ttl, now)
                .await
                .expect("take")
                .is_some()
        );
        assert!(
            nodes[2]
                .try_take(period, limit, ttl, now)
                .await
                .expect("take")
                .is_none()
        );
    }
    // A dead holder's slot lapses after its TTL.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(
        nodes[0]
            .try_take(1, 1, ttl, now)
            .await
            .expect("take")
            .is_some()
    );
}

#[tokio::test]
async fn two_prefixes_do_not_see_each_others_state() {
    let (p1, p2) = (Prefix::new(), Prefix::new());
    let (a, b) = (p1.node("a"), p2.node("a"));
    assert!(
        a.compare_and_set(None, record(1, "a", State::Open))
            .await
            .expect("cas")
    );
    assert_eq!(b.load().await.expect("load"), None);
    let ttl = Some(Duration::from_secs(5));
    assert!(a.sync(&beat("a"), true, ttl).await.expect("sync").leader);
    assert!(
        b.sync(&beat("a"), true, ttl).await.expect("sync").leader,
        "its own lease"
    );
    assert_eq!(b.view().await.expect("view").beats.len(), 1);
}

#[tokio::test]
async fn a_redis_that_is_not_there_is_an_error_not_a_hang() {
    // Port 1 on loopback: nothing listens.
    let fleet = RedisFleet::open("redis://127.0.0.1:1", "bwtest:none", "a").expect("open");
    let started = Instant::now();
    assert!(
        fleet
            .sync(&beat("a"), true, Some(Duration::from_secs(1)))
            .await
            .is_err()
    );
    assert!(fleet.load().await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_key_park_reaches_every_subscriber() {
    let p = Prefix::new();
    let (a, b) = (p.node("a"), p.node("b"));
    let mut parks = b.key_parks().await.expect("subscribe");
    let park = breakwater_fleet::KeyPark {
        node: "a".into(),
        key: "order-1042".into(),
        park_ms: 500,
    };
    a.publish_key_park(&park).await.expect("publish");
    let got = tokio::time::timeout(Duration::from_secs(2), parks.next())
        .await
        .expect("delivered")
        .expect("a park");
    assert_eq!(got, park);
}

#[tokio::test]
async fn a_beat_not_stored_still_renews_the_lease_and_reads_the_record() {
    let p = Prefix::new();
    let a = p.node("a");
    let ttl = Some(Duration::from_millis(600));
    let first = beat("a");
    assert!(a.sync(&first, true, ttl).await.expect("sync").leader);
    assert!(
        a.compare_and_set(None, record(1, "a", State::Open))
            .await
            .expect("cas")
    );
    let mut later = beat("a");
    later.at_ms = first.at_ms + 5_000;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let got = a.sync(&later, false, ttl).await.expect("sync");
        assert!(got.leader, "renewed without storing");
        assert_eq!(got.record.map(|r| r.generation), Some(1));
        assert_eq!(got.beats.len(), 1);
        assert_eq!(
            got.beats[0].at_ms, first.at_ms,
            "the stored beat is the first"
        );
    }
}
