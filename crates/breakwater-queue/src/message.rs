//! Messages as the ingress hands them to a queue and as a worker gets them
//! back, the receipt that settles a claim, and the attempt header of
//! brokers that keep no attempt count.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// A webhook as the ingress hands it to the queue.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Milliseconds since the Unix epoch.
    pub received_at_ms: i64,
}

/// A message as a worker sees it.
#[derive(Debug, Clone)]
pub struct Message {
    /// The backend's id of the message (row id, sequence, offset, ...).
    pub id: String,
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub received_at_ms: i64,
    /// Failed attempts so far (not counting releases). Brokers that keep no
    /// count carry it in [`ATTEMPTS_HEADER`].
    pub attempts: u32,
    /// Times the message was handed out, this one included; 0 where the
    /// backend does not count deliveries.
    pub receives: u32,
}

/// Header carrying the attempt count on brokers that keep none (RabbitMQ,
/// Kafka): a retry republishes the message with it raised by one.
pub const ATTEMPTS_HEADER: &str = "breakwater-attempts";

/// The attempt count carried in `headers` ([`ATTEMPTS_HEADER`]); 0 when it
/// is absent or not a number.
pub fn attempts_from_headers(headers: &[(String, String)]) -> u32 {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(ATTEMPTS_HEADER))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Proof of a claim, needed to settle it. Opaque to workers: each backend
/// puts its own token in it (a row and lease token, a delivery tag, a
/// partition and offset, a receipt handle, an ack subject) and reads it
/// back with [`Receipt::token`].
#[derive(Clone)]
pub struct Receipt {
    token: Arc<dyn Any + Send + Sync>,
}

impl Receipt {
    /// A receipt holding a backend's token.
    pub fn new<T: Any + Send + Sync>(token: T) -> Self {
        Self {
            token: Arc::new(token),
        }
    }

    /// The backend's token, if this receipt holds one of type `T`.
    pub fn token<T: Any>(&self) -> Option<&T> {
        self.token.downcast_ref()
    }
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Receipt(..)")
    }
}

/// A claimed message and the receipt that settles it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message: Message,
    pub receipt: Receipt,
}

/// What `enqueue` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// Newly queued under this id.
    New { id: String },
    /// The event id is already queued, applied or dead-lettered.
    Duplicate { id: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_gives_back_only_its_own_token() {
        let r = Receipt::new((7i64, 9i64));
        assert_eq!(r.token::<(i64, i64)>(), Some(&(7, 9)));
        assert_eq!(r.token::<String>(), None);
        let copy = r.clone();
        assert_eq!(copy.token::<(i64, i64)>(), Some(&(7, 9)));
    }

    #[test]
    fn attempts_read_from_the_header_whatever_its_case() {
        let h = |v: &str| vec![("Breakwater-Attempts".to_owned(), v.to_owned())];
        assert_eq!(attempts_from_headers(&h("3")), 3);
        assert_eq!(attempts_from_headers(&h("x")), 0);
        assert_eq!(attempts_from_headers(&[]), 0);
    }
}
