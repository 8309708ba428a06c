//! The HTTP forward sink through the real binary: a source with
//! `forward = { url = ... }` delivers to a real HTTP service the test
//! starts ([`Receiver`]), signed, under the breaker, retries and DLQ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use breakwater_verify::{Scheme, Verifier};
use http::StatusCode;

use crate::receiver::{Receiver, Reply, always};
use crate::utils::*;

/// The Standard Webhooks secret the forwarded requests are signed with.
const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SECRET_ENV: &str = "BW_TEST_FORWARD_SECRET";

/// A sandbox whose stripe source forwards to `receiver`, with `extra`
/// keys in its `forward` table.
fn forwarding(receiver: &Receiver, extra: &str) -> Sandbox {
    Sandbox::new(&format!(
        "forward = {{ url = \"{}\", secret_env = \"{SECRET_ENV}\"{extra} }}\n",
        receiver.url("/hooks/stripe")
    ))
}

fn start(sandbox: &Sandbox) -> Server {
    Server::start_with_env(
        &sandbox.config_path(),
        "all",
        &[(SECRET_ENV, FORWARD_SECRET)],
    )
}

/// Sends a Stripe event whose entity key is its own id: one key's
/// webhooks go one at a time (`workers.order`), and the breaker's checks
/// here need many calls at once.
async fn send(http: &Http, server: &Server, event_id: &str) -> Answer {
    let a = post_stripe(http, server, stripe_event(event_id, event_id)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    a
}

/// A receiver script: 503 for `down_for`, then 200.
fn down_then_up(down_for: Duration) -> crate::receiver::Script {
    Arc::new(move |_, elapsed| {
        if elapsed < down_for {
            Reply::Status(StatusCode::SERVICE_UNAVAILABLE, Vec::new())
        } else {
            Reply::Status(StatusCode::OK, Vec::new())
        }
    })
}

/// Waits until `receiver` answered 200 (asked once `down_for` was over)
/// to every one of `ids` and the queue is settled, with nothing
/// dead-lettered.
async fn all_delivered_once_back(
    receiver: &Receiver,
    ids: &[String],
    down_for: Duration,
    http: &Http,
    server: &Server,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delivered: std::collections::BTreeSet<String> = receiver
            .received()
            .iter()
            .filter(|r| r.at.duration_since(receiver.started) >= down_for)
            .map(|r| header(r, "idempotency-key").to_owned())
            .collect();
        let stats = queue_stats(http, server).await;
        if ids.iter().all(|id| delivered.contains(id))
            && stats["visible"] == 0
            && stats["in_flight"] == 0
            && stats["delayed"] == 0
        {
            assert_eq!(stats["dead_lettered"], 0, "{stats}");
            return;
        }
        assert!(Instant::now() < deadline, "not all delivered: {stats}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn header<'a>(r: &'a crate::receiver::Received, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header in {:?}", r.headers))
}

/// The original body and content type arrive with the event id as
/// `Idempotency-Key` and `webhook-id`, the source, the attempt number, and
/// a Standard Webhooks signature the receiver verifies with the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_the_body_signed_with_the_headers_a_receiver_needs() {
    let receiver = Receiver::start(always(StatusCode::NO_CONTENT)).await;
    let sandbox = forwarding(&receiver, "");
    let server = start(&sandbox);
    let http = Http::default();
    for i in 0..5 {
        send(&http, &server, &format!("evt_fwd_{i}")).await;
    }
    let got = receiver.wait_for(5, Duration::from_secs(10)).await;
    let verifier = Verifier::new(Scheme::standard(), &[FORWARD_SECRET.to_owned()]).expect("key");
    for r in &got {
        let id = header(r, "idempotency-key");
        assert!(id.starts_with("evt_fwd_"), "{id}");
        assert_eq!(header(r, "webhook-id"), id);
        assert_eq!(header(r, "breakwater-source"), "stripe");
        assert_eq!(header(r, "breakwater-attempt"), "1");
        assert_eq!(header(r, "content-type"), "application/json");
        assert_eq!(r.body.as_ref(), stripe_event(id, id).as_slice());
        verifier
            .verify(&r.headers, &r.body, unix_now())
            .expect("the receiver verifies the signature");
    }
    // Signed with another secret, it would not verify.
    let other = Verifier::new(
        Scheme::standard(),
        &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()],
    )
    .expect("key");
    assert!(
        other
            .verify(&got[0].headers, &got[0].body, unix_now())
            .is_err()
    );
}

