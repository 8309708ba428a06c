//! What a node says about itself every second (its heartbeat), and how the
//! controller lease is written: plain data, serialized as JSON.

use breakwater_control::{OutcomeTally, State};
use serde::{Deserialize, Serialize};

/// What a worker slot is doing, in the article's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SlotState {
    Idle,
    Applying,
    /// Applying for longer than the lock-wait threshold: waiting on a lock.
    DbLockWait,
}

/// One worker slot of a node, as of its node's beat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotBeat {
    /// The slot's number within its node.
    pub slot: u32,
    pub state: SlotState,
    /// The entity key being applied, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_target: Option<String>,
    /// How long the current apply has run.
    #[serde(default)]
    pub waited_ms: u64,
}

/// Which parts of the pipeline a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRole {
    Ingress,
    Worker,
    All,
}

impl NodeRole {
    /// Whether the node runs workers (and so a breaker).
    pub fn runs_workers(self) -> bool {
        self != Self::Ingress
    }
}

/// A node's heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeBeat {
    pub node: String,
    pub role: NodeRole,
    /// Wall-clock milliseconds (Unix) when it was sent.
    pub at_ms: u64,
    /// The breaker state this node applies, and the record generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    #[serde(default)]
    pub generation: u64,
    /// Whether it decides alone because the store could not be reached
    /// (said in the first beat after it can again).
    #[serde(default)]
    pub fallback: bool,
    /// Its worker slots.
    #[serde(default)]
    pub slots: Vec<SlotBeat>,
    /// Its outcomes since it started (the controller reads the difference).
    #[serde(default)]
    pub outcomes: OutcomeTally,
}

impl NodeBeat {
    /// Slots waiting on a lock.
    pub fn lock_waits(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state == SlotState::DbLockWait)
            .count()
    }
}

/// A hot-key park announced to the fleet: `node` parked `key` for
/// `park_ms` after a lock failure (0: its probe went through, the key is
/// free again). Brokers that cannot route a key to one worker use it so a
/// key parked on one node is parked on all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPark {
    pub node: String,
    pub key: String,
    pub park_ms: u64,
}

/// The controller lease's value: `<node> <expires at, Unix ms>`. The
/// expiry rides in the value so a follower knows when to try for the lease
/// without asking Redis for its TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub expires_at_ms: u64,
}

impl Lease {
    /// The value stored.
    pub fn encode(holder: &str, expires_at_ms: u64) -> String {
        format!("{holder} {expires_at_ms}")
    }

    /// Reads a stored value (a node id may hold spaces: the expiry is the
    /// last word).
    pub fn decode(value: &str) -> Option<Self> {
        let (holder, expiry) = value.rsplit_once(' ')?;
        Some(Self {
            holder: holder.to_owned(),
            expires_at_ms: expiry.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_with_spaces_in_the_holder() {
        let v = Lease::encode("host a:42", 1_700_000_000_123);
        let l = Lease::decode(&v).expect("lease");
        assert_eq!(l.holder, "host a:42");
        assert_eq!(l.expires_at_ms, 1_700_000_000_123);
        assert_eq!(Lease::decode("no-expiry"), None);
    }

    #[test]
    fn a_beat_reads_in_the_articles_shape() {
        let beat = NodeBeat {
            node: "w1".into(),
            role: NodeRole::Worker,
            at_ms: 5,
            state: Some(State::Closed),
            generation: 3,
            fallback: false,
            slots: vec![SlotBeat {
                slot: 0,
                state: SlotState::DbLockWait,
                lock_target: Some("order-1042".into()),
                waited_ms: 2_500,
            }],
            outcomes: OutcomeTally::default(),
        };
        let json = serde_json::to_value(&beat).expect("json");
        assert_eq!(json["slots"][0]["state"], "DB_LOCK_WAIT");
        assert_eq!(json["slots"][0]["lock_target"], "order-1042");
        let back: NodeBeat = serde_json::from_value(json).expect("back");
        assert_eq!(back, beat);
        assert_eq!(back.lock_waits(), 1);
    }
}
