//! Standard Webhooks (the Svix format): `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64> [v1,<base64> ...]`.
//!
//! The signed content is `"{id}.{timestamp}.{body}"`, HMAC-SHA256 keyed with the
//! base64-decoded secret (`whsec_<base64>`; the prefix is optional). The signature
//! header is a space-separated list of `version,signature` pairs; only `v1` entries are
//! considered (`v1a` asymmetric signatures are ignored). The timestamp must be within
//! the tolerance of now in both directions. Svix-branded senders use the `svix-id`,
//! `svix-timestamp` and `svix-signature` names; each is used when the `webhook-*` one
//! is absent.

use std::borrow::Cow;
use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::mac::{BASE64, KeySet, Tag};
use crate::{KeyError, Verified, VerifyError};

pub(crate) const ID_NAME: &str = "webhook-id";
const TIMESTAMP_NAME: &str = "webhook-timestamp";
const SIGNATURE_NAME: &str = "webhook-signature";
const ID: HeaderName = HeaderName::from_static(ID_NAME);
const TIMESTAMP: HeaderName = HeaderName::from_static(TIMESTAMP_NAME);
const SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
const SVIX_ID: HeaderName = HeaderName::from_static("svix-id");
const SVIX_TIMESTAMP: HeaderName = HeaderName::from_static("svix-timestamp");
const SVIX_SIGNATURE: HeaderName = HeaderName::from_static("svix-signature");

const SECRET_PREFIX: &str = "whsec_";

/// The key bytes of a `whsec_<base64>` (or bare base64) secret.
pub(crate) fn decode_secret(secret: &str, index: usize) -> Result<Vec<u8>, KeyError> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    BASE64
        .decode(encoded)
        .map_err(|_| KeyError::InvalidBase64 { index })
}

/// Looks a header up under its `webhook-*` name, then its `svix-*` name.
fn lookup<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    svix: &HeaderName,
    label: &'static str,
) -> Result<&'h str, VerifyError> {
    crate::header_text(headers.get(name).or_else(|| headers.get(svix)), || {
        Cow::Borrowed(label)
    })
}

/// The decodable `v1` signatures of the list.
fn candidates(list: &str, tag_len: usize) -> impl Iterator<Item = Tag> + '_ {
    list.split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(move |(_, signature)| Tag::from_base64(signature, tag_len))
}

