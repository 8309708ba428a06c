//! Workers against a real PostgreSQL, through the real binary and HTTP:
//! a hot row, a poison message, the database going away, a duplicate.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::pg::ScratchDb;
use crate::utils::*;

pub(crate) const ORDERS: &str = "
CREATE TABLE orders (
    id            bigint PRIMARY KEY,
    status        text NOT NULL CHECK (status <> 'poison'),
    applied_count int  NOT NULL DEFAULT 0,
    updated_at    timestamptz
);
INSERT INTO orders (id, status) SELECT g, 'new' FROM generate_series(1, 50) g;
INSERT INTO orders (id, status) VALUES (1042, 'new');
";

/// Sink and statement config for the orders table; `extra` is appended.
pub(crate) fn sink_config(db: &ScratchDb, extra: &str) -> String {
    format!(
        r#"
[sink]
url = "{}"
lock_timeout_ms = 500
statement_timeout_ms = 3000
pool_max = 8
acquire_timeout_ms = 1000

[workers]
max_concurrency = 8
max_attempts = 5
backoff_base_ms = 50
backoff_cap_ms = 1000

{extra}

[[source.statement]]
sql = "UPDATE orders SET status = $status, applied_count = applied_count + 1, updated_at = now() WHERE id = $entity"
params = {{ status = "json:/data/object/status" }}
"#,
        db.url()
    )
}

/// A scratch database with the orders table, and the binary serving it
/// with `extra` config.
async fn orders_server(extra: &str) -> (ScratchDb, Sandbox, Server, Http) {
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    let sandbox = Sandbox::new(&sink_config(&db, extra));
    let server = sandbox.start();
    (db, sandbox, server, Http::default())
}

/// A start against an inbox that already exists says nothing of it (the
/// server's NOTICE "relation already exists, skipping" stays out of the
/// log).
#[tokio::test]
async fn a_start_against_an_existing_inbox_logs_no_notice() {
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    db.client
        .batch_execute(
            "CREATE TABLE breakwater_inbox (event_id text NOT NULL, source text NOT NULL,
             entity_key text, payload jsonb, received_at timestamptz NOT NULL,
             applied_at timestamptz, PRIMARY KEY (source, event_id))",
        )
        .await
        .expect("inbox");
    let sandbox = Sandbox::new(&sink_config(&db, ""));
    let server = sandbox.start();
    assert!(
        server.startup.iter().any(|l| l.contains("sink ready")),
        "{:?}",
        server.startup
    );
    let notices: Vec<&String> = server
        .startup
        .iter()
        .filter(|l| l.contains("already exists"))
        .collect();
    assert!(notices.is_empty(), "{notices:?}");
}

/// Sends a Stripe event for `order` and expects 202.
pub(crate) async fn send(http: &Http, server: &Server, event_id: &str, order: i64, status: &str) {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": event_id,
        "type": "order.updated",
        "data": {"object": {"id": order, "status": status}}
    }))
    .expect("json");
    let a = post_stripe(http, server, body).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
}