/// A 429 with `Retry-After: 2`: the next attempt comes no earlier than
/// 2 s later, numbered 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let receiver = Receiver::start(Arc::new(|n, _| {
        if n == 0 {
            Reply::Status(
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "2".to_owned())],
            )
        } else {
            Reply::Status(StatusCode::OK, Vec::new())
        }
    }))
    .await;
    let sandbox = forwarding(&receiver, "");
    let server = start(&sandbox);
    let http = Http::default();
    send(&http, &server, "evt_429").await;
    let got = receiver.wait_for(2, Duration::from_secs(15)).await;
    let waited = got[1].at - got[0].at;
    assert!(
        waited >= Duration::from_secs(2),
        "retried after {waited:?}, before the 2 s asked"
    );
    assert_eq!(header(&got[1], "breakwater-attempt"), "2");
}

/// A 400 is the message's fault: each goes to the DLQ with the status and
/// the receiver's words, once, and the breaker does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_is_dead_lettered_and_the_breaker_stays_closed() {
    let receiver = Receiver::start(always(StatusCode::BAD_REQUEST)).await;
    let sandbox = forwarding(&receiver, "");
    let server = start(&sandbox);
    let http = Http::default();
    for i in 0..3 {
        send(&http, &server, &format!("evt_bad_{i}")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let dlq = loop {
        let list = http.get(&server.admin_url("/dlq")).await.json();
        if list["items"].as_array().map_or(0, Vec::len) == 3 {
            break list;
        }
        assert!(Instant::now() < deadline, "DLQ: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for item in dlq["items"].as_array().into_iter().flatten() {
        assert_eq!(item["class"], "permanent", "{item}");
        let error = item["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("400") && error.contains("receiver says"),
            "{item}"
        );
    }
    assert_eq!(
        receiver.received().len(),
        3,
        "a permanent failure was retried"
    );
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "closed", "{view}");
}

/// Redirects: with `follow_redirects = 1` a 307 to another path is
/// followed with the same POST, body and signature; a second one in a row
/// is not, nor a 302 (it would turn the POST into a GET): those, like any
/// redirect with the default of 0, are dead-lettered with the status and
/// where it pointed, and the breaker stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_configured_redirects_are_followed() {
    // evt 0: 307 to /moved, then 200; evt 1: 307 twice; evt 2: a 302.
    let receiver = Receiver::start(Arc::new(|n, _| {
        let to = |status, path: &str| Reply::Status(status, vec![("location", path.to_owned())]);
        match n {
            0 => to(StatusCode::TEMPORARY_REDIRECT, "/moved"),
            1 => Reply::Status(StatusCode::OK, Vec::new()),
            2 => to(StatusCode::PERMANENT_REDIRECT, "/again"),
            3 => to(StatusCode::TEMPORARY_REDIRECT, "/and-again"),
            4 => to(StatusCode::FOUND, "/get-me"),
            _ => to(StatusCode::TEMPORARY_REDIRECT, "/moved"),
        }
    }))
    .await;
    let sandbox = forwarding(&receiver, ", follow_redirects = 1");
    let server = start(&sandbox);
    let http = Http::default();
    // One at a time, so the receiver's answers go to the event meant.
    send(&http, &server, "evt_redirect_0").await;
    let got = receiver.wait_for(2, Duration::from_secs(15)).await;
    assert_eq!(got[0].path, "/hooks/stripe");
    assert_eq!(got[1].path, "/moved");
    assert_eq!(got[0].body, got[1].body, "the same body, posted again");
    for r in &got[..2] {
        assert_eq!(header(r, "idempotency-key"), "evt_redirect_0");
        assert!(!header(r, "webhook-signature").is_empty());
    }
    send(&http, &server, "evt_redirect_1").await;
    receiver.wait_for(4, Duration::from_secs(15)).await;
    send(&http, &server, "evt_redirect_2").await;
    receiver.wait_for(5, Duration::from_secs(15)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let dlq = loop {
        let list = http.get(&server.admin_url("/dlq")).await.json();
        if list["items"].as_array().map_or(0, Vec::len) == 2 {
            break list;
        }
        assert!(Instant::now() < deadline, "DLQ: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let errors: Vec<String> = dlq["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["error"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("307")
            && e.contains("/and-again")
            && e.contains("more than 1 redirect")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("302") && e.contains("/get-me") && e.contains("307 and 308")),
        "{errors:?}"
    );
    assert_eq!(receiver.received().len(), 5, "nothing retried");
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "closed", "{view}");
}

/// A receiver that takes the request and never answers: the timeout frees
/// the slot and the message is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_times_out_and_is_retried() {
    let receiver = Receiver::start(Arc::new(|n, _| {
        if n == 0 {
            Reply::Hang
        } else {
            Reply::Status(StatusCode::OK, Vec::new())
        }
    }))
    .await;
    let sandbox = forwarding(&receiver, ", timeout_ms = 500");
    let server = start(&sandbox);
    let http = Http::default();
    send(&http, &server, "evt_hang").await;
    let got = receiver.wait_for(2, Duration::from_secs(15)).await;
    assert!(got[1].at - got[0].at >= Duration::from_millis(500));
    assert_eq!(header(&got[1], "idempotency-key"), "evt_hang");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = queue_stats(&http, &server).await;
        if stats["visible"] == 0 && stats["in_flight"] == 0 && stats["delayed"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not settled: {stats}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The receiver down (503) for a while: the breaker opens, nothing but
/// its half-open probes reaches the receiver while it is open, nothing is
/// dead-lettered, and once it answers again every webhook arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_opens_the_breaker_and_gets_everything_afterwards() {
    let down_for = Duration::from_secs(6);
    let receiver = Receiver::start(down_then_up(down_for)).await;
    let sandbox = forwarding(&receiver, "");
    let server = start(&sandbox);
    let http = Http::default();
    let ids: Vec<String> = (0..40).map(|i| format!("evt_down_{i}")).collect();
    for id in &ids {
        send(&http, &server, id).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    all_delivered_once_back(&receiver, &ids, down_for, &http, &server).await;
    let view = http.get(&server.admin_url("/breaker")).await.json();
    let asked = Instant::now();
    let history = view["breaker"]["history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        history.iter().any(|t| t["to"] == "open"),
        "the breaker never opened: {view}"
    );
    // Nothing reached the receiver while the breaker was open (only its
    // half-open probes). The transitions' times come from the history
    // (`ago_ms`); a request is judged only when no transition lies within
    // 30 ms of its arrival (one sent just before a transition may arrive
    // just after it, a probe a moment after half-open began).
    let timeline: Vec<(Instant, String)> = history
        .iter()
        .filter_map(|t| {
            let ago = Duration::from_millis(t["ago_ms"].as_u64()?);
            Some((asked.checked_sub(ago)?, t["to"].as_str()?.to_owned()))
        })
        .collect();
    let margin = Duration::from_millis(30);
    let mut while_open = Vec::new();
    for r in receiver.received() {
        let near = timeline.iter().any(|(t, _)| {
            t.saturating_duration_since(r.at) < margin
                && r.at.saturating_duration_since(*t) < margin
        });
        let state = timeline
            .iter()
            .rev()
            .find(|(t, _)| *t <= r.at)
            .map(|(_, s)| s.as_str());
        if !near && state == Some("open") {
            while_open.push(r.at.duration_since(receiver.started));
        }
    }
    assert!(
        while_open.is_empty(),
        "requests reached the receiver while the breaker was open, at {while_open:?}: {view}"
    );
    // And the breaker did open while the receiver was still down.
    let opened_while_down = timeline
        .iter()
        .any(|(t, s)| s == "open" && t.saturating_duration_since(receiver.started) < down_for);
    assert!(opened_while_down, "{view}");
}

/// Two targets, one down: the other keeps receiving while the down one's
/// own gate holds its webhooks back (the process's breaker never opens, so
/// the database's sources flow too); nothing is dead-lettered, and once
/// the down one answers again it gets every webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_target_down_pauses_neither_the_other_nor_the_breaker() {
    let down_for = Duration::from_secs(6);
    let down = Receiver::start(down_then_up(down_for)).await;
    let up = Receiver::start(always(StatusCode::OK)).await;
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"{}\" }}\n\n[[source]]\nname = \"second\"\nscheme = \"stripe\"\n\
         secrets = [\"{STRIPE_SECRET}\"]\nforward = {{ url = \"{}\" }}\n",
        down.url("/down"),
        up.url("/up")
    ));
    let server = start(&sandbox);
    let http = Http::default();
    let n = 30;
    for i in 0..n {
        send(&http, &server, &format!("evt_down_{i}")).await;
        let body = stripe_event(&format!("evt_up_{i}"), "7");
        let headers = stripe_headers(&body, unix_now());
        let a = http
            .post(&server.url("/webhooks/second"), &headers, body)
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    // All of the healthy target's, while the other is still down.
    let got = up.wait_for(n, Duration::from_secs(5)).await;
    let last = got.iter().map(|r| r.at).max().expect("requests");
    assert!(
        last.duration_since(down.started) < down_for,
        "the healthy target waited for the down one"
    );
    let seen_while_down = down
        .received()
        .iter()
        .filter(|r| r.at.duration_since(down.started) < down_for)
        .count();
    let ids: Vec<String> = (0..n).map(|i| format!("evt_down_{i}")).collect();
    all_delivered_once_back(&down, &ids, down_for, &http, &server).await;
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(
        view["breaker"]["history"].as_array().map(Vec::len),
        Some(0),
        "the process's breaker moved for one target: {view}"
    );
    // Its gate held the down one's webhooks back: far fewer requests than
    // one per webhook per retry while it was down.
    assert!(
        seen_while_down < 3 * n,
        "{seen_while_down} requests reached the down target while it was down"
    );
}

