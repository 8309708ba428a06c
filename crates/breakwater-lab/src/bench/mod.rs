//! `breakwater bench ingress`: the ingress against a bare hyper server, in
//! one run, under the same loopback load.
//!
//! Four phases, each after a short warm-up:
//!
//! 1. **bare hyper**: a hyper server answering `200 ok` to every POST;
//! 2. **breakwater**: the real ingress (Stripe signature verified, event id
//!    and entity key extracted, message committed to the embedded queue
//!    with fsync before the 202), on a fresh store on the same disk as the
//!    data directory;
//! 3. **breakwater at half its peak**: an open-loop load at half the rate
//!    phase 2 reached, to read the latency a deployment would see with
//!    headroom;
//! 4. **bare hyper at that rate**: the same open-loop load against phase
//!    1's server, the floor of what client, loopback and scheduler add to
//!    a latency at that rate (the control for phase 3).
//!
//! With `--floor`, each round has two more full-load phases: the same
//! ingress in front of [`floor::FloorQueue`], which only writes each group
//! of webhooks into a preallocated file and `fdatasync`s it, once from a
//! thread of its own and once led from the runtime's own threads (see
//! [`floor::FloorMode`]). The first one's ratio to bare hyper is the most
//! that any queue fsyncing from its own thread before the 202 can reach on
//! this machine: what is left between it and phase 2 is the store's own
//! cost; the second says what a design without that hand-off could gain;
//! what is left between them and a target is the machine's. After phase 3
//! the own-thread floor also runs at half of its own peak: the tail any
//! such queue would show with that headroom.
//!
//! Phases 1 and 2 alternate for `--rounds` rounds, and the ratio reported
//! is the median of the rounds' ratios (with `--floor`, Breakwater's over
//! the own-thread floor's is printed too: the leader floor runs right
//! after bare hyper, then Breakwater and the own-thread floor back to back,
//! taking turns going first); phase 3 runs at half the median of
//! phase 2's rates. On a shared VM either side alone moves by a third from
//! one minute to the next (bare hyper measured 36k to 60k req/s in five
//! runs within half an hour on the VM of 2026-11-29): the two phases of one round run back to
//! back, under the same neighbours, and the median keeps one lucky or
//! unlucky round from deciding the figure.
//!
//! Each phase's row also gives the CPU time per request over its measured
//! window, read from `/proc` ([`threads`]): the server runtime's threads
//! plus the queue's, and the client's. Bare hyper's server and client
//! threads cost 14–16 and 18–19 µs per request at 56k/s, and 32 and 66 µs
//! at 8k/s, on the VMs of 2026-11-29 (6.6–7.8 and 10.6–11.7 µs at about
//! 100k/s on the faster one of 2026-11-30): a thread that idles between
//! requests pays a wake-up for each.
//! These are the figures to watch when making the ingress cheaper.
//!
//! After the last round it reads the service's own metrics, so the figures say
//! where the time went: the handler's mean time against what the client
//! saw, split into waiting for the queue's writer, the group commit (how
//! many, how large, how long each took including its fsync) and the rest;
//! and, from `/proc` ([`threads`]), the queue threads' time on and waiting
//! for a CPU per webhook. It reads them again after phase 3, for the same
//! split at half the peak rate beside the mean latency the client saw.
//! Last, phase 3's requests over 5 ms (the p99 target) grouped into
//! episodes ([`load::episodes`]): a p99 made by two 40 ms stalls, during
//! which every connection waits, needs a different fix from one made by
//! slowness spread over the run.
//!
//! The load generator keeps `concurrency` keep-alive HTTP/1.1 connections,
//! each sending one request at a time (closed loop in phases 1 and 2; in 3
//! and 4 at send times kept by a pacing thread), and signs every request
//! itself in every phase (so the client's work is the same in all of them).
//! Server and client run in separate tokio runtimes of two threads each on
//! the same two cores: the figures are for comparison, not absolute
//! capacity.

pub mod drain;
pub mod floor;
pub mod forward;
pub mod lean;
pub mod load;
pub mod send;
pub mod threads;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

pub use self::load::{LoadReport, LoadSpec};
use breakwater::config::{Config, SchemeName, SourceConfig};
use breakwater::serve::{self, Role};
use breakwater::telemetry;
use breakwater_queue_embedded::EmbeddedConfig;

use crate::backend::LabBackend;

