//! `breakwater-sim`: runs seeds of the deterministic simulation and prints
//! the seeds tried, the faults they drew, and any that broke a promise with
//! the command that replays it.

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;

use breakwater_sim::queue::KeyOrder;
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
    /// The order the simulated queue keeps: `key` (the default, as on the
    /// segment log) or `none` (applies out of acceptance order are then
    /// counted, not a broken promise).
    #[arg(long, value_parser = parse_order)]
    order: Option<KeyOrder>,
}

fn parse_order(s: &str) -> Result<KeyOrder, String> {
    match s {
        "key" => Ok(KeyOrder::Key),
        "none" => Ok(KeyOrder::None),
        _ => Err(format!("`{s}`: expected `key` or `none`")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let order = args.order.unwrap_or_else(breakwater_sim::default_order);
    if let Some(seed) = args.seed {
        if let Some(id) = args.trace {
            breakwater_sim::node::TRACE.store(u64::from(id) + 1, Ordering::Relaxed);
        }
        let report = breakwater_sim::run_with(seed, order);
        println!("{:#?}", report.schedule);
        print_report(seed, &report);
        for (i, (state, limit, running, held)) in report.nodes.iter().enumerate() {
            println!("node {i} at the end: {state}, limit {limit}, {running} running, {held} held");
        }
        if !report.exhausted_ids.is_empty() {
            println!("dead-lettered as exhausted: {:?}", report.exhausted_ids);
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
    let batch = breakwater_sim::run_many_with(args.start, args.seeds, threads, order);
    println!(
        "seeds {}..{} with order {order:?} in {:.1} s on {threads} thread(s)",
        args.start,
        args.start.saturating_add(args.seeds),
        started.elapsed().as_secs_f64()
    );
    println!("{batch}");
    if batch.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_report(seed: u64, r: &breakwater_sim::Report) {
    println!(
        "seed {seed} (order {:?}): {} accepted, {} applied, {} dead-lettered permanent, {} exhausted, {} duplicate applies, {} of {} keyed applies out of acceptance order, {} transitions, {} probes, {} controller leases taken, {} compare-and-sets lost, ended at {} ms: {}",
        r.order,
        r.accepted,
        r.applied,
        r.dead_permanent,
        r.dead_exhausted,
        r.duplicates,
        r.reorders,
        r.ordered_applies,
        r.transitions,
        r.probes,
        r.leases_taken,
        r.cas_lost,
        r.ended_ms,
        if r.passed() {
            "kept every promise"
        } else {
            "BROKE A PROMISE"
        }
    );
}