/// A target that refuses connections opens the breaker; once it accepts
/// them again, the controller's connect check ends the cool-down early:
/// the webhooks arrive within seconds of its return, well before the 20 s
/// cool-down would have ended, and the history says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_back_from_refusing_connections_is_found_before_the_cool_down_ends() {
    use breakwater_faultproxy::{Fault, FaultProxy};
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let proxy = FaultProxy::start("127.0.0.1:0".parse().expect("addr"), receiver.addr)
        .await
        .expect("proxy");
    proxy.set(Fault::Refuse);
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"http://{}/hooks/stripe\", secret_env = \"{SECRET_ENV}\", \
         connect_timeout_ms = 200 }}\n\n\
         [breaker.cool_down]\nbase_ms = 20000\ncap_ms = 20000\njitter = 0.0\n",
        proxy.local_addr()
    ));
    let server = start(&sandbox);
    let http = Http::default();
    let ids: Vec<String> = (0..30).map(|i| format!("evt_refused_{i}")).collect();
    for id in &ids {
        send(&http, &server, id).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = http.get(&server.admin_url("/breaker")).await.json();
        if view["breaker"]["state"] == "open" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the breaker never opened: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(receiver.received().is_empty(), "nothing got through yet");
    proxy.set(Fault::None);
    let back = Instant::now();
    all_delivered_once_back(&receiver, &ids, Duration::ZERO, &http, &server).await;
    let first = receiver
        .received()
        .iter()
        .map(|r| r.at)
        .min()
        .expect("deliveries");
    let after = first.saturating_duration_since(back);
    println!("first delivery {after:?} after the target came back");
    assert!(
        after < Duration::from_secs(6),
        "the first delivery came {after:?} after the target was back (the cool-down had 18 s left)"
    );
    let view = http.get(&server.admin_url("/breaker")).await.json();
    let history = view["breaker"]["history"].to_string();
    assert!(
        history.contains("the dependency answers again"),
        "the early half-open names the reachability check: {history}"
    );
    proxy.shutdown().await;
}

