//! A small HTTP/1.1 load generator for signed Stripe-style webhooks.
//!
//! Each of `concurrency` tasks owns one keep-alive connection and sends one
//! request at a time, either as fast as answers come (closed loop) or at a
//! fixed share of `rate` (open loop: send times kept by a thread of their
//! own, latency measured from the scheduled send time so a stalled server
//! cannot hide its delay). Every request carries a fresh event id and a
//! real `Stripe-Signature`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use breakwater_verify::Scheme;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// What to send, where and for how long.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub target: SocketAddr,
    pub path: String,
    pub concurrency: usize,
    pub body_bytes: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub secret: String,
    /// Makes event ids unique across runs.
    pub run_tag: String,
    /// Requests per second in total; `None` for as fast as possible.
    pub rate: Option<f64>,
    /// Name prefixes of the threads whose CPU time to read over the
    /// measured window (see [`LoadReport::cpu`]).
    pub cpu_of: Vec<&'static str>,
}

/// A request counts as late past this: the issue's p99 target at half the
/// peak rate.
pub const LATE: Duration = Duration::from_millis(5);

/// A successful request slower than [`LATE`]: when it was due (since the
/// measured window began) and how long it took, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Late {
    pub due_us: u64,
    pub latency_us: u32,
}

impl Late {
    fn done_us(self) -> u64 {
        self.due_us + u64::from(self.latency_us)
    }
}

/// Late requests that overlap in time, or follow each other within the
/// gap [`episodes`] was given: one stall, or one slow stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Episode {
    /// When its first request was due, since the measured window began.
    pub from_us: u64,
    /// When its last request was answered.
    pub to_us: u64,
    pub requests: usize,
    pub worst_us: u32,
}

/// Groups late requests into episodes, largest (most requests) first.
/// Tells a p99 made by a few stalls, where every connection waits at
/// once, from one made by slowness spread over the run.
pub fn episodes(late: &[Late], gap: Duration) -> Vec<Episode> {
    let gap_us = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
    let mut sorted = late.to_vec();
    sorted.sort_unstable_by_key(|l| l.due_us);
    let mut out: Vec<Episode> = Vec::new();
    for l in sorted {
        match out.last_mut() {
            Some(e) if l.due_us <= e.to_us.saturating_add(gap_us) => {
                e.to_us = e.to_us.max(l.done_us());
                e.requests += 1;
                e.worst_us = e.worst_us.max(l.latency_us);
            }
            _ => out.push(Episode {
                from_us: l.due_us,
                to_us: l.done_us(),
                requests: 1,
                worst_us: l.latency_us,
            }),
        }
    }
    out.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.from_us.cmp(&b.from_us)));
    out
}

/// What one run measured.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    /// Latencies of successful (2xx) requests, in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// The successful requests slower than [`LATE`], in no order.
    pub late: Vec<Late>,
    /// Non-2xx answers and transport errors.
    pub errors: u64,
    pub elapsed: Duration,
    /// Nanoseconds on a CPU over the measured window of the threads named
    /// by each of [`LoadSpec::cpu_of`], in that order (`None` where
    /// `/proc` could not say).
    pub cpu: Vec<Option<u64>>,
}

impl LoadReport {
    /// Mean latency of the successful requests, in ms (0 for none).
    pub fn mean_ms(&self) -> f64 {
        let n = self.latencies_us.len();
        if n == 0 {
            return 0.0;
        }
        self.latencies_us
            .iter()
            .map(|&us| f64::from(us))
            .sum::<f64>()
            / n as f64
            / 1000.0
    }

    /// Microseconds on a CPU per successful request of the threads named by
    /// the `i`-th entry of [`LoadSpec::cpu_of`].
    pub fn cpu_us_per_request(&self, i: usize) -> Option<f64> {
        let ns = (*self.cpu.get(i)?)?;
        let n = self.latencies_us.len();
        (n > 0).then(|| ns as f64 / 1e3 / n as f64)
    }
}

impl LoadReport {
    /// Successful requests per second.
    pub fn rate(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            0.0
        } else {
            self.latencies_us.len() as f64 / secs
        }
    }

    /// The `p`-th percentile latency in milliseconds (100 = max).
    pub fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * (self.latencies_us.len() - 1) as f64).round() as usize;
        f64::from(self.latencies_us[rank.min(self.latencies_us.len() - 1)]) / 1000.0
    }
}

