//! The faults the proxy can inject.
//!
//! A [`Fault`] is plain data; what each one does to new and live
//! connections, and the invariants kept, are described in the crate docs.
//! `ResetAll` is an action rather than a state: it is never stored, so
//! [`FaultProxy::fault`](crate::FaultProxy::fault) reports `None` after it.

use std::fmt;
use std::time::Duration;

/// What the proxy does to traffic. Set with [`FaultProxy::set`](crate::FaultProxy::set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Pass bytes through untouched.
    #[default]
    None,
    /// Delay every chunk forwarded, in both directions, by `per_chunk`
    /// (a far-away database, a slow network). Order is preserved; chunks
    /// are in flight together, as on a long link.
    Latency {
        /// How long each chunk is in flight.
        per_chunk: Duration,
    },
    /// Accept new connections and close them at once with RST; live
    /// connections keep working.
    Refuse,
    /// Accept new connections but forward nothing; live connections stop
    /// forwarding too. Bytes are read and swallowed, no answer is sent.
    Blackhole,
    /// One-shot: close every live connection now (RST), then behave as `None`.
    ResetAll,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::None => f.write_str("none"),
            Fault::Latency { per_chunk } => write!(f, "latency({per_chunk:?}/chunk)"),
            Fault::Refuse => f.write_str("refuse"),
            Fault::Blackhole => f.write_str("blackhole"),
            Fault::ResetAll => f.write_str("reset-all"),
        }
    }
}
