//! The `breakwater` command line: the binary's edge, where errors become
//! messages and exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use breakwater::config::Config;
use breakwater::queue::{DlqFilter, DlqPage, OpenMode, QueueStats, dlq_search, replay_at_rate};
use breakwater::serve::{self, Role};
use breakwater_admin_api::{BreakerLocation, BreakerView, TransitionAnswer};
use clap::{Parser, Subcommand};

use admin_target::{AdminArg, AdminTarget, path_segment, urlencode};
use logging::LogFormat;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `print!` that returns an error instead of panicking when stdout is
/// closed (`breakwater breaker status | head -2`): `main` ends quietly on
/// it.
macro_rules! outp {
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!($($arg)*))?
    };
}

/// `println!`, the same way as [`outp!`].
macro_rules! outln {
    ($($arg:tt)*) => {
        outp!("{}\n", format_args!($($arg)*))
    };
}

mod admin_target;
mod events;
mod logging;

fn write_stdout(args: std::fmt::Arguments<'_>) -> Result<(), StdoutError> {
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_fmt(args)
        .map_err(StdoutError)
}

/// A write to stdout that failed: told apart from every other I/O error,
/// so only a closed stdout ends a command quietly.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
struct StdoutError(std::io::Error);

/// Whether `e` is stdout closed under us (`| head`): the reader went away,
/// which is no failure of the command.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<StdoutError>()
            .is_some_and(|out| out.0.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Webhook ingress gateway with a dynamic ingestion circuit breaker.
#[derive(Debug, Parser)]
#[command(name = "breakwater", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr: `text` (default) or `json` (one object per
    /// line, for a log pipeline).
    #[arg(long, global = true, env = "BREAKWATER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `--config`, on the commands that read the config (not `lab` and
/// `bench`, which build their own).
#[derive(Debug, clap::Args)]
struct ConfigPath {
    /// Config file. Default: ./breakwater.toml if it exists, else built-in
    /// defaults. Top-level keys of [ingress], [admin], [queue], [sink],
    /// [workers], [breaker] and [fleet] can be overridden by
    /// BREAKWATER_<SECTION>_<KEY>; [[source]] and nested tables only in the
    /// file.
    #[arg(long, global = true, env = "BREAKWATER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service: ingress, workers and admin listener.
    Serve {
        /// Which parts to run in this process: the ingress only, the
        /// workers only, or both.
        #[arg(long, value_enum, default_value_t = Role::All)]
        role: Role,
        #[command(flatten)]
        config: ConfigPath,
    },
    /// Validate the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
        #[command(flatten)]
        config: ConfigPath,
    },
    /// Audit a deployment against the checklist: signatures, the worker
    /// role's timeouts (read from the live database), the pool, retries,
    /// the breaker's signals, probes and ramp, the inbox's key. Exits
    /// non-zero when an item fails.
    Doctor {
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
        /// The longest outage of the database the deployment must ride out
        /// without losing a webhook (e.g. 6h, 2d as 48h): the queue's
        /// retention is checked against it.
        #[arg(long, value_parser = parse_duration, default_value = "6h")]
        plausible_outage: std::time::Duration,
        #[command(flatten)]
        config: ConfigPath,
    },
    /// Inspect the queue (through the admin API of a running `serve`, else
    /// opened here).
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
        #[command(flatten)]
        config: ConfigPath,
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Inspect and steer the breaker of a running `serve` (admin API).
    Breaker {
        #[command(subcommand)]
        command: BreakerCommand,
        #[command(flatten)]
        config: ConfigPath,
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Follow one webhook: applied (when), dead-lettered (why), or
    /// pending, and each attempt with its time, class and error (admin
    /// API).
    Events {
        #[command(subcommand)]
        command: events::EventsCommand,
        #[command(flatten)]
        config: ConfigPath,
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Inspect the fleet (`[fleet]`): read straight from Redis, so it
    /// answers with every node down.
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
        #[command(flatten)]
        config: ConfigPath,
    },
    /// Inspect, replay or purge dead-lettered messages (through the admin
    /// API of a running `serve`, else on the queue opened here).
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
        #[command(flatten)]
        config: ConfigPath,
        #[command(flatten)]
        admin: AdminArg,
    },
    /// Reproduce a database fault against a real PostgreSQL, naive consumer vs Breakwater.
    Lab(breakwater_lab::outage::LabArgs),
    /// Measure the service.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate the config and print the effective values, secrets redacted.
    ///
    /// Runs every check `serve` runs short of connecting: the file, the
    /// environment overrides, the sources' secrets and extractors, the queue
    /// backend's keys, the sink's URL and each statement's parameters.
    Check {
        /// Print JSON instead of TOML.
        #[arg(long)]
        json: bool,
        /// Also connect: the sink prepares every statement against the
        /// database, and the queue is opened.
        #[arg(long)]
        connect: bool,
    },
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Counts: visible, in flight, delayed, dead-lettered, oldest visible age.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Move an embedded SQLite store into the segment log this config
    /// names (`[queue] backend = "log"`): queued messages with their
    /// attempts, dead letters with their reasons, applied event ids still
    /// within the dedup window. Run it with the service stopped; the old
    /// store is only read, and a run cut short is run again (what the log
    /// already holds is skipped).
    Migrate {
        /// The embedded store's file (default: `queue.db` in `[queue]
        /// path`).
        #[arg(long, value_name = "PATH")]
        from: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum FleetCommand {
    /// The nodes, their roles, last heartbeat, slots in lock wait, the
    /// breaker's shared state, and which node holds the controller lease.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum BreakerCommand {
    /// State, reason, limit, signals with values and thresholds, transitions.
    Status {
        /// Print the admin API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Force the breaker open: workers stop claiming; webhooks wait in the queue.
    Trip {
        /// Resume automatic control after this long (e.g. 30s, 10m, 1h).
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<std::time::Duration>,
        /// Why, for the logs and `breaker status`.
        #[arg(long, default_value = "manual trip from the CLI")]
        note: String,
    },
    /// End a manual override; with --force-closed, force the breaker closed.
    Reset {
        /// Force the breaker closed (full limit) instead of handing it back
        /// to automatic control. Default: off.
        #[arg(long)]
        force_closed: bool,
        /// With --force-closed: resume automatic control after this long
        /// (e.g. 30s, 10m, 1h). Default: until the next reset.
        #[arg(long, value_parser = parse_duration, requires = "force_closed")]
        ttl: Option<std::time::Duration>,
    },
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Dead-lettered messages, oldest first.
    List(DlqListArgs),
    /// One dead-lettered message with its body.
    Show {
        /// The message's id, as `dlq list` shows it.
        id: String,
    },
    /// Put messages back in the queue (IDs, or --all), at most --rate per second.
    Replay {
        /// Ids of the messages to put back, as `dlq list` shows them.
        ids: Vec<String>,
        /// Every dead-lettered message instead of named ones.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// Messages per second.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// Replays per message before `replay` refuses it (no loops).
        #[arg(long, default_value_t = 3)]
        max_replays: u32,
    },
    /// Delete dead-lettered messages (IDs, or --all).
    Purge {
        /// Ids of the messages to delete, as `dlq list` shows them.
        ids: Vec<String>,
        /// Every dead-lettered message instead of named ones.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

/// `dlq list`.
#[derive(Debug, clap::Args)]
struct DlqListArgs {
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Start after this id (the last of the previous page).
    #[arg(long)]
    after: Option<String>,
    /// Only this source's.
    #[arg(long)]
    source: Option<String>,
    /// Only this class's: `permanent` or `exhausted`.
    #[arg(long)]
    class: Option<String>,
    /// Only this event id's.
    #[arg(long)]
    event_id: Option<String>,
    /// Only this entity key's.
    #[arg(long)]
    entity_key: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl DlqListArgs {
    fn filter(&self) -> DlqFilter {
        DlqFilter {
            source: self.source.clone(),
            class: self.class.clone(),
            event_id: self.event_id.clone(),
            entity_key: self.entity_key.clone(),
        }
    }

    /// `GET /dlq` with these arguments.
    fn path(&self) -> String {
        let mut path = format!("/dlq?limit={}", self.limit);
        for (key, value) in [
            ("after", &self.after),
            ("source", &self.source),
            ("class", &self.class),
            ("event_id", &self.event_id),
            ("entity_key", &self.entity_key),
        ] {
            if let Some(v) = value {
                path.push_str(&format!("&{key}={}", urlencode(v)));
            }
        }
        path
    }
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Bare hyper vs Breakwater's verified, durable ingress under the same load.
    Ingress(breakwater_lab::bench::IngressBenchArgs),
    /// Workers draining a backlog into PostgreSQL vs pgbench, same statements.
    Drain(breakwater_lab::bench::drain::DrainBenchArgs),
    /// Workers forwarding a backlog to an HTTP service vs a load generator
    /// driving the same service.
    Forward(breakwater_lab::bench::forward::ForwardBenchArgs),
    /// A steady stream of signed Stripe-style webhooks against a running
    /// service (open loop), its counts every minute: a soak's load.
    Send(breakwater_lab::bench::send::SendArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    let default = Path::new("breakwater.toml");
    let path = path.or_else(|| default.exists().then_some(default));
    Ok(Config::load(path)?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Info for the service; for the other commands warnings only (a
    // config variable that names no section, a slow group commit in
    // `bench ingress`), their output being their report.
    logging::init(
        if matches!(cli.command, Command::Serve { .. }) {
            "info"
        } else {
            "warn"
        },
        cli.log_format,
    );
    match cli.command {
        Command::Serve { role, config } => {
            let config = load_config(config.config.as_deref())?;
            let metrics = breakwater::telemetry::prometheus()
                .install_recorder()
                .context("cannot install the metrics recorder")?;
            runtime()?.block_on(async {
                // Raced against a signal: with `--role all`, `start` waits
                // for a database that does not answer (the ingress serving
                // meanwhile), and a stop asked for then is a stop.
                let running = tokio::select! {
                    running = serve::start(&config, role, Some(metrics)) => running?,
                    () = shutdown_signal() => {
                        tracing::info!("stopped before the workers started");
                        return Ok(());
                    }
                };
                let failed = tokio::select! {
                    () = shutdown_signal() => None,
                    why = running.failed() => Some(why),
                };
                tracing::info!("shutting down");
                running.shutdown().await;
                match failed {
                    Some(why) => Err(anyhow::anyhow!(why)),
                    None => anyhow::Ok(()),
                }
            })
        }
        Command::Config {
            command: ConfigCommand::Check { json, connect },
            config,
        } => {
            let config = load_config(config.config.as_deref())?;
            serve::check(&config)?;
            if connect {
                runtime()?.block_on(serve::check_connected(&config))?;
            }
            let shown = config.shown()?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                outp!("{}", toml::to_string_pretty(&shown)?);
                eprintln!("config ok");
            }
            Ok(())
        }
        Command::Doctor {
            json,
            plausible_outage,
            config,
        } => {
            let config = load_config(config.config.as_deref())?;
            serve::check(&config)?;
            let live = runtime()?.block_on(breakwater::doctor::gather(&config));
            let findings = breakwater::doctor::audit(
                &config,
                &live,
                &breakwater::doctor::Assumptions { plausible_outage },
            );
            if json {
                outln!("{}", serde_json::to_string_pretty(&findings)?);
            } else {
                for f in &findings {
                    outln!("{:<5} {:<42} {}", f.verdict.as_str(), f.check, f.detail);
                    if let Some(fix) = &f.fix {
                        outln!("{:<5} {:<42} fix: {fix}", "", "");
                    }
                }
            }
            anyhow::ensure!(
                !breakwater::doctor::failed(&findings),
                "doctor: {} of {} items failed",
                findings
                    .iter()
                    .filter(|f| f.verdict == breakwater::doctor::Verdict::Fail)
                    .count(),
                findings.len()
            );
            Ok(())
        }
        Command::Queue {
            command: QueueCommand::Migrate { from },
            config,
            ..
        } => {
            let config = load_config(config.config.as_deref())?;
            runtime()?.block_on(queue_migrate(&config, from))
        }
        Command::Queue {
            command: QueueCommand::Stats { json },
            config,
            admin,
        } => {
            let config = load_config(config.config.as_deref())?;
            let stats = runtime()?.block_on(queue_stats(&config, &admin))?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                print_queue_stats(&config.queue.backend, &stats)?;
            }
            Ok(())
        }
        Command::Breaker {
            command,
            config,
            admin,
        } => {
            let config = load_config(config.config.as_deref())?;
            runtime()?.block_on(async {
                let target = AdminTarget::resolve(&config, &admin).await?;
                breaker_command(&target, command).await
            })
        }
        Command::Events {
            command,
            config,
            admin,
        } => {
            let config = load_config(config.config.as_deref())?;
            runtime()?.block_on(async {
                let target = AdminTarget::resolve(&config, &admin).await?;
                events::run(&target, command).await
            })
        }
        Command::Fleet {
            command: FleetCommand::Status { json },
            config,
        } => {
            let config = load_config(config.config.as_deref())?;
            runtime()?.block_on(fleet_status(&config, json))
        }
        Command::Dlq {
            command,
            config,
            admin,
        } => {
            let config = load_config(config.config.as_deref())?;
            runtime()?.block_on(async {
                let target = AdminTarget::resolve(&config, &admin).await?;
                dlq_command(&config, &target, command).await
            })
        }
        Command::Bench {
            command: BenchCommand::Ingress(args),
        } => {
            // The service's own metrics say where phase 2's time went.
            let metrics = breakwater::telemetry::prometheus()
                .install_recorder()
                .context("cannot install the metrics recorder")?;
            let report = breakwater_lab::bench::run_ingress_bench(&args, Some(metrics))?;
            outp!("{report}");
            Ok(())
        }
        Command::Lab(args) => {
            let report = runtime()?.block_on(breakwater_lab::outage::run_lab(&args))?;
            outp!("{report}");
            if let Some(path) = &args.json {
                std::fs::write(path, serde_json::to_vec_pretty(&report)?)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            if let Some(path) = &args.png {
                breakwater_lab::outage::chart::write_png(&report, path)?;
                eprintln!("wrote {}", path.display());
            }
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Drain(args),
        } => {
            let report =
                runtime()?.block_on(breakwater_lab::bench::drain::run_drain_bench(&args))?;
            outp!("{report}");
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Send(args),
        } => {
            let (sent, accepted, refused) =
                runtime()?.block_on(breakwater_lab::bench::send::run_send(&args))?;
            outln!("sent {sent}, accepted {accepted}, refused {refused}");
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Forward(args),
        } => {
            let report =
                runtime()?.block_on(breakwater_lab::bench::forward::run_forward_bench(&args))?;
            outp!("{report}");
            Ok(())
        }
    }
}

/// Parses `500ms`, `30s`, `10m`, `2h` (a bare number is seconds).
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("\"{text}\" is not a duration like 30s, 10m or 1h"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit \"{unit}\" in \"{text}\": use ms, s, m or h"
            ));
        }
    };
    std::time::Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("\"{text}\" is not a duration Breakwater can wait"))
}

async fn breaker_command(admin: &AdminTarget, command: BreakerCommand) -> anyhow::Result<()> {
    match command {
        BreakerCommand::Status { json } => {
            let view: BreakerView = admin.call(http::Method::GET, "/breaker").await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print_breaker(&view)?;
            }
        }
        BreakerCommand::Trip { ttl, note } => {
            let mut q = format!("/breaker/trip?note={}", urlencode(&note));
            if let Some(ttl) = ttl {
                q.push_str(&format!("&ttl_secs={}", ttl.as_secs().max(1)));
            }
            let answer: TransitionAnswer = admin.call(http::Method::POST, &q).await?;
            outln!("{}", answer.transition.as_deref().unwrap_or("tripped"));
        }
        BreakerCommand::Reset { force_closed, ttl } => {
            let mut q = format!("/breaker/reset?force_closed={force_closed}");
            if let Some(ttl) = ttl {
                q.push_str(&format!("&ttl_secs={}", ttl.as_secs().max(1)));
            }
            let answer: TransitionAnswer = admin.call(http::Method::POST, &q).await?;
            match answer.transition {
                Some(t) => outln!("{t}"),
                None => outln!("no manual override in force; state {}", answer.state),
            }
        }
    }
    Ok(())
}

async fn fleet_status(config: &Config, json: bool) -> anyhow::Result<()> {
    let fleet = config
        .fleet
        .as_ref()
        .context("no [fleet] in the config: this deployment runs no fleet (each process keeps its own breaker; see `breakwater breaker status`)")?;
    let store = breakwater_fleet::RedisFleet::open(&fleet.redis_url, &fleet.prefix, "cli")?;
    let view = store.view().await.with_context(|| {
        format!(
            "cannot read the fleet from {}",
            breakwater::config::redact_url(&fleet.redis_url)
        )
    })?;
    let info = breakwater::breaker::fleet::fleet_info(&view, &fleet.prefix);
    if json {
        outln!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    outln!("prefix       {}", info.prefix);
    outln!(
        "breaker      {}",
        match (info.state, info.generation) {
            (Some(s), Some(g)) => format!("{s} (record generation {g})"),
            _ => "no record yet (no worker has started)".to_owned(),
        }
    );
    outln!(
        "lease        {}",
        info.lease_holder
            .as_deref()
            .unwrap_or("(free: no worker holds it)")
    );
    if info.nodes.is_empty() {
        outln!("nodes        none has beaten");
        return Ok(());
    }
    outln!(
        "{:<28} {:<8} {:<10} {:>10} {:>6} {:>10}  notes",
        "NODE",
        "ROLE",
        "STATE",
        "LAST BEAT",
        "SLOTS",
        "LOCK WAIT"
    );
    for n in &info.nodes {
        let mut notes = Vec::new();
        if n.leader {
            notes.push("holds the lease".to_owned());
        }
        if n.fallback {
            notes.push("local fallback".to_owned());
        }
        if !n.lock_targets.is_empty() {
            notes.push(format!("waiting on {}", n.lock_targets.join(", ")));
        }
        outln!(
            "{:<28} {:<8} {:<10} {:>8.1} s {:>6} {:>10}  {}",
            n.node,
            n.role,
            n.state.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            n.last_beat_ms_ago as f64 / 1000.0,
            n.slots,
            n.lock_waits,
            notes.join("; ")
        );
    }
    Ok(())
}

/// `queue stats`: through the admin API of the service running on this
/// config (or `--admin`), else from the queue opened here.
async fn queue_stats(config: &Config, admin: &AdminArg) -> anyhow::Result<QueueStats> {
    let admin = AdminTarget::resolve(config, admin).await?;
    match admin
        .call(http::Method::GET, "/queue/stats")
        .await
        .map_err(anyhow::Error::from)
    {
        Err(e) if admin.may_fall_back(&e) => {}
        done => return done,
    }
    let queue = serve::open_queue(config, OpenMode::Inspect).await?;
    Ok(queue.stats().await?)
}

/// `queue migrate`: the embedded store at `from` into the log `config`
/// names.
async fn queue_migrate(config: &Config, from: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    use breakwater_queue_log::{BACKEND_NAME, LogConfig, LogQueue};
    anyhow::ensure!(
        config.queue.backend == BACKEND_NAME,
        "queue migrate moves an embedded store into the segment log: set [queue] backend = \"{BACKEND_NAME}\" (this config says {:?})",
        config.queue.backend
    );
    let log = LogConfig::from_section(&config.queue)
        .map_err(|e| anyhow::anyhow!("[queue] {}: {e}", e.key.as_deref().unwrap_or("table")))?;
    let from = from.unwrap_or_else(|| log.path.join(breakwater_queue_embedded::FILE_NAME));
    anyhow::ensure!(from.is_file(), "no embedded store at {}", from.display());
    let queue = LogQueue::open(&log)?;
    let moved = queue
        .migrate_from_embedded(&from, |so_far| {
            eprintln!(
                "moved {} queued, {} dead letters, {} applied ids so far",
                so_far.queued, so_far.dead, so_far.applied_ids
            );
        })
        .await?;
    outln!(
        "moved {} queued messages, {} dead letters and {} applied event ids from {} into {} \
         ({} already there, skipped); the old store is left as it was",
        moved.queued,
        moved.dead,
        moved.applied_ids,
        from.display(),
        log.path.display(),
        moved.skipped
    );
    Ok(())
}

fn print_queue_stats(backend: &str, stats: &QueueStats) -> anyhow::Result<()> {
    let count = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |n| n.to_string());
    outln!("backend        {backend}");
    outln!("visible        {}", count(stats.visible));
    outln!("in flight      {}", count(stats.in_flight));
    outln!("delayed        {}", count(stats.delayed));
    outln!("dead-lettered  {}", count(stats.dead_lettered));
    match stats.oldest_visible_age_ms {
        Some(ms) => outln!("oldest visible {:.1} s", ms as f64 / 1000.0),
        None => outln!("oldest visible n/a"),
    }
    outln!("acked (total)  {}", count(stats.acked_total));
    Ok(())
}

fn print_breaker(view: &BreakerView) -> anyhow::Result<()> {
    let b = match (&view.breaker, &view.location) {
        (Some(b), _) => b,
        (None, BreakerLocation::WithTheWorkers { detail }) => {
            outln!("state        (no breaker here)");
            outln!("where        {detail}");
            return Ok(());
        }
        (None, BreakerLocation::Local | BreakerLocation::Fleet) => {
            outln!("state        (unknown)");
            return Ok(());
        }
    };
    outln!("state        {}", b.state);
    outln!("limit        {}", b.limit);
    if let Some(f) = &view.fleet {
        outln!(
            "fleet        node {} ({}{}), lease held by {}, {} node(s) beating",
            f.node.as_deref().unwrap_or("?"),
            f.standing.as_deref().unwrap_or("?"),
            if f.fallback {
                ": the fleet store cannot be reached, deciding alone"
            } else {
                ""
            },
            f.lease_holder.as_deref().unwrap_or("nobody"),
            f.nodes.len()
        );
    }
    if let Some(m) = &b.message {
        outln!("reason       {m}");
    }
    if let Some(w) = &b.waiting_for {
        outln!("waiting for  {w}");
    }
    if let Some(o) = &b.manual_override {
        outln!(
            "override     {}",
            serde_json::to_string(o).unwrap_or_default()
        );
    }
    if b.dry_run {
        outln!("dry run      yes (evaluates, never gates)");
    }
    outln!("signals");
    let shown = |v: Option<f64>| v.map_or_else(|| "null".to_owned(), |v| v.to_string());
    for s in &b.signals {
        outln!(
            "  {:<18} {:<8} value {:<10} threshold {:<10} {}",
            s.signal.as_str(),
            if s.tripping {
                "TRIPPING"
            } else if s.enabled {
                "ok"
            } else {
                "off"
            },
            shown(s.value),
            s.threshold,
            s.detail,
        );
    }
    if !view.parked_keys.is_empty() {
        let keys: Vec<String> = view
            .parked_keys
            .iter()
            .map(|p| format!("{} ({} ms, {} strikes)", p.key, p.remaining_ms, p.strikes))
            .collect();
        outln!("parked keys  {}", keys.join(", "));
    }
    for warning in &view.queue_warnings {
        outln!("queue        {warning}");
    }
    outln!("transitions");
    for t in &b.history {
        outln!(
            "  {} -> {} {} ago: {}",
            t.from,
            t.to,
            format_ago(t.ago_ms),
            t.message
        );
    }
    Ok(())
}

fn format_ago(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// `dlq ...`: through the admin API of the service that runs on this
/// config (any backend; the replay then runs in the service, waiting while
/// its breaker is open), or, when none answers, on the queue opened here.
async fn dlq_command(
    config: &Config,
    admin: &AdminTarget,
    command: DlqCommand,
) -> anyhow::Result<()> {
    match dlq_through_api(admin, &command).await {
        Err(e) if admin.may_fall_back(&e) => {
            eprintln!(
                "no service answers at {}: opening the queue directly",
                admin.addr
            );
        }
        done => return done,
    }
    let queue = serve::open_queue(config, OpenMode::Inspect).await?;
    match command {
        DlqCommand::List(args) => {
            let page = DlqPage {
                limit: args.limit,
                after: args.after.clone(),
            };
            let found = dlq_search(queue.as_ref(), &args.filter(), &page, usize::MAX).await?;
            print_dead_letters(&found.items, args.json)?;
        }
        DlqCommand::Show { id } => {
            let d = queue.dlq_show(&id).await?;
            outln!("{}", serde_json::to_string_pretty(&d)?);
        }
        DlqCommand::Replay {
            ids,
            all,
            rate,
            max_replays,
        } => {
            anyhow::ensure!(all || !ids.is_empty(), "name message ids, or pass --all");
            // At least one message an hour, at most a million a second: the
            // pause between chunks stays a valid duration.
            anyhow::ensure!(
                rate.is_finite() && (1.0 / 3600.0..=1e6).contains(&rate),
                "--rate must be between 0.0003 (one an hour) and 1000000 messages per second"
            );
            let done = replay_at_rate(
                queue.as_ref(),
                if all { &[] } else { &ids },
                rate,
                max_replays,
                || wait_while_breaker_open(admin),
                |p| eprint!("\rreplayed {}", p.replayed),
            )
            .await?;
            eprintln!();
            print_replay_done(done.replayed, done.skipped, max_replays)?;
        }
        DlqCommand::Purge { ids, all } => {
            anyhow::ensure!(all || !ids.is_empty(), "name message ids, or pass --all");
            let n = queue.dlq_purge(if all { &[] } else { &ids }).await?;
            outln!("purged {n} message(s)");
        }
    }
    Ok(())
}

fn print_replay_done(replayed: usize, skipped: usize, max_replays: u32) -> anyhow::Result<()> {
    if skipped > 0 {
        eprintln!("skipped {skipped} (not in the DLQ, or replayed {max_replays} times already)");
    }
    outln!("replayed {replayed} message(s)");
    Ok(())
}

fn print_dead_letters(list: &[breakwater::queue::DeadLetter], json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&list)?);
    } else if list.is_empty() {
        outln!("the dead-letter queue is empty");
    } else {
        outln!(
            "{:<8} {:<12} {:<28} {:<10} {:>8}  error",
            "id",
            "source",
            "event id",
            "class",
            "attempts"
        );
        for d in list {
            outln!(
                "{:<8} {:<12} {:<28} {:<10} {:>8}  {}",
                d.id,
                d.source,
                d.event_id,
                d.class,
                d.attempts,
                d.error
            );
        }
    }
    Ok(())
}

