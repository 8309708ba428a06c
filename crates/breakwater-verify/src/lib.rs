//! Webhook signature verification and signing for Breakwater: pure, constant-time, no I/O.
//!
//! The ingress builds one [`Verifier`] per configured source (a [`Scheme`] plus the
//! source's secrets, several during a rotation) and calls [`Verifier::verify`] with the
//! request headers, the raw body and the current time. Tests, benchmarks, the CLI and
//! the outage lab call [`sign`] to produce the headers a real sender would send.
//!
//! # Schemes
//!
//! | [`Scheme`] | headers read | signed content | encoding |
//! |---|---|---|---|
//! | [`Scheme::Stripe`] | `stripe-signature: t=<unix>,v1=<hex>[,v1=...]` | `{t}.{body}` | hex, HMAC-SHA256, key = the whole `whsec_...` string |
//! | [`Scheme::Shopify`] | `x-shopify-hmac-sha256` | body | base64, HMAC-SHA256 |
//! | [`Scheme::GitHub`] | `x-hub-signature-256: sha256=<hex>` | body | hex, HMAC-SHA256 |
//! | [`Scheme::Standard`] | `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<b64> [v1,<b64>...]` (or the `svix-*` names) | `{id}.{timestamp}.{body}` | base64, HMAC-SHA256, key = base64 after `whsec_` |
//! | [`Scheme::Hmac`] | configured | body | configured ([`HmacScheme`]) |
//!
//! Rules shared by every scheme:
//!
//! - **Rotation**: a request passes if *any* secret matches *any* signature it carries;
//!   [`Verified::secret_index`] says which secret did, so an operator can tell when the
//!   old one stops being used.
//! - **Constant time**: MAC comparisons never stop at the first differing byte.
//! - **Signature first, then time**: [`VerifyError::Stale`] is only returned for an
//!   authentic request, so it reliably means "replay or clock skew", never "forgery".
//!   Stripe's window is one-sided (old timestamps only), as in Stripe's own libraries;
//!   the Standard Webhooks window applies in both directions, as its spec requires.
//! - **No secrets in output**: [`Verifier`]'s `Debug` shows the scheme and the number of
//!   keys only; errors name secrets by index.
//! - **Hot path**: keys are turned into keyed HMAC states once in [`Verifier::new`];
//!   [`Verifier::verify`] feeds the message parts (`t`, `.`, body...) into the MAC
//!   without concatenating them and decodes signatures into stack buffers: it does not
//!   allocate on success.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use breakwater_verify::{sign, Scheme, Verifier};
//!
//! let scheme = Scheme::Stripe { tolerance: Duration::from_secs(300) };
//! let secrets = vec!["whsec_new".to_string(), "whsec_old".to_string()];
//! let verifier = Verifier::new(scheme.clone(), &secrets)?;
//!
//! let body = br#"{"id":"evt_1"}"#;
//! let now = 1_700_000_000;
//! let mut headers = http::HeaderMap::new();
//! for (name, value) in sign(&scheme, "whsec_old", body, now, "evt_1")? {
//!     headers.insert(name, value);
//! }
//! let verified = verifier.verify(&headers, body, now + 5).expect("authentic");
//! assert_eq!(verified.timestamp, Some(now));
//! assert_eq!(verified.secret_index, 1);
//!
//! let err = verifier.verify(&headers, body, now + 3600).unwrap_err();
//! assert!(err.is_stale());
//! # Ok::<(), breakwater_verify::KeyError>(())
//! ```

mod error;
mod github;
mod hmac_generic;
mod mac;
mod shopify;
mod standard;
mod stripe;

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

pub use error::{KeyError, VerifyError};

use mac::KeySet;

