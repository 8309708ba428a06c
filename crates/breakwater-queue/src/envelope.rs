//! How a message travels in a broker's payload (JetStream, RabbitMQ): a
//! length-prefixed JSON envelope of its metadata, then the body as it came.
//! Metadata stays out of broker headers because event ids and entity keys
//! come from senders and a header value may not hold every byte they can.
//!
//! ```text
//! | meta length: u32 big-endian | meta: JSON, sealed | body |
//! ```
//!
//! The metadata is **sealed** ([`seal`], [`open`]; SQS and Kafka carry
//! it so too, in an attribute or a header beside the body): its JSON holds
//! `sum`, the CRC-32C of the metadata's own JSON (without `sum`) followed
//! by the body, so a changed byte of either is refused rather than read as
//! another message. The check runs on the metadata as read, written again,
//! so what a change cannot alter (spacing, a key that only repeats a
//! default) passes. Metadata without `sum` (written before the seal) is
//! read as it is.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::{DeadLetter, NewMessage};

/// What travels beside the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub source: String,
    pub event_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_key: Option<String>,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    pub received_at_ms: i64,
    /// Times the message came back from the DLQ.
    #[serde(default)]
    pub replays: u32,
    /// Failed attempts: before it was dead-lettered (DLQ); so far, on a
    /// broker whose retries are copies carrying the count (SQS).
    #[serde(default)]
    pub attempts: u32,
    /// DLQ only: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_at_ms: Option<i64>,
}

impl Meta {
    /// The metadata of a webhook as the ingress hands it over (no
    /// attempts, replays or reason yet); the body stays in `message`.
    pub fn of(message: &mut NewMessage) -> Self {
        Self {
            source: std::mem::take(&mut message.source),
            event_id: std::mem::take(&mut message.event_id),
            entity_key: message.entity_key.take(),
            headers: std::mem::take(&mut message.headers),
            received_at_ms: message.received_at_ms,
            replays: 0,
            attempts: 0,
            class: None,
            error: None,
            dead_at_ms: None,
        }
    }

    /// The dead letter `id` this metadata describes, with `body` (for `dlq
    /// show`).
    pub fn dead_letter(&self, id: String, body: Option<String>) -> DeadLetter {
        DeadLetter {
            id,
            source: self.source.clone(),
            event_id: self.event_id.clone(),
            entity_key: self.entity_key.clone(),
            attempts: self.attempts,
            replays: self.replays,
            class: self.class.clone().unwrap_or_default(),
            error: self.error.clone().unwrap_or_default(),
            received_at_ms: self.received_at_ms,
            dead_at_ms: self.dead_at_ms.unwrap_or_default(),
            body,
        }
    }
}

/// A payload that is not an envelope, or metadata that is not Breakwater's
/// or does not match its body.
#[derive(Debug, thiserror::Error)]
#[error("not a Breakwater envelope: {0}")]
pub struct NotAnEnvelope(String);

/// The key of the seal in the metadata's JSON.
const SUM_KEY: &str = "sum";

/// The seal of `meta` over `body`: CRC-32C of the metadata's JSON
/// (without the seal), then the body, in 8 lower-case hex digits.
fn sum(meta_json: &[u8], body: &[u8]) -> String {
    let crc = crc32c::crc32c_append(crc32c::crc32c(meta_json), body);
    format!("{crc:08x}")
}

/// `meta` as JSON, sealed over `body` (the module doc).
pub fn seal(meta: &Meta, body: &[u8]) -> Vec<u8> {
    // A struct of strings and numbers always serializes, as an object
    // with at least one key: the seal goes in before its last brace.
    let mut json = serde_json::to_vec(meta).unwrap_or_default();
    let sum = sum(&json, body);
    if json.last() == Some(&b'}') {
        json.pop();
        json.extend_from_slice(format!(",\"{SUM_KEY}\":\"{sum}\"}}").as_bytes());
    }
    json
}

