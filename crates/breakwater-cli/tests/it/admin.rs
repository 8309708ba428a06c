//! The admin listener against what a local attacker can do without the
//! token: a page on another port of 127.0.0.1 sending the requests Chrome
//! sends for it (`Origin` of its own port, `Sec-Fetch-Site: same-site`, no
//! content type for a bodiless `no-cors` fetch), and a crowd of idle
//! sockets filling the listener's connections. The CLI still drives the
//! breaker, and the operator still gets an answer.

use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, StatusCode, header};
use tokio::io::AsyncReadExt;

use crate::utils::*;

/// The headers Chrome sends with `fetch(url, {method: "POST", mode:
/// "no-cors"})` from a page at `page_origin` to the admin listener.
fn no_cors_fetch_from(page_origin: &str) -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (
            header::ORIGIN,
            HeaderValue::from_str(page_origin).expect("origin"),
        ),
        (
            HeaderName::from_static("sec-fetch-site"),
            HeaderValue::from_static("same-site"),
        ),
        (
            HeaderName::from_static("sec-fetch-mode"),
            HeaderValue::from_static("no-cors"),
        ),
        (
            HeaderName::from_static("sec-fetch-dest"),
            HeaderValue::from_static("empty"),
        ),
    ]
}

async fn breaker_state(http: &Http, server: &Server) -> serde_json::Value {
    let view = http.get(&server.admin_url("/breaker")).await.json();
    view["breaker"]["state"].clone()
}

/// The breaker through the CLI, as the operator runs it: `breakwater
/// breaker <args> --admin <listener>`.
fn cli_breaker(sandbox: &Sandbox, server: &Server, args: &[&str]) -> String {
    let out = std::process::Command::new(binary())
        .arg("breaker")
        .args(args)
        .arg("--config")
        .arg(sandbox.config_path())
        .args(["--admin", &server.admin.to_string()])
        .output()
        .expect("run breakwater breaker");
    assert!(
        out.status.success(),
        "breakwater breaker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A page served at another port of 127.0.0.1 (`http://127.0.0.1:17080`)
/// neither trips the breaker for a day nor forces it closed, whatever
/// content type it can send without a preflight; the dashboard's own
/// requests and the CLI still work.
#[tokio::test]
async fn a_page_on_another_loopback_port_cannot_drive_the_breaker() {
    let sandbox = Sandbox::new("");
    let server = sandbox.start();
    let http = Http::default();
    let trip = server.admin_url("/breaker/trip?ttl_secs=86400&note=page");
    let force_closed = server.admin_url("/breaker/reset?force_closed=true&ttl_secs=86400");
    let other_port = format!("http://127.0.0.1:{}", server.admin.port() ^ 1);
    let pages = [
        "http://127.0.0.1:17080".to_owned(),
        other_port,
        format!("http://localhost:{}", server.ingress.port()),
    ];
    let safelisted = [
        None,
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ];
    for page in &pages {
        for content_type in safelisted {
            let mut headers = no_cors_fetch_from(page);
            if let Some(ct) = content_type {
                headers.push((header::CONTENT_TYPE, HeaderValue::from_static(ct)));
            }
            let refused = http.post(&trip, &headers, Vec::new()).await;
            assert_eq!(
                refused.status,
                StatusCode::FORBIDDEN,
                "{page} {content_type:?}: {:?}",
                refused.body
            );
            assert_eq!(refused.json()["error"], "forbidden");
        }
    }
    assert_eq!(breaker_state(&http, &server).await, "closed");

    // A bodiless POST with no Origin at all (a form's target, an old
    // browser): refused for want of a content type.
    let bare = http.post(&trip, &[], Vec::new()).await;
    assert_eq!(bare.status, StatusCode::FORBIDDEN, "{:?}", bare.body);
    assert_eq!(breaker_state(&http, &server).await, "closed");

    // The CLI trips it; the page cannot force it closed.
    let tripped = cli_breaker(&sandbox, &server, &["trip", "--note", "operator"]);
    assert!(tripped.contains("open"), "{tripped}");
    assert_eq!(breaker_state(&http, &server).await, "open");
    for page in &pages {
        let refused = http
            .post(&force_closed, &no_cors_fetch_from(page), Vec::new())
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{page}");
    }
    assert_eq!(breaker_state(&http, &server).await, "open");

    // The dashboard's own call: its origin, same-origin, JSON.
    let own = format!("http://{}", server.admin);
    let dashboard = [
        (header::ORIGIN, HeaderValue::from_str(&own).expect("origin")),
        (
            HeaderName::from_static("sec-fetch-site"),
            HeaderValue::from_static("same-origin"),
        ),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
    ];
    let reset = http
        .post(&server.admin_url("/breaker/reset"), &dashboard, Vec::new())
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);
    assert_eq!(breaker_state(&http, &server).await, "closed");
    // And the CLI's reset.
    cli_breaker(&sandbox, &server, &["trip"]);
    cli_breaker(&sandbox, &server, &["reset"]);
    assert_eq!(breaker_state(&http, &server).await, "closed");
}

/// The admin listener's whole cap (256) of idle sockets does not lock the
/// operator out: `GET /breaker` answers at once (not after the 10 s header
/// timeout), the CLI too, and an idle socket is what made room.
#[tokio::test]
async fn idle_sockets_do_not_lock_the_operator_out() {
    const CAP: usize = 256;
    let sandbox = Sandbox::new("");
    let server = sandbox.start();
    let http = Http::default();
    let mut idle = Vec::with_capacity(CAP);
    for _ in 0..CAP {
        idle.push(
            tokio::net::TcpStream::connect(server.admin)
                .await
                .expect("connect"),
        );
    }
    // Let the listener accept them all.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        http.send(
            http::Method::GET,
            &server.admin_url("/breaker"),
            &[],
            bytes::Bytes::new(),
        ),
    )
    .await
    .expect("an answer within 3 s, not after the header timeout")
    .expect("an answer, not a reset connection");
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    assert_eq!(answer.json()["breaker"]["state"], "closed");
    assert!(started.elapsed() < Duration::from_secs(3));
    let status = cli_breaker(&sandbox, &server, &["status", "--json"]);
    assert!(status.contains("\"closed\""), "{status}");

    // The sockets that made room were closed by the listener.
    let mut closed = 0;
    for socket in &mut idle {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(5), socket.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert!(
        (1..=4).contains(&closed),
        "{closed} idle sockets closed to make room"
    );
}
