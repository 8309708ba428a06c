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

use breakwater_queue::envelope::{decode, encode};
use breakwater_queue::fuzz::{change, changed, meta, text};
use bytes::Bytes;
use proptest::prelude::*;

use crate::{attempt_count, msg_id};

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
        let changed = changed(&payload, &change);
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
