//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...][,v0=...]`.
//!
//! Stripe signs `"{t}.{body}"` with HMAC-SHA256, keyed with the endpoint secret as raw
//! bytes (the whole `whsec_...` string), and writes the tag in lower-case hex. During a
//! secret roll Stripe sends one `v1` per active secret; schemes other than `v1` (the
//! test-mode `v0`) are ignored. Like Stripe's libraries, only timestamps *older* than
//! the tolerance are rejected.

use std::borrow::Cow;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::mac::{KeySet, Tag};
use crate::{KeyError, Verified, VerifyError};

const SIGNATURE_NAME: &str = "stripe-signature";
const SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);

/// The `t` text and the `v1` entries of a `Stripe-Signature` value.
struct Parsed<'h> {
    timestamp_text: &'h str,
    timestamp: i64,
    header: &'h str,
}

impl<'h> Parsed<'h> {
    fn parse(header: &'h str) -> Result<Self, VerifyError> {
        let timestamp_text = fields(header)
            .find_map(|(key, value)| (key == "t").then_some(value))
            .ok_or(VerifyError::malformed(SIGNATURE_NAME, "no `t=` timestamp"))?;
        let timestamp = crate::parse_timestamp(timestamp_text).ok_or(VerifyError::malformed(
            SIGNATURE_NAME,
            "`t=` is not a Unix timestamp",
        ))?;
        Ok(Parsed {
            timestamp_text,
            timestamp,
            header,
        })
    }

    /// The decodable `v1` signatures (anything else is ignored).
    fn candidates(&self, tag_len: usize) -> impl Iterator<Item = Tag> + 'h {
        fields(self.header)
            .filter(|(key, _)| *key == "v1")
            .filter_map(move |(_, value)| Tag::from_hex(value, tag_len))
    }
}

/// `key=value` items of the header, trimmed; items without `=` are skipped.
fn fields(header: &str) -> impl Iterator<Item = (&str, &str)> {
    header
        .split(',')
        .filter_map(|item| item.split_once('='))
        .map(|(key, value)| (key.trim(), value.trim()))
}

