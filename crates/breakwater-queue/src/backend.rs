//! How a backend builds itself from the `[queue]` table (the pattern of
//! vector's `SinkConfig::build`): the keys every backend reads are typed
//! here ([`QueueSection`]), the rest of the table is the backend's own and
//! it reads them itself ([`QueueSection::own`]), with its own defaults.

use std::sync::Arc;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Queue, QueueError};

/// The backend of a `[queue]` table that names none: the segment log, on
/// one node with no service to run (`embedded`, the SQLite store, is the
/// other single-node backend).
pub const DEFAULT_BACKEND: &str = "log";

/// The backends whose store belongs to one process: no fleet can share
/// them, and they keep a message until it is applied.
pub const SINGLE_NODE_BACKENDS: [&str; 2] = ["log", "embedded"];

/// The `[queue]` table: the keys every backend reads, and the rest as the
/// selected backend's own keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueSection {
    /// Which backend holds accepted webhooks ([`DEFAULT_BACKEND`] unless
    /// set).
    pub backend: String,
    /// Where the broker is (`amqp://...`, `nats://...`, bootstrap servers, an
    /// SQS endpoint); unused by the single-node backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Queue, stream or topic name; retry, DLQ and consumer names derive
    /// from it. Unused by the single-node backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Visibility timeout (lease) of a claimed message, in milliseconds.
    pub lease_ms: u64,
    /// How long the broker keeps a message before dropping it, seconds
    /// (SQS's retention period, Kafka's `retention.ms`, a NATS stream's
    /// `max_age`); none: it keeps them (the single-node backends do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_secs: Option<u64>,
    /// Warn (log, `GET /breaker`, the headroom metric's alert) when the
    /// oldest message has less than this left, seconds.
    pub retention_warn_secs: u64,
    /// Whether claims keep each entity key's messages in the order the
    /// ingress accepted them: not a `[queue]` key, the service sets it
    /// from `workers.order` before it opens the queue.
    #[serde(skip)]
    pub key_order: KeyOrder,
    /// The selected backend's own keys.
    #[serde(flatten)]
    pub options: toml::Table,
}

/// `workers.order`: what order a backend's claims keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyOrder {
    /// Per entity key, messages are handed out in the order the ingress
    /// accepted them, one at a time: a later message waits while an
    /// earlier one of its key is leased, waiting for its retry or handed
    /// back, until that one is applied or dead-lettered.
    #[default]
    Key,
    /// No order: any visible message may be handed out.
    None,
}

impl Default for QueueSection {
    fn default() -> Self {
        Self {
            backend: DEFAULT_BACKEND.to_owned(),
            url: None,
            name: None,
            lease_ms: 30_000,
            retention_secs: None,
            retention_warn_secs: 3_600,
            key_order: KeyOrder::default(),
            options: toml::Table::new(),
        }
    }
}

impl QueueSection {
    /// The backend's own keys read as `T` (which should deny unknown fields
    /// and default the missing ones).
    pub fn own<T: DeserializeOwned>(&self) -> Result<T, ConfigProblem> {
        serde_path_to_error::deserialize(toml::Value::Table(self.options.clone())).map_err(|e| {
            let path = e.path().to_string();
            let mut problem = ConfigProblem::from_serde(&e.inner().to_string());
            // A type error names no field in its message: the path does.
            if problem.key.is_none() && path != "." {
                problem.key = Some(path);
            }
            problem
        })
    }

    /// `url`, or a problem naming the key when the backend needs it.
    pub fn required_url(&self) -> Result<&str, ConfigProblem> {
        self.url.as_deref().ok_or_else(|| ConfigProblem {
            key: Some("url".to_owned()),
            message: format!("the {} backend needs the broker's address", self.backend),
        })
    }
}

impl QueueSection {
    /// `name`, or a problem naming the key when it is missing or unfit to
    /// name the broker's queues or streams: ASCII letters, digits and the
    /// characters of `punctuation`, at least one, at most `max_len` when
    /// the broker has a limit.
    pub fn required_name(
        &self,
        punctuation: &str,
        max_len: Option<usize>,
    ) -> Result<&str, ConfigProblem> {
        let name = self.name.as_deref().ok_or_else(|| {
            ConfigProblem::key(
                "name",
                format!("the {} backend needs a queue name", self.backend),
            )
        })?;
        let fits = !name.is_empty()
            && max_len.is_none_or(|max| name.len() <= max)
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || punctuation.contains(c));
        if fits {
            Ok(name)
        } else {
            let allowed: Vec<String> = punctuation.chars().map(|c| format!("'{c}'")).collect();
            let most = max_len.map_or_else(String::new, |max| format!(" (at most {max})"));
            Err(ConfigProblem::key(
                "name",
                format!(
                    "must be letters, digits or {}{most}, at least one: it names the broker's \
                     queues",
                    allowed.join(", ")
                ),
            ))
        }
    }
}

