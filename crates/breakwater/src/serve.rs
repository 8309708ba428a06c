//! `breakwater serve`: wires config, sources, queue, listeners (and, with
//! the worker role, the workers) into one running process.
//!
//! [`start`] binds every listener before it starts any worker (so a caller
//! knows the addresses, port 0 included, and a port clash stops everything)
//! and runs the servers as tasks; with the role `all` it returns only once
//! the sink answers, the ingress and admin API serving meanwhile;
//! [`Running::shutdown`] stops accepting, lets in-flight requests finish and
//! waits for the tasks.
//!
//! A source's `secrets_file` that its group or others may read is warned
//! about at start and by [`check`] ([`exposed_secrets_files`]).

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use std::collections::BTreeMap;
use std::time::Duration;

use breakwater_control::{BackoffPolicy, Jitter};
use breakwater_sink::{
    ForwardTarget, LockWaitersScope, RoutedSink, Sink, SinkSettings, SinkSetupError, StatementSpec,
};

use breakwater_fleet::{NodeRole, RedisFleet};

use crate::admin::Admin;
use crate::breaker::{Coordination, FleetLink, Standing};
use crate::config::{BackoffJitter, Config, LockWaitersScopeName};
use crate::events::journal::EventJournal;
use crate::ingress::{ApplyStatus, Ingress};
use crate::queue::{OpenMode, Queue};
use crate::source;
use crate::worker::apply_runtime::ApplyRuntime;
use crate::worker::lanes::LaneSettings;
use crate::worker::{Controller, ParkedKeys, WorkerSettings, Workers};

