//! The whole pipeline on NATS JetStream: the real binary publishing to and
//! pulling from the machine's NATS server (127.0.0.1:4222, or
//! `BREAKWATER_TEST_NATS_URL`), applying to a real PostgreSQL. Each test
//! uses streams of its own, removed when it ends; a server of its own where
//! the test stops it.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use breakwater_queue_nats::{Names, NatsQueue};
use http::StatusCode;

use crate::orders::{
    applied, burst_through_a_broker_outage, orders_db,
    poison_reaches_the_dlq_and_the_breaker_stays_closed, reset, send, trip, wait_for_applied,
};
use crate::utils::*;
use crate::worker::sink_config;

fn nats_url() -> String {
    std::env::var("BREAKWATER_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A queue name of its own on a NATS server, its streams removed on drop.
pub(crate) struct QueueName {
    url: String,
    name: String,
}

impl QueueName {
    pub(crate) fn new(url: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self {
            url: url.to_owned(),
            name: format!(
                "bwit_{}_{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    /// The `[queue]` table for it.
    pub(crate) fn toml(&self) -> String {
        format!(
            "[queue]\nbackend = \"nats\"\nurl = \"{}\"\nname = \"{}\"\nlease_ms = 10000\n",
            self.url, self.name
        )
    }
}

impl Drop for QueueName {
    fn drop(&mut self) {
        NatsQueue::destroy_blocking(&self.url, &self.name);
    }
}

/// The consumer's counters, from the server: (delivered stream sequence,
/// messages delivered and not acknowledged).
async fn consumer_counts(url: &str, name: &str) -> (u64, usize) {
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let names = Names::of(name);
    let stream = js.get_stream(&names.stream).await.expect("stream");
    let info = stream
        .consumer_info(&names.consumer)
        .await
        .expect("consumer info");
    (info.delivered.stream_sequence, info.num_ack_pending)
}

#[tokio::test]
async fn webhooks_flow_through_jetstream_into_postgres_once_each() {
    let db = orders_db().await;
    let queue = QueueName::new(&nats_url());
    let sandbox = Sandbox::with_queue(&queue.toml(), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    for i in 0..30 {
        let a = send(&http, &server, &format!("evt_nats_{i}"), 1 + i % 50).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    }
    // Within JetStream's duplicate window: 200 duplicate, not queued twice.
    let again = send(&http, &server, "evt_nats_3", 4).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(again.json()["status"], "duplicate");
    wait_for_applied(&db, 30, Duration::from_secs(20)).await;
    let stats = queue_stats(&http, &server).await;
    assert_eq!(stats["visible"], 0, "{stats}");
    assert_eq!(stats["dead_lettered"], 0, "{stats}");
}

/// While the breaker is open no message is delivered to a worker, as the
/// server itself counts it: nothing pending acknowledgement and the
/// consumer's delivered sequence unchanged, for seconds, while webhooks
/// keep arriving. Reset, everything is applied.
#[tokio::test]
async fn while_the_breaker_is_open_jetstream_delivers_nothing() {
    let db = orders_db().await;
    let queue = QueueName::new(&nats_url());
    let sandbox = Sandbox::with_queue(&queue.toml(), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    trip(&http, &server).await;
    let (delivered_at_trip, _) = consumer_counts(&queue.url, &queue.name).await;
    for i in 0..24 {
        let a = send(&http, &server, &format!("evt_open_{i}"), 1 + i % 50).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(125)).await;
        let (delivered, ack_pending) = consumer_counts(&queue.url, &queue.name).await;
        assert_eq!(ack_pending, 0, "a delivery while open");
        assert_eq!(
            delivered, delivered_at_trip,
            "the consumer moved while open"
        );
    }
    assert_eq!(applied(&db).await, 0);
    reset(&http, &server).await;
    wait_for_applied(&db, 24, Duration::from_secs(30)).await;
}

/// A NATS server of this test's own, on its own port and store.
pub(crate) struct OwnNats {
    child: Child,
    port: u16,
    store: tempfile::TempDir,
}

impl OwnNats {
    pub(crate) fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let store = tempfile::tempdir().expect("store");
        let child = Self::spawn(port, store.path());
        Self { child, port, store }
    }

    pub(crate) fn spawn(port: u16, store: &std::path::Path) -> Child {
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("nats-server is needed for this test (Debian's nats-server): {e}")
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn restart(&mut self) {
        self.child = Self::spawn(self.port, self.store.path());
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The broker killed in the middle of a burst and started again: every
/// webhook that got a 2xx is applied, each effect once, and while the
/// broker was away the ingress refused with 503 (the sender retries),
/// never a false 2xx.
#[tokio::test]
async fn a_broker_restart_mid_burst_loses_nothing_acknowledged() {
    let db = orders_db().await;
    let mut nats = OwnNats::start();
    let queue = QueueName::new(&nats.url());
    let queue_toml = format!("{}request_timeout_ms = 500\n", queue.toml());
    let sandbox = Sandbox::with_queue(&queue_toml, &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    burst_through_a_broker_outage(&http, &server, &db, |down| {
        if down {
            nats.kill();
        } else {
            nats.restart();
        }
    })
    .await;
}

/// Poison on JetStream: each bad message reaches the DLQ stream with its
/// reason, the good ones are applied, and the breaker does not move.
#[tokio::test]
async fn poison_reaches_the_dlq_stream_and_the_breaker_stays_closed() {
    let db = orders_db().await;
    let queue = QueueName::new(&nats_url());
    let sandbox = Sandbox::with_queue(&queue.toml(), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    poison_reaches_the_dlq_and_the_breaker_stays_closed(&http, &server, &db).await;
}

/// A read-only command on a NATS queue that does not exist says so and
/// makes nothing (no stream, no consumer with a lease of its own).
#[tokio::test]
async fn queue_stats_on_a_missing_nats_queue_makes_nothing() {
    let queue = QueueName::new(&nats_url());
    // The default SQLite sink's timeouts want a longer lease.
    let toml = queue.toml().replace("lease_ms = 10000", "lease_ms = 30000");
    let sandbox = Sandbox::with_queue(&toml, "");
    let out = std::process::Command::new(binary())
        .args(["queue", "stats", "--config"])
        .arg(sandbox.config_path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no queue at"), "{err}");
    let client = async_nats::connect(&queue.url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    assert!(
        js.get_stream(&Names::of(&queue.name).stream).await.is_err(),
        "a read-only command made the stream"
    );
}
