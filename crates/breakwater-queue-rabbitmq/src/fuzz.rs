//! Generated inputs against how a RabbitMQ delivery is read (proptest,
//! stable toolchain), as `breakwater-verify/tests/fuzz.rs` does for the
//! signatures. Each property runs `PROPTEST_CASES` cases (proptest's own
//! variable; 256 by default); a long run is `PROPTEST_CASES=100000 cargo
//! test --release -p breakwater-queue-rabbitmq --lib fuzz`. No broker
//! needed.
//!
//! - a delivery (the sealed envelope, the counts in its properties) reads
//!   back as the same message with the same counts, whatever its source,
//!   event id, key, headers and body hold;
//! - a payload with one byte changed, cut short or grown reads as that same
//!   message or not at all, never as another;
//! - arbitrary bytes never panic and never read as a message;
//! - a count header of any AMQP type and value never panics, reads as the
//!   number it holds, and is refused when it holds none (never taken for
//!   0).

use breakwater_queue::ATTEMPTS_HEADER;
use breakwater_queue::envelope::encode;
use breakwater_queue::fuzz::{change, changed, meta};
use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use proptest::prelude::*;

use crate::properties::{self, Counts, RELEASES_HEADER};
use crate::read_delivery;

fn counts() -> impl Strategy<Value = Counts> {
    (any::<u32>(), any::<u32>()).prop_map(|(attempts, releases)| Counts { attempts, releases })
}

/// Any AMQP value a header can hold.
fn amqp_value() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>().prop_map(AMQPValue::Float),
        any::<f64>().prop_map(AMQPValue::Double),
        proptest::collection::vec(any::<u8>(), 0..12)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        "[ 0-9+-]{0,12}".prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        "[a-z0-9]{0,8}".prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
        Just(AMQPValue::Void),
    ]
}

/// The count `value` holds, if it holds one.
fn count_in(value: &AMQPValue) -> Option<u32> {
    let n: Option<i64> = match value {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        _ => None,
    };
    n.and_then(|n| u32::try_from(n).ok())
}

fn with_header(name: &str, value: AMQPValue) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from(name), value);
    BasicProperties::default().with_headers(headers)
}

proptest! {
    #[test]
    fn a_delivery_reads_back_as_the_same_message_and_counts(
        meta in meta(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        counts in counts(),
        id in "[0-9a-f]{16}",
    ) {
        let props = properties::build(&id, counts);
        let (back_counts, back, back_body) =
            read_delivery(&props, &encode(&meta, &body)).expect("its own delivery");
        prop_assert_eq!(back_counts, counts);
        prop_assert_eq!(back, meta);
        prop_assert_eq!(&back_body[..], &body[..]);
        prop_assert_eq!(properties::id(&props, || "fallback".into()), id);
    }

    #[test]
    fn a_changed_payload_reads_as_the_same_message_or_not_at_all(
        meta in meta(),
        body in proptest::collection::vec(any::<u8>(), 0..128),
        change in change(),
    ) {
        let payload = encode(&meta, &body);
        let changed = Bytes::from(changed(&payload, &change));
        if let Ok((_, back, back_body)) = read_delivery(&BasicProperties::default(), &changed) {
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
        let mut payload = Vec::new();
        if prefixed {
            payload.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
        }
        payload.extend_from_slice(&json);
        payload.extend_from_slice(&body);
        prop_assert!(read_delivery(&BasicProperties::default(), &Bytes::from(payload)).is_err());
    }

    #[test]
    fn a_count_header_reads_as_the_count_it_holds_or_is_refused(
        value in amqp_value(),
        attempts_header in any::<bool>(),
    ) {
        let name = if attempts_header { ATTEMPTS_HEADER } else { RELEASES_HEADER };
        let read = properties::counts(&with_header(name, value.clone()));
        match count_in(&value) {
            Some(n) => {
                let c = read.expect("a count");
                prop_assert_eq!(if attempts_header { c.attempts } else { c.releases }, n);
            }
            None => prop_assert!(read.is_err(), "{:?} read as {:?}", value, read),
        }
    }
}

#[test]
fn a_count_that_is_not_one_is_refused_not_zero() {
    for bad in [
        AMQPValue::LongLongInt(-1),
        AMQPValue::LongLongInt(i64::from(u32::MAX) + 1),
        AMQPValue::LongString("many".into()),
        AMQPValue::Boolean(true),
        AMQPValue::Double(1.0),
    ] {
        assert!(
            properties::counts(&with_header(ATTEMPTS_HEADER, bad.clone())).is_err(),
            "{bad:?}"
        );
    }
}
