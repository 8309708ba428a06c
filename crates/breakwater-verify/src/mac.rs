//! The shared HMAC machinery every scheme uses.
//!
//! - [`KeySet`]: one pre-keyed HMAC state per configured secret. Keying HMAC (hashing
//!   the padded key into the inner and outer states) is done once, in
//!   [`crate::Verifier::new`]; each verification clones that state, which is a copy of
//!   a couple hundred bytes, and feeds the message parts in without concatenating them.
//! - [`Tag`]: a MAC output or a candidate signature decoded from a header, held in a
//!   stack buffer so that decoding a header allocates nothing.
//!
//! Comparisons go through `subtle::ConstantTimeEq`: the time they take depends on the
//! tag length (public) and never on where the bytes differ.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

use crate::{Algorithm, KeyError};

/// Largest tag any supported algorithm produces (SHA-256).
const MAX_TAG_LEN: usize = 32;

/// Standard-alphabet base64 that accepts input with or without `=` padding.
pub(crate) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A MAC output or a decoded candidate signature, at most [`MAX_TAG_LEN`] bytes.
#[derive(Clone, Copy)]
pub(crate) struct Tag {
    buf: [u8; MAX_TAG_LEN],
    len: usize,
}

impl Tag {
    fn from_slice(bytes: &[u8]) -> Self {
        let mut buf = [0u8; MAX_TAG_LEN];
        let len = bytes.len().min(MAX_TAG_LEN);
        buf[..len].copy_from_slice(&bytes[..len]);
        Tag { buf, len }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Decodes `len` bytes of hex (either case). `None` if `text` is anything else.
    pub(crate) fn from_hex(text: &str, len: usize) -> Option<Self> {
        if len > MAX_TAG_LEN || text.len() != len * 2 {
            return None;
        }
        let mut buf = [0u8; MAX_TAG_LEN];
        hex::decode_to_slice(text, &mut buf[..len]).ok()?;
        Some(Tag { buf, len })
    }

    /// Decodes standard base64 (padding optional) of exactly `len` bytes.
    pub(crate) fn from_base64(text: &str, len: usize) -> Option<Self> {
        // 4 characters per 3 bytes, rounded up: rejects oversized input before decoding.
        if len > MAX_TAG_LEN || text.len() > len.div_ceil(3) * 4 {
            return None;
        }
        // Room for the decoder's length estimate, which may round up past `len`.
        let mut scratch = [0u8; MAX_TAG_LEN + 3];
        let decoded = BASE64.decode_slice(text, &mut scratch).ok()?;
        (decoded == len).then(|| Tag::from_slice(&scratch[..len]))
    }

    pub(crate) fn to_hex(self) -> String {
        hex::encode(self.as_slice())
    }

    pub(crate) fn to_base64(self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.as_slice())
    }
}

/// Pre-keyed HMAC states, one per secret, all of one algorithm.
#[derive(Clone)]
pub(crate) enum KeySet {
    Sha256(Box<[Hmac<Sha256>]>),
    Sha1(Box<[Hmac<Sha1>]>),
}

impl KeySet {
    /// Keys one HMAC state per secret. `keys` must be non-empty (checked by the caller).
    pub(crate) fn new<K: AsRef<[u8]>>(algorithm: Algorithm, keys: &[K]) -> Result<Self, KeyError> {
        fn keyed<M: KeyInit>(keys: &[impl AsRef<[u8]>]) -> Result<Box<[M]>, KeyError> {
            keys.iter()
                .enumerate()
                .map(|(index, key)| {
                    M::new_from_slice(key.as_ref()).map_err(|_| KeyError::Unusable { index })
                })
                .collect()
        }
        Ok(match algorithm {
            Algorithm::Sha256 => KeySet::Sha256(keyed(keys)?),
            Algorithm::Sha1 => KeySet::Sha1(keyed(keys)?),
        })
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            KeySet::Sha256(keys) => keys.len(),
            KeySet::Sha1(keys) => keys.len(),
        }
    }

    /// Length in bytes of the tags this key set produces.
    pub(crate) fn tag_len(&self) -> usize {
        match self {
            KeySet::Sha256(_) => 32,
            KeySet::Sha1(_) => 20,
        }
    }

    /// The tag of the first secret over the concatenation of `message` (for signing).
    pub(crate) fn sign(&self, message: &[&[u8]]) -> Tag {
        match self {
            KeySet::Sha256(keys) => keys.first().map(|key| compute(key, message)),
            KeySet::Sha1(keys) => keys.first().map(|key| compute(key, message)),
        }
        .unwrap_or(Tag {
            buf: [0; MAX_TAG_LEN],
            len: 0,
        })
    }

    /// Index of the first secret whose tag over the concatenation of `message` equals
    /// one of the tags `candidates()` yields.
    ///
    /// `candidates` is called once per secret so the header is re-parsed instead of
    /// collected. Every candidate is compared (no early exit inside one secret's
    /// comparisons); the loop over secrets stops at the first match, which only tells
    /// a timing observer which secret signed an already valid request.
    pub(crate) fn find<I>(&self, message: &[&[u8]], candidates: impl Fn() -> I) -> Option<usize>
    where
        I: Iterator<Item = Tag>,
    {
        match self {
            KeySet::Sha256(keys) => find_in(keys, message, candidates),
            KeySet::Sha1(keys) => find_in(keys, message, candidates),
        }
    }
}

