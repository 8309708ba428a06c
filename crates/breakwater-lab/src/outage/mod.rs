//! `breakwater lab <scenario>`: reproduce a fault of the dependency (a real
//! PostgreSQL, or with `--sink http` an internal HTTP service the lab
//! starts) while a webhook stream flows through the real ingress, queue
//! and workers, once with a naive consumer and once with Breakwater, and
//! report both side by side.
//!
//! Each mode runs in this process on its own ports, queue and scratch
//! schema (`bw_lab_<pid>_<mode>` in the given database, dropped after), or
//! its own [`service::LabService`], with the sink reaching it through a
//! [`FaultProxy`]. The timeline:
//!
//! ```text
//! 0 ─── load at --rate ────────────────────────────────────── --duration ── drain ──▶
//!          fault at --fault-at ──── --fault-secs ────▶ recovery
//! ```
//!
//! | scenario | fault (`--sink db`) | fault (`--sink http`) |
//! |---|---|---|
//! | `hot-row` | another session holds `SELECT ... FOR UPDATE` on order 1042 (30% of the events) | the service holds every request for order 1042 |
//! | `slow-db` (`slow`) | the proxy delays every chunk both ways (`--latency-ms`) | the same, in front of the service |
//! | `db-down` (`down`) | the proxy resets every connection and refuses new ones | the same |
//! | `hanging` | the proxy swallows every byte, answers nothing | the service accepts and never answers |
//! | `erroring` | - | the service answers 503 to every webhook |
//! | `poison` | no fault; 10% of the events violate a CHECK constraint | no fault; the service answers 422 to 10% |
//! | `overload` | `--overload-sessions` other sessions run a CPU-heavy query in a loop, straight to PostgreSQL; each webhook's statement also costs the database about 12 ms of CPU (`--statement-rows`) | - |
//!
//! **Naive mode** is the antipattern from the design, for comparison only:
//! 32 workers on a pool of 20, no lock timeout (statement timeout 60 s), no
//! breaker (dry run), no lanes, retries in the worker at a fixed 200 ms
//! without jitter (holding the worker, as a `for attempt in 1..=3` loop
//! does), dead-letter after 3 attempts. **Breakwater mode** is the defaults
//! with a pool of `--pool-max` (64): the adaptive limiter decides how much
//! of it is used. **Fixed mode** is Breakwater mode with the limiter off
//! (16 applies at most, as before the limiter).
//!
//! Every sample also times a probe of the lab's own, straight to the
//! dependency, not through the proxy: a small query (`SELECT count(*)`
//! over 100 orders), or the service's `GET /probe`: the dependency's
//! latency for an unrelated client.
//!
//! Measured every 250 ms ([`Sample`]) and in total ([`ModeReport`]); how each
//! figure is computed is documented on its field.

pub mod chart;
mod dependency;
pub mod driver;
pub mod report;
pub mod service;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use breakwater_faultproxy::{Fault, FaultProxy};
use serde::Serialize;
use tokio_postgres::NoTls;

use self::dependency::Dependency;
use self::driver::{DriveCounters, DriveSpec, HOT_ORDER};
pub use self::report::{LabReport, ModeReport, Sample};
use self::service::Behaviour;
use breakwater::config::{BackoffJitter, Config, ForwardConfig, StatementConfig};
use breakwater::serve::{self, Role};

use crate::naive::RetryInPlace;

/// Longest wait for the pipeline to start (for the database to answer).
const LAB_START_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The faults the lab can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    HotRow,
    #[value(alias = "slow")]
    SlowDb,
    #[value(alias = "down")]
    DbDown,
    /// The dependency takes requests and never answers.
    Hanging,
    /// `--sink http` only: the service answers 503.
    Erroring,
    Poison,
    Overload,
}

/// What the pipeline writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LabSink {
    /// The scratch schema of a real PostgreSQL (`--database-url`).
    Db,
    /// An internal HTTP service the lab starts, through the forward sink.
    Http,
}