/// Options of `breakwater bench ingress`.
#[derive(Debug, Clone, clap::Args)]
pub struct IngressBenchArgs {
    /// Seconds of measured load per phase.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Rounds of bare hyper then Breakwater at full load; the ratio is the
    /// median of the rounds' ratios.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Seconds of unmeasured warm-up before each phase.
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// Concurrent connections, each with one request in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Size of each webhook body in bytes.
    #[arg(long, default_value_t = 1024)]
    pub body_bytes: usize,
    /// Directory for the benchmark's queue (removed afterwards). Use the
    /// disk production would use: fsync cost is what is being measured.
    #[arg(long, default_value = "data/bench")]
    pub data_dir: PathBuf,
    /// Also run, in each round, the ingress in front of a queue that only
    /// writes each group of webhooks into a preallocated file and
    /// fdatasyncs it, from a thread of its own and from the runtime's
    /// threads: the most an ingress that answers after an fsync can do on
    /// this machine. The first also runs at half its peak.
    #[arg(long)]
    pub floor: bool,
    /// Which queue backend the ingress enqueues onto (with --floor, a
    /// local one: embedded or log).
    #[arg(long, value_enum, default_value_t = LabBackend::Log)]
    pub backend: LabBackend,
    /// The broker's address (default: the broker's usual local one,
    /// nats://127.0.0.1:4222, amqp://guest:guest@127.0.0.1:5672/%2f, the
    /// SQS endpoint http://127.0.0.1:4566, or Kafka's 127.0.0.1:9092).
    #[arg(long)]
    pub queue_url: Option<String>,
}

/// The threads whose CPU time per request the report shows: the server
/// runtime's, the client runtime's, and the embedded queue's (writer and
/// checkpoint), in this order.
const CPU_OF: [&str; 3] = ["bench-server", "bench-client", "queue-"];

/// Secret of the benchmark's Stripe source.
pub const BENCH_SECRET: &str = "whsec_bench_secret_0123456789abcdef";
const SOURCE: &str = "stripe";

/// Results of the four phases.
#[derive(Debug)]
pub struct IngressBenchReport {
    pub args: IngressBenchArgs,
    /// Phases 1 and 2, one pair per round.
    pub rounds: Vec<Round>,
    pub half_rate: LoadReport,
    /// With `--floor`: the own-thread floor at half of its own peak.
    pub floor_half_rate: Option<LoadReport>,
    /// Bare hyper under phase 3's open-loop load: the harness's floor.
    pub bare_half_rate: LoadReport,
    /// The service's own view of phase 2 (all rounds, with warm-ups), when a
    /// metrics recorder was installed.
    pub inside: Option<Inside>,
    /// The same for phase 3 (with its warm-up).
    pub inside_half: Option<Inside>,
    /// CPU time of the queue's threads during phase 2 (all rounds, with warm-ups).
    pub queue_cpu: Option<QueueCpu>,
}

/// One round: bare hyper, then Breakwater, at full load (and, with
/// `--floor`, the ingress on the [`floor`] queue).
#[derive(Debug)]
pub struct Round {
    pub bare: LoadReport,
    pub breakwater: LoadReport,
    /// The floor with its own thread, when it ran.
    pub floor: Option<LoadReport>,
    /// The floor led from the runtime's threads, when it ran.
    pub leader_floor: Option<LoadReport>,
    /// The lean floor ([`lean`]: verify, append, fsync, nothing else),
    /// when it ran.
    pub lean_floor: Option<LoadReport>,
}

impl Round {
    /// Breakwater's rate over bare hyper's.
    pub fn ratio(&self) -> f64 {
        self.ratio_of(&self.breakwater)
    }

    /// The own-thread floor's rate over bare hyper's, when it ran.
    pub fn floor_ratio(&self) -> Option<f64> {
        self.floor.as_ref().map(|floor| self.ratio_of(floor))
    }

    /// Breakwater's rate over the own-thread floor's, when it ran: what
    /// issue 23's target reads.
    pub fn of_floor(&self) -> Option<f64> {
        self.breakwater_over(self.floor.as_ref())
    }

    /// The leader floor's rate over bare hyper's, when it ran.
    pub fn leader_floor_ratio(&self) -> Option<f64> {
        self.leader_floor.as_ref().map(|floor| self.ratio_of(floor))
    }

    /// The lean floor's rate over bare hyper's, when it ran.
    pub fn lean_floor_ratio(&self) -> Option<f64> {
        self.lean_floor.as_ref().map(|floor| self.ratio_of(floor))
    }