fn compute<M: Mac + Clone>(key: &M, message: &[&[u8]]) -> Tag {
    let mut mac = key.clone();
    for part in message {
        mac.update(part);
    }
    Tag::from_slice(&mac.finalize().into_bytes())
}

fn find_in<M, I>(keys: &[M], message: &[&[u8]], candidates: impl Fn() -> I) -> Option<usize>
where
    M: Mac + Clone,
    I: Iterator<Item = Tag>,
{
    keys.iter().position(|key| {
        let expected = compute(key, message);
        let mut hit = Choice::from(0);
        for candidate in candidates() {
            hit |= expected.as_slice().ct_eq(candidate.as_slice());
        }
        bool::from(hit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 4231 test case 2 (HMAC-SHA-256) and RFC 2202 test case 2 (HMAC-SHA-1):
    // key "Jefe", data "what do ya want for nothing?".
    const RFC4231_TC2: &str = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
    const RFC2202_TC2: &str = "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79";

    #[test]
    fn rfc_vectors_split_message() {
        let sha256 = KeySet::new(Algorithm::Sha256, &[b"Jefe"]).expect("keys");
        let tag = sha256.sign(&[b"what do ya ", b"want for nothing?"]);
        assert_eq!(tag.to_hex(), RFC4231_TC2);

        let sha1 = KeySet::new(Algorithm::Sha1, &[b"Jefe"]).expect("keys");
        assert_eq!(
            sha1.sign(&[b"what do ya want for nothing?"]).to_hex(),
            RFC2202_TC2
        );
        assert_eq!(sha1.tag_len(), 20);
    }

    #[test]
    fn hex_decoding_rules() {
        assert!(Tag::from_hex(RFC4231_TC2, 32).is_some());
        assert!(Tag::from_hex(&RFC4231_TC2.to_uppercase(), 32).is_some());
        assert!(Tag::from_hex(&RFC4231_TC2[..62], 32).is_none());
        assert!(Tag::from_hex(&format!("{RFC4231_TC2}00"), 32).is_none());
        assert!(Tag::from_hex(&"zz".repeat(32), 32).is_none());
        assert!(Tag::from_hex(&"00".repeat(40), 40).is_none());
    }

    #[test]
    fn base64_decoding_rules() {
        let padded = "7/zfauXrL6LSdBbV8YTfnCWafHk=";
        let tag = Tag::from_base64(padded, 20).expect("padded");
        assert_eq!(hex::encode(tag.as_slice()), RFC2202_TC2);
        assert!(Tag::from_base64(padded.trim_end_matches('='), 20).is_some());
        assert!(Tag::from_base64(padded, 32).is_none());
        assert!(Tag::from_base64("not base64!", 20).is_none());
        assert!(Tag::from_base64(&"A".repeat(400), 32).is_none());
        assert!(Tag::from_base64("", 32).is_none());
    }

    #[test]
    fn find_checks_every_secret_and_candidate() {
        let keys = KeySet::new(Algorithm::Sha256, &[b"old".as_slice(), b"Jefe"]).expect("keys");
        let good = Tag::from_hex(RFC4231_TC2, 32).expect("hex");
        let bad = Tag::from_hex(&"00".repeat(32), 32).expect("hex");
        let msg: &[&[u8]] = &[b"what do ya want for nothing?"];
        assert_eq!(keys.find(msg, || [bad, good].into_iter()), Some(1));
        assert_eq!(keys.find(msg, || [bad].into_iter()), None);
        assert_eq!(keys.find(msg, std::iter::empty), None);
        assert_eq!(keys.len(), 2);
    }
}
