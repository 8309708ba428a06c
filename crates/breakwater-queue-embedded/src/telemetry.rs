//! The embedded queue's own metric names (the service's `telemetry` module
//! re-exports them, so every name Breakwater emits is listed in one place).

/// Duration of one group commit, in seconds.
pub const QUEUE_COMMIT_SECONDS: &str = "breakwater_queue_commit_seconds";
/// Time an enqueue waited for the writer to start the group commit that
/// holds it (the commit in progress, then the linger), in seconds.
pub const QUEUE_ENQUEUE_WAIT_SECONDS: &str = "breakwater_queue_enqueue_wait_seconds";
/// Operations per group commit.
pub const QUEUE_COMMIT_BATCH: &str = "breakwater_queue_commit_batch_size";
/// Event ids held by the in-memory dedup index.
pub const QUEUE_DEDUP_ENTRIES: &str = "breakwater_queue_dedup_entries";
/// Event ids left out of the full dedup index (`dedup_index_max`).
pub const QUEUE_DEDUP_UNINDEXED: &str = "breakwater_queue_dedup_unindexed_total";
