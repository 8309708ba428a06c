//! The embedded backend's own keys of the `[queue]` table.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[queue]` keys of the embedded backend (beside the common `backend` and
/// `lease_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// Directory holding the store (`queue.db` and its WAL).
    pub path: PathBuf,
    /// How long an applied or queued event id is remembered to answer
    /// redeliveries with 200 instead of enqueuing them twice, in seconds.
    pub dedup_window_secs: u64,
    /// Most operations committed together in one fsync.
    pub max_batch: usize,
    /// Operations waiting for the writer before the ingress answers 503.
    pub max_pending: usize,
    /// Bytes of webhooks waiting for the writer before the ingress answers
    /// 503 (a ceiling on that memory: `max_pending` alone would allow
    /// `max_pending` x `ingress.max_body_bytes`).
    pub max_pending_bytes: usize,
    /// Most event ids the in-memory duplicate index holds (about 30 bytes
    /// each). Past it, new event ids are not indexed: a redelivery of one
    /// is queued again (202, not 200 duplicate) and the sink's inbox
    /// applies it once.
    pub dedup_index_max: usize,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("data/queue"),
            dedup_window_secs: 7 * 24 * 3600,
            max_batch: 1024,
            max_pending: 16_384,
            max_pending_bytes: 256 * 1024 * 1024,
            dedup_index_max: 5_000_000,
        }
    }
}

impl EmbeddedConfig {
    /// The defaults with the store in `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }
}

impl EmbeddedConfig {
    /// The `[queue]` table that selects the embedded backend with these
    /// keys (and the default lease).
    pub fn section(&self) -> breakwater_queue::QueueSection {
        breakwater_queue::QueueSection {
            backend: "embedded".to_owned(),
            // Every field is a plain value: this cannot fail.
            options: toml::Table::try_from(self).unwrap_or_default(),
            ..breakwater_queue::QueueSection::default()
        }
    }

    /// The embedded keys of a `[queue]` table, checked.
    pub fn from_section(
        section: &breakwater_queue::QueueSection,
    ) -> Result<Self, breakwater_queue::ConfigProblem> {
        let config: Self = section.own()?;
        if config.max_batch == 0 {
            return Err(breakwater_queue::ConfigProblem::key(
                "max_batch",
                "must be at least 1",
            ));
        }
        if config.max_pending_bytes == 0 {
            return Err(breakwater_queue::ConfigProblem::key(
                "max_pending_bytes",
                "must be at least 1",
            ));
        }
        if config.max_pending == 0 {
            return Err(breakwater_queue::ConfigProblem::key(
                "max_pending",
                "must be at least 1",
            ));
        }
        Ok(config)
    }
}
