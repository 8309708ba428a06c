//! How a message travels as a Kafka record. Pure: no I/O.
//!
//! - key: the entity key (one entity's events on one partition, in
//!   order); on the dead-letter topic, the dead letter's id (so the
//!   compacted topic keeps one record per id, and a tombstone removes it).
//! - value: the body, as it came.
//! - headers: `breakwater-meta`, the metadata as JSON (source, event id,
//!   entity key, the webhook's headers, when it was received, attempts,
//!   replays, and on the DLQ the class, error and time of death), sealed
//!   over the value ([`breakwater_queue::envelope::seal`]: a changed byte
//!   of either is refused);
//!   `breakwater-attempts`, `breakwater-class` and `breakwater-error`
//!   repeat what tools reading the topic look for; `breakwater-not-before`
//!   (ms since the epoch) on a retry tier says when it is due.
//!
//! A record without `breakwater-meta` was not produced by Breakwater: it is
//! [`Foreign`], and goes to the DLQ as it came; so does one whose metadata
//! does not open against its value, whose `breakwater-not-before` or
//! `breakwater-releases` is not a number, or that carries one of the three
//! twice.

use breakwater_queue::ATTEMPTS_HEADER;
use breakwater_queue::envelope::{self, Meta};

pub(crate) const META_HEADER: &str = "breakwater-meta";
pub(crate) const NOT_BEFORE_HEADER: &str = "breakwater-not-before";
pub(crate) const CLASS_HEADER: &str = "breakwater-class";
pub(crate) const ERROR_HEADER: &str = "breakwater-error";
pub(crate) const RELEASES_HEADER: &str = "breakwater-releases";

/// The headers of a record carrying `meta` and the value `body`, due at
/// `not_before_ms` (0: at once), released `releases` times so far.
pub(crate) fn headers(
    meta: &Meta,
    body: &[u8],
    not_before_ms: i64,
    releases: u32,
) -> Vec<(&'static str, Vec<u8>)> {
    let json = envelope::seal(meta, body);
    let mut out = vec![
        (META_HEADER, json),
        (ATTEMPTS_HEADER, meta.attempts.to_string().into_bytes()),
    ];
    if not_before_ms > 0 {
        out.push((NOT_BEFORE_HEADER, not_before_ms.to_string().into_bytes()));
    }
    if releases > 0 {
        out.push((RELEASES_HEADER, releases.to_string().into_bytes()));
    }
    if let Some(class) = &meta.class {
        out.push((CLASS_HEADER, class.clone().into_bytes()));
    }
    if let Some(error) = &meta.error {
        out.push((ERROR_HEADER, error.clone().into_bytes()));
    }
    out
}

/// A record Breakwater cannot read, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Foreign {
    #[error("not a Breakwater record: no {META_HEADER} header")]
    NoMeta,
    #[error("not a Breakwater record: {META_HEADER} is not its metadata: {0}")]
    BadMeta(String),
    #[error("not a Breakwater record: {0} is not a number")]
    BadNumber(&'static str),
    #[error("not a Breakwater record: {0} twice")]
    Twice(&'static str),
}

/// What a record's headers say: its metadata and when it is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) meta: Meta,
    pub(crate) not_before_ms: i64,
    pub(crate) releases: u32,
}

/// Reads the headers of a record (name and value pairs, as they came) and
/// checks its metadata against its value, `body`.
pub(crate) fn read<'a>(
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    body: &[u8],
) -> Result<Read, Foreign> {
    let mut meta: Option<&[u8]> = None;
    let mut not_before_ms: Option<i64> = None;
    let mut releases: Option<u32> = None;
    /// `v` as this header's number, written as [`headers`] writes it
    /// (decimal, no sign, space or leading zero).
    fn number<T: std::str::FromStr + ToString>(name: &'static str, v: &[u8]) -> Result<T, Foreign> {
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<T>().ok().filter(|n| n.to_string() == s))
            .ok_or(Foreign::BadNumber(name))
    }
    /// `slot`, set once.
    fn once<T>(name: &'static str, slot: &mut Option<T>, value: T) -> Result<(), Foreign> {
        match slot.replace(value) {
            Some(_) => Err(Foreign::Twice(name)),
            None => Ok(()),
        }
    }
    for (name, value) in headers {
        match (name, value) {
            (META_HEADER, Some(v)) => once(META_HEADER, &mut meta, v)?,
            (NOT_BEFORE_HEADER, Some(v)) => {
                once(
                    NOT_BEFORE_HEADER,
                    &mut not_before_ms,
                    number(NOT_BEFORE_HEADER, v)?,
                )?;
            }
            (RELEASES_HEADER, Some(v)) => {
                once(RELEASES_HEADER, &mut releases, number(RELEASES_HEADER, v)?)?;
            }
            _ => {}
        }
    }
    let meta = envelope::open(meta.ok_or(Foreign::NoMeta)?, body)
        .map_err(|e| Foreign::BadMeta(e.to_string()))?;
    Ok(Read {
        meta,
        not_before_ms: not_before_ms.unwrap_or(0),
        releases: releases.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            source: "stripe".into(),
            event_id: "evt\r\n1".into(),
            entity_key: Some("1042".into()),
            headers: vec![("content-type".into(), "application/json".into())],
            received_at_ms: 7,
            replays: 1,
            attempts: 2,
            class: Some("exhausted".into()),
            error: Some("lock timeout".into()),
            dead_at_ms: Some(9),
        }
    }

    fn as_pairs<'a>(h: &'a [(&'static str, Vec<u8>)]) -> Vec<(&'static str, Option<&'a [u8]>)> {
        h.iter().map(|(k, v)| (*k, Some(v.as_slice()))).collect()
    }

    #[test]
    fn metadata_and_due_time_round_trip() {
        let h = headers(&meta(), b"{}", 1_234, 3);
        let back = read(as_pairs(&h), b"{}").expect("read");
        assert_eq!(back.meta, meta());
        assert_eq!(back.not_before_ms, 1_234);
        assert_eq!(back.releases, 3);
        let mirrored: Vec<&str> = h.iter().map(|(k, _)| *k).collect();
        assert!(mirrored.contains(&ATTEMPTS_HEADER));
        assert!(mirrored.contains(&CLASS_HEADER));
        assert!(mirrored.contains(&ERROR_HEADER));
        let plain = headers(
            &Meta {
                class: None,
                error: None,
                ..meta()
            },
            b"",
            0,
            0,
        );
        assert!(
            plain
                .iter()
                .all(|(k, _)| *k != NOT_BEFORE_HEADER && *k != CLASS_HEADER)
        );
        assert_eq!(read(as_pairs(&plain), b"").expect("read").not_before_ms, 0);
    }

    #[test]
    fn a_record_without_metadata_is_foreign() {
        assert_eq!(
            read([("other", Some(&b"x"[..]))], b""),
            Err(Foreign::NoMeta)
        );
        assert!(matches!(
            read([(META_HEADER, Some(&b"{"[..]))], b""),
            Err(Foreign::BadMeta(_))
        ));
        assert_eq!(read([(META_HEADER, None)], b""), Err(Foreign::NoMeta));
    }
}
