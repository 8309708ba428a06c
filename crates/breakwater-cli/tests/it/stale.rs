//! The stale-event guard through the real binary, the segment log and a
//! real PostgreSQL: Stripe webhooks of one order sent newest `created`
//! first end at the newest state, the older ones superseded (told by
//! `GET /events/...` and `breakwater events show`, counted in
//! `breakwater_events_superseded_total`), and an old event dead-lettered
//! earlier and replayed from the DLQ once fixed is superseded too, not
//! applied over the newer state. A forwarded webhook carries its version
//! for the receiver.

use std::process::Command;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::pg::ScratchDb;
use crate::receiver::{Receiver, always};
use crate::utils::*;
use crate::worker::{ORDERS, sink_config};

/// Sends a Stripe event for `order`, created at `created`, and expects 202.
async fn send_created(
    http: &Http,
    server: &Server,
    event_id: &str,
    order: i64,
    status: &str,
    created: i64,
) {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": event_id,
        "object": "event",
        "created": created,
        "type": "order.updated",
        "data": {"object": {"id": order, "status": status}}
    }))
    .expect("json");
    let a = post_stripe(http, server, body).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
}

/// Polls the event's story until `done` holds.
async fn story_when(
    http: &Http,
    server: &Server,
    event_id: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = http
            .get(&server.admin_url(&format!("/events/stripe/{event_id}")))
            .await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        let story = a.json();
        if done(&story) {
            return story;
        }
        assert!(
            Instant::now() < deadline,
            "{event_id} never got there: {story:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn superseded_by(story: &serde_json::Value) -> Option<&str> {
    story["applied"]["superseded_by"].as_str()
}

/// The last attempt this node made, once the worker wrote it down (the
/// inbox row commits first).
fn last_outcome(story: &serde_json::Value) -> Option<&str> {
    story["attempts"].as_array()?.last()?["outcome"].as_str()
}

async fn order_1042(db: &ScratchDb) -> (String, i32) {
    let row = db
        .client
        .query_one(
            "SELECT status, applied_count FROM orders WHERE id = 1042",
            &[],
        )
        .await
        .expect("order 1042");
    (row.get(0), row.get(1))
}

async fn superseded_total(http: &Http, server: &Server) -> Option<u64> {
    let metrics = http.get(&server.admin_url("/metrics")).await;
    String::from_utf8_lossy(&metrics.body)
        .lines()
        .find(|l| l.starts_with("breakwater_events_superseded_total{source=\"stripe\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The binary with `args`, no config from the environment.
fn breakwater(args: &[&str]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .env_remove("BREAKWATER_CONFIG")
        .output()
        .expect("run breakwater")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_stripe_webhooks_and_an_old_replay_are_superseded_by_the_newest() {
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    // The Stripe source sets no `version`: its default is `json:/created`.
    let sandbox = Sandbox::new(&sink_config(&db, ""));
    let server = sandbox.start();
    let http = Http::default();

    // An old event whose statement fails permanently (the CHECK refuses
    // 'poison'): dead-lettered, as it would be before a fix.
    send_created(&http, &server, "evt_old", 1042, "poison", 1_700_000_050).await;
    story_when(&http, &server, "evt_old", |s| s["state"] == "dead_lettered").await;

    // Three webhooks of order 1042, newest `created` first; the newest is
    // applied before the older ones come.
    send_created(&http, &server, "evt_300", 1042, "refunded", 1_700_000_300).await;
    story_when(&http, &server, "evt_300", |s| {
        last_outcome(s) == Some("applied")
    })
    .await;
    send_created(&http, &server, "evt_200", 1042, "shipped", 1_700_000_200).await;
    send_created(&http, &server, "evt_100", 1042, "paid", 1_700_000_100).await;
    for id in ["evt_200", "evt_100"] {
        let story = story_when(&http, &server, id, |s| {
            last_outcome(s) == Some("superseded")
        })
        .await;
        assert_eq!(story["state"], "applied", "settled: {story:#}");
        assert_eq!(superseded_by(&story), Some("evt_300"), "{story:#}");
        let detail = story["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("superseded by evt_300"), "{detail}");
        let last = &story["attempts"][story["attempts"].as_array().map_or(0, Vec::len) - 1];
        assert_eq!(last["note"], "superseded by evt_300", "{story:#}");
        assert!(last["class"].is_null(), "not a failure: {story:#}");
    }
    assert_eq!(
        order_1042(&db).await,
        ("refunded".to_owned(), 1),
        "the newest state, and only the newest's statement ran"
    );
    assert_eq!(superseded_total(&http, &server).await, Some(2));
    let admin = server.admin.to_string();
    let out = breakwater(&["events", "show", "stripe", "evt_100", "--admin", &admin]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("superseded by evt_300"), "{text}");

    // The fix, then the old event replayed from the DLQ: older than what
    // its order holds, so superseded, not applied over the newer state.
    db.client
        .batch_execute("ALTER TABLE orders DROP CONSTRAINT orders_status_check")
        .await
        .expect("the fix");
    let dlq = http.get(&server.admin_url("/dlq")).await.json();
    let id = dlq["items"]
        .as_array()
        .and_then(|items| items.iter().find(|d| d["event_id"] == "evt_old"))
        .and_then(|d| d["id"].as_str())
        .unwrap_or_else(|| panic!("evt_old is not in the DLQ: {dlq:#}"))
        .to_owned();
    let config = sandbox.config_path();
    let config = config.to_str().expect("utf-8 path");
    let out = breakwater(&["dlq", "replay", &id, "--config", config, "--admin", &admin]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed = story_when(&http, &server, "evt_old", |s| {
        last_outcome(s) == Some("superseded")
    })
    .await;
    assert_eq!(superseded_by(&replayed), Some("evt_300"), "{replayed:#}");
    assert_eq!(order_1042(&db).await, ("refunded".to_owned(), 1));
    assert_eq!(superseded_total(&http, &server).await, Some(3));
}

/// A forwarded webhook carries its version in `Breakwater-Version` (none
/// when it has none): the receiver decides what an older one means.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_webhook_carries_its_version_for_the_receiver() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"{}\" }}\n",
        receiver.url("/hooks/stripe")
    ));
    let server = sandbox.start();
    let http = Http::default();
    send_created(&http, &server, "evt_versioned", 1042, "paid", 1_700_000_300).await;
    let a = post_stripe(&http, &server, stripe_event("evt_unversioned", "1042")).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    let got = receiver.wait_for(2, Duration::from_secs(20)).await;
    let version_of = |id: &str| {
        let r = got
            .iter()
            .find(|r| r.headers.get("idempotency-key").is_some_and(|v| v == id))
            .unwrap_or_else(|| panic!("{id} not received: {got:?}"));
        r.headers
            .get("breakwater-version")
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    assert_eq!(version_of("evt_versioned").as_deref(), Some("1700000300"));
    assert_eq!(version_of("evt_unversioned"), None);
}
