//! The admin API's requests and answers, typed once and shared by the
//! admin server (`breakwater serve`), the CLI (`breakwater breaker ...`) and
//! the dashboard, so none of them reads JSON by string keys.
//!
//! | route | request | answer |
//! |---|---|---|
//! | `GET /breaker` | | [`BreakerView`] |
//! | `POST /breaker/trip` | [`TripQuery`] | [`TransitionAnswer`] |
//! | `POST /breaker/reset` | [`ResetQuery`] | [`TransitionAnswer`] |
//! | `GET /queue/stats` | | [`QueueStats`] |
//! | `GET /queue` | | [`QueueView`] |
//! | `GET /dlq` | [`DlqPage`] and [`DlqFilter`] | [`DlqList`] |
//! | `GET /dlq/{id}` | | [`DeadLetter`] |
//! | `POST /dlq/replay` | [`ReplayRequest`] | [`ReplayStatus`] |
//! | `GET /dlq/replay` | | [`ReplayStatus`] |
//! | `POST /dlq/purge` | [`PurgeRequest`] | [`PurgeAnswer`] |
//! | `GET /events/{source}/{event_id}` | | [`EventStory`] |
//! | any, on failure | | [`ErrorBody`] with a 4xx or 5xx status |

pub use breakwater_control::{BreakerStatus, State};
pub use breakwater_queue::{DeadLetter, DlqFilter, DlqPage, QueueStats};
use serde::{Deserialize, Serialize};

/// `GET /breaker`: the breaker this process runs, or where it lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakerView {
    /// Where the breaker that gates this deployment's workers runs.
    pub location: BreakerLocation,
    /// Its full status; `None` where this process runs no breaker (an
    /// ingress-only node).
    pub breaker: Option<BreakerStatus>,
    /// Entity keys the workers' lanes have set aside after lock failures.
    #[serde(default)]
    pub parked_keys: Vec<ParkedKey>,
    /// Sessions waiting on a lock, as the database last reported them.
    pub db_lock_waiters: Option<u32>,
    /// What the queue's own settings could do to the workers' messages
    /// (a broker redelivery limit, SQS `maxReceiveCount`, with too little
    /// room for releases), found when the process started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue_warnings: Vec<String>,
    /// The fleet this process belongs to (`[fleet]`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetInfo>,
    /// Time left before the oldest queued message expires on the broker,
    /// when `queue.retention_secs` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<breakwater_control::RetentionStatus>,
}

/// `GET /queue`: the queue's counts, its oldest message, and how fast the
/// backlog drains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    pub visible: Option<u64>,
    pub in_flight: Option<u64>,
    pub delayed: Option<u64>,
    pub dead_lettered: Option<u64>,
    /// Age of the visible message at the head of the queue, seconds.
    pub oldest_age_secs: Option<f64>,
    /// How fast the backlog shrinks, messages per second (negative: it
    /// grows); none on a process that runs no workers.
    pub net_drain_per_sec: Option<f64>,
    /// Seconds to drain the backlog at that rate (none while it does not
    /// shrink).
    pub drain_secs: Option<f64>,
    /// The retention headroom, when `queue.retention_secs` is set.
    pub retention: Option<breakwater_control::RetentionStatus>,
}

/// A fleet as one of its nodes sees it (`GET /breaker`, `breakwater fleet
/// status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetInfo {
    /// This node's id (absent where the view was read from the store, not
    /// from a node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Where this node stands: `leader` (holds the controller lease and
    /// evaluates), `follower`, `observer` (runs no workers) or `fallback`
    /// (the store cannot be reached: it decides alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standing: Option<String>,
    /// Whether this node is on local fallback.
    #[serde(default)]
    pub fallback: bool,
    /// The Redis key prefix of the deployment.
    pub prefix: String,
    /// The node holding the controller lease.
    pub lease_holder: Option<String>,
    /// The shared breaker record: its state and generation.
    pub state: Option<State>,
    pub generation: Option<u64>,
    /// Every node that beat lately.
    pub nodes: Vec<FleetNode>,
}

