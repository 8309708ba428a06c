//! The conformance suite: one generic set of checks that every queue
//! backend runs against a live instance of itself, so the workers can rely
//! on the same contract whatever holds the messages.
//!
//! A backend's test file implements [`Harness`] (how to open a fresh queue,
//! and the same one again as after a restart) and expands
//! [`conformance_tests!`](crate::conformance_tests), which makes one
//! `#[tokio::test]` per check below:
//!
//! ```ignore
//! breakwater_queue::conformance_tests!(MyHarness::new().await);
//! ```
//!
//! Each check asserts the contract as [`crate::Queue`] documents it, within
//! what the backend declares in [`Capabilities`]: a backend without native
//! deduplication must never invent a duplicate; stats are compared only for
//! the fields the backend says it fills in. Counts a broker reports
//! approximately are awaited for a few seconds before they are compared.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use crate::{
    Capabilities, DeadLetterReason, Delivery, DlqPage, Enqueued, Flow, NewMessage, Queue,
    QueueError, QueueStats, StatKind,
};

/// How the suite reaches the backend under test.
#[async_trait]
pub trait Harness: Send + Sync {
    /// Opens the queue under test. Each harness is one queue (its own
    /// directory, queue, stream or topic); a second call opens the same
    /// queue again, as a restarted process would.
    async fn open(&self) -> Arc<dyn Queue>;

    /// A lease short enough for a check to see it run out (no shorter than
    /// the backend allows).
    fn short_lease(&self) -> Duration {
        Duration::from_millis(300)
    }

    /// The queue opened keeps each entity key's messages in acceptance
    /// order ([`crate::KeyOrder::Key`], which [`crate::Backend::keeps_key_order`]
    /// says it can): [`key_order_as_declared`] checks it.
    fn keeps_key_order(&self) -> bool {
        false
    }

    /// Whether the backend tells of arrivals ([`crate::Queue::arrivals`]):
    /// [`arrivals_follow_enqueue`] checks it does, and that they move.
    fn tells_arrivals(&self) -> bool {
        false
    }
}

/// Expands to one `#[tokio::test]` per check of the suite, each with a
/// fresh harness made by `$harness` (an expression, awaited inside an
/// async test: `MyHarness::new()` or `MyHarness::new().await`).
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@each $harness;
            durable_publish, duplicates_as_declared, lease_expiry_redelivers,
            ack_removes, retry_delay_is_honoured, release_counts_no_attempt,
            dead_letter_keeps_reason, replay_puts_back, purge_deletes,
            pause_stops_delivery, probing_bounds_a_claim, stats_follow,
            a_settled_receipt_is_refused, key_order_as_declared,
            arrivals_follow_enqueue);
    };
    (@each $harness:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let harness = $harness;
                $crate::conformance::$check(&harness).await;
            }
        )*
    };
}

/// A lease no check lets run out.
const LONG_LEASE: Duration = Duration::from_secs(60);
/// Longest a check waits for a message a backend owes it.
const PATIENCE: Duration = Duration::from_secs(10);
/// How far a backend's clock may stand from this process's monotonic one:
/// a fleet's backends stamp due times on the wall clock (the only clock
/// their nodes share), which NTP slews by a few milliseconds against
/// `Instant`.
const CLOCK_SKEW: Duration = Duration::from_millis(20);

fn message(event_id: &str, key: Option<&str>) -> NewMessage {
    NewMessage {
        source: "conformance".into(),
        event_id: event_id.into(),
        entity_key: key.map(str::to_owned),
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from(format!("{{\"id\":\"{event_id}\"}}")),
        received_at_ms: 1_700_000_000_000,
    }
}

/// Enqueues `event_id` under an entity key of its own (`k-<event id>`),
/// so no backend holds it behind another check's message.
async fn enqueue_new(q: &dyn Queue, event_id: &str) {
    let r = q
        .enqueue(message(event_id, Some(&format!("k-{event_id}"))))
        .await
        .expect("enqueue");
    assert!(matches!(r, Enqueued::New { .. }), "{event_id}: {r:?}");
}

/// Claims until `n` messages came back or [`PATIENCE`] ran out.
async fn claim_n(q: &dyn Queue, n: usize, lease: Duration) -> Vec<Delivery> {
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        let batch = q.claim(n - got.len(), lease).await.expect("claim");
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        got.extend(batch);
    }
    assert_eq!(
        got.len(),
        n,
        "claimed {} of {n} within {PATIENCE:?}",
        got.len()
    );
    got
}

