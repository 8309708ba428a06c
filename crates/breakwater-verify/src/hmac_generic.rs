//! Generic HMAC over the raw body: a configured header, algorithm (SHA-256 or SHA-1),
//! encoding (hex or base64) and optional prefix such as `sha256=`.
//!
//! [`verify_single`] is also the engine of the GitHub scheme, which is this scheme with
//! fixed settings.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::mac::{KeySet, Tag};
use crate::{Encoding, HmacScheme, KeyError, Verified, VerifyError};

/// Parses the configured header name (any case).
pub(crate) fn header_name(scheme: &HmacScheme) -> Result<HeaderName, KeyError> {
    HeaderName::from_bytes(scheme.header.trim().as_bytes()).map_err(|_| {
        KeyError::InvalidHeaderName {
            header: scheme.header.clone(),
        }
    })
}

/// A prefix must be text a header value can hold.
pub(crate) fn check_prefix(scheme: &HmacScheme) -> Result<(), KeyError> {
    match scheme.prefix.as_deref() {
        Some(prefix) if HeaderValue::from_str(prefix).is_err() => Err(KeyError::InvalidPrefix),
        _ => Ok(()),
    }
}

/// Strips `prefix` from the start of `text`, ignoring ASCII case.
fn strip_prefix_ignore_case<'t>(text: &'t str, prefix: &str) -> Option<&'t str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// Verifies a header holding one MAC of the body: `[prefix]<encoded tag>`.
pub(crate) fn verify_single(
    keys: &KeySet,
    value: Option<&HeaderValue>,
    label: impl Fn() -> Cow<'static, str>,
    encoding: Encoding,
    prefix: Option<&str>,
    body: &[u8],
) -> Result<Verified, VerifyError> {
    let text = crate::header_text(value, &label)?;
    let encoded = match prefix.filter(|p| !p.is_empty()) {
        Some(prefix) => {
            strip_prefix_ignore_case(text, prefix).ok_or_else(|| VerifyError::MalformedHeader {
                header: label(),
                reason: "the expected prefix is missing",
            })?
        }
        None => text,
    };
    let (candidate, reason) = match encoding {
        Encoding::Hex => (
            Tag::from_hex(encoded, keys.tag_len()),
            "not a hex HMAC of the expected length",
        ),
        Encoding::Base64 => (
            Tag::from_base64(encoded, keys.tag_len()),
            "not a base64 HMAC of the expected length",
        ),
    };
    let candidate = candidate.ok_or_else(|| VerifyError::MalformedHeader {
        header: label(),
        reason,
    })?;
    let secret_index = keys
        .find(&[body], || std::iter::once(candidate))
        .ok_or(VerifyError::Mismatch)?;
    Ok(Verified {
        timestamp: None,
        secret_index,
    })
}

