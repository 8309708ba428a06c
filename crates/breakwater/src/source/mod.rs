//! Sources: the configured issuers of webhooks, compiled for the hot path.
//!
//! A [`SourceConfig`] names a scheme, its secrets and where the event id and
//! entity key live. [`Source::compile`] resolves the secrets (inline, from an
//! environment variable, from a file), builds the signature [`Verifier`] and
//! parses the extractors once, so the ingress does no parsing of config per
//! request. The `pointer` module reads the JSON pointers out of a body.

pub mod config;
mod pointer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use breakwater_verify::{Algorithm, Encoding, HmacScheme, Scheme, Verifier};
use http::{HeaderMap, HeaderName};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use self::pointer::Pointer;

use self::config::{
    BodyFormat, DedupOn, HmacAlgorithm, HmacEncoding, SchemeName, SourceConfig, StatementConfig,
};

/// Headers kept with a message besides those the source's extractors name.
const KEPT_HEADERS: &[&str] = &[
    "content-type",
    "x-github-event",
    "x-github-delivery",
    "x-shopify-webhook-id",
    "x-shopify-topic",
    "x-shopify-shop-domain",
    "stripe-account",
];

/// Where a value comes from: a JSON pointer into the body or a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extractor {
    Json(Pointer),
    Header(HeaderName),
    /// The first of these headers that is present (Standard Webhooks'
    /// `webhook-id`, or Svix's `svix-id`).
    FirstHeader(Vec<HeaderName>),
}

impl Extractor {
    /// Parses `json:/pointer` or `header:Name`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        if let Some(pointer) = spec.strip_prefix("json:") {
            Pointer::parse(pointer).map(Self::Json).map_err(|_| {
                format!("\"{spec}\": a JSON pointer starts with '/', e.g. json:/data/object/id")
            })
        } else if let Some(name) = spec.strip_prefix("header:") {
            HeaderName::from_bytes(name.trim().as_bytes())
                .map(Self::Header)
                .map_err(|_| format!("\"{spec}\": \"{name}\" is not a valid header name"))
        } else {
            Err(format!(
                "\"{spec}\": expected \"json:/pointer\" or \"header:Name\""
            ))
        }
    }
}

/// Renders a JSON value as a key: strings as they are, numbers and booleans
/// as text, null as absent, anything else as compact JSON.
fn json_to_text(v: Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        other => Some(other.to_string()),
    }
}

/// Why a source could not be built from its config.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source \"{source_name}\": environment variable {var} is not set")]
    MissingEnv { source_name: String, var: String },
    #[error("source \"{source_name}\": cannot read secrets file {path}: {error}")]
    SecretsFile {
        source_name: String,
        path: String,
        error: std::io::Error,
    },
    #[error("source \"{source_name}\": {message}")]
    Key {
        source_name: String,
        message: String,
    },
    #[error("source \"{source_name}\": {message}")]
    Extractor {
        source_name: String,
        message: String,
    },
}

/// A source ready for the hot path.
#[derive(Debug)]
pub struct Source {
    pub name: Arc<str>,
    pub verifier: Verifier,
    /// Where the event id is; `None`: a hash of the body.
    pub event_id: Option<Extractor>,
    pub entity_key: Option<Extractor>,
    pub statements: Vec<StatementConfig>,
    /// Headers stored with each message (lower-case).
    pub kept_headers: Vec<HeaderName>,
    /// Refuse a body that is not JSON (400 `bad_json`).
    pub requires_json: bool,
    /// The event id is the signed body's hash ([`DedupOn::Body`]).
    pub dedup_on_body: bool,
    /// The header the event id comes from when the signature does not
    /// cover it: a captured delivery sent again under a fresh id is a new
    /// webhook, applied again (`serve` warns).
    pub unsigned_event_id: Option<String>,
}

/// What the ingress extracts from a verified request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub event_id: String,
    pub entity_key: Option<String>,
}