    /// Breakwater's rate over the lean floor's, when it ran: issue 23's
    /// outside target (75%), read in the same run.
    pub fn of_lean_floor(&self) -> Option<f64> {
        self.breakwater_over(self.lean_floor.as_ref())
    }

    /// Breakwater's rate over `floor`'s, when it ran and took any.
    fn breakwater_over(&self, floor: Option<&LoadReport>) -> Option<f64> {
        floor
            .filter(|floor| floor.rate() > 0.0)
            .map(|floor| self.breakwater.rate() / floor.rate())
    }

    fn ratio_of(&self, phase: &LoadReport) -> f64 {
        if self.bare.rate() > 0.0 {
            phase.rate() / self.bare.rate()
        } else {
            0.0
        }
    }
}

/// `ratios` as printed: `91.5% (median of rounds: 94.3%, 88.4%, 91.5%)`.
fn median_of_rounds(ratios: &[f64]) -> String {
    let per_round: Vec<String> = ratios
        .iter()
        .map(|r| format!("{:.1}%", r * 100.0))
        .collect();
    format!(
        "{:.1}% (median of rounds: {})",
        median(ratios.to_vec()) * 100.0,
        per_round.join(", ")
    )
}

/// The median of `values` (the mean of the middle two for an even count);
/// 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl IngressBenchReport {
    /// The median of the rounds' ratios.
    pub fn ratio(&self) -> f64 {
        median(self.rounds.iter().map(Round::ratio).collect())
    }
}

/// Seconds on CPU of the embedded queue's threads, and the writer's
/// seconds runnable but waiting for a CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueCpu {
    pub writer_secs: f64,
    pub writer_waiting_secs: f64,
    pub checkpoint_secs: f64,
}

impl QueueCpu {
    const WRITER: &str = "queue-writer";
    /// Thread names are cut at 15 bytes.
    const CHECKPOINT: &str = "queue-checkpoin";

    fn read() -> Option<Self> {
        let secs = |ns: u64| ns as f64 / 1e9;
        let writer = threads::times(Self::WRITER)?;
        Some(Self {
            writer_secs: secs(writer.on_cpu_ns),
            writer_waiting_secs: secs(writer.waiting_ns),
            checkpoint_secs: secs(threads::times(Self::CHECKPOINT)?.on_cpu_ns),
        })
    }

    fn since(self, before: Self) -> Self {
        Self {
            writer_secs: self.writer_secs - before.writer_secs,
            writer_waiting_secs: self.writer_waiting_secs - before.writer_waiting_secs,
            checkpoint_secs: self.checkpoint_secs - before.checkpoint_secs,
        }
    }

    fn plus(self, other: Self) -> Self {
        Self {
            writer_secs: self.writer_secs + other.writer_secs,
            writer_waiting_secs: self.writer_waiting_secs + other.writer_waiting_secs,
            checkpoint_secs: self.checkpoint_secs + other.checkpoint_secs,
        }
    }
}

/// Sums (in seconds) and counts of the service's summaries at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub handler_secs: f64,
    pub accepted: f64,
    pub wait_secs: f64,
    pub waits: f64,
    pub commit_secs: f64,
    pub commits: f64,
    pub ops: f64,
}

impl Totals {
    /// Reads the totals from a Prometheus text rendering (the enqueue wait
    /// counts as zero when missing).
    pub fn from_prometheus(text: &str) -> Option<Self> {
        let (handler_secs, accepted) = sum_count(text, telemetry::INGRESS_SECONDS)?;
        let (commit_secs, commits) = sum_count(text, telemetry::QUEUE_COMMIT_SECONDS)?;
        let (ops, _) = sum_count(text, telemetry::QUEUE_COMMIT_BATCH)?;
        let (wait_secs, waits) =
            sum_count(text, telemetry::QUEUE_ENQUEUE_WAIT_SECONDS).unwrap_or((0.0, 0.0));
        Some(Self {
            handler_secs,
            accepted,
            wait_secs,
            waits,
            commit_secs,
            commits,
            ops,
        })
    }

    /// These totals plus what was added between `before` and `after`.
    fn plus_between(self, before: Self, after: Self) -> Self {
        let add = |mine: f64, from: f64, to: f64| mine + (to - from);
        Self {
            handler_secs: add(self.handler_secs, before.handler_secs, after.handler_secs),
            accepted: add(self.accepted, before.accepted, after.accepted),
            wait_secs: add(self.wait_secs, before.wait_secs, after.wait_secs),
            waits: add(self.waits, before.waits, after.waits),
            commit_secs: add(self.commit_secs, before.commit_secs, after.commit_secs),
            commits: add(self.commits, before.commits, after.commits),
            ops: add(self.ops, before.ops, after.ops),
        }
    }
}

