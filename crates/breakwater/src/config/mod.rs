//! The configuration file: its shape, its defaults, and how it is loaded.
//!
//! One TOML file (`breakwater.toml`, or `--config PATH`) layered with
//! environment variables. Loading happens in two passes so that errors are
//! precise:
//!
//! 1. the file alone is deserialized with `toml::from_str`, whose errors carry
//!    the line and column of the offending key (unknown keys are rejected by
//!    `deny_unknown_fields` on every table); the message names the key with
//!    its table (`workers.max_concurency`) and never quotes a value;
//! 2. `BREAKWATER_<SECTION>_<KEY>` variables are applied on top of the parsed
//!    table one at a time, each read as TOML and, should the config refuse
//!    that, as a plain string (a numeric-looking token stays a string); an
//!    error there names the variable and never its value. A variable that
//!    names no section is ignored with a warning.
//!
//! Then [`Config::validate`] checks what the types cannot (timeouts that must
//! be ordered, duplicate source names, secrets that resolve to nothing).
//! Secrets never reach logs: [`Config::redacted`] is what `config check`
//! prints.

mod env;
mod parse_error;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use self::env::ENV_PREFIX;
use self::env::{ENV_SECTIONS, NOT_CONFIG, apply_env};
use self::parse_error::{describe_parse_error, key_line};
pub use crate::queue::QueueSection;
pub use crate::source::config::{
    ForwardConfig, HmacAlgorithm, HmacEncoding, SchemeName, SourceConfig, StatementConfig,
};

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The cause is the source, printed after this by `{:#}`.
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid environment override {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid config: {key}{}: {message}", at_line(*.line))]
    Invalid {
        key: String,
        /// The key's line in the file, when the file sets it.
        line: Option<usize>,
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|n| format!(" (line {n})")).unwrap_or_default()
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            line: None,
            message: message.into(),
        }
    }

    /// The error with the line of its key in `text`, where the file sets it.
    fn located(self, text: &str) -> Self {
        match self {
            Self::Invalid {
                key,
                line: None,
                message,
            } => Self::Invalid {
                line: key_line(text, &key),
                key,
                message,
            },
            other => other,
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub ingress: IngressConfig,
    pub admin: AdminConfig,
    pub queue: QueueSection,
    pub sink: SinkConfig,
    pub workers: WorkersConfig,
    pub breaker: breakwater_control::BreakerConfig,
    /// Many processes, one breaker (through Redis); absent, a process
    /// keeps its own breaker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetConfig>,
    #[serde(rename = "source")]
    pub sources: Vec<SourceConfig>,
}

/// `[ingress]`: the public HTTP listener that takes webhooks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngressConfig {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    /// Connections open at once; one more is closed at accept.
    pub max_connections: usize,
    /// A request head (and the next one on a kept-alive connection) must
    /// arrive within this, or the connection is closed, in milliseconds.
    pub header_timeout_ms: u64,
    /// The body and the handling of one request within this, or 408, in
    /// milliseconds.
    pub request_timeout_ms: u64,
    /// Requests handled at once; more answer 503 with `Retry-After`.
    pub max_in_flight: usize,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 1024 * 1024,
            max_connections: 10_000,
            header_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_in_flight: 4096,
        }
    }
}

/// `[admin]`: the operator listener (metrics, breaker, queue stats).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token; required when `listen` is not a loopback address.
    pub token: Option<String>,
    /// Events whose attempts the workers remember for `GET
    /// /events/{source}/{id}` (in memory, per node; 0: off). About 300
    /// bytes an event, more for one retried many times.
    pub event_history: usize,
    /// Bytes that history may hold (its ids and attempts; 0: off): the
    /// oldest events go first past it, whatever their count.
    pub event_history_bytes: usize,
}

/// The most events `admin.event_history` may keep.
pub const EVENT_HISTORY_MAX: usize = 10_000_000;

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
            event_history: 50_000,
            event_history_bytes: crate::events::journal::DEFAULT_MAX_BYTES,
        }
    }
}

