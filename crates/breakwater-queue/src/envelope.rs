//! How a message travels in a broker's payload (JetStream, RabbitMQ): a
//! length-prefixed JSON envelope of its metadata, then the body as it came.
//! Metadata stays out of broker headers because event ids and entity keys
//! come from senders and a header value may not hold every byte they can.
//!
//! ```text
//! | meta length: u32 big-endian | meta: JSON | body |
//! ```

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

/// A payload that is not an envelope.
#[derive(Debug, thiserror::Error)]
#[error("not a Breakwater envelope: {0}")]
pub struct NotAnEnvelope(String);

pub fn encode(meta: &Meta, body: &[u8]) -> Bytes {
    // A struct of strings and numbers always serializes.
    let json = serde_json::to_vec(meta).unwrap_or_default();
    let mut out = BytesMut::with_capacity(4 + json.len() + body.len());
    out.put_u32(u32::try_from(json.len()).unwrap_or(u32::MAX));
    out.put_slice(&json);
    out.put_slice(body);
    out.freeze()
}

pub fn decode(payload: &Bytes) -> Result<(Meta, Bytes), NotAnEnvelope> {
    let len = payload
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| NotAnEnvelope("shorter than its length prefix".into()))?;
    let end = 4usize
        .checked_add(len)
        .filter(|end| *end <= payload.len())
        .ok_or_else(|| NotAnEnvelope("metadata longer than the payload".into()))?;
    let meta: Meta =
        serde_json::from_slice(&payload[4..end]).map_err(|e| NotAnEnvelope(e.to_string()))?;
    Ok((meta, payload.slice(end..)))
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
}
