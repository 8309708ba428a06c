//! The orders the broker tests send through the pipeline, and how they
//! read what the sink applied (the `ORDERS` table of `worker`); a broker
//! queue of a test's own, and the breaker tripped and reset by hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::pg::ScratchDb;
use crate::utils::*;

/// A scratch database with the `orders` table.
pub async fn orders_db() -> ScratchDb {
    let db = ScratchDb::create().await;
    db.client
        .batch_execute(crate::worker::ORDERS)
        .await
        .expect("schema");
    db
}

/// Applications summed over every order row.
pub async fn applied(db: &ScratchDb) -> i64 {
    db.client
        .query_one(
            "SELECT coalesce(sum(applied_count), 0)::int8 FROM orders",
            &[],
        )
        .await
        .expect("sum")
        .get(0)
}

/// A Stripe event paying `order`.
pub fn order_paid(event_id: &str, order: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": event_id,
        "type": "order.updated",
        "data": {"object": {"id": order, "status": "paid"}}
    }))
    .expect("json")
}

/// Sends a signed Stripe event for `order`.
pub async fn send(http: &Http, server: &Server, event_id: &str, order: i64) -> Answer {
    post_stripe(http, server, order_paid(event_id, order)).await
}

/// Waits until exactly `n` applications were made (more fails at once).
pub async fn wait_for_applied(db: &ScratchDb, n: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = applied(db).await;
        if got == n {
            return;
        }
        assert!(got < n, "applied {got}, more than the {n} sent");
        assert!(
            Instant::now() < deadline,
            "applied {got} of {n} in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many of `event_ids` have no inbox row (were never applied).
pub async fn never_applied(db: &ScratchDb, event_ids: &[String]) -> i64 {
    db.client
        .query_one(
            "SELECT count(*) FROM unnest($1::text[]) AS e(id)
             WHERE NOT EXISTS (SELECT 1 FROM breakwater_inbox i WHERE i.event_id = e.id)",
            &[&event_ids],
        )
        .await
        .expect("missing")
        .get(0)
}

/// Rows of the inbox: one per event applied.
pub async fn inbox_rows(db: &ScratchDb) -> i64 {
    db.client
        .query_one("SELECT count(*) FROM breakwater_inbox", &[])
        .await
        .expect("inbox")
        .get(0)
}

/// Sends 10 good orders and 4 the orders table refuses (a constraint
/// violation), then asserts: the good ones applied, each bad one in the
/// DLQ as permanent with the constraint named, the breaker closed and
/// never moved.
pub async fn poison_reaches_the_dlq_and_the_breaker_stays_closed(
    http: &Http,
    server: &Server,
    db: &ScratchDb,
) {
    for i in 0..10 {
        let a = send(http, server, &format!("evt_good_{i}"), 1 + i).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    }
    for i in 0..4 {
        // The orders table refuses this status: a constraint violation.
        let body = serde_json::to_vec(&serde_json::json!({
            "id": format!("evt_poison_{i}"),
            "data": {"object": {"id": 20 + i, "status": "poison"}}
        }))
        .expect("json");
        let a = post_stripe(http, server, body).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    }
    wait_for_applied(db, 10, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let dlq = loop {
        let list = http.get(&server.admin_url("/dlq")).await.json();
        if list["items"].as_array().map_or(0, Vec::len) == 4 {
            break list;
        }
        if Instant::now() >= deadline {
            let stats = queue_stats(http, server).await;
            panic!("DLQ: {list}\nqueue: {stats}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for item in dlq["items"].as_array().into_iter().flatten() {
        assert_eq!(item["class"], "permanent", "{item}");
        assert!(
            item["error"]
                .as_str()
                .is_some_and(|e| e.contains("constraint")),
            "{item}"
        );
    }
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "closed", "{view}");
    assert_eq!(
        view["breaker"]["history"].as_array().map(Vec::len),
        Some(0),
        "{view}"
    );
}

/// Sends 120 orders 20 ms apart through a broker outage: `outage(true)`
/// before the 50th, `outage(false)` before the 60th. Asserts that some
/// were refused with 503 and none got another answer, that the ingress
/// accepts again once the broker is back, that every accepted one is
/// applied (a refused one may be too: a 503 promises nothing either way,
/// and the sender retries it), and that each effect happened once.
pub async fn burst_through_a_broker_outage(
    http: &Http,
    server: &Server,
    db: &ScratchDb,
    mut outage: impl FnMut(bool),
) {
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..120 {
        if i == 50 {
            outage(true);
        }
        if i == 60 {
            outage(false);
        }
        let event_id = format!("evt_outage_{i}");
        let a = send(http, server, &event_id, 1 + i % 50).await;
        match a.status {
            StatusCode::ACCEPTED => accepted.push(event_id),
            StatusCode::SERVICE_UNAVAILABLE => refused += 1,
            other => panic!("answered {other}: {:?}", a.body),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        refused > 0,
        "the broker was out of reach for 10 webhooks, none refused"
    );
    assert!(accepted.len() >= 50, "accepted only {}", accepted.len());
    // The broker is back: the ingress accepts again by itself.
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in 0.. {
        let event_id = format!("evt_outage_after_{n}");
        let a = send(http, server, &event_id, 7).await;
        if a.status == StatusCode::ACCEPTED {
            accepted.push(event_id);
            break;
        }
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", a.body);
        assert!(Instant::now() < deadline, "never accepting again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let missing = never_applied(db, &accepted).await;
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} acknowledged webhooks never applied"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(applied(db).await, inbox_rows(db).await, "an effect twice");
}

/// 30 webhooks and a redelivery of one of them through a broker that keeps
/// no duplicate window (RabbitMQ, a standard SQS queue): the redelivery is
/// queued again (202) and the sink's inbox applies it once; the queue ends
/// empty, nothing dead-lettered.
pub async fn a_redelivery_queued_again_is_applied_once(
    http: &Http,
    server: &Server,
    db: &ScratchDb,
    prefix: &str,
) {
    for i in 0..30 {
        let a = send(http, server, &format!("{prefix}_{i}"), 1 + i % 50).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    }
    let again = send(http, server, &format!("{prefix}_3"), 4).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{:?}", again.body);
    wait_for_applied(db, 30, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = queue_stats(http, server).await;
        if stats["visible"] == 0 && stats["in_flight"] == 0 {
            assert_eq!(stats["dead_lettered"], 0, "{stats}");
            break;
        }
        assert!(Instant::now() < deadline, "{stats}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(applied(db).await, 30, "the duplicate had an effect");
}

/// Trips the breaker, then sends 12 orders 250 ms apart: none is handed
/// to a worker (nothing in flight, as the broker counts it, every time),
/// all wait visible, none is applied. Reset, all 12 are applied.
pub async fn while_open_nothing_is_delivered(http: &Http, server: &Server, db: &ScratchDb) {
    trip(http, server).await;
    for i in 0..12 {
        let a = send(http, server, &format!("evt_open_{i}"), 1 + i % 50).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let stats = queue_stats(http, server).await;
        assert_eq!(stats["in_flight"], 0, "delivered while open: {stats}");
    }
    let stats = queue_stats(http, server).await;
    assert_eq!(stats["visible"], 12, "arrivals wait, visible: {stats}");
    assert_eq!(applied(db).await, 0);
    reset(http, server).await;
    wait_for_applied(db, 12, Duration::from_secs(30)).await;
}

/// A queue name of a test's own on a broker, its queues removed on drop
/// (by `remove`, given the name).
pub struct BrokerQueue {
    pub name: String,
    backend: &'static str,
    remove: fn(&str),
}

impl BrokerQueue {
    pub fn new(backend: &'static str, remove: fn(&str)) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self {
            name: format!(
                "bwit-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            backend,
            remove,
        }
    }

    /// The `[queue]` table for it at `url`.
    pub fn toml(&self, url: &str) -> String {
        format!(
            "[queue]\nbackend = \"{}\"\nurl = \"{url}\"\nname = \"{}\"\nlease_ms = 10000\n",
            self.backend, self.name
        )
    }
}

impl Drop for BrokerQueue {
    fn drop(&mut self) {
        (self.remove)(&self.name);
    }
}

/// Opens the breaker by hand (`POST /breaker/trip`).
pub async fn trip(http: &Http, server: &Server) {
    let tripped = http
        .admin_post(&server.admin_url("/breaker/trip?note=test"))
        .await;
    assert_eq!(tripped.status, StatusCode::OK, "{:?}", tripped.body);
}

/// Hands the breaker back to automatic control (`POST /breaker/reset`).
pub async fn reset(http: &Http, server: &Server) {
    let reset = http.admin_post(&server.admin_url("/breaker/reset")).await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);
}
