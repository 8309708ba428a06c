//! The ingress over real HTTP against the real binary: every scheme
//! accepted when signed right, every refusal with its status and JSON body,
//! and nothing enqueued for a refused webhook.

use breakwater_verify::{Algorithm, Encoding, HmacScheme, Scheme};
use http::{HeaderName, HeaderValue, StatusCode};

use crate::utils::*;

async fn visible(http: &Http, server: &Server) -> u64 {
    queue_stats(http, server).await["visible"]
        .as_u64()
        .expect("visible")
}

#[tokio::test]
async fn stripe_accepted_then_duplicate() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let body = stripe_event("evt_1", "1042");
    let a = post_stripe(&http, &server, body.clone()).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(a.json()["status"], "accepted");
    assert_eq!(a.json()["event_id"], "evt_1");
    assert_eq!(visible(&http, &server).await, 1);

    let again = post_stripe(&http, &server, body).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json()["status"], "duplicate");
    assert_eq!(again.json()["id"], a.json()["id"]);
    assert_eq!(visible(&http, &server).await, 1, "not enqueued twice");
}

#[tokio::test]
async fn every_scheme_accepts_a_real_signature() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let now = unix_now();
    let body = br#"{"id": 7, "repository": {"id": 99}}"#.to_vec();
    let generic = Scheme::Hmac(HmacScheme {
        header: "X-Signature".into(),
        algorithm: Algorithm::Sha1,
        encoding: Encoding::Base64,
        prefix: Some("sha1=".into()),
    });
    let cases: Vec<(&str, Scheme, &str)> = vec![
        ("github", Scheme::GitHub, GITHUB_SECRET),
        ("shopify", Scheme::Shopify, SHOPIFY_SECRET),
        ("standard", Scheme::standard(), STANDARD_SECRET),
        ("generic", generic, HMAC_SECRET),
    ];
    for (i, (source, scheme, secret)) in cases.into_iter().enumerate() {
        let id = format!("delivery-{i}");
        let mut headers = breakwater_verify::sign(&scheme, secret, &body, now, &id).expect("sign");
        headers.push((
            HeaderName::from_static("x-event-id"),
            HeaderValue::from_str(&id).expect("hv"),
        ));
        let a = http
            .post(
                &server.url(&format!("/webhooks/{source}")),
                &headers,
                body.clone(),
            )
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{source}: {:?}", a.body);
        let event_id = a.json()["event_id"].as_str().unwrap_or_default().to_owned();
        if matches!(source, "github" | "shopify") {
            // Their delivery id is not signed: the signed body identifies
            // the webhook.
            assert!(event_id.starts_with("sha256:"), "{source}: {event_id}");
        } else {
            assert_eq!(event_id, id, "{source} event id from its header");
        }
    }
    assert_eq!(visible(&http, &server).await, 4);
}

/// A captured GitHub or Shopify delivery replayed under a fresh delivery
/// id, another topic header or none (neither is signed, the body is)
/// answers 200 duplicate and is queued once per source.
#[tokio::test]
async fn a_replayed_delivery_with_new_unsigned_headers_is_a_duplicate() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let body = br#"{"action": "opened", "repository": {"id": 99}}"#.to_vec();
    let cases = [
        ("github", Scheme::GitHub, GITHUB_SECRET, "x-github-event"),
        (
            "shopify",
            Scheme::Shopify,
            SHOPIFY_SECRET,
            "x-shopify-topic",
        ),
    ];
    for (source, scheme, secret, topic) in cases {
        let url = server.url(&format!("/webhooks/{source}"));
        let topics = [Some("push"), Some("push2"), Some("pull_request"), None];
        for (i, topic_value) in topics.into_iter().enumerate() {
            let mut headers =
                breakwater_verify::sign(&scheme, secret, &body, unix_now(), &format!("d-{i}"))
                    .expect("sign");
            if let Some(v) = topic_value {
                headers.push((HeaderName::from_static(topic), HeaderValue::from_static(v)));
            }
            let expected = if i == 0 {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            let a = http.post(&url, &headers, body.clone()).await;
            assert_eq!(a.status, expected, "{source} {topic_value:?}: {:?}", a.body);
        }
    }
    assert_eq!(visible(&http, &server).await, 2, "one per source");
}