/// Which parts of the pipeline this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Role {
    /// Only the HTTP ingress (and admin).
    Ingress,
    /// Only the workers (and admin).
    Worker,
    /// Everything.
    #[default]
    All,
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Source(#[from] source::SourceError),
    // The cause is the error's source, not part of its message: printed
    // with its chain (`{:#}`), the message would say it twice.
    #[error("cannot open the queue")]
    Queue(#[from] crate::queue::QueueError),
    #[error("sink")]
    Sink(#[from] breakwater_sink::SinkSetupError),
    #[error("invalid [breaker] config")]
    Breaker(#[from] breakwater_control::ConfigError),
    #[error("[fleet]")]
    Fleet(#[from] breakwater_fleet::FleetError),
    #[error("cannot start the workers' runtime")]
    ApplyRuntime(#[source] std::io::Error),
    #[error("cannot listen on {addr} ({what}): {error}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
}

/// How often the queue is checked for a closed writer.
const QUEUE_WATCH_EVERY: Duration = Duration::from_secs(1);

/// Watches the queue: once it is closed for good (the embedded store's
/// writer thread died), says why in `fatal`, so the binary exits non-zero
/// and a supervisor restarts it, instead of a process answering 503 for
/// ever with `/healthz` the only one to notice.
fn spawn_queue_watch(
    queue: Arc<dyn Queue>,
    fatal: watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(QUEUE_WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            if let Err(crate::queue::QueueError::Closed) = queue.ready().await {
                let why = "the queue is closed (its writer stopped): exiting so the process can \
                           be restarted";
                tracing::error!("{why}");
                let _ = fatal.send(Some(why.to_owned()));
                break;
            }
        }
    })
}

/// A started service.
pub struct Running {
    pub ingress_addr: Option<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub queue: Arc<dyn Queue>,
    /// The breaker, in a process that runs workers (an ingress-only one
    /// runs none: its ingress never waits on it).
    pub controller: Option<Arc<Controller>>,
    workers: Option<Workers>,
    /// Set once the process cannot go on (see [`Running::failed`]).
    fatal: watch::Receiver<Option<String>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The workers' own runtime, beside an ingress (role `all`); last, so
    /// that it goes once everything on it has ended.
    apply_runtime: Option<ApplyRuntime>,
}

impl Running {
    /// Resolves, with the reason, once the process cannot go on (its queue
    /// closed for good); never while it can.
    pub async fn failed(&self) -> String {
        let mut fatal = self.fatal.clone();
        match fatal.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops accepting, finishes in-flight work and waits for every task.
    pub async fn shutdown(self) {
        if let Some(workers) = self.workers {
            workers.shutdown().await;
        }
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        drop(self.apply_runtime);
    }
}

/// Every check `serve` makes before it listens, short of connecting: the
/// sources compile (secrets resolve, extractors parse) and the sink's URL
/// and statements are ones it can run (an undeclared `$parameter` is
/// named). The config's own validation ran when it was loaded.
pub fn check(config: &Config) -> Result<(), ServeError> {
    compiles(config)?;
    warn_exposed_secrets_files(config);
    Ok(())
}

fn compiles(config: &Config) -> Result<(), ServeError> {
    source::compile_all(&config.sources)?;
    breakwater_sink::check(&sink_settings(config), &statements(config))?;
    Ok(())
}

/// One sentence for each source whose `secrets_file` is readable (or
/// writable) by its group or by others: its mode has bits in `0o077`. A
/// file that cannot be read is not named here (the source fails to
/// compile, saying why).
pub fn exposed_secrets_files(config: &Config) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    config
        .sources
        .iter()
        .filter_map(|s| {
            let path = s.secrets_file.as_ref()?;
            let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
            (mode & 0o077 != 0).then(|| {
                format!(
                    "source \"{}\": its secrets_file {} has mode {mode:o}, open to its group or \
                     others: chmod 600 it",
                    s.name,
                    path.display()
                )
            })
        })
        .collect()
}

fn warn_exposed_secrets_files(config: &Config) {
    for warning in exposed_secrets_files(config) {
        tracing::warn!("{warning}");
    }
}

/// [`check`], then what needs the services: the sink connects and prepares
/// every statement against the database, and the queue opens (creating
/// nothing).
pub async fn check_connected(config: &Config) -> Result<(), ServeError> {
    compiles(config)?;
    let database = breakwater_sink::connect(&sink_settings(config), &statements(config)).await?;
    with_forwards(database, config)?;
    open_existing_queue(config).await.map(|_| ())
}

/// The configured queue as it is, creating nothing; `None` when there is
/// none yet (fine: `serve` makes it).
pub async fn open_existing_queue(config: &Config) -> Result<Option<Arc<dyn Queue>>, ServeError> {
    match open_queue(config, OpenMode::Inspect).await {
        Ok(queue) => Ok(Some(queue)),
        Err(ServeError::Queue(crate::queue::QueueError::Missing { .. })) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the configured queue backend.
pub async fn open_queue(config: &Config, mode: OpenMode) -> Result<Arc<dyn Queue>, ServeError> {
    let mut section = config.queue.clone();
    section.key_order = config.key_order();
    Ok(crate::queue::open(&section, mode).await?)
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError::Bind { what, addr, error })
}

fn spawn_server<S>(
    name: &'static str,
    listener: TcpListener,
    service: S,
    limits: crate::http::ServerLimits,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()>
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    tokio::spawn(crate::http::serve(name, listener, service, limits, stop))
}

/// The ingress listener's limits.
pub fn ingress_limits(config: &Config) -> crate::http::ServerLimits {
    let i = &config.ingress;
    crate::http::ServerLimits {
        max_connections: i.max_connections,
        when_full: crate::http::WhenFull::Refuse,
        header_timeout: Duration::from_millis(i.header_timeout_ms),
        request_timeout: Duration::from_millis(i.request_timeout_ms),
        max_in_flight: i.max_in_flight,
    }
}

/// The admin listener's limits: an operator's few clients. When full it
/// closes its idlest connection for a new one, so idle sockets cannot lock
/// the operator out.
const ADMIN_LIMITS: crate::http::ServerLimits = crate::http::ServerLimits {
    max_connections: 256,
    when_full: crate::http::WhenFull::CloseIdlest,
    header_timeout: Duration::from_secs(10),
    request_timeout: Duration::from_secs(30),
    max_in_flight: 64,
};

/// How often the metrics recorder folds its pending histogram samples into
/// their summaries.
const METRICS_UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the metrics recorder's upkeep until `stop`.
///
/// The Prometheus exporter spawns its upkeep task only when it runs its own
/// HTTP listener (see "Upkeep and maintenance" in its docs); installed as a
/// plain recorder, served here by the admin router, it keeps every
/// histogram sample (an `f64`) until something renders `/metrics`. The
/// ingress records two per webhook and the queue two per group commit, so a
/// node that nobody scraped grew by about 16 bytes per webhook without
/// bound, and the first scrape had all of it to fold.
fn spawn_metrics_upkeep(
    metrics: PrometheusHandle,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(METRICS_UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => metrics.run_upkeep(),
                _ = stop.wait_for(|s| *s) => break,
            }
        }
    })
}

/// `database` with the forwarding sources routed to their targets (as it
/// is when no source forwards).
fn with_forwards(
    database: Arc<dyn Sink>,
    config: &Config,
) -> Result<Arc<dyn Sink>, SinkSetupError> {
    let mut forwards = std::collections::HashMap::new();
    for source in &config.sources {
        let Some(forward) = &source.forward else {
            continue;
        };
        let secret = match &forward.secret_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                SinkSetupError::Settings(format!(
                    "source \"{}\": the forward secret's environment variable {var} is not set",
                    source.name
                ))
            })?),
            None => None,
        };
        forwards.insert(
            source.name.clone(),
            ForwardTarget::new(forward.spec(secret))?.with_version(source.version_spec())?,
        );
    }
    if forwards.is_empty() {
        return Ok(database);
    }
    Ok(Arc::new(RoutedSink::new(database, forwards)))
}

