//! A scratch PostgreSQL database per test, on the shared server.
//!
//! The server is the machine's (127.0.0.1:5432, trust auth) or
//! `BREAKWATER_TEST_PG` (a URL without a database name). Each test creates
//! its own database with a unique name and drops it when done. No server is
//! a loud failure, never a silent skip.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_postgres::{Client, NoTls};

/// The server's base URL (no database).
pub fn server_url() -> String {
    std::env::var("BREAKWATER_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// Connects to `database` on the test server.
pub async fn connect(database: &str) -> Client {
    let url = format!("{}/{database}", server_url());
    let (client, conn) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is required for this test and is not reachable at {url}: {e}. \
                 Start it (scripts/test.sh does) or set BREAKWATER_TEST_PG."
            )
        });
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A database that exists for the life of the value.
pub struct ScratchDb {
    pub name: String,
    pub client: Client,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl ScratchDb {
    /// A session of its own holding order `id`'s row (`SELECT ... FOR
    /// UPDATE` in an open transaction) until it runs `ROLLBACK` or drops.
    pub async fn lock_order(&self, id: i64) -> Client {
        let locker = connect(&self.name).await;
        locker
            .batch_execute(&format!(
                "BEGIN; SELECT * FROM orders WHERE id = {id} FOR UPDATE;"
            ))
            .await
            .unwrap_or_else(|e| panic!("lock order {id}: {e}"));
        locker
    }

    /// Creates `bw_it_<pid>_<n>` and connects to it.
    pub async fn create() -> Self {
        let name = format!(
            "bw_it_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let admin = connect("postgres").await;
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .expect("create scratch database");
        }
        let client = connect(&name).await;
        Self { name, client }
    }

    /// The URL a sink uses to reach this database.
    pub fn url(&self) -> String {
        format!("{}/{}", server_url(), self.name)
    }

    /// Drops the database (also done best-effort on drop).
    pub async fn drop_db(self) {
        let admin = connect("postgres").await;
        let _ = admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        // Best effort when a test panicked before `drop_db`: a blocking psql.
        let _ = std::process::Command::new("psql")
            .args([
                &server_url(),
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