async fn claim_one(q: &dyn Queue, lease: Duration) -> Delivery {
    claim_n(q, 1, lease).await.remove(0)
}

/// Claims for `over` and asserts nothing is handed out.
async fn assert_nothing_delivered(q: &dyn Queue, over: Duration, why: &str) {
    let deadline = Instant::now() + over;
    while Instant::now() < deadline {
        let got = q.claim(10, LONG_LEASE).await.expect("claim");
        assert!(got.is_empty(), "{why}: delivered {got:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn poison() -> DeadLetterReason {
    DeadLetterReason {
        class: "permanent".into(),
        error: "23505: duplicate key value violates unique constraint".into(),
    }
}

/// Waits until `check` holds on the stats the backend declares.
async fn stats_until(
    q: &dyn Queue,
    what: &str,
    check: impl Fn(&QueueStats, &Capabilities) -> bool,
) {
    let caps = q.capabilities();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = q.stats().await.expect("stats");
        for kind in caps.stats {
            assert!(s.has(*kind), "declared {kind:?} but stats lack it: {s:?}");
        }
        if check(&s, &caps) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: stats {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn declared(caps: &Capabilities, kind: StatKind) -> bool {
    caps.stats.contains(&kind)
}

/// Everything acknowledged by `enqueue` is there after a reopen, intact.
pub async fn durable_publish(h: &dyn Harness) {
    let ids: BTreeSet<String> = (0..20).map(|i| format!("durable-{i}")).collect();
    {
        let q = h.open().await;
        for id in &ids {
            enqueue_new(q.as_ref(), id).await;
        }
    }
    let q = h.open().await;
    let got = claim_n(q.as_ref(), ids.len(), LONG_LEASE).await;
    let seen: BTreeSet<String> = got.iter().map(|d| d.message.event_id.clone()).collect();
    assert_eq!(seen, ids);
    for d in &got {
        let m = &d.message;
        assert_eq!(m.source, "conformance");
        assert_eq!(m.entity_key, Some(format!("k-{}", m.event_id)));
        assert_eq!(
            m.body,
            Bytes::from(format!("{{\"id\":\"{}\"}}", m.event_id))
        );
        assert!(
            m.headers
                .iter()
                .any(|(k, v)| k == "content-type" && v == "application/json"),
            "{:?}",
            m.headers
        );
        assert_eq!(m.attempts, 0);
    }
}

/// A backend that deduplicates answers `Duplicate` and queues once; one
/// that does not never invents a duplicate.
pub async fn duplicates_as_declared(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "dup").await;
    let again = q.enqueue(message("dup", Some("k"))).await.expect("enqueue");
    let other = q
        .enqueue(message("not-dup", Some("k")))
        .await
        .expect("enqueue");
    assert!(matches!(other, Enqueued::New { .. }), "{other:?}");
    if q.capabilities().native_dedup {
        assert!(matches!(again, Enqueued::Duplicate { .. }), "{again:?}");
        let got = claim_n(q.as_ref(), 2, LONG_LEASE).await;
        let dup = got.iter().filter(|d| d.message.event_id == "dup").count();
        assert_eq!(dup, 1, "queued twice");
        assert_nothing_delivered(q.as_ref(), Duration::from_millis(300), "a third").await;
    } else {
        assert!(matches!(again, Enqueued::New { .. }), "{again:?}");
    }
}

/// A claim whose lease runs out is delivered again, and its old receipt
/// can no longer settle it.
pub async fn lease_expiry_redelivers(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "lease").await;
    let lease = h.short_lease();
    let first = claim_one(q.as_ref(), lease).await;
    let again = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(again.message.event_id, "lease");
    assert_eq!(
        again.message.attempts, 0,
        "a lapsed lease is not a failed attempt"
    );
    if q.capabilities().counts_receives {
        assert_eq!(again.message.receives, first.message.receives + 1);
    }
    assert!(
        matches!(
            q.ack(&first.receipt).await,
            Err(QueueError::LeaseLost { .. })
        ),
        "the lapsed receipt settled the message"
    );
    q.ack(&again.receipt).await.expect("ack");
}

/// An acknowledged message is gone.
pub async fn ack_removes(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "ack").await;
    let d = claim_one(q.as_ref(), h.short_lease()).await;
    q.ack(&d.receipt).await.expect("ack");
    // Past the lease it would have come back had the ack not held.
    assert_nothing_delivered(q.as_ref(), h.short_lease() * 3, "an acked message").await;
    stats_until(q.as_ref(), "nothing left after the ack", |s, caps| {
        (!declared(caps, StatKind::Visible) || s.visible == Some(0))
            && (!declared(caps, StatKind::InFlight) || s.in_flight == Some(0))
            && (!declared(caps, StatKind::AckedTotal) || s.acked_total == Some(1))
    })
    .await;
}

/// A retry comes back after its delay, not before, with one more attempt.
pub async fn retry_delay_is_honoured(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "retry").await;
    let d = claim_one(q.as_ref(), LONG_LEASE).await;
    let delay = Duration::from_millis(1500);
    let asked = Instant::now();
    q.retry_later(&d.receipt, delay, "lock timeout")
        .await
        .expect("retry");
    let back = loop {
        let got = q.claim(1, LONG_LEASE).await.expect("claim");
        if let Some(d) = got.into_iter().next() {
            break d;
        }
        assert!(
            asked.elapsed() < delay + PATIENCE,
            "the retry never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let waited = asked.elapsed();
    assert!(
        waited + CLOCK_SKEW >= delay,
        "back after {waited:?}, before its {delay:?} delay"
    );
    assert_eq!(back.message.event_id, "retry");
    assert_eq!(back.message.attempts, 1, "a retry counts an attempt");
}

/// A release hands the message back at once without counting an attempt.
pub async fn release_counts_no_attempt(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "release").await;
    let d = claim_one(q.as_ref(), LONG_LEASE).await;
    q.release(&d.receipt, Duration::ZERO)
        .await
        .expect("release");
    let back = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(back.message.event_id, "release");
    assert_eq!(back.message.attempts, 0, "a release counted an attempt");
}

/// A dead letter leaves the queue for the DLQ with its class, error and
/// body.
pub async fn dead_letter_keeps_reason(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "poison").await;
    let d = claim_one(q.as_ref(), h.short_lease()).await;
    q.dead_letter(&d.receipt, &poison())
        .await
        .expect("dead-letter");
    assert_nothing_delivered(q.as_ref(), h.short_lease() * 3, "a dead letter").await;
    let list = q.dlq_list(&DlqPage::first(10)).await.expect("dlq list");
    assert_eq!(list.len(), 1, "{list:?}");
    let dl = &list[0];
    assert_eq!(
        (dl.event_id.as_str(), dl.source.as_str()),
        ("poison", "conformance")
    );
    assert_eq!(
        (dl.class.as_str(), dl.error.as_str()),
        ("permanent", poison().error.as_str())
    );
    assert!(dl.body.is_none(), "the listing carries no body");
    let shown = q.dlq_show(&dl.id).await.expect("dlq show");
    assert_eq!(shown.body.as_deref(), Some("{\"id\":\"poison\"}"));
    assert!(matches!(
        q.dlq_show("no-such-id").await,
        Err(QueueError::NotFound { .. })
    ));
    stats_until(q.as_ref(), "one dead letter", |s, caps| {
        !declared(caps, StatKind::DeadLettered) || s.dead_lettered == Some(1)
    })
    .await;
}

