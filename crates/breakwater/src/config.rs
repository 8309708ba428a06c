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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "BREAKWATER_";

/// Variables under [`ENV_PREFIX`] of the form `<WORD>_<WORD>` that are not
/// config overrides (and `BREAKWATER_TEST_*`, the test suite's).
/// `BREAKWATER_CONFIG` has no second word and never reaches the check.
const NOT_CONFIG: &[&str] = &["BREAKWATER_CHART_FONT"];

/// Sections that environment variables may override.
const ENV_SECTIONS: &[&str] = &["ingress", "admin", "queue", "sink", "workers", "breaker"];

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid environment override {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid config: {key}: {message}")]
    Invalid { key: String, message: String },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub ingress: IngressConfig,
    pub admin: AdminConfig,
    pub queue: QueueConfig,
    pub sink: SinkConfig,
    pub workers: WorkersConfig,
    pub breaker: breakwater_control::BreakerConfig,
    #[serde(rename = "source")]
    pub sources: Vec<SourceConfig>,
}

/// `[ingress]`: the public HTTP listener that takes webhooks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngressConfig {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 1024 * 1024,
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
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
        }
    }
}

/// Which queue backend holds accepted webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueBackend {
    #[default]
    Embedded,
    Rabbitmq,
    Kafka,
    Sqs,
    Nats,
}

impl QueueBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Rabbitmq => "rabbitmq",
            Self::Kafka => "kafka",
            Self::Sqs => "sqs",
            Self::Nats => "nats",
        }
    }
}

/// `[queue]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    pub backend: QueueBackend,
    /// Embedded backend: directory holding the queue's files.
    pub path: PathBuf,
    /// Visibility timeout of a claimed message, in milliseconds.
    pub lease_ms: u64,
    /// How long an applied or queued event id is remembered to answer
    /// redeliveries with 200 instead of enqueuing them twice, in seconds.
    pub dedup_window_secs: u64,
    /// Embedded backend: most operations committed together in one fsync.
    pub max_batch: usize,
    /// Embedded backend: operations waiting for the writer before the
    /// ingress answers 503.
    pub max_pending: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            backend: QueueBackend::Embedded,
            path: PathBuf::from("data/queue"),
            lease_ms: 30_000,
            dedup_window_secs: 7 * 24 * 3600,
            max_batch: 1024,
            max_pending: 16_384,
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
        }
    }
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
    /// Retry in the worker (sleeping while holding it) instead of through
    /// the queue. The naive consumer's habit, for the outage lab's
    /// comparison; leave it off.
    pub retry_in_place: bool,
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
            retry_in_place: false,
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

/// Signature scheme of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeName {
    Stripe,
    Shopify,
    Github,
    Standard,
    Hmac,
}

/// HMAC algorithm of the generic scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HmacAlgorithm {
    #[default]
    Sha256,
    Sha1,
}

/// Signature encoding of the generic scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HmacEncoding {
    #[default]
    Hex,
    Base64,
}

/// `[[source]]`: one issuer of webhooks, reachable at `POST /webhooks/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub name: String,
    pub scheme: SchemeName,
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Environment variable holding comma-separated secrets.
    #[serde(default)]
    pub secrets_env: Option<String>,
    /// File holding one secret per line.
    #[serde(default)]
    pub secrets_file: Option<PathBuf>,
    /// Replay window of timestamped schemes (stripe, standard), in seconds.
    #[serde(default)]
    pub tolerance_secs: Option<u64>,
    /// Generic HMAC: header carrying the signature.
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub algorithm: HmacAlgorithm,
    #[serde(default)]
    pub encoding: HmacEncoding,
    /// Generic HMAC: prefix before the signature, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `json:/pointer` or `header:Name`; absent: the scheme's id header, else
    /// a hash of the body.
    #[serde(default)]
    pub event_id: Option<String>,
    /// `json:/pointer` or `header:Name`; absent: no entity key (no lane).
    #[serde(default)]
    pub entity_key: Option<String>,
    /// Statements run in the inbox transaction, only for a new event id.
    #[serde(default, rename = "statement")]
    pub statements: Vec<StatementConfig>,
}

impl SourceConfig {
    /// A source as the file would give it with only `name`, `scheme` and
    /// `secrets` set: every other key at its default.
    pub fn new(name: impl Into<String>, scheme: SchemeName, secrets: Vec<String>) -> Self {
        Self {
            name: name.into(),
            scheme,
            secrets,
            secrets_env: None,
            secrets_file: None,
            tolerance_secs: None,
            header: None,
            algorithm: HmacAlgorithm::default(),
            encoding: HmacEncoding::default(),
            prefix: None,
            event_id: None,
            entity_key: None,
            statements: Vec::new(),
        }
    }
}