/// Means from the service's metrics over a stretch of the bench.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inside {
    /// Accepted webhooks and the handler's mean time for them, in ms.
    pub accepted: f64,
    pub handler_ms: f64,
    /// Mean time an enqueue waited for the writer to start its group
    /// commit, in ms (0 when the metric is missing).
    pub wait_ms: f64,
    /// Group commits, operations per commit, and the mean commit time
    /// (inserts, commit and fsync) in ms.
    pub commits: f64,
    pub ops_per_commit: f64,
    pub commit_ms: f64,
}

impl Inside {
    /// The means of what happened between two readings.
    pub fn between(before: Totals, after: Totals) -> Self {
        let mean = |sum: f64, n: f64| if n > 0.0 { sum / n } else { 0.0 };
        let accepted = after.accepted - before.accepted;
        let commits = after.commits - before.commits;
        Self {
            accepted,
            handler_ms: mean(after.handler_secs - before.handler_secs, accepted) * 1000.0,
            wait_ms: mean(
                after.wait_secs - before.wait_secs,
                after.waits - before.waits,
            ) * 1000.0,
            commits,
            ops_per_commit: mean(after.ops - before.ops, commits),
            commit_ms: mean(after.commit_secs - before.commit_secs, commits) * 1000.0,
        }
    }

    /// The means since the service started, from a Prometheus rendering
    /// (the bench itself reads [`Totals`] and takes differences).
    #[cfg(test)]
    fn from_prometheus(text: &str) -> Option<Self> {
        Totals::from_prometheus(text).map(|t| Self::between(Totals::default(), t))
    }

    /// The handler's mean time outside the writer's wait and commit.
    fn rest_ms(&self) -> f64 {
        self.handler_ms - self.wait_ms - self.commit_ms
    }
}

/// The `_sum` and `_count` of a summary, added up over its label sets.
fn sum_count(text: &str, name: &str) -> Option<(f64, f64)> {
    let total = |suffix: &str| -> Option<f64> {
        let metric = format!("{name}{suffix}");
        let values: Vec<f64> = text
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(&metric)?;
                if !(rest.starts_with(' ') || rest.starts_with('{')) {
                    return None;
                }
                line.rsplit(' ').next()?.parse().ok()
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    };
    Some((total("_sum")?, total("_count")?))
}

