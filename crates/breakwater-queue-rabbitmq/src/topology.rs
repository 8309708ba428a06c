//! What Breakwater declares on a RabbitMQ broker for one `[queue] name`,
//! and which delay tier a delay goes to. Names and choices only; the
//! declaring is in `session`.
//!
//! | queue | arguments | role |
//! |---|---|---|
//! | `<name>` | durable, `x-queue-type`, dead-letters to `<name>.dlq` | the work queue |
//! | `<name>.delay.<ms>` | durable, `x-message-ttl = ms`, dead-letters to `<name>` | a retry or delayed release waits here |
//! | `<name>.dlq` | durable, `x-queue-type` | final failures, with class and reason |
//!
//! Everything goes through the default exchange (routing key = queue
//! name), so there is no exchange to declare or lose. Quorum delay tiers
//! dead-letter `at-least-once` (which needs `x-overflow = reject-publish`),
//! so a message on its way back from a tier is never dropped.

use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::config::QueueType;

/// The queue names one `[queue] name` gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub queue: String,
    pub dlq: String,
    delay_prefix: String,
}

impl Names {
    pub fn of(name: &str) -> Self {
        Self {
            queue: name.to_owned(),
            dlq: format!("{name}.dlq"),
            delay_prefix: format!("{name}.delay."),
        }
    }

    /// The delay tier queue of `ms`.
    pub fn delay(&self, ms: u64) -> String {
        format!("{}{ms}", self.delay_prefix)
    }
}

/// The tier a delay waits in: the smallest at least as long as `delay`
/// (so a retry never comes back early), or the longest tier. `tiers` is
/// ascending and non-empty (the config checks it).
pub(crate) fn tier_for(tiers: &[u64], delay: Duration) -> u64 {
    let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    tiers
        .iter()
        .copied()
        .find(|t| *t >= ms)
        .or_else(|| tiers.last().copied())
        .unwrap_or(0)
}

fn string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn base(queue_type: QueueType) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        string(queue_type.as_str()),
    );
    args
}

/// Arguments of the work queue: what is rejected without requeue (a quorum
/// queue's delivery limit, an operator's `reject`) lands in the DLQ, never
/// nowhere.
pub(crate) fn queue_args(names: &Names, queue_type: QueueType) -> FieldTable {
    let mut args = base(queue_type);
    args.insert(ShortString::from("x-dead-letter-exchange"), string(""));
    args.insert(
        ShortString::from("x-dead-letter-routing-key"),
        string(&names.dlq),
    );
    args
}

/// Arguments of a delay tier of `ms`.
pub(crate) fn delay_args(names: &Names, queue_type: QueueType, ms: u64) -> FieldTable {
    let mut args = base(queue_type);
    args.insert(
        ShortString::from("x-message-ttl"),
        AMQPValue::LongLongInt(i64::try_from(ms).unwrap_or(i64::MAX)),
    );
    args.insert(ShortString::from("x-dead-letter-exchange"), string(""));
    args.insert(
        ShortString::from("x-dead-letter-routing-key"),
        string(&names.queue),
    );
    if queue_type == QueueType::Quorum {
        args.insert(
            ShortString::from("x-dead-letter-strategy"),
            string("at-least-once"),
        );
        args.insert(ShortString::from("x-overflow"), string("reject-publish"));
    }
    args
}

/// Arguments of the DLQ.
pub(crate) fn dlq_args(queue_type: QueueType) -> FieldTable {
    base(queue_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_waits_in_the_smallest_tier_that_covers_it() {
        let tiers = [100, 1_000, 5_000];
        assert_eq!(tier_for(&tiers, Duration::ZERO), 100);
        assert_eq!(tier_for(&tiers, Duration::from_millis(100)), 100);
        assert_eq!(tier_for(&tiers, Duration::from_millis(101)), 1_000);
        assert_eq!(tier_for(&tiers, Duration::from_millis(4_999)), 5_000);
        assert_eq!(
            tier_for(&tiers, Duration::from_secs(3600)),
            5_000,
            "capped by the longest tier"
        );
    }

    #[test]
    fn names_derive_from_the_queue_name() {
        let n = Names::of("orders");
        assert_eq!(
            (n.queue.as_str(), n.dlq.as_str(), n.delay(250).as_str()),
            ("orders", "orders.dlq", "orders.delay.250")
        );
    }

    #[test]
    fn quorum_tiers_dead_letter_at_least_once() {
        let names = Names::of("q");
        let args = delay_args(&names, QueueType::Quorum, 500);
        let get = |k: &str| args.inner().get(&ShortString::from(k)).cloned();
        assert_eq!(get("x-message-ttl"), Some(AMQPValue::LongLongInt(500)));
        assert_eq!(get("x-dead-letter-routing-key"), Some(string("q")));
        assert_eq!(get("x-dead-letter-strategy"), Some(string("at-least-once")));
        let classic = delay_args(&names, QueueType::Classic, 500);
        assert!(
            classic
                .inner()
                .get(&ShortString::from("x-dead-letter-strategy"))
                .is_none()
        );
    }
}