/// `[sink]`: the database workers apply webhooks to.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    pub url: String,
    pub lock_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub idle_in_transaction_timeout_ms: u64,
    pub pool_max: usize,
    pub acquire_timeout_ms: u64,
    /// Which sessions waiting on a lock feed the breaker's lock-waiter
    /// signal (PostgreSQL): `breakwater` (its own sessions, those they
    /// block, and those waiting on the relations they lock) or `database`
    /// (every session of the database).
    pub lock_waiters_scope: LockWaitersScopeName,
}

/// `sink.lock_waiters_scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockWaitersScopeName {
    #[default]
    Breakwater,
    Database,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://data/breakwater.db".to_owned(),
            lock_timeout_ms: 1000,
            statement_timeout_ms: 5000,
            idle_in_transaction_timeout_ms: 10_000,
            pool_max: 20,
            acquire_timeout_ms: 2000,
            lock_waiters_scope: LockWaitersScopeName::default(),
        }
    }
}

/// `[fleet]`: the processes of one deployment share one breaker through
/// Redis (see `breakwater_fleet`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Where the fleet's state lives, e.g. `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// Every key under it, so deployments can share one Redis.
    #[serde(default = "FleetConfig::default_prefix")]
    pub prefix: String,
    /// This process's id in the fleet; `hostname:pid` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// How often each node beats (heartbeat, lease, record), milliseconds.
    #[serde(default = "FleetConfig::default_beat_ms")]
    pub beat_ms: u64,
    /// How long the controller lease lasts unless renewed: a dead holder is
    /// replaced within it, milliseconds.
    #[serde(default = "FleetConfig::default_lease_ms")]
    pub lease_ms: u64,
}

impl FleetConfig {
    fn default_prefix() -> String {
        "breakwater".to_owned()
    }
    fn default_beat_ms() -> u64 {
        1_000
    }
    fn default_lease_ms() -> u64 {
        3_000
    }

    /// This process's node id: the configured one, else `hostname:pid`.
    pub fn node(&self) -> String {
        self.node_id.clone().unwrap_or_else(host_and_pid)
    }
}

/// `hostname:pid`: a process's name where none is configured.
fn host_and_pid() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// `[workers]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    pub max_concurrency: u32,
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Jitter of the retry backoff: full (default), equal, or none (plain
    /// capped exponential; with base = cap, a fixed interval).
    pub backoff_jitter: BackoffJitter,
    /// Messages of one entity key applied at once (hot-key lanes); 0 = no limit.
    pub per_key_concurrency: u32,
    /// In a process that also runs the ingress (role `all`), how many
    /// steps of the Unix nice value the workers' threads run below it
    /// (0-19; 0 = on the ingress's own threads), so that under a flood the
    /// CPU goes to taking webhooks first and the applies catch up after
    /// (`worker/apply_runtime.rs`). Linux only.
    pub nice: u8,
    /// `key`: per entity key, statements run in the order the ingress
    /// accepted the webhooks; `none`: any order. Unset: `key` where the
    /// queue backend keeps it (the segment log), else `none`, with a
    /// warning at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<crate::queue::KeyOrder>,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        Self {
            max_concurrency: 16,
            max_attempts: 5,
            // Five attempts from 500 ms take seconds, longer than the breaker
            // needs to notice a database that went away; from 100 ms they
            // took under a second and dead-lettered messages in a plain
            // outage (`breakwater lab db-down`).
            backoff_base_ms: 500,
            backoff_cap_ms: 30_000,
            backoff_jitter: BackoffJitter::Full,
            per_key_concurrency: 1,
            nice: 10,
            order: None,
        }
    }
}

/// `workers.backoff_jitter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffJitter {
    #[default]
    Full,
    Equal,
    None,
}

impl Config {
    /// The order the workers keep: `workers.order` as set, else `key`
    /// where the queue backend keeps it, else `none`.
    pub fn key_order(&self) -> crate::queue::KeyOrder {
        use crate::queue::KeyOrder;
        self.workers.order.unwrap_or_else(|| {
            match crate::queue::backend(&self.queue).map(|b| b.keeps_key_order(&self.queue)) {
                Ok(Ok(())) => KeyOrder::Key,
                _ => KeyOrder::None,
            }
        })
    }

