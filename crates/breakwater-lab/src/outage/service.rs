//! The lab's internal HTTP service, for `breakwater lab <scenario> --sink
//! http`: what the forward sink protects in place of a database.
//!
//! It is a service of bounded capacity: [`WORKERS`] requests are handled
//! at once, each taking [`WORK`]; more wait their turn, as in a real
//! service's worker pool. It records the first successful delivery of each
//! event id (a forwarded webhook is delivered at most once as far as the
//! lab counts; duplicates are answered 200 again) with the event's lag:
//! the time since the driver sent it (`sent_ms` in the body).
//!
//! `GET /probe` goes through the same workers: its latency is the
//! service's latency for an unrelated client, the lab's probe.
//!
//! What the scenarios make it do ([`Behaviour`]):
//!
//! | behaviour | answer to a webhook |
//! |---|---|
//! | `Healthy` | 200 after [`WORK`] (422 for a poison event) |
//! | `Erroring` | 503 at once |
//! | `Hanging` | nothing until the behaviour changes, then 503 (the service restarted) |
//! | `KeyLocked` | order 1042 waits like `Hanging`; the others as `Healthy` |

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{Semaphore, watch};

use super::driver::HOT_ORDER;

/// Requests the service handles at once.
pub const WORKERS: usize = 16;
/// What one request costs the service.
pub const WORK: Duration = Duration::from_millis(2);

/// How the service answers the webhooks, set by the scenario's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Healthy,
    Erroring,
    Hanging,
    /// A lock in the service on the hot order.
    KeyLocked,
}

/// One event's first successful delivery.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    sent_ms: i64,
    lag_ms: f64,
    hot: bool,
}

#[derive(Debug)]
struct State {
    behaviour: watch::Sender<Behaviour>,
    workers: Semaphore,
    delivered: Mutex<HashMap<String, Delivery>>,
    /// Webhook requests received and not answered yet.
    in_flight: AtomicU64,
}

/// The running service.
pub struct LabService {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

/// A webhook as the service reads it.
#[derive(serde::Deserialize)]
struct Webhook {
    id: String,
    #[serde(default)]
    sent_ms: i64,
    data: WebhookData,
}

#[derive(serde::Deserialize)]
struct WebhookData {
    object: WebhookObject,
}

#[derive(serde::Deserialize)]
struct WebhookObject {
    id: i64,
    status: String,
}

impl LabService {
    /// Listens on a loopback port of its own.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            behaviour: watch::Sender::new(Behaviour::Healthy),
            workers: Semaphore::new(WORKERS),
            delivered: Mutex::new(HashMap::new()),
            in_flight: AtomicU64::new(0),
        });
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req| answer(Arc::clone(&state), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, behaviour: Behaviour) {
        self.state.behaviour.send_replace(behaviour);
    }

    /// Events delivered (first successes): (hot order, the others).
    pub fn delivered(&self) -> (u64, u64) {
        let delivered = self.deliveries();
        let hot = delivered.values().filter(|d| d.hot).count() as u64;
        (hot, delivered.len() as u64 - hot)
    }

    /// Webhook requests received and not answered yet.
    pub fn held(&self) -> u64 {
        self.state.in_flight.load(Ordering::Relaxed)
    }

    /// The lags of the events not for the hot order sent in
    /// `[from_ms, to_ms)` (wall clock), milliseconds.
    pub fn unrelated_lags(&self, from_ms: i64, to_ms: i64) -> Vec<f64> {
        self.deliveries()
            .values()
            .filter(|d| !d.hot && d.sent_ms >= from_ms && d.sent_ms < to_ms)
            .map(|d| d.lag_ms)
            .collect()
    }

    fn deliveries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Delivery>> {
        self.state
            .delivered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn shutdown(self) {
        self.task.abort();
    }
}

/// Counts a webhook request in flight for as long as it lives.
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn answer(
    state: Arc<State>,
    req: http::Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let reply = |status: StatusCode| {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = status;
        Ok(r)
    };
    if req.method() == Method::GET && req.uri().path() == "/probe" {
        let _worker = state.workers.acquire().await;
        tokio::time::sleep(WORK).await;
        return reply(StatusCode::OK);
    }
    state.in_flight.fetch_add(1, Ordering::Relaxed);
    let _counted = InFlight(&state.in_flight);
    let body = req.into_body().collect().await?.to_bytes();
    let Ok(webhook) = serde_json::from_slice::<Webhook>(&body) else {
        return reply(StatusCode::BAD_REQUEST);
    };
    let hot = webhook.data.object.id == HOT_ORDER;
    let behaviour = *state.behaviour.borrow();
    let held = match behaviour {
        Behaviour::Erroring => return reply(StatusCode::SERVICE_UNAVAILABLE),
        Behaviour::Hanging => true,
        Behaviour::KeyLocked => hot,
        Behaviour::Healthy => false,
    };
    if held {
        // Until the fault ends; the service then fails what it held.
        let mut changes = state.behaviour.subscribe();
        let _ = changes.wait_for(|b| *b != behaviour).await;
        return reply(StatusCode::SERVICE_UNAVAILABLE);
    }
    let _worker = state.workers.acquire().await;
    tokio::time::sleep(WORK).await;
    if webhook.data.object.status == "poison" {
        return reply(StatusCode::UNPROCESSABLE_ENTITY);
    }
    let now_ms = breakwater::ingress::unix_now_ms();
    let mut delivered = state
        .delivered
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    delivered.entry(webhook.id).or_insert(Delivery {
        sent_ms: webhook.sent_ms,
        lag_ms: (now_ms - webhook.sent_ms) as f64,
        hot,
    });
    drop(delivered);
    reply(StatusCode::OK)
}

/// How long `GET /probe` took, milliseconds (none if it failed).
pub async fn time_probe(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
    addr: SocketAddr,
) -> Option<f64> {
    let started = Instant::now();
    let request = http::Request::get(format!("http://{addr}/probe"))
        .body(Full::new(Bytes::new()))
        .ok()?;
    let response = tokio::time::timeout(Duration::from_secs(5), client.request(request))
        .await
        .ok()?
        .ok()?;
    let ok = response.status().is_success();
    let _ = response.into_body().collect().await;
    ok.then(|| started.elapsed().as_secs_f64() * 1000.0)
}