/// A Stripe-style event of about `size` bytes.
pub fn stripe_body(event_id: &str, object_id: &str, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"id":"{event_id}","object":"event","type":"payment_intent.succeeded","api_version":"2024-06-20","data":{{"object":{{"id":"{object_id}","object":"payment_intent","amount":2000,"currency":"usd","status":"succeeded","description":""#
    );
    let tail = r#""}}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    body.resize(head.len() + pad, b'x');
    body.extend_from_slice(tail.as_bytes());
    body
}

/// Sends the load and measures it.
pub async fn run(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    let start = Instant::now();
    let measure_from = start + spec.warmup;
    let end = measure_from + spec.duration;
    let mut schedules: Vec<Option<_>> = match spec.rate {
        Some(rate) => pace(rate, spec.concurrency, start, end)?
            .into_iter()
            .map(Some)
            .collect(),
        None => (0..spec.concurrency).map(|_| None).collect(),
    };
    let cpu = watch_cpu(spec.cpu_of.clone(), measure_from, end)?;
    let mut tasks = Vec::with_capacity(spec.concurrency);
    for (worker, schedule) in schedules.drain(..).enumerate() {
        let spec = spec.clone();
        tasks.push(tokio::spawn(async move {
            worker_loop(spec, worker, measure_from, end, schedule).await
        }));
    }
    let mut report = LoadReport::default();
    for t in tasks {
        let outcome = t.await.context("load task panicked")??;
        report.latencies_us.extend(outcome.latencies_us);
        report.late.extend(outcome.late);
        report.errors += outcome.errors;
    }
    report.elapsed = end.saturating_duration_since(measure_from);
    report.latencies_us.sort_unstable();
    report.cpu = cpu.join().unwrap_or_default();
    Ok(report)
}

/// Reads the CPU time of the threads named by each prefix at `from` and at
/// `to`, from a thread of its own (tokio's timer would add up to a
/// millisecond of lateness), and gives the differences.
fn watch_cpu(
    prefixes: Vec<&'static str>,
    from: Instant,
    to: Instant,
) -> anyhow::Result<std::thread::JoinHandle<Vec<Option<u64>>>> {
    let read = move |prefixes: &[&str]| -> Vec<Option<u64>> {
        prefixes
            .iter()
            .map(|p| super::threads::times(p).map(|t| t.on_cpu_ns))
            .collect()
    };
    std::thread::Builder::new()
        .name("bench-cpu-watch".into())
        .spawn(move || {
            sleep_until(from);
            let before = read(&prefixes);
            sleep_until(to);
            let after = read(&prefixes);
            before
                .into_iter()
                .zip(after)
                .map(|(b, a)| Some(a?.saturating_sub(b?)))
                .collect()
        })
        .context("cannot start the CPU watch thread")
}

/// Send times of an open-loop load: `rate` per second from `start` until
/// `end`, dealt round-robin to `connections` queues.
///
/// A thread of its own keeps the time: tokio's timer fires on whole
/// milliseconds, which added up to a millisecond of the client's own
/// lateness to every latency (bare hyper read 1.3 ms at its p50 at 7k/s).
/// A send time waits in its connection's queue while that connection is
/// still busy, and latency counts from the send time, so a slow answer
/// delays the sends behind it and they are measured late, not omitted.
fn pace(
    rate: f64,
    connections: usize,
    start: Instant,
    end: Instant,
) -> anyhow::Result<Vec<mpsc::UnboundedReceiver<Instant>>> {
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..connections).map(|_| mpsc::unbounded_channel()).unzip();
    let every = Duration::from_secs_f64(1.0 / rate.max(f64::MIN_POSITIVE));
    std::thread::Builder::new()
        .name("bench-pacer".into())
        .spawn(move || {
            let mut at = start;
            for to in senders.iter().cycle() {
                if at >= end {
                    break;
                }
                sleep_until(at);
                if to.send(at).is_err() {
                    break;
                }
                at += every;
            }
        })
        .context("cannot start the pacing thread")?;
    Ok(receivers)
}

/// Blocks the calling thread until `at` (at once if it has passed).
fn sleep_until(at: Instant) {
    if let Some(wait) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

async fn connect(
    target: SocketAddr,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(target)
        .await
        .with_context(|| format!("cannot connect to {target}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// What one connection measured.
#[derive(Default)]
struct Measured {
    latencies_us: Vec<u32>,
    late: Vec<Late>,
    errors: u64,
}

async fn worker_loop(
    spec: LoadSpec,
    worker: usize,
    measure_from: Instant,
    end: Instant,
    mut schedule: Option<mpsc::UnboundedReceiver<Instant>>,
) -> anyhow::Result<Measured> {
    let scheme = Scheme::Stripe {
        tolerance: Duration::from_secs(300),
    };
    let mut sender = connect(spec.target).await?;
    let mut measured = Measured::default();
    let mut n: u64 = 0;
    loop {
        // Signed before its send time: preparing it is not the server's
        // latency.
        n += 1;
        let event_id = format!("evt_{}_{worker}_{n}", spec.run_tag);
        let object_id = format!("pi_{}", n % 1000);
        let body = stripe_body(&event_id, &object_id, spec.body_bytes);
        let now_unix = breakwater::ingress::unix_now();
        let headers = breakwater_verify::sign(&scheme, &spec.secret, &body, now_unix, &event_id)
            .context("signing failed")?;
        let mut request = hyper::Request::post(&spec.path)
            .header(http::header::HOST, "bench")
            .header(http::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(Bytes::from(body)))?;
        let scheduled = match &mut schedule {
            Some(times) => match times.recv().await {
                Some(at) => at,
                None => break,
            },
            None => Instant::now(),
        };
        if scheduled >= end {
            break;
        }
        if sender.ready().await.is_err() {
            sender = connect(spec.target).await?;
        }
        let ok = match sender.send_request(request).await {
            Ok(response) => {
                let ok = response.status().is_success();
                let _ = response.into_body().collect().await;
                ok
            }
            Err(_) => {
                sender = connect(spec.target).await?;
                false
            }
        };
        let done = Instant::now();
        if scheduled >= measure_from && done <= end + Duration::from_secs(5) {
            if ok {
                let took = done.duration_since(scheduled);
                let latency_us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
                measured.latencies_us.push(latency_us);
                if took > LATE {
                    let due = scheduled.duration_since(measure_from).as_micros();
                    measured.late.push(Late {
                        due_us: u64::try_from(due).unwrap_or(u64::MAX),
                        latency_us,
                    });
                }
            } else {
                measured.errors += 1;
            }
        }
    }
    Ok(measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_request_divides_by_successful_requests() {
        let report = LoadReport {
            latencies_us: vec![100, 200, 300, 400],
            late: Vec::new(),
            errors: 3,
            elapsed: Duration::from_secs(1),
            cpu: vec![Some(8_000), None],
        };
        assert_eq!(report.cpu_us_per_request(0), Some(2.0));
        assert_eq!(report.cpu_us_per_request(1), None, "unreadable");
        assert_eq!(report.cpu_us_per_request(2), None, "not asked for");
        let idle = LoadReport {
            cpu: vec![Some(8_000)],
            ..LoadReport::default()
        };
        assert_eq!(idle.cpu_us_per_request(0), None, "no requests");
        assert_eq!(idle.mean_ms(), 0.0);
        assert!((report.mean_ms() - 0.25).abs() < 1e-12);
    }

    fn late(due_ms: u64, latency_ms: u32) -> Late {
        Late {
            due_us: due_ms * 1000,
            latency_us: latency_ms * 1000,
        }
    }

    #[test]
    fn overlapping_late_requests_make_one_episode_and_the_largest_comes_first() {
        let gap = Duration::from_millis(10);
        let found = episodes(
            &[
                // A lone slow request at 900 ms.
                late(900, 6),
                // A 40 ms stall at 100 ms: every request due during it is
                // late, later ones by less; given out of order.
                late(130, 12),
                late(100, 40),
                late(110, 31),
                // Due 9 ms after the stall's last answer (at 142 ms): the
                // same episode.
                late(151, 6),
                // 30 ms after: a new one.
                late(187, 7),
            ],
            gap,
        );
        assert_eq!(
            found,
            vec![
                Episode {
                    from_us: 100_000,
                    to_us: 157_000,
                    requests: 4,
                    worst_us: 40_000,
                },
                Episode {
                    from_us: 187_000,
                    to_us: 194_000,
                    requests: 1,
                    worst_us: 7_000,
                },
                Episode {
                    from_us: 900_000,
                    to_us: 906_000,
                    requests: 1,
                    worst_us: 6_000,
                },
            ]
        );
        assert!(episodes(&[], gap).is_empty());
    }
}
