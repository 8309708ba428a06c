//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`.
//!
//! Shopify signs the raw request body with HMAC-SHA256, keyed with the app's client
//! secret as raw bytes, and sends the tag in standard base64. There is no signed
//! timestamp; the delivery id travels in `X-Shopify-Webhook-Id`.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::mac::{KeySet, Tag};
use crate::{KeyError, Verified, VerifyError};

const HMAC_NAME: &str = "x-shopify-hmac-sha256";
const HMAC: HeaderName = HeaderName::from_static(HMAC_NAME);
pub(crate) const WEBHOOK_ID_NAME: &str = "x-shopify-webhook-id";
const WEBHOOK_ID: HeaderName = HeaderName::from_static(WEBHOOK_ID_NAME);

pub(crate) fn verify(
    keys: &KeySet,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Verified, VerifyError> {
    let header = crate::header_text(headers.get(&HMAC), || Cow::Borrowed(HMAC_NAME))?;
    let candidate = Tag::from_base64(header, keys.tag_len()).ok_or(VerifyError::malformed(
        HMAC_NAME,
        "not a base64 HMAC-SHA256",
    ))?;
    let secret_index = keys
        .find(&[body], || std::iter::once(candidate))
        .ok_or(VerifyError::Mismatch)?;
    Ok(Verified {
        timestamp: None,
        secret_index,
    })
}

pub(crate) fn sign(
    keys: &KeySet,
    body: &[u8],
    msg_id: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, KeyError> {
    let tag = keys.sign(&[body]).to_base64();
    let mut out = vec![(
        HMAC,
        crate::header_value(tag, KeyError::Unusable { index: 0 })?,
    )];
    if !msg_id.is_empty() {
        let id = crate::header_value(msg_id.to_owned(), KeyError::InvalidMessageId)?;
        out.push((WEBHOOK_ID, id));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{headers, into_map, secrets};
    use crate::{Scheme, Verifier};

    // Vector computed independently, twice, with:
    //   python3: base64.b64encode(hmac.new(SECRET, BODY, hashlib.sha256).digest())
    //   printf %s "$BODY" | openssl dgst -sha256 -binary -hmac "$SECRET" | base64
    // (same result).
    const SECRET: &str = "shpss_breakwater_shopify_test_secret";
    const BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    const SIG: &str = "XYH2bHlpnx2FttXIt3NidlHCwmlG4K1jX3D+Sayj41k=";

    fn check(sig: &str, list: &[&str], body: &[u8]) -> Result<Verified, VerifyError> {
        Verifier::new(Scheme::Shopify, &secrets(list))
            .expect("verifier")
            .verify(&headers(&[("X-Shopify-Hmac-Sha256", sig)]), body, 0)
    }

    #[test]
    fn known_vector() {
        assert_eq!(
            check(SIG, &[SECRET], BODY),
            Ok(Verified {
                timestamp: None,
                secret_index: 0
            })
        );
        // Padding is optional on input.
        assert!(check(SIG.trim_end_matches('='), &[SECRET], BODY).is_ok());
        let signed =
            into_map(crate::sign(&Scheme::Shopify, SECRET, BODY, 0, "b54557e4").expect("sign"));
        assert_eq!(signed.get("x-shopify-hmac-sha256").expect("hmac"), SIG);
        assert_eq!(signed.get("x-shopify-webhook-id").expect("id"), "b54557e4");
        let without_id = crate::sign(&Scheme::Shopify, SECRET, BODY, 0, "").expect("sign");
        assert_eq!(without_id.len(), 1);
    }

    #[test]
    fn wrong_secret_tampered_body_rotation() {
        assert_eq!(check(SIG, &["other"], BODY), Err(VerifyError::Mismatch));
        assert_eq!(check(SIG, &[SECRET], b"{}"), Err(VerifyError::Mismatch));
        let verified = check(SIG, &["old", SECRET], BODY).expect("rotation");
        assert_eq!(verified.secret_index, 1);
    }

    #[test]
    fn missing_and_malformed() {
        let v = Verifier::new(Scheme::Shopify, &secrets(&[SECRET])).expect("verifier");
        assert_eq!(
            v.verify(&HeaderMap::new(), BODY, 0),
            Err(VerifyError::MissingHeader("x-shopify-hmac-sha256".into()))
        );
        let hex = "5d81f66c79699f1d85b6d5c8b773627651c2c26946e0ad635f70fe49aca3e359";
        for bad in ["", "!!!", hex, "XYH2bHlpnx2FttXIt3NidlHCwmlG4K1j"] {
            assert_eq!(
                check(bad, &[SECRET], BODY),
                Err(VerifyError::malformed(
                    HMAC_NAME,
                    "not a base64 HMAC-SHA256"
                )),
                "{bad}"
            );
        }
    }
}
