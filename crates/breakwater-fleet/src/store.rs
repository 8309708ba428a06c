//! [`RedisFleet`]: the fleet store on Redis behind the control crate's
//! seams ([`BreakerStore`], [`ProbeSlots`]), plus what only a fleet has:
//! the per-second beat that carries heartbeats and the controller lease,
//! the change feed, and the read `breakwater fleet status` shows.
//!
//! Every call is bounded by the connection's response timeout, so a Redis
//! that hangs looks like one that is down: [`CoordinationError`], and the
//! node decides alone.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use breakwater_control::{
    BreakerRecord, BreakerStore, CoordinationError, ProbeSlot, ProbeSlots, Version,
};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};
use serde::de::DeserializeOwned;

use crate::beat::{KeyPark, Lease, NodeBeat};
use crate::keys::Keys;
use crate::scripts;

/// How long one Redis call may take before the store counts as down.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("invalid fleet redis_url: {0}")]
    Url(String),
}

/// What a beat brought back.
#[derive(Debug, Clone, Default)]
pub struct SyncAnswer {
    /// The lease as it stands after the beat.
    pub lease: Option<Lease>,
    /// Whether this node holds it.
    pub leader: bool,
    /// The breaker record (the backstop to the change feed).
    pub record: Option<BreakerRecord>,
    /// Every node's beat, this one's included: read for the lease holder
    /// only (it evaluates the fleet's signals).
    pub beats: Vec<NodeBeat>,
}

/// Everything `breakwater fleet status` shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetView {
    pub lease: Option<Lease>,
    pub record: Option<BreakerRecord>,
    pub beats: Vec<NodeBeat>,
}

struct Scripts {
    compare_and_set: Script,
    sync: Script,
    release_lease: Script,
    take_probe_slot: Script,
    give_back_probe_slot: Script,
}

/// The fleet store of one deployment (one prefix) on Redis.
pub struct RedisFleet {
    client: redis::Client,
    conn: ConnectionManager,
    keys: Keys,
    node: String,
    scripts: Scripts,
}

impl std::fmt::Debug for RedisFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFleet")
            .field("prefix", &self.keys.prefix())
            .field("node", &self.node)
            .finish()
    }
}

fn unavailable(e: impl std::fmt::Display) -> CoordinationError {
    CoordinationError::Unavailable(e.to_string())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Wall-clock milliseconds now (Unix), as records and beats carry them.
pub fn now_ms() -> u64 {
    unix_ms()
}

/// A new store epoch, for the first record of a store: the time in
/// microseconds, below 2^53 (exact in Lua) until the year 2255.
pub fn new_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(1))
}

