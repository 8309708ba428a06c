//! How long a local store takes to be ready again with a backlog on disk:
//! fills a store in a scratch directory with N queued webhooks (default
//! 1,000,000, 1 KiB bodies), closes it, then times opening it again, the
//! first enqueue answered (the embedded store loads its duplicate index
//! then; the log has rebuilt every index by the time it opens) and the
//! first claim. Without `DROP_CACHES` the page cache holds what the store
//! left in it (the log: the newest `cache_bytes`, 256 MiB); with
//! `DROP_CACHES=1` (root) it is dropped before reopening, as after a
//! reboot.
//!
//!   cargo run --release -p breakwater-queue-log --example recovery [N] [log|embedded]

use std::sync::Arc;
use std::time::{Duration, Instant};

use breakwater_queue::Queue;
use breakwater_queue_embedded::{EmbeddedConfig, EmbeddedQueue};
use breakwater_queue_log::{LogConfig, LogQueue};

mod support;

use support::BODY;

/// Opens the store named by `store` in `dir`.
fn open(store: &str, dir: &std::path::Path) -> Result<Arc<dyn Queue>, Box<dyn std::error::Error>> {
    Ok(match store {
        "embedded" => Arc::new(EmbeddedQueue::open(&EmbeddedConfig::at(dir))?),
        "log" => Arc::new(LogQueue::open(&LogConfig::at(dir))?),
        other => return Err(format!("no store {other:?}: log or embedded").into()),
    })
}

fn dir_size(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 1_000_000,
    };
    let store = std::env::args().nth(2).unwrap_or_else(|| "log".to_owned());
    let dir = tempfile::tempdir()?;

    let filling = Instant::now();
    {
        let queue = open(&store, dir.path())?;
        for from in (0..n).step_by(100_000) {
            support::enqueue(&queue, "recovery", from..(from + 100_000).min(n)).await?;
            eprintln!(
                "{} queued ({:.0} s)",
                (from + 100_000).min(n),
                filling.elapsed().as_secs_f64()
            );
        }
    }
    let filled = filling.elapsed();
    // The writer and checkpoint threads end once the last handle is gone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "{store}: filled {n} webhooks of {BODY} B in {:.1} s ({:.0}/s); store {:.0} MiB",
        filled.as_secs_f64(),
        n as f64 / filled.as_secs_f64(),
        dir_size(dir.path()) as f64 / (1024.0 * 1024.0)
    );

    let cold = std::env::var_os("DROP_CACHES").is_some();
    if cold {
        std::fs::write("/proc/sys/vm/drop_caches", "3\n")?;
    }
    let start = Instant::now();
    let queue = open(&store, dir.path())?;
    let opened = start.elapsed();
    let answered = queue.enqueue(support::message("recovery", n)).await?;
    let first_enqueue = start.elapsed();
    let claimed = queue.claim(1, Duration::from_secs(30)).await?;
    let first_claim = start.elapsed();
    assert_eq!(claimed.len(), 1, "a backlog to claim from");
    assert!(matches!(answered, breakwater_queue::Enqueued::New { .. }));
    let again = queue.enqueue(support::message("recovery", 0)).await?;
    assert!(
        matches!(again, breakwater_queue::Enqueued::Duplicate { .. }),
        "the index knows the backlog"
    );
    let stats = queue.stats().await?;
    println!(
        "reopened ({}) with {:?} visible: open {:.3} s, first enqueue answered {:.3} s (the duplicate \
         index loaded), first claim {:.3} s",
        if cold {
            "page cache dropped"
        } else {
            "page cache as the store left it"
        },
        stats.visible,
        opened.as_secs_f64(),
        first_enqueue.as_secs_f64(),
        first_claim.as_secs_f64()
    );
    Ok(())
}
