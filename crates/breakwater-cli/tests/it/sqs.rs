//! The whole pipeline on Amazon SQS: the real binary sending to and
//! receiving from the local SQS endpoint the test script starts (moto,
//! `BREAKWATER_TEST_SQS_URL`), applying to a real PostgreSQL. Each test
//! uses queues of its own, deleted when it ends. The endpoint-loss test
//! cuts every connection at a fault proxy between Breakwater and it.

use std::net::SocketAddr;

use breakwater_faultproxy::{Fault, FaultProxy};
use breakwater_queue_sqs::{Endpoint, SqsQueue};

use crate::orders::{
    BrokerQueue, a_redelivery_queued_again_is_applied_once, burst_through_a_broker_outage,
    orders_db, poison_reaches_the_dlq_and_the_breaker_stays_closed,
    while_open_nothing_is_delivered,
};
use crate::utils::*;
use crate::worker::sink_config;

/// Queues of the test's own at the local endpoint.
fn queue() -> BrokerQueue {
    BrokerQueue::new("sqs", |name| {
        SqsQueue::destroy_blocking(&Endpoint::at(Some(sqs_url())), name)
    })
}

fn sqs_url() -> String {
    std::env::var("BREAKWATER_TEST_SQS_URL").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

#[tokio::test]
async fn webhooks_flow_through_sqs_into_postgres_once_each() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue.toml(&sqs_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    a_redelivery_queued_again_is_applied_once(&http, &server, &db, "evt_sqs").await;
}

/// While the breaker is open nothing is received, as SQS itself counts
/// it: nothing in flight, for seconds, while webhooks keep arriving (and
/// wait, visible). Reset, everything is applied.
#[tokio::test]
async fn while_the_breaker_is_open_nothing_is_received_from_sqs() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue.toml(&sqs_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    while_open_nothing_is_delivered(&http, &server, &db).await;
}

/// Every connection to the endpoint cut in the middle of a burst, and new
/// ones refused for a while: every webhook that got a 2xx is applied, each
/// effect once, and while SQS was out of reach the ingress refused with
/// 503, never a false 2xx. (Two threads: the proxy must run while the test
/// blocks waiting for the binary to start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_sqs_connection_mid_burst_loses_nothing_acknowledged() {
    let db = orders_db().await;
    let target: SocketAddr = sqs_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("BREAKWATER_TEST_SQS_URL is http://ip:port");
    let proxy = FaultProxy::start("127.0.0.1:0".parse().expect("addr"), target)
        .await
        .expect("proxy");
    let queue = queue();
    let url = format!("http://{}", proxy.local_addr());
    let queue_toml = format!("{}request_timeout_ms = 1000\n", queue.toml(&url));
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

/// Poison on SQS: each bad message reaches the DLQ queue with its reason,
/// the good ones are applied, and the breaker does not move.
#[tokio::test]
async fn poison_reaches_the_sqs_dlq_and_the_breaker_stays_closed() {
    let db = orders_db().await;
    let queue = queue();
    let sandbox = Sandbox::with_queue(&queue.toml(&sqs_url()), &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    poison_reaches_the_dlq_and_the_breaker_stays_closed(&http, &server, &db).await;
}

/// A queue whose redrive policy leaves too little room for releases (here
/// made by Breakwater with `max_receive_count = 5`): `serve` says so in
/// `GET /breaker`, and `doctor` warns, without failing.
#[tokio::test]
async fn a_redrive_policy_without_room_for_releases_is_reported() {
    let db = orders_db().await;
    let queue = queue();
    let queue_toml = format!("{}max_receive_count = 5\n", queue.toml(&sqs_url()));
    let sandbox = Sandbox::with_queue(&queue_toml, &sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();
    let view = http.get(&server.admin_url("/breaker")).await.json();
    let warnings = view["queue_warnings"].to_string();
    assert!(
        warnings.contains("redelivery limit is 5"),
        "/breaker: {view}"
    );
    let out = std::process::Command::new(binary())
        .args(["doctor", "--json", "--config"])
        .arg(sandbox.config_path())
        .output()
        .expect("run doctor");
    let findings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let finding = findings
        .as_array()
        .and_then(|a| a.iter().find(|f| f["check"] == "queue.redelivery"))
        .unwrap_or_else(|| panic!("no queue.redelivery in {findings}"));
    assert_eq!(finding["verdict"], "warn", "{finding}");
}
