//! A simulated queue with the contract's semantics (`breakwater-queue`'s
//! `Queue`): claims under a lease with a token, a lease that lapses makes
//! the message visible again, settles only with the current token, retries
//! count an attempt, releases do not, the DLQ keeps its reason.
//!
//! With [`KeyOrder::Key`] (the default, as on the segment log) it keeps
//! the log's key lines (`breakwater-queue-log/src/lines.rs`): per entity
//! key, only the head of its line (its lowest queued id; ids follow
//! acceptance) is ever in the ready index, so only the head can be
//! claimed. A retried, released or lapsed head stays the head; an ack or a
//! dead letter takes it out of its line and puts the next id in the ready
//! index, at its own (earlier) visible time. Messages behind a head count
//! as visible, as the log's stats count them. With [`KeyOrder::None`] any
//! visible message may be claimed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use breakwater::queue::KeyOrder;

use crate::schedule::Ms;

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QState {
    /// Visible from `visible_at` (or leased until it).
    Queued,
    Acked,
    Dead(&'static str),
}

#[derive(Debug, Clone)]
pub struct QMsg {
    pub id: u32,
    pub key: Option<u32>,
    pub poison: bool,
    pub state: QState,
    pub visible_at: Ms,
    /// The lease's token; 0 while not leased.
    pub token: u64,
    pub attempts: u32,
    pub receives: u32,
    /// Behind the head of its key's line: not claimable, not in the ready
    /// index.
    pub behind: bool,
}

/// A claimed message.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    pub id: u32,
    pub key: Option<u32>,
    pub poison: bool,
    pub token: u64,
    pub attempts: u32,
    pub receives: u32,
}

#[derive(Debug)]
pub struct SimQueue {
    pub msgs: Vec<QMsg>,
    /// Every claimable queued message by `(visible_at, id)`: the ready
    /// index (with key order, of keyed messages only the heads).
    queued: BTreeSet<(Ms, u32)>,
    /// Queued messages under a lease.
    leased: u64,
    next_token: u64,
    pub acked: u64,
    pub dead: u64,
    /// With key order: per key, its queued ids in acceptance order, the
    /// head first.
    lines: Option<BTreeMap<u32, VecDeque<u32>>>,
    /// Messages behind a head.
    behind: u64,
}

impl Default for SimQueue {
    fn default() -> Self {
        Self::new(KeyOrder::default())
    }
}

impl SimQueue {
    pub fn new(order: KeyOrder) -> Self {
        Self {
            msgs: Vec::new(),
            queued: BTreeSet::new(),
            leased: 0,
            next_token: 0,
            acked: 0,
            dead: 0,
            lines: match order {
                KeyOrder::Key => Some(BTreeMap::new()),
                KeyOrder::None => None,
            },
            behind: 0,
        }
    }

    /// The order it keeps.
    pub fn order(&self) -> KeyOrder {
        if self.lines.is_some() {
            KeyOrder::Key
        } else {
            KeyOrder::None
        }
    }

    pub fn enqueue(&mut self, key: Option<u32>, poison: bool, now: Ms) -> u32 {
        let id = u32::try_from(self.msgs.len()).unwrap_or(u32::MAX);
        let behind = match (self.lines.as_mut(), key) {
            (Some(lines), Some(key)) => {
                let line = lines.entry(key).or_default();
                line.push_back(id);
                line.len() > 1
            }
            _ => false,
        };
        if behind {
            self.behind += 1;
        } else {
            self.queued.insert((now, id));
        }
        self.msgs.push(QMsg {
            id,
            key,
            poison,
            state: QState::Queued,
            visible_at: now,
            token: 0,
            attempts: 0,
            receives: 0,
            behind,
        });
        id
    }

    /// Up to `n` visible messages whose key is not in `skip`, oldest
    /// visible first, each under a lease of `lease` ms (with key order,
    /// only heads of their key's line are in the ready index).
    pub fn claim(&mut self, n: usize, lease: Ms, skip: &[u32], now: Ms) -> Vec<Delivery> {
        let ready: Vec<u32> = self
            .queued
            .range(..=(now, u32::MAX))
            .map(|&(_, id)| id)
            .filter(|&id| {
                self.msgs[id as usize]
                    .key
                    .is_none_or(|k| !skip.contains(&k))
            })
            .take(n)
            .collect();
        ready
            .into_iter()
            .map(|id| {
                self.next_token += 1;
                let token = self.next_token;
                self.move_to(id, now + lease, token);
                let m = &mut self.msgs[id as usize];
                m.receives += 1;
                Delivery {
                    id: m.id,
                    key: m.key,
                    poison: m.poison,
                    token: m.token,
                    attempts: m.attempts,
                    receives: m.receives,
                }
            })
            .collect()
    }

    /// Makes `id` visible at `at` (leased with `token`, or 0).
    fn move_to(&mut self, id: u32, at: Ms, token: u64) {
        let m = &mut self.msgs[id as usize];
        self.queued.remove(&(m.visible_at, id));
        self.queued.insert((at, id));
        if m.token == 0 && token != 0 {
            self.leased += 1;
        } else if m.token != 0 && token == 0 {
            self.leased -= 1;
        }
        m.visible_at = at;
        m.token = token;
    }