pub use crate::backend::LabBackend;

/// Which consumers to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    Naive,
    Breakwater,
    Fixed,
    /// Naive and Breakwater.
    Both,
    /// Naive, Fixed and Breakwater.
    All,
}

/// One consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Naive,
    Breakwater,
    /// Breakwater with the adaptive limiter off.
    Fixed,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::Breakwater => "breakwater",
            Self::Fixed => "fixed",
        }
    }
}

/// Options of `breakwater lab`.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct LabArgs {
    /// The fault to inject.
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// PostgreSQL database to create the scratch schemas in.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub database_url: String,
    /// Seconds of webhook load.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Webhooks per second.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds into the load when the fault starts (the fault must end
    /// within --duration).
    #[arg(long, default_value_t = 10)]
    pub fault_at: u64,
    /// Seconds the fault lasts.
    #[arg(long, default_value_t = 30)]
    pub fault_secs: u64,
    /// Share of events for the hot order 1042.
    #[arg(long, default_value_t = 0.3)]
    pub hot_share: f64,
    /// slow-db: delay per chunk forwarded, each way.
    #[arg(long, default_value_t = 40)]
    pub latency_ms: u64,
    /// overload: sessions running the heavy query loop.
    #[arg(long, default_value_t = 2)]
    pub overload_sessions: u32,
    /// CPU work the database does for each webhook besides its indexed
    /// UPDATE: an aggregate over this many generated rows in the same
    /// statement, as a handler that recomputes a total would (80,000 take
    /// about 12 ms of one core here, so 150 webhooks/s ask about as much
    /// CPU as the database gets). Default: 80,000 in overload, where the
    /// webhooks' own work is what more concurrency piles onto a saturated
    /// database; 0 (the UPDATE alone) elsewhere. `--sink db` only.
    #[arg(long, value_name = "ROWS")]
    pub statement_rows: Option<u64>,
    /// The breaker's slow-call threshold in every mode
    /// (`breaker.slow_calls.slow_ms`; default the breaker's own, 5,000).
    /// A tighter one, as a deployment with a latency target sets, shows
    /// which modes push the database's latency past it and trip.
    #[arg(long, value_name = "MS")]
    pub slow_call_ms: Option<u64>,
    /// Breakwater mode's limiter starts here, in slow start
    /// (`breaker.limiter.initial_concurrency`; default 0: at the breaker's
    /// 16, no slow start).
    #[arg(long, value_name = "N")]
    pub initial_concurrency: Option<u32>,
    /// How many nice steps every mode's workers run below its ingress
    /// (`workers.nice`; default the config's, 10; 0: one runtime).
    #[arg(long, value_name = "N")]
    pub workers_nice: Option<u8>,
    /// Breakwater mode's pool (`sink.pool_max`, the limiter's ceiling);
    /// the naive consumer keeps its 20, fixed mode its 16 workers.
    #[arg(long, default_value_t = 64)]
    pub pool_max: usize,
    /// Most seconds to wait for the backlog after the load ends.
    #[arg(long, default_value_t = 90)]
    pub drain_timeout: u64,
    /// What the pipeline writes to: PostgreSQL, or a forward target (the
    /// lab's own HTTP service, 16 requests at once, 2 ms each).
    #[arg(long, value_enum, default_value_t = LabSink::Db)]
    pub sink: LabSink,
    /// Which queue backend holds the webhooks.
    #[arg(long, value_enum, default_value_t = LabBackend::Log)]
    pub backend: LabBackend,
    /// The broker's address (default: the broker's usual local one,
    /// nats://127.0.0.1:4222, amqp://guest:guest@127.0.0.1:5672/%2f, the
    /// SQS endpoint http://127.0.0.1:4566, or Kafka's 127.0.0.1:9092).
    #[arg(long)]
    pub queue_url: Option<String>,
    /// Which consumers to run.
    #[arg(long, value_enum, default_value_t = ModeChoice::Both)]
    #[serde(skip)]
    pub mode: ModeChoice,
    /// Write the figures and time series as JSON here.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub json: Option<std::path::PathBuf>,
    /// Draw the time series of every mode as a PNG page here.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub png: Option<std::path::PathBuf>,
    /// Directory for the lab's queues (removed afterwards).
    #[arg(long, default_value = "data/lab")]
    #[serde(skip)]
    pub data_dir: std::path::PathBuf,
    /// No progress lines on stderr.
    #[arg(long)]
    #[serde(skip)]
    pub quiet: bool,
}

