//! What the log may carry, through the real binary: no payload and no
//! credential whatever `RUST_LOG` asks for, and one event on one line
//! whatever a request or a signed event id holds.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::pg::ScratchDb;
use crate::utils::*;
use crate::worker::{ORDERS, send};

/// The lines `server` logs from now until it is `quiet` that long.
fn lines(server: &Server, quiet: Duration) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(line) = server.log.recv_timeout(quiet) {
        out.push(line);
    }
    out
}

/// Waits until order `id` has `status` in `db`.
async fn wait_for_status(db: &ScratchDb, id: i64, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let row = db
            .client
            .query_one("SELECT status FROM orders WHERE id = $1", &[&id])
            .await
            .expect("order row");
        if row.get::<_, String>(0) == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "order {id} never became {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// tokio-postgres logs every statement's parameters at DEBUG; hyper and
/// the brokers' clients log what they carry. With `RUST_LOG=trace` the
/// log still holds neither the payload's values nor the sink's password.
#[tokio::test]
async fn the_most_verbose_log_carries_no_payload_and_no_credential() {
    const CARD: &str = "cvc_4242_0451";
    const PASSWORD: &str = "hunter2_in_the_url";
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    // Trust auth: the password is sent and ignored.
    let url = db
        .url()
        .replacen("postgres@", &format!("postgres:{PASSWORD}@"), 1);
    let sandbox = Sandbox::new(&crate::worker::sink_config(&db, "").replace(&db.url(), &url));
    let server = Server::start_with_env(&sandbox.config_path(), "all", &[("RUST_LOG", "trace")]);
    let http = Http::default();
    send(&http, &server, "evt_log_1", 7, CARD).await;
    wait_for_status(&db, 7, CARD).await;
    let mut log = server.startup.clone();
    log.extend(lines(&server, Duration::from_millis(500)));
    assert!(
        log.iter()
            .any(|l| l.contains("DEBUG") || l.contains("TRACE")),
        "the log is as verbose as asked"
    );
    let leaks: Vec<&String> = log
        .iter()
        .filter(|l| l.contains(CARD) || l.contains(PASSWORD))
        .collect();
    assert!(leaks.is_empty(), "{} line(s) leak: {leaks:#?}", leaks.len());
    drop(server);
    db.drop_db().await;
}

/// A newline in a request path (no signature needed, logged at DEBUG) and
/// in a signed event id (logged at WARN when its message is
/// dead-lettered) is written escaped: no line of the log starts with the
/// forged text.
#[tokio::test]
async fn a_newline_in_a_path_or_an_event_id_cannot_forge_a_log_line() {
    const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO breakwater: forged";
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    let sandbox = Sandbox::new(&crate::worker::sink_config(&db, ""));
    let server = Server::start_with_env(&sandbox.config_path(), "all", &[("RUST_LOG", "debug")]);
    let http = Http::default();

    let path = format!("/webhooks/nope%0A{}", FORGED.replace(' ', "%20"));
    let body = stripe_event("evt_path", "1");
    let a = http
        .post(&server.url(&path), &stripe_headers(&body, unix_now()), body)
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{:?}", a.body);

    // `poison` breaks the orders table's CHECK: dead-lettered, logged at
    // WARN with its event id.
    send(&http, &server, &format!("evt_id\n{FORGED}"), 3, "poison").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = Vec::new();
    while !log.iter().any(|l: &String| l.contains("dead-lettered")) {
        assert!(Instant::now() < deadline, "never dead-lettered: {log:#?}");
        log.extend(lines(&server, Duration::from_millis(200)));
    }
    log.extend(lines(&server, Duration::from_millis(300)));

    let logged: Vec<&String> = log.iter().filter(|l| l.contains("forged")).collect();
    assert!(logged.len() >= 2, "both were logged: {log:#?}");
    let forged: Vec<&String> = log.iter().filter(|l| l.starts_with(FORGED)).collect();
    assert!(forged.is_empty(), "forged lines: {forged:#?}");
    drop(server);
    db.drop_db().await;
}
