//! `[[source]]` as the config file writes it: one issuer of webhooks, its
//! signature scheme and secrets, where its event id and entity key are, and
//! the statements it runs. [`super::compile_all`] turns these into what the
//! ingress runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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

impl SchemeName {
    /// The name as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stripe => "stripe",
            Self::Shopify => "shopify",
            Self::Github => "github",
            Self::Standard => "standard",
            Self::Hmac => "hmac",
        }
    }
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

/// What a source's bodies must be (`body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BodyFormat {
    /// A body that is not JSON is refused with 400 `bad_json`, nothing
    /// enqueued (the default of stripe, shopify, github and standard, whose
    /// issuers always send JSON).
    Json,
    /// Any body is accepted (the default of hmac); statements that read it
    /// as JSON dead-letter a message whose body is not, saying so.
    Any,
}

/// What identifies a webhook for deduplication (`dedup_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DedupOn {
    /// The event id (`event_id`, or the scheme's id header).
    EventId,
    /// A hash of the signed body: for schemes whose signature covers the
    /// body only (github, shopify), so a captured delivery replayed under a
    /// fresh, unsigned delivery id is still a duplicate. The event id is
    /// then `sha256:<hex>`; the delivery id header stays with the message.
    Body,
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
    /// Where each event's version is, for the stale-event guard (an event
    /// older than the newest applied for its entity key is superseded):
    /// `json:/pointer` or `header:Name`, read by the sink; `"none"`: no
    /// guard. Absent: the scheme's ([`SourceConfig::version_spec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `event_id` or `body`; absent: `body` for github and shopify (their
    /// delivery id is not signed) when no `event_id` is set, else
    /// `event_id`.
    #[serde(default)]
    pub dedup_on: Option<DedupOn>,
    /// `json` or `any`; absent: `json`, except `any` for the hmac scheme.
    #[serde(default)]
    pub body: Option<BodyFormat>,
    /// Statements run in the inbox transaction, only for a new event id.
    #[serde(default, rename = "statement")]
    pub statements: Vec<StatementConfig>,
    /// Forward this source's webhooks to an HTTP service instead of
    /// running statements (a source has one or the other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<ForwardConfig>,
}

/// `forward = { url = ..., ... }` of a source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardConfig {
    /// `http://host:port/path` or `https://host:port/path`.
    pub url: String,
    /// The whole request, connecting included, in milliseconds.
    #[serde(default = "ForwardConfig::default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "ForwardConfig::default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Requests in flight at once to this target.
    #[serde(default = "ForwardConfig::default_max_connections")]
    pub max_connections: usize,
    /// Environment variable holding the Standard Webhooks secret
    /// (`whsec_<base64>`) the forwarded requests are signed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// HTTP/2 instead of HTTP/1.1: with prior knowledge (h2c) on
    /// `http://`, offered by ALPN on `https://`.
    #[serde(default)]
    pub http2: bool,
    /// Redirects followed per request (307 and 308 only: they keep the
    /// POST and its body; to an `http://` URL or a path on the target); 0,
    /// the default: a redirect is a permanent failure, in the DLQ with its
    /// status and `Location`.
    #[serde(default)]
    pub follow_redirects: u32,
    /// PEM file of certificates trusted for an `https://` url besides the
    /// system's roots (a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl ForwardConfig {
    /// The forward sink's settings for this target, signed with `secret`
    /// (what `serve` builds and `config check` validates).
    pub fn spec(&self, secret: Option<String>) -> breakwater_sink::ForwardSpec {
        breakwater_sink::ForwardSpec {
            url: self.url.clone(),
            timeout: Duration::from_millis(self.timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            max_connections: self.max_connections,
            secret,
            http2: self.http2,
            follow_redirects: self.follow_redirects,
            ca_file: self.ca_file.clone(),
        }
    }

    /// Forwarding to `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout_ms: Self::default_timeout_ms(),
            connect_timeout_ms: Self::default_connect_timeout_ms(),
            max_connections: Self::default_max_connections(),
            secret_env: None,
            http2: false,
            follow_redirects: 0,
            ca_file: None,
        }
    }

    fn default_timeout_ms() -> u64 {
        5_000
    }
    fn default_connect_timeout_ms() -> u64 {
        1_000
    }
    fn default_max_connections() -> usize {
        32
    }
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
            version: None,
            dedup_on: None,
            body: None,
            statements: Vec::new(),
            forward: None,
        }
    }
}

/// `version = "none"`: no stale-event guard, not even the scheme's.
pub const NO_VERSION: &str = "none";

impl SourceConfig {
    /// Where this source's events carry their version: `version` as set
    /// (`None` for [`NO_VERSION`]), else the scheme's own: Stripe's event
    /// `created` (`json:/created`, in the signed body), Standard Webhooks'
    /// signed `webhook-timestamp` header. Shopify and GitHub have none:
    /// their topic and delivery headers are not signed, so they must never
    /// be a version; Shopify's `json:/updated_at` is one for orders,
    /// products and customers, set by hand; GitHub sends nothing that
    /// grows per entity.
    pub fn version_spec(&self) -> Option<&str> {
        match self.version.as_deref().map(str::trim) {
            Some(NO_VERSION) => None,
            Some(spec) => Some(spec),
            None => match self.scheme {
                SchemeName::Stripe => Some("json:/created"),
                SchemeName::Standard => Some("header:webhook-timestamp"),
                SchemeName::Shopify | SchemeName::Github | SchemeName::Hmac => None,
            },
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