    /// Settles `id` for good; with key order, the next of its key's line
    /// becomes claimable.
    fn finish(&mut self, id: u32, state: QState) {
        let m = &mut self.msgs[id as usize];
        self.queued.remove(&(m.visible_at, id));
        if m.token != 0 {
            self.leased -= 1;
        }
        m.token = 0;
        m.state = state;
        let key = m.key;
        let (Some(lines), Some(key)) = (self.lines.as_mut(), key) else {
            return;
        };
        let Some(line) = lines.get_mut(&key) else {
            return;
        };
        debug_assert_eq!(line.front(), Some(&id), "only a head is settled");
        line.pop_front();
        match line.front().copied() {
            Some(next) => {
                let n = &mut self.msgs[next as usize];
                n.behind = false;
                self.behind -= 1;
                self.queued.insert((n.visible_at, next));
            }
            None => {
                lines.remove(&key);
            }
        }
    }

    /// The message if `token` still holds its lease.
    fn leased(&mut self, id: u32, token: u64, now: Ms) -> Option<&mut QMsg> {
        self.msgs.get_mut(id as usize).filter(|m| {
            m.state == QState::Queued && !m.behind && m.token == token && m.visible_at > now
        })
    }

    pub fn ack(&mut self, id: u32, token: u64, now: Ms) -> bool {
        if self.leased(id, token, now).is_none() {
            return false;
        }
        self.finish(id, QState::Acked);
        self.acked += 1;
        true
    }

    pub fn retry_later(&mut self, id: u32, token: u64, delay: Ms, now: Ms) -> bool {
        let Some(m) = self.leased(id, token, now) else {
            return false;
        };
        m.attempts += 1;
        self.move_to(id, now + delay, 0);
        true
    }

    pub fn release(&mut self, id: u32, token: u64, delay: Ms, now: Ms) -> bool {
        let Some(m) = self.leased(id, token, now) else {
            return false;
        };
        m.receives = m.receives.saturating_sub(1);
        self.move_to(id, now + delay, 0);
        true
    }

    pub fn dead_letter(&mut self, id: u32, token: u64, class: &'static str, now: Ms) -> bool {
        if self.leased(id, token, now).is_none() {
            return false;
        }
        self.finish(id, QState::Dead(class));
        self.dead += 1;
        true
    }

    /// Keeps the lease of a message still being worked on.
    pub fn extend(&mut self, id: u32, token: u64, lease: Ms, now: Ms) {
        if self.leased(id, token, now).is_some() {
            self.move_to(id, now + lease, token);
        }
    }

    /// Visible, in flight (leased), delayed: as `stats` counts them.
    /// (A lapsed lease counts as visible; the leases counted in flight
    /// may include it, so in flight is at most the rest. Messages behind a
    /// head count as visible, as on the segment log.)
    pub fn counts(&self, now: Ms) -> (u64, u64, u64) {
        let total = self.queued.len() as u64;
        let visible = self.queued.range(..=(now, u32::MAX)).count() as u64;
        let in_flight = self.leased.min(total - visible);
        (
            visible + self.behind,
            in_flight,
            total - visible - in_flight,
        )
    }

    pub fn unsettled(&self) -> usize {
        self.queued.len() + usize::try_from(self.behind).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(d: &[Delivery]) -> Vec<u32> {
        d.iter().map(|d| d.id).collect()
    }

    #[test]
    fn with_key_order_only_the_head_is_claimed_until_it_is_acked_or_dead() {
        let mut q = SimQueue::new(KeyOrder::Key);
        let a = q.enqueue(Some(7), false, 0);
        let b = q.enqueue(Some(7), false, 1);
        let c = q.enqueue(Some(7), false, 2);
        let other = q.enqueue(Some(8), false, 3);
        let none = q.enqueue(None, false, 4);
        assert_eq!(q.counts(10), (5, 0, 0));
        let got = q.claim(10, 1_000, &[], 10);
        assert_eq!(ids(&got), vec![a, other, none]);
        assert!(q.ack(other, got[1].token, 15) && q.ack(none, got[2].token, 15));
        // Retried: still the head, and nothing of its key meanwhile.
        assert!(q.retry_later(a, got[0].token, 100, 20));
        assert!(q.claim(10, 1_000, &[], 50).is_empty());
        let again = q.claim(10, 1_000, &[], 120);
        assert_eq!(ids(&again), vec![a]);
        // Released: still the head.
        assert!(q.release(a, again[0].token, 0, 130));
        let again = q.claim(10, 1_000, &[], 130);
        assert_eq!(ids(&again), vec![a]);
        // Lapsed: still the head.
        let lapsed = q.claim(10, 1_000, &[], 1_200);
        assert_eq!(ids(&lapsed), vec![a]);
        assert!(
            !q.ack(a, again[0].token, 1_200),
            "a lapsed token settles nothing"
        );
        // Acked: the next one goes on.
        assert!(q.ack(a, lapsed[0].token, 1_210));
        let next = q.claim(10, 1_000, &[], 1_210);
        assert_eq!(ids(&next), vec![b]);
        // Dead-lettered: the next one goes on too.
        assert!(q.dead_letter(b, next[0].token, "exhausted", 1_220));
        assert_eq!(ids(&q.claim(10, 1_000, &[7], 1_220)), Vec::<u32>::new());
        assert_eq!(ids(&q.claim(10, 1_000, &[], 1_220)), vec![c]);
        assert_eq!(q.unsettled(), 1);
    }

    #[test]
    fn without_key_order_any_visible_message_is_claimed() {
        let mut q = SimQueue::new(KeyOrder::None);
        let a = q.enqueue(Some(7), false, 0);
        let b = q.enqueue(Some(7), false, 1);
        let got = q.claim(1, 1_000, &[], 10);
        assert_eq!(ids(&got), vec![a]);
        assert!(q.retry_later(a, got[0].token, 100, 20));
        assert_eq!(ids(&q.claim(10, 1_000, &[], 20)), vec![b]);
    }
}
