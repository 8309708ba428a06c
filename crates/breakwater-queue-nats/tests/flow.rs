//! The breaker's flow on JetStream, asserted from the server's own
//! consumer counters: half-open a claim takes no more than the probes, and
//! each ramp step raises how many one claim may take, step by step. Against
//! the server on 127.0.0.1:4222 (`BREAKWATER_TEST_NATS_URL`), on streams of
//! the test's own, removed after; the server being unreachable is a
//! failure, never a skip.

use std::time::Duration;

use breakwater_queue::{Flow, NewMessage, OpenMode, Queue};
use breakwater_queue_nats::{Names, NatsConfig, NatsQueue};
use bytes::Bytes;

fn url() -> String {
    std::env::var("BREAKWATER_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

struct Streams(String);

impl Drop for Streams {
    fn drop(&mut self) {
        NatsQueue::destroy_blocking(&url(), &self.0);
    }
}

/// Messages delivered and not acknowledged, as the server counts them.
async fn ack_pending(name: &str) -> usize {
    let client = async_nats::connect(url()).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let names = Names::of(name);
    let stream = js.get_stream(&names.stream).await.expect("stream");
    stream
        .consumer_info(&names.consumer)
        .await
        .expect("consumer info")
        .num_ack_pending
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_takes_the_probes_and_the_ramp_raises_the_fetch_step_by_step() {
    let streams = Streams(format!("bwflow_{}", std::process::id()));
    let q = NatsQueue::open(
        &url(),
        &streams.0,
        Duration::from_secs(60),
        &NatsConfig::default(),
        OpenMode::Serve,
    )
    .await
    .unwrap_or_else(|e| panic!("NATS at {} is unreachable ({e}); this test needs it", url()));
    for i in 0..40 {
        q.enqueue(NewMessage {
            source: "flow".into(),
            event_id: format!("flow-{i}"),
            entity_key: None,
            headers: Vec::new(),
            body: Bytes::from_static(b"{}"),
            received_at_ms: 0,
        })
        .await
        .expect("enqueue");
    }
    q.set_flow(Flow::Paused).await.expect("pause");
    assert!(
        q.claim(10, Duration::from_secs(60))
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(ack_pending(&streams.0).await, 0, "a delivery while paused");

    let mut outstanding = 0;
    for (flow, most) in [
        (Flow::Probing { probes: 1 }, 1),
        (Flow::Flowing { limit: 2 }, 2),
        (Flow::Flowing { limit: 4 }, 4),
        (Flow::Flowing { limit: 8 }, 8),
    ] {
        q.set_flow(flow).await.expect("flow");
        let got = q.claim(100, Duration::from_secs(60)).await.expect("claim");
        assert!(!got.is_empty(), "{flow:?}: nothing claimed");
        assert!(got.len() <= most, "{flow:?}: a claim of {}", got.len());
        outstanding += got.len();
        assert_eq!(
            ack_pending(&streams.0).await,
            outstanding,
            "{flow:?}: the server handed out more than was claimed"
        );
    }
}