/// The sink settings of a config.
pub fn sink_settings(config: &Config) -> SinkSettings {
    let s = &config.sink;
    SinkSettings {
        url: s.url.clone(),
        lock_timeout: Duration::from_millis(s.lock_timeout_ms),
        statement_timeout: Duration::from_millis(s.statement_timeout_ms),
        idle_in_transaction_timeout: Duration::from_millis(s.idle_in_transaction_timeout_ms),
        pool_max: s.pool_max,
        acquire_timeout: Duration::from_millis(s.acquire_timeout_ms),
        lock_waiters_scope: match s.lock_waiters_scope {
            LockWaitersScopeName::Breakwater => LockWaitersScope::Breakwater,
            LockWaitersScopeName::Database => LockWaitersScope::Database,
        },
        versions: config
            .sources
            .iter()
            .filter_map(|source| Some((source.name.clone(), source.version_spec()?.to_owned())))
            .collect(),
    }
}

/// Every source's statements, for the sink.
pub fn statements(config: &Config) -> BTreeMap<String, Vec<StatementSpec>> {
    config
        .sources
        .iter()
        .map(|s| {
            let specs = s
                .statements
                .iter()
                .map(|st| StatementSpec {
                    sql: st.sql.clone(),
                    params: st.params.clone(),
                })
                .collect();
            (s.name.clone(), specs)
        })
        .collect()
}

/// The worker settings of a config.
pub fn worker_settings(config: &Config) -> WorkerSettings {
    let w = &config.workers;
    WorkerSettings {
        max_concurrency: config.concurrency_ceiling(),
        max_attempts: w.max_attempts,
        backoff: BackoffPolicy {
            kind: match w.backoff_jitter {
                BackoffJitter::Full => Jitter::Full,
                BackoffJitter::Equal => Jitter::Equal,
                BackoffJitter::None => Jitter::None,
            },
            base: Duration::from_millis(w.backoff_base_ms),
            cap: Duration::from_millis(w.backoff_cap_ms),
        },
        lease: Duration::from_millis(config.queue.lease_ms),
        lanes: LaneSettings {
            per_key: w.per_key_concurrency,
            max_held: (config.concurrency_ceiling() as usize * 4).max(32),
            ..LaneSettings::default()
        },
        journal: Arc::new(
            EventJournal::new(config.admin.event_history, config.node_name())
                .with_max_bytes(config.admin.event_history_bytes),
        ),
    }
}

/// First wait between attempts to reach an unreachable sink; it doubles up
/// to [`SINK_RETRY_MAX`].
const SINK_RETRY_FIRST: Duration = Duration::from_secs(1);
const SINK_RETRY_MAX: Duration = Duration::from_secs(30);

