//! `breakwater serve`: wires config, sources, queue, listeners (and, with
//! the worker role, the workers) into one running process.
//!
//! [`start`] binds every listener before it returns (so a caller knows the
//! addresses, port 0 included) and runs the servers as tasks;
//! [`Running::shutdown`] stops accepting, lets in-flight requests finish and
//! waits for the tasks.

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::Admin;
use crate::config::Config;
use crate::ingress::Ingress;
use crate::queue::Queue;
use crate::queue::embedded::EmbeddedQueue;
use crate::source;

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
    #[error("cannot open the queue: {0}")]
    Queue(#[from] crate::queue::QueueError),
    #[error("cannot listen on {addr} ({what}): {error}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
}

/// A started service.
pub struct Running {
    pub ingress_addr: Option<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub queue: Arc<dyn Queue>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, finishes in-flight work and waits for every task.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Opens the configured queue backend.
pub fn open_queue(config: &Config) -> Result<Arc<dyn Queue>, ServeError> {
    Ok(Arc::new(EmbeddedQueue::open(&config.queue)?))
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError::Bind { what, addr, error })
}

fn spawn_server(
    listener: TcpListener,
    router: axum::Router,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "server stopped with an error");
        }
    })
}

/// Starts the service described by `config`.
pub async fn start(
    config: &Config,
    role: Role,
    metrics: Option<PrometheusHandle>,
) -> Result<Running, ServeError> {
    let sources = source::compile_all(&config.sources)?;
    let queue = open_queue(config)?;
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let mut ingress_addr = None;
    if role != Role::Worker {
        let listener = bind("ingress", config.ingress.listen).await?;
        let addr = listener.local_addr().map_err(|error| ServeError::Bind {
            what: "ingress",
            addr: config.ingress.listen,
            error,
        })?;
        let router = Ingress::new(&sources, Arc::clone(&queue), config.ingress.max_body_bytes)
            .router();
        tasks.push(spawn_server(listener, router, stop_rx.clone()));
        tracing::info!(%addr, sources = sources.len(), "ingress listening: POST /webhooks/{{source}}");
        if sources.is_empty() {
            tracing::warn!("no [[source]] configured: every webhook will answer 404");
        }
        ingress_addr = Some(addr);
    }

    let admin_listener = bind("admin", config.admin.listen).await?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|error| ServeError::Bind {
            what: "admin",
            addr: config.admin.listen,
            error,
        })?;
    let admin = Admin {
        metrics,
        queue: Arc::clone(&queue),
        token: config.admin.token.clone(),
    };
    tasks.push(spawn_server(admin_listener, admin.router(), stop_rx.clone()));
    tracing::info!(addr = %admin_addr, "admin listening: /metrics /queue/stats");

    Ok(Running {
        ingress_addr,
        admin_addr,
        queue,
        stop,
        tasks,
    })
}
