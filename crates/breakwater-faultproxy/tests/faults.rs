//! Each fault over real sockets: client -> FaultProxy -> echo server, all on
//! 127.0.0.1 port 0. Timing asserts are lower bounds only; "nothing arrives"
//! is checked with short timeouts, and "closed" means EOF or an error.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use breakwater_faultproxy::{Fault, FaultProxy, ProxyStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

/// Upstream that echoes every byte back until the peer closes.
async fn echo_server() -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = stream.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    Ok(addr)
}

async fn proxy_to_echo() -> io::Result<FaultProxy> {
    let upstream = echo_server().await?;
    FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
}

/// Writes `msg` and expects it echoed back within a second.
async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> io::Result<()> {
    stream.write_all(msg).await?;
    let mut buf = vec![0; msg.len()];
    timeout(Duration::from_secs(1), stream.read_exact(&mut buf))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no echo within 1s"))??;
    assert_eq!(buf, msg);
    Ok(())
}

/// A fresh connection through the proxy that has been echoed once.
async fn connected(proxy: &FaultProxy) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect(proxy.local_addr()).await?;
    let before = proxy.stats().bytes_down;
    round_trip(&mut stream, b"hello").await?;
    // The proxy counts what it forwarded after the write returned: the
    // echo can reach the client first. Wait for the count to catch up, so
    // a caller's snapshot taken now is settled.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while proxy.stats().bytes_down < before + 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(stream)
}

/// True if the stream reads EOF or an error (not data) within a second.
async fn sees_close(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 64];
    matches!(
        timeout(Duration::from_secs(1), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// True if a new connection to `addr` is closed without an answer. The RST
/// can beat `connect` itself, so a failed connect counts as closed too.
async fn dial_is_closed(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return true;
    };
    let _ = stream.write_all(b"anyone?").await; // may already fail with RST
    sees_close(&mut stream).await
}

/// True if nothing at all (data, EOF or error) arrives within `wait`.
async fn stays_silent(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0; 64];
    timeout(wait, stream.read(&mut buf)).await.is_err()
}