impl fmt::Display for IngressBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.args;
        writeln!(
            f,
            "ingress bench: {} connections, {} B bodies, {} s per phase (after {} s warm-up), \
             {} rounds of phases 1 and 2",
            a.concurrency, a.body_bytes, a.duration, a.warmup, a.rounds
        )?;
        writeln!(
            f,
            "{:<28} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}   CPU us/req: server + queue, client",
            "phase", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"
        )?;
        let mut rows: Vec<(String, &LoadReport)> = Vec::new();
        for (i, round) in self.rounds.iter().enumerate() {
            let n = i + 1;
            rows.push((format!("{n}: bare hyper (200 ok)"), &round.bare));
            rows.push((
                format!("{n}: breakwater (verify+durable)"),
                &round.breakwater,
            ));
            if let Some(floor) = &round.floor {
                rows.push((format!("{n}: floor, own thread"), floor));
            }
            if let Some(floor) = &round.leader_floor {
                rows.push((format!("{n}: floor, leader"), floor));
            }
            if let Some(floor) = &round.lean_floor {
                rows.push((format!("{n}: floor, lean"), floor));
            }
        }
        rows.push(("breakwater at 1/2 peak".to_owned(), &self.half_rate));
        rows.push(("bare hyper at that rate".to_owned(), &self.bare_half_rate));
        if let Some(floor) = &self.floor_half_rate {
            rows.push(("floor, own thread, 1/2 peak".to_owned(), floor));
        }
        for (name, r) in rows {
            let us = |i: usize| r.cpu_us_per_request(i).unwrap_or(0.0);
            let cpu = match (r.cpu_us_per_request(0), r.cpu_us_per_request(1)) {
                (Some(server), Some(client)) => {
                    format!("{server:.1} + {:.1}, {client:.1}", us(2))
                }
                _ => "-".to_owned(),
            };
            writeln!(
                f,
                "{:<28} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8}   {}",
                name,
                r.rate(),
                r.percentile_ms(50.0),
                r.percentile_ms(90.0),
                r.percentile_ms(99.0),
                r.percentile_ms(100.0),
                r.errors,
                cpu
            )?;
        }
        let ratios: Vec<f64> = self.rounds.iter().map(Round::ratio).collect();
        writeln!(
            f,
            "ratio breakwater / bare hyper: {}",
            median_of_rounds(&ratios)
        )?;
        let floors = [
            (
                "floor, own thread",
                self.rounds
                    .iter()
                    .filter_map(Round::floor_ratio)
                    .collect::<Vec<_>>(),
                "the most a queue that fsyncs each group from its own thread before \
                 answering can reach here",
            ),
            (
                "floor, leader",
                self.rounds
                    .iter()
                    .filter_map(Round::leader_floor_ratio)
                    .collect(),
                "the same with the fsync on the runtime's own threads, no hand-off",
            ),
            (
                "floor, lean",
                self.rounds
                    .iter()
                    .filter_map(Round::lean_floor_ratio)
                    .collect(),
                "hyper, the signature check, one write and fsync per group, nothing else",
            ),
        ];
        for (name, ratios, meaning) in floors {
            if ratios.is_empty() {
                continue;
            }
            writeln!(
                f,
                "ratio {name} / bare hyper: {}: {meaning}",
                median_of_rounds(&ratios)
            )?;
        }
        let of_floor: Vec<f64> = self.rounds.iter().filter_map(Round::of_floor).collect();
        if !of_floor.is_empty() {
            writeln!(
                f,
                "ratio breakwater / floor, own thread: {}",
                median_of_rounds(&of_floor)
            )?;
        }
        let of_lean: Vec<f64> = self
            .rounds
            .iter()
            .filter_map(Round::of_lean_floor)
            .collect();
        if !of_lean.is_empty() {
            writeln!(
                f,
                "ratio breakwater / floor, lean: {}",
                median_of_rounds(&of_lean)
            )?;
        }
        if let Some(i) = &self.inside {
            writeln!(
                f,
                "inside phase 2 (all rounds, with warm-ups): {:.0} accepted; {:.0} group commits of {:.1} \
                 operations, {:.2} ms each (inserts + commit + fsync)",
                i.accepted, i.commits, i.ops_per_commit, i.commit_ms
            )?;
            writeln!(
                f,
                "handler mean {:.2} ms = waiting for the writer {:.2} + its group commit {:.2} \
                 + the rest {:.2} (verify, parse, wake-ups)",
                i.handler_ms,
                i.wait_ms,
                i.commit_ms,
                i.rest_ms()
            )?;
            if let Some(cpu) = self.queue_cpu.filter(|_| i.accepted > 0.0) {
                let per_webhook = |secs: f64| secs / i.accepted * 1e6;
                writeln!(
                    f,
                    "queue threads per accepted webhook: writer {:.1} us on CPU and {:.1} us \
                     waiting for one, checkpoint {:.1} us on CPU",
                    per_webhook(cpu.writer_secs),
                    per_webhook(cpu.writer_waiting_secs),
                    per_webhook(cpu.checkpoint_secs)
                )?;
            }
        }
        if let Some(i) = &self.inside_half {
            writeln!(
                f,
                "inside phase 3 (with warm-up): handler mean {:.2} ms = waiting for the writer \
                 {:.2} + its group commit {:.2} + the rest {:.2}; the client saw {:.2} ms mean",
                i.handler_ms,
                i.wait_ms,
                i.commit_ms,
                i.rest_ms(),
                self.half_rate.mean_ms()
            )?;
        }
        write_episodes(f, &self.half_rate)
    }
}

/// How close together late requests must be to count as one episode.
const EPISODE_GAP: Duration = Duration::from_millis(10);

