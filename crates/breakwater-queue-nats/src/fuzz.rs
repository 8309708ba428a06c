//! Generated inputs against how a JetStream message is read (proptest,
//! stable toolchain), as `breakwater-verify/tests/fuzz.rs` does for the
//! signatures. Each property runs `PROPTEST_CASES` cases (proptest's own
//! variable; 256 by default); a long run is `PROPTEST_CASES=100000 cargo
//! test --release -p breakwater-queue-nats --lib fuzz`. No broker needed.
//!
//! - a message's payload (the sealed envelope) reads back as the same
//!   message, whatever its source, event id, key, headers and body hold;
//! - a payload with one byte changed, cut short or grown reads as that same
//!   message or not at all, never as another;
//! - arbitrary bytes never panic and never read as a message;
//! - the attempt count reads back as written, and anything else is not a
//!   count;
//! - distinct (source, event id) pairs never share a `Nats-Msg-Id`.

use breakwater_queue::envelope::{Meta, decode, encode};
use bytes::Bytes;
use proptest::prelude::*;

use crate::{attempt_count, msg_id};

/// Any text, control characters and all.
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..24).prop_map(String::from_iter)
}

fn meta() -> impl Strategy<Value = Meta> {
    (
        text(),
        text(),
        proptest::option::of(text()),
        proptest::collection::vec((text(), text()), 0..4),
        any::<i64>(),
        any::<u32>(),
        any::<u32>(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(any::<i64>()),
    )
        .prop_map(
            |(
                source,
                event_id,
                entity_key,
                headers,
                received_at_ms,
                replays,
                attempts,
                class,
                error,
                dead_at_ms,
            )| Meta {
                source,
                event_id,
                entity_key,
                headers,
                received_at_ms,
                replays,
                attempts,
                class,
                error,
                dead_at_ms,
            },
        )
}

/// One change to a payload: a byte replaced (xor with a non-zero mask),
/// the payload cut at a point, or a byte put in at a point.
#[derive(Debug, Clone)]
enum Change {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, u8),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Change::Flip(at, mask)),
        any::<usize>().prop_map(Change::Cut),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Change::Insert(at, b)),
    ]
}

fn apply(payload: &[u8], change: &Change) -> Vec<u8> {
    let mut out = payload.to_vec();
    match *change {
        Change::Flip(at, mask) if !out.is_empty() => {
            let at = at % out.len();
            out[at] ^= mask;
        }
        Change::Flip(..) => {}
        Change::Cut(at) => out.truncate(at % (out.len() + 1)),
        Change::Insert(at, b) => out.insert(at % (out.len() + 1), b),
    }
    out
}

proptest! {
    #[test]
    fn a_payload_reads_back_as_the_same_message(
        meta in meta(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let payload = encode(&meta, &body);
        let (back, back_body) = decode(&payload).expect("its own payload");
        prop_assert_eq!(back, meta);
        prop_assert_eq!(&back_body[..], &body[..]);
    }

    #[test]
    fn a_changed_payload_reads_as_the_same_message_or_not_at_all(
        meta in meta(),
        body in proptest::collection::vec(any::<u8>(), 0..128),
        change in change(),
    ) {
        let payload = encode(&meta, &body);
        let changed = apply(&payload, &change);
        if let Ok((back, back_body)) = decode(&Bytes::from(changed)) {
            prop_assert_eq!(
                (&back, &back_body[..]),
                (&meta, &body[..]),
                "{:?} read as another message", change
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_read_as_a_message(
        json in proptest::collection::vec(any::<u8>(), 0..256),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        prefixed in any::<bool>(),
    ) {
        // Prefixed with their own length, the bytes reach the JSON reader.
        let mut payload = Vec::new();
        if prefixed {
            payload.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
        }
        payload.extend_from_slice(&json);
        payload.extend_from_slice(&body);
        prop_assert!(decode(&Bytes::from(payload)).is_err());
    }

    #[test]
    fn an_attempt_count_reads_back_as_written_and_nothing_else_is_one(
        n in any::<u32>(),
        other in proptest::collection::vec(any::<u8>(), 0..12),
    ) {
        prop_assert_eq!(attempt_count(n.to_string().as_bytes()), Some(n));
        if let Some(m) = attempt_count(&other) {
            let written = m.to_string();
            prop_assert_eq!(written.as_bytes(), &other[..]);
        }
    }

    #[test]
    fn distinct_events_never_share_a_message_id(
        a in "[a-z0-9_-]{1,12}",
        b in "[a-z0-9_-]{1,12}",
        x in text(),
        y in text(),
    ) {
        prop_assume!((&a, &x) != (&b, &y));
        prop_assert_ne!(msg_id(&a, &x), msg_id(&b, &y));
    }
}

#[test]
fn a_count_is_decimal_digits_only() {
    for bad in [
        &b""[..],
        b"-1",
        b"+1",
        b" 1",
        b"01",
        b"1.0",
        b"4294967296",
        b"\xff",
    ] {
        assert_eq!(attempt_count(bad), None, "{bad:?}");
    }
    assert_eq!(attempt_count(b"0"), Some(0));
}
