//! A small typed client of the admin API, for the CLI (`breaker`,
//! `events show`, and `dlq` and `queue stats` when a service answers).

use std::net::SocketAddr;
use std::time::Duration;

use breakwater_admin_api::ErrorBody;
use bytes::Bytes;
use http::{Method, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    #[error("cannot reach the admin API at {addr} (is `breakwater serve` running?): {detail}")]
    Unreachable { addr: SocketAddr, detail: String },
    #[error("admin API answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("admin API answered something this client cannot read: {0}")]
    Json(#[from] serde_json::Error),
}

/// Calls `method path` on the admin listener and reads its answer as `T`
/// (a type of `breakwater-admin-api`).
pub async fn call<T: serde::de::DeserializeOwned>(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path_and_query: &str,
) -> Result<T, AdminClientError> {
    call_with(addr, token, method, path_and_query, None::<&()>).await
}

/// [`call`] with `body` sent as JSON.
pub async fn call_with<T: serde::de::DeserializeOwned, B: serde::Serialize>(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path_and_query: &str,
    body: Option<&B>,
) -> Result<T, AdminClientError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // Every write says JSON, with a body or without: the API refuses a
    // write without a content type, as a web page could send it.
    let writes = !matches!(method, Method::GET | Method::HEAD);
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path_and_query}"));
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if writes || body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let body = match body {
        Some(b) => Bytes::from(serde_json::to_vec(b)?),
        None => Bytes::new(),
    };
    let unreachable = |detail: String| AdminClientError::Unreachable { addr, detail };
    let req = req
        .body(Full::new(body))
        .map_err(|e| unreachable(e.to_string()))?;
    let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
        .await
        .map_err(|_| unreachable("no answer in 5 s".to_owned()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        let body = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) => format!("{}: {}", e.error, e.detail),
            Err(_) => String::from_utf8_lossy(&body).into_owned(),
        };
        return Err(AdminClientError::Status {
            status: status.as_u16(),
            body,
        });
    }
    Ok(serde_json::from_slice(&body)?)
}