#[tokio::test]
async fn refusals_answer_json_and_enqueue_nothing() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let url = server.url("/webhooks/stripe");
    let body = stripe_event("evt_bad", "1");

    // Unknown source.
    let a = http
        .post(
            &server.url("/webhooks/nope"),
            &stripe_headers(&body, unix_now()),
            body.clone(),
        )
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.json()["error"], "unknown_source");
    // Names no source can have: with a slash, empty, not UTF-8.
    for path in ["/webhooks/stripe/extra", "/webhooks/", "/webhooks/%FF"] {
        let a = http
            .post(
                &server.url(path),
                &stripe_headers(&body, unix_now()),
                body.clone(),
            )
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(a.json()["error"], "unknown_source", "{path}");
    }
    // Outside /webhooks/: JSON too.
    let a = http.get(&server.url("/nothing-here")).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.json()["error"], "not_found");
    assert!(
        a.json()["detail"]
            .as_str()
            .is_some_and(|d| d.contains("GET /nothing-here"))
    );
    // A known path with the wrong method: 405 in JSON, with Allow.
    let a = http.get(&url).await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(a.json()["error"], "method_not_allowed");
    assert_eq!(
        a.headers.get(http::header::ALLOW).map(|v| v.as_bytes()),
        Some(&b"POST"[..])
    );

    // Missing signature.
    let a = http.post(&url, &[], body.clone()).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.json()["error"], "unauthorized");
    assert!(a.json()["detail"].as_str().is_some_and(|d| !d.is_empty()));

    // Wrong secret.
    let forged = breakwater_verify::sign(&Scheme::stripe(), "whsec_wrong", &body, unix_now(), "")
        .expect("sign");
    let a = http.post(&url, &forged, body.clone()).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    // Tampered body.
    let headers = stripe_headers(&body, unix_now());
    let a = http
        .post(&url, &headers, stripe_event("evt_bad", "2"))
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    // Stale timestamp (an hour old).
    let a = http
        .post(
            &url,
            &stripe_headers(&body, unix_now() - 3600),
            body.clone(),
        )
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.json()["error"], "stale");

    // Body over the 4096-byte limit of the test config.
    let big = stripe_event(&"x".repeat(5000), "1");
    let a = http
        .post(&url, &stripe_headers(&big, unix_now()), big)
        .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(a.json()["error"], "too_large");

    assert_eq!(
        visible(&http, &server).await,
        0,
        "nothing refused was enqueued"
    );
    let stats = queue_stats(&http, &server).await;
    assert_eq!(stats["in_flight"], 0);
    assert_eq!(stats["dead_lettered"], 0);
}

