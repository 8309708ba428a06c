//! The queue backends this build has, and how the service opens the one
//! `[queue] backend` names. The contract itself is the
//! `breakwater-queue` crate (re-exported here); each backend is a crate of
//! its own that builds itself from the `[queue]` table.
//!
//! Adding a backend: its crate (implementing `Queue` and `Backend`, passing
//! `breakwater_queue::conformance_tests!`), one line in [`BACKENDS`], and
//! its keys in ARCHITECTURE.md's configuration table.

use std::sync::Arc;

pub use breakwater_queue::*;
use breakwater_queue_embedded::EmbeddedBackend;
use breakwater_queue_nats::NatsBackend;
use breakwater_queue_rabbitmq::RabbitMqBackend;

/// Every backend of this build, by the name `[queue] backend` selects it by.
const BACKENDS: &[&dyn Backend] = &[&EmbeddedBackend, &NatsBackend, &RabbitMqBackend];

/// Backends planned but not built yet, named in the error for them.
const PLANNED: &[&str] = &["kafka", "sqs"];

/// The backend `section` selects.
pub fn backend(section: &QueueSection) -> Result<&'static dyn Backend, ConfigProblem> {
    let name = section.backend.as_str();
    BACKENDS
        .iter()
        .copied()
        .find(|b| b.name() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = BACKENDS.iter().map(|b| b.name()).collect();
            let message = if PLANNED.contains(&name) {
                format!(
                    "\"{name}\" is not available in this build yet; use one of {}",
                    known.join(", ")
                )
            } else {
                format!("unknown backend; expected one of {}", known.join(", "))
            };
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
