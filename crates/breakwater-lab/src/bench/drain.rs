//! `breakwater bench drain`: how fast the workers apply a backlog into
//! PostgreSQL, next to `pgbench` running the same statements, in one run.
//!
//! Both phases use a fresh scratch database with an `orders` table of 1000
//! rows and Breakwater's inbox, the same concurrency, and per transaction
//! the same work: `SET LOCAL lock_timeout`, `SET LOCAL statement_timeout`,
//! the inbox insert with a ~1 KiB jsonb payload, one `UPDATE orders`.
//!
//! 1. **pgbench**: `pgbench -n -M prepared -c C -j 2 -T D` with that script;
//!    its `tps` is the reference.
//! 2. **breakwater**: N messages are put in a fresh queue first (the
//!    embedded store, or a broker's with `--backend`), then the real
//!    workers (controller, lanes, sink pool) drain it; the rate is N over
//!    the time until every message is applied (its inbox row committed).
//!    This includes the queue's own claims and acks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use tokio_postgres::NoTls;

use breakwater::config::{Config, StatementConfig};
use breakwater::queue::{NewMessage, OpenMode};
use breakwater::serve;
use breakwater::worker::{Controller, Workers};
use breakwater_queue_embedded::EmbeddedConfig;

use crate::backend::LabBackend;

/// Options of `breakwater bench drain`.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainBenchArgs {
    /// PostgreSQL server (without a database name); a scratch database is
    /// created on it and dropped afterwards.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub server_url: String,
    /// Messages Breakwater drains.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Concurrent transactions (pgbench clients, Breakwater workers, pool size).
    #[arg(long, default_value_t = 16)]
    pub concurrency: u32,
    /// Seconds pgbench runs.
    #[arg(long, default_value_t = 10)]
    pub pgbench_seconds: u64,
    /// Directory for the benchmark's queue (removed afterwards).
    #[arg(long, default_value = "data/bench")]
    pub data_dir: PathBuf,
    /// Which queue backend holds the backlog.
    #[arg(long, value_enum, default_value_t = LabBackend::Log)]
    pub backend: LabBackend,
    /// The broker's address (default: the broker's usual local one).
    #[arg(long)]
    pub queue_url: Option<String>,
}

const ORDERS: i64 = 1000;
const UPDATE: &str = "UPDATE orders SET status = $status, updated_at = now() WHERE id = $entity";

/// Figures of one drain benchmark.
#[derive(Debug)]
pub struct DrainReport {
    pub backend: LabBackend,
    pub concurrency: u32,
    pub pgbench_tps: f64,
    pub messages: usize,
    pub seconds: f64,
}

impl DrainReport {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds.max(f64::EPSILON)
    }
}

impl std::fmt::Display for DrainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "drain bench on {:?}: {} concurrent transactions, inbox insert (~1 KiB jsonb) + 1 UPDATE each",
            self.backend, self.concurrency
        )?;
        writeln!(f, "{:<34} {:>10}", "phase", "per second")?;
        writeln!(
            f,
            "{:<34} {:>10.0}",
            "pgbench (same statements)", self.pgbench_tps
        )?;
        writeln!(
            f,
            "{:<34} {:>10.0}   ({} messages in {:.1} s)",
            "breakwater workers (queue -> pg)",
            self.rate(),
            self.messages,
            self.seconds
        )?;
        writeln!(
            f,
            "ratio breakwater / pgbench: {:.1}%",
            100.0 * self.rate() / self.pgbench_tps.max(f64::EPSILON)
        )
    }
}

fn payload(i: usize, order: i64) -> String {
    let pad = "x".repeat(900);
    format!(
        r#"{{"id":"evt_drain_{i}","type":"order.updated","data":{{"object":{{"id":{order},"status":"paid","note":"{pad}"}}}}}}"#
    )
}

