//! Generated inputs against how an SQS message is read (proptest, stable
//! toolchain), as `breakwater-verify/tests/fuzz.rs` does for the
//! signatures. Each property runs `PROPTEST_CASES` cases (proptest's own
//! variable; 256 by default); a long run is `PROPTEST_CASES=100000 cargo
//! test --release -p breakwater-queue-sqs --lib fuzz`. No queue needed.
//!
//! - a message (the body as text or base64, the sealed `bw-meta`, the
//!   `bw-not-before`) reads back as the same message, due at the same time,
//!   whatever its source, event id, key, headers and body hold;
//! - a message with one byte of its metadata changed, cut short or grown,
//!   one character of its body changed, or its body's encoding swapped,
//!   reads as that same message or not at all, never as another;
//! - arbitrary attributes and bodies never panic and never read as a
//!   message.

use breakwater_queue::fuzz::{meta, text};
use proptest::prelude::*;

use crate::wire::{Incoming, Outgoing};

/// A body: text SQS carries as it is, or any bytes (base64), or none.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        text().prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..128),
        Just(Vec::new()),
    ]
}

/// One change to a message as SQS hands it over.
#[derive(Debug, Clone)]
enum Change {
    /// A byte of `bw-meta` replaced (xor with a non-zero mask).
    MetaFlip(usize, u8),
    /// `bw-meta` cut at a point.
    MetaCut(usize),
    /// A byte put in `bw-meta`.
    MetaInsert(usize, u8),
    /// A character of the body replaced.
    BodyChar(usize, char),
    /// The body cut at a character.
    BodyCut(usize),
    /// `bw-body` said otherwise (none, `base64`, `empty`).
    Encoding(Option<&'static str>),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Change::MetaFlip(at, mask)),
        any::<usize>().prop_map(Change::MetaCut),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Change::MetaInsert(at, b)),
        (any::<usize>(), any::<char>()).prop_map(|(at, c)| Change::BodyChar(at, c)),
        any::<usize>().prop_map(Change::BodyCut),
        prop_oneof![Just(None), Just(Some("base64")), Just(Some("empty"))]
            .prop_map(Change::Encoding),
    ]
}

/// What SQS would hand over for `out`, changed by `change`: its body, its
/// `bw-meta`, its `bw-body`.
fn changed(out: &Outgoing, change: &Change) -> (String, Vec<u8>, Option<&'static str>) {
    let (mut body, mut meta, mut encoding) =
        (out.body.clone(), out.meta.clone(), out.body_encoding);
    let chars: Vec<char> = body.chars().collect();
    match *change {
        Change::MetaFlip(at, mask) => {
            if !meta.is_empty() {
                let at = at % meta.len();
                meta[at] ^= mask;
            }
        }
        Change::MetaCut(at) => meta.truncate(at % (meta.len() + 1)),
        Change::MetaInsert(at, b) => meta.insert(at % (meta.len() + 1), b),
        Change::BodyChar(at, c) => {
            if !chars.is_empty() {
                let mut chars = chars;
                let at = at % chars.len();
                chars[at] = c;
                body = chars.into_iter().collect();
            }
        }
        Change::BodyCut(at) => body = chars[..at % (chars.len() + 1)].iter().collect(),
        Change::Encoding(e) => encoding = e,
    }
    (body, meta, encoding)
}

proptest! {
    #[test]
    fn a_message_reads_back_as_the_same_message_due_at_the_same_time(
        meta in meta(),
        body in body(),
        not_before_ms in proptest::option::of(any::<i64>()),
    ) {
        let out = Outgoing::new(&meta, &body, not_before_ms);
        let not_before = out.not_before_ms.map(|ms| ms.to_string());
        let incoming = Incoming {
            body: &out.body,
            meta: Some(&out.meta),
            body_encoding: out.body_encoding,
            not_before: not_before.as_deref(),
        };
        let (back, back_body) = incoming.decode().expect("its own message");
        prop_assert_eq!(back, meta);
        prop_assert_eq!(&back_body[..], &body[..]);
        prop_assert_eq!(incoming.not_before_ms(), not_before_ms);
        prop_assert!(!out.body.is_empty(), "SQS refuses an empty body");
    }

    #[test]
    fn a_changed_message_reads_as_the_same_message_or_not_at_all(
        meta in meta(),
        body in body(),
        change in change(),
    ) {
        let out = Outgoing::new(&meta, &body, None);
        let (changed_body, changed_meta, encoding) = changed(&out, &change);
        let incoming = Incoming {
            body: &changed_body,
            meta: Some(&changed_meta),
            body_encoding: encoding,
            not_before: None,
        };
        if let Ok((back, back_body)) = incoming.decode() {
            prop_assert_eq!(
                (&back, &back_body[..]),
                (&meta, &body[..]),
                "{:?} read as another message", change
            );
        }
    }

    #[test]
    fn arbitrary_attributes_never_read_as_a_message(
        body in text(),
        meta in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..256)),
        encoding in proptest::option::of(prop_oneof![
            Just("base64".to_owned()),
            Just("empty".to_owned()),
            text(),
        ]),
        not_before in proptest::option::of(text()),
    ) {
        let incoming = Incoming {
            body: &body,
            meta: meta.as_deref(),
            body_encoding: encoding.as_deref(),
            not_before: not_before.as_deref(),
        };
        let _ = incoming.not_before_ms();
        prop_assert!(incoming.decode().is_err());
    }

    #[test]
    fn a_not_before_that_is_not_a_number_makes_the_message_not_ours(
        meta in meta(),
        body in body(),
        not_before in "[^0-9]{1,8}",
    ) {
        let out = Outgoing::new(&meta, &body, None);
        let incoming = Incoming {
            body: &out.body,
            meta: Some(&out.meta),
            body_encoding: out.body_encoding,
            not_before: Some(&not_before),
        };
        prop_assume!(incoming.not_before_ms().is_none());
        prop_assert!(incoming.decode().is_err());
    }
}
