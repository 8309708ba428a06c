//! A simulated queue with the contract's semantics (`breakwater-queue`'s
//! `Queue`): claims under a lease with a token, a lease that lapses makes
//! the message visible again, settles only with the current token, retries
//! count an attempt, releases do not, the DLQ keeps its reason.

use std::collections::BTreeSet;

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

#[derive(Debug, Default)]
pub struct SimQueue {
    pub msgs: Vec<QMsg>,
    /// Every queued message by `(visible_at, id)`: the ready index.
    queued: BTreeSet<(Ms, u32)>,
    /// Queued messages under a lease.
    leased: u64,
    next_token: u64,
    pub acked: u64,
    pub dead: u64,
}

impl SimQueue {
    pub fn enqueue(&mut self, key: Option<u32>, poison: bool, now: Ms) -> u32 {
        let id = u32::try_from(self.msgs.len()).unwrap_or(u32::MAX);
        self.queued.insert((now, id));
        self.msgs.push(QMsg {
            id,
            key,
            poison,
            state: QState::Queued,
            visible_at: now,
            token: 0,
            attempts: 0,
            receives: 0,
        });
        id
    }

    /// Up to `n` visible messages whose key is not in `skip`, oldest
    /// visible first, each under a lease of `lease` ms.
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

    /// Settles `id` for good.
    fn finish(&mut self, id: u32, state: QState) {
        let m = &mut self.msgs[id as usize];
        self.queued.remove(&(m.visible_at, id));
        if m.token != 0 {
            self.leased -= 1;
        }
        m.token = 0;
        m.state = state;
    }

    /// The message if `token` still holds its lease.
    fn leased(&mut self, id: u32, token: u64, now: Ms) -> Option<&mut QMsg> {
        self.msgs
            .get_mut(id as usize)
            .filter(|m| m.state == QState::Queued && m.token == token && m.visible_at > now)
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
    /// may include it, so in flight is at most the rest.)
    pub fn counts(&self, now: Ms) -> (u64, u64, u64) {
        let total = self.queued.len() as u64;
        let visible = self.queued.range(..=(now, u32::MAX)).count() as u64;
        let in_flight = self.leased.min(total - visible);
        (visible, in_flight, total - visible - in_flight)
    }

    pub fn unsettled(&self) -> usize {
        self.queued.len()
    }
}
