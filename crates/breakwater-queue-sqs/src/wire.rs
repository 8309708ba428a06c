//! How a message travels in SQS. An SQS body must be non-empty text of
//! the characters XML allows, while a webhook body is any bytes, and event
//! ids and keys come from senders. So:
//!
//! - the metadata ([`Meta`]: source, event id, key, headers, attempts,
//!   replays, and in the DLQ class and reason) is JSON in the binary
//!   message attribute `bw-meta`, sealed over the body
//!   ([`breakwater_queue::envelope::seal`]: a changed byte of either, or
//!   of the body's base64, is refused as not Breakwater's);
//! - the body is the SQS body as it came when SQS can carry it, else its
//!   base64 with the attribute `bw-body = base64` (`empty` for no body,
//!   which SQS cannot send);
//! - `bw-not-before` (milliseconds since the epoch) holds back a retry
//!   whose delay SQS cannot keep itself (past 15 minutes, or on a FIFO
//!   queue, which has no per-message delay); one that is not a number
//!   makes the message not Breakwater's. Pure.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;

use breakwater_queue::envelope::{self, Meta};

pub(crate) const META: &str = "bw-meta";
pub(crate) const BODY_ENCODING: &str = "bw-body";
pub(crate) const NOT_BEFORE: &str = "bw-not-before";

/// A message ready for SQS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outgoing {
    pub(crate) body: String,
    pub(crate) meta: Vec<u8>,
    /// `bw-body`, when the body is not as it came.
    pub(crate) body_encoding: Option<&'static str>,
    pub(crate) not_before_ms: Option<i64>,
}

impl Outgoing {
    pub(crate) fn new(meta: &Meta, body: &[u8], not_before_ms: Option<i64>) -> Self {
        let meta = envelope::seal(meta, body);
        let (body, body_encoding) = if body.is_empty() {
            ("-".to_owned(), Some("empty"))
        } else {
            match std::str::from_utf8(body) {
                Ok(text) if text.chars().all(sqs_allows) => (text.to_owned(), None),
                _ => (STANDARD.encode(body), Some("base64")),
            }
        };
        Self {
            body,
            meta,
            body_encoding,
            not_before_ms,
        }
    }

    /// Bytes SQS counts against its message size limit: the body and each
    /// attribute's name, type and value.
    pub(crate) fn size(&self) -> usize {
        let attr = |name: &str, ty: &str, value: usize| name.len() + ty.len() + value;
        self.body.len()
            + attr(META, "Binary", self.meta.len())
            + self
                .body_encoding
                .map_or(0, |e| attr(BODY_ENCODING, "String", e.len()))
            + self
                .not_before_ms
                .map_or(0, |_| attr(NOT_BEFORE, "Number", 13))
    }
}

/// A message as SQS handed it over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Incoming<'a> {
    pub(crate) body: &'a str,
    pub(crate) meta: Option<&'a [u8]>,
    pub(crate) body_encoding: Option<&'a str>,
    pub(crate) not_before: Option<&'a str>,
}

/// A message that is not one of Breakwater's.
#[derive(Debug, thiserror::Error)]
#[error("not a Breakwater message: {0}")]
pub(crate) struct Foreign(pub String);

impl Incoming<'_> {
    pub(crate) fn decode(&self) -> Result<(Meta, Bytes), Foreign> {
        let meta = self
            .meta
            .ok_or_else(|| Foreign(format!("no {META} attribute")))?;
        if self.not_before.is_some() && self.not_before_ms().is_none() {
            return Err(Foreign(format!("{NOT_BEFORE} is not a number")));
        }
        let body = match self.body_encoding {
            None => Bytes::copy_from_slice(self.body.as_bytes()),
            Some("empty") => Bytes::new(),
            Some("base64") => STANDARD
                .decode(self.body)
                .map(Bytes::from)
                .map_err(|e| Foreign(format!("{BODY_ENCODING}: {e}")))?,
            Some(other) => return Err(Foreign(format!("{BODY_ENCODING} = {other:?}"))),
        };
        let meta = envelope::open(meta, &body).map_err(|e| Foreign(e.to_string()))?;
        Ok((meta, body))
    }

    /// When the message may run, if it is held back.
    pub(crate) fn not_before_ms(&self) -> Option<i64> {
        self.not_before.and_then(|v| v.trim().parse().ok())
    }
}

/// Whether SQS takes `c` in a message body.
fn sqs_allows(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            source: "stripe".into(),
            event_id: "evt\u{0}\r\n1".into(),
            entity_key: Some("1042".into()),
            headers: vec![("content-type".into(), "application/json".into())],
            received_at_ms: 7,
            replays: 0,
            attempts: 2,
            class: None,
            error: None,
            dead_at_ms: None,
        }
    }

    fn round_trip(body: &[u8]) -> (Outgoing, Meta, Bytes) {
        let out = Outgoing::new(&meta(), body, Some(9));
        let not_before = out.not_before_ms.map(|ms| ms.to_string());
        let incoming = Incoming {
            body: &out.body,
            meta: Some(&out.meta),
            body_encoding: out.body_encoding,
            not_before: not_before.as_deref(),
        };
        assert_eq!(incoming.not_before_ms(), Some(9));
        let (m, b) = incoming.decode().expect("decode");
        (out, m, b)
    }

    #[test]
    fn text_travels_as_it_came_and_bytes_as_base64() {
        let (out, m, b) = round_trip(b"{\"a\":\"\xc3\xa9\"}");
        assert_eq!(
            (out.body_encoding, &b[..]),
            (None, &b"{\"a\":\"\xc3\xa9\"}"[..])
        );
        assert_eq!(m, meta());
        for odd in [&b"\x00\x01binary"[..], b"\xff\xfe", "\u{FFFF}".as_bytes()] {
            let (out, _, b) = round_trip(odd);
            assert_eq!((out.body_encoding, &b[..]), (Some("base64"), odd));
        }
        let (out, _, b) = round_trip(b"");
        assert_eq!((out.body_encoding, b.len()), (Some("empty"), 0));
        assert!(!out.body.is_empty(), "SQS refuses an empty body");
    }

    #[test]
    fn a_message_without_metadata_is_foreign() {
        let foreign = Incoming {
            body: "{}",
            meta: None,
            body_encoding: None,
            not_before: None,
        };
        assert!(foreign.decode().is_err());
        let garbled = Incoming {
            meta: Some(b"{"),
            ..foreign
        };
        assert!(garbled.decode().is_err());
    }

    #[test]
    fn the_size_counts_body_and_attributes() {
        let out = Outgoing::new(&meta(), b"12345", None);
        assert_eq!(out.size(), 5 + META.len() + "Binary".len() + out.meta.len());
    }
}
