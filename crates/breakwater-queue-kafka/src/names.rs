//! The topics and the consumer group of one Breakwater queue on Kafka, and
//! which retry tier a delay goes to. Pure: no I/O.
//!
//! | what | name |
//! |---|---|
//! | the queue | `<name>` |
//! | retry tiers | `<name>.retry.<ms>` |
//! | dead letters | `<name>.dlq` (compacted: a replayed or purged record is a tombstone) |
//! | the workers' group | `<name>.workers`, or `[queue] group` |

use std::time::Duration;

/// Which subscribed topic a record came from: the queue itself or one of
/// its retry tiers (an index into [`Names::subscribed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TopicIx(pub(crate) usize);

impl TopicIx {
    pub(crate) const QUEUE: Self = Self(0);

    pub(crate) fn is_tier(self) -> bool {
        self.0 > 0
    }
}

/// The names of one queue's topics and group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The topic webhooks are produced to.
    pub topic: String,
    /// The retry tiers: (delay in ms, topic), ascending.
    pub tiers: Vec<(u64, String)>,
    /// The dead-letter topic.
    pub dlq: String,
    /// The consumer group of the workers.
    pub group: String,
}

impl Names {
    /// The names for topic `name` with the retry tiers `tiers_ms` (sorted
    /// and deduplicated here) and the group `group` (or `<name>.workers`).
    pub fn of(name: &str, tiers_ms: &[u64], group: Option<&str>) -> Self {
        let mut tiers: Vec<u64> = tiers_ms.iter().copied().filter(|ms| *ms > 0).collect();
        tiers.sort_unstable();
        tiers.dedup();
        Self {
            topic: name.to_owned(),
            tiers: tiers
                .into_iter()
                .map(|ms| (ms, format!("{name}.retry.{ms}")))
                .collect(),
            dlq: format!("{name}.dlq"),
            group: group.map_or_else(|| format!("{name}.workers"), str::to_owned),
        }
    }

    /// The topics the workers subscribe to: the queue, then each tier (the
    /// order [`TopicIx`] counts in).
    pub fn subscribed(&self) -> Vec<&str> {
        std::iter::once(self.topic.as_str())
            .chain(self.tiers.iter().map(|(_, t)| t.as_str()))
            .collect()
    }

    pub(crate) fn topic(&self, ix: TopicIx) -> &str {
        match ix.0 {
            0 => &self.topic,
            n => self
                .tiers
                .get(n - 1)
                .map_or(&self.topic, |(_, t)| t.as_str()),
        }
    }

    pub(crate) fn ix(&self, topic: &str) -> Option<TopicIx> {
        if topic == self.topic {
            return Some(TopicIx::QUEUE);
        }
        self.tiers
            .iter()
            .position(|(_, t)| t == topic)
            .map(|i| TopicIx(i + 1))
    }

    /// Where a message handed back after `delay` goes: the queue itself
    /// when there is no delay, else the smallest tier at least as long
    /// (the longest when none is).
    pub(crate) fn for_delay(&self, delay: Duration) -> TopicIx {
        if delay.is_zero() || self.tiers.is_empty() {
            return TopicIx::QUEUE;
        }
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let i = self
            .tiers
            .iter()
            .position(|(tier, _)| *tier >= ms)
            .unwrap_or(self.tiers.len() - 1);
        TopicIx(i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_topic() {
        let n = Names::of("orders", &[5_000, 250, 250, 0], None);
        assert_eq!(n.dlq, "orders.dlq");
        assert_eq!(n.group, "orders.workers");
        assert_eq!(
            n.subscribed(),
            vec!["orders", "orders.retry.250", "orders.retry.5000"]
        );
        assert_eq!(n.ix("orders.retry.5000"), Some(TopicIx(2)));
        assert_eq!(n.topic(TopicIx(2)), "orders.retry.5000");
        assert_eq!(n.ix("other"), None);
        assert_eq!(Names::of("o", &[], Some("g")).group, "g");
    }

    #[test]
    fn a_delay_goes_to_the_smallest_tier_at_least_as_long() {
        let n = Names::of("o", &[250, 1_000, 5_000], None);
        let tier = |ms| n.topic(n.for_delay(Duration::from_millis(ms))).to_owned();
        assert_eq!(tier(0), "o");
        assert_eq!(tier(1), "o.retry.250");
        assert_eq!(tier(250), "o.retry.250");
        assert_eq!(tier(251), "o.retry.1000");
        assert_eq!(tier(60_000), "o.retry.5000", "the longest caps it");
        assert!(!n.for_delay(Duration::ZERO).is_tier());
        assert!(n.for_delay(Duration::from_millis(1)).is_tier());
    }
}