/// The DLQ through the admin API: a dead letter replayed with
/// `POST /dlq/replay` waits while the breaker is open and is delivered
/// after the reset (followed at `GET /dlq/replay`); another is deleted with
/// `POST /dlq/purge`; requests that name nothing are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dlq_is_replayed_and_purged_through_the_admin_api() {
    // The first two requests are refused (400: dead-lettered), the rest
    // accepted.
    let receiver = Receiver::start(Arc::new(|n, _| {
        let status = if n < 2 {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        };
        Reply::Status(status, Vec::new())
    }))
    .await;
    let sandbox = forwarding(&receiver, "");
    let server = start(&sandbox);
    let http = Http::default();
    let json = [(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    )];
    let post = |path: &'static str, body: serde_json::Value| {
        let url = server.admin_url(path);
        let http = &http;
        let json = &json;
        async move {
            http.post(&url, json, serde_json::to_vec(&body).expect("json"))
                .await
        }
    };
    let dead_letters = |n: usize| {
        let url = server.admin_url("/dlq");
        let http = &http;
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let list = http.get(&url).await.json();
                let items = list["items"].as_array().cloned().unwrap_or_default();
                if items.len() == n {
                    return items;
                }
                assert!(
                    Instant::now() < deadline,
                    "{n} dead letters expected: {list}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    send(&http, &server, "evt_replayed").await;
    let first = dead_letters(1).await;
    send(&http, &server, "evt_purged").await;
    let both = dead_letters(2).await;
    let id_of = |items: &[serde_json::Value], event: &str| {
        items
            .iter()
            .find(|d| d["event_id"] == event)
            .and_then(|d| d["id"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("{event} not in {items:?}"))
    };
    assert_eq!(id_of(&first, "evt_replayed"), id_of(&both, "evt_replayed"));

    // Nothing named: refused, nothing started.
    let refused = post("/dlq/replay", serde_json::json!({})).await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        refused.body
    );
    assert_eq!(refused.json()["error"], "bad_request");
    let refused = post("/dlq/purge", serde_json::json!({"ids": ["1"], "all": true})).await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        refused.body
    );
    let none = http.get(&server.admin_url("/dlq/replay")).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "no replay yet");

    // Replay while the breaker is open: it waits.
    let trip = http.admin_post(&server.admin_url("/breaker/trip")).await;
    assert_eq!(trip.status, StatusCode::OK, "{:?}", trip.body);
    let started = post(
        "/dlq/replay",
        serde_json::json!({"ids": [id_of(&both, "evt_replayed")], "rate": 50.0}),
    )
    .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{:?}", started.body);
    assert_eq!(started.json()["running"], true);
    let again = post("/dlq/replay", serde_json::json!({"all": true})).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "one replay at a time");
    assert_eq!(again.json()["error"], "replay_running");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = http.get(&server.admin_url("/dlq/replay")).await.json();
    assert_eq!(held["waiting_for_breaker"], true, "{held}");
    assert_eq!(held["replayed"], 0, "{held}");
    assert_eq!(
        receiver.received().len(),
        2,
        "nothing more reached the service"
    );

    // Reset: the replay goes on, the webhook is delivered.
    let reset = http.admin_post(&server.admin_url("/breaker/reset")).await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let s = http.get(&server.admin_url("/dlq/replay")).await.json();
        if s["running"] == false {
            break s;
        }
        assert!(Instant::now() < deadline, "the replay never ended: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["replayed"], 1, "{done}");
    assert_eq!(done["skipped"], 0, "{done}");
    assert!(done["error"].is_null(), "{done}");
    let left = dead_letters(1).await;
    assert_eq!(left[0]["event_id"], "evt_purged");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !receiver
        .received()
        .iter()
        .skip(2)
        .any(|r| header(r, "idempotency-key") == "evt_replayed")
    {
        assert!(
            Instant::now() < deadline,
            "the replayed webhook never arrived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The CLI on this service's config goes through the same API.
    let pinned = sandbox.dir.path().join("pinned.toml");
    let config = std::fs::read_to_string(sandbox.config_path()).expect("config");
    let admin_line = "[admin]\nlisten = \"127.0.0.1:0\"";
    assert!(config.contains(admin_line), "{config}");
    std::fs::write(
        &pinned,
        config.replace(
            admin_line,
            &format!("[admin]\nlisten = \"{}\"", server.admin),
        ),
    )
    .expect("write the pinned config");
    let out = std::process::Command::new(binary())
        .args(["dlq", "list", "--json", "--config"])
        .arg(&pinned)
        .env(SECRET_ENV, FORWARD_SECRET)
        .output()
        .expect("dlq list");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("opening the queue directly"), "{stderr}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(listed[0]["event_id"], "evt_purged", "{listed}");

    // Purge the other one.
    let purged = post("/dlq/purge", serde_json::json!({"all": true})).await;
    assert_eq!(purged.status, StatusCode::OK, "{:?}", purged.body);
    assert_eq!(purged.json()["purged"], 1);
    dead_letters(0).await;
    assert_eq!(
        receiver.received().len(),
        3,
        "the purged one was never sent again"
    );
}

/// A password in the forward URL's user info.
const URL_PASSWORD: &str = "pw-5ecret-in-url";
/// A token in the forward URL's query.
const URL_TOKEN: &str = "tok-5ecret-in-query";

/// The text `breakwater config check` prints for `config`, with `json`
/// or not, stdout and stderr together.
fn config_check(config: &std::path::Path, json: bool) -> String {
    let mut args = vec!["config", "check"];
    if json {
        args.push("--json");
    }
    let out = std::process::Command::new(binary())
        .args(&args)
        .arg("--config")
        .arg(config)
        .env_remove("BREAKWATER_CONFIG")
        .env(SECRET_ENV, FORWARD_SECRET)
        .output()
        .expect("config check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits until the DLQ holds `n` entries, and returns them.
async fn dead_letters(http: &Http, server: &Server, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = http.get(&server.admin_url("/dlq")).await.json();
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if items.len() == n {
            return items;
        }
        assert!(
            Instant::now() < deadline,
            "{n} dead letters expected: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `text` carries neither secret of the forward URL.
fn assert_no_url_secret(what: &str, text: &str) {
    assert!(
        !text.contains(URL_PASSWORD) && !text.contains(URL_TOKEN),
        "{what} shows a secret of the forward URL: {text}"
    );
}

/// A forward URL's user-info password and query values are shown nowhere:
/// not in the DLQ entries (a 400 dead-lettered at once, 503s until the
/// retries ran out), the attempts and destination of `GET /events/...`,
/// what the dashboard reads (`/breaker`, `/queue`, `/metrics`), the
/// "retries exhausted" WARN line, nor `config check` (text and JSON). The
/// user name, the host, the path and the query's names still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_url_s_password_and_query_values_are_never_shown() {
    let receiver = Receiver::start(Arc::new(|n, _| {
        let status = if n == 0 {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        Reply::Status(status, Vec::new())
    }))
    .await;
    let url = format!(
        "http://bw-user:{URL_PASSWORD}@{}/hooks/stripe?token={URL_TOKEN}&v=2",
        receiver.addr
    );
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"{url}\", secret_env = \"{SECRET_ENV}\" }}\n"
    ));
    let mut server = Server::start_with_env(
        &sandbox.config_path(),
        "all",
        &[
            (SECRET_ENV, FORWARD_SECRET),
            ("BREAKWATER_WORKERS_MAX_ATTEMPTS", "2"),
            ("BREAKWATER_WORKERS_BACKOFF_BASE_MS", "50"),
            ("BREAKWATER_WORKERS_BACKOFF_CAP_MS", "100"),
            // A target failing every request looks down, and a message's
            // retries run out only while the dependency looks fine: a
            // breaker that only watches lets them run out.
            ("BREAKWATER_BREAKER_DRY_RUN", "true"),
        ],
    );
    let http = Http::default();
    send(&http, &server, "evt_cred_refused").await;
    dead_letters(&http, &server, 1).await;
    send(&http, &server, "evt_cred_exhausted").await;
    let dlq = dead_letters(&http, &server, 2).await;
    let got = receiver.received();
    assert_eq!(got.len(), 3, "one 400, then two 503s");
    assert!(
        got[0].path.ends_with(&format!("?token={URL_TOKEN}&v=2")),
        "the query still reaches the target: {}",
        got[0].path
    );

    let shown_url = format!(
        "http://bw-user:<redacted>@{}/hooks/stripe?token=<redacted>&v=<redacted>",
        receiver.addr
    );
    for item in &dlq {
        let error = item["error"].as_str().unwrap_or_default();
        assert_no_url_secret("a DLQ entry", error);
        assert!(error.contains(&shown_url), "{item}");
    }
    let story = http
        .get(&server.admin_url("/events/stripe/evt_cred_exhausted"))
        .await;
    assert_eq!(story.status, StatusCode::OK, "{:?}", story.body);
    let story = story.json();
    assert_eq!(
        story["attempts"].as_array().map(Vec::len),
        Some(2),
        "{story}"
    );
    assert_no_url_secret("GET /events", &story.to_string());
    assert_eq!(
        story["destination"],
        format!("forwarded to {shown_url}"),
        "{story}"
    );
    for path in ["/breaker", "/queue", "/metrics", "/dlq", "/"] {
        let answer = http.get(&server.admin_url(path)).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        assert_no_url_secret(path, &String::from_utf8_lossy(&answer.body));
    }

    // The log, up to the WARN line of the retries run out.
    let mut lines = server.startup.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lines.iter().any(|l| l.contains("retries exhausted")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match server.log.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => panic!("no \"retries exhausted\" line in:\n{}", lines.join("\n")),
        }
    }
    server.kill9();
    while let Ok(line) = server.log.try_recv() {
        lines.push(line);
    }
    let exhausted = lines
        .iter()
        .find(|l| l.contains("retries exhausted"))
        .expect("the WARN line");
    assert!(exhausted.contains("http_5xx"), "{exhausted}");
    for line in &lines {
        assert_no_url_secret("the log", line);
    }

    for json in [false, true] {
        let shown = config_check(&sandbox.config_path(), json);
        assert_no_url_secret("config check", &shown);
        assert!(shown.contains(&shown_url), "{shown}");
    }
}

/// A URL the sink cannot take is refused by `config check` without
/// printing its secrets either.
#[test]
fn a_refused_forward_url_is_named_without_its_secrets() {
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"http://bw-user:{URL_PASSWORD}@127.0.0.1:1/hooks?token={URL_TOKEN}\", \
         ca_file = \"/nonexistent/ca.pem\" }}\n"
    ));
    let out = std::process::Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(sandbox.config_path())
        .env_remove("BREAKWATER_CONFIG")
        .output()
        .expect("config check");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("ca_file"), "{said}");
    assert_no_url_secret("a refused config", &said);
}

