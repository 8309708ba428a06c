//! The `breakwater` command line: the binary's edge, where errors become
//! messages and exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use breakwater::config::Config;
use breakwater::serve::{self, Role};
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
enum BenchCommand {
    /// Bare hyper vs Breakwater's verified, durable ingress under the same load.
    Ingress(breakwater::bench::IngressBenchArgs),
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

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { role } => {
            init_tracing();
            let config = load_config(cli.config.as_deref())?;
            let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .context("cannot install the metrics recorder")?;
            runtime()?.block_on(async {
                let running = serve::start(&config, role, Some(metrics)).await?;
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
                let queue = serve::open_queue(&config)?;
                anyhow::Ok(queue.stats().await?)
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                println!("backend        {}", config.queue.backend.as_str());
                println!("visible        {}", stats.visible);
                println!("in flight      {}", stats.in_flight);
                println!("delayed        {}", stats.delayed);
                println!("dead-lettered  {}", stats.dead_lettered);
                println!(
                    "oldest visible {:.1} s",
                    stats.oldest_visible_age_ms as f64 / 1000.0
                );
                println!("acked (total)  {}", stats.acked_total);
            }
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Ingress(args),
        } => {
            let report = breakwater::bench::run_ingress_bench(&args)?;
            print!("{report}");
            Ok(())
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
