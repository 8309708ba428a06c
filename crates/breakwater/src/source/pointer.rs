//! JSON pointers (RFC 6901) read out of a body in one pass, without
//! building the document.
//!
//! The ingress needs one or two fields of every webhook (the event id, the
//! entity key) from bodies of a kilobyte or more. Parsing the whole body
//! into a `serde_json::Value` allocates a node for every field only to
//! drop them all; under `bench ingress` that parse was the largest piece of
//! the request handler. Here the parser walks the body once, descends only
//! into the members and elements some pointer passes through, skips the
//! rest (still checking its syntax), and builds a `Value` only for what a
//! pointer points at.
//!
//! The answers are those of `serde_json::from_slice::<Value>(body)` followed
//! by [`Value::pointer`]: a body that is not one JSON document yields
//! nothing, a repeated member name means its last occurrence, and array
//! indices follow the RFC (no sign, no leading zero). Two differences: a
//! skipped string is not checked for valid UTF-8, and an integer a pointer
//! points at that does not fit `u64`/`i64` comes back as its digits in a
//! string (a `Value` would round it to a float, and ids one apart would
//! collide).

use std::fmt;

use serde::Deserialize as _;
use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::Value;
use serde_json::value::RawValue;

/// `node` as a pointer answers it: an integer too large for `u64`/`i64`
/// (which a `Value` holds as a float, rounded) as the digits it was sent
/// with, in a string; anything else as it is.
fn exact(node: Value, raw: &str) -> Value {
    match &node {
        Value::Number(n) if !(n.is_u64() || n.is_i64()) => {
            let text = raw.trim();
            let integer = text
                .strip_prefix('-')
                .unwrap_or(text)
                .bytes()
                .all(|b| b.is_ascii_digit());
            if integer {
                Value::String(text.to_owned())
            } else {
                node
            }
        }
        _ => node,
    }
}

/// A JSON pointer split into its reference tokens, unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    tokens: Vec<String>,
}

impl Pointer {
    /// Parses `""` (the whole document) or `/token/token...`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let tokens = match text.strip_prefix('/') {
            Some(rest) => rest
                .split('/')
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect(),
            None if text.is_empty() => Vec::new(),
            None => return Err(format!("\"{text}\": a JSON pointer starts with '/'")),
        };
        Ok(Self { tokens })
    }
}

/// At most this many pointers per pass (a set of them is a bit mask).
pub(super) const MAX_POINTERS: usize = 64;

/// The values at `pointers` in `body`, in the same order (`None` where the
/// document has nothing there), or `None` if `body` is not one JSON
/// document.
///
/// # Panics
///
/// If given more than [`MAX_POINTERS`] pointers (a programming error: the
/// ingress asks for two).
pub(super) fn find(body: &[u8], pointers: &[&Pointer]) -> Option<Vec<Option<Value>>> {
    assert!(pointers.len() <= MAX_POINTERS, "too many JSON pointers");
    let mut found = vec![None; pointers.len()];
    let all = if pointers.len() == MAX_POINTERS {
        u64::MAX
    } else {
        (1u64 << pointers.len()) - 1
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let walk = Walk {
        pointers,
        depth: 0,
        wanted: all,
        found: &mut found,
    };
    walk.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(found)
}

/// One node of the document, reached by the pointers in `wanted` (a bit
/// mask over `pointers`), whose first `depth` tokens all matched the path
/// to it.
struct Walk<'p, 'f> {
    pointers: &'p [&'p Pointer],
    depth: usize,
    wanted: u64,
    found: &'f mut [Option<Value>],
}

impl Walk<'_, '_> {
    fn indices(&self) -> impl Iterator<Item = usize> + use<> {
        members(self.wanted, self.pointers.len())
    }

    /// The pointers in `wanted` whose next token is `matches`.
    fn next_matching(&self, matches: impl Fn(&str) -> bool) -> u64 {
        self.indices()
            .filter(|&i| matches(&self.pointers[i].tokens[self.depth]))
            .fold(0, |set, i| set | (1 << i))
    }

