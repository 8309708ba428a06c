//! The lab's webhook stream: signed Stripe-style events sent over real HTTP
//! at a fixed rate (open loop: a slow answer does not slow the sender).
//!
//! Entity keys: `hot_share` of the events go to the hot order (1042), the
//! rest spread over orders 1..=1000. In the poison scenario `poison_share`
//! of the events carry a status the `orders` table's CHECK refuses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use breakwater_verify::Scheme;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;

/// The order every hot-row scenario locks.
pub const HOT_ORDER: i64 = 1042;
/// Other orders: 1..=UNRELATED_ORDERS.
pub const UNRELATED_ORDERS: i64 = 1000;

/// What the driver sends.
#[derive(Debug, Clone)]
pub struct DriveSpec {
    pub url: String,
    pub secret: String,
    pub rate: f64,
    pub duration: Duration,
    pub hot_share: f64,
    pub poison_share: f64,
    /// Makes event ids unique per run.
    pub tag: String,
}

/// Counters the sampler reads while the driver runs.
#[derive(Debug, Default)]
pub struct DriveCounters {
    pub sent: AtomicU64,
    /// Answered 2xx: durably accepted.
    pub accepted: AtomicU64,
    pub accepted_poison: AtomicU64,
    pub refused: AtomicU64,
}

/// Sends the stream; returns when the last request is answered.
pub async fn drive(spec: DriveSpec, counters: Arc<DriveCounters>) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let in_flight = Arc::new(Semaphore::new(512));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x1042);
    let interval = Duration::from_secs_f64(1.0 / spec.rate.max(0.1));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = tokio::time::Instant::now() + spec.duration;
    let scheme = Scheme::stripe();
    let mut n: u64 = 0;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tick.tick().await;
        if tokio::time::Instant::now() >= end {
            break;
        }
        n += 1;
        let order = if rng.random_bool(spec.hot_share.clamp(0.0, 1.0)) {
            HOT_ORDER
        } else {
            rng.random_range(1..=UNRELATED_ORDERS)
        };
        let poison = rng.random_bool(spec.poison_share.clamp(0.0, 1.0));
        let status = if poison { "poison" } else { "paid" };
        let event_id = format!("evt_{}_{n}", spec.tag);
        let body = serde_json::json!({
            "id": event_id,
            "type": "order.updated",
            // When it was sent (wall clock, ms): the lab's service measures
            // each delivery's lag from it.
            "sent_ms": breakwater::ingress::unix_now_ms(),
            "data": {"object": {"id": order, "status": status}}
        })
        .to_string()
        .into_bytes();
        let Ok(headers) = breakwater_verify::sign(
            &scheme,
            &spec.secret,
            &body,
            breakwater::ingress::unix_now(),
            "",
        ) else {
            continue;
        };
        let mut req =
            http::Request::post(&spec.url).header(http::header::CONTENT_TYPE, "application/json");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let Ok(req) = req.body(Full::new(Bytes::from(body))) else {
            continue;
        };
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        counters.sent.fetch_add(1, Ordering::Relaxed);
        let (client, counters) = (client.clone(), Arc::clone(&counters));
        tasks.spawn(async move {
            let _permit = permit;
            let ok = match client.request(req).await {
                Ok(resp) => {
                    let ok = resp.status().is_success();
                    let _ = resp.into_body().collect().await;
                    ok
                }
                Err(_) => false,
            };
            if ok {
                counters.accepted.fetch_add(1, Ordering::Relaxed);
                if poison {
                    counters.accepted_poison.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                counters.refused.fetch_add(1, Ordering::Relaxed);
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}
