//! Replaying the dead-letter queue at a bounded rate, on any backend.

use std::future::Future;
use std::time::Duration;

use crate::{Queue, QueueError};

/// Progress of [`replay_at_rate`], reported after each chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplayProgress {
    /// Messages put back so far.
    pub replayed: usize,
    /// Named messages not put back (not in the DLQ, or replayed
    /// `max_replays` times already).
    pub skipped: usize,
}

/// Puts dead letters back at most `rate` per second, in chunks of a tenth
/// of a second's worth: the messages `ids`, or every one when `ids` is
/// empty. Before each chunk it awaits `before_chunk` (the CLI waits there
/// while the breaker is open: no point feeding a database being
/// protected); after each it calls `progress`.
pub async fn replay_at_rate<W, F>(
    queue: &dyn Queue,
    ids: &[String],
    rate: f64,
    max_replays: u32,
    mut before_chunk: W,
    mut progress: impl FnMut(ReplayProgress),
) -> Result<ReplayProgress, QueueError>
where
    W: FnMut() -> F,
    F: Future<Output = ()>,
{
    let rate = if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        1.0
    };
    let per_chunk = (rate / 10.0).ceil().clamp(1.0, 1e6) as usize;
    let all = ids.is_empty();
    let mut pending = ids.iter();
    let mut done = ReplayProgress::default();
    loop {
        before_chunk().await;
        let chunk: Vec<String> = pending.by_ref().take(per_chunk).cloned().collect();
        if !all && chunk.is_empty() {
            break;
        }
        let put_back = queue.dlq_replay(&chunk, max_replays, per_chunk).await?;
        done.replayed += put_back.len();
        if !all {
            done.skipped += chunk.len() - put_back.len().min(chunk.len());
        }
        progress(done);
        if all && put_back.is_empty() {
            break;
        }
        let pause = Duration::try_from_secs_f64(put_back.len().max(1) as f64 / rate)
            .unwrap_or(Duration::from_secs(3600));
        tokio::time::sleep(pause).await;
    }
    Ok(done)
}