/// One node of a fleet, from its latest heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    pub node: String,
    /// `ingress`, `worker` or `all`.
    pub role: String,
    /// The breaker state it applies.
    pub state: Option<State>,
    /// Milliseconds since its last heartbeat.
    pub last_beat_ms_ago: u64,
    /// Worker slots, and how many are waiting on a lock.
    pub slots: usize,
    pub lock_waits: usize,
    /// The entity keys its waiting slots are locked on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lock_targets: Vec<String>,
    /// Whether it said it was on local fallback.
    pub fallback: bool,
    /// Whether it holds the controller lease.
    pub leader: bool,
}

/// Where the breaker runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BreakerLocation {
    /// In this process, beside its workers.
    Local,
    /// With the workers, in other processes (this one runs only the
    /// ingress, which never gates on the breaker).
    WithTheWorkers { detail: String },
    /// Shared by the fleet (`[fleet]`): every node follows one record, the
    /// lease holder evaluates; `breaker` is this node's copy.
    Fleet,
}

/// A key parked by the hot-key lanes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedKey {
    pub key: String,
    /// Until its messages are tried again.
    pub remaining_ms: u64,
    /// Lock failures in a row.
    pub strikes: u32,
}

/// Query of `POST /breaker/trip`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TripQuery {
    /// Resume automatic control after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// Why, for the logs and `breaker status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Query of `POST /breaker/reset`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetQuery {
    /// Force the breaker closed instead of ending the manual override.
    #[serde(default)]
    pub force_closed: bool,
    /// With `force_closed`: resume automatic control after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}

/// Answer of `POST /breaker/trip` and `/breaker/reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionAnswer {
    /// The transition made, in words; `None` when nothing changed (a reset
    /// with no override in force).
    pub transition: Option<String>,
    /// The state after the call.
    pub state: State,
}

/// Answer of `GET /dlq`: one page of dead letters, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DlqList {
    pub items: Vec<DeadLetter>,
    /// Pass as `after` for the next page; `None` on the last one.
    pub next_after: Option<String>,
    /// With a filter: dead letters read to find these (a filtered page
    /// reads at most a bounded number, then answers with `next_after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scanned: Option<usize>,
}

/// Most earlier dead letters of its key an [`EventStory`] names.
pub const EARLIER_DEAD_LETTERS_SHOWN: usize = 5;

/// `GET /events/{source}/{event_id}`: one webhook's story, from what the
/// sink's inbox, the DLQ and this node's attempt history know of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventStory {
    pub source: String,
    pub event_id: String,
    pub state: EventState,
    /// The state in words, with where to look next when it is unknown.
    pub detail: String,
    /// Where the source's events are applied: the database (its URL
    /// without a password) or the forward target; `None` on a node that
    /// runs no workers.
    pub destination: Option<String>,
    /// Its inbox row, when the sink applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedRecord>,
    /// Its dead letter (without the body: `GET /dlq/{id}` has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// Dead letters of the same source and entity key received before it,
    /// newest first (at most [`EARLIER_DEAD_LETTERS_SHOWN`], without
    /// bodies): with key order its key's later events did not wait for
    /// them, so it may have been applied over a state they never set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_dead_letters: Vec<DeadLetter>,
    /// Every attempt this node made, oldest first (the latest
    /// [`EventStory::attempts_dropped`] past the cap are kept).
    pub attempts: Vec<AttemptRecord>,
    /// Older attempts no longer kept.
    #[serde(default)]
    pub attempts_dropped: u32,
    /// The node whose history `attempts` come from, and how far back it
    /// reaches.
    pub history: HistoryScope,
    /// Lookups that failed (the database did not answer, the DLQ could
    /// not be read): the story may be short of what they hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lookup_errors: Vec<String>,
}

/// Where an event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    /// Its effect is in the database (its inbox row), or a forward target
    /// answered 2xx.
    Applied,
    /// In the DLQ.
    DeadLettered,
    /// Tried and not settled: waiting for its retry, or handed back.
    Pending,
    /// Neither applied, dead-lettered, nor tried on this node lately.
    Unknown,
}

