//! What a burst of webhooks costs the log store after a backlog was
//! drained, with drained segments kept free for reuse and without: fills a
//! store in a scratch directory with SEGMENTS segments' worth of 1 KiB
//! webhooks, claims and acks them all (the drain), then times a burst of
//! half as many again, enqueued 512 at a time, and reads how many bytes
//! the process wrote to disk meanwhile (`/proc/self/io`). Then the same
//! burst on a fresh store, at once and after the store idled until its
//! blank segments were zero-filled ahead. Prints one line per case.
//!
//!   cargo run --release -p breakwater-queue-log --example burst [SEGMENTS]

use std::sync::Arc;
use std::time::{Duration, Instant};

use breakwater_queue::Queue;
use breakwater_queue_log::{LogConfig, LogQueue};

mod support;

/// Webhooks of [`support::BODY`] bytes a 64 MiB segment holds, about.
const PER_SEGMENT: usize = 56_000;

/// Bytes this process has caused to be written to disk so far.
fn write_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes: ")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Claims and acks everything queued.
async fn drain(queue: &Arc<LogQueue>) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        let claimed = queue.claim(4096, Duration::from_secs(600)).await?;
        if claimed.is_empty() {
            return Ok(());
        }
        let mut tasks = tokio::task::JoinSet::new();
        for d in claimed {
            let queue = Arc::clone(queue);
            tasks.spawn(async move { queue.ack(&d.receipt).await });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
    }
}

/// Times a burst of `burst` webhooks on `queue`, printed as `case`.
async fn time_burst(
    case: &str,
    queue: &Arc<LogQueue>,
    from: usize,
    burst: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let written = write_bytes();
    let started = Instant::now();
    support::enqueue(queue, "burst", from..from + burst).await?;
    let took = started.elapsed().as_secs_f64();
    let written = write_bytes().saturating_sub(written);
    println!(
        "{case}: {burst} webhooks in {took:.2} s, {:.0}/s; {:.0} MiB written ({:.2} KiB a webhook)",
        burst as f64 / took,
        written as f64 / (1024.0 * 1024.0),
        written as f64 / 1024.0 / burst as f64,
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let segments: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 8,
    };
    let backlog = segments * PER_SEGMENT;
    let burst = backlog / 2;
    for free_segments in [LogConfig::default().free_segments, 0] {
        let dir = tempfile::tempdir()?;
        let queue = Arc::new(LogQueue::open(&LogConfig {
            free_segments,
            ..LogConfig::at(dir.path())
        })?);
        support::enqueue(&queue, "burst", 0..backlog).await?;
        drain(&queue).await?;
        // Let the reclaim of the last acks' group run.
        queue.enqueue(support::message("burst", backlog)).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        time_burst(
            &format!("after a drain of {segments} segments, free_segments = {free_segments}"),
            &queue,
            backlog + 1,
            burst,
        )
        .await?;
    }
    let dir = tempfile::tempdir()?;
    let queue = Arc::new(LogQueue::open(&LogConfig::at(dir.path()))?);
    time_burst("fresh store, at once", &queue, 0, burst).await?;

    let dir = tempfile::tempdir()?;
    let config = LogConfig::at(dir.path());
    let queue = Arc::new(LogQueue::open(&config)?);
    let idled = Instant::now();
    while blanks(dir.path())? < config.free_segments && idled.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let case = format!(
        "fresh store, after {:.1} s idle ({} blank segments made)",
        idled.elapsed().as_secs_f64(),
        blanks(dir.path())?
    );
    time_burst(&case, &queue, 0, burst).await?;
    Ok(())
}

/// Blank segments ready in the store at `dir`.
fn blanks(dir: &std::path::Path) -> std::io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        if name.to_string_lossy().starts_with("blank-") && name.to_string_lossy().ends_with(".log")
        {
            n += 1;
        }
    }
    Ok(n)
}