#[tokio::test]
async fn queue_that_cannot_commit_answers_503_with_retry_after() {
    // The embedded store, whose file another process can lock.
    let sandbox = Sandbox::with_embedded_queue("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    // Another process holds the store's write lock: the writer's commit
    // waits out its busy timeout and fails.
    let blocker = rusqlite::Connection::open(sandbox.queue_db()).expect("open store");
    blocker
        .execute_batch("BEGIN EXCLUSIVE; INSERT INTO counters VALUES ('blocker', 1);")
        .expect("lock");
    let body = stripe_event("evt_503", "1");
    let a = post_stripe(&http, &server, body.clone()).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", a.body);
    assert_eq!(a.json()["error"], "unavailable");
    assert!(a.headers.contains_key(http::header::RETRY_AFTER));
    blocker.execute_batch("ROLLBACK").expect("unlock");

    // Once the store is free again, the issuer's retry is accepted.
    let a = post_stripe(&http, &server, body).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(visible(&http, &server).await, 1);
}

#[tokio::test]
async fn health_and_readiness() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    assert_eq!(
        http.get(&server.url("/healthz")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.get(&server.url("/readyz")).await.status,
        StatusCode::OK
    );
    let metrics = http.get(&server.admin_url("/metrics")).await;
    assert_eq!(metrics.status, StatusCode::OK);
}

/// `serve` with ingress and workers, its database refusing connections:
/// the ingress still takes webhooks into the queue, and the log says the
/// workers wait for the database.
#[tokio::test]
async fn ingress_takes_webhooks_while_the_sink_does_not_answer() {
    // Port 1 on loopback: nothing listens, every connection is refused.
    let sandbox = Sandbox::new("[sink]\nurl = \"postgres://breakwater@127.0.0.1:1/nowhere\"\n");
    let server = sandbox.start_listening();
    let http = Http::default();
    let body = stripe_event("evt_db_down", "7");
    let a = post_stripe(&http, &server, body).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(visible(&http, &server).await, 1);
    let warned = std::iter::from_fn(|| {
        server
            .log
            .recv_timeout(std::time::Duration::from_secs(10))
            .ok()
    })
    .any(|line| line.contains("does not answer"));
    assert!(warned, "no warning that the sink does not answer");

    // Accepting is right, and it is not the same as healthy: the breaker is
    // held open with the reason, and /readyz says nothing is applied.
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "open", "{view}");
    let why = view["breaker"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("does not answer"), "{view}");
    let ready = http.get(&server.url("/readyz")).await;
    assert_eq!(ready.status, StatusCode::OK, "still accepting");
    let ready = ready.json();
    assert_eq!(ready["accepting"], true, "{ready}");
    assert_eq!(ready["applying"], false, "{ready}");
    assert!(
        ready["detail"]
            .as_str()
            .is_some_and(|d| d.contains("does not answer")),
        "{ready}"
    );
}

/// A sink host name that does not resolve is said as such, not as a
/// generic connection error.
#[tokio::test]
async fn an_unresolvable_sink_host_is_said_plainly() {
    let sandbox =
        Sandbox::new("[sink]\nurl = \"postgres://breakwater@no-such-host.invalid/nowhere\"\n");
    let server = sandbox.start_listening();
    let http = Http::default();
    let said = std::iter::from_fn(|| {
        server
            .log
            .recv_timeout(std::time::Duration::from_secs(15))
            .ok()
    })
    .any(|line| line.contains("does not resolve"));
    assert!(said, "no plain word that the host name does not resolve");
    let view = http.get(&server.admin_url("/breaker")).await.json();
    let why = view["breaker"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("does not resolve"), "{view}");
}

/// A correctly signed body that is not JSON, to a source whose issuer
/// always sends JSON: 400 `bad_json`, nothing enqueued.
#[tokio::test]
async fn a_signed_body_that_is_not_json_is_refused() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let refused = post_stripe(&http, &server, b"{\"id\": \"evt_x\", oops".to_vec()).await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        refused.body
    );
    assert_eq!(refused.json()["error"], "bad_json");
    assert_eq!(visible(&http, &server).await, 0);
    // A valid one still goes through.
    let a = post_stripe(&http, &server, stripe_event("evt_json", "1")).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
}

/// An ingress-only process runs no breaker (its ingress never waits on
/// one): `/breaker` says where the breaker lives instead of showing a
/// frozen one, and trip and reset are refused, not silently applied to
/// nothing.
#[tokio::test]
async fn an_ingress_only_node_says_where_the_breaker_runs() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let view = http.get(&server.admin_url("/breaker")).await;
    assert_eq!(view.status, StatusCode::OK);
    let view = view.json();
    assert!(view["breaker"].is_null(), "{view}");
    assert_eq!(view["location"]["kind"], "with_the_workers", "{view}");
    assert!(
        view["location"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("worker processes")),
        "{view}"
    );
    for path in ["/breaker/trip", "/breaker/reset"] {
        let refused = http.admin_post(&server.admin_url(path)).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{path}");
        assert_eq!(refused.json()["error"], "no_breaker", "{path}");
    }
    // The ingress still takes webhooks.
    let a = post_stripe(&http, &server, stripe_event("evt_ingress_only", "7")).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
}