/// `[[source.statement]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatementConfig {
    pub sql: String,
    /// Named parameters: `json:/pointer` or `header:Name`.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

impl Config {
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
        config.validate()?;
        Ok(config)
    }

    /// Checks what the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sink = &self.sink;
        if sink.statement_timeout_ms <= sink.lock_timeout_ms {
            return Err(ConfigError::invalid(
                "sink.statement_timeout_ms",
                format!(
                    "must be larger than sink.lock_timeout_ms ({} <= {}); otherwise the \
                     statement timeout fires first and the lock timeout never does",
                    sink.statement_timeout_ms, sink.lock_timeout_ms
                ),
            ));
        }
        if sink.pool_max == 0 {
            return Err(ConfigError::invalid("sink.pool_max", "must be at least 1"));
        }
        if self.workers.max_concurrency == 0 {
            return Err(ConfigError::invalid(
                "workers.max_concurrency",
                "must be at least 1",
            ));
        }
        if self.workers.max_attempts == 0 {
            return Err(ConfigError::invalid(
                "workers.max_attempts",
                "must be at least 1",
            ));
        }
        // `serve` sets the breaker's maximum to the pool's size; a value of
        // its own would be silently replaced.
        if self.breaker.max_concurrency
            != breakwater_control::BreakerConfig::default().max_concurrency
        {
            return Err(ConfigError::invalid(
                "breaker.max_concurrency",
                "the breaker's maximum is the workers' pool: set workers.max_concurrency \
                 (BREAKWATER_WORKERS_MAX_CONCURRENCY) instead",
            ));
        }
        self.breaker.validate().map_err(|e| match e {
            breakwater_control::ConfigError::Invalid { key, problem } => {
                ConfigError::invalid(format!("breaker.{key}"), problem)
            }
        })?;
        if self.ingress.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "ingress.max_body_bytes",
                "must be at least 1",
            ));
        }
        // A lease must outlive the longest apply (pool wait, then the
        // inbox insert and each statement, every one under the statement
        // timeout), or a slow apply's message is handed to a second worker.
        let statements = self
            .sources
            .iter()
            .map(|s| s.statements.len())
            .max()
            .unwrap_or(0)
            .max(1) as u64
            + 1;
        let longest_apply = sink
            .statement_timeout_ms
            .saturating_mul(statements)
            .saturating_add(sink.acquire_timeout_ms);
        if self.queue.lease_ms < longest_apply.max(1000) {
            return Err(ConfigError::invalid(
                "queue.lease_ms",
                format!(
                    "must be at least {} ms (sink.acquire_timeout_ms + {statements} x \
                     sink.statement_timeout_ms: the inbox insert and the most statements \
                     of any source), or a slow apply outlives its lease and runs twice",
                    longest_apply.max(1000)
                ),
            ));
        }
        if self
            .admin
            .token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(ConfigError::invalid(
                "admin.token",
                "is empty: set a secret, or leave the key out on a loopback admin.listen",
            ));
        }
        if self.queue.backend != QueueBackend::Embedded {
            return Err(ConfigError::invalid(
                "queue.backend",
                format!(
                    "\"{}\" is not available in this build yet; use \"embedded\"",
                    self.queue.backend.as_str()
                ),
            ));
        }
        if !self.admin.listen.ip().is_loopback() && self.admin.token.is_none() {
            return Err(ConfigError::invalid(
                "admin.token",
                "required when admin.listen is not a loopback address",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, source) in self.sources.iter().enumerate() {
            let key = format!("source[{i}]");
            if source.name.is_empty()
                || !source
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(ConfigError::invalid(
                    format!("{key}.name"),
                    "must be non-empty and use only letters, digits, '-' and '_'",
                ));
            }
            if !names.insert(source.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{key}.name"),
                    format!("duplicate source name \"{}\"", source.name),
                ));
            }
            if source.scheme == SchemeName::Hmac && source.header.is_none() {
                return Err(ConfigError::invalid(
                    format!("{key}.header"),
                    "the hmac scheme needs the name of the signature header",
                ));
            }
            for (field, value) in [
                ("event_id", &source.event_id),
                ("entity_key", &source.entity_key),
            ] {
                if let Some(v) = value {
                    crate::source::Extractor::parse(v)
                        .map_err(|m| ConfigError::invalid(format!("{key}.{field}"), m))?;
                }
            }
            for (j, st) in source.statements.iter().enumerate() {
                for (name, v) in &st.params {
                    crate::source::Extractor::parse(v).map_err(|m| {
                        ConfigError::invalid(format!("{key}.statement[{j}].params.{name}"), m)
                    })?;
                }
            }
        }
        Ok(())
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
        }
        copy.sink.url = redact_url(&copy.sink.url);
        copy
    }
}

