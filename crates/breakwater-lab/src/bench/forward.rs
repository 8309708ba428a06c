//! `breakwater bench forward`: how fast the workers forward a backlog to an
//! HTTP service that answers at once, next to the same service driven
//! directly by the load generator, in one run.
//!
//! 1. **direct**: the ingress bench's load generator POSTs 1 KiB bodies to
//!    a bare hyper server (200 at once) with C connections; its rate is the
//!    reference.
//! 2. **breakwater**: N messages are put in a fresh embedded queue, then
//!    the real workers (controller, lanes, a forward target with C
//!    connections) forward them to the same server; the rate is N over the
//!    time until every message is acknowledged. This includes the queue's
//!    own claims and acks (group-committed, fsync'd).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use breakwater::config::Config;
use breakwater::queue::{NewMessage, Queue};
use breakwater::serve;
use breakwater::worker::{Controller, Workers};
use breakwater_queue_embedded::{EmbeddedConfig, EmbeddedQueue};
use breakwater_sink::{ForwardSpec, ForwardTarget, RoutedSink};

use super::load::{self, LoadSpec};

/// The Standard Webhooks secret the forwarded requests are signed with
/// (signing is part of what is measured).
const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// Options of `breakwater bench forward`.
#[derive(Debug, Clone, clap::Args)]
pub struct ForwardBenchArgs {
    /// Messages Breakwater forwards.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Connections of the load generator, and of the forward target (and
    /// workers).
    #[arg(long, default_value_t = 16)]
    pub concurrency: u32,
    /// Seconds the load generator runs.
    #[arg(long, default_value_t = 10)]
    pub direct_seconds: u64,
    /// Directory for the benchmark's queue and database (removed
    /// afterwards).
    #[arg(long, default_value = "data/bench")]
    pub data_dir: PathBuf,
}

/// Figures of one forward benchmark.
#[derive(Debug)]
pub struct ForwardReport {
    pub concurrency: u32,
    pub direct_rate: f64,
    pub messages: usize,
    pub seconds: f64,
}

impl ForwardReport {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds.max(f64::EPSILON)
    }
}

impl std::fmt::Display for ForwardReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "forward bench: {} connections, 1 KiB bodies, a receiver answering 200 at once",
            self.concurrency
        )?;
        writeln!(f, "{:<34} {:>10}", "phase", "per second")?;
        writeln!(
            f,
            "{:<34} {:>10.0}",
            "load generator -> receiver", self.direct_rate
        )?;
        writeln!(
            f,
            "{:<34} {:>10.0}   ({} messages in {:.1} s)",
            "breakwater workers (queue -> http)",
            self.rate(),
            self.messages,
            self.seconds
        )?;
        write!(
            f,
            "ratio breakwater / direct: {:.1}%",
            100.0 * self.rate() / self.direct_rate.max(f64::EPSILON)
        )
    }
}

pub async fn run_forward_bench(args: &ForwardBenchArgs) -> anyhow::Result<ForwardReport> {
    let receiver = super::start_bare_hyper().await?;
    let dir = args
        .data_dir
        .join(format!("forward-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = run_phases(args, receiver, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_phases(
    args: &ForwardBenchArgs,
    receiver: std::net::SocketAddr,
    dir: &std::path::Path,
) -> anyhow::Result<ForwardReport> {
    eprintln!("phase 1/2: the load generator, {} s", args.direct_seconds);
    let direct = load::run(LoadSpec {
        target: receiver,
        path: "/hooks".to_owned(),
        concurrency: args.concurrency as usize,
        body_bytes: 1024,
        warmup: Duration::from_secs(1),
        duration: Duration::from_secs(args.direct_seconds),
        secret: super::BENCH_SECRET.to_owned(),
        run_tag: format!("direct{}", std::process::id()),
        rate: None,
        cpu_of: Vec::new(),
    })
    .await?;
    anyhow::ensure!(
        direct.errors == 0,
        "{} direct requests failed",
        direct.errors
    );

    eprintln!("phase 2/2: breakwater forwards {} messages", args.messages);
    let mut config = Config::default();
    config.sink.url = format!("sqlite://{}", dir.join("sink.db").display());
    config.workers.max_concurrency = args.concurrency;
    // The limiter's ceiling: the target's connections, not more.
    config.sink.pool_max = args.concurrency as usize;
    let queue_config = EmbeddedConfig::at(dir.join("queue"));
    let queue: Arc<dyn Queue> = Arc::new(EmbeddedQueue::open(&queue_config)?);
    super::fill_queue(&queue, args.messages, |i| NewMessage {
        source: "stripe".to_owned(),
        event_id: format!("evt_forward_{i}"),
        entity_key: None,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        body: Bytes::from(load::stripe_body(&format!("evt_forward_{i}"), "1", 1024)),
        received_at_ms: breakwater::ingress::unix_now_ms(),
    })
    .await?;
    let database =
        breakwater_sink::connect(&serve::sink_settings(&config), &Default::default()).await?;
    let target = ForwardTarget::new(ForwardSpec {
        url: format!("http://{receiver}/hooks"),
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        max_connections: args.concurrency as usize,
        secret: Some(FORWARD_SECRET.to_owned()),
        http2: false,
        follow_redirects: 0,
        ca_file: None,
    })?;
    let sink = Arc::new(RoutedSink::new(
        database,
        HashMap::from([("stripe".to_owned(), target)]),
    ));
    let breaker = config.breaker_config();
    let controller = Controller::new(breaker, config.concurrency_ceiling() as usize)?;
    let started = Instant::now();
    let workers = Workers::start(
        Arc::clone(&queue),
        sink,
        controller,
        serve::worker_settings(&config),
        breakwater::worker::ParkedKeys::default(),
    );
    let target = args.messages as u64;
    loop {
        let s = queue.stats().await?;
        let (acked, dead) = (
            s.acked_total.unwrap_or(0),
            s.dead_lettered_total.unwrap_or(0),
        );
        if acked + dead >= target {
            anyhow::ensure!(dead == 0, "{dead} messages were dead-lettered");
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "forwarding did not finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    workers.shutdown().await;
    Ok(ForwardReport {
        concurrency: args.concurrency,
        direct_rate: direct.rate(),
        messages: args.messages,
        seconds,
    })
}
