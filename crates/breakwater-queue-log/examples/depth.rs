//! Whether a webhook costs the log store more as the store fills: enqueues
//! CHUNKS chunks of 250,000 1 KiB webhooks into one store, 512 in flight,
//! never claiming any, and prints each chunk's rate and the process's CPU
//! per webhook (user + system, from `/proc/self/stat`) against the depth
//! the chunk started at. Every chunk after the first few writes its
//! segments' zeros as it goes, so chunks past the blanks compare like with
//! like; only the depth differs.
//!
//!   cargo run --release -p breakwater-queue-log --example depth [CHUNKS]

use std::sync::Arc;
use std::time::Instant;

use breakwater_queue_log::{LogConfig, LogQueue};

mod support;

const CHUNK: usize = 250_000;

/// CPU seconds (user + system) this process has used so far.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line, in clock ticks (100 a second).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let chunks: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 8,
    };
    let dir = tempfile::tempdir()?;
    let queue = Arc::new(LogQueue::open(&LogConfig::at(dir.path()))?);
    for chunk in 0..chunks {
        let from = chunk * CHUNK;
        let (cpu, started) = (cpu_secs(), Instant::now());
        support::enqueue(&queue, "depth", from..from + CHUNK).await?;
        let took = started.elapsed().as_secs_f64();
        let cpu = cpu_secs() - cpu;
        println!(
            "depth {:>9}: {:.0} webhooks/s, {:.2} us of CPU a webhook",
            from,
            CHUNK as f64 / took,
            cpu * 1e6 / CHUNK as f64,
        );
    }
    Ok(())
}
