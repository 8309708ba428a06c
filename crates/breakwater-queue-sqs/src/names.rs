//! The SQS names one `[queue] name` gives (the queue, its DLQ), whether it
//! is a FIFO queue, and a FIFO message's group and deduplication ids. Pure.

use sha2::{Digest, Sha256};

/// SQS's limit on a queue name.
pub(crate) const MAX_NAME: usize = 80;
const FIFO_SUFFIX: &str = ".fifo";
const DLQ_SUFFIX: &str = "-dlq";

/// The queues of one `[queue] name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    pub(crate) queue: String,
    pub(crate) dlq: String,
    /// A FIFO queue (its name ends in `.fifo`): groups keep one entity
    /// key's messages in order and sends are deduplicated for 5 minutes.
    pub(crate) fifo: bool,
}

impl Names {
    /// The names for `name`, the DLQ's `dlq` when configured.
    pub(crate) fn of(name: &str, dlq: Option<&str>) -> Self {
        let fifo = name.ends_with(FIFO_SUFFIX);
        let dlq = dlq.map_or_else(
            || match name.strip_suffix(FIFO_SUFFIX) {
                Some(base) => format!("{base}{DLQ_SUFFIX}{FIFO_SUFFIX}"),
                None => format!("{name}{DLQ_SUFFIX}"),
            },
            str::to_owned,
        );
        Self {
            queue: name.to_owned(),
            dlq,
            fifo,
        }
    }
}

/// What is wrong with `name` as an SQS queue name: letters, digits, `-`
/// and `_`, with `.fifo` only as the suffix of a FIFO queue, at most 80.
pub(crate) fn problem(name: &str) -> Option<String> {
    let base = name.strip_suffix(FIFO_SUFFIX).unwrap_or(name);
    if base.is_empty()
        || !base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Some(
            "must be letters, digits, '-' or '_' (and \".fifo\" at the end of a FIFO queue), \
             at least one"
                .to_owned(),
        );
    }
    (name.len() > MAX_NAME).then(|| format!("must be at most {MAX_NAME} characters"))
}

/// A FIFO message's group: its entity key, so one entity's messages stay
/// in order; a message without one is a group of its own, so nothing
/// waits behind it.
pub(crate) fn group_id(entity_key: Option<&str>, source: &str, event_id: &str) -> String {
    match entity_key {
        // A group id is at most 128 characters of a limited set: a long
        // or unusual key is hashed.
        Some(key) if key.len() <= 128 && key.chars().all(|c| c.is_ascii_graphic()) => {
            key.to_owned()
        }
        Some(key) => format!("k-{}", digest(&[key])),
        None => format!("e-{}", digest(&[source, event_id])),
    }
}

/// A FIFO message's deduplication id: the event's, with `suffix` for a
/// copy that must not be taken for the original (a retry, a replay).
pub(crate) fn dedup_id(source: &str, event_id: &str, suffix: &str) -> String {
    format!("{}{suffix}", digest(&[source, event_id]))
}

fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_queue_name() {
        assert_eq!(
            Names::of("orders", None),
            Names {
                queue: "orders".into(),
                dlq: "orders-dlq".into(),
                fifo: false
            }
        );
        let fifo = Names::of("orders.fifo", None);
        assert_eq!((fifo.dlq.as_str(), fifo.fifo), ("orders-dlq.fifo", true));
        assert_eq!(Names::of("orders", Some("dead")).dlq, "dead");
    }

    #[test]
    fn a_queue_name_is_checked_as_sqs_does() {
        for good in ["orders", "orders_1-a", "orders.fifo"] {
            assert_eq!(problem(good), None, "{good}");
        }
        for bad in ["", ".fifo", "a.b", "a.fifo.fifo", "ü", &"a".repeat(81)] {
            assert!(problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn groups_keep_a_key_and_spread_the_keyless() {
        assert_eq!(group_id(Some("order-7"), "s", "e1"), "order-7");
        let long = "k".repeat(200);
        let hashed = group_id(Some(&long), "s", "e1");
        assert!(hashed.starts_with("k-") && hashed.len() < 128, "{hashed}");
        assert_ne!(group_id(None, "s", "e1"), group_id(None, "s", "e2"));
        assert_eq!(dedup_id("s", "e", ""), dedup_id("s", "e", ""));
        assert_ne!(dedup_id("s", "e", ""), dedup_id("s", "e", "-a1"));
    }
}
