//! `breakwater-sim`: runs seeds of the deterministic simulation and prints
//! the seeds tried, the faults they drew, and any that broke a promise with
//! the command that replays it.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use clap::Parser;

/// Deterministic simulation of Breakwater's breaker, lanes and settle
/// decisions under seeded fault schedules.
#[derive(Debug, Parser)]
#[command(name = "breakwater-sim", version)]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 10_000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Run this one seed and print its schedule and what happened.
    #[arg(long)]
    seed: Option<u64>,
    /// With --seed: print every settle of this message id.
    #[arg(long)]
    trace: Option<u32>,
    /// Threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(seed) = args.seed {
        if let Some(id) = args.trace {
            breakwater_sim::node::TRACE.store(u64::from(id) + 1, Ordering::Relaxed);
        }
        let report = breakwater_sim::run(seed);
        println!("{:#?}", report.schedule);
        print_report(seed, &report);
        for (i, (state, limit, running, held)) in report.nodes.iter().enumerate() {
            println!("node {i} at the end: {state}, limit {limit}, {running} running, {held} held");
        }
        for (id, started, due) in &report.running {
            println!("running at the end: message {id}, started {started} ms, due {due} ms");
        }
        for v in report.violations.iter().take(20) {
            println!("broken at {} ms: {}", v.at, v.what);
        }
        return if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = Instant::now();
    let next = AtomicU64::new(args.start);
    let end = args.start.saturating_add(args.seeds);
    let failed = Mutex::new(Vec::new());
    let (accepted, dead, exhausted, duplicates, transitions) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicU64::new(0),
        AtomicUsize::new(0),
    );
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let r = breakwater_sim::run(seed);
                    accepted.fetch_add(r.accepted, Ordering::Relaxed);
                    dead.fetch_add(r.dead_permanent, Ordering::Relaxed);
                    exhausted.fetch_add(r.dead_exhausted, Ordering::Relaxed);
                    duplicates.fetch_add(r.duplicates, Ordering::Relaxed);
                    transitions.fetch_add(r.transitions, Ordering::Relaxed);
                    if !r.passed() {
                        let first = r
                            .violations
                            .first()
                            .map(|v| format!("at {} ms: {}", v.at, v.what));
                        failed
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((seed, first.unwrap_or_default()));
                    }
                }
            });
        }
    });
    let mut failed = failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    failed.sort();
    println!(
        "seeds {}..{}: {} run in {:.1} s on {threads} thread(s); {} webhooks accepted, {} dead-lettered as poison, {} exhausted, {} duplicate applies (no effect), {} breaker transitions",
        args.start,
        end,
        end - args.start,
        started.elapsed().as_secs_f64(),
        accepted.into_inner(),
        dead.into_inner(),
        exhausted.into_inner(),
        duplicates.into_inner(),
        transitions.into_inner()
    );
    if failed.is_empty() {
        println!("every seed kept every promise");
        return ExitCode::SUCCESS;
    }
    println!("{} seed(s) broke a promise:", failed.len());
    for (seed, what) in failed.iter().take(20) {
        println!("  seed {seed} {what}");
        println!("    replay: cargo run -p breakwater-sim --release -- --seed {seed}");
    }
    ExitCode::FAILURE
}

fn print_report(seed: u64, r: &breakwater_sim::Report) {
    println!(
        "seed {seed}: {} accepted, {} applied, {} dead-lettered permanent, {} exhausted, {} duplicate applies, {} transitions, {} probes, ended at {} ms: {}",
        r.accepted,
        r.applied,
        r.dead_permanent,
        r.dead_exhausted,
        r.duplicates,
        r.transitions,
        r.probes,
        r.ended_ms,
        if r.passed() {
            "kept every promise"
        } else {
            "BROKE A PROMISE"
        }
    );
}
