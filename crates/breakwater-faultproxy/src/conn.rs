//! One proxied connection: dial upstream, then relay each direction.
//!
//! Each direction is a reader and a writer: the reader reads a chunk (up to
//! [`CHUNK`] bytes), looks up the fault *for that chunk*, then
//!
//! - `Latency`: stamps it due `per_chunk` from now and queues it; the
//!   writer writes the queued chunks in order, each once it is due. So the
//!   latency is a delay in flight, as on a long link: requests a client
//!   pipelines overlap instead of each waiting behind the one before;
//! - `Blackhole`: drop the chunk and mark the connection blackholed; from
//!   then on both directions drop every chunk, whatever the fault, until the
//!   connection closes (a stream with a hole must never be resumed);
//! - anything else: queue it due now.
//!
//! End of stream is forwarded as a half-close (`shutdown` of the write side),
//! so request/response protocols that rely on it keep working; the
//! connection ends when both directions have. On a blackholed connection an
//! end of stream from either side ends the whole connection instead.
//!
//! The whole relay races one signal: "a `ResetAll` happened since accept, or
//! shutdown". When it fires, or on any I/O error (including failing to reach
//! upstream), both sockets are dropped with linger 0, so each peer sees a
//! reset rather than a clean end. The task ends exactly once either way.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::fault::Fault;
use crate::shared::{LiveGuard, Shared};

/// Largest chunk read (and delayed, or swallowed) at once.
const CHUNK: usize = 16 * 1024;
/// Most chunks on their way in one direction (read, not yet written):
/// past it the reader waits, as a full link would.
const IN_FLIGHT: usize = 256;

/// Closes a socket with RST (linger 0) when it is dropped.
pub(crate) fn reset(stream: &TcpStream) {
    if let Err(e) = stream.set_zero_linger() {
        tracing::debug!(error = %e, "could not set linger 0; closing with FIN");
    }
}

/// Serves one accepted client until it ends, fails, or is reset.
/// `fault` and `resets` are what the accept loop saw at accept time.
pub(crate) async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    fault: Fault,
    resets: u64,
    _live: LiveGuard,
) {
    let _ = client.set_nodelay(true);
    let mut control = shared.control.subscribe();
    let mut upstream = None;

    let ended = tokio::select! {
        biased;
        _ = control.wait_for(|c| c.shutdown || c.resets != resets) => {
            Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset by fault proxy"))
        }
        r = relay(&mut client, &mut upstream, &shared, fault) => r,
    };

    match ended {
        Ok(()) => tracing::debug!(%peer, "connection closed"),
        Err(e) => {
            tracing::debug!(%peer, reason = %e, "connection reset");
            reset(&client);
            if let Some(up) = &upstream {
                reset(up);
            }
        }
    }
}

async fn relay(
    client: &mut TcpStream,
    upstream: &mut Option<TcpStream>,
    shared: &Shared,
    fault: Fault,
) -> io::Result<()> {
    if fault == Fault::Blackhole {
        // Never dial upstream: swallow until the client gives up.
        let mut buf = vec![0; CHUNK];
        while client.read(&mut buf).await? != 0 {}
        return Ok(());
    }

    let up = upstream.insert(TcpStream::connect(shared.upstream).await?);
    let _ = up.set_nodelay(true);
    let blackholed = AtomicBool::new(false);
    let (client_rd, client_wr) = client.split();
    let (up_rd, up_wr) = up.split();
    tokio::try_join!(
        pipe(client_rd, up_wr, shared, &shared.bytes_up, &blackholed),
        pipe(up_rd, client_wr, shared, &shared.bytes_down, &blackholed),
    )?;
    Ok(())
}

/// Copies one direction chunk by chunk, applying the fault of the moment:
/// a reader stamps each chunk with the time it may leave (now, or now +
/// the latency), a writer sends them in order, each not before its time.
async fn pipe(
    from: ReadHalf<'_>,
    to: WriteHalf<'_>,
    shared: &Shared,
    forwarded: &AtomicU64,
    blackholed: &AtomicBool,
) -> io::Result<()> {
    let (tx, rx) = mpsc::channel(IN_FLIGHT);
    tokio::try_join!(
        read_side(from, tx, shared, blackholed),
        write_side(rx, to, forwarded)
    )?;
    Ok(())
}

/// A chunk on its way: its bytes and when they may leave. The reader
/// closing the channel is the end of the stream.
type InFlight = (Instant, Vec<u8>);

async fn read_side(
    mut from: ReadHalf<'_>,
    tx: mpsc::Sender<InFlight>,
    shared: &Shared,
    blackholed: &AtomicBool,
) -> io::Result<()> {
    let mut buf = vec![0; CHUNK];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            if blackholed.load(Ordering::Relaxed) {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "peer hung up on a blackholed connection",
                ));
            }
            return Ok(());
        }
        let now = Instant::now();
        let due = match shared.fault() {
            Fault::Blackhole => {
                blackholed.store(true, Ordering::Relaxed);
                continue;
            }
            _ if blackholed.load(Ordering::Relaxed) => continue,
            Fault::Latency { per_chunk } => now + per_chunk,
            Fault::None | Fault::Refuse | Fault::ResetAll => now,
        };
        if tx.send((due, buf[..n].to_vec())).await.is_err() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the other side stopped taking bytes",
            ));
        }
    }
}

async fn write_side(
    mut rx: mpsc::Receiver<InFlight>,
    mut to: WriteHalf<'_>,
    forwarded: &AtomicU64,
) -> io::Result<()> {
    while let Some((due, bytes)) = rx.recv().await {
        // No timer for a chunk already due (no fault): order is kept all
        // the same, as chunks leave one by one.
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        to.write_all(&bytes).await?;
        forwarded.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
    // The reader saw the end of the stream.
    to.shutdown().await
}
