//! One webhook's story through the admin API and `breakwater events show`,
//! against a real PostgreSQL: an event applied at once, one retried after a
//! serialization failure and then applied, one dead-lettered by a
//! constraint, one never sent; and the DLQ's filters.

use std::process::Command;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::pg::ScratchDb;
use crate::utils::*;
use crate::worker::{ORDERS, send, sink_config};

/// Order 7's updates fail with SQLSTATE 40001 (a serialization failure, a
/// dependency failure that is retried) while `flaky.failing` is true.
const FLAKY: &str = "
CREATE TABLE flaky (failing boolean NOT NULL);
INSERT INTO flaky VALUES (true);
CREATE FUNCTION flaky_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id = 7 AND (SELECT failing FROM flaky) THEN
        RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER flaky BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION flaky_update();
";

/// Retries slow enough for the test to see the first one before the
/// next, and many of them, over the workers' shared config.
const RETRIES: [(&str, &str); 3] = [
    ("BREAKWATER_WORKERS_MAX_ATTEMPTS", "50"),
    ("BREAKWATER_WORKERS_BACKOFF_BASE_MS", "200"),
    ("BREAKWATER_WORKERS_BACKOFF_CAP_MS", "400"),
];

async fn story(http: &Http, server: &Server, event_id: &str) -> serde_json::Value {
    let a = http
        .get(&server.admin_url(&format!("/events/stripe/{event_id}")))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    a.json()
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
        let s = story(http, server, event_id).await;
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{event_id} never got there: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The binary with `args`, no config from the environment.
fn breakwater(args: &[&str]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .env_remove("BREAKWATER_CONFIG")
        .output()
        .expect("run breakwater")
}

/// `breakwater events show stripe ID` against the server's admin API
/// (named with `--admin`: the config on disk names port 0).
fn events_show(server: &Server, event_id: &str, json: bool) -> std::process::Output {
    let admin = server.admin.to_string();
    let mut args = vec!["events", "show", "stripe", event_id, "--admin", &admin];
    if json {
        args.push("--json");
    }
    breakwater(&args)
}

fn outcomes(story: &serde_json::Value) -> Vec<String> {
    story["attempts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|a| a["outcome"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_tells_an_applied_a_retried_and_a_dead_lettered_event() {
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    db.client.batch_execute(FLAKY).await.expect("trigger");
    let sandbox = Sandbox::new(&sink_config(&db, ""));
    let server = Server::start_with_env(&sandbox.config_path(), "all", &RETRIES);
    let http = Http::default();

    send(&http, &server, "evt_applied", 1, "paid").await;
    send(&http, &server, "evt_poison", 2, "poison").await;
    send(&http, &server, "evt_retried", 7, "paid").await;

    // Order 7 fails until the flag is cleared: its story shows a retry.
    let failing = story_when(&http, &server, "evt_retried", |s| {
        outcomes(s).iter().any(|o| o == "retried")
    })
    .await;
    assert_eq!(failing["state"], "pending", "{failing:#}");
    db.client
        .batch_execute("UPDATE flaky SET failing = false")
        .await
        .expect("clear the flag");
    // The inbox row commits before the worker writes the attempt down: wait
    // for both.
    let retried = story_when(&http, &server, "evt_retried", |s| {
        s["state"] == "applied" && outcomes(s).last().is_some_and(|o| o == "applied")
    })
    .await;
    let attempts = retried["attempts"].as_array().expect("attempts");
    let first = &attempts[0];
    assert_eq!(first["outcome"], "retried", "{retried:#}");
    assert_eq!(first["class"], "dependency");
    assert_eq!(first["kind"], "serialization");
    assert!(
        first["error"]
            .as_str()
            .is_some_and(|e| e.contains("injected serialization failure")),
        "{first}"
    );
    assert_eq!(
        outcomes(&retried).last().map(String::as_str),
        Some("applied")
    );
    assert!(attempts.len() >= 2);
    assert!(
        attempts
            .windows(2)
            .all(|w| w[0]["at_ms"].as_i64() <= w[1]["at_ms"].as_i64()),
        "attempts oldest first: {retried:#}"
    );
    let applied_at = retried["applied"]["applied_at_ms"]
        .as_i64()
        .expect("applied_at");
    assert!(
        applied_at
            >= retried["applied"]["received_at_ms"]
                .as_i64()
                .expect("received")
    );
    assert_eq!(retried["applied"]["entity_key"], "7");

    let applied = story_when(&http, &server, "evt_applied", |s| {
        s["state"] == "applied" && !outcomes(s).is_empty()
    })
    .await;
    assert_eq!(outcomes(&applied), ["applied"], "{applied:#}");
    let destination = applied["destination"].as_str().expect("destination");
    assert!(
        destination.starts_with("PostgreSQL postgres://"),
        "{destination}"
    );
    assert!(destination.contains(&db.name), "{destination}");

    let dead = story_when(&http, &server, "evt_poison", |s| {
        s["state"] == "dead_lettered" && !outcomes(s).is_empty()
    })
    .await;
    assert_eq!(dead["dead_letter"]["class"], "permanent", "{dead:#}");
    assert!(
        dead["dead_letter"].get("body").is_none(),
        "no body: {dead:#}"
    );
    assert_eq!(outcomes(&dead), ["dead_lettered"]);
    assert_eq!(dead["attempts"][0]["kind"], "constraint");
    assert!(dead.get("applied").is_none());

    // Order 2's next webhook went on without the dead-lettered one, and
    // its story names it.
    send(&http, &server, "evt_after_poison", 2, "shipped").await;
    let after = story_when(&http, &server, "evt_after_poison", |s| {
        s["state"] == "applied"
    })
    .await;
    let earlier = after["earlier_dead_letters"].as_array().expect("named");
    assert_eq!(earlier.len(), 1, "{after:#}");
    assert_eq!(earlier[0]["event_id"], "evt_poison");
    assert!(earlier[0].get("body").is_none(), "no body: {after:#}");
    assert!(
        after["detail"]
            .as_str()
            .is_some_and(|d| d.contains("dead-lettered (evt_poison)")),
        "{after:#}"
    );
    let applied_before = story(&http, &server, "evt_applied").await;
    assert!(
        applied_before.get("earlier_dead_letters").is_none(),
        "order 1 had none: {applied_before:#}"
    );
    let out = events_show(&server, "evt_after_poison", false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("earlier      evt_poison of its key dead-lettered (permanent)"),
        "{text}"
    );

    // The CLI, from "another host": the same stories, in words and JSON,
    // and an exit code that says which ones need a look.
    let out = events_show(&server, "evt_retried", false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("state        applied"), "{text}");
    assert!(text.contains("retried"), "{text}");
    assert!(text.contains("dependency/serialization"), "{text}");
    assert!(text.contains("injected serialization failure"), "{text}");
    let out = events_show(&server, "evt_poison", true);
    assert!(!out.status.success(), "a dead letter exits non-zero");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["state"], "dead_lettered");
    let out = events_show(&server, "evt_never_sent", false);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state        unknown"), "{text}");
    assert!(text.contains("attempts     on "), "{text}");

    // The DLQ's filters, through the API and the CLI.
    let count = |path: &'static str| {
        let http = &http;
        let url = server.admin_url(path);
        async move {
            let list = http.get(&url).await.json();
            list["items"].as_array().map_or(usize::MAX, Vec::len)
        }
    };
    assert_eq!(count("/dlq?class=permanent").await, 1);
    assert_eq!(count("/dlq?class=exhausted").await, 0);
    assert_eq!(count("/dlq?source=github").await, 0);
    assert_eq!(count("/dlq?source=stripe&event_id=evt_poison").await, 1);
    assert_eq!(count("/dlq?event_id=evt_applied").await, 0);
    assert_eq!(count("/dlq?entity_key=2").await, 1);
    assert_eq!(count("/dlq?entity_key=1").await, 0);
    let admin = server.admin.to_string();
    let out = breakwater(&[
        "dlq",
        "list",
        "--event-id",
        "evt_poison",
        "--json",
        "--admin",
        &admin,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");

    // `queue stats` goes through the API too.
    let out = breakwater(&["queue", "stats", "--json", "--admin", &admin]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(stats["dead_lettered"], 1, "{stats}");

    db.drop_db().await;
}

/// `--admin` names a service: when it does not answer, the command says so
/// and does not open a queue here instead.
#[test]
fn a_named_admin_api_that_does_not_answer_is_an_error_not_a_fallback() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(binary())
        .args(["dlq", "list", "--admin", &addr])
        .current_dir(dir.path())
        .env_remove("BREAKWATER_CONFIG")
        .output()
        .expect("run breakwater");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the admin API"), "{err}");
    assert!(!err.contains("opening the queue directly"), "{err}");
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").next().is_none(),
        "nothing created here"
    );
    let out = breakwater(&[
        "events",
        "show",
        "stripe",
        "evt_1",
        "--admin",
        "no-such-host.invalid:9090",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--admin no-such-host.invalid:9090"), "{err}");
}

/// A sink password under a percent-encoded key (`pass%77ord`, which the
/// driver decodes to `password` and sends) is hidden like a plain one: in
/// `config check` (text and JSON), the "sink ready" line and the
/// destination `GET /events/...` tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_password_under_an_encoded_key_is_never_shown() {
    let db = ScratchDb::create().await;
    db.client.batch_execute(ORDERS).await.expect("schema");
    // The server's own password when the test server has one (the driver
    // sends this one), else any: trust authentication asks for none.
    let server_config: tokio_postgres::Config = crate::pg::server_url().parse().expect("url");
    let password = server_config.get_password().map_or_else(
        || "pg-5ecret-under-encoded-key".to_owned(),
        |p| String::from_utf8_lossy(p).into_owned(),
    );
    let url = format!("{}?application_name=bw_it&pass%77ord={password}", db.url());
    let sandbox = Sandbox::new(&sink_config(&db, "").replace(&db.url(), &url));
    let server = sandbox.start();
    let http = Http::default();

    let ready = server
        .startup
        .iter()
        .find(|l| l.contains("sink ready"))
        .unwrap_or_else(|| panic!("no \"sink ready\" line: {:?}", server.startup));
    assert!(!ready.contains(&password), "{ready}");
    assert!(ready.contains("pass%77ord=<redacted>"), "{ready}");
    assert!(ready.contains("application_name=bw_it"), "{ready}");

    send(&http, &server, "evt_encoded_key", 1, "paid").await;
    let story = story_when(&http, &server, "evt_encoded_key", |s| {
        s["state"] == "applied"
    })
    .await;
    let destination = story["destination"].as_str().expect("destination");
    assert!(!story.to_string().contains(&password), "{story:#}");
    assert!(
        destination.contains("pass%77ord=<redacted>"),
        "{destination}"
    );

    let config = sandbox.config_path();
    let config = config.to_str().expect("utf8");
    for json in [false, true] {
        let mut args = vec!["config", "check", "--config", config];
        if json {
            args.push("--json");
        }
        let out = breakwater(&args);
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!shown.contains(&password), "{shown}");
        assert!(shown.contains("pass%77ord=<redacted>"), "{shown}");
    }

    drop(server);
    db.drop_db().await;
}
