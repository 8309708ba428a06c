//! The queue backends this build has, and how the service opens the one
//! `[queue] backend` names. The contract itself is the
//! `breakwater-queue` crate (re-exported here); each backend is a crate of
//! its own that builds itself from the `[queue]` table.
//!
//! Adding a backend: its crate (implementing `Queue` and `Backend`, passing
//! `breakwater_queue::conformance_tests!`), one line in `BACKENDS`, and
//! its keys in ARCHITECTURE.md's configuration table.

use std::sync::Arc;

pub use breakwater_queue::*;
use breakwater_queue_embedded::EmbeddedBackend;
use breakwater_queue_kafka::KafkaBackend;
use breakwater_queue_log::LogBackend;
use breakwater_queue_nats::NatsBackend;
use breakwater_queue_rabbitmq::RabbitMqBackend;
use breakwater_queue_sqs::SqsBackend;

/// Every backend of this build, by the name `[queue] backend` selects it by.
const BACKENDS: &[&dyn Backend] = &[
    &EmbeddedBackend,
    &LogBackend,
    &NatsBackend,
    &RabbitMqBackend,
    &SqsBackend,
    &KafkaBackend,
];

/// The backend `section` selects.
pub fn backend(section: &QueueSection) -> Result<&'static dyn Backend, ConfigProblem> {
    let name = section.backend.as_str();
    BACKENDS
        .iter()
        .copied()
        .find(|b| b.name() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = BACKENDS.iter().map(|b| b.name()).collect();
            let message = format!("unknown backend; expected one of {}", known.join(", "));
            ConfigProblem::key("backend", message)
        })
}

/// Checks `[queue]` without connecting: the backend exists and accepts its
/// keys. Returns the backend's own keys with their defaults.
pub fn check(section: &QueueSection) -> Result<toml::Table, ConfigProblem> {
    backend(section)?.check(section)
}

/// Opens the queue `[queue]` describes.
pub async fn open(section: &QueueSection, mode: OpenMode) -> Result<Arc<dyn Queue>, QueueError> {
    let backend = backend(section).map_err(|e| QueueError::Storage(e.to_string()))?;
    backend.open(section, mode).await
}

/// Releases a message may see between two attempts (a parked key hands
/// its messages back again and again while its row stays locked; each
/// breaker transition hands back what was held) that a broker's own
/// redelivery limit must leave room for.
pub const RELEASE_HEADROOM: u32 = 20;

/// Why a broker's own redelivery limit ([`Queue::redelivery_limit`], SQS
/// `maxReceiveCount`) may dead-letter messages Breakwater would still
/// try: it counts releases (which are not failures) and, where a retry is
/// not a fresh copy, attempts. `None` when it leaves room.
pub fn redelivery_warning(limit: Option<u32>, max_attempts: u32) -> Option<String> {
    let limit = limit?;
    let needed = max_attempts.saturating_add(RELEASE_HEADROOM);
    (limit < needed).then(|| {
        format!(
            "the queue's own redelivery limit is {limit} (SQS maxReceiveCount): it counts \
             every release, so a hot row or a breaker opening can move a message to the \
             broker's DLQ without a reason; raise it to at least {needed} \
             (workers.max_attempts {max_attempts} + {RELEASE_HEADROOM} releases)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redelivery_limit_must_leave_room_for_releases() {
        assert_eq!(redelivery_warning(None, 5), None);
        assert_eq!(redelivery_warning(Some(100), 5), None);
        assert_eq!(redelivery_warning(Some(25), 5), None);
        let w = redelivery_warning(Some(10), 5).expect("too little room");
        assert!(w.contains("at least 25"), "{w}");
    }
}