impl Source {
    /// Builds a source, resolving its secrets with `env`.
    pub fn compile(
        config: &SourceConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, SourceError> {
        let name = config.name.clone();
        let mut secrets: Vec<String> = config.secrets.clone();
        if let Some(var) = &config.secrets_env {
            let value = env(var).ok_or_else(|| SourceError::MissingEnv {
                source_name: name.clone(),
                var: var.clone(),
            })?;
            secrets.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
        }
        if let Some(path) = &config.secrets_file {
            let text = std::fs::read_to_string(path).map_err(|error| SourceError::SecretsFile {
                source_name: name.clone(),
                path: path.display().to_string(),
                error,
            })?;
            secrets.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
        }
        let scheme = scheme_of(config);
        let default_id_header = breakwater_verify::default_event_id_header(&scheme);
        let verifier = Verifier::new(scheme, &secrets).map_err(|e| SourceError::Key {
            source_name: name.clone(),
            message: e.to_string(),
        })?;
        let parse = |spec: &str| {
            Extractor::parse(spec).map_err(|message| SourceError::Extractor {
                source_name: name.clone(),
                message,
            })
        };
        let event_id = match (&config.event_id, config.scheme) {
            (Some(spec), _) => Some(parse(spec)?),
            // Stripe puts the event id in the body.
            (None, SchemeName::Stripe) => Some(parse("json:/id")?),
            // Standard Webhooks senders name it `webhook-id`, Svix's
            // `svix-id`; the verifier accepts both sets of headers.
            (None, SchemeName::Standard) => Some(Extractor::FirstHeader(vec![
                HeaderName::from_static("webhook-id"),
                HeaderName::from_static("svix-id"),
            ])),
            (None, _) => default_id_header.map(|h| Extractor::Header(HeaderName::from_static(h))),
        };
        let entity_key = config.entity_key.as_deref().map(parse).transpose()?;
        let mut kept_headers: Vec<HeaderName> = KEPT_HEADERS
            .iter()
            .map(|h| HeaderName::from_static(h))
            .collect();
        // The sink reads the version; a header one travels with the message.
        if let Some(Extractor::Header(h)) = config.version_spec().map(parse).transpose()?
            && !kept_headers.contains(&h)
        {
            kept_headers.push(h);
        }
        for st in &config.statements {
            for spec in st.params.values() {
                if let Extractor::Header(h) = parse(spec)?
                    && !kept_headers.contains(&h)
                {
                    kept_headers.push(h);
                }
            }
        }
        let unsigned_event_id = match (&event_id, dedup_on(config)) {
            (Some(id), DedupOn::EventId) => unsigned_header(config.scheme, id),
            _ => None,
        };
        Ok(Self {
            name: Arc::from(name.as_str()),
            verifier,
            event_id,
            entity_key,
            statements: config.statements.clone(),
            kept_headers,
            requires_json: body_format(config) == BodyFormat::Json,
            dedup_on_body: dedup_on(config) == DedupOn::Body,
            unsigned_event_id,
        })
    }

    /// Extracts the event id (falling back to a hash of the body) and the
    /// entity key. Never fails: a signed webhook is never refused because a
    /// field is missing; the sink decides what a malformed payload means.
    /// The body is read at most once, and only if a JSON pointer asks.
    pub fn identify(&self, headers: &HeaderMap, body: &[u8]) -> Identity {
        let pointers = self.pointers();
        let found = if pointers.is_empty() {
            Vec::new()
        } else {
            pointer::find(body, &pointers).unwrap_or_else(|| vec![None; pointers.len()])
        };
        self.identify_from(headers, body, found)
    }

    /// What the ingress does with a verified body: refuses it if the
    /// source takes only JSON and it is not one JSON document (serde's
    /// reason), else [`Self::identify`]s it. The body is read once when a
    /// JSON pointer reads it anyway: only a body the pointers' walk refuses
    /// is checked again, for serde's reason (or to let through one whose
    /// pointed-at string is not UTF-8, which the syntax check allows).
    pub fn read(&self, headers: &HeaderMap, body: &[u8]) -> Result<Identity, serde_json::Error> {
        let check = || {
            if self.requires_json {
                serde_json::from_slice::<serde::de::IgnoredAny>(body).map(drop)
            } else {
                Ok(())
            }
        };
        let pointers = self.pointers();
        let found = if pointers.is_empty() {
            check()?;
            Vec::new()
        } else {
            match pointer::find(body, &pointers) {
                Some(found) => found,
                None => {
                    check()?;
                    vec![None; pointers.len()]
                }
            }
        };
        Ok(self.identify_from(headers, body, found))
    }

    /// The JSON pointers the event id and the entity key read, in that
    /// order.
    fn pointers(&self) -> Vec<&Pointer> {
        [self.event_id.as_ref(), self.entity_key.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                Extractor::Json(p) => Some(p),
                Extractor::Header(_) | Extractor::FirstHeader(_) => None,
            })
            .collect()
    }

