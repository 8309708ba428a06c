//! Breakwater's fleet store on Redis: many processes, one breaker.
//!
//! | module | what lives there |
//! |---|---|
//! | [`keys`] | every key and channel under a deployment's prefix |
//! | [`beat`] | a node's heartbeat (slots in the article's shape, its outcome tally) and the lease value |
//! | [`scripts`] | the Lua scripts: record compare-and-set, the beat, probe slots |
//! | [`store`] | [`RedisFleet`]: the control crate's `BreakerStore` and `ProbeSlots` on Redis, the beat, the change feed, the fleet view |
//!
//! What Redis holds for one prefix:
//!
//! | key | type | what |
//! |---|---|---|
//! | `<prefix>:breaker` | string | the breaker record (JSON, with its generation), changed only by compare-and-set, each change published on `<prefix>:breaker:changes` |
//! | `<prefix>:lease` | string, TTL | the controller lease: `<node> <expiry ms>` |
//! | `<prefix>:nodes` | hash | node id -> its latest beat (JSON); a beat older than the heartbeat TTL is not live |
//! | `<prefix>:probes:<period>` | sorted set | probe slots held in a half-open period, scored by expiry (the Redis server's clock) |
//! | `<prefix>:probes:<period>:ok` | counter | probe successes in that period, fleet-wide |
//! | `<prefix>:keys:parked` | channel | hot-key parks and their ends, so a key parked on one node is parked on all |
//!
//! Cost: one beat per node per second is one `EVALSHA` running `MGET`, and
//! `HSET` when the node has something new to tell (the lease holder adds
//! `SET` and `HGETALL`); transitions and probes add a few commands each,
//! and nothing is per message.

pub mod beat;
pub mod keys;
pub mod scripts;
pub mod store;

pub use beat::{KeyPark, Lease, NodeBeat, NodeRole, SlotBeat, SlotState};
pub use keys::Keys;
pub use store::{FleetError, FleetView, RedisFleet, SyncAnswer, new_epoch, now_ms};
