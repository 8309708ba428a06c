//! Errors the ingress answers with, each knowing its HTTP status.
//!
//! Every error answers a JSON body `{"error": "<code>", "detail": "<text>"}`
//! and nothing is enqueued. The codes are stable (scripts match on them);
//! the details are for people.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// Seconds an issuer is asked to wait when the queue cannot take a webhook.
pub const RETRY_AFTER_SECS: u32 = 5;

/// Why a webhook was refused.
#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error("no source named \"{0}\" is configured")]
    UnknownSource(String),
    #[error("nothing here answers {0}; webhooks go to POST /webhooks/{{source}}")]
    NoRoute(String),
    #[error("{0} is not allowed here (see the Allow header)")]
    WrongMethod(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Stale(String),
    #[error("body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot read the request body: {0}")]
    BadBody(String),
    #[error("the body is not valid JSON, and this source takes only JSON: {0}")]
    BadJson(String),
    #[error("the event id is {len} bytes long; at most {limit} are taken")]
    EventIdTooLong { len: usize, limit: usize },
    #[error("the entity key is {len} bytes long; at most {limit} are taken")]
    EntityKeyTooLong { len: usize, limit: usize },
    #[error("the queue cannot take the webhook now: {0}")]
    Unavailable(String),
}

impl IngressError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnknownSource(_) | Self::NoRoute(_) => StatusCode::NOT_FOUND,
            Self::WrongMethod(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized(_) | Self::Stale(_) => StatusCode::UNAUTHORIZED,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BadBody(_)
            | Self::BadJson(_)
            | Self::EventIdTooLong { .. }
            | Self::EntityKeyTooLong { .. } => StatusCode::BAD_REQUEST,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable code in the `error` field (also the metric's outcome label).
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownSource(_) => "unknown_source",
            Self::NoRoute(_) => "not_found",
            Self::WrongMethod(_) => "method_not_allowed",
            Self::Unauthorized(_) => "unauthorized",
            Self::Stale(_) => "stale",
            Self::TooLarge { .. } => "too_large",
            Self::BadBody(_) => "bad_body",
            Self::BadJson(_) => "bad_json",
            Self::EventIdTooLong { .. } => "event_id_too_long",
            Self::EntityKeyTooLong { .. } => "entity_key_too_long",
            Self::Unavailable(_) => "unavailable",
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    detail: String,
}

impl IntoResponse for IngressError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody {
            error: self.code(),
            detail: self.to_string(),
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}