pub(crate) fn verify(
    keys: &KeySet,
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<Verified, VerifyError> {
    let header = crate::header_text(headers.get(&SIGNATURE), || Cow::Borrowed(SIGNATURE_NAME))?;
    let parsed = Parsed::parse(header)?;
    let tag_len = keys.tag_len();
    if parsed.candidates(tag_len).next().is_none() {
        return Err(VerifyError::malformed(
            SIGNATURE_NAME,
            "no valid `v1=` signature",
        ));
    }
    let message: [&[u8]; 3] = [parsed.timestamp_text.as_bytes(), b".", body];
    let secret_index = keys
        .find(&message, || parsed.candidates(tag_len))
        .ok_or(VerifyError::Mismatch)?;
    crate::check_window(parsed.timestamp, now, tolerance, false)?;
    Ok(Verified {
        timestamp: Some(parsed.timestamp),
        secret_index,
    })
}

pub(crate) fn sign(
    keys: &KeySet,
    body: &[u8],
    now: i64,
) -> Result<Vec<(HeaderName, HeaderValue)>, KeyError> {
    let t = now.to_string();
    let tag = keys.sign(&[t.as_bytes(), b".", body]);
    let value = crate::header_value(
        format!("t={t},v1={}", tag.to_hex()),
        KeyError::Unusable { index: 0 },
    )?;
    Ok(vec![(SIGNATURE, value)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{headers, into_map, secrets};
    use crate::{Scheme, Verifier};

    // Vector computed independently, twice, with:
    //   python3 -c 'import hmac,hashlib; print(hmac.new(b"whsec_breakwater_stripe_test_secret",
    //     b"1700000000." + BODY, hashlib.sha256).hexdigest())'
    //   printf %s "1700000000.$BODY" | openssl dgst -sha256 -hmac whsec_breakwater_stripe_test_secret
    // (same result; OTHER_SIG is the same with key b"whsec_previous_secret").
    const SECRET: &str = "whsec_breakwater_stripe_test_secret";
    const BODY: &[u8] =
        br#"{"id":"evt_1Breakwater","object":"event","type":"payment_intent.succeeded"}"#;
    const T: i64 = 1_700_000_000;
    const SIG: &str = "518bf98fc1c63b285a5ca0ae9f82ae5778ade92419ef0a8f7156914710c78ab2";
    const OTHER_SIG: &str = "913f3e1b67ea732f8963ea45f405a499e385f7862eef6264fc5ea4dd054992c8";

    fn verifier(list: &[&str]) -> Verifier {
        Verifier::new(Scheme::stripe(), &secrets(list)).expect("verifier")
    }

    fn check(header: &str, list: &[&str], body: &[u8], now: i64) -> Result<Verified, VerifyError> {
        verifier(list).verify(&headers(&[("Stripe-Signature", header)]), body, now)
    }

    #[test]
    fn known_vector() {
        let header = format!("t={T},v1={SIG}");
        let verified = check(&header, &[SECRET], BODY, T + 1).expect("valid");
        assert_eq!(
            verified,
            Verified {
                timestamp: Some(T),
                secret_index: 0
            }
        );
        let signed = into_map(sign_with(SECRET, T));
        assert_eq!(
            signed.get("stripe-signature").expect("header"),
            header.as_str()
        );
    }

    fn sign_with(secret: &str, now: i64) -> Vec<(HeaderName, HeaderValue)> {
        crate::sign(&Scheme::stripe(), secret, BODY, now, "ignored").expect("sign")
    }

    #[test]
    fn wrong_secret_and_tampered_body() {
        let header = format!("t={T},v1={SIG}");
        assert_eq!(
            check(&header, &["whsec_wrong"], BODY, T),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            check(&header, &[SECRET], b"{}", T),
            Err(VerifyError::Mismatch)
        );
        // The timestamp is signed too.
        let moved = format!("t={},v1={SIG}", T + 1);
        assert_eq!(
            check(&moved, &[SECRET], BODY, T),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn several_v1_and_unknown_schemes() {
        // Stripe's roll format: one v1 per active secret, plus a v0 to ignore.
        let header = format!("t={T}, v1={OTHER_SIG}, v1={SIG}, v0=6ffbb59b2300aae63f27240, x=1");
        assert!(check(&header, &[SECRET], BODY, T).is_ok());
        // Undecodable v1 entries are skipped, not fatal.
        let header = format!("t={T},v1=nothex,v1={SIG}");
        assert!(check(&header, &[SECRET], BODY, T).is_ok());
        // The right tag under v0 does not count.
        let header = format!("t={T},v0={SIG},v1={OTHER_SIG}");
        assert_eq!(
            check(&header, &[SECRET], BODY, T),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn rotation_second_secret_matches() {
        let header = format!("t={T},v1={SIG}");
        let verified = check(&header, &["whsec_previous_secret", SECRET], BODY, T).expect("ok");
        assert_eq!(verified.secret_index, 1);
        let header = format!("t={T},v1={OTHER_SIG}");
        let verified = check(&header, &[SECRET, "whsec_previous_secret"], BODY, T).expect("ok");
        assert_eq!(verified.secret_index, 1);
    }

    #[test]
    fn stale_but_not_future() {
        let header = format!("t={T},v1={SIG}");
        assert!(check(&header, &[SECRET], BODY, T + 300).is_ok());
        let err = check(&header, &[SECRET], BODY, T + 301).expect_err("stale");
        assert_eq!(
            err,
            VerifyError::Stale {
                age_secs: 301,
                tolerance_secs: 300
            }
        );
        assert!(err.is_stale());
        // Stripe's libraries only reject old timestamps.
        assert!(check(&header, &[SECRET], BODY, T - 3600).is_ok());
        // A forged stale request reports the forgery, not the age.
        let forged = format!("t={T},v1={OTHER_SIG}");
        assert_eq!(
            check(&forged, &[SECRET], BODY, T + 9999),
            Err(VerifyError::Mismatch)
        );
        // Custom tolerance.
        let v = Verifier::new(
            Scheme::Stripe {
                tolerance: Duration::from_secs(10),
            },
            &secrets(&[SECRET]),
        )
        .expect("verifier");
        let map = headers(&[("stripe-signature", &header)]);
        assert!(v.verify(&map, BODY, T + 11).expect_err("stale").is_stale());
    }

    #[test]
    fn missing_and_malformed() {
        let v = verifier(&[SECRET]);
        let err = v.verify(&HeaderMap::new(), BODY, T).expect_err("missing");
        assert_eq!(err, VerifyError::MissingHeader("stripe-signature".into()));
        assert_eq!(err.to_string(), "missing `stripe-signature` header");
        for (header, reason) in [
            (format!("v1={SIG}"), "no `t=` timestamp"),
            (
                format!("t=yesterday,v1={SIG}"),
                "`t=` is not a Unix timestamp",
            ),
            (format!("t=-5,v1={SIG}"), "`t=` is not a Unix timestamp"),
            (format!("t={T}"), "no valid `v1=` signature"),
            (format!("t={T},v1=xyz"), "no valid `v1=` signature"),
            (
                format!("t={T},v1={}", &SIG[..40]),
                "no valid `v1=` signature",
            ),
            (String::new(), "no `t=` timestamp"),
        ] {
            assert_eq!(
                check(&header, &[SECRET], BODY, T),
                Err(VerifyError::malformed("stripe-signature", reason)),
                "{header}"
            );
        }
        let mut map = HeaderMap::new();
        map.insert(
            "stripe-signature",
            HeaderValue::from_bytes(b"t=1,v1=\xff").expect("obs-text value"),
        );
        assert_eq!(
            v.verify(&map, BODY, T),
            Err(VerifyError::malformed(
                "stripe-signature",
                "not visible ASCII"
            ))
        );
    }

    #[test]
    fn sign_round_trip_at_other_times() {
        for now in [0, 1, T, 4_102_444_800] {
            let map = into_map(sign_with(SECRET, now));
            let verified = verifier(&[SECRET]).verify(&map, BODY, now).expect("valid");
            assert_eq!(verified.timestamp, Some(now));
        }
    }
}