/// A replayed dead letter is delivered again with its attempts reset; a
/// message replayed `max_replays` times is refused.
pub async fn replay_puts_back(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "replayed").await;
    let d = claim_one(q.as_ref(), LONG_LEASE).await;
    q.retry_later(&d.receipt, Duration::ZERO, "x")
        .await
        .expect("retry");
    let d = claim_one(q.as_ref(), LONG_LEASE).await;
    q.dead_letter(&d.receipt, &poison())
        .await
        .expect("dead-letter");
    let id = q.dlq_list(&DlqPage::first(10)).await.expect("list")[0]
        .id
        .clone();

    let put_back = q
        .dlq_replay(std::slice::from_ref(&id), 1, 100)
        .await
        .expect("replay");
    assert_eq!(put_back, vec![id.clone()]);
    assert!(
        q.dlq_list(&DlqPage::first(10))
            .await
            .expect("list")
            .is_empty()
    );
    let back = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(back.message.event_id, "replayed");
    assert_eq!(
        back.message.attempts, 0,
        "a replay starts the attempts afresh"
    );

    q.dead_letter(&back.receipt, &poison())
        .await
        .expect("dead-letter");
    let list = q.dlq_list(&DlqPage::first(10)).await.expect("list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].replays, 1);
    let again = q.dlq_replay(&[], 1, 100).await.expect("replay");
    assert!(again.is_empty(), "replayed past max_replays: {again:?}");
}

