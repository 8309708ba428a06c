//! The stale-event guard's version: where a source's events carry it
//! (`version = "json:/pointer"` or `"header:Name"`, read from the body and
//! the kept headers the way statement parameters are) and how it becomes
//! one comparable integer.
//!
//! Normalised ([`normalise`]): a JSON integer as it is; a string of digits
//! (a header, a JSON string) as the integer it spells; an RFC 3339
//! timestamp (Shopify's `2024-01-01T10:00:00-05:00`) as Unix microseconds.
//! Anything else present (a fraction, a boolean, free text) is a permanent
//! failure of the message (`invalid_version`, the DLQ entry names the value
//! and why), never a dependency failure. No value at all (the pointer finds
//! nothing or `null`, the header is absent, the body is not JSON) is no
//! version: the event applies as it would without the guard.
//!
//! The database sinks compare it with the newest version applied for the
//! event's entity key in the inbox transaction (`breakwater_versions`, see
//! the crate doc); the forward sink sends it as `breakwater-version` and
//! leaves the decision to the receiver.

use serde_json::Value;

use crate::param::{ParamSource, ParamValue, header, parse_body};
use crate::{Event, SinkError};

/// Where a source's events carry their version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VersionSpec {
    from: ParamSource,
    /// As the config wrote it, for error messages.
    written: String,
}

impl VersionSpec {
    /// Parses `json:/pointer` or `header:Name`, like a statement parameter.
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
        let from = ParamSource::parse(spec)?;
        Ok(Self {
            from,
            written: spec.trim().to_owned(),
        })
    }

    /// The event's version: `json` is its body parsed as JSON (`None`: not
    /// JSON). `Ok(None)` when it carries none.
    pub(crate) fn read(
        &self,
        event: &Event<'_>,
        json: Option<&Value>,
    ) -> Result<Option<i64>, SinkError> {
        let value = match &self.from {
            ParamSource::Json(pointer) => match json.and_then(|doc| doc.pointer(pointer)) {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::String(s)) => ParamValue::Text(s.clone()),
                Some(v) => ParamValue::Json(v.clone()),
            },
            ParamSource::Header(name) => match header(event.headers, name) {
                None => return Ok(None),
                Some(v) => ParamValue::Text(v.to_owned()),
            },
            // `ParamSource::parse` makes only the two above.
            _ => return Ok(None),
        };
        normalise(&value).map(Some).map_err(|why| {
            let shown: String = value
                .to_text()
                .unwrap_or_default()
                .chars()
                .take(80)
                .collect();
            SinkError::permanent(
                "invalid_version",
                format!("version {}: {shown:?} is {why}", self.written),
            )
        })
    }

    /// [`Self::read`] for a sink that has not parsed the body (the forward
    /// sink): parses it only when the version is in it.
    pub(crate) fn read_raw(&self, event: &Event<'_>) -> Result<Option<i64>, SinkError> {
        let json = match self.from {
            ParamSource::Json(_) => parse_body(event.body),
            _ => None,
        };
        self.read(event, json.as_ref())
    }
}

/// A version as one comparable integer; `Err` says why the value is not
/// one.
pub(crate) fn normalise(value: &ParamValue) -> Result<i64, String> {
    const WANTED: &str = "an integer, a string of digits or an RFC 3339 timestamp";
    match value {
        ParamValue::Json(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| format!("not a 64-bit integer (wanted {WANTED})")),
        ParamValue::Text(s) | ParamValue::Json(Value::String(s)) => {
            let s = s.trim();
            let digits = s.strip_prefix('-').unwrap_or(s);
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                return s
                    .parse()
                    .map_err(|_| "a number past the 64-bit range".to_owned());
            }
            chrono::DateTime::parse_from_rfc3339(s)
                .map(|t| t.timestamp_micros())
                .map_err(|_| format!("not {WANTED}"))
        }
        ParamValue::Null | ParamValue::Json(Value::Null) => Err(format!("null, not {WANTED}")),
        ParamValue::Json(_) => Err(format!("not {WANTED}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FailureClass;
    use serde_json::json;

    fn event<'a>(headers: &'a [(String, String)], body: &'a [u8]) -> Event<'a> {
        Event {
            source: "shop",
            event_id: "evt_1",
            entity_key: Some("1042"),
            headers,
            body,
            received_at_ms: 0,
            attempt: 1,
        }
    }

    #[test]
    fn integers_digits_and_rfc3339_times_are_versions() {
        let text = |s: &str| normalise(&ParamValue::Text(s.to_owned()));
        assert_eq!(
            normalise(&ParamValue::Json(json!(1_700_000_000))),
            Ok(1_700_000_000)
        );
        assert_eq!(normalise(&ParamValue::Json(json!(-3))), Ok(-3));
        assert_eq!(text("1700000000"), Ok(1_700_000_000));
        assert_eq!(text(" 42 "), Ok(42));
        // Shopify's updated_at, in its own offset: Unix microseconds.
        assert_eq!(text("2024-01-01T10:00:00-05:00"), Ok(1_704_121_200_000_000));
        assert_eq!(
            text("2024-01-01T15:00:00.000001Z"),
            Ok(1_704_121_200_000_001)
        );
        assert!(text("2024-01-01T10:00:00-05:00") < text("2024-01-01T10:00:01-05:00"));
    }

    #[test]
    fn anything_else_present_is_refused_with_the_reason() {
        for bad in [
            ParamValue::Json(json!(1.5)),
            ParamValue::Json(json!(u64::MAX)),
            ParamValue::Json(json!(true)),
            ParamValue::Json(json!({"a": 1})),
            ParamValue::Text("yesterday".into()),
            ParamValue::Text(String::new()),
            ParamValue::Text("99999999999999999999".into()),
            ParamValue::Text("2024-01-01".into()),
        ] {
            assert!(normalise(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn read_from_the_body_or_a_header_and_absent_is_none() {
        let spec = VersionSpec::parse("json:/updated_at").expect("spec");
        let body = br#"{"updated_at":"2024-01-01T10:00:00-05:00"}"#;
        let json = parse_body(body);
        let read = |spec: &VersionSpec, e: &Event<'_>| spec.read_raw(e).expect("a version or none");
        assert_eq!(
            spec.read(&event(&[], body), json.as_ref()).expect("read"),
            Some(1_704_121_200_000_000)
        );
        assert_eq!(read(&spec, &event(&[], body)), Some(1_704_121_200_000_000));
        for absent in [&br#"{}"#[..], br#"{"updated_at":null}"#, b"not json"] {
            assert_eq!(read(&spec, &event(&[], absent)), None);
        }

        let spec = VersionSpec::parse("header:Webhook-Timestamp").expect("spec");
        let headers = vec![("webhook-timestamp".to_owned(), "1700000000".to_owned())];
        assert_eq!(read(&spec, &event(&headers, b"{}")), Some(1_700_000_000));
        assert_eq!(read(&spec, &event(&[], b"{}")), None);

        let bad = vec![("webhook-timestamp".to_owned(), "soon".to_owned())];
        let err = spec.read_raw(&event(&bad, b"{}")).expect_err("refused");
        assert_eq!(
            (err.class, err.kind),
            (FailureClass::Permanent, "invalid_version")
        );
        assert!(err.message.contains("header:Webhook-Timestamp"), "{err}");
        assert!(err.message.contains("\"soon\""), "{err}");

        assert!(VersionSpec::parse("created").is_err());
        assert!(VersionSpec::parse("json:created").is_err());
    }
}