    /// Why `workers.order` is unset and the queue backend keeps no key
    /// order, for a warning at start; `None` when order is kept or was
    /// turned off on purpose.
    pub fn key_order_warning(&self) -> Option<String> {
        if self.workers.order.is_some() {
            return None;
        }
        let backend = crate::queue::backend(&self.queue).ok()?;
        let why = backend.keeps_key_order(&self.queue).err()?;
        Some(format!(
            "webhooks of one entity key may be applied out of order: {why}; make the \
             statements order-proof (change a row only for an event newer than it), or set \
             workers.order = \"none\" to say order does not matter"
        ))
    }

    /// This process's name: its fleet node id, else `hostname:pid`.
    pub fn node_name(&self) -> String {
        self.fleet
            .as_ref()
            .map_or_else(host_and_pid, FleetConfig::node)
    }

    /// The most applies that may run at once: the adaptive limiter's
    /// ceiling (`breaker.limiter.max_concurrency`; 0 = the sink's pool, or
    /// `workers.max_concurrency` when that is larger), or
    /// `workers.max_concurrency` with the limiter off.
    pub fn concurrency_ceiling(&self) -> u32 {
        let w = self.workers.max_concurrency;
        let l = &self.breaker.limiter;
        if !l.enabled {
            return w;
        }
        match l.max_concurrency {
            0 => w.max(u32::try_from(self.sink.pool_max).unwrap_or(u32::MAX)),
            m => m.max(w),
        }
    }

    /// The breaker's configuration as `serve` runs it: its maximum is the
    /// workers' pool, its limiter's ceiling resolved.
    pub fn breaker_config(&self) -> breakwater_control::BreakerConfig {
        let mut b = self.breaker.clone();
        b.max_concurrency = self.workers.max_concurrency;
        b.limiter.max_concurrency = self.concurrency_ceiling();
        b
    }

    /// Loads `path` (or the defaults when `None`) and applies the
    /// environment of this process.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// Loads `path` and applies the given environment (testable form).
    pub fn load_with_env(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let (text, origin) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_owned(),
                    source,
                })?;
                (text, p.to_owned())
            }
            None => (String::new(), PathBuf::from("<defaults>")),
        };
        Self::from_toml_with_env(&text, &origin, env)
    }

    /// Parses TOML text, applies the environment and validates.
    pub fn from_toml_with_env(
        text: &str,
        origin: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let parse_err = |e: toml::de::Error| ConfigError::Parse {
            path: origin.to_owned(),
            message: describe_parse_error(text, &e),
        };
        // Pass 1: the file alone, for errors with line numbers.
        let mut config: Config = toml::from_str(text).map_err(parse_err)?;
        // Pass 2: environment overrides on top of the file's table, one at
        // a time, so an error names its variable.
        let mut table: toml::Table = toml::from_str(text).map_err(parse_err)?;
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let rest = rest.to_ascii_lowercase();
            let Some((section, key)) = rest.split_once('_') else {
                continue;
            };
            if !ENV_SECTIONS.contains(&section) {
                if !NOT_CONFIG.contains(&var.as_str()) && !var.starts_with("BREAKWATER_TEST_") {
                    tracing::warn!(
                    %var,
                    sections = ?ENV_SECTIONS,
                        "ignored: names no config section (BREAKWATER_<SECTION>_<KEY>)"
                    );
                }
                continue;
            }
            config = apply_env(&mut table, section, key, &value)
                .map_err(|message| ConfigError::Env { var, message })?;
        }
        config.validate().map_err(|e| e.located(text))?;
        Ok(config)
    }

    /// What `config check` prints: [`Config::redacted`] as a table, without
    /// `breaker.max_concurrency` (refused in the file: the breaker's
    /// maximum is `workers.max_concurrency`).
    pub fn shown(&self) -> Result<toml::Table, toml::ser::Error> {
        let mut table = toml::Table::try_from(self.redacted())?;
        if let Some(toml::Value::Table(breaker)) = table.get_mut("breaker") {
            breaker.remove("max_concurrency");
        }
        Ok(table)
    }

    /// The configuration with every secret replaced by `"<redacted>"`.
    pub fn redacted(&self) -> Config {
        let mut copy = self.clone();
        if copy.admin.token.is_some() {
            copy.admin.token = Some("<redacted>".to_owned());
        }
        for source in &mut copy.sources {
            for secret in &mut source.secrets {
                *secret = "<redacted>".to_owned();
            }
            // A target may take a password or a token in its URL.
            if let Some(forward) = &mut source.forward {
                forward.url = breakwater_sink::redact_http_url(&forward.url);
            }
        }
        copy.sink.url = redact_url(&copy.sink.url);
        copy.queue.url = copy.queue.url.as_deref().map(redact_url);
        if let Some(fleet) = &mut copy.fleet {
            fleet.redis_url = redact_url(&fleet.redis_url);
        }
        // The backend's own keys as it reads them, defaults included, its
        // secret ones hidden.
        if let Ok(effective) = crate::queue::check(&copy.queue) {
            copy.queue.options = effective;
        }
        if let Ok(backend) = crate::queue::backend(&copy.queue) {
            for key in backend.secret_keys() {
                if let Some(value) = copy.queue.options.get_mut(*key) {
                    *value = toml::Value::String("<redacted>".to_owned());
                }
            }
        }
        copy
    }
}

