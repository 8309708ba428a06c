//! The command line: `config check` on good and broken files, `queue stats`.

use std::process::Command;

use crate::utils::*;

fn breakwater(args: &[&str]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .env_remove("BREAKWATER_CONFIG")
        .output()
        .expect("run breakwater")
}

#[test]
fn config_check_prints_effective_config_without_secrets() {
    let sandbox = Sandbox::new("");
    let out = breakwater(&[
        "config",
        "check",
        "--config",
        sandbox.config_path().to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("name = \"stripe\""), "{text}");
    assert!(text.contains("<redacted>"));
    assert!(!text.contains(STRIPE_SECRET), "a secret was printed");
}

/// The README's "run it" is `serve` with the repository's own
/// `breakwater.toml`: it must be valid and run the default queue (the
/// segment log), not the SQLite store of earlier releases.
#[test]
fn the_shipped_config_is_valid_and_runs_the_default_queue() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../breakwater.toml");
    let out = breakwater(&[
        "config",
        "check",
        "--json",
        "--config",
        shipped.to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let effective: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        effective["queue"]["backend"],
        breakwater::queue::DEFAULT_BACKEND,
        "{effective}"
    );
}

#[test]
fn broken_config_names_key_and_line_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[ingress]\nlisten = \"127.0.0.1:0\"\n\n[workers]\nmax_concurency = 4\n",
    )
    .expect("write");
    let out = breakwater(&["config", "check", "--config", path.to_str().expect("utf8")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`workers.max_concurency`"), "{err}");
    assert!(err.contains("line 5"), "{err}");
}

#[test]
fn missing_secret_env_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "[[source]]\nname = \"s\"\nscheme = \"github\"\nsecrets_env = \"BW_TEST_UNSET_SECRET\"\n",
    )
    .expect("write");
    let out = breakwater(&["config", "check", "--config", path.to_str().expect("utf8")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("BW_TEST_UNSET_SECRET"));
}