    /// Where to go for the child matched by `set`.
    fn child(&mut self, set: u64) -> Walk<'_, '_> {
        // A later member of the same name replaces an earlier one, as in a
        // parsed `Value`: forget what the earlier one gave.
        for i in members(set, self.pointers.len()) {
            self.found[i] = None;
        }
        Walk {
            pointers: self.pointers,
            depth: self.depth + 1,
            wanted: set,
            found: self.found,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        if self.wanted == 0 {
            return de.deserialize_ignored_any(IgnoredAny).map(drop);
        }
        let ends_here = self
            .indices()
            .any(|i| self.pointers[i].tokens.len() == self.depth);
        if ends_here {
            // Some pointer wants this whole node: build it once and answer
            // every pointer through here from it. Its text is kept too: an
            // integer past 2^64 becomes a float in a `Value`, and two such
            // ids would collide.
            let raw = Box::<RawValue>::deserialize(de)?;
            let node: Value = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
            for i in self.indices() {
                let rest = &self.pointers[i].tokens[self.depth..];
                self.found[i] = if rest.is_empty() {
                    Some(exact(node.clone(), raw.get()))
                } else {
                    rest.iter()
                        .try_fold(&node, |v, token| step(v, token))
                        .cloned()
                };
            }
            return Ok(());
        }
        de.deserialize_any(self)
    }
}

/// The indices in the bit mask `set` over `len` pointers.
fn members(set: u64, len: usize) -> impl Iterator<Item = usize> {
    (0..len).filter(move |i| set & (1 << i) != 0)
}

/// One step of [`Value::pointer`] for an unescaped token.
fn step<'v>(v: &'v Value, token: &str) -> Option<&'v Value> {
    match v {
        Value::Object(map) => map.get(token),
        Value::Array(items) => items.get(array_index(token)?),
        _ => None,
    }
}