const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Probe queries timed before the load starts (50 ms apart).
const IDLE_PROBES: usize = 20;

/// `--statement-rows` when not given in overload.
pub const OVERLOAD_STATEMENT_ROWS: u64 = 80_000;

impl LabArgs {
    /// The rows each webhook's statement aggregates (`--statement-rows`).
    pub fn statement_rows(&self) -> u64 {
        self.statement_rows.unwrap_or(match self.scenario {
            Scenario::Overload => OVERLOAD_STATEMENT_ROWS,
            _ => 0,
        })
    }
}

/// Runs the scenario in the chosen modes.
pub async fn run_lab(args: &LabArgs) -> anyhow::Result<LabReport> {
    args.check()?;
    let modes: &[Mode] = match args.mode {
        ModeChoice::Naive => &[Mode::Naive],
        ModeChoice::Breakwater => &[Mode::Breakwater],
        ModeChoice::Fixed => &[Mode::Fixed],
        ModeChoice::Both => &[Mode::Naive, Mode::Breakwater],
        ModeChoice::All => &[Mode::Naive, Mode::Fixed, Mode::Breakwater],
    };
    let mut report = LabReport::new(args);
    // The outermost folder of `data_dir` that this run creates: removed
    // afterwards if nothing else came to be in it.
    let made = args
        .data_dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(std::path::Path::to_owned);
    let mut outcome = Ok(());
    for mode in modes {
        match run_mode(args, *mode).await {
            Ok(r) => {
                report.modes.insert(mode.as_str().to_owned(), r);
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    // Each mode removes its own queue; the folders the lab made go too,
    // innermost first, each only if empty (fails harmlessly otherwise).
    if let Some(made) = made {
        for dir in args.data_dir.ancestors() {
            let _ = std::fs::remove_dir(dir);
            if dir == made {
                break;
            }
        }
    }
    outcome.map(|()| report)
}

impl LabArgs {
    /// Refuses a run that would test nothing: a fault that does not start
    /// and end inside the load.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.duration > 0, "--duration must be at least 1 second");
        anyhow::ensure!(
            self.fault_at + self.fault_secs <= self.duration && self.fault_secs > 0,
            "the fault (--fault-at {} --fault-secs {}) must start and end inside the load \
             (--duration {}): for a {} s run, try --fault-at {} --fault-secs {}",
            self.fault_at,
            self.fault_secs,
            self.duration,
            self.duration,
            self.duration / 6,
            (self.duration / 2).max(1),
        );
        anyhow::ensure!(
            self.rate.is_finite() && self.rate > 0.0,
            "--rate must be a positive number of webhooks per second"
        );
        match (self.scenario, self.sink) {
            (Scenario::Erroring, LabSink::Db) => anyhow::bail!(
                "erroring is a scenario of the HTTP service: add --sink http \
                 (a database that fails every call is db-down)"
            ),
            (Scenario::Overload, LabSink::Http) => anyhow::bail!(
                "overload loads the database; with --sink http try slow-db, erroring or hanging"
            ),
            _ => {}
        }
        Ok(())
    }
}

/// Where the database is, parsed from `--database-url`.
struct Target {
    upstream: SocketAddr,
    user: String,
    password: Option<String>,
    dbname: String,
}

async fn target(url: &str) -> anyhow::Result<Target> {
    let config: tokio_postgres::Config = url
        .parse()
        .with_context(|| format!("--database-url \"{url}\" is not a PostgreSQL URL"))?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => anyhow::bail!("--database-url needs a TCP host (the fault proxy sits on TCP)"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .with_context(|| format!("cannot resolve {host}"))?;
    Ok(Target {
        upstream,
        user: config.get_user().unwrap_or("postgres").to_owned(),
        password: config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
        dbname: config.get_dbname().unwrap_or("postgres").to_owned(),
    })
}

async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {url}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Share of the poison scenario's webhooks that are poison.
pub const POISON_SHARE: f64 = 0.1;

/// Applies of one message in the naive consumer's worker before it gives
/// up on it (then it is dead-lettered: `workers.max_attempts = 1`).
const NAIVE_ATTEMPTS: u32 = 3;

/// The config of one mode.
///
/// `sink_url` is the database (through the proxy); with `forward`, the
/// source forwards to that URL instead, and the database is a scratch
/// SQLite file nothing is written to.
fn mode_config(
    mode: Mode,
    sink_url: String,
    forward: Option<String>,
    queue_dir: std::path::PathBuf,
    args: &LabArgs,
) -> Config {
    let mut c = crate::bench::bench_config(&queue_dir);
    c.sink.url = sink_url;
    c.sink.pool_max = 20;
    if let Some(ms) = args.slow_call_ms {
        c.breaker.slow_calls.slow_ms = ms;
    }
    if let Some(nice) = args.workers_nice {
        c.workers.nice = nice;
    }
    match mode {
        Mode::Breakwater => {
            c.sink.pool_max = args.pool_max;
            if let Some(n) = args.initial_concurrency {
                c.breaker.limiter.initial_concurrency = n;
            }
        }
        Mode::Fixed => c.breaker.limiter.enabled = false,
        Mode::Naive => {}
    }
    if mode == Mode::Naive {
        c.sink.lock_timeout_ms = 60_000;
        c.sink.statement_timeout_ms = 60_001;
        c.sink.acquire_timeout_ms = 2000;
        c.workers.max_concurrency = 32;
        c.workers.per_key_concurrency = 0;
        // Three applies in the worker (see `naive_retries`), then the DLQ.
        c.workers.max_attempts = 1;
        c.workers.backoff_jitter = BackoffJitter::None;
        c.workers.backoff_base_ms = 200;
        c.workers.backoff_cap_ms = 200;
        c.breaker.dry_run = true;
    }
    match forward {
        Some(url) => {
            c.sources[0].forward = Some(ForwardConfig {
                // As many requests at once as the workers make.
                max_connections: c.concurrency_ceiling().max(32) as usize,
                ..ForwardConfig::new(url)
            });
        }
        None => c.sources[0].statements.push(StatementConfig {
            sql: update_sql(args.statement_rows()),
            params: [("status".to_owned(), "json:/data/object/status".to_owned())].into(),
        }),
    }
    c
}

/// The webhooks' statement: the indexed UPDATE, and with `rows` > 0 an
/// aggregate over that many generated rows that the UPDATE waits on (the
/// database's CPU per webhook; the row changes as before).
fn update_sql(rows: u64) -> String {
    let work = if rows > 0 {
        format!(" AND (SELECT sum(g % 7) FROM generate_series(1, {rows}) g) >= 0")
    } else {
        String::new()
    };
    format!("UPDATE orders SET status = $status, updated_at = now() WHERE id = $entity{work}")
}

/// A count of the embedded queue (which reports every one).
fn count(v: Option<u64>) -> u64 {
    v.unwrap_or(0)
}

/// Wall-clock milliseconds.
fn wall_ms() -> i64 {
    breakwater::ingress::unix_now_ms()
}

async fn run_mode(args: &LabArgs, mode: Mode) -> anyhow::Result<ModeReport> {
    let tag = format!("{}_{}", std::process::id(), mode.as_str());
    let dependency = match args.sink {
        LabSink::Db => Dependency::database(&args.database_url, &tag).await?,
        LabSink::Http => Dependency::service().await?,
    };
    let result = run_mode_in(args, mode, &dependency, &tag).await;
    dependency.remove().await;
    result
}

/// The proxy in front of `dependency`, and the mode's config reaching the
/// dependency through it.
async fn wire(
    args: &LabArgs,
    mode: Mode,
    dependency: &Dependency,
    queue_dir: &std::path::Path,
) -> anyhow::Result<(FaultProxy, Config)> {
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    Ok(match dependency {
        Dependency::Database(db) => {
            let target = target(&db.url).await?;
            let proxy = FaultProxy::start(local, target.upstream).await?;
            let auth = match &target.password {
                Some(p) => format!("{}:{p}", target.user),
                None => target.user.clone(),
            };
            let sink_url = format!(
                "postgres://{auth}@{}/{}?application_name={}&options=-c%20search_path%3D{}",
                proxy.local_addr(),
                target.dbname,
                db.app_name,
                db.schema
            );
            let config = mode_config(mode, sink_url, None, queue_dir.to_owned(), args);
            (proxy, config)
        }
        Dependency::Service { service, .. } => {
            let proxy = FaultProxy::start(local, service.addr()).await?;
            let unused_db = format!("sqlite://{}", queue_dir.join("unused-sink.db").display());
            let forward = format!("http://{}/hooks", proxy.local_addr());
            let config = mode_config(mode, unused_db, Some(forward), queue_dir.to_owned(), args);
            (proxy, config)
        }
    })
}

async fn run_mode_in(
    args: &LabArgs,
    mode: Mode,
    dependency: &Dependency,
    app: &str,
) -> anyhow::Result<ModeReport> {
    let queue_dir = args.data_dir.join(format!("{app}-{}", wall_ms()));
    let (proxy, mut config) = wire(args, mode, dependency, &queue_dir).await?;
    let queue_name = format!("bwlab_{app}_{}", wall_ms());
    if let Some(section) = args.backend.section(
        &args.backend.url(args.queue_url.as_deref()),
        &queue_name,
        &queue_dir,
    ) {
        config.queue = section;
    }
    // Every apply the workers send is counted; the naive mode also retries
    // in the worker.
    let applies = Arc::new(AtomicU64::new(0));
    let (in_place, backoff) = match mode {
        Mode::Naive => (NAIVE_ATTEMPTS, serve::worker_settings(&config).backoff),
        Mode::Breakwater | Mode::Fixed => (1, serve::worker_settings(&config).backoff),
    };
    let counted = Arc::clone(&applies);
    let hooks = serve::Hooks {
        sink_layer: Some(Box::new(move |sink| {
            Arc::new(RetryInPlace::new(sink, in_place, backoff, counted))
        })),
    };
    // `start` waits for a database that does not answer; the lab has
    // nothing to show without one.
    let running = tokio::time::timeout(
        LAB_START_LIMIT,
        serve::start_with(&config, Role::All, None, hooks),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "the database did not answer within {} s",
            LAB_START_LIMIT.as_secs()
        )
    })?
    .context("cannot start the pipeline")?;
    let ingress = running.ingress_addr.context("no ingress")?;
    let controller = running.controller.clone().context("no workers")?;
    // Consumers ready before the load, as in a running deployment (a Kafka
    // consumer takes seconds to join its group).
    if let Err(e) = running.queue.start_consuming(LAB_START_LIMIT).await {
        tracing::warn!(error = %e, "the workers' consumer is not ready; the load starts anyway");
    }

    let counters = Arc::new(DriveCounters::default());
    let spec = DriveSpec {
        url: format!("http://{ingress}/webhooks/stripe"),
        secret: crate::bench::BENCH_SECRET.to_owned(),
        rate: args.rate,
        duration: Duration::from_secs(args.duration),
        hot_share: if args.scenario == Scenario::HotRow {
            args.hot_share
        } else {
            0.0
        },
        poison_share: if args.scenario == Scenario::Poison {
            POISON_SHARE
        } else {
            0.0
        },
        tag: app.to_owned(),
    };
    // The dependency unloaded: the lab's probe before any webhook.
    let mut idle_probes = Vec::new();
    for _ in 0..IDLE_PROBES {
        idle_probes.extend(dependency.probe().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let driver = tokio::spawn(driver::drive(spec, Arc::clone(&counters)));
    let fault_start = Duration::from_secs(args.fault_at);
    let fault_end = fault_start + Duration::from_secs(args.fault_secs);
    let mut fault = FaultState::default();
    let mut samples: Vec<Sample> = Vec::new();
    let mut wall_fault = (0i64, 0i64);
    let mut applies_at_fault = (0u64, 0u64);
    let mut drive_done_at: Option<Instant> = None;
    let mut last_progress = Instant::now();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let t = started.elapsed();
        // The fault's timeline.
        if t >= fault_start && !fault.started && args.scenario != Scenario::Poison {
            wall_fault.0 = wall_ms();
            applies_at_fault.0 = applies.load(Ordering::Relaxed);
            fault.start(args, &proxy, dependency).await?;
        }
        if t >= fault_end && fault.started && !fault.ended {
            wall_fault.1 = wall_ms();
            applies_at_fault.1 = applies.load(Ordering::Relaxed);
            fault.end(&proxy, dependency).await?;
        }
        // The sample.
        let (applied_hot, applied_unrelated) = dependency.applied().await;
        let (lock_waiters, active) = dependency.activity().await;
        let probe_ms = dependency.probe().await;
        let stats = running.queue.stats().await.unwrap_or_default();
        let gate = controller.gate();
        let status_state = controller.status().state;
        let sample = Sample {
            t_ms: t.as_millis() as u64,
            accepted: counters.accepted.load(Ordering::Relaxed),
            applied_hot,
            applied_unrelated,
            lock_waiters,
            connections_active: active,
            state: status_state.as_str(),
            limit: gate.limit,
            dead_lettered: count(stats.dead_lettered),
            backlog: count(stats.visible) + count(stats.in_flight) + count(stats.delayed),
            applies: applies.load(Ordering::Relaxed),
            fault: fault.started && !fault.ended,
            probe_ms,
        };
        if !args.quiet && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            eprintln!(
                "[{:<10}] t={:>3}s{} accepted {:>6} applied {:>6} (hot {:>4}) backlog {:>5} waiters {:>2} conns {:>2} dlq {:>4} breaker {} x{} probe {:.1} ms",
                mode.as_str(),
                t.as_secs(),
                if sample.fault { " FAULT" } else { "      " },
                sample.accepted,
                sample.applied_hot + sample.applied_unrelated,
                sample.applied_hot,
                sample.backlog,
                sample.lock_waiters,
                sample.connections_active,
                sample.dead_lettered,
                sample.state,
                sample.limit,
                sample.probe_ms.unwrap_or(f64::NAN)
            );
        }
        let settled = sample.applied_hot + sample.applied_unrelated + sample.dead_lettered
            >= sample.accepted
            && sample.backlog == 0;
        samples.push(sample);
        if driver.is_finished() && drive_done_at.is_none() {
            drive_done_at = Some(Instant::now());
        }
        if let Some(done) = drive_done_at {
            let fault_over = fault.ended || args.scenario == Scenario::Poison;
            if fault_over && settled {
                break;
            }
            if done.elapsed() > Duration::from_secs(args.drain_timeout) {
                if !args.quiet {
                    eprintln!("[{}] drain timeout: stopping with a backlog", mode.as_str());
                }
                break;
            }
        }
    }
    driver.await.context("the driver panicked")?;
    if fault.started && !fault.ended {
        fault.end(&proxy, dependency).await?;
    }
    let history_at = started.elapsed();
    let status = controller.status();
    let history = status.history;
    let limiter = status.limiter;
    let stats = running.queue.stats().await.unwrap_or_default();
    running.shutdown().await;
    proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&queue_dir);
    args.backend
        .remove(&args.backend.url(args.queue_url.as_deref()), &queue_name)
        .await;

    // Totals, read from the dependency itself.
    let applied = dependency.applied_total().await?;
    let lag = if wall_fault.1 > 0 {
        dependency.unrelated_lag(wall_fault.0, wall_fault.1).await
    } else {
        (None, None, 0)
    };
    let accepted = counters.accepted.load(Ordering::Relaxed);
    let dead = count(stats.dead_lettered);
    let fault_end_offset = fault_end.as_millis() as u64;
    let report = report::summarize(report::Inputs {
        mode,
        accepted,
        accepted_poison: counters.accepted_poison.load(Ordering::Relaxed),
        refused: counters.refused.load(Ordering::Relaxed),
        applied,
        dead_lettered: dead,
        pending: count(stats.visible) + count(stats.in_flight) + count(stats.delayed),
        lag_p50_ms: lag.0,
        lag_p99_ms: lag.1,
        lag_count: lag.2,
        statements_during_fault: applies_at_fault.1.saturating_sub(applies_at_fault.0),
        fault_start_ms: fault_start.as_millis() as u64,
        fault_end_ms: fault_end_offset,
        history,
        history_at,
        limiter,
        idle_probes,
        elapsed: started.elapsed(),
        samples,
        scenario: args.scenario,
    });
    Ok(report)
}