async fn inbox_count(db: &ScratchDb, filter: &str) -> i64 {
    db.client
        .query_one(
            &format!("SELECT count(*) FROM breakwater_inbox WHERE {filter}"),
            &[],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(0)
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

async fn applied_counts(db: &ScratchDb) -> HashMap<i64, i32> {
    db.client
        .query("SELECT id, applied_count FROM orders", &[])
        .await
        .expect("orders")
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Sessions of the scratch database waiting on a lock.
async fn lock_waiters(db: &ScratchDb) -> i64 {
    db.client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_row_is_parked_while_unrelated_orders_flow() {
    let (db, _sandbox, server, http) = orders_server("").await;

    // Another session holds order 1042's row lock.
    let locker = db.lock_order(1042).await;
    let locked_at = Instant::now();

    // 200 webhooks: 30% for the hot row, the rest for 50 other orders.
    let mut expected: HashMap<i64, i32> = HashMap::new();
    for i in 0..200 {
        let order = if i % 10 < 3 { 1042 } else { 1 + (i % 50) };
        *expected.entry(order).or_default() += 1;
        send(&http, &server, &format!("evt_hot_{i}"), order, "paid").await;
    }
    let unrelated = i64::from(
        expected
            .iter()
            .filter(|(k, _)| **k != 1042)
            .map(|(_, v)| *v)
            .sum::<i32>(),
    );

    // While the lock is held: unrelated orders are all applied, the hot key
    // is parked with a lock-related failure, and at most one session waits.
    let mut max_waiters = 0;
    let mut saw_parked = false;
    let deadline = locked_at + Duration::from_secs(6);
    while Instant::now() < deadline {
        max_waiters = max_waiters.max(lock_waiters(&db).await);
        let status = http.get(&server.admin_url("/breaker")).await.json();
        saw_parked |= status["parked_keys"]
            .as_array()
            .is_some_and(|keys| keys.iter().any(|k| k["key"] == "1042"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let unrelated_during_lock = inbox_count(&db, "entity_key <> '1042'").await;
    assert_eq!(
        unrelated_during_lock, unrelated,
        "every unrelated order was applied while 1042 was locked"
    );
    assert_eq!(
        inbox_count(&db, "entity_key = '1042'").await,
        0,
        "1042 is locked"
    );
    assert!(saw_parked, "the hot key was parked after lock timeouts");
    assert!(
        max_waiters <= 1,
        "{max_waiters} sessions waited on the hot row at once"
    );

    locker.batch_execute("ROLLBACK").await.expect("unlock");
    wait_for("every event applied", Duration::from_secs(30), async || {
        inbox_count(&db, "true").await == 200
    })
    .await;
    let counts = applied_counts(&db).await;
    for (order, n) in &expected {
        assert_eq!(
            counts.get(order),
            Some(n),
            "order {order} applied exactly once per event"
        );
    }
    let stats = queue_stats(&http, &server).await;
    assert_eq!(stats["dead_lettered"], 0, "nothing dead-lettered");
    let breaker = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(
        breaker["breaker"]["state"], "closed",
        "one hot row does not stop the fleet"
    );
    drop(server);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_goes_to_the_dlq_and_the_breaker_stays_closed() {
    let (db, sandbox, server, http) = orders_server("").await;
    for i in 0..40 {
        let (status, order) = if i % 2 == 0 {
            ("poison", 1 + i % 50)
        } else {
            ("paid", 1 + i % 50)
        };
        send(&http, &server, &format!("evt_p_{i}"), order, status).await;
    }
    wait_for(
        "20 poison messages dead-lettered",
        Duration::from_secs(20),
        async || queue_stats(&http, &server).await["dead_lettered"] == 20,
    )
    .await;
    wait_for(
        "20 good messages applied",
        Duration::from_secs(20),
        async || inbox_count(&db, "true").await == 20,
    )
    .await;
    let breaker = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(breaker["breaker"]["state"], "closed");
    assert!(
        breaker["breaker"]["history"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "no transition at all: {}",
        breaker["breaker"]["history"]
    );
    let out = std::process::Command::new(binary())
        .args([
            "dlq",
            "list",
            "--json",
            "--admin",
            &server.admin.to_string(),
            "--config",
        ])
        .arg(sandbox.config_path())
        .output()
        .expect("dlq list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let first = &list[0];
    assert_eq!(first["class"], "permanent");
    assert!(
        first["error"]
            .as_str()
            .is_some_and(|e| e.contains("constraint")),
        "{first}"
    );
    drop(server);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_opens_the_breaker_and_loses_nothing() {
    let breaker = r#"
[breaker]
[breaker.cool_down]
base_ms = 500
cap_ms = 1000
[breaker.ramp]
hold_ms = 300
[breaker.half_open]
successes_to_close = 1
[breaker.failure_ratio]
min_calls = 5
"#;
    let (db, _sandbox, server, http) = orders_server(breaker).await;

    // The database stops taking connections and loses the ones it had.
    let admin = crate::pg::connect("postgres").await;
    let cut = format!(
        "ALTER DATABASE {0} ALLOW_CONNECTIONS false;
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = '{0}' AND pid <> pg_backend_pid();",
        db.name
    );
    admin
        .batch_execute(&cut)
        .await
        .expect("cut the database off");

    for i in 0..60 {
        send(&http, &server, &format!("evt_down_{i}"), 1 + i % 50, "paid").await;
    }
    wait_for("the breaker to open", Duration::from_secs(20), async || {
        let b = http.get(&server.admin_url("/breaker")).await.json();
        b["breaker"]["history"]
            .as_array()
            .is_some_and(|h| h.iter().any(|t| t["to"] == "open"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            db.name
        ))
        .await
        .expect("restore");

    let db = db;
    let check = crate::pg::connect(&db.name).await;
    wait_for(
        "all 60 applied after recovery",
        Duration::from_secs(40),
        async || {
            check
                .query_one("SELECT count(*) FROM breakwater_inbox", &[])
                .await
                .map(|r| r.get::<_, i64>(0) == 60)
                .unwrap_or(false)
        },
    )
    .await;
    let stats = queue_stats(&http, &server).await;
    assert_eq!(stats["dead_lettered"], 0, "an outage dead-letters nothing");
    let total: i64 = check
        .query_one("SELECT sum(applied_count)::bigint FROM orders", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(total, 60, "each event applied exactly once");
    drop(server);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_delivery_is_applied_once() {
    let (db, _sandbox, server, http) = orders_server("").await;
    send(&http, &server, "evt_dup", 7, "paid").await;
    wait_for("applied", Duration::from_secs(10), async || {
        inbox_count(&db, "event_id = 'evt_dup'").await == 1
    })
    .await;
    // The issuer retries after the first was applied: answered 200, not applied again.
    let body = serde_json::to_vec(&serde_json::json!({
        "id": "evt_dup", "data": {"object": {"id": 7, "status": "paid"}}
    }))
    .expect("json");
    let a = post_stripe(&http, &server, body).await;
    assert_eq!(a.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(applied_counts(&db).await.get(&7), Some(&1));
    drop(server);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_or_releases_in_flight_work_and_exits() {
    // On the embedded store, which keeps leases on disk: whether the
    // message was released shows in its file.
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    let sandbox = Sandbox::with_embedded_queue(&sink_config(&db, ""));
    let mut server = sandbox.start();
    let http = Http::default();
    // Order 1042 is locked: its message sits in an apply, waiting on the lock.
    let locker = db.lock_order(1042).await;
    send(&http, &server, "evt_term_hot", 1042, "paid").await;
    for i in 0..5 {
        send(&http, &server, &format!("evt_term_{i}"), 1 + i, "paid").await;
    }
    wait_for(
        "the unrelated ones applied",
        Duration::from_secs(10),
        async || inbox_count(&db, "entity_key <> '1042'").await == 5,
    )
    .await;
    let pid = server.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    // It exits on its own, cleanly, within the lock timeout plus the grace.
    let deadline = Instant::now() + Duration::from_secs(25);
    let exit = loop {
        if let Some(exit) = server.child.try_wait().expect("try_wait") {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "still running 25 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(exit.success(), "exit status {exit}");
    // The hot message was not lost: it is back in the queue, not stuck in
    // flight under a lease nobody holds.
    let store = rusqlite::Connection::open(sandbox.queue_db()).expect("store");
    let (state, leased): (i64, bool) = store
        .query_row(
            "SELECT state, lease IS NOT NULL FROM messages WHERE event_id = 'evt_term_hot'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("the hot message is still stored");
    assert_eq!(state, 0, "pending, not dead-lettered");
    assert!(!leased, "released, not left leased");
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    db.drop_db().await;
}

/// One metric's `# TYPE` line and the label names of its samples.
fn scraped(text: &str, name: &str) -> (Option<String>, std::collections::BTreeSet<String>) {
    let kind = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
        .map(str::to_owned);
    let labels = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| rest.strip_prefix(s))
                .unwrap_or(rest);
            rest.strip_prefix('{')
        })
        .flat_map(|labels| {
            labels
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim().to_owned()))
                .collect::<Vec<_>>()
        })
        .filter(|k| k != "le" && k != "quantile")
        .collect();
    (kind, labels)
}

/// The operator's metrics, scraped from `/metrics` after real traffic
/// (applied, dead-lettered, refused, a trip and a reset): every name with
/// its type and labels, time in seconds as histograms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_their_names_types_labels_and_units_after_traffic() {
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    let sandbox = Sandbox::new(&sink_config(&db, ""));
    // A retention known, as on a broker that drops old messages.
    let server = Server::start_with_env(
        &sandbox.config_path(),
        "all",
        &[("BREAKWATER_QUEUE_RETENTION_SECS", "86400")],
    );
    let http = Http::default();
    for i in 0..6 {
        let status = if i == 0 { "poison" } else { "paid" };
        send(&http, &server, &format!("evt_metrics_{i}"), 1 + i, status).await;
    }
    // Signed for another body.
    let refused = http
        .post(
            &server.url("/webhooks/stripe"),
            &stripe_headers(b"{}", unix_now()),
            b"{\"id\":\"evt_x\"}".to_vec(),
        )
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    wait_for("5 applied", Duration::from_secs(20), async || {
        inbox_count(&db, "true").await == 5
    })
    .await;
    wait_for("1 dead-lettered", Duration::from_secs(20), async || {
        queue_stats(&http, &server).await["dead_lettered"] == 1
    })
    .await;
    let trip = http
        .admin_post(&server.admin_url("/breaker/trip?note=metrics"))
        .await;
    assert_eq!(trip.status, StatusCode::OK, "{:?}", trip.body);
    let reset = http
        .admin_post(&server.admin_url("/breaker/reset?force_closed=true"))
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);
    // The samplers publish the gauges once a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let metrics = http.get(&server.admin_url("/metrics")).await;
    assert_eq!(metrics.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    let expected: &[(&str, &str, &[&str])] = &[
        (
            "breakwater_ingress_requests_total",
            "counter",
            &["source", "status", "outcome"],
        ),
        (
            "breakwater_ingress_latency_seconds",
            "histogram",
            &["source"],
        ),
        ("breakwater_breaker_state", "gauge", &[]),
        (
            "breakwater_breaker_transitions_total",
            "counter",
            &["to", "reason"],
        ),
        ("breakwater_concurrency_limit", "gauge", &[]),
        ("breakwater_queue_visible", "gauge", &[]),
        ("breakwater_queue_inflight", "gauge", &[]),
        ("breakwater_queue_oldest_age_seconds", "gauge", &[]),
        ("breakwater_dlq_total", "counter", &["class"]),
        ("breakwater_apply_latency_seconds", "histogram", &[]),
        ("breakwater_apply_total", "counter", &["source", "outcome"]),
        ("breakwater_workers", "gauge", &["state"]),
        ("breakwater_db_lock_waiters", "gauge", &[]),
        ("breakwater_retention_headroom_seconds", "gauge", &[]),
    ];
    for (name, kind, labels) in expected {
        let (found, seen) = scraped(&text, name);
        assert_eq!(found.as_deref(), Some(*kind), "{name}'s type in:\n{text}");
        let want: std::collections::BTreeSet<String> =
            labels.iter().map(|l| (*l).to_owned()).collect();
        assert_eq!(seen, want, "{name}'s labels");
    }
    // The values say what happened.
    for line in [
        "breakwater_ingress_requests_total{source=\"stripe\",status=\"202\",outcome=\"accepted\"} 6",
        "breakwater_ingress_requests_total{source=\"stripe\",status=\"401\",outcome=\"unauthorized\"} 1",
        "breakwater_dlq_total{class=\"permanent\"} 1",
        "breakwater_apply_total{source=\"stripe\",outcome=\"success\"} 5",
        "breakwater_apply_total{source=\"stripe\",outcome=\"permanent\"} 1",
        "breakwater_breaker_transitions_total{to=\"open\",reason=\"forced_open\"} 1",
        "breakwater_breaker_transitions_total{to=\"closed\",reason=\"forced_closed\"} 1",
        "breakwater_workers{state=\"lock_wait\"} 0",
        "breakwater_queue_visible 0",
        "breakwater_retention_headroom_seconds 86400",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line} in:\n{text}"
        );
    }
    let breaker = http.get(&server.admin_url("/breaker")).await.json();
    let retention = &breaker["retention"];
    assert_eq!(retention["retention_secs"], 86400, "{breaker}");
    assert_eq!(retention["headroom_secs"], 86400.0, "{breaker}");
    assert_eq!(retention["at_risk"], false, "{breaker}");
    let queue = http.get(&server.admin_url("/queue")).await;
    assert_eq!(queue.status, StatusCode::OK);
    let queue = queue.json();
    assert_eq!(
        (
            &queue["visible"],
            &queue["in_flight"],
            &queue["dead_lettered"]
        ),
        (
            &serde_json::json!(0),
            &serde_json::json!(0),
            &serde_json::json!(1)
        ),
        "{queue}"
    );
    assert_eq!(queue["oldest_age_secs"], 0.0, "{queue}");
    assert!(queue["net_drain_per_sec"].is_number(), "{queue}");
    assert!(queue["drain_secs"].is_null(), "nothing to drain: {queue}");
    assert_eq!(queue["retention"]["headroom_secs"], 86400.0, "{queue}");
    // Every metric the shipped Grafana dashboard and alerting rules query
    // is one this scrape has.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for file in [
        "deploy/grafana/breakwater.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let shipped = std::fs::read_to_string(root.join(file)).expect(file);
        let queried = metric_names(&shipped);
        assert!(queried.len() >= 4, "{file} queries {queried:?}");
        for name in queried {
            let (kind, _) = scraped(&text, &name);
            assert!(
                kind.is_some(),
                "{file} queries {name}, which /metrics does not have"
            );
        }
    }
    drop(server);
    db.drop_db().await;
}

/// The `breakwater_*` metric names in a text, without a histogram's
/// `_bucket`, `_sum` or `_count`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("breakwater_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(name.to_owned());
        rest = &tail[end..];
    }
    names
}

/// Each thread of process `pid`: its name and its nice value (Linux's
/// `/proc/PID/task/TID/stat`, the 19th field).
fn thread_nices(pid: u32) -> Vec<(String, i32)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let dir = task.expect("task").path();
        let (Ok(name), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue; // the thread ended meanwhile
        };
        // After the name in parentheses: state is field 3, nice field 19.
        let after_name = &stat[stat.rfind(')').expect("stat") + 1..];
        let nice = after_name
            .split_whitespace()
            .nth(16)
            .and_then(|n| n.parse().ok())
            .expect("nice field");
        threads.push((name.trim().to_owned(), nice));
    }
    threads
}

/// Applies `n` webhooks through `server` (its SQLite sink) and waits until
/// the queue has acknowledged them all.
async fn apply_webhooks(http: &Http, server: &Server, prefix: &str, n: u64) {
    for i in 0..n {
        let event = stripe_event(&format!("{prefix}_{i}"), &i.to_string());
        let answer = post_stripe(http, server, event).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{:?}", answer.body);
    }
    wait_for(
        "the webhooks to be applied",
        Duration::from_secs(20),
        async || queue_stats(http, server).await["acked_total"].as_u64() >= Some(n),
    )
    .await;
}

/// Beside the ingress (role `all`) the workers run on threads of their
/// own, `workers.nice` steps below the ingress's, and apply as before; with
/// `workers.nice = 0` they share the ingress's threads.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_the_ingress_the_workers_run_at_a_lower_cpu_priority() {
    let http = Http::default();
    let sandbox = Sandbox::new("");
    let server = sandbox.start();
    apply_webhooks(&http, &server, "evt_nice", 3).await;
    let threads = thread_nices(server.child.id());
    let base = threads
        .iter()
        .find(|(name, _)| name == "breakwater")
        .map(|(_, nice)| *nice)
        .unwrap_or_else(|| panic!("no main thread in {threads:?}"));
    let apply: Vec<i32> = threads
        .iter()
        .filter(|(name, _)| name == "bw-apply")
        .map(|(_, nice)| *nice)
        .collect();
    assert!(!apply.is_empty(), "no worker thread in {threads:?}");
    let lowered = (base + 10).min(19);
    assert!(
        apply.iter().all(|&nice| nice == lowered),
        "workers at {apply:?}, want {lowered}: {threads:?}"
    );
    // The main runtime's threads (`tokio-rt-worker`, blocking ones
    // too), the queue's writer and the rest stay where they were.
    let others: Vec<i32> = threads
        .iter()
        .filter(|(name, _)| name != "bw-apply")
        .map(|(_, nice)| *nice)
        .collect();
    assert!(
        threads.iter().any(|(name, _)| name.starts_with("tokio-")),
        "no ingress thread in {threads:?}"
    );
    assert!(
        others.iter().all(|&nice| nice == base),
        "the ingress's threads moved: {threads:?}"
    );
    drop(server);

    let sandbox = Sandbox::new("[workers]\nnice = 0\n");
    let server = sandbox.start();
    apply_webhooks(&http, &server, "evt_nice_zero", 3).await;
    let threads = thread_nices(server.child.id());
    assert!(
        threads.iter().all(|(name, _)| name != "bw-apply"),
        "nice = 0 keeps one runtime: {threads:?}"
    );
}
