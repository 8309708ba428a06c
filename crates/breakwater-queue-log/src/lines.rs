//! Key lines: per entity key, the ids of its queued messages in order.
//! Pure, no I/O.
//!
//! With `workers.order = "key"` (the default) the index hands out only
//! the head of each line, so one key's messages are applied in the order
//! the ingress accepted them (ids follow acceptance). The head stays the
//! head through its lease, a retry's delay, a release and a lapsed lease;
//! the next one becomes the head only when the head leaves the queue,
//! applied or dead-lettered. After a restart the lines are rebuilt from
//! the records, and the lowest id of each key is its head again.
//!
//! Lines are keyed by a 64-bit hash of the entity key, in
//! [`SHARDS`] hash tables by the hash's top byte (like the dedup index:
//! no table is rehashed whole on the writer thread). Two keys whose
//! hashes collide share one line: they are applied one after the other,
//! never out of order.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Hash tables of the lines.
const SHARDS: usize = 256;

/// The line an entity key waits in.
pub(crate) fn line_of(entity_key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    entity_key.hash(&mut h);
    h.finish()
}

/// One key's queued ids: `head`, then `behind` in rising order.
#[derive(Debug)]
struct Line {
    head: u64,
    behind: VecDeque<u64>,
}

/// Where a message joined its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Joined {
    /// It is the head; `displaced` was the head until now (a lower id
    /// joining late, as a carried record does when the records are read
    /// back at start).
    Head { displaced: Option<u64> },
    /// Behind an earlier message of its key.
    Behind,
}

/// Every key's line (see the module doc).
#[derive(Debug)]
pub(crate) struct KeyLines {
    shards: Vec<HashMap<u64, Line>>,
}

impl KeyLines {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| HashMap::new()).collect(),
        }
    }

    fn shard(&mut self, line: u64) -> &mut HashMap<u64, Line> {
        &mut self.shards[(line >> 56) as usize % SHARDS]
    }

    /// Puts `id` in `line`, in id order.
    pub(crate) fn join(&mut self, line: u64, id: u64) -> Joined {
        let Some(l) = self.shard(line).get_mut(&line) else {
            let fresh = Line {
                head: id,
                behind: VecDeque::new(),
            };
            self.shard(line).insert(line, fresh);
            return Joined::Head { displaced: None };
        };
        if id == l.head {
            return Joined::Head { displaced: None };
        }
        if id < l.head {
            let displaced = std::mem::replace(&mut l.head, id);
            l.behind.push_front(displaced);
            return Joined::Head {
                displaced: Some(displaced),
            };
        }
        // Ids rise, so this is almost always the back.
        let at = l.behind.partition_point(|&b| b < id);
        if l.behind.get(at) != Some(&id) {
            l.behind.insert(at, id);
        }
        Joined::Behind
    }

    /// Takes `id` out of `line`; when it was the head and another waits,
    /// returns that one, the new head.
    pub(crate) fn leave(&mut self, line: u64, id: u64) -> Option<u64> {
        let shard = self.shard(line);
        let l = shard.get_mut(&line)?;
        if l.head != id {
            if let Ok(at) = l.behind.binary_search(&id) {
                l.behind.remove(at);
            }
            return None;
        }
        match l.behind.pop_front() {
            Some(next) => {
                l.head = next;
                Some(next)
            }
            None => {
                shard.remove(&line);
                None
            }
        }
    }

    /// The head of `line`, if any message waits in it.
    #[cfg(test)]
    pub(crate) fn head(&self, line: u64) -> Option<u64> {
        self.shards[(line >> 56) as usize % SHARDS]
            .get(&line)
            .map(|l| l.head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_to_join_is_the_head_and_the_next_follows_it_out() {
        let mut lines = KeyLines::new();
        let k = line_of("1042");
        assert_eq!(lines.join(k, 1), Joined::Head { displaced: None });
        assert_eq!(lines.join(k, 5), Joined::Behind);
        assert_eq!(lines.join(k, 9), Joined::Behind);
        // A message behind the head leaves (dead-lettered by an operator's
        // purge, say): the head stays.
        assert_eq!(lines.leave(k, 5), None);
        assert_eq!(lines.head(k), Some(1));
        assert_eq!(lines.leave(k, 1), Some(9));
        assert_eq!(lines.leave(k, 9), None);
        assert_eq!(lines.head(k), None, "an empty line is dropped");
    }

    #[test]
    fn a_lower_id_joining_late_takes_the_head_and_order_is_kept() {
        let mut lines = KeyLines::new();
        let k = line_of("k");
        for id in [7, 12, 20] {
            lines.join(k, id);
        }
        assert_eq!(lines.join(k, 3), Joined::Head { displaced: Some(7) });
        assert_eq!(lines.join(k, 15), Joined::Behind);
        assert_eq!(lines.join(k, 15), Joined::Behind, "twice is once");
        let mut order = vec![lines.head(k).expect("head")];
        while let Some(next) = lines.leave(k, *order.last().expect("one")) {
            order.push(next);
        }
        assert_eq!(order, vec![3, 7, 12, 15, 20]);
    }

    #[test]
    fn keys_have_lines_of_their_own() {
        let mut lines = KeyLines::new();
        let (a, b) = (line_of("a"), line_of("b"));
        assert_ne!(a, b);
        assert_eq!(lines.join(a, 1), Joined::Head { displaced: None });
        assert_eq!(lines.join(b, 2), Joined::Head { displaced: None });
        assert_eq!(lines.leave(a, 1), None);
        assert_eq!(lines.head(b), Some(2));
    }
}
