//! The dead-letter queue's records, as every backend reports them.

use serde::{Deserialize, Serialize};

/// Why a message left for the DLQ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterReason {
    /// `permanent` (poison) or `exhausted` (retries used up).
    pub class: String,
    pub error: String,
}

/// Which dead letters [`crate::Queue::dlq_list`] returns: the oldest
/// `limit` after the id `after` (exclusive), so a caller can page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DlqPage {
    pub limit: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

impl DlqPage {
    /// The first `limit` dead letters.
    pub fn first(limit: usize) -> Self {
        Self { limit, after: None }
    }
}

/// One dead-lettered message, for `dlq list|show` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub id: String,
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub attempts: u32,
    pub replays: u32,
    pub class: String,
    pub error: String,
    pub received_at_ms: i64,
    pub dead_at_ms: i64,
    /// The body (as text, lossily), in `dlq show` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}