/// Phase 3's late requests, in episodes: whether its p99 comes from a few
/// stalls or from slowness spread over the run.
fn write_episodes(f: &mut fmt::Formatter<'_>, half: &LoadReport) -> fmt::Result {
    let late_ms = load::LATE.as_millis();
    let found = load::episodes(&half.late, EPISODE_GAP);
    let share = half.late.len() as f64 / half.latencies_us.len().max(1) as f64 * 100.0;
    write!(
        f,
        "phase 3 over {late_ms} ms: {} requests ({share:.2}%) in {} episodes",
        half.late.len(),
        found.len()
    )?;
    let largest: Vec<String> = found
        .iter()
        .take(3)
        .map(|e| {
            format!(
                "{} at {:.2} s for {:.0} ms (slowest {:.1} ms)",
                e.requests,
                e.from_us as f64 / 1e6,
                e.to_us.saturating_sub(e.from_us) as f64 / 1e3,
                f64::from(e.worst_us) / 1e3
            )
        })
        .collect();
    if largest.is_empty() {
        writeln!(f)
    } else {
        writeln!(f, "; largest: {}", largest.join(", "))
    }
}

fn runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .context("cannot start a runtime")
}

/// Runs the four phases and returns their figures. With `metrics` (the
/// handle of the installed recorder) the report also holds the service's
/// own view of phase 2.
pub fn run_ingress_bench(
    args: &IngressBenchArgs,
    metrics: Option<PrometheusHandle>,
) -> anyhow::Result<IngressBenchReport> {
    let server_rt = runtime("bench-server")?;
    let client_rt = runtime("bench-client")?;
    let spec = |target: SocketAddr, path: &str, tag: &str, rate: Option<f64>| LoadSpec {
        target,
        path: path.to_owned(),
        concurrency: args.concurrency,
        body_bytes: args.body_bytes,
        warmup: Duration::from_secs(args.warmup),
        duration: Duration::from_secs(args.duration),
        secret: BENCH_SECRET.to_owned(),
        run_tag: tag.to_owned(),
        rate,
        cpu_of: CPU_OF.to_vec(),
    };

    let bare_addr = server_rt.block_on(start_bare_hyper())?;
    if args.floor && !matches!(args.backend, LabBackend::Embedded | LabBackend::Log) {
        anyhow::bail!("--floor measures a local store: use --backend embedded or --backend log");
    }
    let dir = args.data_dir.join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = bench_config(&dir);
    let queue_name = format!("bwbench_{}", std::process::id());
    if let Some(section) = args.backend.section(
        &args.backend.url(args.queue_url.as_deref()),
        &queue_name,
        &dir,
    ) {
        config.queue = section;
    }
    let running = server_rt.block_on(serve::start(&config, Role::Ingress, None))?;
    let addr = running.ingress_addr.context("the ingress did not start")?;
    let path = format!("/webhooks/{SOURCE}");
    let floor_addrs = if args.floor {
        Some((
            server_rt.block_on(start_floor(&config, &dir, floor::FloorMode::OwnThread))?,
            server_rt.block_on(start_floor(&config, &dir, floor::FloorMode::Leader))?,
            server_rt.block_on(lean::start(&dir.join("floor-lean.log"), BENCH_SECRET))?,
        ))
    } else {
        None
    };
    let totals = || {
        metrics
            .as_ref()
            .and_then(|m| Totals::from_prometheus(&m.render()))
    };
    // The floor's requests go through the same ingress metrics: their
    // share is taken out of phase 2's figures.
    let mut floor_share = Totals::default();
    let mut rounds = Vec::new();
    // The queue threads' CPU while the queue is busy, so phase 1 (queue
    // idle) is left out.
    let mut queue_cpu: Option<QueueCpu> = QueueCpu::read().map(|_| QueueCpu::default());
    for n in 1..=args.rounds {
        eprintln!("round {n}/{}: phase 1/4: bare hyper", args.rounds);
        let tag = format!("bare{n}");
        let bare = client_rt.block_on(load::run(spec(bare_addr, "/", &tag, None)))?;
        // The leader floor runs first; then Breakwater and the own-thread
        // floor, the pair issue 23 compares, back to back and taking turns
        // going first. Neither of the pair always follows bare hyper or
        // the other: whichever ran right after bare hyper read 10-20%
        // lower in most rounds (2026-12-03).
        let own_floor_first = n % 2 == 0;
        let (mut floor, mut leader_floor, mut lean_floor) = (None, None, None);
        let mut run_floor =
            |addr: SocketAddr, name: &str, report: &mut Option<LoadReport>| -> anyhow::Result<()> {
                eprintln!("round {n}/{}: floor, {name}", args.rounds);
                let tag = format!("floor-{name}-{n}");
                let before = totals();
                *report = Some(client_rt.block_on(load::run(spec(addr, &path, &tag, None)))?);
                if let (Some(before), Some(after)) = (before, totals()) {
                    floor_share = floor_share.plus_between(before, after);
                }
                Ok(())
            };
        if let Some((own_thread, leader, lean)) = floor_addrs {
            run_floor(leader, "leader", &mut leader_floor)?;
            run_floor(lean, "lean", &mut lean_floor)?;
            if own_floor_first {
                run_floor(own_thread, "own thread", &mut floor)?;
            }
        }
        eprintln!("round {n}/{}: phase 2/4: breakwater ingress", args.rounds);
        let before = QueueCpu::read();
        let tag = format!("bw{n}");
        let breakwater = client_rt.block_on(load::run(spec(addr, &path, &tag, None)))?;
        queue_cpu = match (queue_cpu, before, QueueCpu::read()) {
            (Some(sum), Some(before), Some(after)) => Some(sum.plus(after.since(before))),
            _ => None,
        };
        if let Some((own_thread, _, _)) = floor_addrs
            && !own_floor_first
        {
            run_floor(own_thread, "own thread", &mut floor)?;
        }
        rounds.push(Round {
            bare,
            breakwater,
            floor,
            leader_floor,
            lean_floor,
        });
    }
    let after_rounds = totals();
    let inside = after_rounds.map(|t| Inside::between(floor_share, t));

    let peak = median(rounds.iter().map(|r| r.breakwater.rate()).collect());
    eprintln!("phase 3/4: breakwater at half of {peak:.0} req/s");
    let half = (peak / 2.0).max(1.0);
    let half_rate = client_rt.block_on(load::run(spec(addr, &path, "half", Some(half))))?;
    let inside_half = after_rounds
        .zip(totals())
        .map(|(before, after)| Inside::between(before, after));
    let floor_half_rate = match floor_addrs {
        Some((own_thread, _, _)) => {
            let peak = median(
                rounds
                    .iter()
                    .filter_map(|r| r.floor.as_ref())
                    .map(LoadReport::rate)
                    .collect(),
            );
            let half = (peak / 2.0).max(1.0);
            eprintln!("floor, own thread, at half of its {peak:.0} req/s");
            Some(client_rt.block_on(load::run(spec(
                own_thread,
                &path,
                "floor-half",
                Some(half),
            )))?)
        }
        None => None,
    };

    server_rt.block_on(running.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
    server_rt.block_on(
        args.backend
            .remove(&args.backend.url(args.queue_url.as_deref()), &queue_name),
    );

    eprintln!("phase 4/4: bare hyper at {half:.0} req/s");
    let bare_half_rate =
        client_rt.block_on(load::run(spec(bare_addr, "/", "bare-half", Some(half))))?;
    drop(server_rt);
    Ok(IngressBenchReport {
        args: args.clone(),
        rounds,
        half_rate,
        floor_half_rate,
        bare_half_rate,
        inside,
        inside_half,
        queue_cpu,
    })
}

/// The configuration of the benchmark's ingress: one Stripe source,
/// listeners on ephemeral ports, the queue under `dir`.
pub fn bench_config(dir: &std::path::Path) -> Config {
    let mut config = Config::default();
    config.ingress.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.admin.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.queue = EmbeddedConfig::at(dir).section();
    config.sources.push(SourceConfig {
        event_id: Some("json:/id".to_owned()),
        entity_key: Some("json:/data/object/id".to_owned()),
        ..SourceConfig::new(SOURCE, SchemeName::Stripe, vec![BENCH_SECRET.to_owned()])
    });
    config
}

/// Starts the real ingress of `config` in front of a [`floor::FloorQueue`]
/// whose file is in `dir`, on an ephemeral port.
async fn start_floor(
    config: &Config,
    dir: &std::path::Path,
    mode: floor::FloorMode,
) -> anyhow::Result<SocketAddr> {
    let sources = breakwater::source::compile_all(&config.sources)?;
    let file = dir.join(format!("floor-{mode:?}.log"));
    // The embedded store's group settings (the log's are the same).
    let embedded = EmbeddedConfig::from_section(&config.queue).unwrap_or_default();
    let queue = floor::FloorQueue::open(&file, &embedded, mode)?;
    let service = breakwater::ingress::Ingress::new(
        &sources,
        std::sync::Arc::new(queue),
        config.ingress.max_body_bytes,
    )
    .service();
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    // Served as `serve` serves the ingress: the same limits, the same
    // path; it stops with the process.
    let (never_stops, stop) = tokio::sync::watch::channel(false);
    let limits = breakwater::serve::ingress_limits(config);
    tokio::spawn(async move {
        let _never_stops = never_stops;
        breakwater::http::serve("floor", listener, service, limits, stop).await;
    });
    Ok(addr)
}

/// Puts `n` messages (the `i`th made by `message(i)`) in `queue`, 512
/// enqueues in flight at a time, before a drain is timed.
pub(crate) async fn fill_queue(
    queue: &std::sync::Arc<dyn breakwater::queue::Queue>,
    n: usize,
    message: impl Fn(usize) -> breakwater::queue::NewMessage,
) -> anyhow::Result<()> {
    let mut fills = Vec::new();
    for i in 0..n {
        let q = std::sync::Arc::clone(queue);
        let m = message(i);
        fills.push(tokio::spawn(async move { q.enqueue(m).await }));
        if fills.len() >= 512 {
            for f in fills.drain(..) {
                f.await??;
            }
        }
    }
    for f in fills {
        f.await??;
    }
    Ok(())
}

/// Starts a hyper server that answers `200 ok` to anything, on an ephemeral
/// loopback port: what the bench calls bare hyper.
pub async fn start_bare_hyper() -> anyhow::Result<SocketAddr> {
    serve_plain_hyper(service_fn(|_req| async {
        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
            b"ok",
        ))))
    }))
    .await
}

