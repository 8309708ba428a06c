//! Where a statement parameter's value comes from (`$entity`, `json:/..`,
//! `header:..`), and the value it takes for one event. Shared by the
//! statements (`statement.rs`) and the stale-event guard (`version.rs`),
//! which reads an event's version the same way.

use serde_json::Value;

/// Where a parameter's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParamSource {
    /// `$entity`: the event's entity key.
    Entity,
    /// `$event_id`.
    EventId,
    /// `$source`: the source name.
    Source,
    /// `$payload`: the whole body as JSON.
    Payload,
    /// `$version`: the event's version, normalised (`crate::version`);
    /// `NULL` when it carries none.
    Version,
    /// `json:/pointer` into the body.
    Json(String),
    /// `header:Name`, looked up case-insensitively.
    Header(String),
}

impl ParamSource {
    /// Parses a `params` entry: `json:/pointer` or `header:Name`.
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
        if let Some(pointer) = spec.strip_prefix("json:") {
            if !pointer.is_empty() && !pointer.starts_with('/') {
                return Err(format!(
                    "\"{spec}\": a JSON pointer is empty or starts with '/' (json:/data/id)"
                ));
            }
            Ok(Self::Json(pointer.to_owned()))
        } else if let Some(name) = spec.strip_prefix("header:") {
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("\"{spec}\": the header name is empty"));
            }
            Ok(Self::Header(name.to_owned()))
        } else {
            Err(format!(
                "\"{spec}\": a parameter's value is \"json:/pointer\" or \"header:Name\""
            ))
        }
    }

    pub(crate) fn builtin(name: &str) -> Option<Self> {
        match name {
            "entity" => Some(Self::Entity),
            "event_id" => Some(Self::EventId),
            "source" => Some(Self::Source),
            "payload" => Some(Self::Payload),
            "version" => Some(Self::Version),
            _ => None,
        }
    }
}

/// A parameter's value for one event, before the backend converts it to
/// the type the database expects.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ParamValue {
    /// JSON `null` at the pointer: binds SQL `NULL`.
    Null,
    /// A JSON string, a header, the entity key, the event id, the source.
    Text(String),
    /// A JSON number, boolean, object or array; or `$payload`.
    Json(Value),
}

impl ParamValue {
    /// The value as text: strings as they are, other JSON as JSON text.
    pub(crate) fn to_text(&self) -> Option<String> {
        match self {
            Self::Null => None,
            Self::Text(s) => Some(s.clone()),
            Self::Json(Value::String(s)) => Some(s.clone()),
            Self::Json(v) => Some(v.to_string()),
        }
    }

    /// The value as JSON: text becomes a JSON string.
    pub(crate) fn to_json(&self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Text(s) => Value::String(s.clone()),
            Self::Json(v) => v.clone(),
        }
    }
}

/// Parses the body as JSON, if it is JSON.
pub(crate) fn parse_body(body: &[u8]) -> Option<Value> {
    serde_json::from_slice(body).ok()
}

/// Looks a header up case-insensitively; the first one wins.
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}