/// An event's inbox row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRecord {
    /// Milliseconds since the Unix epoch.
    pub received_at_ms: i64,
    pub applied_at_ms: Option<i64>,
    pub entity_key: Option<String>,
    /// The event whose newer version its entity key already held when it
    /// came: it was superseded (settled, its statements not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}

/// One attempt at an event, as the worker settled it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// When it was settled, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The attempt's number (1 the first time; a release does not count
    /// one, so two records can share it).
    pub attempt: u32,
    /// `applied`, `duplicate`, `retried`, `released` or `dead_lettered`.
    pub outcome: String,
    /// `dependency` or `permanent`, for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The failure's short name (`lock_timeout`, `constraint`, `http_503`
    /// ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why a message went back untried (a parked key, the breaker opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// How long the apply took.
    pub apply_ms: u64,
    /// A half-open probe.
    #[serde(default)]
    pub probe: bool,
}

/// Whose attempt history an [`EventStory`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryScope {
    /// The node (`[fleet] node_id`, else the host name).
    pub node: String,
    /// Events it remembers now, and at most (`admin.event_history`; 0 off,
    /// or a node that runs no workers).
    pub events: usize,
    pub capacity: usize,
}

/// Body of `POST /dlq/replay`: the dead letters to put back (`ids`, or
/// `all`), at most `rate` a second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// Ids as `GET /dlq` shows them.
    #[serde(default)]
    pub ids: Vec<String>,
    /// Every dead letter instead of named ones.
    #[serde(default)]
    pub all: bool,
    /// Messages per second (100).
    #[serde(default = "ReplayRequest::default_rate")]
    pub rate: f64,
    /// Replays per message before it is refused (3): no loops.
    #[serde(default = "ReplayRequest::default_max_replays")]
    pub max_replays: u32,
}

impl ReplayRequest {
    fn default_rate() -> f64 {
        100.0
    }
    fn default_max_replays() -> u32 {
        3
    }
}

/// `GET /dlq/replay`, and the answer of `POST /dlq/replay` (202): the
/// replay running now, or the last one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayStatus {
    pub running: bool,
    /// How many ids were named; `None` for the whole DLQ.
    pub requested: Option<usize>,
    /// Messages per second.
    pub rate: f64,
    /// Put back so far.
    pub replayed: usize,
    /// Named but not put back: not in the DLQ, or replayed `max_replays`
    /// times already.
    pub skipped: usize,
    /// Held while the breaker is open.
    pub waiting_for_breaker: bool,
    /// Milliseconds since it started.
    pub started_ago_ms: u64,
    /// Why it stopped early, if it did.
    pub error: Option<String>,
}

/// Body of `POST /dlq/purge`: the dead letters to delete (`ids`, or
/// `all`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeRequest {
    #[serde(default)]
    pub ids: Vec<String>,
    #[serde(default)]
    pub all: bool,
}

/// Answer of `POST /dlq/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeAnswer {
    /// Dead letters deleted.
    pub purged: usize,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable code: `unauthorized`, `forbidden`, `queue`, `not_found`,
    /// `no_breaker`, `bad_request`, `replay_running`.
    pub error: String,
    pub detail: String,
}

impl ErrorBody {
    pub fn new(error: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ingress_only_view_round_trips_and_says_where_the_breaker_is() {
        let view = BreakerView {
            location: BreakerLocation::WithTheWorkers {
                detail: "run by the worker processes".into(),
            },
            breaker: None,
            parked_keys: Vec::new(),
            db_lock_waiters: None,
            queue_warnings: vec!["the queue's own redelivery limit is 5".into()],
            fleet: None,
            retention: None,
        };
        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["location"]["kind"], "with_the_workers");
        assert!(json["breaker"].is_null());
        let back: BreakerView = serde_json::from_value(json).expect("back");
        assert_eq!(back, view);
    }
}