/// `url` with any password redacted (see [`breakwater_sink::redact_url`]).
pub use breakwater_sink::redact_url;

#[cfg(test)]
mod tests {
    use super::parse_error::{TableHeader, table_at, table_header, top_level_lines};
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(text, Path::new("test.toml"), Vec::new())
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").expect("defaults are valid");
        assert_eq!(c.ingress.listen.port(), 8080);
        assert_eq!(c.queue.backend, "log");
        assert!(c.sources.is_empty());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let err = parse("[ingress]\nlisten = \"127.0.0.1:1\"\nmax_bodyy = 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 3"), "{msg}");
        assert!(msg.contains("`ingress.max_bodyy`"), "{msg}");
    }

    #[test]
    fn a_fleet_table_is_read_checked_and_its_url_redacted() {
        let c =
            parse("[fleet]\nredis_url = \"redis://:pw@10.0.0.5:6379\"\nprefix = \"bw:orders\"\n")
                .expect("valid");
        let fleet = c.fleet.as_ref().expect("fleet");
        assert_eq!((fleet.beat_ms, fleet.lease_ms), (1_000, 3_000));
        assert!(fleet.node().contains(':'), "hostname:pid, {}", fleet.node());
        let shown = c.redacted().fleet.expect("fleet").redis_url;
        assert!(!shown.contains("pw"), "{shown}");
        assert!(
            parse("").expect("defaults").fleet.is_none(),
            "no fleet by default"
        );

        let err = parse("[fleet]\nredis_url = \"redis://x\"\nlease_ms = 1500\n").unwrap_err();
        assert!(err.to_string().contains("fleet.lease_ms"), "{err}");
        let err = parse("[fleet]\nredis_url = \"http://x\"\n").unwrap_err();
        assert!(err.to_string().contains("fleet.redis_url"), "{err}");
        let err = parse("[fleet]\nredis_url = \"redis://x\"\nprefixx = \"a\"\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("prefixx") && msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn wrong_type_names_line() {
        let err = parse("[sink]\npool_max = \"many\"\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 2"), "{msg}");
        assert!(msg.contains("pool_max"), "{msg}");
    }

    #[test]
    fn the_limiters_ceiling_is_the_pool_and_may_not_pass_it() {
        let c = parse("").expect("defaults");
        assert_eq!(c.concurrency_ceiling(), 20, "the sink's pool");
        let b = c.breaker_config();
        assert_eq!((b.max_concurrency, b.limiter.max_concurrency), (16, 20));
        let c = parse("[workers]\nmax_concurrency = 32\n").expect("valid");
        assert_eq!(c.concurrency_ceiling(), 32, "never below where it starts");
        let c = parse("[breaker.limiter]\nenabled = false\n").expect("valid");
        assert_eq!(c.concurrency_ceiling(), 16);
        let c = parse("[sink]\npool_max = 64\n[breaker.limiter]\nmax_concurrency = 48\n")
            .expect("valid");
        assert_eq!(c.concurrency_ceiling(), 48);
        let err = parse("[breaker.limiter]\nmax_concurrency = 48\n")
            .expect_err("above the pool")
            .to_string();
        assert!(err.contains("breaker.limiter.max_concurrency"), "{err}");
        assert!(err.contains("sink.pool_max (20)"), "{err}");
        let err = parse("[breaker.limiter]\nmin_concurrency = 17\n")
            .expect_err("above the start")
            .to_string();
        assert!(err.contains("breaker.limiter.min_concurrency"), "{err}");
    }

    #[test]
    fn env_overrides_file() {
        let env = vec![
            ("BREAKWATER_SINK_POOL_MAX".to_owned(), "7".to_owned()),
            (
                "BREAKWATER_INGRESS_LISTEN".to_owned(),
                "127.0.0.1:9999".to_owned(),
            ),
            ("UNRELATED".to_owned(), "x".to_owned()),
        ];
        let c = Config::from_toml_with_env("[sink]\npool_max = 3\n", Path::new("t"), env)
            .expect("valid");
        assert_eq!(c.sink.pool_max, 7);
        assert_eq!(c.ingress.listen.port(), 9999);
    }

    #[test]
    fn env_values_keep_their_type_name_their_variable_and_hide_their_value() {
        let load = |var: &str, value: &str| {
            let env = vec![(var.to_owned(), value.to_owned())];
            Config::from_toml_with_env("", Path::new("t"), env)
        };
        // A token that looks like a number stays a string.
        let c = load("BREAKWATER_ADMIN_TOKEN", "123456").expect("valid");
        assert_eq!(c.admin.token.as_deref(), Some("123456"));
        // A value of the wrong type names the variable, not the value.
        let err = load("BREAKWATER_SINK_POOL_MAX", "s3cr3t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("BREAKWATER_SINK_POOL_MAX"), "{err}");
        assert!(err.contains("sink.pool_max"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
        // The breaker's maximum is not a knob of its own, in the
        // environment as in the file.
        let err = load("BREAKWATER_BREAKER_MAX_CONCURRENCY", "5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("workers.max_concurrency"), "{err}");
        let err = parse("[breaker]\nmax_concurrency = 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("breaker.max_concurrency"), "{err}");
        // A variable naming no section changes nothing and fails nothing.
        let c = load("BREAKWATER_WORKER_MAX_CONCURRENCY", "3").expect("ignored");
        assert_eq!(
            c.workers.max_concurrency,
            Config::default().workers.max_concurrency
        );
    }

    #[test]
    fn a_parse_error_names_key_and_line_but_never_shows_the_value() {
        let text = "[[source]]\nname = \"a\"\nscheme = \"github\"\nsecrets = \"whsec_topsecret\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("line 4"), "{err}");
        assert!(err.contains("`source[0].secrets`"), "{err}");
        assert!(!err.contains("topsecret"), "{err}");
        // A secret where a key goes (found by the config fuzz test): the
        // unknown name is not echoed; a misspelt key still is.
        let pasted = "[[source]]\nname = \"a\"\nscheme = \"github\"\nwhsec_topsecret42 = 1\n";
        let err = parse(pasted).unwrap_err().to_string();
        assert!(err.contains("line 4"), "{err}");
        assert!(!err.contains("topsecret"), "{err}");
        let typo = parse("[workers]\nmax_concurency = 4\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a config key"), "{err}");
        assert!(typo.contains("`max_concurency`"), "{typo}");
    }

    #[test]
    fn a_parse_error_names_the_table_of_its_key() {
        let text = "[[source]] # first\nname = \"a\"\nscheme = \"github\"\nsecrets = [\n  \"x\",\n]\n\n\
                    [[source]]\nname = \"b\"\nschemee = \"github\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("line 10"), "{err}");
        assert!(err.contains("`source[1].schemee`"), "{err}");
        let err = parse("nope = 1\n[ingress]\n").unwrap_err().to_string();
        assert!(err.contains("(`nope`)"), "top level: {err}");
        // Nested arrays of tables count within their parent item.
        let text = "[[source]]\nname = \"a\"\nscheme = \"github\"\n\
                    [[source.statement]]\nsql = \"SELECT 1\"\n\
                    [[source]]\nname = \"b\"\nscheme = \"github\"\n\
                    [[source.statement]]\nsqll = \"SELECT 2\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("`source[1].statement[0].sqll`"), "{err}");
        assert_eq!(
            table_at("[[source]]\n[[source.statement]]\n[source.statement.params]\n"),
            Some("source[0].statement[0].params".to_owned())
        );
        // A header-like line inside a multi-line string is not a header.
        assert_eq!(
            table_at("[[source]]\nsql = \"\"\"\n[orders]\n\"\"\"\n"),
            Some("source[0]".to_owned())
        );
        assert_eq!(
            top_level_lines("a = [\n  1,\n]\n[t] # x\nb = '[u]'\n").collect::<Vec<_>>(),
            vec!["a = [", "[t] # x", "b = '[u]'"]
        );
        // What cannot be read is not named rather than misnamed.
        assert_eq!(table_at("[workers]\n[\"quoted\"]\n"), None);
        assert_eq!(table_header("[ \"a\", \"b\" ]"), None, "an array line");
        assert_eq!(
            table_header(" [breaker.ramp] # steps"),
            Some(TableHeader::Table("breaker.ramp"))
        );
        // A syntax error names no key: a secret pasted unquoted into a
        // list, or on a line of its own, is not shown.
        for text in [
            "[[source]]\nname = \"a\"\nscheme = \"github\"\nsecrets = [\n  \"x\",\n  whsec_pasted=\n]\n",
            "[[source]]\nname = \"a\"\nwhsec_pasted==\n",
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains("line "), "{err}");
            assert!(!err.contains("whsec_pasted"), "{err}");
        }
    }

    #[test]
    fn bad_env_override_names_variable() {
        let env = vec![("BREAKWATER_SINK_POOL_MAXX".to_owned(), "7".to_owned())];
        let err = Config::from_toml_with_env("", Path::new("t"), env).unwrap_err();
        assert!(err.to_string().contains("pool_maxx"), "{err}");
    }

    #[test]
    fn lease_must_outlive_the_longest_source_apply() {
        let with = |n: usize| {
            let statement = "[[source.statement]]\nsql = \"SELECT 1\"\n";
            parse(&format!(
                "[[source]]\nname = \"s\"\nscheme = \"github\"\nsecrets = [\"x\"]\n{}",
                statement.repeat(n)
            ))
        };
        // Defaults: lease 30 s, pool wait 2 s, 5 s per statement.
        assert!(with(4).is_ok(), "2 + (4 + 1) x 5 = 27 s fits");
        let err = with(6).unwrap_err().to_string();
        assert!(err.contains("queue.lease_ms"), "{err}");
        assert!(err.contains("37000 ms") && err.contains("7 x"), "{err}");
    }

    #[test]
    fn an_empty_admin_token_is_refused() {
        let err = parse("[admin]\ntoken = \"  \"\n").unwrap_err().to_string();
        assert!(err.contains("admin.token"), "{err}");
    }

    #[test]
    fn statement_timeout_must_exceed_lock_timeout() {
        let err =
            parse("[sink]\nlock_timeout_ms = 5000\nstatement_timeout_ms = 5000\n").unwrap_err();
        assert!(
            err.to_string().contains("sink.statement_timeout_ms"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_source_names_rejected() {
        let text = r#"
[[source]]
name = "a"
scheme = "github"
secrets = ["x"]
[[source]]
name = "a"
scheme = "github"
secrets = ["y"]
"#;
        let err = parse(text).unwrap_err();
        assert!(err.to_string().contains("duplicate"), "{err}");
    }

    #[test]
    fn bad_extractor_names_key() {
        let text = r#"
[[source]]
name = "a"
scheme = "github"
secrets = ["x"]
event_id = "body:/id"
"#;
        let err = parse(text).unwrap_err();
        assert!(err.to_string().contains("source[0].event_id"), "{err}");
    }

    #[test]
    fn redaction_hides_secrets_and_passwords() {
        let text = r#"
[sink]
url = "postgres://app:hunter2@db/app"
[[source]]
name = "a"
scheme = "github"
secrets = ["topsecret"]
"#;
        let c = parse(text).expect("valid");
        let shown = toml::to_string(&c.redacted()).expect("serializes");
        assert!(!shown.contains("topsecret"));
        assert!(!shown.contains("hunter2"));
        assert!(shown.contains("postgres://app:<redacted>@db/app"));
    }

    #[test]
    fn a_source_forwards_or_runs_statements_and_its_url_is_checked() {
        let source = "[[source]]\nname = \"a\"\nscheme = \"github\"\nsecrets = [\"s\"]\n";
        let ok = format!("{source}forward = {{ url = \"http://127.0.0.1:7000/hooks\" }}\n");
        let c = parse(&ok).expect("a forwarding source");
        let forward = c.sources[0].forward.as_ref().expect("forward");
        assert_eq!((forward.timeout_ms, forward.max_connections), (5000, 32));
        let both = format!("{ok}[[source.statement]]\nsql = \"SELECT 1\"\n");
        let err = parse(&both).expect_err("both").to_string();
        assert!(err.contains("source[0].forward"), "{err}");
        assert!(err.contains("not both"), "{err}");
        let https = format!("{source}forward = {{ url = \"https://svc/hooks\" }}\n");
        parse(&https).expect("an https target");
        let no_ca = format!(
            "{source}forward = {{ url = \"https://svc/hooks\", ca_file = \"/nonexistent/ca.pem\" }}\n"
        );
        let err = parse(&no_ca).expect_err("a CA file not there").to_string();
        assert!(err.contains("source[0].forward"), "{err}");
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let ftp = format!("{source}forward = {{ url = \"ftp://svc/hooks\" }}\n");
        let err = parse(&ftp).expect_err("ftp").to_string();
        assert!(err.contains("https://host"), "{err}");
        let typo = format!("{source}forward = {{ url = \"http://svc/\", timeout = 5 }}\n");
        let err = parse(&typo).expect_err("unknown key").to_string();
        assert!(err.contains("timeout"), "{err}");
    }

    #[test]
    fn a_forward_url_is_shown_without_its_password_or_query_values() {
        let c = parse(
            "[[source]]\nname = \"a\"\nscheme = \"github\"\nsecrets = [\"s\"]\n\
             forward = { url = \"http://bw:pw-1@svc:7000/hooks?token=tok-1&v=2\" }\n",
        )
        .expect("a forwarding source");
        let shown = toml::to_string(&c.shown().expect("shown")).expect("serializes");
        assert!(
            !shown.contains("pw-1") && !shown.contains("tok-1"),
            "{shown}"
        );
        assert!(
            shown.contains("http://bw:<redacted>@svc:7000/hooks?token=<redacted>&v=<redacted>"),
            "{shown}"
        );
        let forward = c.sources[0].forward.as_ref().expect("forward");
        assert!(forward.url.contains("pw-1"), "the config itself keeps it");
    }

    #[test]
    fn the_queue_backends_own_keys_are_checked_with_their_line() {
        let err =
            parse("[ingress]\nmax_body_bytes = 10\n\n[queue]\nlease_ms = 60000\nmax_bach = 3\n")
                .expect_err("unknown embedded key")
                .to_string();
        assert!(err.contains("queue.max_bach (line 6)"), "{err}");
        assert!(err.contains("expected one of"), "{err}");
        let err = parse("[queue]\nbackend = \"kafka\"\n")
            .expect_err("no bootstrap servers")
            .to_string();
        assert!(err.contains("queue.url"), "{err}");
        let err = parse(
            "[queue]\nbackend = \"rabbitmq\"\nurl = \"amqp://127.0.0.1\"\nname = \"q\"\ndelay_tiers_ms = [500, 100]\n",
        )
        .expect_err("tiers out of order")
        .to_string();
        assert!(err.contains("queue.delay_tiers_ms (line 5)"), "{err}");
        let err = parse("[queue]\nbackend = \"rabbitmqq\"\n")
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("expected one of embedded"), "{err}");
    }

    #[test]
    fn key_order_is_kept_where_the_backend_can_and_refused_by_name_where_it_cannot() {
        use crate::queue::KeyOrder;
        let log = parse("").expect("defaults");
        assert_eq!(log.key_order(), KeyOrder::Key);
        assert_eq!(log.key_order_warning(), None);
        let rabbit = "[queue]\nbackend = \"rabbitmq\"\nurl = \"amqp://127.0.0.1\"\nname = \"q\"\n";
        let unset = parse(rabbit).expect("unset: allowed");
        assert_eq!(unset.key_order(), KeyOrder::None);
        let warning = unset.key_order_warning().expect("a warning");
        assert!(warning.contains("out of order"), "{warning}");
        let err = parse(&format!("{rabbit}\n[workers]\norder = \"key\"\n"))
            .expect_err("key order refused on RabbitMQ")
            .to_string();
        assert!(err.contains("workers.order"), "{err}");
        assert!(err.contains("rabbitmq"), "{err}");
        let none = parse(&format!("{rabbit}\n[workers]\norder = \"none\"\n")).expect("none");
        assert_eq!(
            (none.key_order(), none.key_order_warning()),
            (KeyOrder::None, None)
        );
        let off = parse("[workers]\norder = \"none\"\n").expect("none on the log");
        assert_eq!(off.key_order(), KeyOrder::None);
        let kafka = "[queue]\nbackend = \"kafka\"\nurl = \"127.0.0.1:9092\"\nname = \"q\"\n";
        let kafka = parse(kafka).expect("kafka");
        assert_eq!(
            (kafka.key_order(), kafka.key_order_warning()),
            (KeyOrder::Key, None),
            "Kafka keeps key order"
        );
    }

    #[test]
    fn the_backends_own_keys_take_environment_overrides_and_show_with_defaults() {
        let c = Config::from_toml_with_env(
            "[queue]\nmax_batch = 8\n",
            Path::new("t.toml"),
            [("BREAKWATER_QUEUE_PATH".to_owned(), "/tmp/q".to_owned())],
        )
        .expect("config");
        let shown = c.redacted().queue.options;
        assert_eq!(shown.get("path").and_then(|v| v.as_str()), Some("/tmp/q"));
        assert_eq!(shown.get("max_batch").and_then(|v| v.as_integer()), Some(8));
        assert_eq!(
            shown.get("max_pending").and_then(|v| v.as_integer()),
            Some(16_384),
            "defaults filled in: {shown:?}"
        );
    }

    #[test]
    fn a_backend_key_from_the_environment_stays_a_string_when_it_must() {
        let c = Config::from_toml_with_env(
            "",
            Path::new("t.toml"),
            [("BREAKWATER_QUEUE_PATH".to_owned(), "2024".to_owned())],
        )
        .expect("a numeric-looking path is a path");
        assert_eq!(
            c.redacted()
                .queue
                .options
                .get("path")
                .and_then(|v| v.as_str()),
            Some("2024")
        );
        let err = Config::from_toml_with_env(
            "",
            Path::new("t.toml"),
            [("BREAKWATER_QUEUE_MAX_BATCH".to_owned(), "lots".to_owned())],
        )
        .expect_err("not a number")
        .to_string();
        assert!(err.contains("BREAKWATER_QUEUE_MAX_BATCH"), "{err}");
        assert!(!err.contains("lots"), "the value is shown: {err}");
    }

    #[test]
    fn a_type_error_in_a_backend_key_names_the_key_and_line() {
        let err = parse("[queue]\nmax_batch = \"x\"\n")
            .expect_err("a string for a number")
            .to_string();
        assert!(err.contains("queue.max_batch (line 2)"), "{err}");
        assert!(!err.contains("\"x\""), "{err}");
    }
}