/// Dead letters through the admin API: an empty DLQ pages as an empty
/// list, and an unknown id is a 404 in JSON.
#[tokio::test]
async fn the_admin_api_lists_dead_letters_through_the_queue_contract() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let list = http.get(&server.admin_url("/dlq")).await;
    assert_eq!(list.status, StatusCode::OK, "{:?}", list.body);
    let list = list.json();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    assert!(list["next_after"].is_null());
    let missing = http.get(&server.admin_url("/dlq/999")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["error"], "not_found");
}

/// Slow clients are cut off: hundreds of connections that never finish
/// their request head are closed by the header timeout, a body trickled a
/// byte at a time gets 408 at the request deadline, and a real webhook sent
/// meanwhile is answered at once.
#[tokio::test]
async fn slow_clients_are_cut_off_and_real_webhooks_still_get_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sandbox =
        Sandbox::with_ingress("header_timeout_ms = 1000\nrequest_timeout_ms = 1500\n", "");
    let server = sandbox.start_ingress();
    let http = Http::default();

    // The issue's figure: 2,000 slow clients.
    const SLOW: usize = 2_000;
    let mut slow = Vec::new();
    for _ in 0..SLOW {
        let mut s = tokio::net::TcpStream::connect(server.ingress)
            .await
            .expect("connect");
        s.write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("half a head");
        slow.push(s);
    }
    let started = std::time::Instant::now();
    let a = post_stripe(&http, &server, stripe_event("evt_amid_slow", "7")).await;
    let waited = started.elapsed();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert!(
        waited < std::time::Duration::from_secs(1),
        "a real webhook waited {waited:?} behind {SLOW} slow clients"
    );
    eprintln!("a real webhook amid {SLOW} slow clients: 202 in {waited:?}");

    // A body trickled a byte at a time: 408 at the request deadline.
    let mut trickle = tokio::net::TcpStream::connect(server.ingress)
        .await
        .expect("connect");
    trickle
        .write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        .await
        .expect("head");
    let trickling = tokio::spawn(async move {
        for _ in 0..100 {
            if trickle.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        trickle
    });

    // Past the header timeout every half-sent connection was closed.
    tokio::time::sleep(std::time::Duration::from_millis(1800)).await;
    let mut closed = 0;
    for s in &mut slow {
        let mut buf = [0u8; 256];
        match tokio::time::timeout(std::time::Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            Ok(Ok(_)) => closed += 1, // an error answer, then the close
            Err(_) => {}
        }
    }
    assert_eq!(closed, SLOW, "half-sent connections left open");

    let mut trickle = trickling.await.expect("join");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        trickle.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"timeout\""), "{answer}");
    assert_eq!(visible(&http, &server).await, 1, "only the real webhook");
}

/// A web page the operator opens cannot drive the admin API through the
/// browser: a cross-site form POST to `/breaker/trip` is refused and the
/// breaker does not move; a rebound host name is refused too.
#[tokio::test]
async fn the_admin_api_refuses_what_a_browser_could_be_made_to_send() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start();
    let http = Http::default();
    let trip = server.admin_url("/breaker/trip?ttl_secs=31536000");
    for headers in [
        vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        )],
        vec![(
            http::header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        )],
        vec![(
            http::header::HOST,
            HeaderValue::from_static("evil.example:9090"),
        )],
    ] {
        let refused = http.post(&trip, &headers, Vec::new()).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{headers:?}");
        assert_eq!(refused.json()["error"], "forbidden");
    }
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "closed", "{view}");
    // The CLI's own request still works.
    let ok = http.admin_post(&trip).await;
    assert_eq!(ok.status, StatusCode::OK, "{:?}", ok.body);
}