pub(crate) fn verify(
    keys: &KeySet,
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<Verified, VerifyError> {
    let id = lookup(headers, &ID, &SVIX_ID, ID_NAME)?;
    let timestamp_text = lookup(headers, &TIMESTAMP, &SVIX_TIMESTAMP, TIMESTAMP_NAME)?;
    let list = lookup(headers, &SIGNATURE, &SVIX_SIGNATURE, SIGNATURE_NAME)?;
    let timestamp = crate::parse_timestamp(timestamp_text).ok_or(VerifyError::malformed(
        TIMESTAMP_NAME,
        "not a Unix timestamp",
    ))?;
    let tag_len = keys.tag_len();
    if candidates(list, tag_len).next().is_none() {
        return Err(VerifyError::malformed(
            SIGNATURE_NAME,
            "no valid `v1,` signature",
        ));
    }
    let message: [&[u8]; 5] = [id.as_bytes(), b".", timestamp_text.as_bytes(), b".", body];
    let secret_index = keys
        .find(&message, || candidates(list, tag_len))
        .ok_or(VerifyError::Mismatch)?;
    crate::check_window(timestamp, now, tolerance, true)?;
    Ok(Verified {
        timestamp: Some(timestamp),
        secret_index,
    })
}

pub(crate) fn sign(
    keys: &KeySet,
    body: &[u8],
    now: i64,
    msg_id: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, KeyError> {
    let id = HeaderValue::from_str(msg_id).map_err(|_| KeyError::InvalidMessageId)?;
    let t = now.to_string();
    let tag = keys.sign(&[msg_id.as_bytes(), b".", t.as_bytes(), b".", body]);
    let internal = || KeyError::Unusable { index: 0 };
    Ok(vec![
        (ID, id),
        (TIMESTAMP, crate::header_value(t, internal())?),
        (
            SIGNATURE,
            crate::header_value(format!("v1,{}", tag.to_base64()), internal())?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{headers, into_map, secrets};
    use crate::{Scheme, Verifier};

    // Reference vector of the Standard Webhooks libraries (standard-webhooks repo,
    // libraries/javascript/src/webhook.test.ts, test "sign function works"; the same
    // values appear in the Svix libraries' tests). Re-checked with python3 hmac.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID_VALUE: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const T: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    // Second reference vector, from the standard-webhooks Rust library's `test_sign`
    // (libraries/rust/src/lib.rs).
    const SECRET2: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID2: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const T2: i64 = 1_649_367_553;
    const BODY2: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIG2: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    // Well-formed v1 signatures that match nothing (from the same test suites).
    const NOISE1: &str = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=";
    const NOISE2: &str = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ=";

    fn verifier(list: &[&str]) -> Verifier {
        Verifier::new(Scheme::standard(), &secrets(list)).expect("verifier")
    }

    fn map(id: &str, t: &str, sig: &str) -> HeaderMap {
        headers(&[
            ("webhook-id", id),
            ("webhook-timestamp", t),
            ("webhook-signature", sig),
        ])
    }

    fn check(sig: &str, list: &[&str], body: &[u8], now: i64) -> Result<Verified, VerifyError> {
        verifier(list).verify(&map(ID_VALUE, &T.to_string(), sig), body, now)
    }

    #[test]
    fn reference_vectors() {
        assert_eq!(
            check(SIG, &[SECRET], BODY, T),
            Ok(Verified {
                timestamp: Some(T),
                secret_index: 0
            })
        );
        // The bare base64 form of the secret works too.
        assert!(check(SIG, &["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], BODY, T).is_ok());
        let signed =
            into_map(crate::sign(&Scheme::standard(), SECRET, BODY, T, ID_VALUE).expect("sign"));
        assert_eq!(signed.get("webhook-id").expect("id"), ID_VALUE);
        assert_eq!(signed.get("webhook-timestamp").expect("ts"), "1614265330");
        assert_eq!(signed.get("webhook-signature").expect("sig"), SIG);

        let v2 = verifier(&[SECRET2]);
        assert!(
            v2.verify(&map(ID2, &T2.to_string(), SIG2), BODY2, T2)
                .is_ok()
        );
        let signed2 =
            into_map(crate::sign(&Scheme::standard(), SECRET2, BODY2, T2, ID2).expect("sign"));
        assert_eq!(signed2.get("webhook-signature").expect("sig"), SIG2);
    }

    #[test]
    fn wrong_secret_tampered_body_and_id() {
        assert_eq!(check(SIG, &[SECRET2], BODY, T), Err(VerifyError::Mismatch));
        assert_eq!(
            check(SIG, &[SECRET], br#"{"test": 2432232315}"#, T),
            Err(VerifyError::Mismatch)
        );
        let other_id = map("msg_other", &T.to_string(), SIG);
        assert_eq!(
            verifier(&[SECRET]).verify(&other_id, BODY, T),
            Err(VerifyError::Mismatch)
        );
        let other_t = map(ID_VALUE, &(T + 1).to_string(), SIG);
        assert_eq!(
            verifier(&[SECRET]).verify(&other_t, BODY, T),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn signature_lists() {
        let list = format!("{NOISE1} v2,{} {SIG} {NOISE2}", &SIG[3..]);
        assert!(check(&list, &[SECRET], BODY, T).is_ok());
        // Non-v1 versions never count, even carrying the right tag.
        let list = format!("v1a,{} v2,{} {NOISE1}", &SIG[3..], &SIG[3..]);
        assert_eq!(check(&list, &[SECRET], BODY, T), Err(VerifyError::Mismatch));
        // Extra spaces and junk entries are tolerated.
        let list = format!("  junk v1,!!! {SIG}  ");
        assert!(check(&list, &[SECRET], BODY, T).is_ok());
        let list = format!("{NOISE1} {NOISE2}");
        assert_eq!(check(&list, &[SECRET], BODY, T), Err(VerifyError::Mismatch));
    }

    #[test]
    fn rotation_second_secret_matches() {
        let verified = check(SIG, &[SECRET2, SECRET], BODY, T).expect("rotation");
        assert_eq!(verified.secret_index, 1);
        // Sender rolling too: two signatures, receiver knows only the new secret.
        let list = format!("{SIG2} {SIG}");
        assert_eq!(
            check(&list, &[SECRET], BODY, T).map(|v| v.secret_index),
            Ok(0)
        );
    }

    #[test]
    fn stale_and_future_timestamps() {
        assert!(check(SIG, &[SECRET], BODY, T + 300).is_ok());
        assert!(check(SIG, &[SECRET], BODY, T - 300).is_ok());
        assert_eq!(
            check(SIG, &[SECRET], BODY, T + 301),
            Err(VerifyError::Stale {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        let future = check(SIG, &[SECRET], BODY, T - 301).expect_err("future");
        assert_eq!(
            future,
            VerifyError::Stale {
                age_secs: -301,
                tolerance_secs: 300
            }
        );
        assert!(future.is_stale());
        // Forged and old: reported as a mismatch.
        assert_eq!(
            check(NOISE1, &[SECRET], BODY, T + 9999),
            Err(VerifyError::Mismatch)
        );
        let wide = Verifier::new(
            Scheme::Standard {
                tolerance: Duration::from_secs(3600),
            },
            &secrets(&[SECRET]),
        )
        .expect("verifier");
        assert!(
            wide.verify(&map(ID_VALUE, &T.to_string(), SIG), BODY, T + 3600)
                .is_ok()
        );
    }

    #[test]
    fn svix_header_names() {
        let svix = headers(&[
            ("svix-id", ID_VALUE),
            ("svix-timestamp", "1614265330"),
            ("svix-signature", SIG),
        ]);
        assert!(verifier(&[SECRET]).verify(&svix, BODY, T).is_ok());
        // webhook-* wins when both are present.
        let mut both = svix.clone();
        both.insert("webhook-signature", HeaderValue::from_static(NOISE1));
        assert_eq!(
            verifier(&[SECRET]).verify(&both, BODY, T),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn missing_and_malformed() {
        let v = verifier(&[SECRET]);
        let full = map(ID_VALUE, "1614265330", SIG);
        for (name, label) in [
            ("webhook-id", "webhook-id"),
            ("webhook-timestamp", "webhook-timestamp"),
            ("webhook-signature", "webhook-signature"),
        ] {
            let mut partial = full.clone();
            partial.remove(name);
            assert_eq!(
                v.verify(&partial, BODY, T),
                Err(VerifyError::MissingHeader(label.into()))
            );
        }
        for t in ["hello", "", "-1614265330", "1614265330.5"] {
            assert_eq!(
                v.verify(&map(ID_VALUE, t, SIG), BODY, T),
                Err(VerifyError::malformed(
                    "webhook-timestamp",
                    "not a Unix timestamp"
                )),
                "{t}"
            );
        }
        // From the reference suite: "invalid signature", "partial signature".
        for sig in ["v1,dawfeoifkpqwoekfpqoekf", &SIG[..8], "v1,", "", "v2,abc"] {
            assert_eq!(
                v.verify(&map(ID_VALUE, "1614265330", sig), BODY, T),
                Err(VerifyError::malformed(
                    "webhook-signature",
                    "no valid `v1,` signature"
                )),
                "{sig}"
            );
        }
    }

    #[test]
    fn secret_decoding() {
        assert_eq!(
            decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 0).map(|k| k.len()),
            Ok(24)
        );
        assert_eq!(
            decode_secret("whsec_%%%", 3),
            Err(KeyError::InvalidBase64 { index: 3 })
        );
        assert_eq!(
            Verifier::new(Scheme::standard(), &secrets(&[SECRET, "not base64!"])).err(),
            Some(KeyError::InvalidBase64 { index: 1 })
        );
        assert_eq!(
            crate::sign(&Scheme::standard(), "whsec_!!", BODY, T, ID_VALUE).err(),
            Some(KeyError::InvalidBase64 { index: 0 })
        );
    }
}
