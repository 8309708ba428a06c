//! Per entity key, the records this process holds of it, in the order they
//! were fetched (`workers.order = "key"`). The key chose the partition at
//! produce time and one consumer of the group owns a partition, so the
//! records of a key reach one process in the order the ingress produced
//! them; this keeps that order through claims, retries and releases.
//!
//! A key's **head** is the one record of it that may be claimed: fetched
//! and waiting in the buffer, claimed, or waiting here for its retry (a
//! retry of a keyed record stays in this process, unfinished, instead of
//! going to a retry tier: the partition's commit holds at it, so a crash
//! reads it again first). The records **behind** it wait here, outside the
//! fetch window, until the head is applied or dead-lettered; then the next
//! becomes the head. Records without a key, or not readable, are not
//! ordered. Pure: no I/O.

use std::collections::{HashMap, VecDeque};

use crate::gate::Tp;
use crate::polled::Polled;

/// The key lines of one process.
#[derive(Debug, Default)]
pub(crate) struct KeyLines {
    /// Each key's head, by where it is.
    heads: HashMap<String, (Tp, i64)>,
    /// The records behind each key's head, oldest first.
    behind: HashMap<String, VecDeque<Polled>>,
    /// How many records wait behind a head, all keys together.
    behind_len: usize,
}

impl KeyLines {
    /// A record goes to the buffer: back as it came when it may be claimed
    /// (its key has no head here, which it now is; or it has no key), or
    /// kept behind its key's head.
    pub(crate) fn admit(&mut self, p: Polled) -> Option<Polled> {
        let Some(key) = p.entity_key() else {
            return Some(p);
        };
        if self.heads.contains_key(key) {
            self.behind.entry(key.to_owned()).or_default().push_back(p);
            self.behind_len += 1;
            return None;
        }
        self.heads.insert(key.to_owned(), (p.tp, p.offset));
        Some(p)
    }

    /// The record `p` is done with (applied, dead-lettered): when it was
    /// its key's head, the next record of the key, its new head, for the
    /// buffer.
    pub(crate) fn finish(&mut self, p: &Polled) -> Option<Polled> {
        let key = p.entity_key()?;
        if self.heads.get(key) != Some(&(p.tp, p.offset)) {
            return None;
        }
        self.heads.remove(key);
        self.promote(key)
    }

    fn promote(&mut self, key: &str) -> Option<Polled> {
        let line = self.behind.get_mut(key)?;
        let next = line.pop_front();
        if line.is_empty() {
            self.behind.remove(key);
        }
        let next = next?;
        self.behind_len -= 1;
        self.heads.insert(key.to_owned(), (next.tp, next.offset));
        Some(next)
    }

    /// Forgets the records of partitions no longer assigned (their new
    /// owner reads them again from the commit); returns the records that
    /// became heads (a line whose head was on such a partition), for the
    /// buffer.
    pub(crate) fn revoke(&mut self, revoked: &[Tp]) -> Vec<Polled> {
        for line in self.behind.values_mut() {
            line.retain(|p| !revoked.contains(&p.tp));
        }
        self.behind.retain(|_, line| !line.is_empty());
        self.behind_len = self.behind.values().map(VecDeque::len).sum();
        let lost: Vec<String> = self
            .heads
            .iter()
            .filter(|(_, (tp, _))| revoked.contains(tp))
            .map(|(k, _)| k.clone())
            .collect();
        lost.into_iter()
            .filter_map(|key| {
                self.heads.remove(&key);
                self.promote(&key)
            })
            .collect()
    }

    /// Records waiting behind a head, all keys together.
    pub(crate) fn behind_len(&self) -> usize {
        self.behind_len
    }

    /// The records waiting behind a head, every key's.
    pub(crate) fn behind(&self) -> impl Iterator<Item = &Polled> {
        self.behind.values().flat_map(|line| line.iter())
    }
}

#[cfg(test)]
mod tests {
    use breakwater_queue::envelope::Meta;
    use bytes::Bytes;

    use super::*;
    use crate::names::TopicIx;
    use crate::wire::Read;

    const TP: Tp = (TopicIx(0), 0);
    const OTHER: Tp = (TopicIx(0), 1);

    fn record(tp: Tp, offset: i64, key: Option<&str>) -> Polled {
        Polled {
            tp,
            offset,
            read: Ok(Read {
                meta: Meta {
                    source: "s".into(),
                    event_id: format!("e{offset}"),
                    entity_key: key.map(str::to_owned),
                    headers: Vec::new(),
                    received_at_ms: 0,
                    replays: 0,
                    attempts: 0,
                    class: None,
                    error: None,
                    dead_at_ms: None,
                },
                not_before_ms: 0,
                releases: 0,
            }),
            body: Bytes::new(),
            timestamp_ms: None,
        }
    }

    fn offset(p: Option<Polled>) -> Option<i64> {
        p.map(|p| p.offset)
    }

    #[test]
    fn a_key_s_later_records_wait_behind_its_head_in_order() {
        let mut lines = KeyLines::default();
        let head = lines.admit(record(TP, 1, Some("a"))).expect("a head");
        assert!(lines.admit(record(TP, 2, Some("a"))).is_none());
        assert_eq!(offset(lines.admit(record(TP, 3, Some("b")))), Some(3));
        assert!(lines.admit(record(TP, 4, Some("a"))).is_none());
        assert_eq!(lines.behind_len(), 2);
        let next = lines.finish(&head).expect("the next head");
        assert_eq!(next.offset, 2);
        assert!(lines.finish(&head).is_none(), "finished once");
        assert_eq!(offset(lines.finish(&next)), Some(4));
        assert_eq!(lines.behind_len(), 0);
    }

    #[test]
    fn records_without_a_key_are_not_ordered() {
        let mut lines = KeyLines::default();
        assert!(lines.admit(record(TP, 1, None)).is_some());
        assert!(lines.admit(record(TP, 2, None)).is_some());
        assert_eq!(lines.behind_len(), 0);
    }

    #[test]
    fn finishing_a_record_that_is_not_the_head_changes_nothing() {
        let mut lines = KeyLines::default();
        lines.admit(record(TP, 1, Some("a"))).expect("head");
        assert!(lines.admit(record(TP, 2, Some("a"))).is_none());
        assert!(lines.finish(&record(TP, 2, Some("a"))).is_none());
        assert_eq!(lines.behind_len(), 1);
    }

    #[test]
    fn a_revoked_partition_s_records_are_forgotten_and_other_lines_go_on() {
        let mut lines = KeyLines::default();
        lines
            .admit(record(OTHER, 1, Some("a")))
            .expect("head on OTHER");
        assert!(lines.admit(record(TP, 7, Some("a"))).is_none());
        assert!(lines.admit(record(OTHER, 2, Some("a"))).is_none());
        lines.admit(record(TP, 8, Some("b"))).expect("head on TP");
        assert!(lines.admit(record(OTHER, 3, Some("b"))).is_none());
        assert_eq!(lines.behind().filter(|p| p.tp == OTHER).count(), 2);
        let heads = lines.revoke(&[OTHER]);
        assert_eq!(heads.iter().map(|p| p.offset).collect::<Vec<_>>(), [7]);
        assert_eq!(lines.behind_len(), 0);
        assert!(lines.admit(record(TP, 9, Some("a"))).is_none(), "7 heads a");
    }
}
