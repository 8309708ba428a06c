//! `breakwater doctor` against a real PostgreSQL: a worker role set up
//! badly (no lock timeout; a statement timeout not above the lock timeout)
//! fails, with the fix named; a role set up well passes. Each test makes
//! its own roles and database and drops them.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::pg::{ScratchDb, connect, server_url};
use crate::utils::*;

/// A login role of its own with `settings` (`ALTER ROLE ... SET`), dropped
/// with the value.
struct Role {
    name: String,
}

impl Role {
    async fn create(settings: &[(&str, &str)]) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "bw_doctor_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let admin = connect("postgres").await;
        admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN"
            ))
            .await
            .expect("create role");
        for (key, value) in settings {
            admin
                .batch_execute(&format!("ALTER ROLE {name} SET {key} = '{value}'"))
                .await
                .expect("set");
        }
        Self { name }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &format!("{}/postgres", server_url()),
                "-c",
                &format!("DROP ROLE IF EXISTS {}", self.name),
            ])
            .output();
    }
}

/// Runs `doctor --json` with the sink at `db` as `role`: (exit ok, findings).
fn doctor(db: &ScratchDb, role: &Role) -> (bool, serde_json::Value) {
    let url = db
        .url()
        .replacen("postgres@", &format!("{}@", role.name), 1);
    let sandbox = Sandbox::new(&format!("[sink]\nurl = \"{url}\"\n"));
    let out = Command::new(binary())
        .args(["doctor", "--json", "--config"])
        .arg(sandbox.config_path())
        .output()
        .expect("run doctor");
    let findings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), findings)
}

fn verdict<'a>(findings: &'a serde_json::Value, check: &str) -> &'a serde_json::Value {
    findings
        .as_array()
        .and_then(|a| a.iter().find(|f| f["check"] == check))
        .unwrap_or_else(|| panic!("no {check} in {findings}"))
}

#[tokio::test]
async fn a_badly_set_role_fails_and_a_well_set_one_passes() {
    let db = ScratchDb::create().await;
    let no_lock_timeout = Role::create(&[]).await;
    let (ok, f) = doctor(&db, &no_lock_timeout);
    assert!(!ok, "doctor passed a role without lock_timeout: {f}");
    let lock = verdict(&f, "role.lock_timeout");
    assert_eq!(lock["verdict"], "fail", "{lock}");
    assert!(
        lock["fix"]
            .as_str()
            .is_some_and(|fix| fix.contains(&format!("ALTER ROLE {}", no_lock_timeout.name))),
        "{lock}"
    );

    let inverted = Role::create(&[("lock_timeout", "1s"), ("statement_timeout", "500ms")]).await;
    let (ok, f) = doctor(&db, &inverted);
    assert!(!ok, "doctor passed statement_timeout < lock_timeout: {f}");
    assert_eq!(verdict(&f, "role.lock_timeout")["verdict"], "pass", "{f}");
    assert_eq!(
        verdict(&f, "role.statement_timeout")["verdict"],
        "fail",
        "{f}"
    );

    let good = Role::create(&[
        ("lock_timeout", "1s"),
        ("statement_timeout", "5s"),
        ("idle_in_transaction_session_timeout", "10s"),
    ])
    .await;
    let (ok, f) = doctor(&db, &good);
    assert!(ok, "doctor failed a well-set role: {f}");
    for check in [
        "role.lock_timeout",
        "role.statement_timeout",
        "role.idle_in_transaction_session_timeout",
        "inbox.key",
        "sources.signatures",
    ] {
        assert_eq!(verdict(&f, check)["verdict"], "pass", "{check}: {f}");
    }
    db.drop_db().await;
}
