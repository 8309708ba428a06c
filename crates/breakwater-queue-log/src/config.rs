//! The segment-log backend's own keys of the `[queue]` table.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[queue]` keys of the log backend (beside the common `backend` and
/// `lease_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Directory holding the segments, the dedup file and the dead-letter
    /// store.
    pub path: PathBuf,
    /// Size of each segment file, preallocated when it is created. A
    /// webhook larger than a segment gets a segment of its own size.
    pub segment_bytes: u64,
    /// Most segments kept ready for the next rolls, so a burst writes no
    /// zeros until they run out: settled ones kept on disk
    /// (`free-<index>.log`) and, while there are fewer, blank ones
    /// zero-filled while the writer idles (`blank-<n>.log`). They hold about
    /// this many segments of disk beyond what the queue holds; 0 keeps and
    /// makes none. The default, 12 (768 MiB of 64 MiB segments), covers a
    /// flood of about 600k webhooks of 1 KiB on a store that has idled a
    /// couple of seconds: each roll past them zero-fills a segment beside
    /// the group commits, 10-20% of the ingress's rate while it lasts.
    pub free_segments: usize,
    /// Most bytes of the newest written data left in the page cache; what
    /// lies further behind the writer is let go of (a drain reads it back
    /// from disk, in order). Keeps a growing backlog from taking the
    /// memory the database beside it uses. 0: no bound, the kernel decides.
    pub cache_bytes: u64,
    /// How long an applied event id is remembered to answer redeliveries
    /// with 200 instead of queuing them twice, in seconds.
    pub dedup_window_secs: u64,
    /// Most event ids the dedup index holds (about 40 bytes each); past it
    /// a redelivery of a new one is queued again and the inbox applies it
    /// once.
    pub dedup_index_max: usize,
    /// Most operations written together with one fdatasync.
    pub max_batch: usize,
    /// Operations waiting for the writer before the ingress answers 503.
    pub max_pending: usize,
    /// Bytes of webhooks waiting for the writer before the ingress answers
    /// 503.
    pub max_pending_bytes: usize,
    /// The order claims keep (`workers.order`, set by the service; not a
    /// `[queue]` key).
    #[serde(skip)]
    pub key_order: breakwater_queue::KeyOrder,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("data/queue"),
            segment_bytes: 64 << 20,
            free_segments: 12,
            cache_bytes: 256 << 20,
            dedup_window_secs: 7 * 24 * 3600,
            dedup_index_max: 5_000_000,
            max_batch: 1024,
            max_pending: 16_384,
            max_pending_bytes: 256 * 1024 * 1024,
            key_order: breakwater_queue::KeyOrder::default(),
        }
    }
}

/// The smallest segment: a header and room for a few frames.
pub const MIN_SEGMENT_BYTES: u64 = 64 << 10;

impl LogConfig {
    /// The defaults with the store in `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }

    /// The `[queue]` table that selects the log backend with these keys.
    pub fn section(&self) -> breakwater_queue::QueueSection {
        breakwater_queue::QueueSection {
            backend: crate::BACKEND_NAME.to_owned(),
            // Every field is a plain value: this cannot fail.
            options: toml::Table::try_from(self).unwrap_or_default(),
            key_order: self.key_order,
            ..breakwater_queue::QueueSection::default()
        }
    }

    /// The log keys of a `[queue]` table, checked.
    pub fn from_section(
        section: &breakwater_queue::QueueSection,
    ) -> Result<Self, breakwater_queue::ConfigProblem> {
        use breakwater_queue::ConfigProblem;
        let config: Self = section.own()?;
        for (key, value) in [
            ("max_batch", config.max_batch),
            ("max_pending", config.max_pending),
            ("max_pending_bytes", config.max_pending_bytes),
        ] {
            if value == 0 {
                return Err(ConfigProblem::key(key, "must be at least 1"));
            }
        }
        if config.segment_bytes < MIN_SEGMENT_BYTES {
            return Err(ConfigProblem::key(
                "segment_bytes",
                format!("must be at least {MIN_SEGMENT_BYTES} (64 KiB)"),
            ));
        }
        Ok(config)
    }
}