/// Serves `service` with plain hyper HTTP/1 (no limits, no timeouts) on an
/// ephemeral loopback port, one clone per connection.
pub(crate) async fn serve_plain_hyper<S>(service: S) -> anyhow::Result<SocketAddr>
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<Full<Bytes>>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(vec![0.3, 0.5, 0.1]), 0.3);
        assert_eq!(median(vec![0.4, 0.1, 0.2, 0.3]), 0.25);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn inside_figures_are_read_from_the_rendered_summaries() {
        let text = "\
# TYPE breakwater_ingress_latency_seconds summary
breakwater_ingress_latency_seconds{source=\"stripe\",quantile=\"0.5\"} 0.004
breakwater_ingress_latency_seconds_sum{source=\"stripe\"} 30
breakwater_ingress_latency_seconds_count{source=\"stripe\"} 6000
breakwater_ingress_latency_seconds_sum{source=\"github\"} 10
breakwater_ingress_latency_seconds_count{source=\"github\"} 4000
breakwater_queue_commit_seconds_sum 0.5
breakwater_queue_commit_seconds_count 500
breakwater_queue_commit_batch_size_sum 10000
breakwater_queue_commit_batch_size_count 500
breakwater_queue_enqueue_wait_seconds_sum 15
breakwater_queue_enqueue_wait_seconds_count 10000
";
        let inside = Inside::from_prometheus(text).expect("parsed");
        assert_eq!(inside.accepted, 10_000.0);
        assert!((inside.handler_ms - 4.0).abs() < 1e-9);
        assert!((inside.wait_ms - 1.5).abs() < 1e-9);
        assert_eq!(inside.commits, 500.0);
        assert!((inside.ops_per_commit - 20.0).abs() < 1e-9);
        assert!((inside.commit_ms - 1.0).abs() < 1e-9);
        assert_eq!(Inside::from_prometheus("nothing here"), None);

        let before = Totals::from_prometheus(text).expect("parsed");
        let after = Totals {
            handler_secs: before.handler_secs + 2.0,
            accepted: before.accepted + 1000.0,
            wait_secs: before.wait_secs + 0.5,
            waits: before.waits + 1000.0,
            commit_secs: before.commit_secs + 0.1,
            commits: before.commits + 100.0,
            ops: before.ops + 1000.0,
        };
        let phase = Inside::between(before, after);
        // Taking a stretch's share out: what is left is the rest.
        let share = Totals::default().plus_between(before, after);
        assert_eq!(share.accepted, 1000.0);
        assert_eq!(Inside::between(share, after).accepted, before.accepted);
        assert!((Inside::between(share, after).handler_ms - 4.0).abs() < 1e-9);
        assert_eq!(phase.accepted, 1000.0);
        assert!((phase.handler_ms - 2.0).abs() < 1e-9);
        assert!((phase.wait_ms - 0.5).abs() < 1e-9);
        assert!((phase.commit_ms - 1.0).abs() < 1e-9);
        assert!((phase.ops_per_commit - 10.0).abs() < 1e-9);
        assert!((phase.rest_ms() - 0.5).abs() < 1e-9);
    }
}