#[test]
fn queue_stats_reads_the_store_and_never_makes_one() {
    let sandbox = Sandbox::with_embedded_queue("");
    let config = sandbox.config_path().to_str().expect("utf8").to_owned();
    let store = sandbox.queue_db().parent().expect("queue dir").to_owned();
    // No store yet: said plainly, nothing created.
    let out = breakwater(&["queue", "stats", "--config", &config]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no queue at"), "{err}");
    assert_eq!(err.matches("no queue at").count(), 1, "said twice: {err}");
    assert!(!store.exists(), "a read-only command created {store:?}");

    drop(
        breakwater_queue_embedded::EmbeddedQueue::open(
            &breakwater_queue_embedded::EmbeddedConfig::at(&store),
        )
        .expect("create the store"),
    );
    let out = breakwater(&["queue", "stats", "--json", "--config", &config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["visible"], 0);
    assert_eq!(v["dead_lettered"], 0);
}

/// A short `bench ingress --floor`: every phase runs against the real
/// servers, every request of every phase is answered 2xx, and the run
/// leaves no store behind. (The figures themselves are for people: a
/// timed assertion would flake on a busy machine.)
#[test]
fn bench_ingress_runs_every_phase_without_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = breakwater(&[
        "bench",
        "ingress",
        "--rounds",
        "1",
        "--duration",
        "1",
        "--warmup",
        "0",
        "--concurrency",
        "4",
        "--floor",
        "--data-dir",
        dir.path().to_str().expect("utf8"),
    ]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for phase in [
        "1: bare hyper (200 ok)",
        "1: breakwater (verify+durable)",
        "1: floor, own thread",
        "1: floor, leader",
        "breakwater at 1/2 peak",
        "floor, own thread, 1/2 peak",
        "bare hyper at that rate",
    ] {
        let row = report
            .lines()
            .find_map(|line| line.strip_prefix(phase))
            .unwrap_or_else(|| panic!("no row {phase:?} in:\n{report}"));
        let columns: Vec<&str> = row.split_whitespace().collect();
        let rate: f64 = columns[0].parse().expect("req/s");
        assert!(rate > 0.0, "{phase}: no request answered\n{report}");
        assert_eq!(columns[5], "0", "{phase}: errors\n{report}");
    }
    assert!(
        report.contains("ratio breakwater / bare hyper: "),
        "{report}"
    );
    for floor in ["floor, own thread", "floor, leader"] {
        assert!(
            report.contains(&format!("ratio {floor} / bare hyper: ")),
            "{report}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("data dir").collect();
    assert!(left.is_empty(), "the bench left {left:?} behind");
}

/// `config check` runs every check `serve` runs short of connecting.
#[test]
fn config_check_catches_what_serve_would_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "[sink]\nurl = \"postgres://u@127.0.0.1:1/db\"\n[[source]]\nname = \"s\"\nscheme = \"github\"\nsecrets = [\"x\"]\n[[source.statement]]\nsql = \"UPDATE t SET a = $statsu\"\nparams = { status = \"json:/a\" }\n",
            "statsu",
        ),
        (
            "[sink]\nurl = \"mysql://u@127.0.0.1/db\"\n",
            "unsupported sink URL",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&path, text).expect("write");
        let out = breakwater(&["config", "check", "--config", path.to_str().expect("utf8")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "passed: {text}");
        assert!(err.contains(expected), "{err}");
        assert_eq!(err.matches("error:").count(), 1, "{err}");
    }
}

/// An unknown variant names the valid choices (never secret) and hides
/// only the value given.
#[test]
fn an_unknown_choice_lists_the_valid_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[workers]\nbackoff_jitter = \"fulll\"\n").expect("write");
    let out = breakwater(&["config", "check", "--config", path.to_str().expect("utf8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("`full`, `equal`"), "{err}");
    assert!(!err.contains("fulll"), "the value is shown: {err}");
}

/// Output into a pipe whose reader went away (`| head -2`) ends the command
/// quietly, without a panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::process::Stdio;
    let sandbox = Sandbox::new("");
    let mut child = std::process::Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(sandbox.config_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Close the read end before it writes.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{:?}: {err}", out.status);
}

/// `lab` and `bench` build their own config: `--config` is refused there
/// instead of silently ignored; every option of `dlq` says what it does.
#[test]
fn config_is_taken_only_where_it_is_read_and_options_are_described() {
    let out = breakwater(&["lab", "hot-row", "--config", "x.toml"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--config"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        &["dlq", "list", "--help"][..],
        &["dlq", "replay", "--help"][..],
        &["breaker", "reset", "--help"][..],
        &["queue", "stats", "--help"][..],
    ] {
        let out = breakwater(args);
        let help = String::from_utf8_lossy(&out.stdout);
        for line in help.lines().filter(|l| l.trim_start().starts_with("--")) {
            let described = line.trim_start().split_once("  ").is_some();
            assert!(
                described || line.contains("--help") || line.contains("--version"),
                "{args:?}: an option without a description: {line}"
            );
        }
    }
}

/// A password with a `/` in it (which the driver reads as a password) and
/// an `sslpassword` are never printed by `config check`.
#[test]
fn config_check_hides_every_password_the_driver_would_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "[sink]\nurl = \"postgres://u:ab/cd@127.0.0.1/db?sslpassword=k3y\"\n",
    )
    .expect("write");
    let out = breakwater(&["config", "check", "--config", path.to_str().expect("utf8")]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!shown.contains("ab/cd"), "{shown}");
    assert!(!shown.contains("k3y"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

/// Keys the driver percent-decodes before it reads them (`pass%77ord` is
/// `password`) hide their values like the plain keys, in text and JSON;
/// the other parameters stay readable.
#[test]
fn config_check_hides_passwords_under_percent_encoded_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "[sink]\nurl = \"postgres://u@127.0.0.1/db?sslmode=prefer&pass%77ord=k3y-a\
         &%73slpassword=k3y-b&%70%61%73%73%77%6f%72%64=k3y-c&oauth_client_secret=k3y-d\"\n",
    )
    .expect("write");
    let config = path.to_str().expect("utf8");
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
        assert!(!shown.contains("k3y"), "{shown}");
        assert!(shown.contains("pass%77ord=<redacted>"), "{shown}");
        assert!(shown.contains("sslmode=prefer"), "{shown}");
    }
}

/// `--log-format json` (or `BREAKWATER_LOG_FORMAT=json`): every log line
/// is one JSON object, with the level, the target and the message.
#[test]
fn logs_can_be_json_lines() {
    use std::io::{BufRead, BufReader};
    let sandbox = Sandbox::new("");
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(sandbox.config_path())
        .env("BREAKWATER_LOG_FORMAT", "json")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let listening = line.contains("listening");
        lines.push(line);
        if listening || lines.len() > 50 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!lines.is_empty(), "no log lines");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v["level"].is_string(), "{v}");
        assert!(v["fields"]["message"].is_string(), "{v}");
    }
    assert!(lines.iter().any(|l| l.contains("listening")), "{lines:?}");
}

