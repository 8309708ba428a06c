//! The proxy handle and its accept loop.
//!
//! All state lives in [`Shared`] (`shared.rs`): one `watch` channel carrying [`Control`]
//! (the current fault, a reset generation and the shutdown flag) plus atomic
//! counters. The `watch` channel is the single source of truth and the
//! wake-up mechanism at once:
//!
//! - each direction's reader reads the current fault per chunk (`Sender::borrow`, a cheap
//!   read lock);
//! - each connection task waits for "`resets` moved past the value seen at
//!   accept, or `shutdown`", and on that closes both sockets with RST;
//! - the accept loop waits for `shutdown`, stops listening, and joins every
//!   connection task, so [`FaultProxy::shutdown`] returns with nothing live.
//!
//! The accept loop holds only `Arc<Shared>`, never the handle, so dropping
//! the last [`FaultProxy`] clone raises `shutdown` and the loop ends.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::conn;
use crate::fault::Fault;
use crate::shared::{Control, LiveGuard, Shared};

/// Counters since the proxy started. All values are a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyStats {
    /// Connections accepted, including the ones `Refuse` closed at once.
    pub accepted: u64,
    /// Connections open right now (client side accepted and not yet closed).
    pub live: u64,
    /// Bytes forwarded client -> upstream (swallowed bytes not counted).
    pub bytes_up: u64,
    /// Bytes forwarded upstream -> client (swallowed bytes not counted).
    pub bytes_down: u64,
}

/// A running fault-injection proxy. Cheap to clone; all clones control the
/// same proxy. See the crate docs for what each [`Fault`] does.
#[derive(Clone)]
pub struct FaultProxy {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    accept_task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Last handle gone without `shutdown()`: stop anyway, don't wait.
        self.shared.control.send_modify(|c| c.shutdown = true);
    }
}

impl FaultProxy {
    /// Binds `listen` (port 0 picks a free port, see [`local_addr`](Self::local_addr))
    /// and starts forwarding to `upstream` with [`Fault::None`].
    ///
    /// The upstream is dialled per accepted connection, so it need not be up yet.
    /// Must be called inside a tokio runtime.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            control: watch::Sender::new(Control::default()),
            accepted: AtomicU64::new(0),
            live: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        tracing::info!(proxy = %local_addr, %upstream, "fault proxy listening");
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                local_addr,
                accept_task: Mutex::new(Some(accept_task)),
            }),
        })
    }

    /// The address clients should connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The upstream every connection is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.inner.shared.upstream
    }

    /// Switches the fault. Takes effect at once for new connections and for
    /// the next chunk read on live ones; `ResetAll` closes every live
    /// connection now and leaves the fault at `None`.
    pub fn set(&self, fault: Fault) {
        self.inner.shared.control.send_modify(|c| match fault {
            Fault::ResetAll => {
                c.resets += 1;
                c.fault = Fault::None;
            }
            other => c.fault = other,
        });
        tracing::info!(proxy = %self.inner.local_addr, %fault, "fault set");
    }

    /// The fault in force (never `ResetAll`, which is one-shot).
    pub fn fault(&self) -> Fault {
        self.inner.shared.fault()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.inner.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            live: s.live.load(Ordering::Relaxed),
            bytes_up: s.bytes_up.load(Ordering::Relaxed),
            bytes_down: s.bytes_down.load(Ordering::Relaxed),
        }
    }

    /// Stops listening and closes every live connection (RST), returning once
    /// all of them are closed. Other clones then control a stopped proxy.
    pub async fn shutdown(self) {
        self.inner.shared.control.send_modify(|c| c.shutdown = true);
        let task = self
            .inner
            .accept_task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // `None`: another clone already shut the proxy down.
        let Some(task) = task else { return };
        if let Err(e) = task.await {
            tracing::warn!(proxy = %self.inner.local_addr, error = %e, "accept loop failed");
        }
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("local_addr", &self.inner.local_addr)
            .field("upstream", &self.inner.shared.upstream)
            .field("fault", &self.fault())
            .finish()
    }
}

async fn shutdown_requested(control: &mut watch::Receiver<Control>) {
    // The sender lives in `Shared`, which the caller keeps alive, so this
    // only returns once `shutdown` is set.
    let _ = control.wait_for(|c| c.shutdown).await;
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut control = shared.control.subscribe();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = shutdown_requested(&mut control) => break,
            // Reap finished connection tasks so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    // Read fault and reset generation together: a ResetAll
                    // after this point closes this connection too.
                    let (fault, resets) = {
                        let c = shared.control.borrow();
                        (c.fault, c.resets)
                    };
                    if fault == Fault::Refuse {
                        tracing::debug!(%peer, "refused");
                        conn::reset(&client);
                        continue;
                    }
                    let live = LiveGuard::new(&shared);
                    conns.spawn(conn::serve(client, peer, Arc::clone(&shared), fault, resets, live));
                }
                Err(e) => {
                    // e.g. EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        }
    }
    drop(listener);
    // Every connection task sees `shutdown` and closes its sockets.
    while conns.join_next().await.is_some() {}
    tracing::info!("fault proxy stopped");
}
