//! The state every task of a proxy shares: the control channel (fault,
//! reset generation, shutdown) and the counters, and the guard that counts
//! a connection as live. The accept loop (`proxy.rs`) and each connection
//! (`conn.rs`) both read it; neither imports the other's state.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use crate::fault::Fault;

/// What every task watches. `ResetAll` is applied as `resets += 1`.
#[derive(Debug, Default)]
pub(crate) struct Control {
    pub(crate) fault: Fault,
    pub(crate) resets: u64,
    pub(crate) shutdown: bool,
}

pub(crate) struct Shared {
    pub(crate) upstream: SocketAddr,
    pub(crate) control: watch::Sender<Control>,
    pub(crate) accepted: AtomicU64,
    pub(crate) live: AtomicU64,
    pub(crate) bytes_up: AtomicU64,
    pub(crate) bytes_down: AtomicU64,
}

impl Shared {
    /// The fault to apply to the chunk (or connection) at hand.
    pub(crate) fn fault(&self) -> Fault {
        self.control.borrow().fault
    }
}

/// Counts a connection as live for as long as it is held.
pub(crate) struct LiveGuard(Arc<Shared>);

impl LiveGuard {
    pub(crate) fn new(shared: &Arc<Shared>) -> Self {
        shared.live.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(shared))
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::Relaxed);
    }
}
