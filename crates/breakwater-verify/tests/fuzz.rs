//! Generated inputs against every signature scheme (proptest, stable
//! toolchain). Each property runs `PROPTEST_CASES` cases (proptest's own
//! variable; 256 by default, so CI stays short); a long run is
//! `PROPTEST_CASES=1000000 cargo test --release -p breakwater-verify --test fuzz`.
//!
//! - a body signed with any one of the rotated secrets verifies, naming
//!   that secret;
//! - the same signature over any other body never does;
//! - headers made of arbitrary text or bytes never verify, and never panic.

use base64::Engine as _;
use breakwater_verify::{Algorithm, Encoding, HmacScheme, Scheme, Verifier, sign};
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

const NOW: i64 = 1_700_000_000;

/// The `n`th secret, in a form `scheme` accepts (Standard Webhooks wants
/// `whsec_` and base64).
fn secret(scheme: &Scheme, n: u8) -> String {
    let raw = format!("fuzz-secret-{n}-0123456789");
    match scheme {
        Scheme::Standard { .. } => format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        ),
        _ => raw,
    }
}

fn schemes() -> Vec<Scheme> {
    vec![
        Scheme::stripe(),
        Scheme::standard(),
        Scheme::Shopify,
        Scheme::GitHub,
        Scheme::Hmac(HmacScheme {
            header: "x-signature".into(),
            algorithm: Algorithm::Sha256,
            encoding: Encoding::Hex,
            prefix: Some("sha256=".into()),
        }),
        Scheme::Hmac(HmacScheme {
            header: "x-signature".into(),
            algorithm: Algorithm::Sha1,
            encoding: Encoding::Base64,
            prefix: None,
        }),
    ]
}

/// The header names a scheme reads.
fn names(scheme: &Scheme) -> Vec<&'static str> {
    match scheme {
        Scheme::Stripe { .. } => vec!["stripe-signature"],
        Scheme::Standard { .. } => vec!["webhook-id", "webhook-timestamp", "webhook-signature"],
        Scheme::Shopify => vec!["x-shopify-hmac-sha256"],
        Scheme::GitHub => vec!["x-hub-signature-256"],
        Scheme::Hmac(_) => vec!["x-signature"],
    }
}

proptest! {
    #[test]
    fn a_body_signed_with_any_rotated_secret_verifies_and_no_other_body_does(
        body in proptest::collection::vec(any::<u8>(), 0..512),
        other in proptest::collection::vec(any::<u8>(), 0..512),
        rotated in 1u8..4,
        signer in 0u8..4,
        scheme_index in 0usize..6,
    ) {
        let scheme = schemes().swap_remove(scheme_index);
        let secrets: Vec<String> = (0..rotated).map(|n| secret(&scheme, n)).collect();
        let signer = usize::from(signer % rotated);
        let verifier = Verifier::new(scheme.clone(), &secrets).expect("secrets");
        let signed: HeaderMap = sign(&scheme, &secrets[signer], &body, NOW, "msg_1")
            .expect("sign")
            .into_iter()
            .collect();
        let verified = verifier.verify(&signed, &body, NOW);
        prop_assert!(verified.is_ok(), "{:?}: {:?}", scheme, verified);
        prop_assert_eq!(verified.expect("ok").secret_index, signer);
        if other != body {
            prop_assert!(
                verifier.verify(&signed, &other, NOW).is_err(),
                "{:?} verified another body", scheme
            );
        }
    }

    #[test]
    fn arbitrary_headers_never_verify_and_never_panic(
        values in proptest::collection::vec(any::<String>(), 3),
        raw in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 3),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        scheme_index in 0usize..6,
    ) {
        let scheme = schemes().swap_remove(scheme_index);
        let verifier = Verifier::new(scheme.clone(), &[secret(&scheme, 0)]).expect("secret");
        let mut text = HeaderMap::new();
        let mut bytes = HeaderMap::new();
        for (i, name) in names(&scheme).into_iter().enumerate() {
            let name = HeaderName::from_static(name);
            if let Ok(v) = HeaderValue::from_str(&values[i]) {
                text.insert(name.clone(), v);
            }
            if let Ok(v) = HeaderValue::from_bytes(&raw[i]) {
                bytes.insert(name, v);
            }
        }
        prop_assert!(verifier.verify(&text, &body, NOW).is_err());
        prop_assert!(verifier.verify(&bytes, &body, NOW).is_err());
    }
}
