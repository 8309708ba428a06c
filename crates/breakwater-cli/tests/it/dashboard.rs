//! The admin dashboard in a real headless Chromium, driven over WebDriver
//! (`chromedriver`, Debian's `chromium-driver`, installed by
//! `scripts/test.sh`): a page on another port of 127.0.0.1 can neither
//! trip the breaker nor force it closed through the browser, the dashboard
//! follows the breaker when it is tripped from outside, its Trip and Reset
//! buttons move it, and a dead letter is replayed from its row and
//! delivered.
//!
//! With `BREAKWATER_DASHBOARD_SCREENSHOT=<file>` the test also saves a
//! screenshot of the page with the breaker open and a dead letter listed
//! (`docs/dashboard.png` was made so).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use http::StatusCode;

use crate::receiver::{Receiver, Reply, always};
use crate::utils::*;

/// A chromedriver of the test's own, on a port of its own.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver() -> Driver {
    let binary = std::env::var("BREAKWATER_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(&binary)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {binary} ({e}): the dashboard test needs Chromium's WebDriver \
                 (Debian: chromium chromium-driver; scripts/test.sh installs them)"
            )
        });
    let driver = Driver { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

async fn browser(driver: &Driver) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1000"]
        }),
    );
    // Plain HTTP to the local chromedriver: no TLS stack (and no
    // process-wide rustls provider to pick).
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session")
}

