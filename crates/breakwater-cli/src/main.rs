//! The `breakwater` command line: the binary's edge, where errors become
//! messages and exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use breakwater::config::Config;
use breakwater::queue::{DlqPage, OpenMode, QueueStats, replay_at_rate};
use breakwater::serve::{self, Role};
use breakwater_admin_api::{BreakerLocation, BreakerView, TransitionAnswer};
use clap::{Parser, Subcommand};

/// Webhook ingress gateway with a dynamic ingestion circuit breaker.
#[derive(Debug, Parser)]
#[command(name = "breakwater", version, about, long_about = None)]
struct Cli {
    /// Config file. Default: ./breakwater.toml if it exists, else built-in
    /// defaults. Every key can be overridden by BREAKWATER_<SECTION>_<KEY>.
    #[arg(long, global = true, env = "BREAKWATER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service: ingress, workers and admin listener.
    Serve {
        /// Which parts to run in this process.
        #[arg(long, value_enum, default_value_t = Role::All)]
        role: Role,
    },
    /// Validate the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Inspect the queue.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Inspect and steer the breaker of a running `serve` (admin API).
    Breaker {
        #[command(subcommand)]
        command: BreakerCommand,
    },
    /// Inspect, replay or purge dead-lettered messages.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
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
    Check {
        /// Print JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Counts: visible, in flight, delayed, dead-lettered, oldest visible age.
    Stats {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum BreakerCommand {
    /// State, reason, limit, signals with values and thresholds, transitions.
    Status {
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
        #[arg(long)]
        force_closed: bool,
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<std::time::Duration>,
    },
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Dead-lettered messages, oldest first.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// One dead-lettered message with its body.
    Show { id: String },
    /// Put messages back in the queue (IDs, or --all), at most --rate per second.
    Replay {
        ids: Vec<String>,
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
        ids: Vec<String>,
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Bare hyper vs Breakwater's verified, durable ingress under the same load.
    Ingress(breakwater_lab::bench::IngressBenchArgs),
    /// Workers draining a backlog into PostgreSQL vs pgbench, same statements.
    Drain(breakwater_lab::bench::drain::DrainBenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
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

/// Logs to stderr, filtered by `RUST_LOG`, else at `default` and above.
fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
    init_tracing(if matches!(cli.command, Command::Serve { .. }) {
        "info"
    } else {
        "warn"
    });
    match cli.command {
        Command::Serve { role } => {
            let config = load_config(cli.config.as_deref())?;
            let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
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
                shutdown_signal().await;
                tracing::info!("shutting down");
                running.shutdown().await;
                anyhow::Ok(())
            })
        }
        Command::Config {
            command: ConfigCommand::Check { json },
        } => {
            let config = load_config(cli.config.as_deref())?;
            breakwater::source::compile_all(&config.sources)?;
            let shown = config.redacted();
            if json {
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                print!("{}", toml::to_string_pretty(&shown)?);
                eprintln!("config ok");
            }
            Ok(())
        }
        Command::Queue {
            command: QueueCommand::Stats { json },
        } => {
            let config = load_config(cli.config.as_deref())?;
            let stats = runtime()?.block_on(async {
                let queue = serve::open_queue(&config, OpenMode::Inspect).await?;
                anyhow::Ok(queue.stats().await?)
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                print_queue_stats(&config.queue.backend, &stats);
            }
            Ok(())
        }
        Command::Breaker { command } => {
            let config = load_config(cli.config.as_deref())?;
            runtime()?.block_on(breaker_command(&config, command))
        }
        Command::Dlq { command } => {
            let config = load_config(cli.config.as_deref())?;
            runtime()?.block_on(dlq_command(&config, command))
        }
        Command::Bench {
            command: BenchCommand::Ingress(args),
        } => {
            // The service's own metrics say where phase 2's time went.
            let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .context("cannot install the metrics recorder")?;
            let report = breakwater_lab::bench::run_ingress_bench(&args, Some(metrics))?;
            print!("{report}");
            Ok(())
        }
        Command::Lab(args) => {
            let report = runtime()?.block_on(breakwater_lab::outage::run_lab(&args))?;
            print!("{report}");
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
            print!("{report}");
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

async fn breaker_command(config: &Config, command: BreakerCommand) -> anyhow::Result<()> {
    use breakwater::admin::client::call;
    let addr = config.admin.listen;
    let token = config.admin.token.as_deref();
    match command {
        BreakerCommand::Status { json } => {
            let view: BreakerView = call(addr, token, http::Method::GET, "/breaker").await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print_breaker(&view);
            }
        }
        BreakerCommand::Trip { ttl, note } => {
            let mut q = format!("/breaker/trip?note={}", urlencode(&note));
            if let Some(ttl) = ttl {
                q.push_str(&format!("&ttl_secs={}", ttl.as_secs().max(1)));
            }
            let answer: TransitionAnswer = call(addr, token, http::Method::POST, &q).await?;
            println!("{}", answer.transition.as_deref().unwrap_or("tripped"));
        }
        BreakerCommand::Reset { force_closed, ttl } => {
            let mut q = format!("/breaker/reset?force_closed={force_closed}");
            if let Some(ttl) = ttl {
                q.push_str(&format!("&ttl_secs={}", ttl.as_secs().max(1)));
            }
            let answer: TransitionAnswer = call(addr, token, http::Method::POST, &q).await?;
            match answer.transition {
                Some(t) => println!("{t}"),
                None => println!("no manual override in force; state {}", answer.state),
            }
        }
    }
    Ok(())
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn print_queue_stats(backend: &str, stats: &QueueStats) {
    let count = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |n| n.to_string());
    println!("backend        {backend}");
    println!("visible        {}", count(stats.visible));
    println!("in flight      {}", count(stats.in_flight));
    println!("delayed        {}", count(stats.delayed));
    println!("dead-lettered  {}", count(stats.dead_lettered));
    match stats.oldest_visible_age_ms {
        Some(ms) => println!("oldest visible {:.1} s", ms as f64 / 1000.0),
        None => println!("oldest visible n/a"),
    }
    println!("acked (total)  {}", count(stats.acked_total));
}

fn print_breaker(view: &BreakerView) {
    let b = match (&view.breaker, &view.location) {
        (Some(b), _) => b,
        (None, BreakerLocation::WithTheWorkers { detail }) => {
            println!("state        (no breaker here)");
            println!("where        {detail}");
            return;
        }
        (None, BreakerLocation::Local) => {
            println!("state        (unknown)");
            return;
        }
    };
    println!("state        {}", b.state);
    println!("limit        {}", b.limit);
    if let Some(m) = &b.message {
        println!("reason       {m}");
    }
    if let Some(o) = &b.manual_override {
        println!(
            "override     {}",
            serde_json::to_string(o).unwrap_or_default()
        );
    }
    if b.dry_run {
        println!("dry run      yes (evaluates, never gates)");
    }
    println!("signals");
    let shown = |v: Option<f64>| v.map_or_else(|| "null".to_owned(), |v| v.to_string());
    for s in &b.signals {
        println!(
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
        println!("parked keys  {}", keys.join(", "));
    }
    println!("transitions");
    for t in &b.history {
        println!(
            "  {} -> {} {} ago: {}",
            t.from,
            t.to,
            format_ago(t.ago_ms),
            t.message
        );
    }
}

fn format_ago(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

async fn dlq_command(config: &Config, command: DlqCommand) -> anyhow::Result<()> {
    let queue = serve::open_queue(config, OpenMode::Inspect).await?;
    match command {
        DlqCommand::List { limit, json } => {
            let list = queue.dlq_list(&DlqPage::first(limit)).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if list.is_empty() {
                println!("the dead-letter queue is empty");
            } else {
                println!(
                    "{:<8} {:<12} {:<28} {:<10} {:>8}  error",
                    "id", "source", "event id", "class", "attempts"
                );
                for d in list {
                    println!(
                        "{:<8} {:<12} {:<28} {:<10} {:>8}  {}",
                        d.id, d.source, d.event_id, d.class, d.attempts, d.error
                    );
                }
            }
        }
        DlqCommand::Show { id } => {
            let d = queue.dlq_show(&id).await?;
            println!("{}", serde_json::to_string_pretty(&d)?);
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
                || wait_while_breaker_open(config),
                |p| eprint!("\rreplayed {}", p.replayed),
            )
            .await?;
            eprintln!();
            if done.skipped > 0 {
                eprintln!(
                    "skipped {} (not in the DLQ, or replayed {max_replays} times already)",
                    done.skipped
                );
            }
            println!("replayed {} message(s)", done.replayed);
        }
        DlqCommand::Purge { ids, all } => {
            anyhow::ensure!(all || !ids.is_empty(), "name message ids, or pass --all");
            let n = queue.dlq_purge(if all { &[] } else { &ids }).await?;
            println!("purged {n} message(s)");
        }
    }
    Ok(())
}

/// Replay waits while a running service's breaker is open (no point
/// feeding a database that is being protected). No service, or one that
/// runs no breaker: no wait.
async fn wait_while_breaker_open(config: &Config) {
    let mut said = false;
    loop {
        let view: Result<BreakerView, _> = breakwater::admin::client::call(
            config.admin.listen,
            config.admin.token.as_deref(),
            http::Method::GET,
            "/breaker",
        )
        .await;
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
