//! Generated inputs for the brokers' envelope fuzz tests (proptest), in
//! one place: every backend reads the same [`Meta`] back from its own wire
//! form, and its fuzz module (`src/fuzz.rs` of each broker crate) checks
//! that against these strategies. Built with the `conformance` feature,
//! for tests only.

use proptest::prelude::*;

use crate::envelope::Meta;

/// Any text, control characters and all.
pub fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..24).prop_map(String::from_iter)
}

/// Any metadata a message can carry.
pub fn meta() -> impl Strategy<Value = Meta> {
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

/// One change to bytes: one replaced (xor with a non-zero mask), cut at a
/// point, or one put in at a point.
#[derive(Debug, Clone)]
pub enum Change {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, u8),
}

/// Any [`Change`].
pub fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Change::Flip(at, mask)),
        any::<usize>().prop_map(Change::Cut),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Change::Insert(at, b)),
    ]
}

/// `bytes` with `change` made (positions taken modulo the length).
pub fn changed(bytes: &[u8], change: &Change) -> Vec<u8> {
    let mut out = bytes.to_vec();
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