/// The dashboard at the admin listener's `/`: one page embedded in the
/// binary, served without the token (it holds no data; its calls carry the
/// token the operator types in), never framed, calling every endpoint it
/// shows; the API behind it still wants the token.
#[tokio::test]
async fn the_dashboard_is_served_and_its_api_still_needs_the_token() {
    let sandbox = Sandbox::new("");
    let token = "dashboard-test-token";
    let server = Server::start_with_env(
        &sandbox.config_path(),
        "all",
        &[("BREAKWATER_ADMIN_TOKEN", token)],
    );
    let http = Http::default();
    let page = http.get(&server.admin_url("/")).await;
    assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
    let header = |name: http::header::HeaderName| {
        page.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(header(http::header::CONTENT_TYPE).starts_with("text/html"));
    assert_eq!(header(http::header::X_FRAME_OPTIONS), "DENY");
    assert!(header(http::header::CONTENT_SECURITY_POLICY).contains("frame-ancestors 'none'"));
    let html = String::from_utf8_lossy(&page.body);
    for call in [
        "\"/breaker\"",
        "\"/queue\"",
        "\"/dlq?limit=50\"",
        "\"/metrics\"",
        "\"/dlq/replay\"",
        "\"/dlq/purge\"",
        "\"/breaker/trip",
        "\"/breaker/reset\"",
    ] {
        assert!(html.contains(call), "the page calls {call}");
    }
    let refused = http.get(&server.admin_url("/breaker")).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    // As the page calls it: the bearer token, its own origin.
    let bearer = http::HeaderValue::from_str(&format!("Bearer {token}")).expect("header");
    let origin = http::HeaderValue::from_str(&format!("http://{}", server.admin)).expect("header");
    let trip = http
        .post(
            &server.admin_url("/breaker/trip"),
            &[
                (http::header::AUTHORIZATION, bearer.clone()),
                (http::header::ORIGIN, origin),
                (
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                ),
            ],
            Vec::new(),
        )
        .await;
    assert_eq!(trip.status, StatusCode::OK, "{:?}", trip.body);
    assert_eq!(trip.json()["state"], "open");
}

/// An event id or entity key longer than 1024 bytes answers 400 and
/// nothing is queued (100 signed events with 900 KB ids held 230 MB in
/// the process); one of exactly 1024 bytes is taken. The id from a header
/// is capped like one from the body, and an over-long id is refused, not
/// hashed into another identity.
#[tokio::test]
async fn an_over_long_event_id_or_entity_key_is_refused_and_nothing_queued() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start_ingress();
    let http = Http::default();
    let long = |n: usize| format!("evt_{}", "x".repeat(n - 4));

    let a = post_stripe(&http, &server, stripe_event(&long(1025), "1")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{:?}", a.body);
    assert_eq!(a.json()["error"], "event_id_too_long");
    assert!(
        a.body.len() < 300,
        "the answer does not echo the id: {:?}",
        a.body
    );

    let a = post_stripe(&http, &server, stripe_event("evt_key", &"k".repeat(1025))).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{:?}", a.body);
    assert_eq!(a.json()["error"], "entity_key_too_long");

    // From a header (the generic source's X-Event-Id).
    let body = br#"{"n": 1}"#.to_vec();
    let scheme = Scheme::Hmac(HmacScheme {
        header: "X-Signature".into(),
        algorithm: Algorithm::Sha1,
        encoding: Encoding::Base64,
        prefix: Some("sha1=".into()),
    });
    let mut headers =
        breakwater_verify::sign(&scheme, HMAC_SECRET, &body, unix_now(), "").expect("sign");
    headers.push((
        HeaderName::from_static("x-event-id"),
        HeaderValue::from_str(&long(1025)).expect("hv"),
    ));
    let a = http
        .post(&server.url("/webhooks/generic"), &headers, body)
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{:?}", a.body);
    assert_eq!(a.json()["error"], "event_id_too_long");
    assert_eq!(visible(&http, &server).await, 0, "nothing queued");

    let a = post_stripe(&http, &server, stripe_event(&long(1024), &"k".repeat(1024))).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(visible(&http, &server).await, 1);
}