    /// The identity, given what [`Self::pointers`] found in the body.
    fn identify_from(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        found: Vec<Option<Value>>,
    ) -> Identity {
        let extractors = [self.event_id.as_ref(), self.entity_key.as_ref()];
        let mut from_body = found.into_iter();
        let [event_id, entity_key] = extractors.map(|e| match e? {
            Extractor::Header(name) => headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            Extractor::FirstHeader(names) => names
                .iter()
                .find_map(|name| headers.get(name).and_then(|v| v.to_str().ok()))
                .map(str::to_owned),
            Extractor::Json(_) => from_body.next().flatten().and_then(json_to_text),
        });
        let event_id = if self.dedup_on_body {
            signed_content_id(body)
        } else {
            event_id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| body_hash_id(body))
        };
        Identity {
            event_id,
            entity_key,
        }
    }

    /// The headers worth keeping with the message.
    pub fn keep_headers(&self, headers: &HeaderMap) -> Vec<(String, String)> {
        self.kept_headers
            .iter()
            .filter_map(|name| {
                let v = headers.get(name)?.to_str().ok()?;
                Some((name.as_str().to_owned(), v.to_owned()))
            })
            .collect()
    }
}

/// The id of a webhook deduplicated on what its signature covers (see
/// [`DedupOn::Body`]): a hash of the signed body and of nothing else.
///
/// GitHub and Shopify sign the body only; their topic headers
/// (`X-GitHub-Event`, `X-Shopify-Topic`) and delivery ids are not signed,
/// so whoever captured a delivery can send it again with any of them
/// changed. Were a header part of the identity, each change would make a
/// new webhook, applied again. Two deliveries of one body under two topics
/// are therefore one webhook: a source that needs them apart sets
/// `dedup_on = "event_id"` and accepts that its delivery id is unsigned.
pub fn signed_content_id(body: &[u8]) -> String {
    body_hash_id(body)
}

/// The id of a webhook whose source gives none: `sha256:<hex of body>`.
/// The header `id` reads when `scheme`'s signature does not cover it. Only
/// Standard Webhooks signs a header (its id, `webhook-id` or Svix's
/// `svix-id`); every scheme signs the body.
fn unsigned_header(scheme: SchemeName, id: &Extractor) -> Option<String> {
    let signed = |h: &HeaderName| {
        scheme == SchemeName::Standard && matches!(h.as_str(), "webhook-id" | "svix-id")
    };
    match id {
        Extractor::Json(_) => None,
        Extractor::Header(h) => (!signed(h)).then(|| h.to_string()),
        Extractor::FirstHeader(hs) => hs.iter().find(|h| !signed(h)).map(HeaderName::to_string),
    }
}

pub fn body_hash_id(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}

fn scheme_of(config: &SourceConfig) -> Scheme {
    let tolerance = |default: u64| Duration::from_secs(config.tolerance_secs.unwrap_or(default));
    match config.scheme {
        SchemeName::Stripe => Scheme::Stripe {
            tolerance: tolerance(300),
        },
        SchemeName::Shopify => Scheme::Shopify,
        SchemeName::Github => Scheme::GitHub,
        SchemeName::Standard => Scheme::Standard {
            tolerance: tolerance(300),
        },
        SchemeName::Hmac => Scheme::Hmac(HmacScheme {
            header: config.header.clone().unwrap_or_default(),
            algorithm: match config.algorithm {
                HmacAlgorithm::Sha256 => Algorithm::Sha256,
                HmacAlgorithm::Sha1 => Algorithm::Sha1,
            },
            encoding: match config.encoding {
                HmacEncoding::Hex => Encoding::Hex,
                HmacEncoding::Base64 => Encoding::Base64,
            },
            prefix: config.prefix.clone(),
        }),
    }
}

/// All sources by name.
pub type Sources = HashMap<String, Arc<Source>>;

/// Compiles every configured source.
pub fn compile_all(configs: &[SourceConfig]) -> Result<Sources, SourceError> {
    configs
        .iter()
        .map(|c| {
            Source::compile(c, |v| std::env::var(v).ok()).map(|s| (c.name.clone(), Arc::new(s)))
        })
        .collect()
}