/// Connects the sink. With `wait`, a database that does not answer
/// ([`SinkSetupError::Unreachable`]) is tried again, with a warning each
/// time, until it does; any other setup error (a bad URL or statement, a
/// refused password) returns at once.
///
/// Meanwhile the breaker is held open with the reason, so `/breaker`,
/// `/readyz` and the metrics say the workers are not applying; once the
/// sink answers it goes half-open and probes confirm it.
async fn connect_sink(
    config: &Config,
    wait: bool,
    controller: &Controller,
) -> Result<Arc<dyn Sink>, ServeError> {
    let mut delay = SINK_RETRY_FIRST;
    let mut held = false;
    loop {
        match breakwater_sink::connect(&sink_settings(config), &statements(config)).await {
            Err(SinkSetupError::Unreachable(error)) if wait => {
                let why = unreachable_reason(&error);
                // Held before it is said, so whoever reads the log finds
                // the breaker already saying it too.
                if !held {
                    controller.dependency_unreachable(&why);
                    held = true;
                }
                tracing::warn!(
                    retry_in_s = delay.as_secs(),
                    "{why}: the ingress keeps taking webhooks into the queue, and the workers \
                     start once it answers"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(SINK_RETRY_MAX);
            }
            Ok(sink) => {
                if held {
                    controller.dependency_reachable();
                }
                return Ok(with_forwards(sink, config)?);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Why the sink cannot be reached, in the words an operator needs: a host
/// name that does not resolve is said plainly, not as a connect error.
fn unreachable_reason(error: &str) -> String {
    if error.contains("lookup address") || error.contains("Name or service not known") {
        format!("the sink's host name does not resolve (DNS): {error}")
    } else {
        format!("the sink's database does not answer: {error}")
    }
}

/// Wraps the sink the workers apply through (the outage lab's naive
/// consumer adds its in-place retries this way).
pub type SinkLayer = Box<dyn FnOnce(Arc<dyn Sink>) -> Arc<dyn Sink> + Send>;

/// What a caller may add to a started service beyond its config.
#[derive(Default)]
pub struct Hooks {
    pub sink_layer: Option<SinkLayer>,
}

fn node_role(role: Role) -> NodeRole {
    match role {
        Role::Ingress => NodeRole::Ingress,
        Role::Worker => NodeRole::Worker,
        Role::All => NodeRole::All,
    }
}

/// Starts the service described by `config`. With the role `all` and a
/// sink that does not answer, it returns only once the sink does, the
/// ingress and the admin API serving meanwhile.
pub async fn start(
    config: &Config,
    role: Role,
    metrics: Option<PrometheusHandle>,
) -> Result<Running, ServeError> {
    start_with(config, role, metrics, Hooks::default()).await
}

/// [`start`], with [`Hooks`].
pub async fn start_with(
    config: &Config,
    role: Role,
    metrics: Option<PrometheusHandle>,
    hooks: Hooks,
) -> Result<Running, ServeError> {
    let sources = source::compile_all(&config.sources)?;
    warn_exposed_secrets_files(config);
    for (name, s) in &sources {
        if let Some(header) = &s.unsigned_event_id {
            tracing::warn!(source = %name, header = %header,
                "the event id comes from a header the signature does not cover: a captured \
                 webhook sent again under a fresh id is applied again; take the id from the \
                 body (event_id = \"json:/...\") or set dedup_on = \"body\"");
        }
    }
    let queue = open_queue(config, OpenMode::Serve).await?;
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let (fatal_tx, fatal) = watch::channel(None);
    tasks.push(spawn_queue_watch(
        Arc::clone(&queue),
        fatal_tx,
        stop_rx.clone(),
    ));

    let runs_workers = role != Role::Ingress;
    // A redelivery limit concerns the workers' messages: an ingress-only
    // process has nothing to say about it.
    let queue_warnings: Vec<String> = if runs_workers {
        crate::queue::redelivery_warning(queue.redelivery_limit(), config.workers.max_attempts)
            .into_iter()
            .chain(config.key_order_warning())
            .collect()
    } else {
        Vec::new()
    };
    for warning in &queue_warnings {
        tracing::warn!(backend = %config.queue.backend, "{warning}");
    }
    // With [fleet], every node (an ingress node too, so its admin API
    // shows and can trip the fleet's breaker) follows one shared breaker.
    let fleet = match &config.fleet {
        Some(f) => {
            let node = f.node();
            let store = Arc::new(RedisFleet::open(&f.redis_url, &f.prefix, &node)?);
            tracing::info!(node = %node, prefix = %f.prefix,
                redis = %crate::config::redact_url(&f.redis_url), "fleet mode: one breaker through Redis");
            Some(Arc::new(FleetLink::new(
                store,
                node_role(role),
                Duration::from_millis(f.beat_ms),
                Duration::from_millis(f.lease_ms),
            )))
        }
        None => None,
    };
    let controller = if runs_workers || fleet.is_some() {
        // One knob for the pool size: the breaker's maximum is the workers';
        // the limiter may take it up to its ceiling.
        let breaker_config = config.breaker_config();
        let workers = if runs_workers {
            config.concurrency_ceiling() as usize
        } else {
            0
        };
        let coordination = match &fleet {
            Some(link) => Coordination {
                store: Arc::clone(link.store()) as _,
                probe_slots: Arc::clone(link.store()) as _,
                node: link.store().node().to_owned(),
                standing: if runs_workers {
                    Standing::Follower
                } else {
                    Standing::Observer
                },
            },
            None => Coordination::local(),
        };
        let controller = Controller::with_coordination(breaker_config, workers, coordination)?;
        if let Some(retention) = config.queue.retention_secs {
            controller.watch_retention(retention, config.queue.retention_warn_secs);
        }
        Some(controller)
    } else {
        None
    };
    if let (Some(link), Some(controller)) = (&fleet, &controller) {
        tasks.push(tokio::spawn(
            Arc::clone(link).run(Arc::clone(controller), stop_rx.clone()),
        ));
        if !runs_workers {
            tasks.push(tokio::spawn(Arc::clone(controller).share(stop_rx.clone())));
        }
    }
    let mut ingress_addr = None;
    if role != Role::Worker {
        let listener = bind("ingress", config.ingress.listen).await?;
        let addr = listener.local_addr().map_err(|error| ServeError::Bind {
            what: "ingress",
            addr: config.ingress.listen,
            error,
        })?;
        let mut ingress = Ingress::new(&sources, Arc::clone(&queue), config.ingress.max_body_bytes);
        if let Some(controller) = &controller {
            ingress = ingress.with_apply_status(Arc::clone(controller) as Arc<dyn ApplyStatus>);
        }
        tasks.push(spawn_server(
            "ingress",
            listener,
            ingress.service(),
            ingress_limits(config),
            stop_rx.clone(),
        ));
        tracing::info!(%addr, sources = sources.len(), "ingress listening: POST /webhooks/{{source}}");
        if sources.is_empty() {
            tracing::warn!("no [[source]] configured: every webhook will answer 404");
        }
        ingress_addr = Some(addr);
    }

    // Every listener is bound before any worker starts: a port clash stops
    // the service before it claims anything.
    let admin_listener = bind("admin", config.admin.listen).await?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|error| ServeError::Bind {
            what: "admin",
            addr: config.admin.listen,
            error,
        })?;

    let parked = runs_workers.then(ParkedKeys::default);

    if let Some(metrics) = &metrics {
        tasks.push(spawn_metrics_upkeep(metrics.clone(), stop_rx.clone()));
    }
    let settings = worker_settings(config);
    let sink_slot = crate::admin::SinkSlot::default();
    let admin = Admin {
        metrics,
        queue: Arc::clone(&queue),
        token: config.admin.token.clone(),
        listen: admin_addr,
        controller: controller.clone(),
        fleet: fleet.clone(),
        parked: parked.clone(),
        queue_warnings,
        replays: Default::default(),
        journal: Arc::clone(&settings.journal),
        sink: Arc::clone(&sink_slot),
    };
    tasks.push(spawn_server(
        "admin",
        admin_listener,
        admin.router(),
        ADMIN_LIMITS,
        stop_rx.clone(),
    ));
    tracing::info!(addr = %admin_addr, "admin listening: /metrics /queue/stats /breaker");

    let mut workers = None;
    let mut apply_runtime = None;
    if let (Some(parked), Some(controller)) = (parked, &controller) {
        // With the ingress in this process, a database that does not answer
        // must not keep it from taking webhooks: they wait in the queue.
        let mut sink = connect_sink(config, role == Role::All, controller).await?;
        if let Some(layer) = hooks.sink_layer {
            sink = layer(sink);
        }
        tracing::info!(sink = %crate::config::redact_url(&config.sink.url), "sink ready");
        let _ = sink_slot.set(Arc::clone(&sink));
        tasks.push(tokio::spawn(Arc::clone(controller).run(
            Arc::clone(&queue),
            Arc::clone(&sink),
            stop_rx.clone(),
        )));
        let shared_parks = fleet.as_ref().map(|link| {
            let (shared, handles) = link.share_parks(stop_rx.clone());
            tasks.extend(handles);
            shared
        });
        // Beside an ingress, the workers take the CPU the ingress leaves.
        if role == Role::All {
            apply_runtime =
                ApplyRuntime::start(config.workers.nice).map_err(ServeError::ApplyRuntime)?;
        }
        let main_runtime = tokio::runtime::Handle::current();
        let runtime = apply_runtime
            .as_ref()
            .and_then(ApplyRuntime::handle)
            .unwrap_or(&main_runtime);
        workers = Some(Workers::start_in_fleet(
            Arc::clone(&queue),
            sink,
            Arc::clone(controller),
            settings,
            parked,
            shared_parks,
            runtime,
        ));
        tracing::info!(
            max_concurrency = config.workers.max_concurrency,
            nice = apply_runtime.as_ref().map_or(0, |_| config.workers.nice),
            "workers started"
        );
    }

    Ok(Running {
        ingress_addr,
        admin_addr,
        queue,
        controller,
        workers,
        fatal,
        stop,
        tasks,
        apply_runtime,
    })
}
