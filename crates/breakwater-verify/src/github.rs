//! GitHub: `X-Hub-Signature-256: sha256=<hex>`.
//!
//! GitHub signs the raw payload with HMAC-SHA256, keyed with the webhook secret as raw
//! bytes, and writes `sha256=` followed by the lower-case hex tag. There is no signed
//! timestamp; the delivery id travels in `X-GitHub-Delivery`. (The legacy SHA-1
//! `X-Hub-Signature` can be checked with [`crate::Scheme::Hmac`] if ever needed.)

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::mac::KeySet;
use crate::{Encoding, KeyError, Verified, VerifyError, hmac_generic};

const SIGNATURE_NAME: &str = "x-hub-signature-256";
const SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
pub(crate) const DELIVERY_NAME: &str = "x-github-delivery";
const DELIVERY: HeaderName = HeaderName::from_static(DELIVERY_NAME);
const PREFIX: &str = "sha256=";

pub(crate) fn verify(
    keys: &KeySet,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Verified, VerifyError> {
    hmac_generic::verify_single(
        keys,
        headers.get(&SIGNATURE),
        || Cow::Borrowed(SIGNATURE_NAME),
        Encoding::Hex,
        Some(PREFIX),
        body,
    )
}

pub(crate) fn sign(
    keys: &KeySet,
    body: &[u8],
    msg_id: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, KeyError> {
    let text = hmac_generic::encode(keys, Encoding::Hex, Some(PREFIX), body);
    let mut out = vec![(
        SIGNATURE,
        crate::header_value(text, KeyError::Unusable { index: 0 })?,
    )];
    if !msg_id.is_empty() {
        let id = crate::header_value(msg_id.to_owned(), KeyError::InvalidMessageId)?;
        out.push((DELIVERY, id));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{headers, into_map, secrets};
    use crate::{Scheme, Verifier};

    // GitHub's documented test values ("Validating webhook deliveries", docs.github.com):
    // secret "It's a Secret to Everybody", payload "Hello, World!".
    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn check(sig: &str, list: &[&str], body: &[u8]) -> Result<Verified, VerifyError> {
        Verifier::new(Scheme::GitHub, &secrets(list))
            .expect("verifier")
            .verify(&headers(&[("X-Hub-Signature-256", sig)]), body, 0)
    }

    #[test]
    fn documented_vector() {
        assert_eq!(
            check(SIG, &[SECRET], BODY),
            Ok(Verified {
                timestamp: None,
                secret_index: 0
            })
        );
        let signed = into_map(
            crate::sign(
                &Scheme::GitHub,
                SECRET,
                BODY,
                0,
                "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            )
            .expect("sign"),
        );
        assert_eq!(signed.get("x-hub-signature-256").expect("sig"), SIG);
        assert_eq!(
            signed.get("x-github-delivery").expect("delivery"),
            "72d3162e-cc78-11e3-81ab-4c9367dc0958"
        );
    }

    #[test]
    fn wrong_secret_tampered_body_rotation() {
        assert_eq!(
            check(SIG, &["It's a secret to everybody"], BODY),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            check(SIG, &[SECRET], b"Hello, World?"),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            check(SIG, &["old", SECRET], BODY).map(|v| v.secret_index),
            Ok(1)
        );
        // A different but well-formed tag.
        let other = format!("sha256={}", "0".repeat(64));
        assert_eq!(check(&other, &[SECRET], BODY), Err(VerifyError::Mismatch));
    }

    #[test]
    fn missing_and_malformed() {
        let v = Verifier::new(Scheme::GitHub, &secrets(&[SECRET])).expect("verifier");
        assert_eq!(
            v.verify(&HeaderMap::new(), BODY, 0),
            Err(VerifyError::MissingHeader("x-hub-signature-256".into()))
        );
        // The legacy SHA-1 header alone is not accepted.
        let legacy = headers(&[(
            "x-hub-signature",
            "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59",
        )]);
        assert!(matches!(
            v.verify(&legacy, BODY, 0),
            Err(VerifyError::MissingHeader(_))
        ));
        for (bad, reason) in [
            (&SIG[7..], "the expected prefix is missing"),
            (
                "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59",
                "the expected prefix is missing",
            ),
            ("sha256=", "not a hex HMAC of the expected length"),
            (
                "sha256=757107ea0eb2509f",
                "not a hex HMAC of the expected length",
            ),
            (
                &format!("sha256={}", "zz".repeat(32)),
                "not a hex HMAC of the expected length",
            ),
        ] {
            assert_eq!(
                check(bad, &[SECRET], BODY),
                Err(VerifyError::malformed(SIGNATURE_NAME, reason)),
                "{bad}"
            );
        }
    }
}