/// Purging by id deletes those; purging with no ids deletes all.
pub async fn purge_deletes(h: &dyn Harness) {
    let q = h.open().await;
    for id in ["p1", "p2", "p3"] {
        enqueue_new(q.as_ref(), id).await;
    }
    for d in claim_n(q.as_ref(), 3, LONG_LEASE).await {
        q.dead_letter(&d.receipt, &poison())
            .await
            .expect("dead-letter");
    }
    let list = q.dlq_list(&DlqPage::first(10)).await.expect("list");
    assert_eq!(list.len(), 3);
    assert_eq!(q.dlq_purge(&[list[0].id.clone()]).await.expect("purge"), 1);
    let page = q
        .dlq_list(&DlqPage {
            limit: 1,
            after: None,
        })
        .await
        .expect("list");
    assert_eq!(page.len(), 1, "limit is honoured");
    let next = q
        .dlq_list(&DlqPage {
            limit: 10,
            after: Some(page[0].id.clone()),
        })
        .await
        .expect("list");
    assert_eq!(next.len(), 1, "paging after an id: {next:?}");
    assert_ne!(next[0].id, page[0].id);
    assert_eq!(q.dlq_purge(&[]).await.expect("purge"), 2);
    assert!(
        q.dlq_list(&DlqPage::first(10))
            .await
            .expect("list")
            .is_empty()
    );
}

/// Paused, nothing is delivered, even as messages keep arriving; resumed,
/// everything flows.
pub async fn pause_stops_delivery(h: &dyn Harness) {
    let q = h.open().await;
    for i in 0..3 {
        enqueue_new(q.as_ref(), &format!("before-{i}")).await;
    }
    q.set_flow(Flow::Paused).await.expect("pause");
    for i in 0..3 {
        enqueue_new(q.as_ref(), &format!("during-{i}")).await;
    }
    assert_nothing_delivered(q.as_ref(), Duration::from_secs(1), "while paused").await;
    q.set_flow(Flow::Flowing { limit: 16 })
        .await
        .expect("resume");
    let got = claim_n(q.as_ref(), 6, LONG_LEASE).await;
    assert_eq!(got.len(), 6);
}

/// Half-open, a claim hands out no more than the probes.
pub async fn probing_bounds_a_claim(h: &dyn Harness) {
    let q = h.open().await;
    for i in 0..5 {
        enqueue_new(q.as_ref(), &format!("probe-{i}")).await;
    }
    q.set_flow(Flow::Probing { probes: 1 })
        .await
        .expect("probing");
    let first = claim_one(q.as_ref(), LONG_LEASE).await;
    let more = q.claim(10, LONG_LEASE).await.expect("claim");
    if q.capabilities().push {
        assert!(
            more.is_empty(),
            "a second delivery with one probe outstanding"
        );
    } else {
        assert!(more.len() <= 1, "a claim of {} with one probe", more.len());
    }
    q.ack(&first.receipt).await.expect("ack");
    q.set_flow(Flow::Flowing { limit: 16 })
        .await
        .expect("flowing");
    let rest = 4 - more.len();
    claim_n(q.as_ref(), rest, LONG_LEASE).await;
}

/// Visible, in flight, delayed and dead-lettered follow what was done, for
/// the fields the backend declares.
pub async fn stats_follow(h: &dyn Harness) {
    let q = h.open().await;
    for i in 0..4 {
        enqueue_new(q.as_ref(), &format!("stats-{i}")).await;
    }
    stats_until(q.as_ref(), "4 visible", |s, caps| {
        !declared(caps, StatKind::Visible) || s.visible == Some(4)
    })
    .await;
    let held = claim_n(q.as_ref(), 3, LONG_LEASE).await;
    q.retry_later(&held[1].receipt, Duration::from_secs(60), "later")
        .await
        .expect("retry");
    q.dead_letter(&held[2].receipt, &poison())
        .await
        .expect("dead-letter");
    stats_until(
        q.as_ref(),
        "1 visible, 1 in flight, 1 delayed, 1 dead",
        |s, caps| {
            (!declared(caps, StatKind::Visible) || s.visible == Some(1))
                && (!declared(caps, StatKind::InFlight) || s.in_flight == Some(1))
                && (!declared(caps, StatKind::Delayed) || s.delayed == Some(1))
                && (!declared(caps, StatKind::DeadLettered) || s.dead_lettered == Some(1))
                && (!declared(caps, StatKind::DeadLetteredTotal)
                    || s.dead_lettered_total == Some(1))
        },
    )
    .await;
    q.ack(&held[0].receipt).await.expect("ack");
    stats_until(q.as_ref(), "nothing in flight", |s, caps| {
        (!declared(caps, StatKind::InFlight) || s.in_flight == Some(0))
            && (!declared(caps, StatKind::AckedTotal) || s.acked_total == Some(1))
    })
    .await;
}