/// Sets `[section] key` in `table` from an environment value and reads the
/// whole table again. The value is read as TOML first (`20`, `true`,
/// `["a","b"]`) and, should the config refuse that, as the string it is (a
/// token `123456` stays a string). The error message never repeats the
/// value: it may be a secret.
fn apply_env(
    table: &mut toml::Table,
    section: &str,
    key: &str,
    raw: &str,
) -> Result<Config, String> {
    let mut last = String::new();
    for value in [parse_env_value(raw), toml::Value::String(raw.to_owned())] {
        let toml::Value::Table(section_table) = table
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        else {
            return Err(format!("[{section}] is not a table in the file"));
        };
        section_table.insert(key.to_owned(), value);
        match toml::Value::Table(table.clone()).try_into::<Config>() {
            Ok(config) => return Ok(config),
            Err(e) => last = e.message().to_owned(),
        }
    }
    Err(format!("{section}.{key}: {}", hide_values(&last)))
}

/// Where and what: "line N, column C (`section.key`): message", the key
/// named with the table it sits in as validation names it
/// (`workers.max_concurrency`, `source[0].secrets` in the first
/// `[[source]]`, `source[1].statement[0].sql`). Unlike the error's own
/// rendering it does not quote the offending line, and it hides the value
/// in a type error: either may be a secret (`secrets = "whsec_…"` written
/// as a string, not a list). A syntax error names no key (see
/// [`names_a_field`]).
fn describe_parse_error(text: &str, e: &toml::de::Error) -> String {
    let message = hide_values(e.message().trim_end());
    let Some(span) = e.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    let line_text = text[line_start..].lines().next().unwrap_or("");
    let key = line_text
        .split_once('=')
        .map(|(key, _)| key.trim())
        .filter(|key| names_a_field(e.message()) && bare_path(key));
    match key {
        Some(key) => {
            let key = match table_at(&text[..line_start]) {
                Some(table) => format!("{table}.{key}"),
                None => key.to_owned(),
            };
            format!("line {line}, column {column} (`{key}`): {message}")
        }
        None => format!("line {line}, column {column}: {message}"),
    }
}

/// Whether `message` is about a field of a file that parsed: serde's
/// complaints about a key it does not know or a value of the wrong type.
/// Only then is the error's line a `key = value` line of the document; a
/// syntax error's line may be anything, a secret pasted unquoted into a
/// list or a table included, and its text is not shown.
fn names_a_field(message: &str) -> bool {
    [
        "unknown field",
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
    ]
    .iter()
    .any(|start| message.starts_with(start))
}

/// Whether `name` is a bare key or a dotted path of bare keys.
fn bare_path(name: &str) -> bool {
    name.split('.').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    })
}

/// The table that the text after `before` sits in, from its table
/// headers: `workers` under `[workers]`, `source[0]` under the first
/// `[[source]]`, `source[1].statement[0]` under the first
/// `[[source.statement]]` of the second source; `None` at the top level,
/// or under a header this cannot read (a quoted key), rather than a wrong
/// name.
fn table_at(before: &str) -> Option<String> {
    // How many items each array of tables has had so far; a new item of
    // an array starts the arrays nested in it afresh.
    let mut items: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut last = None;
    for header in top_level_lines(before).filter_map(table_header) {
        if let TableHeader::ArrayItem(name) = header {
            *items.entry(name).or_default() += 1;
            items.retain(|nested, _| {
                !(nested.len() > name.len()
                    && nested.starts_with(name)
                    && nested.as_bytes()[name.len()] == b'.')
            });
        }
        last = Some(header);
    }
    let name = match last? {
        TableHeader::Table(name) | TableHeader::ArrayItem(name) => name,
        TableHeader::Unreadable => return None,
    };
    // Each prefix that is an array of tables gets its current item.
    let mut path = String::new();
    for (end, part) in name
        .match_indices('.')
        .map(|(i, _)| i)
        .chain([name.len()])
        .zip(name.split('.'))
    {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part);
        if let Some(n) = items.get(&name[..end]) {
            path.push_str(&format!("[{}]", n - 1));
        }
    }
    Some(path)
}