/// The text the element `id` shows now (empty when it is not there).
async fn text_of(page: &Client, id: &str) -> String {
    match page.find(Locator::Id(id)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Waits until the element `id` shows `want` (in any case).
async fn wait_text(page: &Client, id: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let shown = text_of(page, id).await;
        // As rendered: the state badge is upper-cased by its style.
        if shown.trim().eq_ignore_ascii_case(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "#{id} shows {shown:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the element `id`'s text holds `want`.
async fn wait_contains(page: &Client, id: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let shown = text_of(page, id).await;
        if shown.contains(want) {
            return shown;
        }
        assert!(
            Instant::now() < deadline,
            "#{id} shows {shown:?}, without {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Finds and clicks `css`. The page redraws its tables as it polls, so an
/// element found may be replaced before the click lands (a stale element
/// reference): then it is found again, for up to 5 s.
async fn click(page: &Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clicked = page
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
            .click()
            .await;
        match clicked {
            Ok(_) => return,
            Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot click {css}: {e}"),
        }
    }
}

/// Runs, in the page `page` shows, the `fetch` calls another site's page
/// can make without a preflight (`no-cors`: no body, or a text body) to
/// `url`, and says how each ended (`fulfilled:opaque` when the listener
/// answered).
async fn no_cors_posts(page: &Client, url: &str) -> Vec<String> {
    let script = r#"
        const [url, done] = arguments;
        Promise.allSettled([
            fetch(url, { method: "POST", mode: "no-cors" }),
            fetch(url, { method: "POST", mode: "no-cors", body: "x" }),
        ]).then(rs => done(rs.map(r => r.status + ":" + (r.value ? r.value.type : String(r.reason)))));
    "#;
    let ended = page
        .execute_async(script, vec![serde_json::json!(url)])
        .await
        .expect("the page's fetch calls");
    serde_json::from_value(ended).expect("a list of outcomes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_the_breaker_and_replays_a_dead_letter() {
    // The first request is refused (400: dead-lettered), the rest taken.
    let receiver = Receiver::start(Arc::new(|n, _| {
        let status = if n == 0 {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        };
        Reply::Status(status, Vec::new())
    }))
    .await;
    let sandbox = Sandbox::new(&format!(
        "forward = {{ url = \"{}\" }}\n",
        receiver.url("/hooks/stripe")
    ));
    let server = sandbox.start();
    let http = Http::default();
    let driver = start_driver();
    let page = browser(&driver).await;

    // A page on another port of 127.0.0.1 (Chrome calls it same-site):
    // its POSTs reach the listener and are refused; the breaker does not
    // move, tripped for a day or forced closed.
    let elsewhere = Receiver::start(always(StatusCode::OK)).await;
    page.goto(&elsewhere.url("/"))
        .await
        .expect("open the other page");
    let breaker_state =
        async || http.get(&server.admin_url("/breaker")).await.json()["breaker"]["state"].clone();
    let answered = vec!["fulfilled:opaque".to_owned(); 2];
    let trip_a_day = server.admin_url("/breaker/trip?ttl_secs=86400&note=page");
    assert_eq!(no_cors_posts(&page, &trip_a_day).await, answered);
    assert_eq!(breaker_state().await, "closed");
    let tripped = http
        .admin_post(&server.admin_url("/breaker/trip?note=operator"))
        .await;
    assert_eq!(tripped.status, StatusCode::OK, "{:?}", tripped.body);
    let force_closed = server.admin_url("/breaker/reset?force_closed=true&ttl_secs=86400");
    assert_eq!(no_cors_posts(&page, &force_closed).await, answered);
    assert_eq!(breaker_state().await, "open");
    let reset = http.admin_post(&server.admin_url("/breaker/reset")).await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);

    page.goto(&server.admin_url("/"))
        .await
        .expect("open the page");
    wait_text(&page, "state", "closed").await;

    // A dead letter appears in the table, with its Replay button.
    let sent = post_stripe(&http, &server, stripe_event("evt_dashboard", "7")).await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{:?}", sent.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    while page
        .find(Locator::Css("button[data-replay]"))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the dead letter never showed on the page"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Its story, from the event id in its row.
    click(&page, "#dlq button.link").await;
    wait_contains(&page, "event", "dead lettered").await;
    let attempts = text_of(&page, "attempts").await;
    assert!(attempts.contains("dead_lettered"), "{attempts}");
    assert!(attempts.contains("permanent/"), "{attempts}");

    // Filtered by class: an exhausted-only view has none of it.
    click(&page, "#dlq-class option:nth-child(3)").await;
    wait_contains(&page, "dlq", "the dead-letter queue is empty").await;
    click(&page, "#dlq-class option:nth-child(1)").await;
    wait_contains(&page, "dlq", "evt_dashboard").await;

    // Tripped from outside (the API): the page follows.
    let tripped = http.admin_post(&server.admin_url("/breaker/trip")).await;
    assert_eq!(tripped.status, StatusCode::OK, "{:?}", tripped.body);
    wait_text(&page, "state", "open").await;
    click(&page, "#reset").await;
    wait_text(&page, "state", "closed").await;
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "closed", "{view}");

    // Trip from the page: the API and the page say open.
    click(&page, "#trip").await;
    wait_text(&page, "state", "open").await;
    let view = http.get(&server.admin_url("/breaker")).await.json();
    assert_eq!(view["breaker"]["state"], "open", "{view}");
    let history = text_of(&page, "history").await;
    assert!(history.contains("closed → open"), "{history}");
    if let Ok(path) = std::env::var("BREAKWATER_DASHBOARD_SCREENSHOT") {
        let png = page.screenshot().await.expect("screenshot");
        std::fs::write(&path, png).expect("write the screenshot");
    }

    // Reset from the page: closed again.
    click(&page, "#reset").await;
    wait_text(&page, "state", "closed").await;

    // Replay the dead letter from its row: delivered, the table empties.
    click(&page, "button[data-replay]").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.received().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the replayed webhook never reached the receiver"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let table = text_of(&page, "dlq").await;
        if table.contains("the dead-letter queue is empty") {
            break;
        }
        assert!(Instant::now() < deadline, "the DLQ table shows {table:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its story now: applied on the replay, after the dead letter.
    click(&page, "#event-form button").await;
    wait_contains(&page, "event", "the target answered 2xx").await;
    let attempts = text_of(&page, "attempts").await;
    let (dead, applied) = (attempts.find("dead_lettered"), attempts.rfind("applied"));
    assert!(
        matches!((dead, applied), (Some(d), Some(a)) if d < a),
        "dead-lettered, then applied: {attempts}"
    );
    page.close().await.expect("close the browser");
}