/// What the scenario's fault holds while it lasts.
#[derive(Default)]
struct FaultState {
    started: bool,
    ended: bool,
    locker: Option<tokio_postgres::Client>,
    /// The overload's query loops, stopped at the fault's end.
    heavy: Option<(
        tokio::sync::watch::Sender<bool>,
        Vec<tokio::task::JoinHandle<()>>,
    )>,
}

/// The overload's heavy query: a second or so of one core's work.
const HEAVY_QUERY: &str = "SELECT sum(g * g % 7) FROM generate_series(1, 3000000) g";

/// One overload session: the heavy query in a loop until `stop`; the
/// query in flight is cancelled then.
async fn heavy_loop(url: String, mut stop: tokio::sync::watch::Receiver<bool>) {
    let Ok(client) = connect(&url).await else {
        return;
    };
    let cancel = client.cancel_token();
    loop {
        let stopped = tokio::select! {
            _ = client.simple_query(HEAVY_QUERY) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopped {
            let _ = cancel.cancel_query(NoTls).await;
            return;
        }
    }
}

impl FaultState {
    async fn start(
        &mut self,
        args: &LabArgs,
        proxy: &FaultProxy,
        dependency: &Dependency,
    ) -> anyhow::Result<()> {
        self.started = true;
        match (args.scenario, dependency) {
            (Scenario::HotRow, Dependency::Database(db)) => {
                let locker = connect(&db.url).await?;
                locker
                    .batch_execute(&format!(
                        "BEGIN; SELECT 1 FROM {}.orders WHERE id = {HOT_ORDER} FOR UPDATE;",
                        db.schema
                    ))
                    .await
                    .context("cannot lock the hot row")?;
                self.locker = Some(locker);
            }
            (Scenario::HotRow, Dependency::Service { service, .. }) => {
                service.set(Behaviour::KeyLocked);
            }
            (Scenario::SlowDb, _) => proxy.set(Fault::Latency {
                per_chunk: Duration::from_millis(args.latency_ms),
            }),
            (Scenario::DbDown, _) => {
                proxy.set(Fault::ResetAll);
                proxy.set(Fault::Refuse);
            }
            (Scenario::Hanging, Dependency::Database(_)) => proxy.set(Fault::Blackhole),
            (Scenario::Hanging, Dependency::Service { service, .. }) => {
                service.set(Behaviour::Hanging);
            }
            (Scenario::Erroring, Dependency::Service { service, .. }) => {
                service.set(Behaviour::Erroring);
            }
            (Scenario::Overload, Dependency::Database(db)) => {
                let (stop, rx) = tokio::sync::watch::channel(false);
                let loops = (0..args.overload_sessions)
                    .map(|_| tokio::spawn(heavy_loop(db.url.clone(), rx.clone())))
                    .collect();
                self.heavy = Some((stop, loops));
            }
            // Refused by `LabArgs::check`.
            (Scenario::Erroring, Dependency::Database(_))
            | (Scenario::Overload, Dependency::Service { .. })
            | (Scenario::Poison, _) => {}
        }
        Ok(())
    }

    async fn end(&mut self, proxy: &FaultProxy, dependency: &Dependency) -> anyhow::Result<()> {
        self.ended = true;
        if let Some(locker) = self.locker.take() {
            locker.batch_execute("ROLLBACK").await?;
        }
        if let Some((stop, loops)) = self.heavy.take() {
            let _ = stop.send(true);
            for l in loops {
                let _ = l.await;
            }
        }
        if let Dependency::Service { service, .. } = dependency {
            service.set(Behaviour::Healthy);
        }
        proxy.set(Fault::None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::LabArgs;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }

    fn args(line: &[&str]) -> LabArgs {
        let mut argv = vec!["lab"];
        argv.extend_from_slice(line);
        Cli::try_parse_from(argv).expect("arguments").lab
    }

    #[test]
    fn overload_statements_cost_the_database_cpu_unless_told_otherwise() {
        assert_eq!(
            args(&["overload"]).statement_rows(),
            super::OVERLOAD_STATEMENT_ROWS
        );
        assert_eq!(args(&["hot-row"]).statement_rows(), 0);
        assert_eq!(
            args(&["overload", "--statement-rows", "0"]).statement_rows(),
            0
        );
        assert_eq!(
            args(&["slow-db", "--statement-rows", "500"]).statement_rows(),
            500
        );
        assert!(!super::update_sql(0).contains("generate_series"));
        let heavy = super::update_sql(80_000);
        assert!(
            heavy.starts_with("UPDATE orders SET status = $status")
                && heavy.contains("WHERE id = $entity AND")
                && heavy.contains("generate_series(1, 80000)"),
            "{heavy}"
        );
    }

    #[test]
    fn a_slow_call_threshold_applies_to_every_mode_and_an_initial_limit_to_breakwaters() {
        let tight = args(&[
            "overload",
            "--slow-call-ms",
            "120",
            "--initial-concurrency",
            "2",
        ]);
        let default = args(&["overload"]);
        for mode in [
            super::Mode::Naive,
            super::Mode::Fixed,
            super::Mode::Breakwater,
        ] {
            let config = |a| super::mode_config(mode, String::new(), None, "q".into(), a);
            assert_eq!(config(&tight).breaker.slow_calls.slow_ms, 120, "{mode:?}");
            assert_eq!(
                config(&default).breaker.slow_calls.slow_ms,
                breakwater_control::config::SlowCallConfig::default().slow_ms,
                "{mode:?}"
            );
            let initial = config(&tight).breaker.limiter.initial_concurrency;
            assert_eq!(
                initial,
                if mode == super::Mode::Breakwater {
                    2
                } else {
                    breakwater_control::config::LimiterConfig::default().initial_concurrency
                },
                "{mode:?}"
            );
        }
    }

    #[test]
    fn a_fault_outside_the_load_is_refused_with_values_that_fit() {
        let err = args(&["hot-row", "--duration", "10"])
            .check()
            .expect_err("the default fault starts at 10 s")
            .to_string();
        assert!(err.contains("must start and end inside the load"), "{err}");
        assert!(err.contains("--fault-at 1 --fault-secs 5"), "{err}");
        assert!(
            args(&[
                "hot-row",
                "--duration",
                "10",
                "--fault-at",
                "2",
                "--fault-secs",
                "5"
            ])
            .check()
            .is_ok()
        );
        assert!(args(&["db-down"]).check().is_ok(), "the defaults fit");
    }
}
