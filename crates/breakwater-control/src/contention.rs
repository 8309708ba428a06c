//! Telling one hot key's lock trouble from the database's.
//!
//! A row lock held on one entity key (order 1042) makes every apply of that
//! key time out on the lock; the hot-key lanes set the key aside, and the
//! breaker should not pause every other key for it. But lock timeouts on
//! many keys at once (a table lock, a migration) are the database's
//! trouble. [`KeyContention`] draws the line: a lock timeout is one key's
//! trouble while lock timeouts in the last `window` touched fewer than
//! `max_keys` distinct keys.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

/// Recent lock timeouts by key.
#[derive(Debug, Clone)]
pub struct KeyContention {
    window: Duration,
    max_keys: usize,
    /// (when, hash of the key), oldest first.
    recent: VecDeque<(Instant, u64)>,
}

impl Default for KeyContention {
    /// Three distinct keys within 10 s is the database's trouble.
    fn default() -> Self {
        Self::new(Duration::from_secs(10), 3)
    }
}

impl KeyContention {
    pub fn new(window: Duration, max_keys: usize) -> Self {
        Self {
            window,
            max_keys: max_keys.max(2),
            recent: VecDeque::new(),
        }
    }

    /// Records a lock timeout on `key` at `now`; `true` while it is one
    /// key's trouble, `false` once the recent ones span `max_keys` keys.
    pub fn is_one_keys_trouble(&mut self, key: &str, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > self.window)
        {
            self.recent.pop_front();
        }
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let key = h.finish();
        // One entry per key: a hot key failing a thousand times is one key.
        self.recent.retain(|(_, k)| *k != key);
        self.recent.push_back((now, key));
        self.recent.len() < self.max_keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hot_key_stays_its_own_trouble_and_many_keys_do_not() {
        let mut c = KeyContention::default();
        let t = Instant::now();
        for i in 0..100 {
            assert!(c.is_one_keys_trouble("1042", t + Duration::from_millis(i * 10)));
        }
        assert!(c.is_one_keys_trouble("7", t + Duration::from_secs(1)));
        assert!(
            !c.is_one_keys_trouble("8", t + Duration::from_secs(1)),
            "three keys"
        );
        // Long after, one key alone again.
        assert!(c.is_one_keys_trouble("9", t + Duration::from_secs(30)));
    }
}