/// The most bytes a DLQ entry's error holds for a forwarded webhook: the
/// sink's message (at most 512 bytes) after its kind.
const ERROR_TEXT_MOST: usize = 512 + "http_redirect: ".len();

/// Redirects whose `Location` is 60 KB long: the DLQ entry's error is
/// capped at 512 bytes of message whichever way the redirect is refused
/// (a 302 with redirects followed or not, one 307 too many).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_s_error_text_is_capped_however_long_its_location() {
    let long = format!("/{}", "l".repeat(60 * 1024));
    let script_long = long.clone();
    let receiver = Receiver::start(Arc::new(move |n, _| {
        let to = |status, path: &str| Reply::Status(status, vec![("location", path.to_owned())]);
        match n {
            // stripe (follow_redirects = 1): a 302, refused.
            0 => to(StatusCode::FOUND, &script_long),
            // stripe: a 307 followed, then one too many.
            1 => to(StatusCode::TEMPORARY_REDIRECT, "/moved"),
            2 => to(StatusCode::TEMPORARY_REDIRECT, &script_long),
            // second (no redirects followed): a 302.
            _ => to(StatusCode::FOUND, &script_long),
        }
    }))
    .await;
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"{}\", follow_redirects = 1 }}\n\n[[source]]\nname = \"second\"\n\
         scheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\nforward = {{ url = \"{}\" }}\n",
        receiver.url("/hooks/stripe"),
        receiver.url("/hooks/second"),
    ));
    let server = start(&sandbox);
    let http = Http::default();
    send(&http, &server, "evt_long_302").await;
    dead_letters(&http, &server, 1).await;
    send(&http, &server, "evt_long_307").await;
    dead_letters(&http, &server, 2).await;
    let body = stripe_event("evt_long_second", "7");
    let headers = stripe_headers(&body, unix_now());
    let a = http
        .post(&server.url("/webhooks/second"), &headers, body)
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    let dlq = dead_letters(&http, &server, 3).await;
    assert_eq!(receiver.received().len(), 4, "nothing retried");
    for item in &dlq {
        let error = item["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("http_redirect: HTTP 30"),
            "{}",
            &error[..error.len().min(200)]
        );
        assert!(
            error.len() <= ERROR_TEXT_MOST,
            "{} bytes of error for {}: {}...",
            error.len(),
            item["event_id"],
            &error[..error.len().min(200)]
        );
    }
}