async fn admin_client(server_url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(&format!("{server_url}/postgres"), NoTls)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {server_url}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Runs both phases.
pub async fn run_drain_bench(args: &DrainBenchArgs) -> anyhow::Result<DrainReport> {
    let name = format!("bw_bench_drain_{}", std::process::id());
    let admin = admin_client(&args.server_url).await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let result = run_phases(args, &name).await;
    let _ = admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await;
    result
}

async fn run_phases(args: &DrainBenchArgs, name: &str) -> anyhow::Result<DrainReport> {
    let db_url = format!("{}/{name}", args.server_url);
    let (client, conn) = tokio_postgres::connect(&db_url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute(&format!(
            "CREATE TABLE orders (id bigint PRIMARY KEY, status text, updated_at timestamptz);
             INSERT INTO orders SELECT g, 'new', now() FROM generate_series(1, {ORDERS}) g;"
        ))
        .await?;

    let mut config = Config::default();
    config.sink.url = db_url.clone();
    config.sink.pool_max = args.concurrency as usize;
    config.workers.max_concurrency = args.concurrency;
    let queue_config =
        EmbeddedConfig::at(args.data_dir.join(format!("drain-{}", std::process::id())));
    config.queue = queue_config.section();
    let queue_url = args.backend.url(args.queue_url.as_deref());
    let queue_name = format!("bwbench_drain_{}", std::process::id());
    if let Some(section) = args
        .backend
        .section(&queue_url, &queue_name, &queue_config.path)
    {
        config.queue = section;
    }
    let mut source = crate::bench::bench_config(&queue_config.path)
        .sources
        .remove(0);
    source.statements.push(StatementConfig {
        sql: UPDATE.to_owned(),
        params: [("status".to_owned(), "json:/data/object/status".to_owned())].into(),
    });
    config.sources.push(source);

    // Phase 1: the sink creates the inbox; pgbench runs the same statements.
    let sink =
        breakwater_sink::connect(&serve::sink_settings(&config), &serve::statements(&config))
            .await?;
    eprintln!("phase 1/2: pgbench, {} s", args.pgbench_seconds);
    let pgbench_tps = run_pgbench(args, &config, &db_url).await?;
    client.batch_execute("TRUNCATE breakwater_inbox").await?;

    // Phase 2: fill a queue, then let the workers drain it.
    eprintln!("phase 2/2: breakwater drains {} messages", args.messages);
    let _ = std::fs::remove_dir_all(&queue_config.path);
    let drained = drain(args, &config, &client, sink).await;
    args.backend.remove(&queue_url, &queue_name).await;
    let _ = std::fs::remove_dir_all(&queue_config.path);
    Ok(DrainReport {
        backend: args.backend,
        concurrency: args.concurrency,
        pgbench_tps,
        messages: args.messages,
        seconds: drained?,
    })
}

/// Fills the queue `config` names, lets the workers drain it into the
/// sink, and returns the seconds the drain took.
async fn drain(
    args: &DrainBenchArgs,
    config: &Config,
    client: &tokio_postgres::Client,
    sink: Arc<dyn breakwater_sink::Sink>,
) -> anyhow::Result<f64> {
    let queue = breakwater::queue::open(&config.queue, OpenMode::Serve).await?;
    super::fill_queue(&queue, args.messages, |i| {
        let order = 1 + (i as i64 % ORDERS);
        NewMessage {
            source: "stripe".to_owned(),
            event_id: format!("evt_drain_{i}"),
            entity_key: Some(order.to_string()),
            headers: Vec::new(),
            body: Bytes::from(payload(i, order)),
            received_at_ms: breakwater::ingress::unix_now_ms(),
        }
    })
    .await?;
    let breaker = config.breaker_config();
    let controller = Controller::new(breaker, config.concurrency_ceiling() as usize)?;
    // The consumer ready first (a Kafka consumer takes seconds to join its
    // group): the figure is the drain, not the start.
    queue.start_consuming(Duration::from_secs(30)).await?;
    // The breaker's tick, as `serve` runs it: without it the adaptive
    // limiter would never judge a window and the drain would run at its
    // starting limit.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ticks =
        tokio::spawn(Arc::clone(&controller).run(Arc::clone(&queue), Arc::clone(&sink), stop_rx));
    let started = Instant::now();
    let workers = Workers::start(
        Arc::clone(&queue),
        sink,
        Arc::clone(&controller),
        serve::worker_settings(config),
        breakwater::worker::ParkedKeys::default(),
    );
    let target = args.messages as i64;
    loop {
        let applied: i64 = client
            .query_one("SELECT count(*) FROM breakwater_inbox", &[])
            .await?
            .get(0);
        if applied >= target {
            break;
        }
        let dead = queue.stats().await?.dead_lettered.unwrap_or(0);
        anyhow::ensure!(dead == 0, "{dead} messages were dead-lettered");
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "drain did not finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    workers.shutdown().await;
    let _ = stop_tx.send(true);
    let _ = ticks.await;
    if let Some(limiter) = controller.status().limiter {
        eprintln!(
            "limiter at the end: {} (last move: {})",
            limiter.limit,
            limiter
                .last_change
                .map_or_else(|| "none".to_owned(), |c| c.to_string())
        );
    }
    Ok(seconds)
}

async fn run_pgbench(args: &DrainBenchArgs, config: &Config, db_url: &str) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("drain.sql");
    let body = payload(0, 1).replace('\'', "''");
    std::fs::write(
        &script,
        format!(
            "\\set id random(1, {ORDERS})\n\\set n random(1, 2000000000)\n\
             BEGIN;\n\
             SET LOCAL lock_timeout = '{lock}ms';\n\
             SET LOCAL statement_timeout = '{stmt}ms';\n\
             INSERT INTO breakwater_inbox (event_id, source, entity_key, payload, received_at, applied_at) \
             VALUES ('pg-' || :client_id || '-' || :n, 'stripe', :id, '{body}'::jsonb, now(), now()) \
             ON CONFLICT (source, event_id) DO NOTHING;\n\
             UPDATE orders SET status = 'paid', updated_at = now() WHERE id = :id;\n\
             COMMIT;\n",
            lock = config.sink.lock_timeout_ms,
            stmt = config.sink.statement_timeout_ms,
        ),
    )?;
    let out = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-j", "2"])
        .arg("-c")
        .arg(args.concurrency.to_string())
        .arg("-T")
        .arg(args.pgbench_seconds.to_string())
        .arg("-f")
        .arg(&script)
        .arg(db_url)
        .output()
        .await
        .context("cannot run pgbench (Debian package postgresql-client)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no tps in pgbench's output:\n{text}"))
}
