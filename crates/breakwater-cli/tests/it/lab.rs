//! Short runs of every outage-lab scenario in Breakwater mode, against the
//! real PostgreSQL or (`--sink http`) the lab's own HTTP service, asserting
//! the invariants the lab exists to show.

use std::process::Command;

use crate::utils::binary;

/// Runs `breakwater lab <scenario>` briefly and returns the Breakwater
/// mode's figures from its JSON.
fn lab(scenario: &str) -> serde_json::Value {
    lab_with(scenario, &[])
}

/// [`lab`] with more arguments.
fn lab_with(scenario: &str, extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("lab.json");
    let out = Command::new(binary())
        .args([
            "lab",
            scenario,
            "--mode",
            "breakwater",
            "--duration",
            "7",
            "--fault-at",
            "2",
            "--fault-secs",
            "3",
            "--rate",
            "80",
            "--drain-timeout",
            "60",
            "--quiet",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--database-url")
        .arg(format!("{}/test", crate::pg::server_url()))
        .args(extra)
        .output()
        .expect("run breakwater lab");
    assert!(
        out.status.success(),
        "lab {scenario} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("read json")).expect("json");
    assert_eq!(report["scenario"], scenario);
    let mode = report["modes"]["breakwater"].clone();
    assert!(mode["accepted"].as_u64().is_some_and(|n| n > 300), "{mode}");
    assert!(
        !mode["series"].as_array().is_none_or(Vec::is_empty),
        "a time series"
    );
    mode
}

#[test]
fn hot_row_loses_nothing_and_keeps_one_waiter() {
    let m = lab("hot-row");
    assert_eq!(m["lost"], 0);
    assert_eq!(m["dead_lettered"], 0);
    assert!(
        m["max_lock_waiters"].as_u64().is_some_and(|n| n <= 1),
        "{}",
        m["max_lock_waiters"]
    );
    assert_eq!(
        m["breaker_opened"], false,
        "one hot row does not stop the fleet"
    );
    assert!(
        m["unrelated_applied_during_fault"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );
}

#[test]
fn poison_never_trips_the_breaker() {
    let m = lab("poison");
    assert_eq!(m["lost"], 0);
    assert!(m["accepted_poison"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(
        m["dead_lettered"], m["accepted_poison"],
        "every poison message, and only those"
    );
    assert_eq!(m["breaker_opened"], false);
    assert_eq!(m["breaker_transitions"].as_array().map(Vec::len), Some(0));
}

#[test]
fn db_down_opens_the_breaker_and_loses_nothing() {
    let m = lab("db-down");
    assert_eq!(m["lost"], 0);
    assert_eq!(m["dead_lettered"], 0);
    assert_eq!(m["breaker_opened"], true, "{}", m["breaker_transitions"]);
}

#[test]
fn slow_db_loses_nothing() {
    let m = lab("slow-db");
    assert_eq!(m["lost"], 0);
    assert_eq!(m["dead_lettered"], 0);
}

#[test]
fn an_erroring_service_opens_the_breaker_and_gets_everything_after() {
    let m = lab_with("erroring", &["--sink", "http"]);
    assert_eq!(m["lost"], 0);
    assert_eq!(m["dead_lettered"], 0);
    assert_eq!(m["pending"], 0);
    assert_eq!(m["applied"], m["accepted"], "every webhook delivered once");
    assert_eq!(m["breaker_opened"], true, "{}", m["breaker_transitions"]);
}

#[test]
fn a_hanging_service_loses_nothing() {
    let m = lab_with("hanging", &["--sink", "http"]);
    assert_eq!(m["lost"], 0);
    assert_eq!(m["dead_lettered"], 0);
    assert_eq!(m["applied"], m["accepted"]);
}

#[test]
fn a_service_refusing_poison_dead_letters_only_those() {
    let m = lab_with("poison", &["--sink", "http"]);
    assert_eq!(m["lost"], 0);
    assert!(m["accepted_poison"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(m["dead_lettered"], m["accepted_poison"]);
    assert_eq!(m["breaker_opened"], false);
}