/// Event ids that differ reach the receiver under different keys, even
/// when one is spelled like the other's encoding (`c%0A` and `c` followed
/// by a newline): every byte outside visible ASCII, and `%` itself, is
/// percent-encoded, so a receiver decoding the key gets the id back; an id
/// of visible ASCII without `%` arrives as it is. `webhook-id` is the same
/// value, and the signature covers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_event_ids_reach_the_receiver_as_distinct_keys() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let sandbox = forwarding(&receiver, "");
    let server = start(&sandbox);
    let http = Http::default();
    let expected = [
        ("c%0A", "c%250A"),
        ("c\n", "c%0A"),
        ("evt_plain-1.x", "evt_plain-1.x"),
        ("ü", "%C3%BC"),
        ("a b", "a%20b"),
        ("%", "%25"),
    ];
    // One at a time, so the receiver's requests come in this order.
    for (n, (id, _)) in expected.iter().enumerate() {
        send(&http, &server, id).await;
        receiver.wait_for(n + 1, Duration::from_secs(10)).await;
    }
    let got = receiver.received();
    let verifier = Verifier::new(Scheme::standard(), &[FORWARD_SECRET.to_owned()]).expect("key");
    let mut keys = std::collections::BTreeSet::new();
    for (r, (id, key)) in got.iter().zip(expected) {
        assert_eq!(header(r, "idempotency-key"), key, "for id {id:?}");
        assert_eq!(header(r, "webhook-id"), key, "for id {id:?}");
        verifier
            .verify(&r.headers, &r.body, unix_now())
            .expect("the signature covers the encoded id");
        keys.insert(key);
    }
    assert_eq!(keys.len(), expected.len(), "{keys:?}");
}