/// `dlq ...` through the admin API; an `AdminClientError::Unreachable`
/// when no service answers.
async fn dlq_through_api(admin: &AdminTarget, command: &DlqCommand) -> anyhow::Result<()> {
    use breakwater_admin_api::{DlqList, PurgeAnswer, PurgeRequest, ReplayRequest, ReplayStatus};
    use http::Method;
    match command {
        DlqCommand::List(args) => {
            let list: DlqList = admin.call(Method::GET, &args.path()).await?;
            print_dead_letters(&list.items, args.json)?;
            if let Some(next) = &list.next_after {
                eprintln!("more: --after {next}");
            }
        }
        DlqCommand::Show { id } => {
            let d: breakwater::queue::DeadLetter = admin
                .call(Method::GET, &format!("/dlq/{}", path_segment(id)))
                .await?;
            outln!("{}", serde_json::to_string_pretty(&d)?);
        }
        DlqCommand::Replay {
            ids,
            all,
            rate,
            max_replays,
        } => {
            let request = ReplayRequest {
                ids: ids.clone(),
                all: *all,
                rate: *rate,
                max_replays: *max_replays,
            };
            let mut status: ReplayStatus = admin
                .call_with(Method::POST, "/dlq/replay", &request)
                .await?;
            let mut said_waiting = false;
            while status.running {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                status = admin.call(Method::GET, "/dlq/replay").await?;
                if status.waiting_for_breaker && !said_waiting {
                    eprintln!("\nthe breaker is open: the replay waits");
                }
                said_waiting = status.waiting_for_breaker;
                eprint!("\rreplayed {}", status.replayed);
            }
            eprintln!();
            if let Some(e) = &status.error {
                anyhow::bail!("the replay stopped after {}: {e}", status.replayed);
            }
            print_replay_done(status.replayed, status.skipped, *max_replays)?;
        }
        DlqCommand::Purge { ids, all } => {
            let request = PurgeRequest {
                ids: ids.clone(),
                all: *all,
            };
            let answer: PurgeAnswer = admin
                .call_with(Method::POST, "/dlq/purge", &request)
                .await?;
            outln!("purged {} message(s)", answer.purged);
        }
    }
    Ok(())
}

/// Replay waits while a running service's breaker is open (no point
/// feeding a database that is being protected). No service, or one that
/// runs no breaker: no wait.
async fn wait_while_breaker_open(admin: &AdminTarget) {
    let mut said = false;
    loop {
        let view: Result<BreakerView, _> = admin.call(http::Method::GET, "/breaker").await;
        match view {
            Ok(BreakerView {
                breaker: Some(b), ..
            }) if !b.gate.may_poll => {
                if !said {
                    eprintln!("breaker is open: waiting before replaying");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            _ => return,
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_and_absurd_ones_are_errors_not_panics() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("10 parsecs").is_err());
        let err = parse_duration("100000000000000000000000").unwrap_err();
        assert!(err.contains("not a duration Breakwater can wait"), "{err}");
    }
}
