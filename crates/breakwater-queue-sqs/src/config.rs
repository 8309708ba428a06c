//! The SQS backend's own keys of the `[queue]` table (beside `backend`,
//! `url`, `name` and `lease_ms`).

use serde::{Deserialize, Serialize};

/// `[queue]` keys of the `sqs` backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqsConfig {
    /// The AWS region. Unset: the AWS chain's (`AWS_REGION`, the profile),
    /// else `us-east-1`; for a local `http://` endpoint, `AWS_REGION` or
    /// `us-east-1`, without the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The queue dead letters go to. Unset: `<name>-dlq` (`<base>-dlq.fifo`
    /// for a FIFO queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dlq_name: Option<String>,
    /// `maxReceiveCount` of the redrive policy Breakwater sets on a queue
    /// it creates (the queue's own backstop into the DLQ, for a message
    /// that crashes every worker that takes it). Breakwater dead-letters
    /// failed messages itself, with their reason; this count must leave
    /// room for the releases a breaker and a parked key cause. An existing
    /// queue keeps its policy, which is checked at start.
    pub max_receive_count: u32,
    /// Longest a receive waits for a message (SQS long polling), in whole
    /// seconds, 0 to 20, while the process holds no claim (an idle worker;
    /// one with messages applying or held polls without waiting, to come
    /// back to them). A breaker that opens during a poll waits for it and
    /// hands back what it took.
    pub wait_time_secs: u32,
    /// Most receives one claim sends at once (each takes up to 10
    /// messages).
    pub receive_concurrency: usize,
    /// Most send or delete batches in flight at once; webhooks arriving
    /// while they are all busy wait and go in the next batch (up to 10).
    pub batches_in_flight: usize,
    /// Longest wait for SQS to answer one attempt of a call (a receive:
    /// beyond its long poll), in milliseconds; the SDK tries a call up to 3
    /// times (with backoff) before it fails.
    pub request_timeout_ms: u64,
    /// Most dead letters a `dlq` command reads through (SQS cannot address
    /// a message in a queue: listing receives them and hands them back).
    pub dlq_scan_max: usize,
}

impl Default for SqsConfig {
    fn default() -> Self {
        Self {
            region: None,
            dlq_name: None,
            max_receive_count: 100,
            wait_time_secs: 1,
            receive_concurrency: 4,
            batches_in_flight: 16,
            request_timeout_ms: 5_000,
            dlq_scan_max: 2_000,
        }
    }
}
