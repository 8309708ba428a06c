//! The log backend's own metric names; the group-commit ones are the
//! embedded queue's, so dashboards read either backend alike.

pub use breakwater_queue_embedded::telemetry::{QUEUE_COMMIT_BATCH, QUEUE_COMMIT_SECONDS};

/// Segments deleted once nothing in them was live.
pub const QUEUE_SEGMENTS_RECLAIMED: &str = "breakwater_queue_segments_reclaimed_total";
