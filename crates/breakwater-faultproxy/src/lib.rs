//! A small TCP fault-injection proxy for the outage lab (a toxiproxy stand-in).
//!
//! [`FaultProxy`] listens on one address and forwards every accepted
//! connection to one upstream (in the lab: Breakwater's PostgreSQL sink ->
//! proxy -> a real PostgreSQL). The lab flips a [`Fault`] at any time with
//! [`FaultProxy::set`]; the proxy consults it when a connection is accepted
//! and again for every chunk it reads, so a change takes effect at once for
//! new connections and new chunks.
//!
//! # Behaviour per fault
//!
//! | fault       | new connections                          | live connections                               |
//! |-------------|------------------------------------------|------------------------------------------------|
//! | `None`      | connected to upstream, bytes pass as-is  | bytes pass as-is                               |
//! | `Latency`   | connected to upstream                    | every chunk arrives `per_chunk` after it was sent, each direction |
//! | `Refuse`    | accepted, then closed at once with RST   | keep working                                   |
//! | `Blackhole` | accepted, never connected upstream, every byte swallowed | every further byte swallowed   |
//! | `ResetAll`  | (one-shot, then behaves as `None`)       | closed with RST, now                           |
//!
//! # Invariants
//!
//! - **Order.** Each direction of a connection is one reader queueing
//!   chunks and one writer writing them in the order read, each once it is
//!   due (`Latency`: `per_chunk` after it was read), so bytes are never
//!   reordered, and pipelined chunks are in flight together as on a long
//!   link.
//! - **Blackhole never forwards a byte** read while it is set. A connection
//!   that has swallowed a byte stays blackholed until it closes, even after
//!   the fault is lifted: resuming would hand the peer a stream with a hole
//!   in it, a protocol desync no real outage produces. Such a connection
//!   ends when either side hangs up (or on `ResetAll`/shutdown); lifting the
//!   fault only helps new connections.
//! - **`ResetAll` closes every connection live at the moment of the call
//!   exactly once** (each connection task ends once, dropping both sockets
//!   with linger 0), and leaves the fault at `None`; connections accepted
//!   afterwards are untouched.
//! - **Upstream down.** When the upstream cannot be reached, the client is
//!   closed with RST: the same thing a client sees from a dead database.
//! - **Shutdown** stops listening and closes every live connection before
//!   [`FaultProxy::shutdown`] returns. Dropping the last handle does the same,
//!   without waiting.
//!
//! # Example
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use breakwater_faultproxy::{Fault, FaultProxy};
//!
//! # async fn lab() -> std::io::Result<()> {
//! let listen = SocketAddr::from(([127, 0, 0, 1], 0));
//! let postgres = SocketAddr::from(([127, 0, 0, 1], 5432));
//! let proxy = FaultProxy::start(listen, postgres).await?;
//! // point the sink at proxy.local_addr(), then:
//! proxy.set(Fault::Latency { per_chunk: Duration::from_millis(200) });
//! proxy.set(Fault::ResetAll);
//! proxy.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod conn;
mod fault;
mod proxy;
mod shared;

pub use fault::Fault;
pub use proxy::{FaultProxy, ProxyStats};