impl RedisFleet {
    /// A store for `node` under `prefix`. Connects lazily: a Redis that is
    /// down at start is a store whose calls fail until it is up.
    pub fn open(url: &str, prefix: &str, node: &str) -> Result<Self, FleetError> {
        let client = redis::Client::open(url).map_err(|e| FleetError::Url(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = client
            .get_connection_manager_lazy(config)
            .map_err(|e| FleetError::Url(e.to_string()))?;
        Ok(Self {
            client,
            conn,
            keys: Keys::new(prefix),
            node: node.to_owned(),
            scripts: Scripts {
                compare_and_set: Script::new(scripts::COMPARE_AND_SET),
                sync: Script::new(scripts::SYNC),
                release_lease: Script::new(scripts::RELEASE_LEASE),
                take_probe_slot: Script::new(scripts::TAKE_PROBE_SLOT),
                give_back_probe_slot: Script::new(scripts::GIVE_BACK_PROBE_SLOT),
            },
        })
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The key names.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// One beat: stores `beat` (when `store_beat`), takes or renews the
    /// controller lease for `lease_ttl` when given (a node that runs no
    /// breaker passes `None`), reads the record, and for the lease holder
    /// every node's beat. One round trip.
    pub async fn sync(
        &self,
        beat: &NodeBeat,
        store_beat: bool,
        lease_ttl: Option<Duration>,
    ) -> Result<SyncAnswer, CoordinationError> {
        let json = serde_json::to_string(beat).map_err(unavailable)?;
        let ttl = lease_ttl.unwrap_or(Duration::ZERO);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let lease_value = Lease::encode(&self.node, unix_ms().saturating_add(ttl_ms));
        let (lease, record, beats): (String, String, Vec<String>) = self
            .scripts
            .sync
            .key(self.keys.beats())
            .key(self.keys.lease())
            .key(self.keys.record())
            .arg(&self.node)
            .arg(json)
            .arg(lease_value)
            .arg(ttl_ms)
            .arg(if lease_ttl.is_some() { "1" } else { "0" })
            .arg(if store_beat { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let lease = Lease::decode(&lease);
        Ok(SyncAnswer {
            leader: lease.as_ref().is_some_and(|l| l.holder == self.node),
            lease,
            record: parse_record(&record),
            beats: parse_beats(&beats),
        })
    }

    /// Gives the controller lease up, if this node holds it (a clean stop
    /// hands over at once, not after the lease time).
    pub async fn release_lease(&self) -> Result<(), CoordinationError> {
        let _: i64 = self
            .scripts
            .release_lease
            .key(self.keys.lease())
            .arg(&self.node)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Removes nodes' beats (nodes long gone).
    pub async fn forget_nodes(&self, nodes: &[String]) -> Result<(), CoordinationError> {
        if nodes.is_empty() {
            return Ok(());
        }
        let _: i64 = self
            .conn
            .clone()
            .hdel(self.keys.beats(), nodes)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// The records other nodes store, as they are stored: a stream that
    /// ends when the connection is lost (subscribe again to go on).
    pub async fn changes(&self) -> Result<BoxStream<'static, BreakerRecord>, CoordinationError> {
        self.subscribe(self.keys.channel()).await
    }

    /// Announces a hot-key park (or its end, `park_ms` 0) to the fleet.
    pub async fn publish_key_park(&self, park: &KeyPark) -> Result<(), CoordinationError> {
        let json = serde_json::to_string(park).map_err(unavailable)?;
        let _: i64 = self
            .conn
            .clone()
            .publish(self.keys.key_parks(), json)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// The hot-key parks announced by any node (this one's included): a
    /// stream that ends when the connection is lost.
    pub async fn key_parks(&self) -> Result<BoxStream<'static, KeyPark>, CoordinationError> {
        self.subscribe(self.keys.key_parks()).await
    }

    /// The JSON messages of `channel`, read as `T` (one that cannot be read
    /// is skipped, with a warning), on a connection of its own: a stream
    /// that ends when that connection is lost.
    async fn subscribe<T: DeserializeOwned + Send + 'static>(
        &self,
        channel: String,
    ) -> Result<BoxStream<'static, T>, CoordinationError> {
        let mut pubsub = tokio::time::timeout(RESPONSE_TIMEOUT, self.client.get_async_pubsub())
            .await
            .map_err(unavailable)?
            .map_err(unavailable)?;
        tokio::time::timeout(RESPONSE_TIMEOUT, pubsub.subscribe(&channel))
            .await
            .map_err(unavailable)?
            .map_err(unavailable)?;
        Ok(pubsub
            .into_on_message()
            .filter_map(move |msg| {
                let read = msg
                    .get_payload::<String>()
                    .map_err(|e| e.to_string())
                    .and_then(|p| serde_json::from_str(&p).map_err(|e| e.to_string()));
                if let Err(e) = &read {
                    tracing::warn!(channel = %channel, error = %e, "a fleet message could not be read");
                }
                std::future::ready(read.ok())
            })
            .boxed())
    }

    /// The fleet as it stands: lease, record, every node's beat.
    pub async fn view(&self) -> Result<FleetView, CoordinationError> {
        let mut conn = self.conn.clone();
        let (lease, record): (Option<String>, Option<String>) = redis::pipe()
            .get(self.keys.lease())
            .get(self.keys.record())
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let beats: Vec<String> = conn.hgetall(self.keys.beats()).await.map_err(unavailable)?;
        Ok(FleetView {
            lease: lease.as_deref().and_then(Lease::decode),
            record: record.as_deref().and_then(parse_record),
            beats: parse_beats(&beats),
        })
    }
}

fn parse_record(json: &str) -> Option<BreakerRecord> {
    if json.is_empty() {
        return None;
    }
    match serde_json::from_str(json) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "a breaker record in the fleet store could not be read");
            None
        }
    }
}

/// A flat `HGETALL` answer (field, value, ...) as beats; unreadable ones
/// are skipped.
fn parse_beats(flat: &[String]) -> Vec<NodeBeat> {
    flat.chunks_exact(2)
        .filter_map(|kv| serde_json::from_str(&kv[1]).ok())
        .collect()
}

#[async_trait]
impl BreakerStore for RedisFleet {
    async fn load(&self) -> Result<Option<BreakerRecord>, CoordinationError> {
        let json: Option<String> = self
            .conn
            .clone()
            .get(self.keys.record())
            .await
            .map_err(unavailable)?;
        Ok(json.as_deref().and_then(parse_record))
    }

    async fn compare_and_set(
        &self,
        expected: Option<Version>,
        record: BreakerRecord,
    ) -> Result<bool, CoordinationError> {
        let json = serde_json::to_string(&record).map_err(unavailable)?;
        let stored: i64 = self
            .scripts
            .compare_and_set
            .key(self.keys.record())
            .arg(expected.map_or(String::new(), |v| format!("{}:{}", v.epoch, v.generation)))
            .arg(json)
            .arg(self.keys.channel())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(stored == 1)
    }
}

#[async_trait]
impl ProbeSlots for RedisFleet {
    async fn try_take(
        &self,
        period: u64,
        limit: u32,
        ttl: Duration,
        _now: Instant,
    ) -> Result<Option<ProbeSlot>, CoordinationError> {
        let id: i64 = self
            .scripts
            .take_probe_slot
            .key(self.keys.probes(period))
            .key(self.keys.probe_ids())
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(u64::try_from(id).ok().map(|id| ProbeSlot { period, id }))
    }

    async fn give_back(&self, slot: ProbeSlot) -> Result<(), CoordinationError> {
        self.return_slot(slot, false).await.map(|_| ())
    }

    async fn succeeded(&self, slot: ProbeSlot) -> Result<u32, CoordinationError> {
        self.return_slot(slot, true).await
    }
}

impl RedisFleet {
    async fn return_slot(&self, slot: ProbeSlot, success: bool) -> Result<u32, CoordinationError> {
        let n: i64 = self
            .scripts
            .give_back_probe_slot
            .key(self.keys.probes(slot.period))
            .key(self.keys.probe_successes(slot.period))
            .arg(slot.id)
            .arg(if success { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(u32::try_from(n).unwrap_or(0))
    }
}