/// A backend's own keys as `config check` shows them: its config struct,
/// every default filled in, as a table (what [`Backend::check`] returns).
pub fn own_keys_table<T: Serialize>(config: &T) -> Result<toml::Table, ConfigProblem> {
    toml::Table::try_from(config).map_err(|e| ConfigProblem {
        key: None,
        message: e.to_string(),
    })
}

/// What is wrong with a backend's keys: `key` is relative to `[queue]`
/// when the problem is one key's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigProblem {
    pub key: Option<String>,
    pub message: String,
}

impl ConfigProblem {
    /// A problem with one key.
    pub fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: Some(key.into()),
            message: message.into(),
        }
    }

    /// A serde message, with the key it names (an unknown or missing field).
    fn from_serde(message: &str) -> Self {
        let named = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|p| message.split_once(p))
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(key, _)| key.to_owned());
        Self {
            key: named,
            message: message.trim().to_owned(),
        }
    }
}

/// How a command opens a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// `serve` (and the benches): create what is missing (a store, a
    /// topology) and start what the backend runs.
    Serve,
    /// Read-only and operator commands (`queue stats`, `dlq ...`): open what
    /// exists, create nothing; [`QueueError::Missing`] when there is none.
    Inspect,
}

/// A queue backend: builds itself from the `[queue]` table.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The `[queue] backend` value that selects it.
    fn name(&self) -> &'static str;

    /// Checks the backend's own keys (and the common ones it needs) without
    /// connecting; returns its own keys with every default filled in, for
    /// `config check`.
    fn check(&self, section: &QueueSection) -> Result<toml::Table, ConfigProblem>;

    /// The backend's own keys that hold secrets, replaced by `<redacted>`
    /// wherever the config is shown.
    fn secret_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether this backend keeps each entity key's messages in the order
    /// they were accepted through retries, releases, lease expiry and
    /// restarts ([`KeyOrder::Key`]); `Err` says why it cannot.
    fn keeps_key_order(&self, section: &QueueSection) -> Result<(), String> {
        let _ = section;
        Err(format!(
            "the {} backend hands a retried or released message back behind the later \
             messages of its entity key, so it cannot keep their order",
            self.name()
        ))
    }

    /// Opens (or, with [`OpenMode::Serve`], creates) the queue.
    async fn open(
        &self,
        section: &QueueSection,
        mode: OpenMode,
    ) -> Result<Arc<dyn Queue>, QueueError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Own {
        path: String,
        batch: u32,
    }

    impl Default for Own {
        fn default() -> Self {
            Self {
                path: "data".into(),
                batch: 8,
            }
        }
    }

    #[test]
    fn the_common_keys_are_typed_and_the_rest_belong_to_the_backend() {
        let s: QueueSection =
            toml::from_str("backend = \"embedded\"\nlease_ms = 5000\nbatch = 3\n").expect("toml");
        assert_eq!((s.backend.as_str(), s.lease_ms), ("embedded", 5000));
        let own: Own = s.own().expect("own keys");
        assert_eq!(
            own,
            Own {
                path: "data".into(),
                batch: 3
            }
        );
    }

    #[test]
    fn a_type_error_in_an_own_key_names_the_key() {
        let s: QueueSection = toml::from_str("batch = \"x\"\n").expect("toml");
        let e = s.own::<Own>().expect_err("a string for a number");
        assert_eq!(e.key.as_deref(), Some("batch"), "{e}");
    }

    #[test]
    fn a_broker_name_is_required_and_must_name_a_queue() {
        let s = |extra: &str| -> QueueSection {
            toml::from_str(&format!("backend = \"b\"\n{extra}")).expect("toml")
        };
        assert_eq!(
            s("name = \"orders-1\"").required_name("-_", Some(10)),
            Ok("orders-1")
        );
        for bad in [
            "",
            "name = \"\"",
            "name = \"a.b\"",
            "name = \"abcdefghijk\"",
        ] {
            let e = s(bad).required_name("-_", Some(10)).expect_err(bad);
            assert_eq!(e.key.as_deref(), Some("name"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_unknown_own_key_is_named() {
        let s: QueueSection = toml::from_str("batchh = 3\n").expect("toml");
        let e = s.own::<Own>().expect_err("unknown key");
        assert_eq!(e.key.as_deref(), Some("batchh"));
        assert!(e.message.contains("expected `path` or `batch`"), "{e}");
    }
}