/// Polls the stats until `cond` holds (tasks update counters asynchronously).
async fn stats_until(proxy: &FaultProxy, cond: impl Fn(&ProxyStats) -> bool) -> ProxyStats {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stats = proxy.stats();
        if cond(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "stats never matched: {stats:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_round_trips_bytes_in_order() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let mut stream = connected(&proxy).await?;

    // Several chunks' worth, written and read concurrently.
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (mut rd, mut wr) = stream.split();
    let mut echoed = vec![0; payload.len()];
    let (w, r) = tokio::join!(wr.write_all(&payload), rd.read_exact(&mut echoed));
    w?;
    r?;
    assert!(echoed == payload, "echo differs from payload");

    let total = (payload.len() + b"hello".len()) as u64;
    let stats = proxy.stats();
    assert_eq!((stats.bytes_up, stats.bytes_down), (total, total));
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_delays_each_direction_and_keeps_order() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let mut live = connected(&proxy).await?;
    let per_chunk = Duration::from_millis(60);
    proxy.set(Fault::Latency { per_chunk });
    assert_eq!(proxy.fault(), Fault::Latency { per_chunk });

    // Applies to a connection opened before the fault, and to a new one.
    for stream in [
        &mut live,
        &mut TcpStream::connect(proxy.local_addr()).await?,
    ] {
        let started = Instant::now();
        round_trip(stream, b"ping").await?;
        let took = started.elapsed();
        assert!(took >= 2 * per_chunk, "round trip took {took:?}");
    }

    // Separate small writes, each possibly its own delayed chunk, stay in order.
    proxy.set(Fault::Latency {
        per_chunk: Duration::from_millis(10),
    });
    for i in 0..5u8 {
        live.write_all(&[i]).await?;
    }
    let mut buf = [0; 5];
    timeout(Duration::from_secs(1), live.read_exact(&mut buf)).await??;
    assert_eq!(buf, [0, 1, 2, 3, 4]);

    proxy.shutdown().await;
    Ok(())
}

/// Latency is a delay in flight, not a pause per chunk: two one-byte
/// chunks sent 20 ms apart are both back about one round trip (2 x 300 ms)
/// after the second was sent, about 620 ms in; a proxy that slept before
/// each write would hold the second behind the first in each direction,
/// and return it after about 900 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_overlaps_chunks_in_flight() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let mut live = connected(&proxy).await?;
    let per_chunk = Duration::from_millis(300);
    proxy.set(Fault::Latency { per_chunk });
    let started = Instant::now();
    live.write_all(&[0]).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    live.write_all(&[1]).await?;
    let mut buf = [0; 2];
    timeout(Duration::from_secs(5), live.read_exact(&mut buf)).await??;
    let took = started.elapsed();
    assert_eq!(buf, [0, 1]);
    assert!(took >= 2 * per_chunk, "back after {took:?}");
    assert!(
        took < per_chunk * 5 / 2,
        "the second chunk waited behind the first: {took:?}"
    );
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_closes_new_connections_only() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let mut live = connected(&proxy).await?;
    proxy.set(Fault::Refuse);

    assert!(
        dial_is_closed(proxy.local_addr()).await,
        "refused connection got data or hung"
    );

    round_trip(&mut live, b"still here").await?;

    proxy.set(Fault::None);
    let _again = connected(&proxy).await?;
    let stats = stats_until(&proxy, |s| s.live == 2).await;
    assert_eq!(stats.accepted, 3);
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_forwards_nothing_until_lifted_for_new_connections() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let mut live = connected(&proxy).await?;
    proxy.set(Fault::Blackhole);
    let before = proxy.stats();

    let mut fresh = TcpStream::connect(proxy.local_addr()).await?;
    live.write_all(b"into the void").await?;
    fresh.write_all(b"into the void").await?;
    let wait = Duration::from_millis(300);
    let (live_silent, fresh_silent) = tokio::join!(
        stays_silent(&mut live, wait),
        stays_silent(&mut fresh, wait)
    );
    assert!(
        live_silent,
        "live connection got an answer through a blackhole"
    );
    assert!(
        fresh_silent,
        "new connection got an answer through a blackhole"
    );
    let after = proxy.stats();
    assert_eq!(
        (after.bytes_up, after.bytes_down),
        (before.bytes_up, before.bytes_down)
    );

    proxy.set(Fault::None);
    connected(&proxy).await?;
    // A connection that lost bytes is never resumed.
    live.write_all(b"hello?").await?;
    assert!(stays_silent(&mut live, Duration::from_millis(100)).await);

    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_closes_live_connections_once() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let mut a = connected(&proxy).await?;
    let mut b = connected(&proxy).await?;
    // A blackholed connection (no upstream) is closed too.
    proxy.set(Fault::Blackhole);
    let mut c = TcpStream::connect(proxy.local_addr()).await?;
    stats_until(&proxy, |s| s.live == 3).await;

    proxy.set(Fault::ResetAll);
    assert_eq!(proxy.fault(), Fault::None, "ResetAll is one-shot");
    assert!(sees_close(&mut a).await, "a survived ResetAll");
    assert!(sees_close(&mut b).await, "b survived ResetAll");
    assert!(sees_close(&mut c).await, "c survived ResetAll");
    stats_until(&proxy, |s| s.live == 0).await;

    let mut after = connected(&proxy).await?;
    round_trip(&mut after, b"again").await?;
    assert_eq!(proxy.stats().live, 1);
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_accepted_and_live_and_shutdown_closes_all() -> io::Result<()> {
    let proxy = proxy_to_echo().await?;
    let a = connected(&proxy).await?;
    let mut b = connected(&proxy).await?;
    let mut c = connected(&proxy).await?;
    let stats = proxy.stats();
    assert_eq!((stats.accepted, stats.live), (3, 3));

    drop(a);
    stats_until(&proxy, |s| s.live == 2).await;
    assert_eq!(proxy.stats().accepted, 3);

    let addr = proxy.local_addr();
    let handle = proxy.clone();
    proxy.shutdown().await;
    assert_eq!(handle.stats().live, 0);
    assert!(sees_close(&mut b).await);
    assert!(sees_close(&mut c).await);
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_closes_the_client() -> io::Result<()> {
    // A port that was free a moment ago: nothing listens there.
    let dead = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), dead).await?;
    assert!(dial_is_closed(proxy.local_addr()).await);
    stats_until(&proxy, |s| s.accepted == 1 && s.live == 0).await;
    proxy.shutdown().await;
    Ok(())
}