/// The metadata `json` holds, checked against `body` when sealed.
pub fn open(json: &[u8], body: &[u8]) -> Result<Meta, NotAnEnvelope> {
    #[derive(Deserialize)]
    struct Sealed {
        #[serde(flatten)]
        meta: Meta,
        #[serde(default)]
        sum: Option<String>,
    }
    let sealed: Sealed = serde_json::from_slice(json).map_err(|e| NotAnEnvelope(e.to_string()))?;
    if let Some(found) = &sealed.sum {
        let written = serde_json::to_vec(&sealed.meta).unwrap_or_default();
        if *found != sum(&written, body) {
            return Err(NotAnEnvelope(
                "its seal does not match its metadata and body: changed in transit or at rest"
                    .into(),
            ));
        }
    }
    Ok(sealed.meta)
}

/// `meta` (sealed) and `body` as one payload.
pub fn encode(meta: &Meta, body: &[u8]) -> Bytes {
    let json = seal(meta, body);
    let mut out = BytesMut::with_capacity(4 + json.len() + body.len());
    out.put_u32(u32::try_from(json.len()).unwrap_or(u32::MAX));
    out.put_slice(&json);
    out.put_slice(body);
    out.freeze()
}

/// The metadata and body of a payload [`encode`] made.
pub fn decode(payload: &Bytes) -> Result<(Meta, Bytes), NotAnEnvelope> {
    let len = payload
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| NotAnEnvelope("shorter than its length prefix".into()))?;
    let end = 4usize
        .checked_add(len)
        .filter(|end| *end <= payload.len())
        .ok_or_else(|| NotAnEnvelope("metadata longer than the payload".into()))?;
    let body = payload.slice(end..);
    let meta = open(&payload[4..end], &body)?;
    Ok((meta, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_one() {
        let meta = Meta {
            source: "stripe".into(),
            event_id: "evt\r\n1".into(),
            entity_key: Some("1042".into()),
            headers: vec![("content-type".into(), "application/json".into())],
            received_at_ms: 7,
            replays: 1,
            attempts: 0,
            class: None,
            error: None,
            dead_at_ms: None,
        };
        let payload = encode(&meta, b"{\"a\":1}");
        let (back, body) = decode(&payload).expect("decode");
        assert_eq!(back, meta);
        assert_eq!(&body[..], b"{\"a\":1}");
        assert!(decode(&Bytes::from_static(b"\x00\x00")).is_err());
        assert!(decode(&Bytes::from_static(b"\x00\x00\x00\x09{}")).is_err());
    }

    #[test]
    fn a_changed_byte_breaks_the_seal_and_unsealed_metadata_is_read() {
        let meta = Meta {
            source: "stripe".into(),
            event_id: "evt_1".into(),
            entity_key: None,
            headers: Vec::new(),
            received_at_ms: 7,
            replays: 1,
            attempts: 0,
            class: None,
            error: None,
            dead_at_ms: None,
        };
        let sealed = seal(&meta, b"body");
        assert!(std::str::from_utf8(&sealed).is_ok_and(|s| s.contains("\"sum\":\"")));
        assert_eq!(open(&sealed, b"body").expect("open"), meta);
        assert!(open(&sealed, b"bodz").is_err(), "another body");
        let other = String::from_utf8(sealed.clone())
            .expect("utf-8")
            .replace("\"replays\":1", "\"replays\":2");
        assert!(open(other.as_bytes(), b"body").is_err(), "another count");
        // A renamed key falls back to its default: another message, refused.
        let renamed = String::from_utf8(sealed)
            .expect("utf-8")
            .replace("\"replays\"", "\"replayz\"");
        assert!(open(renamed.as_bytes(), b"body").is_err());
        // Written before the seal.
        let unsealed = serde_json::to_vec(&meta).expect("json");
        assert_eq!(open(&unsealed, b"anything").expect("open"), meta);
    }
}
