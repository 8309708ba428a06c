//! Error types of the crate.
//!
//! Two families, kept apart because they surface at different times:
//!
//! - [`KeyError`]: configuration problems found when building a [`crate::Verifier`] or
//!   calling [`crate::sign`] (no secrets, a secret that is not valid base64, a bad
//!   header name...). Reported at startup or by `config check`.
//! - [`VerifyError`]: why one request was rejected. Every message is written to be
//!   returned as the `detail` of an HTTP 401 answer.
//!
//! Neither type ever carries secret material: secrets are referred to by their index in
//! the configured list, never by value.

use std::borrow::Cow;

/// A secret list or a scheme that cannot be used. Never echoes a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The secret list is empty.
    #[error("no secrets configured")]
    NoSecrets,
    /// A secret is the empty string (or only the `whsec_` prefix).
    #[error("secret at index {index} is empty")]
    EmptySecret {
        /// Position of the secret in the configured list.
        index: usize,
    },
    /// A Standard Webhooks secret is not base64 after its optional `whsec_` prefix.
    #[error(
        "secret at index {index} is not valid base64 \
         (Standard Webhooks secrets look like `whsec_<base64>`)"
    )]
    InvalidBase64 {
        /// Position of the secret in the configured list.
        index: usize,
    },
    /// The HMAC implementation refused the key (should not happen: HMAC takes any length).
    #[error("secret at index {index} was refused by the HMAC implementation")]
    Unusable {
        /// Position of the secret in the configured list.
        index: usize,
    },
    /// The generic HMAC scheme names a header that is not a valid HTTP header name.
    #[error("`{header}` is not a valid HTTP header name")]
    InvalidHeaderName {
        /// The configured header name (not a secret).
        header: String,
    },
    /// The generic HMAC scheme's prefix cannot appear in an HTTP header value.
    #[error("the signature prefix contains characters not allowed in an HTTP header value")]
    InvalidPrefix,
    /// [`crate::sign`] was given a message id that cannot be sent as a header value.
    #[error("the message id contains characters not allowed in an HTTP header value")]
    InvalidMessageId,
}

/// Why a webhook was rejected. The `Display` text is suitable as an HTTP 401 `detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A header the scheme needs is absent. Holds the header name (lower case).
    #[error("missing `{0}` header")]
    MissingHeader(Cow<'static, str>),
    /// A header is present but cannot be parsed.
    #[error("malformed `{header}` header: {reason}")]
    MalformedHeader {
        /// Header name (lower case).
        header: Cow<'static, str>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No configured secret produced any of the signatures in the request.
    #[error("signature does not match")]
    Mismatch,
    /// The signature is authentic but its timestamp is outside the tolerance window.
    /// `age_secs` is negative for a timestamp in the future.
    #[error("{}", stale_detail(*.age_secs, *.tolerance_secs))]
    Stale {
        /// `now - timestamp`, in seconds (negative: in the future).
        age_secs: i64,
        /// The configured tolerance, in seconds.
        tolerance_secs: u64,
    },
}

impl VerifyError {
    /// True for [`VerifyError::Stale`]: the sender and this host disagree on the time, or
    /// the request is a replay. Useful to count apart from forgeries.
    pub fn is_stale(&self) -> bool {
        matches!(self, VerifyError::Stale { .. })
    }

    pub(crate) fn malformed(header: &'static str, reason: &'static str) -> Self {
        VerifyError::MalformedHeader {
            header: Cow::Borrowed(header),
            reason,
        }
    }
}

fn stale_detail(age_secs: i64, tolerance_secs: u64) -> String {
    if age_secs >= 0 {
        format!(
            "timestamp is {age_secs} s old, outside the {tolerance_secs} s tolerance \
             (replayed, or the clocks disagree)"
        )
    } else {
        format!(
            "timestamp is {} s in the future, outside the {tolerance_secs} s tolerance \
             (the clocks disagree)",
            age_secs.unsigned_abs()
        )
    }
}
