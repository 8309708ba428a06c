//! The ingress on generated requests (proptest, `PROPTEST_CASES`, 256 in
//! the suite; a long run is
//! `PROPTEST_CASES=1000000 cargo test --release -p breakwater --test ingress_fuzz`):
//! random methods, paths, headers and bodies against the real router and a
//! real embedded queue. None is accepted (no signature is valid), every
//! answer is a 4xx (or 503, never another 5xx), and nothing is enqueued.

use std::sync::Arc;

use axum::body::Body;
use breakwater::config::{SchemeName, SourceConfig};
use breakwater::ingress::Ingress;
use breakwater::queue::Queue;
use breakwater_queue_embedded::{EmbeddedConfig, EmbeddedQueue};
use http::{Method, Request};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tower::ServiceExt;

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        Just(Method::POST),
        Just(Method::POST),
        Just(Method::GET),
        Just(Method::PUT),
        Just(Method::DELETE),
        Just(Method::HEAD),
        Just(Method::OPTIONS),
        Just(Method::PATCH),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/webhooks/stripe".to_owned()),
        Just("/webhooks/github".to_owned()),
        Just("/webhooks/standard".to_owned()),
        Just("/webhooks/nope".to_owned()),
        Just("/webhooks/".to_owned()),
        Just("/".to_owned()),
        "/[a-z/%.]{0,20}",
    ]
}

fn header() -> impl Strategy<Value = (String, Vec<u8>)> {
    let name = prop_oneof![
        Just("stripe-signature".to_owned()),
        Just("x-hub-signature-256".to_owned()),
        Just("x-github-delivery".to_owned()),
        Just("webhook-id".to_owned()),
        Just("webhook-timestamp".to_owned()),
        Just("webhook-signature".to_owned()),
        Just("content-type".to_owned()),
        Just("content-encoding".to_owned()),
        "[a-z-]{1,12}",
    ];
    let value = prop_oneof![
        Just(b"t=1700000000,v1=00".to_vec()),
        Just(b"sha256=00".to_vec()),
        Just(b"application/json".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..64),
    ];
    (name, value)
}

#[test]
fn random_requests_get_a_4xx_and_enqueue_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Arc::new(EmbeddedQueue::open(&EmbeddedConfig::at(dir.path())).expect("queue"));
    let sources = breakwater::source::compile_all(&[
        SourceConfig::new("stripe", SchemeName::Stripe, vec!["whsec_fuzz".into()]),
        SourceConfig::new("github", SchemeName::Github, vec!["fuzz".into()]),
        SourceConfig::new(
            "standard",
            SchemeName::Standard,
            vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
        ),
    ])
    .expect("sources");
    let as_queue: Arc<dyn Queue> = queue.clone();
    let router = Ingress::new(&sources, as_queue, 4096).router();
    let mut runner = TestRunner::new(Config::default());
    let strategy = (
        method(),
        path(),
        proptest::collection::vec(header(), 0..5),
        proptest::collection::vec(any::<u8>(), 0..6000),
    );
    let cases = runner.config().cases;
    runner
        .run(&strategy, |(method, path, headers, body)| {
            let mut req = Request::builder().method(method).uri(path.as_str());
            for (name, value) in &headers {
                if let (Ok(n), Ok(v)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_bytes(value),
                ) {
                    req = req.header(n, v);
                }
            }
            // The health routes answer 200 by design: not webhooks.
            let health = ["/healthz", "/readyz"].contains(&path.as_str());
            let Ok(req) = req.body(Body::from(body)) else {
                return Ok(());
            };
            if health {
                return Ok(());
            }
            let status = rt
                .block_on(router.clone().oneshot(req))
                .expect("infallible")
                .status();
            prop_assert!(
                status.is_client_error() || status == http::StatusCode::SERVICE_UNAVAILABLE,
                "{} {} answered {}",
                headers.len(),
                path,
                status
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let stats = rt.block_on(queue.stats()).expect("stats");
    assert_eq!(stats.visible, Some(0), "something was enqueued: {stats:?}");
    eprintln!("{cases} generated requests: none accepted, none enqueued");
}
