//! The orders the broker tests send through the pipeline, and how they
//! read what the sink applied (the `ORDERS` table of `worker`).

use std::time::{Duration, Instant};

use crate::pg::ScratchDb;
use crate::utils::*;

/// Applications summed over every order row.
pub async fn applied(db: &ScratchDb) -> i64 {
    db.client
        .query_one(
            "SELECT coalesce(sum(applied_count), 0)::int8 FROM orders",
            &[],
        )
        .await
        .expect("sum")
        .get(0)
}

/// Sends a signed Stripe event for `order`.
pub async fn send(http: &Http, server: &Server, event_id: &str, order: i64) -> Answer {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": event_id,
        "type": "order.updated",
        "data": {"object": {"id": order, "status": "paid"}}
    }))
    .expect("json");
    post_stripe(http, server, body).await
}

/// Waits until exactly `n` applications were made (more fails at once).
pub async fn wait_for_applied(db: &ScratchDb, n: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = applied(db).await;
        if got == n {
            return;
        }
        assert!(got < n, "applied {got}, more than the {n} sent");
        assert!(
            Instant::now() < deadline,
            "applied {got} of {n} in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many of `event_ids` have no inbox row (were never applied).
pub async fn never_applied(db: &ScratchDb, event_ids: &[String]) -> i64 {
    db.client
        .query_one(
            "SELECT count(*) FROM unnest($1::text[]) AS e(id)
             WHERE NOT EXISTS (SELECT 1 FROM breakwater_inbox i WHERE i.event_id = e.id)",
            &[&event_ids],
        )
        .await
        .expect("missing")
        .get(0)
}

/// Rows of the inbox: one per event applied.
pub async fn inbox_rows(db: &ScratchDb) -> i64 {
    db.client
        .query_one("SELECT count(*) FROM breakwater_inbox", &[])
        .await
        .expect("inbox")
        .get(0)
}
