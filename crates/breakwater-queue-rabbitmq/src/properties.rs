//! The AMQP properties Breakwater puts on its messages: persistent, a
//! message id of its own, and two counts in headers, since RabbitMQ keeps
//! neither: failed attempts ([`ATTEMPTS_HEADER`]) and delayed releases
//! ([`RELEASES_HEADER`], which spreads a hot key's backlog out: see the
//! dispatcher's `spread_release`). The message itself (source, event id,
//! key, headers, body) travels in the payload envelope. A count that is
//! there but not one (a negative or too large number, text that is not a
//! number, another type) makes the message unreadable, to be
//! dead-lettered, never taken for 0: a poison message must not retry for
//! ever.

use breakwater_queue::ATTEMPTS_HEADER;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// Header counting the times a message was released with a delay.
pub(crate) const RELEASES_HEADER: &str = "breakwater-releases";

/// AMQP's persistent delivery mode.
const PERSISTENT: u8 = 2;

/// The counts a message carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) attempts: u32,
    pub(crate) releases: u32,
}

/// Properties of a message with id `id` carrying `counts`.
pub(crate) fn build(id: &str, counts: Counts) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, n) in [
        (ATTEMPTS_HEADER, counts.attempts),
        (RELEASES_HEADER, counts.releases),
    ] {
        if n > 0 {
            headers.insert(
                ShortString::from(name),
                AMQPValue::LongLongInt(i64::from(n)),
            );
        }
    }
    BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id(ShortString::from(id))
        .with_headers(headers)
}

/// A count header that holds no count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {0} header is not a count")]
pub(crate) struct NotACount(pub(crate) &'static str);

/// The counts `props` carry (0 for a missing one).
pub(crate) fn counts(props: &BasicProperties) -> Result<Counts, NotACount> {
    let read = |name: &'static str| -> Result<u32, NotACount> {
        let Some(value) = props
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(&ShortString::from(name)))
        else {
            return Ok(0);
        };
        let n: Option<i64> = match value {
            AMQPValue::LongLongInt(n) => Some(*n),
            AMQPValue::LongInt(n) => Some(i64::from(*n)),
            AMQPValue::LongUInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            _ => None,
        };
        n.and_then(|n| u32::try_from(n).ok()).ok_or(NotACount(name))
    };
    Ok(Counts {
        attempts: read(ATTEMPTS_HEADER)?,
        releases: read(RELEASES_HEADER)?,
    })
}

/// The message id `props` carry, or `fallback`.
pub(crate) fn id(props: &BasicProperties, fallback: impl FnOnce() -> String) -> String {
    props
        .message_id()
        .as_ref()
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_and_default_to_zero() {
        let c = Counts {
            attempts: 3,
            releases: 1,
        };
        let props = build("m1", c);
        assert_eq!(counts(&props), Ok(c));
        assert_eq!(id(&props, || "x".into()), "m1");
        assert_eq!(counts(&BasicProperties::default()), Ok(Counts::default()));
        assert_eq!(props.delivery_mode(), &Some(PERSISTENT));
    }

    #[test]
    fn a_count_another_client_wrote_as_text_is_read() {
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from(ATTEMPTS_HEADER),
            AMQPValue::LongString("4".into()),
        );
        let props = BasicProperties::default().with_headers(headers);
        assert_eq!(counts(&props).map(|c| c.attempts), Ok(4));
    }
}
