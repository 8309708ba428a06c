//! Which queue backend the lab and the benches run on, and the queue
//! section for it: the embedded store under a folder of the run's own, or
//! a broker on a queue name of the run's own, removed afterwards.

use serde::Serialize;

/// Which queue backend holds the webhooks of a lab or bench run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LabBackend {
    /// The embedded store, under --data-dir.
    #[default]
    Embedded,
    /// NATS JetStream at --queue-url, on streams of the run's own, removed
    /// afterwards.
    Nats,
}

impl LabBackend {
    /// The `[queue]` table for a broker queue `name` at `url`; `None` for
    /// the embedded store (the caller's config already points at it).
    pub fn broker_section(self, url: &str, name: &str) -> Option<breakwater::queue::QueueSection> {
        match self {
            Self::Embedded => None,
            Self::Nats => Some(breakwater::queue::QueueSection {
                backend: "nats".to_owned(),
                url: Some(url.to_owned()),
                name: Some(name.to_owned()),
                ..breakwater::queue::QueueSection::default()
            }),
        }
    }

    /// Removes what a run made on the broker (nothing for the embedded
    /// store, whose folder the caller removes).
    pub async fn remove(self, url: &str, name: &str) {
        if self == Self::Nats
            && let Err(e) = breakwater_queue_nats::NatsQueue::destroy(url, name).await
        {
            tracing::warn!(error = %e, queue = name, "the run's NATS streams were not removed");
        }
    }
}