pub(crate) fn verify(
    keys: &KeySet,
    scheme: &HmacScheme,
    name: &HeaderName,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Verified, VerifyError> {
    verify_single(
        keys,
        headers.get(name),
        || Cow::Owned(name.as_str().to_owned()),
        scheme.encoding,
        scheme.prefix.as_deref(),
        body,
    )
}

/// `[prefix]<encoded MAC of body>`.
pub(crate) fn encode(
    keys: &KeySet,
    encoding: Encoding,
    prefix: Option<&str>,
    body: &[u8],
) -> String {
    let tag = keys.sign(&[body]);
    let encoded = match encoding {
        Encoding::Hex => tag.to_hex(),
        Encoding::Base64 => tag.to_base64(),
    };
    match prefix {
        Some(prefix) => format!("{prefix}{encoded}"),
        None => encoded,
    }
}

pub(crate) fn sign(
    keys: &KeySet,
    scheme: &HmacScheme,
    name: HeaderName,
    body: &[u8],
) -> Result<Vec<(HeaderName, HeaderValue)>, KeyError> {
    let text = encode(keys, scheme.encoding, scheme.prefix.as_deref(), body);
    Ok(vec![(
        name,
        crate::header_value(text, KeyError::InvalidPrefix)?,
    )])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{headers, into_map, secrets};
    use crate::{Algorithm, Scheme, Verifier};

    // RFC 4231 test case 2 (HMAC-SHA-256) and RFC 2202 test case 2 (HMAC-SHA-1):
    // key "Jefe", data "what do ya want for nothing?". The base64 forms were produced
    // with python3 (base64.b64encode of the digest).
    const KEY: &str = "Jefe";
    const DATA: &[u8] = b"what do ya want for nothing?";
    const SHA256_HEX: &str = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
    const SHA1_HEX: &str = "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79";
    const SHA1_B64: &str = "7/zfauXrL6LSdBbV8YTfnCWafHk=";
    // GitHub's legacy `X-Hub-Signature` for the GitHub documentation example (secret
    // "It's a Secret to Everybody", payload "Hello, World!"), computed with python3
    // hmac/hashlib.sha1.
    const GITHUB_SHA1: &str = "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59";

    fn scheme(algorithm: Algorithm, encoding: Encoding, prefix: Option<&str>) -> Scheme {
        Scheme::Hmac(HmacScheme {
            header: "X-Signature".into(),
            algorithm,
            encoding,
            prefix: prefix.map(str::to_owned),
        })
    }

    fn check(
        scheme: &Scheme,
        list: &[&str],
        value: &str,
        body: &[u8],
    ) -> Result<Verified, VerifyError> {
        Verifier::new(scheme.clone(), &secrets(list))
            .expect("verifier")
            .verify(&headers(&[("x-signature", value)]), body, 0)
    }

    #[test]
    fn rfc_vectors_in_every_shape() {
        let cases = [
            (
                Algorithm::Sha256,
                Encoding::Hex,
                None,
                SHA256_HEX.to_owned(),
            ),
            (
                Algorithm::Sha256,
                Encoding::Hex,
                Some("sha256="),
                format!("sha256={SHA256_HEX}"),
            ),
            (Algorithm::Sha1, Encoding::Hex, None, SHA1_HEX.to_owned()),
            (Algorithm::Sha1, Encoding::Base64, None, SHA1_B64.to_owned()),
            (
                Algorithm::Sha1,
                Encoding::Base64,
                Some("v1:"),
                format!("v1:{SHA1_B64}"),
            ),
        ];
        for (algorithm, encoding, prefix, expected) in cases {
            let s = scheme(algorithm, encoding, prefix);
            assert!(check(&s, &[KEY], &expected, DATA).is_ok(), "{expected}");
            let signed = into_map(crate::sign(&s, KEY, DATA, 0, "").expect("sign"));
            assert_eq!(
                signed.get("x-signature").expect("header"),
                expected.as_str()
            );
            assert_eq!(
                check(&s, &["other", KEY], &expected, DATA).map(|v| v.secret_index),
                Ok(1)
            );
            assert_eq!(
                check(&s, &["other"], &expected, DATA),
                Err(VerifyError::Mismatch)
            );
            assert_eq!(
                check(&s, &[KEY], &expected, b"tampered"),
                Err(VerifyError::Mismatch)
            );
        }
    }

    #[test]
    fn github_legacy_sha1_header() {
        let s = Scheme::Hmac(HmacScheme {
            header: "X-Hub-Signature".into(),
            algorithm: Algorithm::Sha1,
            encoding: Encoding::Hex,
            prefix: Some("sha1=".into()),
        });
        let v = Verifier::new(s, &secrets(&["It's a Secret to Everybody"])).expect("verifier");
        let map = headers(&[("x-hub-signature", GITHUB_SHA1)]);
        assert!(v.verify(&map, b"Hello, World!", 0).is_ok());
    }

    #[test]
    fn prefix_and_case_handling() {
        let s = scheme(Algorithm::Sha256, Encoding::Hex, Some("sha256="));
        let upper = format!("SHA256={}", SHA256_HEX.to_uppercase());
        assert!(check(&s, &[KEY], &upper, DATA).is_ok());
        assert_eq!(
            check(&s, &[KEY], SHA256_HEX, DATA),
            Err(VerifyError::MalformedHeader {
                header: "x-signature".into(),
                reason: "the expected prefix is missing"
            })
        );
        // A sha1-length tag for a sha256 scheme is malformed, not a mismatch.
        assert_eq!(
            check(&s, &[KEY], &format!("sha256={SHA1_HEX}"), DATA),
            Err(VerifyError::MalformedHeader {
                header: "x-signature".into(),
                reason: "not a hex HMAC of the expected length"
            })
        );
        let b64 = scheme(Algorithm::Sha1, Encoding::Base64, None);
        assert_eq!(
            check(&b64, &[KEY], SHA1_HEX, DATA),
            Err(VerifyError::MalformedHeader {
                header: "x-signature".into(),
                reason: "not a base64 HMAC of the expected length"
            })
        );
        // Prefix longer than the value, or cut inside a multi-byte char: no panic.
        assert!(check(&s, &[KEY], "sha", DATA).is_err());
        // An empty prefix means no prefix.
        let empty = scheme(Algorithm::Sha256, Encoding::Hex, Some(""));
        assert!(check(&empty, &[KEY], SHA256_HEX, DATA).is_ok());
        assert_eq!(strip_prefix_ignore_case("é=abc", "x="), None);
    }

    #[test]
    fn missing_header_and_config_errors() {
        let s = scheme(Algorithm::Sha256, Encoding::Hex, None);
        let v = Verifier::new(s, &secrets(&[KEY])).expect("verifier");
        assert_eq!(
            v.verify(&HeaderMap::new(), DATA, 0),
            Err(VerifyError::MissingHeader("x-signature".into()))
        );
        let bad_name = Scheme::Hmac(HmacScheme {
            header: "bad header".into(),
            algorithm: Algorithm::Sha256,
            encoding: Encoding::Hex,
            prefix: None,
        });
        assert_eq!(
            Verifier::new(bad_name, &secrets(&[KEY])).err(),
            Some(KeyError::InvalidHeaderName {
                header: "bad header".into()
            })
        );
        let bad_prefix = scheme(Algorithm::Sha256, Encoding::Hex, Some("a\nb"));
        assert_eq!(
            Verifier::new(bad_prefix.clone(), &secrets(&[KEY])).err(),
            Some(KeyError::InvalidPrefix)
        );
        assert_eq!(
            crate::sign(&bad_prefix, KEY, DATA, 0, "").err(),
            Some(KeyError::InvalidPrefix)
        );
    }
}
