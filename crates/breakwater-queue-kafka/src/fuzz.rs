//! Generated inputs against how a Kafka record is read (proptest, stable
//! toolchain), as `breakwater-verify/tests/fuzz.rs` does for the
//! signatures. Each property runs `PROPTEST_CASES` cases (proptest's own
//! variable; 256 by default); a long run is `PROPTEST_CASES=100000 cargo
//! test --release -p breakwater-queue-kafka --lib fuzz`. No broker needed.
//!
//! - a record (the value, the sealed `breakwater-meta`, the due time and
//!   release count) reads back as the same message, due at the same time,
//!   released as often, whatever its source, event id, key, headers and
//!   body hold;
//! - a record with one byte of its metadata or value changed, cut short or
//!   grown reads as that same message or not at all, never as another; a
//!   due time or release count changed reads as the number it now says or
//!   not at all (never a default), and a header Breakwater reads, given
//!   twice, is refused;
//! - arbitrary headers and values never panic and never read as a message.

use breakwater_queue::fuzz::{change, changed, meta};
use proptest::prelude::*;

use crate::wire::{self, META_HEADER, NOT_BEFORE_HEADER, RELEASES_HEADER, Read};

/// Which part of a record a change hits.
#[derive(Debug, Clone, Copy)]
enum Part {
    Meta,
    Value,
    NotBefore,
    Releases,
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        Just(Part::Meta),
        Just(Part::Value),
        Just(Part::NotBefore),
        Just(Part::Releases),
    ]
}

fn read(headers: &[(&'static str, Vec<u8>)], value: &[u8]) -> Result<Read, wire::Foreign> {
    wire::read(headers.iter().map(|(k, v)| (*k, Some(v.as_slice()))), value)
}

/// The header names a record may carry: Breakwater's, and another.
fn name() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(META_HEADER),
        Just(NOT_BEFORE_HEADER),
        Just(RELEASES_HEADER),
        Just(breakwater_queue::ATTEMPTS_HEADER),
        Just("content-type"),
    ]
}

proptest! {
    #[test]
    fn a_record_reads_back_as_the_same_message_due_at_the_same_time(
        meta in meta(),
        value in proptest::collection::vec(any::<u8>(), 0..256),
        not_before_ms in 0i64..=i64::MAX,
        releases in any::<u32>(),
    ) {
        let headers = wire::headers(&meta, &value, not_before_ms, releases);
        let back = read(&headers, &value).expect("its own record");
        prop_assert_eq!(back, Read { meta, not_before_ms, releases });
    }

    #[test]
    fn a_changed_record_reads_as_the_same_record_or_not_at_all(
        meta in meta(),
        value in proptest::collection::vec(any::<u8>(), 0..128),
        not_before_ms in 1i64..=i64::MAX,
        releases in 1u32..,
        part in part(),
        change in change(),
    ) {
        let mut headers = wire::headers(&meta, &value, not_before_ms, releases);
        let mut value_changed = value.clone();
        let name = match part {
            Part::Meta => Some(META_HEADER),
            Part::NotBefore => Some(NOT_BEFORE_HEADER),
            Part::Releases => Some(RELEASES_HEADER),
            Part::Value => None,
        };
        match name {
            Some(name) => {
                for (k, v) in &mut headers {
                    if *k == name {
                        *v = changed(v, &change);
                    }
                }
            }
            None => value_changed = changed(&value_changed, &change),
        }
        if let Ok(back) = read(&headers, &value_changed) {
            prop_assert_eq!(&back.meta, &meta, "{:?} of {:?} read as another message", change, part);
            prop_assert_eq!(&value_changed, &value, "{:?} of the value read", change);
            // A count or time reads as exactly what the header now says.
            let said = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| *k == name)
                    .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_owned))
            };
            prop_assert_eq!(said(NOT_BEFORE_HEADER), Some(back.not_before_ms.to_string()));
            prop_assert_eq!(said(RELEASES_HEADER), Some(back.releases.to_string()));
        }
    }

    #[test]
    fn a_header_breakwater_reads_given_twice_is_refused(
        meta in meta(),
        value in proptest::collection::vec(any::<u8>(), 0..64),
        twice in prop_oneof![Just(META_HEADER), Just(NOT_BEFORE_HEADER), Just(RELEASES_HEADER)],
    ) {
        let mut headers = wire::headers(&meta, &value, 5, 1);
        let again = headers.iter().find(|(k, _)| *k == twice).cloned();
        headers.extend(again);
        prop_assert!(read(&headers, &value).is_err());
    }

    #[test]
    fn arbitrary_headers_never_read_as_a_message(
        headers in proptest::collection::vec(
            (name(), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..96))),
            0..6,
        ),
        value in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let read = wire::read(headers.iter().map(|(k, v)| (*k, v.as_deref())), &value);
        prop_assert!(read.is_err(), "{:?}", read);
    }
}