/// Tolerance the providers document and use by default: 5 minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// How a source signs its webhooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Stripe: `Stripe-Signature: t=...,v1=...`; rejects timestamps older than `tolerance`.
    Stripe {
        /// Maximum age of the signed timestamp (Stripe's libraries default to 300 s).
        tolerance: Duration,
    },
    /// Shopify: `X-Shopify-Hmac-Sha256`, base64 HMAC-SHA256 of the body.
    Shopify,
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`.
    GitHub,
    /// Standard Webhooks (Svix and others): `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`; rejects timestamps more than `tolerance` away from now.
    Standard {
        /// Allowed distance between the signed timestamp and now, in both directions.
        tolerance: Duration,
    },
    /// Any HMAC signer over the raw body.
    Hmac(HmacScheme),
}

impl Scheme {
    /// Stripe with the default 300 s tolerance.
    pub const fn stripe() -> Self {
        Scheme::Stripe {
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// Standard Webhooks with the default 300 s tolerance.
    pub const fn standard() -> Self {
        Scheme::Standard {
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// The scheme's name as written in the config (`stripe`, `shopify`, `github`,
    /// `standard`, `hmac`), for logs and metric labels.
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::Stripe { .. } => "stripe",
            Scheme::Shopify => "shopify",
            Scheme::GitHub => "github",
            Scheme::Standard { .. } => "standard",
            Scheme::Hmac(_) => "hmac",
        }
    }
}

/// A generic HMAC-over-the-body scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HmacScheme {
    /// Header carrying the signature (any case; matched case-insensitively).
    pub header: String,
    /// Hash function of the HMAC.
    pub algorithm: Algorithm,
    /// How the MAC is written in the header.
    pub encoding: Encoding,
    /// Text before the encoded MAC, e.g. `sha256=` (matched ASCII case-insensitively).
    pub prefix: Option<String>,
}

/// Hash function of a generic HMAC scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// HMAC-SHA256 (32-byte tags).
    Sha256,
    /// HMAC-SHA1 (20-byte tags), for legacy senders.
    Sha1,
}

/// Text encoding of a generic HMAC signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Hexadecimal, either case accepted, lower case produced.
    Hex,
    /// Standard base64 (`+/`), padding optional on input, produced with padding.
    Base64,
}

/// What a successful verification learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The signed timestamp (Unix seconds), for the schemes that sign one
    /// (Stripe, Standard Webhooks).
    pub timestamp: Option<i64>,
    /// Index, in the list given to [`Verifier::new`], of the secret that matched.
    pub secret_index: usize,
}

/// A scheme with its decoded, pre-keyed secrets. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    compiled: Compiled,
}

/// Everything `verify` needs, derived once from the scheme and the secrets.
#[derive(Clone)]
struct Compiled {
    keys: KeySet,
    /// The generic scheme's header name, parsed once.
    hmac_header: Option<HeaderName>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field(
                "keys",
                &format_args!("<{} redacted>", self.compiled.keys.len()),
            )
            .finish()
    }
}

impl Verifier {
    /// Decodes and keys `secrets` for `scheme`.
    ///
    /// Stripe, Shopify, GitHub and generic HMAC secrets are used as their raw bytes
    /// (for Stripe, the whole `whsec_...` string is the key). Standard Webhooks secrets
    /// are base64, with or without a `whsec_` prefix.
    pub fn new(scheme: Scheme, secrets: &[String]) -> Result<Self, KeyError> {
        let compiled = Compiled::new(&scheme, secrets)?;
        Ok(Verifier { scheme, compiled })
    }

    /// Checks the signature of one request. `body` must be the raw bytes as received;
    /// `now_unix` is the current time in Unix seconds.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Verified, VerifyError> {
        let keys = &self.compiled.keys;
        match &self.scheme {
            Scheme::Stripe { tolerance } => {
                stripe::verify(keys, *tolerance, headers, body, now_unix)
            }
            Scheme::Shopify => shopify::verify(keys, headers, body),
            Scheme::GitHub => github::verify(keys, headers, body),
            Scheme::Standard { tolerance } => {
                standard::verify(keys, *tolerance, headers, body, now_unix)
            }
            Scheme::Hmac(hmac) => match &self.compiled.hmac_header {
                Some(name) => hmac_generic::verify(keys, hmac, name, headers, body),
                // `Compiled::new` always sets it for `Scheme::Hmac`.
                None => Err(VerifyError::MissingHeader(Cow::Owned(hmac.header.clone()))),
            },
        }
    }

    /// The scheme this verifier checks.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// Number of secrets configured.
    pub fn secret_count(&self) -> usize {
        self.compiled.keys.len()
    }
}

impl Compiled {
    fn new<S: AsRef<str>>(scheme: &Scheme, secrets: &[S]) -> Result<Self, KeyError> {
        if secrets.is_empty() {
            return Err(KeyError::NoSecrets);
        }
        let mut hmac_header = None;
        let algorithm = match scheme {
            Scheme::Hmac(hmac) => {
                hmac_header = Some(hmac_generic::header_name(hmac)?);
                hmac_generic::check_prefix(hmac)?;
                hmac.algorithm
            }
            _ => Algorithm::Sha256,
        };
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, secret)| decode_secret(scheme, secret.as_ref(), index))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Compiled {
            keys: KeySet::new(algorithm, &keys)?,
            hmac_header,
        })
    }
}

/// The key bytes of one configured secret.
fn decode_secret<'s>(
    scheme: &Scheme,
    secret: &'s str,
    index: usize,
) -> Result<Cow<'s, [u8]>, KeyError> {
    let key = match scheme {
        Scheme::Standard { .. } => Cow::Owned(standard::decode_secret(secret, index)?),
        _ => Cow::Borrowed(secret.as_bytes()),
    };
    if key.is_empty() {
        return Err(KeyError::EmptySecret { index });
    }
    Ok(key)
}

/// Produces the headers a real sender using `scheme` and `secret` would attach to
/// `body` at `now_unix`.
///
/// `msg_id` becomes `webhook-id` (Standard Webhooks), `x-shopify-webhook-id` (Shopify)
/// or `x-github-delivery` (GitHub) when non-empty; Stripe and generic HMAC carry the
/// event id in the body and ignore it.
pub fn sign(
    scheme: &Scheme,
    secret: &str,
    body: &[u8],
    now_unix: i64,
    msg_id: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, KeyError> {
    let compiled = Compiled::new(scheme, &[secret])?;
    let keys = &compiled.keys;
    match scheme {
        Scheme::Stripe { .. } => stripe::sign(keys, body, now_unix),
        Scheme::Shopify => shopify::sign(keys, body, msg_id),
        Scheme::GitHub => github::sign(keys, body, msg_id),
        Scheme::Standard { .. } => standard::sign(keys, body, now_unix, msg_id),
        Scheme::Hmac(hmac) => match compiled.hmac_header {
            Some(name) => hmac_generic::sign(keys, hmac, name, body),
            None => Err(KeyError::InvalidHeaderName {
                header: hmac.header.clone(),
            }),
        },
    }
}

/// The header that carries a unique event id for `scheme`, if the provider sends one:
/// Shopify `x-shopify-webhook-id`, GitHub `x-github-delivery`, Standard Webhooks
/// `webhook-id` (Svix-branded senders use `svix-id`). Stripe puts the event id in the
/// body (`json:/id`); generic HMAC senders vary.
pub fn default_event_id_header(scheme: &Scheme) -> Option<&'static str> {
    match scheme {
        Scheme::Shopify => Some(shopify::WEBHOOK_ID_NAME),
        Scheme::GitHub => Some(github::DELIVERY_NAME),
        Scheme::Standard { .. } => Some(standard::ID_NAME),
        Scheme::Stripe { .. } | Scheme::Hmac(_) => None,
    }
}

/// The value of a header as trimmed text, or the error naming it (`label`, lower case).
pub(crate) fn header_text(
    value: Option<&HeaderValue>,
    label: impl FnOnce() -> Cow<'static, str>,
) -> Result<&str, VerifyError> {
    match value.map(HeaderValue::to_str) {
        Some(Ok(text)) => Ok(text.trim()),
        Some(Err(_)) => Err(VerifyError::MalformedHeader {
            header: label(),
            reason: "not visible ASCII",
        }),
        None => Err(VerifyError::MissingHeader(label())),
    }
}

/// Parses a signed Unix timestamp: ASCII digits only (no sign, no spaces).
pub(crate) fn parse_timestamp(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Checks `timestamp` against `now`: too old always fails; too far in the future fails
/// only when `reject_future`.
pub(crate) fn check_window(
    timestamp: i64,
    now: i64,
    tolerance: Duration,
    reject_future: bool,
) -> Result<(), VerifyError> {
    let tolerance_secs = tolerance.as_secs();
    let limit = i64::try_from(tolerance_secs).unwrap_or(i64::MAX);
    let age_secs = now.saturating_sub(timestamp);
    if age_secs > limit || (reject_future && age_secs < -limit) {
        return Err(VerifyError::Stale {
            age_secs,
            tolerance_secs,
        });
    }
    Ok(())
}

/// Builds a header value from generated ASCII text (hex, base64, digits, a validated
/// prefix or message id); `on_error` is reported if it is somehow not a valid value.
pub(crate) fn header_value(text: String, on_error: KeyError) -> Result<HeaderValue, KeyError> {
    HeaderValue::try_from(text).map_err(|_| on_error)
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Helpers shared by the per-scheme tests.

    use http::{HeaderMap, HeaderName, HeaderValue};

    /// A header map from `(name, value)` pairs.
    pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("test header name"),
                HeaderValue::from_str(value).expect("test header value"),
            );
        }
        map
    }

    /// A header map from what `sign` returned.
    pub(crate) fn into_map(signed: Vec<(HeaderName, HeaderValue)>) -> HeaderMap {
        signed.into_iter().collect()
    }

    pub(crate) fn secrets(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{into_map, secrets};
    use super::*;

    fn all_schemes() -> Vec<Scheme> {
        vec![
            Scheme::stripe(),
            Scheme::Shopify,
            Scheme::GitHub,
            Scheme::standard(),
            Scheme::Hmac(HmacScheme {
                header: "X-Signature".into(),
                algorithm: Algorithm::Sha1,
                encoding: Encoding::Base64,
                prefix: Some("sha1=".into()),
            }),
        ]
    }

    // Base64 of "breakwater secret!" so the same string also works as a Standard secret.
    const SECRET: &str = "whsec_YnJlYWt3YXRlciBzZWNyZXQh";
    // Base64 of "other secret".
    const OTHER: &str = "whsec_b3RoZXIgc2VjcmV0";

    #[test]
    fn sign_round_trips_verify_for_every_scheme() {
        let body = br#"{"id":"evt_42","data":{"object":{"id":"order_1042"}}}"#;
        let now = 1_700_000_000;
        for scheme in all_schemes() {
            let verifier = Verifier::new(scheme.clone(), &secrets(&[OTHER, SECRET]))
                .unwrap_or_else(|e| panic!("{}: {e}", scheme.name()));
            let headers = into_map(sign(&scheme, SECRET, body, now, "msg_42").expect("sign"));
            let verified = verifier
                .verify(&headers, body, now + 10)
                .unwrap_or_else(|e| panic!("{}: {e}", scheme.name()));
            assert_eq!(verified.secret_index, 1, "{}", scheme.name());
            assert_eq!(
                verified.timestamp.is_some(),
                matches!(scheme, Scheme::Stripe { .. } | Scheme::Standard { .. })
            );
            assert_eq!(
                verifier.verify(&headers, b"tampered", now + 10),
                Err(VerifyError::Mismatch),
                "{}",
                scheme.name()
            );
            if let Some(id_header) = default_event_id_header(&scheme) {
                assert_eq!(
                    headers.get(id_header).map(|v| v.as_bytes()),
                    Some(&b"msg_42"[..])
                );
            }
        }
    }

    #[test]
    fn debug_and_errors_never_show_secrets() {
        for scheme in all_schemes() {
            let verifier = Verifier::new(scheme, &secrets(&[SECRET])).expect("verifier");
            let debug = format!("{verifier:?}");
            assert!(!debug.contains("YnJlYWt3"), "{debug}");
            assert!(debug.contains("<1 redacted>"), "{debug}");
        }
        let err = Verifier::new(Scheme::standard(), &secrets(&["whsec_not*base64"]))
            .expect_err("bad base64");
        assert_eq!(err, KeyError::InvalidBase64 { index: 0 });
        assert!(!format!("{err} {err:?}").contains("not*base64"));
    }

    #[test]
    fn key_errors() {
        assert_eq!(
            Verifier::new(Scheme::GitHub, &[]).err(),
            Some(KeyError::NoSecrets)
        );
        assert_eq!(
            Verifier::new(Scheme::GitHub, &secrets(&["ok", ""])).err(),
            Some(KeyError::EmptySecret { index: 1 })
        );
        assert_eq!(
            Verifier::new(Scheme::standard(), &secrets(&["whsec_"])).err(),
            Some(KeyError::EmptySecret { index: 0 })
        );
        assert_eq!(
            sign(&Scheme::standard(), SECRET, b"", 0, "bad\nid").err(),
            Some(KeyError::InvalidMessageId)
        );
    }

    #[test]
    fn verifier_is_send_sync_clone() {
        fn assert_traits<T: Send + Sync + Clone + 'static>() {}
        assert_traits::<Verifier>();
        let verifier = Verifier::new(Scheme::GitHub, &secrets(&["s"])).expect("verifier");
        let copy = verifier.clone();
        assert_eq!(copy.scheme(), &Scheme::GitHub);
        assert_eq!(copy.secret_count(), 1);
    }

    #[test]
    fn default_event_id_headers() {
        assert_eq!(
            default_event_id_header(&Scheme::Shopify),
            Some("x-shopify-webhook-id")
        );
        assert_eq!(
            default_event_id_header(&Scheme::GitHub),
            Some("x-github-delivery")
        );
        assert_eq!(
            default_event_id_header(&Scheme::standard()),
            Some("webhook-id")
        );
        assert_eq!(default_event_id_header(&Scheme::stripe()), None);
    }

    #[test]
    fn window_edges() {
        let tol = Duration::from_secs(300);
        assert!(check_window(1000, 1300, tol, true).is_ok());
        assert!(check_window(1000, 1301, tol, true).is_err());
        assert!(check_window(1300, 1000, tol, true).is_ok());
        assert!(check_window(1301, 1000, tol, true).is_err());
        assert!(check_window(i64::MAX, 1000, tol, false).is_ok());
        assert!(check_window(0, i64::MAX, Duration::MAX, true).is_ok());
        assert!(check_window(i64::MAX, 0, Duration::MAX, true).is_ok());
        let stale = check_window(0, i64::MAX, tol, true).expect_err("stale");
        assert!(stale.is_stale());
        assert!(stale.to_string().contains("old"), "{stale}");
        let future = check_window(2000, 1000, tol, true).expect_err("future");
        assert!(
            future.to_string().contains("1000 s in the future"),
            "{future}"
        );
    }

    #[test]
    fn timestamp_parsing() {
        assert_eq!(parse_timestamp("1614265330"), Some(1_614_265_330));
        for bad in ["", "-1", "+1", "1.5", "abc", "99999999999999999999"] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }
}