/// A receipt settles its message once.
pub async fn a_settled_receipt_is_refused(h: &dyn Harness) {
    let q = h.open().await;
    enqueue_new(q.as_ref(), "once").await;
    let d = claim_one(q.as_ref(), LONG_LEASE).await;
    q.ack(&d.receipt).await.expect("ack");
    for (what, result) in [
        ("ack", q.ack(&d.receipt).await),
        ("release", q.release(&d.receipt, Duration::ZERO).await),
        ("dead-letter", q.dead_letter(&d.receipt, &poison()).await),
    ] {
        assert!(
            matches!(result, Err(QueueError::LeaseLost { .. })),
            "a second {what}: {result:?}"
        );
    }
}

/// A queue that keeps key order hands out one key's messages one at a
/// time, in the order they were enqueued: the next only once the one
/// before was acked or dead-lettered, not while it waits for its retry or
/// after a release. Other keys are not held. (A backend that keeps no
/// order is not checked: nothing it does is wrong.)
pub async fn key_order_as_declared(h: &dyn Harness) {
    if !h.keeps_key_order() {
        return;
    }
    let q = h.open().await;
    for (id, key) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a")] {
        let r = q.enqueue(message(id, Some(key))).await.expect("enqueue");
        assert!(matches!(r, Enqueued::New { .. }), "{id}: {r:?}");
    }
    let ids = |got: &[Delivery]| -> BTreeSet<String> {
        got.iter().map(|d| d.message.event_id.clone()).collect()
    };
    let heads = claim_n(q.as_ref(), 2, LONG_LEASE).await;
    assert_eq!(ids(&heads), ["a1", "b1"].map(String::from).into());
    assert_nothing_delivered(q.as_ref(), Duration::from_millis(200), "a2 waits for a1").await;
    let a1 = heads
        .iter()
        .find(|d| d.message.event_id == "a1")
        .expect("a1");
    q.retry_later(&a1.receipt, Duration::from_millis(300), "lock timeout")
        .await
        .expect("retry");
    let back = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(back.message.event_id, "a1", "a2 waited for a1's retry");
    q.release(&back.receipt, Duration::ZERO)
        .await
        .expect("release");
    let back = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(back.message.event_id, "a1", "a released head stays first");
    q.ack(&back.receipt).await.expect("ack");
    let next = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(next.message.event_id, "a2");
    q.dead_letter(&next.receipt, &poison())
        .await
        .expect("dead letter");
    let last = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(last.message.event_id, "a3", "a dead letter frees its key");
}

/// A backend that tells of arrivals ([`crate::Queue::arrivals`]) moves
/// them when an enqueue became claimable, so idle workers claim at once.
/// (One that does not is only checked to say so: its workers poll.)
pub async fn arrivals_follow_enqueue(h: &dyn Harness) {
    let q = h.open().await;
    let arrivals = q.arrivals();
    assert_eq!(arrivals.is_some(), h.tells_arrivals(), "tells of arrivals");
    let Some(mut arrivals) = arrivals else {
        return;
    };
    // A consumer that starts at its first claim (Kafka's) starts now.
    let none = q.claim(1, LONG_LEASE).await.expect("claim");
    assert!(none.is_empty(), "nothing enqueued yet: {none:?}");
    arrivals.borrow_and_update();
    enqueue_new(q.as_ref(), "arrives").await;
    tokio::time::timeout(PATIENCE, arrivals.changed())
        .await
        .expect("arrivals moved")
        .expect("the queue is open");
    let d = claim_one(q.as_ref(), LONG_LEASE).await;
    assert_eq!(d.message.event_id, "arrives");
}
