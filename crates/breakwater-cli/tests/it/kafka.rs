//! The whole pipeline on Kafka: the real binary producing to and consuming
//! from the local broker the test script starts (tansu,
//! `BREAKWATER_TEST_KAFKA_URL`), applying to a real PostgreSQL. Each test
//! uses topics and a group of its own, deleted when it ends. The outage
//! test starts a broker of its own behind a fault proxy.

use std::time::{Duration, Instant};

use breakwater_faultproxy::Fault;
use breakwater_queue_kafka::KafkaQueue;
use breakwater_queue_kafka::tansu::ProxiedBroker;
use http::StatusCode;

use crate::orders::{
    BrokerQueue, a_redelivery_queued_again_is_applied_once, applied, burst_through_a_broker_outage,
    inbox_rows, never_applied, orders_db, poison_reaches_the_dlq_and_the_breaker_stays_closed,
    send, while_open_nothing_is_delivered,
};
use crate::utils::*;
use crate::worker::sink_config;

pub(crate) fn kafka_url() -> String {
    std::env::var("BREAKWATER_TEST_KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Topics of the test's own on the local broker.
pub(crate) fn queue() -> BrokerQueue {
    BrokerQueue::new("kafka", |name| {
        KafkaQueue::destroy_blocking(&kafka_url(), name)
    })
}

/// The `[queue]` table for `queue` at `url`: two partitions, a short
/// session so a killed worker's partitions move on soon.
pub(crate) fn queue_toml(queue: &BrokerQueue, url: &str) -> String {
    format!(
        "{}partitions = 2\nsession_timeout_ms = 6000\ncommit_interval_ms = 100\n",
        queue.toml(url)
    )
}

#[tokio::test]
async fn webhooks_flow_through_kafka_into_postgres_once_each() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue_toml(&queue, &kafka_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    a_redelivery_queued_again_is_applied_once(&http, &server, &db, "evt_kafka").await;
}

/// While the breaker is open nothing is handed to a worker: nothing in
/// flight, for seconds, while webhooks keep arriving (and wait, as lag).
/// Reset, everything is applied.
#[tokio::test]
async fn while_the_breaker_is_open_kafka_delivers_nothing() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue_toml(&queue, &kafka_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    while_open_nothing_is_delivered(&http, &server, &db).await;
}

/// Poison on Kafka: each bad message reaches the dead-letter topic with
/// its reason, the good ones are applied, and the breaker does not move.
#[tokio::test]
async fn poison_reaches_the_kafka_dlq_and_the_breaker_stays_closed() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue_toml(&queue, &kafka_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    poison_reaches_the_dlq_and_the_breaker_stays_closed(&http, &server, &db).await;
}

/// kill -9 a worker in the middle of its work (applies slowed to 20 ms
/// each, one at a time), start it again: every webhook is applied, each
/// effect once. Offsets committed before the kill stop below what was
/// unfinished, so the restart reads that again and skips nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_skips_nothing_and_applies_each_once() {
    const TOTAL: usize = 150;
    let db = orders_db().await;
    db.client
        .batch_execute(
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(0.02); RETURN NEW; END $$;
             CREATE TRIGGER slow BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION slow();",
        )
        .await
        .expect("slow trigger");
    let queue = queue();
    let sandbox = Sandbox::with_queue(
        &queue_toml(&queue, &kafka_url()),
        &sink_config(&db, "").replace("max_concurrency = 8", "max_concurrency = 1"),
    );
    let mut server = sandbox.start();
    let http = Http::default();
    let mut accepted = Vec::new();
    for i in 0..TOTAL {
        let event_id = format!("evt_kill_{i}");
        let a = send(&http, &server, &event_id, 1 + (i as i64) % 50).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        accepted.push(event_id);
    }
    let started = Instant::now();
    while applied(&db).await < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9();
    let at_kill = applied(&db).await;
    assert!(
        at_kill < TOTAL as i64,
        "the kill came after everything was applied: it proves nothing"
    );
    let _server = sandbox.start();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let missing = never_applied(&db, &accepted).await;
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} webhooks never applied after the restart (applied {at_kill} before the kill)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(applied(&db).await, TOTAL as i64, "an effect twice");
    assert_eq!(inbox_rows(&db).await, TOTAL as i64);
}

/// Every connection to the broker cut in the middle of a burst, and then
/// nothing answering for a while: every webhook that got a 2xx is applied,
/// each effect once, and while the broker was out of reach the ingress
/// refused with 503, never a false 2xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_kafka_connection_mid_burst_loses_nothing_acknowledged() {
    let db = orders_db().await;
    let broker = ProxiedBroker::start().await;
    let queue = queue();
    let queue_toml = format!(
        "{}request_timeout_ms = 1000\n",
        queue_toml(&queue, &broker.url())
    );
    let sandbox = Sandbox::with_queue(&queue_toml, &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    burst_through_a_broker_outage(&http, &server, &db, |down| {
        if down {
            broker.proxy.set(Fault::ResetAll);
            broker.proxy.set(Fault::Blackhole);
        } else {
            broker.proxy.set(Fault::None);
        }
    })
    .await;
    drop(server);
}