/// An array index token as RFC 6901 spells it: digits, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(set) = map.next_key_seed(KeyMatch { walk: &self })? {
            if set == 0 {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value_seed(self.child(set))?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            let set = self.next_matching(|t| array_index(t) == Some(index));
            let more = if set == 0 {
                seq.next_element::<IgnoredAny>()?.is_some()
            } else {
                seq.next_element_seed(self.child(set))?.is_some()
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    // A scalar where a pointer wanted to go deeper: nothing there.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Reads a member name and answers which of the walk's pointers continue
/// through it, without keeping the name.
struct KeyMatch<'w, 'p, 'f> {
    walk: &'w Walk<'p, 'f>,
}

impl<'de> DeserializeSeed<'de> for KeyMatch<'_, '_, '_> {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<u64, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyMatch<'_, '_, '_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, key: &str) -> Result<u64, E> {
        Ok(self.walk.next_matching(|t| t == key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `find` must agree with parsing the body and calling `Value::pointer`.
    fn agrees(body: &str, pointers: &[&str]) {
        let parsed: Vec<Pointer> = pointers
            .iter()
            .map(|p| Pointer::parse(p).expect("pointer"))
            .collect();
        let refs: Vec<&Pointer> = parsed.iter().collect();
        let expected = serde_json::from_str::<Value>(body)
            .ok()
            .map(|v| pointers.iter().map(|p| v.pointer(p).cloned()).collect());
        assert_eq!(
            find(body.as_bytes(), &refs),
            expected,
            "{body} at {pointers:?}"
        );
    }

    const STRIPE: &str = r#"{"id":"evt_1","object":"event","type":"charge.succeeded",
        "data":{"object":{"id":"ch_9","amount":100,"meta":{"a/b":"slash","m~n":"tilde"},
        "items":[{"sku":"x"},{"sku":"y","qty":2}],"paid":true,"note":null}},
        "list":[[1,2],[3,[4,5]]],"esc\"aped":"q","":"empty-name"}"#;

    #[test]
    fn agrees_with_value_pointer() {
        agrees(STRIPE, &["/id", "/data/object/id"]);
        agrees(STRIPE, &["/data/object/amount", "/data/object/paid"]);
        agrees(STRIPE, &["/data/object/note", "/data/object/absent"]);
        agrees(
            STRIPE,
            &["/data/object/items/1/sku", "/data/object/items/0"],
        );
        agrees(
            STRIPE,
            &["/data/object/meta/a~1b", "/data/object/meta/m~0n"],
        );
        agrees(STRIPE, &["/list/1/1/0", "/list/2", "/list/-"]);
        agrees(STRIPE, &["/esc\"aped", "/"]);
        agrees(STRIPE, &["/data", "/data/object/id"]);
        agrees(STRIPE, &["", "/id"]);
        agrees(STRIPE, &["/id/deeper", "/data/object/amount/0"]);
    }

    #[test]
    fn array_indices_follow_the_rfc() {
        let body = r#"{"a":[10,11,12]}"#;
        agrees(body, &["/a/01", "/a/+1"]);
        agrees(body, &["/a/0", "/a/2"]);
        agrees(body, &["/a/3", "/a/x"]);
    }

    #[test]
    fn the_last_of_repeated_names_wins() {
        agrees(r#"{"id":"first","id":"second"}"#, &["/id"]);
        agrees(r#"{"d":{"id":"x"},"d":{"other":1}}"#, &["/d/id"]);
        agrees(r#"{"d":{"id":"x"},"d":5}"#, &["/d/id"]);
    }

    #[test]
    fn a_body_that_is_not_one_document_yields_nothing() {
        for body in [
            "",
            "not json",
            r#"{"id":"e1"} trailing"#,
            r#"{"id":"e1","#,
            r#"{"id":"e1","x":[1,}"#,
            r#"{"x":tru,"id":"e1"}"#,
        ] {
            agrees(body, &["/id"]);
            assert_eq!(
                find(body.as_bytes(), &[&Pointer::parse("/id").expect("p")]),
                None
            );
        }
    }

    #[test]
    fn scalars_and_arrays_at_the_top() {
        agrees("42", &["", "/0"]);
        agrees(r#"["a","b"]"#, &["/1", "/0/x"]);
        agrees("null", &["", "/a"]);
    }

    #[test]
    fn parse_rejects_a_pointer_without_a_slash() {
        assert!(Pointer::parse("id").is_err());
        assert_eq!(
            Pointer::parse("").expect("root").tokens,
            Vec::<String>::new()
        );
        assert_eq!(
            Pointer::parse("/a~1b/~01").expect("p").tokens,
            ["a/b", "~1"]
        );
    }
}

/// Generated documents and pointers: the one-pass reader answers what
/// `serde_json` parsing and `Value::pointer` answer. `PROPTEST_CASES` sets
/// the count (256 by default; a long run is
/// `PROPTEST_CASES=1000000 cargo test --release -p breakwater pointer::fuzz`).
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::{Pointer, find};

    /// Keys and indices from a small alphabet, so pointers often hit.
    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("0".to_owned()),
            Just("1".to_owned()),
            Just("a/b".to_owned()),
            Just("~".to_owned()),
            Just("".to_owned()),
        ]
    }

    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((token(), inner), 0..4)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn escape(token: &str) -> String {
        token.replace('~', "~0").replace('/', "~1")
    }

    proptest! {
        #[test]
        fn answers_as_serde_json_does(
            doc in document(),
            paths in proptest::collection::vec(proptest::collection::vec(token(), 0..4), 1..3),
        ) {
            let body = serde_json::to_vec(&doc).expect("serialize");
            let texts: Vec<String> = paths
                .iter()
                .map(|p| p.iter().map(|t| format!("/{}", escape(t))).collect())
                .collect();
            let pointers: Vec<Pointer> = texts
                .iter()
                .map(|t| Pointer::parse(t).expect("pointer"))
                .collect();
            let refs: Vec<&Pointer> = pointers.iter().collect();
            let found = find(&body, &refs).expect("a JSON document");
            let parsed: Value = serde_json::from_slice(&body).expect("parse");
            for (text, got) in texts.iter().zip(found) {
                prop_assert_eq!(got.as_ref(), parsed.pointer(text), "{} in {}", text, doc);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..256),
            path in proptest::collection::vec(token(), 0..3),
        ) {
            let text: String = path.iter().map(|t| format!("/{}", escape(t))).collect();
            let pointer = Pointer::parse(&text).expect("pointer");
            let found = find(&body, &[&pointer]);
            if let Ok(parsed) = serde_json::from_slice::<Value>(&body) {
                let found = found.expect("a document serde_json reads");
                prop_assert_eq!(found[0].as_ref(), parsed.pointer(&text));
            }
        }
    }
}
