//! Reading one event's inbox row back: whether the sink applied it and
//! when, for the admin API's event lookup (`GET /events/{source}/{id}`).
//! The row is the proof of an effect: the sink writes it in the same
//! transaction as the source's statements.

/// One event's row in the inbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRecord {
    /// When the ingress accepted it, milliseconds since the Unix epoch.
    pub received_at_ms: i64,
    /// When the transaction that applied it ran (its commit followed).
    pub applied_at_ms: Option<i64>,
    pub entity_key: Option<String>,
    /// Set when it was superseded: the event whose newer version its
    /// entity key already held (its statements did not run).
    pub superseded_by: Option<String>,
}

/// What the sink that applies a source's events knows of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxLookup {
    /// Applied: its inbox row.
    Found(InboxRecord),
    /// Not in the inbox: never applied (or pruned from it by the operator).
    Absent,
    /// This sink keeps no inbox (a forward target: the service it
    /// forwards to deduplicates on the idempotency key).
    NotKept,
}