/// The lines of `text` that start outside every string, array and inline
/// table: the only ones that can be table headers (a line of a multi-line
/// SQL string may well read `[orders]`).
fn top_level_lines(text: &str) -> impl Iterator<Item = &str> {
    #[derive(PartialEq)]
    enum In {
        Code,
        Comment,
        Basic,
        Literal,
        MultiBasic,
        MultiLiteral,
    }
    let bytes = text.as_bytes();
    let mut starts = vec![0];
    let (mut at, mut depth, mut state) = (0, 0usize, In::Code);
    while at < bytes.len() {
        let rest = &bytes[at..];
        let (step, next) = match (&state, rest[0]) {
            (In::Code, b'#') => (1, In::Comment),
            (In::Code, b'"') if rest.starts_with(b"\"\"\"") => (3, In::MultiBasic),
            (In::Code, b'\'') if rest.starts_with(b"'''") => (3, In::MultiLiteral),
            (In::Code, b'"') => (1, In::Basic),
            (In::Code, b'\'') => (1, In::Literal),
            (In::Code, b'[' | b'{') => {
                depth += 1;
                (1, In::Code)
            }
            (In::Code, b']' | b'}') => {
                depth = depth.saturating_sub(1);
                (1, In::Code)
            }
            (In::Basic | In::MultiBasic, b'\\') => (2, state),
            (In::Basic, b'"') | (In::Literal, b'\'') => (1, In::Code),
            (In::MultiBasic, b'"') if rest.starts_with(b"\"\"\"") => (3, In::Code),
            (In::MultiLiteral, b'\'') if rest.starts_with(b"'''") => (3, In::Code),
            (In::Comment | In::Basic | In::Literal, b'\n') => (1, In::Code),
            _ => (1, state),
        };
        state = next;
        at += step;
        // A header line opens and closes its brackets on itself: what
        // counts is the depth where a line starts.
        if at <= bytes.len() && bytes[at - 1] == b'\n' && state == In::Code && depth == 0 {
            starts.push(at);
        }
    }
    starts
        .into_iter()
        .filter_map(move |start| text.get(start..)?.lines().next())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableHeader<'a> {
    /// `[name]`
    Table(&'a str),
    /// `[[name]]`
    ArrayItem(&'a str),
    /// A header with quoted keys or spaced dots: not named.
    Unreadable,
}

/// A line's table header, if it is one (a comment may follow it). A line
/// of a multi-line array may start with `[` too; one holding a comma, or
/// nothing, is taken for that.
fn table_header(line: &str) -> Option<TableHeader<'_>> {
    let line = line.split('#').next().unwrap_or("").trim();
    let (inner, array) = match line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
        Some(inner) => (inner.trim(), true),
        None => (line.strip_prefix('[')?.strip_suffix(']')?.trim(), false),
    };
    if inner.is_empty() || inner.contains(',') {
        return None;
    }
    Some(match (bare_path(inner), array) {
        (false, _) => TableHeader::Unreadable,
        (true, true) => TableHeader::ArrayItem(inner),
        (true, false) => TableHeader::Table(inner),
    })
}

/// A deserialization message with the value it quotes hidden: serde quotes
/// the offending value in "invalid type", "invalid value", "invalid
/// length" and "unknown variant" messages, and it may be a secret. Other
/// messages quote keys ("unknown field"), which stay.
fn hide_values(message: &str) -> String {
    if message.starts_with("invalid") || message.starts_with("unknown variant") {
        hide_quoted(message)
    } else {
        message.to_owned()
    }
}

/// `text` with every quoted part (between backticks or double quotes)
/// replaced by "(value not shown)".
fn hide_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '`' || c == '"' {
            out.push_str("(value not shown)");
            for inner in chars.by_ref() {
                if inner == c {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads an environment value as a TOML value when it parses as one
/// (`20`, `true`, `["a","b"]`), else as a string.
fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}

/// `url` with any password redacted (see [`breakwater_sink::redact_url`]).
pub use breakwater_sink::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(text, Path::new("test.toml"), Vec::new())
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").expect("defaults are valid");
        assert_eq!(c.ingress.listen.port(), 8080);
        assert_eq!(c.queue.backend, QueueBackend::Embedded);
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
    fn wrong_type_names_line() {
        let err = parse("[sink]\npool_max = \"many\"\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 2"), "{msg}");
        assert!(msg.contains("pool_max"), "{msg}");
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
}
