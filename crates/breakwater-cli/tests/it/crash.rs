//! A 2xx means durable: kill -9 the binary in the middle of a burst,
//! restart it, and every event id that got a 2xx is in the queue exactly
//! once.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use tokio::sync::Semaphore;

use crate::utils::*;

const TOTAL: usize = 3000;
const CONCURRENCY: usize = 64;
const KILL_AFTER: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_burst_loses_no_acknowledged_webhook() {
    let sandbox = Sandbox::new("");
    let mut server = sandbox.start_ingress();
    let http = Http::default();
    let url = server.url("/webhooks/stripe");
    let answered = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::with_capacity(TOTAL);
    for i in 0..TOTAL {
        let (http, url, answered, gate) =
            (http.clone(), url.clone(), answered.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore");
            let event_id = format!("evt_crash_{i}");
            let body = stripe_event(&event_id, &format!("{}", i % 50));
            let headers = stripe_headers(&body, unix_now());
            let result = http.send(http::Method::POST, &url, &headers, body).await;
            answered.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(a) if a.status.is_success() => Some(event_id),
                _ => None,
            }
        }));
    }
    // Kill once a third of the burst has been answered.
    while answered.load(Ordering::Relaxed) < KILL_AFTER {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.kill9();

    let mut acknowledged = HashSet::new();
    for t in tasks {
        if let Some(id) = t.await.expect("task") {
            acknowledged.insert(id);
        }
    }
    assert!(
        acknowledged.len() >= KILL_AFTER / 2,
        "the burst was cut too early to prove anything: {} acknowledged",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() < TOTAL,
        "the kill came after the burst ended; nothing was in flight"
    );

    // Restart on the same store: everything acknowledged is there, once.
    let server = sandbox.start_ingress();
    let stats = queue_stats(&http, &server).await;
    let db = rusqlite::Connection::open(sandbox.queue_db()).expect("open store");
    let mut st = db
        .prepare("SELECT event_id, COUNT(*) FROM messages GROUP BY event_id")
        .expect("prepare");
    let rows: Vec<(String, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    let stored: HashSet<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    assert!(
        rows.iter().all(|(_, n)| *n == 1),
        "an event id is stored twice"
    );
    let missing: Vec<_> = acknowledged
        .iter()
        .filter(|id| !stored.contains(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    assert_eq!(stats["visible"].as_u64(), Some(rows.len() as u64));

    // And a redelivery of an acknowledged event is answered as a duplicate.
    let some = acknowledged.iter().next().expect("one").clone();
    let order: usize = some.trim_start_matches("evt_crash_").parse().expect("n");
    let body = stripe_event(&some, &format!("{}", order % 50));
    let a = post_stripe(&http, &server, body).await;
    assert_eq!(a.status, StatusCode::OK);
}
