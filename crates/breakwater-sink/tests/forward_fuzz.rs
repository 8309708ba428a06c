//! The forward sink's header building on generated events (proptest,
//! `PROPTEST_CASES`, 256 in the suite; a long run is
//! `PROPTEST_CASES=1000000 cargo test --release -p breakwater-sink --test forward_fuzz`):
//! event ids, source names and content types of any characters (arbitrary
//! text, bytes read as UTF-8, and the characters percent-encoding is made
//! of, so that encodings and what they encode meet).
//!
//! - building the headers never fails nor panics, signed or not;
//! - every value is a valid header value of visible ASCII (a receiver
//!   trims nothing from it);
//! - `idempotency-key` and `webhook-id` are one value, which
//!   percent-decodes to the event id (so distinct ids never share a key),
//!   and a signed request verifies with the target's secret;
//! - two distinct ids give two distinct keys.

use std::time::Duration;

use breakwater_sink::{Event, ForwardSpec, ForwardTarget};
use breakwater_verify::{Scheme, Verifier};
use http::HeaderMap;
use proptest::prelude::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn target(secret: Option<&str>) -> ForwardTarget {
    ForwardTarget::new(ForwardSpec {
        url: "http://127.0.0.1:9/hooks".into(),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        max_connections: 1,
        secret: secret.map(str::to_owned),
        http2: false,
        follow_redirects: 0,
        ca_file: None,
    })
    .expect("target")
}

/// Text of any kind: arbitrary characters, arbitrary bytes read as UTF-8,
/// printable ASCII, and short strings of the characters an encoding is
/// made of and the ones it encodes.
fn text() -> impl Strategy<Value = String> {
    let tricky = prop::sample::select(vec![
        'c', 'A', 'a', '0', '2', '5', 'F', '%', ' ', '\t', '\n', '\r', '\0', '\u{7f}', 'ü', '€',
        '"', ',', ';', '=',
    ]);
    prop_oneof![
        any::<String>(),
        proptest::collection::vec(any::<u8>(), 0..32)
            .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        "[ -~]{0,24}",
        proptest::collection::vec(tricky, 0..8).prop_map(|chars| chars.into_iter().collect()),
    ]
}

/// `id` with every byte outside visible ASCII written `%XX` and `%` left
/// as it is: another id, which an encoding that leaves `%` alone would
/// give the same key (`c%0A` and `c` with a newline).
fn spelled_encoded(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_graphic() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Two ids: the same twice, one and its spelled encoding, or any two.
fn id_pairs() -> impl Strategy<Value = (String, String)> {
    text().prop_flat_map(|a| {
        let encoded = spelled_encoded(&a);
        (Just(a.clone()), prop_oneof![Just(a), Just(encoded), text()])
    })
}

/// `value` percent-decoded, as bytes; `None` if a `%` is not followed by
/// two hex digits.
fn percent_decoded(value: &str) -> Option<Vec<u8>> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

fn headers_for(
    target: &ForwardTarget,
    event_id: &str,
    source: &str,
    content_type: &str,
    body: &[u8],
    attempt: u32,
) -> HeaderMap {
    let sent = [("Content-Type".to_owned(), content_type.to_owned())];
    let event = Event {
        source,
        event_id,
        entity_key: None,
        headers: &sent,
        body,
        received_at_ms: 1_700_000_000_000,
        attempt,
    };
    target
        .headers(&event, attempt)
        .unwrap_or_else(|e| panic!("no headers for {event_id:?} from {source:?}: {e}"))
}

fn key(headers: &HeaderMap) -> &str {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .expect("an idempotency-key of visible ASCII")
}

proptest! {
    #[test]
    fn every_event_makes_valid_headers_whose_key_decodes_to_its_id(
        event_id in text(),
        source in text(),
        content_type in text(),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        attempt in any::<u32>(),
        signed in any::<bool>(),
    ) {
        let target = target(signed.then_some(SECRET));
        let headers = headers_for(&target, &event_id, &source, &content_type, &body, attempt);
        for (name, value) in &headers {
            let bytes = value.as_bytes();
            prop_assert!(
                bytes.iter().all(|&b| b == b' ' || b.is_ascii_graphic()),
                "{name}: {value:?}"
            );
            prop_assert!(
                bytes.first() != Some(&b' ') && bytes.last() != Some(&b' '),
                "{name} starts or ends with a space: {value:?}"
            );
        }
        let key = key(&headers);
        prop_assert_eq!(headers.get("webhook-id").and_then(|v| v.to_str().ok()), Some(key));
        prop_assert_eq!(percent_decoded(key), Some(event_id.as_bytes().to_vec()), "{}", key);
        if event_id.bytes().all(|b| b.is_ascii_graphic() && b != b'%') {
            prop_assert_eq!(key, event_id.as_str(), "a plain id arrives as it is");
        }
        let shown_source = headers
            .get("breakwater-source")
            .and_then(|v| v.to_str().ok())
            .expect("breakwater-source");
        prop_assert_eq!(percent_decoded(shown_source), Some(source.as_bytes().to_vec()));
        let attempt_shown = attempt.to_string();
        prop_assert_eq!(
            headers.get("breakwater-attempt").and_then(|v| v.to_str().ok()),
            Some(attempt_shown.as_str())
        );
        if signed {
            let verifier = Verifier::new(Scheme::standard(), &[SECRET.to_owned()])
                .expect("secret");
            let now = unix_now();
            prop_assert!(verifier.verify(&headers, &body, now).is_ok(), "{headers:?}");
        }
    }

    #[test]
    fn distinct_ids_give_distinct_keys((a, b) in id_pairs()) {
        let target = target(None);
        let key_a = key(&headers_for(&target, &a, "s", "application/json", b"{}", 1)).to_owned();
        let key_b = key(&headers_for(&target, &b, "s", "application/json", b"{}", 1)).to_owned();
        prop_assert_eq!(a == b, key_a == key_b, "{:?} and {:?}: {} and {}", a, b, key_a, key_b);
    }
}

/// Seconds since the Unix epoch (the signature's timestamp is checked
/// against it).
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
