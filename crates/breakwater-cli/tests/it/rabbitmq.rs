//! The whole pipeline on RabbitMQ: the real binary publishing to and
//! consuming from the machine's broker (127.0.0.1:5672, guest/guest, or
//! `BREAKWATER_TEST_AMQP_URL`), applying to a real PostgreSQL. Each test
//! uses queues of its own, deleted when it ends. The shared broker is
//! never stopped: the connection-loss test cuts every connection at a fault
//! proxy between Breakwater and the broker.

use std::net::SocketAddr;
use std::time::Duration;

use breakwater_faultproxy::{Fault, FaultProxy};
use breakwater_queue_rabbitmq::RabbitMqQueue;
use breakwater_queue_rabbitmq::rabbitmqctl::{counts_become, prefetches, queue_counts};
use http::StatusCode;

use crate::orders::{
    BrokerQueue, a_redelivery_queued_again_is_applied_once, applied, burst_through_a_broker_outage,
    orders_db, poison_reaches_the_dlq_and_the_breaker_stays_closed, reset, send, trip,
    wait_for_applied,
};
use crate::utils::*;
use crate::worker::sink_config;

/// Queues of the test's own on the machine's broker.
fn queue() -> BrokerQueue {
    BrokerQueue::new("rabbitmq", |name| {
        RabbitMqQueue::destroy_blocking(&amqp_url(), name)
    })
}

fn amqp_url() -> String {
    std::env::var("BREAKWATER_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

#[tokio::test]
async fn webhooks_flow_through_rabbitmq_into_postgres_once_each() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue.toml(&amqp_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    a_redelivery_queued_again_is_applied_once(&http, &server, &db, "evt_amqp").await;
}

/// While the breaker is open no message is delivered to a worker, as the
/// broker itself counts it: no consumer on the queue and nothing unacked,
/// for seconds, while webhooks keep arriving (and wait, ready). Reset,
/// everything is applied.
#[tokio::test]
async fn while_the_breaker_is_open_rabbitmq_delivers_nothing() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue.toml(&amqp_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    trip(&http, &server).await;
    counts_become(&queue.name, (0, 0, 0), "open: no consumer").await;
    for i in 0..16 {
        let a = send(&http, &server, &format!("evt_open_{i}"), 1 + i % 50).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(prefetches(&queue.name).is_empty(), "a consumer while open");
        let (_, unacked, consumers) = queue_counts(&queue.name);
        assert_eq!((unacked, consumers), (0, 0), "a delivery while open");
    }
    counts_become(&queue.name, (16, 0, 0), "arrivals wait, ready").await;
    assert_eq!(applied(&db).await, 0);
    reset(&http, &server).await;
    wait_for_applied(&db, 16, Duration::from_secs(30)).await;
}

/// Every connection to the broker cut in the middle of a burst, and new
/// ones refused for a while: every webhook that got a 2xx is applied, each
/// effect once, and while the broker was out of reach the ingress refused
/// with 503 (the sender retries), never a false 2xx. (Two threads: the
/// proxy must run while the test blocks waiting for the binary to start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_broker_connection_mid_burst_loses_nothing_acknowledged() {
    let db = orders_db().await;
    let broker: SocketAddr = "127.0.0.1:5672".parse().expect("addr");
    let proxy = FaultProxy::start("127.0.0.1:0".parse().expect("addr"), broker)
        .await
        .expect("proxy");
    let queue = queue();
    let url = format!("amqp://guest:guest@{}/%2f", proxy.local_addr());
    let queue_toml = format!(
        "{}request_timeout_ms = 1000\nreconnect_max_ms = 500\n",
        queue.toml(&url)
    );
    let sandbox = Sandbox::with_queue(&queue_toml, &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    burst_through_a_broker_outage(&http, &server, &db, |down| {
        if down {
            proxy.set(Fault::Refuse);
            proxy.set(Fault::ResetAll);
            proxy.set(Fault::Refuse);
        } else {
            proxy.set(Fault::None);
        }
    })
    .await;
    drop(server);
    proxy.shutdown().await;
}

/// Poison on RabbitMQ: each bad message reaches the DLQ queue with its
/// reason, the good ones are applied, and the breaker does not move.
#[tokio::test]
async fn poison_reaches_the_dlq_queue_and_the_breaker_stays_closed() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue.toml(&amqp_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    poison_reaches_the_dlq_and_the_breaker_stays_closed(&http, &server, &db).await;
}
