//! What the store examples share: the 1 KiB webhook they enqueue and the
//! loop that enqueues a range of them with [`IN_FLIGHT`] in flight.
//! (A folder without `main.rs`, so Cargo does not take it for an example.)

use std::sync::Arc;

use breakwater_queue::{NewMessage, Queue};

/// Body bytes of each webhook.
pub(crate) const BODY: usize = 1024;
/// Enqueues in flight at once (the writer groups them).
pub(crate) const IN_FLIGHT: usize = 512;

/// Webhook `i` of a run named `run`: a 1 KiB body, one of 10,000 orders,
/// received now.
pub(crate) fn message(run: &str, i: usize) -> NewMessage {
    NewMessage {
        source: "stripe".to_owned(),
        event_id: format!("evt_{run}_{i:09}"),
        entity_key: Some(format!("order_{}", i % 10_000)),
        headers: Vec::new(),
        body: vec![b'x'; BODY].into(),
        received_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    }
}

/// Enqueues webhooks `range` of run `run` on `queue`, [`IN_FLIGHT`] at a
/// time.
pub(crate) async fn enqueue<Q: Queue + ?Sized + 'static>(
    queue: &Arc<Q>,
    run: &'static str,
    range: std::ops::Range<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let gate = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for i in range {
        let permit = Arc::clone(&gate).acquire_owned().await?;
        let queue = Arc::clone(queue);
        tasks.spawn(async move {
            let done = queue.enqueue(message(run, i)).await;
            drop(permit);
            done
        });
        while let Some(done) = tasks.try_join_next() {
            done??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}
