//! A queue's counts as the broker itself reports them, through
//! `rabbitmqctl` (which must be on the PATH, run by a user allowed to use
//! it): what the tests assert the breaker's flow against, rather than
//! trusting the client's own view. Behind the `rabbitmqctl` feature, for
//! tests; it panics on a failure, as a test should.
//!
//! `list_queues` counts come from the broker's statistics, which lag the
//! protocol by up to its `collect_statistics_interval` (5 s by default):
//! wait for them. `list_consumers` is live.

use std::process::Command;
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .args(["-q", "--no-table-headers"])
        .output()
        .unwrap_or_else(|e| panic!("rabbitmqctl is needed for these tests: {e}"));
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// (ready, unacked, consumers) of `queue`, as the broker counts them.
pub fn queue_counts(queue: &str) -> (u64, u64, u64) {
    let out = run(&[
        "list_queues",
        "name",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
    ]);
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && f[0] == queue {
            let n = |s: &str| s.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
            return (n(f[1]), n(f[2]), n(f[3]));
        }
    }
    panic!("no queue {queue} in {out}");
}

/// The prefetch of each consumer on `queue`.
pub fn prefetches(queue: &str) -> Vec<u64> {
    run(&["list_consumers", "queue_name", "prefetch_count"])
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() == 2 && f[0] == queue).then(|| f[1].parse().unwrap_or(u64::MAX))
        })
        .collect()
}

/// Waits until the broker's counts of `queue` are `want` (its statistics
/// lag the protocol by up to a few hundred milliseconds).
pub async fn counts_become(queue: &str, want: (u64, u64, u64), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = queue_counts(queue);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: (ready, unacked, consumers) = {got:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
