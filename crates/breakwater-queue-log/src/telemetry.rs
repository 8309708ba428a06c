//! The log backend's own metric names; the group-commit ones are the
//! embedded queue's, so dashboards read either backend alike.

pub use breakwater_queue_embedded::telemetry::{QUEUE_COMMIT_BATCH, QUEUE_COMMIT_SECONDS};

/// Segments reclaimed once nothing in them was live (deleted, or
/// recycled as the next segment).
pub const QUEUE_SEGMENTS_RECLAIMED: &str = "breakwater_queue_segments_reclaimed_total";

/// Segments made from settled ones (recycled at once, or kept free and
/// reused later) instead of zero-filled.
pub const QUEUE_SEGMENTS_RECYCLED: &str = "breakwater_queue_segments_recycled_total";

/// Blank segments zero-filled ahead while the writer idled
/// ([`crate::blanks`]).
pub const QUEUE_SEGMENTS_MADE_AHEAD: &str = "breakwater_queue_segments_made_ahead_total";