/// An embedded store in `dir` holding three Stripe webhooks for order 7,
/// `{prefix}_0` to `{prefix}_2`, closed (its writer given 200 ms to let go).
async fn fill_embedded_store(dir: &std::path::Path, prefix: &str) {
    {
        let store = breakwater_queue_embedded::EmbeddedQueue::open(
            &breakwater_queue_embedded::EmbeddedConfig::at(dir),
        )
        .expect("create the embedded store");
        for i in 0..3 {
            let event = format!("{prefix}_{i}");
            breakwater::queue::Queue::enqueue(
                &store,
                breakwater::queue::NewMessage {
                    source: "stripe".into(),
                    event_id: event.clone(),
                    entity_key: Some("7".into()),
                    headers: Vec::new(),
                    body: stripe_event(&event, "7").into(),
                    received_at_ms: 1_700_000_000_000,
                },
            )
            .await
            .expect("enqueue");
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_migrate_moves_an_embedded_store_into_the_log() {
    let old = Sandbox::with_embedded_queue("");
    fill_embedded_store(&old.queue_dir(), "evt_migrate").await;
    let from = old.queue_db();
    let from = from.to_str().expect("utf8");

    // Into the embedded store it names itself: refused, saying why.
    let own = old.config_path();
    let out = breakwater(&["queue", "migrate", "--config", own.to_str().expect("utf8")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backend = \"log\""), "{err}");

    let new = Sandbox::with_log_queue("");
    let config = new.config_path();
    let config = config.to_str().expect("utf8");
    let out = breakwater(&["queue", "migrate", "--config", config, "--from", from]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("moved 3 queued messages"), "{said}");
    let out = breakwater(&["queue", "stats", "--json", "--config", config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["visible"], 3, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_the_default_log_takes_in_an_embedded_store_left_in_its_directory() {
    // A data directory from before the log was the default: an embedded
    // store holding three webhooks.
    let sandbox = Sandbox::new("");
    fill_embedded_store(&sandbox.queue_dir(), "evt_upgrade").await;
    let old = sandbox.queue_db();
    assert!(old.is_file());
    let server = sandbox.start_ingress();
    let http = Http::default();
    let stats = queue_stats(&http, &server).await;
    assert_eq!(stats["visible"], 3, "{stats}");
    assert!(!old.exists(), "the embedded store is renamed once moved");
    assert!(sandbox.queue_dir().join("queue.db.migrated").is_file());
    // Redelivered by the issuer: already queued, answered as a duplicate.
    let again = post_stripe(&http, &server, stripe_event("evt_upgrade_1", "7")).await;
    assert_eq!(again.status, http::StatusCode::OK, "{:?}", again.body);
    drop(server);
    // A restart moves nothing twice.
    let server = sandbox.start_ingress();
    assert_eq!(queue_stats(&http, &server).await["visible"], 3);
}