/// What identifies `config`'s webhooks for deduplication: as set, else the
/// body for the schemes whose delivery id is not signed (github, shopify)
/// unless an `event_id` is configured.
pub fn dedup_on(config: &SourceConfig) -> DedupOn {
    config
        .dedup_on
        .unwrap_or(match (config.scheme, &config.event_id) {
            (SchemeName::Github | SchemeName::Shopify, None) => DedupOn::Body,
            _ => DedupOn::EventId,
        })
}

/// What `config`'s bodies must be: as set, else JSON for every scheme whose
/// issuers always send JSON, anything for generic HMAC.
pub fn body_format(config: &SourceConfig) -> BodyFormat {
    config.body.unwrap_or(match config.scheme {
        SchemeName::Hmac => BodyFormat::Any,
        _ => BodyFormat::Json,
    })
}

/// Checks every extractor spec of `source` (`event_id`, `entity_key`,
/// `version`, each statement parameter); the error names the field relative to the source
/// (`entity_key`, `statement[0].params.status`).
pub fn check_extractors(source: &SourceConfig) -> Result<(), (String, String)> {
    for (field, value) in [
        ("event_id", &source.event_id),
        ("entity_key", &source.entity_key),
    ] {
        if let Some(v) = value {
            Extractor::parse(v).map_err(|m| (field.to_owned(), m))?;
        }
    }
    if let Some(v) = source.version_spec() {
        Extractor::parse(v).map_err(|m| ("version".to_owned(), format!("{m}, or \"none\"")))?;
    }
    for (j, st) in source.statements.iter().enumerate() {
        for (name, v) in &st.params {
            Extractor::parse(v).map_err(|m| (format!("statement[{j}].params.{name}"), m))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn github(event_id: Option<&str>, entity: Option<&str>) -> SourceConfig {
        SourceConfig {
            event_id: event_id.map(str::to_owned),
            entity_key: entity.map(str::to_owned),
            ..SourceConfig::new("gh", SchemeName::Github, vec!["s3cret".into()])
        }
    }

    #[test]
    fn scheme_default_id_header_is_used_when_the_body_does_not_identify() {
        // GitHub signs the body only: by default the body identifies it.
        let s = Source::compile(&github(None, Some("json:/order/id")), |_| None).expect("ok");
        let mut h = HeaderMap::new();
        h.insert("x-github-delivery", "d-1".parse().expect("hv"));
        let body = br#"{"order":{"id":1042}}"#;
        let id = s.identify(&h, body);
        assert!(id.event_id.starts_with("sha256:"), "{}", id.event_id);
        assert_ne!(id.event_id, "d-1");
        assert_eq!(id.entity_key.as_deref(), Some("1042"));
        // With dedup_on = event_id, the delivery header.
        let config = SourceConfig {
            dedup_on: Some(config::DedupOn::EventId),
            ..github(None, None)
        };
        let s = Source::compile(&config, |_| None).expect("ok");
        assert_eq!(s.identify(&h, body).event_id, "d-1");
    }

    #[test]
    fn missing_id_falls_back_to_body_hash() {
        let s = Source::compile(&github(Some("json:/id"), None), |_| None).expect("ok");
        let body = br#"{"no_id":true}"#;
        let id = s.identify(&HeaderMap::new(), body);
        assert_eq!(id.event_id, body_hash_id(body));
        assert!(id.event_id.starts_with("sha256:"));
        assert_eq!(id.entity_key, None);
    }

    /// `read` answers as the separate JSON check followed by `identify`
    /// would, with and without pointers, for JSON-only and any-body sources.
    #[test]
    fn read_is_the_json_check_then_identify() {
        let json_only = |event_id: Option<&str>| {
            Source::compile(&github(event_id, Some("json:/order/id")), |_| None).expect("ok")
        };
        let any_body = Source::compile(
            &SourceConfig {
                body: Some(BodyFormat::Any),
                ..github(Some("json:/id"), None)
            },
            |_| None,
        )
        .expect("ok");
        let headers = HeaderMap::new();
        let bodies: [&[u8]; 6] = [
            br#"{"id":"evt_1","order":{"id":1042}}"#,
            br#"{"id":"evt_1"} trailing"#,
            b"not json at all",
            br#"{"id":"evt_1","order":{"id":10"#,
            // A pointed-at string that is not UTF-8: the pointers' walk
            // refuses it, the syntax check does not.
            b"{\"id\":\"\xff\xfe\",\"order\":{\"id\":7}}",
            b"",
        ];
        for source in [json_only(Some("json:/id")), json_only(None), any_body] {
            for body in bodies {
                let separate = if source.requires_json {
                    serde_json::from_slice::<serde::de::IgnoredAny>(body)
                        .map(|_| source.identify(&headers, body))
                        .map_err(|e| e.to_string())
                } else {
                    Ok(source.identify(&headers, body))
                };
                let together = source.read(&headers, body).map_err(|e| e.to_string());
                assert_eq!(together, separate, "{:?}", String::from_utf8_lossy(body));
            }
        }
        // And the refusals are there to compare.
        assert!(json_only(None).read(&headers, b"not json").is_err());
        let odd = b"{\"id\":\"\xff\",\"order\":{\"id\":7}}";
        assert!(json_only(Some("json:/id")).read(&headers, odd).is_ok());
    }

    #[test]
    fn secrets_from_env_are_split() {
        let mut c = github(None, None);
        c.secrets.clear();
        c.secrets_env = Some("GH_SECRETS".into());
        let s = Source::compile(&c, |v| (v == "GH_SECRETS").then(|| "a, b".to_owned()));
        assert!(s.is_ok());
        let missing = Source::compile(&c, |_| None).unwrap_err();
        assert!(missing.to_string().contains("GH_SECRETS"));
    }

    #[test]
    fn no_secret_at_all_is_an_error() {
        let mut c = github(None, None);
        c.secrets.clear();
        assert!(Source::compile(&c, |_| None).is_err());
    }

    #[test]
    fn extractor_parsing() {
        assert_eq!(
            Extractor::parse("json:/a/b"),
            Ok(Extractor::Json(Pointer::parse("/a/b").expect("pointer")))
        );
        assert!(matches!(
            Extractor::parse("header:X-Id"),
            Ok(Extractor::Header(_))
        ));
        assert!(Extractor::parse("json:a").is_err());
        assert!(Extractor::parse("query:a").is_err());
    }

    #[test]
    fn a_standard_webhooks_source_takes_its_id_from_svix_id_too() {
        let config = SourceConfig::new(
            "sw",
            SchemeName::Standard,
            vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
        );
        let source = Source::compile(&config, |_| None).expect("source");
        let mut svix = HeaderMap::new();
        svix.insert("svix-id", "msg_svix_1".parse().expect("value"));
        assert_eq!(source.identify(&svix, b"{}").event_id, "msg_svix_1");
        let mut standard = HeaderMap::new();
        standard.insert("webhook-id", "msg_std_1".parse().expect("value"));
        standard.insert("svix-id", "msg_svix_2".parse().expect("value"));
        assert_eq!(source.identify(&standard, b"{}").event_id, "msg_std_1");
    }

    #[test]
    fn integer_ids_past_2_pow_53_keep_every_digit() {
        let mut config = SourceConfig::new("s", SchemeName::Stripe, vec!["whsec_x".into()]);
        config.entity_key = Some("json:/order".into());
        let source = Source::compile(&config, |_| None).expect("source");
        let body = br#"{"id": 9007199254740993, "order": 18446744073709551615}"#;
        let id = source.identify(&HeaderMap::new(), body);
        assert_eq!(id.event_id, "9007199254740993");
        assert_eq!(id.entity_key.as_deref(), Some("18446744073709551615"));
        // Past 2^64 (a float in a `Value`): still every digit, so two ids
        // one apart stay two.
        let a = source.identify(&HeaderMap::new(), br#"{"id": 18446744073709551616}"#);
        let b = source.identify(&HeaderMap::new(), br#"{"id": -18446744073709551617}"#);
        assert_eq!(a.event_id, "18446744073709551616");
        assert_eq!(b.event_id, "-18446744073709551617");
        let c = source.identify(&HeaderMap::new(), br#"{"id": 1.5e3}"#);
        assert_eq!(c.event_id, "1500.0", "a float is rendered as a number");
    }

    #[test]
    fn an_event_id_from_a_header_the_signature_does_not_cover_is_named() {
        let unsigned = |scheme: SchemeName, event_id: Option<&str>, dedup: Option<DedupOn>| {
            let config = SourceConfig {
                event_id: event_id.map(str::to_owned),
                dedup_on: dedup,
                header: Some("X-Signature".into()),
                ..SourceConfig::new(
                    "s",
                    scheme,
                    vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
                )
            };
            Source::compile(&config, |_| None)
                .expect("source")
                .unsigned_event_id
        };
        let hmac = SchemeName::Hmac;
        assert_eq!(
            unsigned(hmac, Some("header:X-Event-Id"), None).as_deref(),
            Some("x-event-id")
        );
        assert_eq!(unsigned(hmac, Some("json:/id"), None), None);
        assert_eq!(
            unsigned(hmac, Some("header:X-Event-Id"), Some(DedupOn::Body)),
            None
        );
        assert_eq!(
            unsigned(SchemeName::Standard, None, None),
            None,
            "webhook-id is signed"
        );
        assert_eq!(unsigned(SchemeName::Stripe, None, None), None, "json:/id");
        assert_eq!(
            unsigned(SchemeName::Github, None, None),
            None,
            "the body's hash"
        );
        assert_eq!(
            unsigned(SchemeName::Github, None, Some(DedupOn::EventId)).as_deref(),
            Some("x-github-delivery")
        );
    }

    /// Only what the signature covers identifies a delivery: a captured
    /// GitHub or Shopify webhook sent again under another topic header,
    /// another delivery id or none at all is the same webhook.
    #[test]
    fn unsigned_headers_do_not_change_the_identity() {
        let body = br#"{"id": 820982911946154508}"#;
        for (scheme, topic, delivery) in [
            (
                SchemeName::Shopify,
                "x-shopify-topic",
                "x-shopify-webhook-id",
            ),
            (SchemeName::Github, "x-github-event", "x-github-delivery"),
        ] {
            let config = SourceConfig::new("s", scheme, vec!["s".into()]);
            let source = Source::compile(&config, |_| None).expect("source");
            let headers = |t: Option<&str>, d: &str| {
                let mut h = HeaderMap::new();
                if let Some(t) = t {
                    h.insert(topic, t.parse().expect("value"));
                }
                h.insert(delivery, d.parse().expect("value"));
                h
            };
            let first = source.identify(&headers(Some("orders/create"), "w-1"), body);
            for (t, d) in [
                (Some("orders/paid"), "w-2"),
                (Some("push2"), "w-3"),
                (None, "w-4"),
            ] {
                assert_eq!(
                    source.identify(&headers(t, d), body),
                    first,
                    "{scheme:?} {t:?}"
                );
            }
            assert_eq!(first.event_id, body_hash_id(body));
        }
    }

    /// The stale-event guard's version: the scheme's default (Standard
    /// Webhooks' signed timestamp header then travels with the message),
    /// `"none"` turning it off, and a malformed one refused.
    #[test]
    fn version_defaults_by_scheme_and_none_turns_it_off() {
        let standard = SourceConfig::new("std", SchemeName::Standard, vec![]);
        assert_eq!(standard.version_spec(), Some("header:webhook-timestamp"));
        let stripe = SourceConfig::new("stripe", SchemeName::Stripe, vec![]);
        assert_eq!(stripe.version_spec(), Some("json:/created"));
        assert_eq!(github(None, None).version_spec(), None);
        let off = SourceConfig {
            version: Some(config::NO_VERSION.to_owned()),
            ..stripe
        };
        assert_eq!(off.version_spec(), None);

        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned();
        let source = Source::compile(
            &SourceConfig::new("std", SchemeName::Standard, vec![secret]),
            |_| None,
        )
        .expect("ok");
        assert!(source.kept_headers.iter().any(|h| h == "webhook-timestamp"));

        let bad = SourceConfig {
            version: Some("created".to_owned()),
            ..SourceConfig::new("stripe", SchemeName::Stripe, vec!["whsec_x".into()])
        };
        let (field, why) = check_extractors(&bad).expect_err("refused");
        assert_eq!(field, "version");
        assert!(why.contains("none"), "{why}");
        let err = Source::compile(&bad, |_| None).expect_err("refused");
        assert!(err.to_string().contains("created"), "{err}");
    }
}
