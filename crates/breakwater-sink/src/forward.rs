//! The HTTP forward sink: a source with `forward = { url = ... }` has its
//! verified webhooks POSTed to an internal service instead of written to a
//! database, under the same breaker, lanes, retries and DLQ.
//!
//! What the receiver gets: the original body and content type, and
//!
//! | header | value |
//! |---|---|
//! | `idempotency-key`, `webhook-id` | the event id, encoded (below): the receiver deduplicates on it (there is no inbox on this path) |
//! | `webhook-timestamp`, `webhook-signature` | a Standard Webhooks signature with the target's secret, when it has one, so the receiver can trust the request came from Breakwater |
//! | `breakwater-source` | the source's name, encoded the same way |
//! | `breakwater-attempt` | 1 for the first attempt, 2 for the first retry, ... |
//! | `breakwater-version` | the event's version (the stale-event guard's integer, `version.rs`), when its source has one and it carries one: the receiver decides what an older version means |
//!
//! The event id comes from the sender and may hold any character, so it
//! is percent-encoded: every byte of visible ASCII but `%` as it is, every
//! other byte (space, control characters, `%`, the UTF-8 bytes of a
//! non-ASCII character) as `%XX`. An id of visible ASCII without `%`
//! arrives unchanged, distinct ids never share a key, and the receiver
//! gets the id back by percent-decoding the key (`c%250A` is `c%0A`,
//! `c%0A` is `c` and a newline).
//!
//! What a person sees of a target, its errors included, never holds its
//! URL's password or query values ([`crate::redact_http_url`]), and an
//! error's message is at most 512 bytes long (`MESSAGE_MOST_BYTES`:
//! [`ForwardTarget::forward`], which every error leaves through, cuts it).
//!
//! How an answer is classified ([`classify`]): 2xx applied; connection
//! errors, timeouts, 429 and 5xx are *dependency* failures (retried, they
//! feed the breaker), with `Retry-After` (seconds or an HTTP-date)
//! carried as the retry's delay; 3xx and other 4xx are *permanent*
//! (the DLQ entry keeps the status and the start of the body), except the
//! 307s and 308s a target's `follow_redirects` allows, which are followed
//! with the same POST (`redirect_target` says where to).
//!
//! Each target has its own connection pool, at most `max_connections`
//! requests at once, a connect timeout, and a timeout on the whole request.
//! `http://` targets speak HTTP/1.1, or HTTP/2 with prior knowledge (h2c);
//! `https://` targets speak TLS (rustls) and offer HTTP/1.1, or HTTP/2 by
//! ALPN, trusting the system's roots and a target's own `ca_file`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::sync::Semaphore;

use crate::target_gate::{GateSettings, Pass, TargetGate};
use crate::{Applied, Event, SinkError, SinkSetupError, TargetFailure};

/// How long a reachability check's connection must stay open.
const REACH_HOLD: Duration = Duration::from_millis(50);
/// Most bytes of a refusal's body kept in the DLQ entry.
const EXCERPT_BYTES: usize = 512;
/// Most bytes of the message of any error the forward sink returns (what
/// the DLQ entry, the attempt history and the log keep of it).
const MESSAGE_MOST_BYTES: usize = 512;
/// What ends a message cut at [`MESSAGE_MOST_BYTES`].
const CUT_MARK: &str = "…";
/// Most bytes of an answer's body read (the rest is dropped with the
/// connection).
const READ_AT_MOST: usize = 64 * 1024;

/// Where and how a source's webhooks are forwarded.
#[derive(Clone, PartialEq, Eq)]
pub struct ForwardSpec {
    /// `http://host:port/path` or `https://host:port/path`.
    pub url: String,
    /// The whole request, connecting included.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Requests in flight at once to this target.
    pub max_connections: usize,
    /// Standard Webhooks secret (`whsec_<base64>`) the forwarded requests
    /// are signed with; `None`: unsigned.
    pub secret: Option<String>,
    /// HTTP/2 instead of HTTP/1.1: with prior knowledge (h2c) on
    /// `http://`, offered by ALPN on `https://`.
    pub http2: bool,
    /// Redirects followed per request: 307 and 308 only (they keep the
    /// POST and its body), to a URL of the same scheme or `https://`, or a
    /// path on the same target; 0 (the default): none.
    pub follow_redirects: u32,
    /// PEM certificates trusted for an `https://` target besides the
    /// system's roots (a private CA, a self-signed service).
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ForwardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardSpec")
            .field("url", &crate::redact_http_url(&self.url))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_connections", &self.max_connections)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("http2", &self.http2)
            .field("follow_redirects", &self.follow_redirects)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// One forward target: its pool, its bound, its signer.
pub struct ForwardTarget {
    spec: ForwardSpec,
    /// The URL as people see it: no password, no query values.
    shown_url: String,
    uri: Uri,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    permits: Arc<Semaphore>,
    /// This target's own breaker, consulted when the process forwards to
    /// several targets.
    gate: std::sync::Mutex<TargetGate>,
    /// Where the source's events carry their version (`with_version`).
    pub(crate) version: Option<crate::version::VersionSpec>,
}

impl std::fmt::Debug for ForwardTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardTarget")
            .field("url", &self.shown_url)
            .finish_non_exhaustive()
    }
}

impl ForwardTarget {
    /// A target for `spec` (no connection is made until the first
    /// request).
    pub fn new(spec: ForwardSpec) -> Result<Self, SinkSetupError> {
        let shown_url = crate::redact_http_url(&spec.url);
        let uri: Uri = spec
            .url
            .parse()
            .map_err(|e| SinkSetupError::Settings(format!("forward url {shown_url:?}: {e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(SinkSetupError::Settings(format!(
                    "forward url {shown_url:?}: must be http://host[:port]/path or https://host[:port]/path"
                )));
            }
        };
        if uri.host().is_none() {
            return Err(SinkSetupError::Settings(format!(
                "forward url {shown_url:?}: has no host"
            )));
        }
        if spec.ca_file.is_some() && !https {
            return Err(SinkSetupError::Settings(format!(
                "forward ca_file: only an https:// url uses it, not {shown_url:?}"
            )));
        }
        if spec.max_connections == 0 || spec.timeout.is_zero() {
            return Err(SinkSetupError::Settings(
                "forward: max_connections and timeout_ms must be above 0".into(),
            ));
        }
        if let Some(secret) = &spec.secret {
            breakwater_verify::sign(&breakwater_verify::Scheme::standard(), secret, b"", 0, "x")
                .map_err(|e| SinkSetupError::Settings(format!("forward secret: {e}")))?;
        }
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(spec.connect_timeout));
        tcp.set_nodelay(true);
        // The TLS layer takes the https:// URLs.
        tcp.enforce_http(false);
        let tls = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(https, spec.ca_file.as_deref())?)
            .https_or_http();
        let connector = if spec.http2 {
            tls.enable_http2().wrap_connector(tcp)
        } else {
            tls.enable_http1().wrap_connector(tcp)
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(spec.max_connections)
            .http2_only(spec.http2)
            .build(connector);
        Ok(Self {
            gate: std::sync::Mutex::new(TargetGate::new(GateSettings::default())),
            permits: Arc::new(Semaphore::new(spec.max_connections)),
            spec,
            shown_url,
            uri,
            client,
            version: None,
        })
    }

    /// Where this target's events go, for people: its URL, no password,
    /// no query values.
    pub fn destination(&self) -> String {
        format!("forwarded to {}", self.shown_url)
    }

    /// Whether the target accepts a TCP connection within the connect
    /// timeout and keeps it open for [`REACH_HOLD`] (nothing is sent: no
    /// TLS, no request), a check that adds no load to a service that is
    /// down. A peer that accepts and resets at once (a balancer or proxy
    /// with no backend) is not reachable.
    pub async fn reachable(&self) -> bool {
        let Some(host) = self.uri.host() else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self
            .uri
            .port_u16()
            .unwrap_or(if self.uri.scheme_str() == Some("https") {
                443
            } else {
                80
            });
        let connect = tokio::net::TcpStream::connect((host, port));
        let Ok(Ok(stream)) = tokio::time::timeout(self.spec.connect_timeout, connect).await else {
            return false;
        };
        let mut first = [0u8; 1];
        match tokio::time::timeout(REACH_HOLD, stream.peek(&mut first)).await {
            // Quiet: open, waiting for a request.
            Err(_) => true,
            // Closed or reset.
            Ok(Ok(0) | Err(_)) => false,
            // It spoke first (a banner): open too.
            Ok(Ok(_)) => true,
        }
    }

    /// Requests in flight now, and the most there may be.
    pub fn usage(&self) -> (usize, usize) {
        let max = self.spec.max_connections;
        (max - self.permits.available_permits().min(max), max)
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, TargetGate> {
        self.gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// POSTs `event` to the target; `attempt` is 1 for the first try. With
    /// `scoped` (the process forwards to several targets) the target's own
    /// gate refuses it fast while the target is failing, and its failures
    /// carry [`SinkError::target`].
    ///
    /// Every error of the forward sink leaves through here, its message
    /// cut to 512 bytes (`MESSAGE_MOST_BYTES`): a redirect's `Location`, a
    /// long URL or an error chain can be any length.
    pub async fn forward(
        &self,
        event: &Event<'_>,
        attempt: u32,
        scoped: bool,
    ) -> Result<Applied, SinkError> {
        self.forward_uncut(event, attempt, scoped)
            .await
            .map_err(|mut e| {
                cut_message(&mut e.message);
                e
            })
    }

    async fn forward_uncut(
        &self,
        event: &Event<'_>,
        attempt: u32,
        scoped: bool,
    ) -> Result<Applied, SinkError> {
        if !scoped {
            return self.send(event, attempt).await;
        }
        let url = &self.shown_url;
        let probe = match self.gate().pass(std::time::Instant::now()) {
            Pass::Go => false,
            Pass::Probe => true,
            Pass::Refused(wait) => {
                let mut e = SinkError::dependency(
                    "target_open",
                    format!("{url} is failing: its gate holds requests back for {wait:?}"),
                );
                e.retry_after = Some(wait);
                e.target = Some(TargetFailure { in_trouble: true });
                return Err(e);
            }
        };
        let result = self.send(event, attempt).await;
        let failed = result.as_ref().is_err_and(SinkError::is_dependency);
        let mut gate = self.gate();
        let opened = gate.record(failed, probe, std::time::Instant::now());
        let in_trouble = opened || probe || gate.in_trouble();
        drop(gate);
        result.map_err(|mut e| {
            if e.is_dependency() {
                e.target = Some(TargetFailure { in_trouble });
                if in_trouble && e.retry_after.is_none() {
                    e.retry_after = Some(GateSettings::default().cool_down);
                }
            }
            e
        })
    }

    async fn send(&self, event: &Event<'_>, attempt: u32) -> Result<Applied, SinkError> {
        let url = &self.shown_url;
        let deadline = tokio::time::Instant::now() + self.spec.timeout;
        let _permit = tokio::time::timeout_at(deadline, self.permits.acquire())
            .await
            .map_err(|_| {
                SinkError::dependency(
                    "pool_timeout",
                    format!(
                        "all {} connections to {url} busy for {:?}",
                        self.spec.max_connections, self.spec.timeout
                    ),
                )
            })?
            .map_err(|_| SinkError::dependency("connection", "the forward target is closed"))?;
        let mut uri = self.uri.clone();
        let mut hops = 0;
        loop {
            let answer = self.send_once(&uri, event, attempt, deadline).await?;
            let redirect = matches!(answer.status.as_u16(), 307 | 308);
            if self.spec.follow_redirects == 0 || !answer.status.is_redirection() {
                let shown = if hops == 0 {
                    std::borrow::Cow::Borrowed(url.as_str())
                } else {
                    std::borrow::Cow::Owned(crate::redact_http_url(&uri.to_string()))
                };
                return classify(
                    &shown,
                    answer.status,
                    answer.retry_after,
                    answer.location.as_deref(),
                    &answer.body,
                );
            }
            let to = answer
                .location
                .as_deref()
                .map_or_else(|| "(no Location)".to_owned(), crate::redact_http_url);
            let why = if !redirect {
                "only 307 and 308 are followed (the others would turn the POST into a GET)"
                    .to_owned()
            } else if hops == self.spec.follow_redirects {
                format!(
                    "more than {} redirect(s) in a row",
                    self.spec.follow_redirects
                )
            } else {
                match answer
                    .location
                    .as_deref()
                    .and_then(|l| redirect_target(&uri, l))
                {
                    Some(next) => {
                        uri = next;
                        hops += 1;
                        continue;
                    }
                    None => "only an http(s):// URL (never https to http) or a path on the \
                             same target is followed"
                        .to_owned(),
                }
            };
            let from = crate::redact_http_url(&uri.to_string());
            return Err(SinkError::permanent(
                "http_redirect",
                format!("HTTP {} from {from} to {to}: {why}", answer.status),
            ));
        }
    }

    /// One request to `uri`, its answer read (bounded) within `deadline`.
    async fn send_once(
        &self,
        uri: &Uri,
        event: &Event<'_>,
        attempt: u32,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, SinkError> {
        let url = &self.shown_url;
        let request = self.request(uri, event, attempt)?;
        let response = match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Err(_) => {
                return Err(SinkError::dependency(
                    "timeout",
                    format!("{url} did not answer within {:?}", self.spec.timeout),
                ));
            }
            Ok(Err(e)) => {
                return Err(SinkError::dependency(
                    "connection",
                    format!("{url}: {}", error_chain(&e)),
                ));
            }
            Ok(Ok(response)) => response,
        };
        let (parts, body) = response.into_parts();
        let retry_after = parts
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
        let location = parts
            .headers
            .get(http::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Read what came back (bounded, within the same deadline) so the
        // connection can serve the next request.
        let body =
            match tokio::time::timeout_at(deadline, Limited::new(body, READ_AT_MOST).collect())
                .await
            {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(_)) | Err(_) => Bytes::new(),
            };
        Ok(Answer {
            status: parts.status,
            retry_after,
            location,
            body,
        })
    }

    fn request(
        &self,
        uri: &Uri,
        event: &Event<'_>,
        attempt: u32,
    ) -> Result<Request<Full<Bytes>>, SinkError> {
        let headers = self.headers(event, attempt)?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .body(Full::new(Bytes::copy_from_slice(event.body)))
            .map_err(|e| SinkError::permanent("forward_request", e.to_string()))?;
        *request.headers_mut() = headers;
        Ok(request)
    }

    /// The headers of the request that forwards `event` (the table of the
    /// module's doc), signed now when the target has a secret.
    pub fn headers(&self, event: &Event<'_>, attempt: u32) -> Result<HeaderMap, SinkError> {
        let content_type = event
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map_or("application/json", |(_, v)| v.as_str());
        let event_id = id_header_value(event.event_id)?;
        let mut headers = HeaderMap::with_capacity(6);
        headers.insert(
            http::header::CONTENT_TYPE,
            content_type_value(content_type)?,
        );
        headers.insert(HeaderName::from_static("idempotency-key"), event_id.clone());
        headers.insert(
            HeaderName::from_static("breakwater-source"),
            id_header_value(event.source)?,
        );
        headers.insert(
            HeaderName::from_static("breakwater-attempt"),
            HeaderValue::from(attempt),
        );
        if let Some(spec) = &self.version
            && let Some(version) = spec.read_raw(event)?
        {
            headers.insert(
                HeaderName::from_static("breakwater-version"),
                HeaderValue::from(version),
            );
        }
        match &self.spec.secret {
            Some(secret) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                // Visible ASCII by construction: the id as the receiver
                // reads it in `webhook-id`, signed as such.
                let id = event_id.to_str().map_err(|e| {
                    SinkError::permanent("forward_request", format!("event id header: {e}"))
                })?;
                let signed = breakwater_verify::sign(
                    &breakwater_verify::Scheme::standard(),
                    secret,
                    event.body,
                    now,
                    id,
                )
                .map_err(|e| SinkError::permanent("forward_secret", e.to_string()))?;
                for (name, value) in signed {
                    headers.insert(name, value);
                }
            }
            None => {
                headers.insert(HeaderName::from_static("webhook-id"), event_id);
            }
        }
        Ok(headers)
    }
}

/// The TLS settings of a target: for `https`, the system's roots and the
/// certificates of `ca_file`; for plain http, none are needed (nor read).
fn tls_config(https: bool, ca_file: Option<&Path>) -> Result<rustls::ClientConfig, SinkSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    if https {
        // Unreadable system certificates are skipped: a private CA in
        // `ca_file` may be all a target needs.
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
    }
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| SinkSetupError::Settings(format!("forward ca_file {shown}: {e}")))?;
        if certs.is_empty() {
            return Err(SinkSetupError::Settings(format!(
                "forward ca_file {shown}: holds no PEM certificate"
            )));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| SinkSetupError::Settings(format!("forward ca_file {shown}: {e}")))?;
        }
    }
    // The provider is named, not taken from the process: other crates of
    // the binary bring rustls with a different one.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SinkSetupError::Settings(format!("forward TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What came back from one request.
struct Answer {
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<String>,
    body: Bytes,
}

/// Where a redirect from `from` to `location` leads, if Breakwater follows
/// it: an `https://` URL, an `http://` URL when `from` is plain http too
/// (never from TLS down to plain text), or a path (`/...`) on the same
/// scheme and host; `None` for anything else (another scheme, a relative
/// path).
fn redirect_target(from: &Uri, location: &str) -> Option<Uri> {
    if location.starts_with('/') && !location.starts_with("//") {
        let mut parts = from.clone().into_parts();
        parts.path_and_query = Some(location.parse().ok()?);
        return Uri::from_parts(parts).ok();
    }
    let to: Uri = location.parse().ok()?;
    let scheme_ok = match to.scheme_str() {
        Some("https") => true,
        Some("http") => from.scheme_str() == Some("http"),
        _ => false,
    };
    (scheme_ok && to.host().is_some()).then_some(to)
}

/// A `Retry-After` value: delay-seconds, or an HTTP-date (the time left
/// until it, none once it passed); `None` when it is neither.
fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Whether `b` goes into an [`id_header_value`] as it is.
fn kept_in_id(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'%'
}

/// An event id (or a source's name) as a header value, injectively: each
/// byte of visible ASCII but `%` as it is, every other byte (space, control
/// characters, `%`, the UTF-8 bytes of a non-ASCII character) as `%XX` in
/// upper-case hex. Percent-decoding the value gives `s` back, so distinct
/// ids never share a value; an id of visible ASCII without `%` is
/// unchanged. (An id comes from the sender and may hold anything; a
/// header value holds visible ASCII, and a receiver trims the spaces at
/// its ends.)
fn id_header_value(s: &str) -> Result<HeaderValue, SinkError> {
    if s.bytes().all(kept_in_id) {
        return visible_ascii_value(s.to_owned());
    }
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if kept_in_id(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
            out.push(char::from(HEX_DIGITS[usize::from(b & 0x0f)]));
        }
    }
    visible_ascii_value(out)
}

const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// `s`, made of visible ASCII (and spaces) only, as a header value: it
/// always is one; the error is there for the type.
fn visible_ascii_value(s: String) -> Result<HeaderValue, SinkError> {
    HeaderValue::from_maybe_shared(Bytes::from(s))
        .map_err(|e| SinkError::permanent("forward_request", format!("a header value: {e}")))
}

/// The sender's content type, as it is when it is visible ASCII with
/// spaces between (`application/json; charset=utf-8`), else encoded like
/// an id.
fn content_type_value(s: &str) -> Result<HeaderValue, SinkError> {
    if s.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
        && !s.starts_with(' ')
        && !s.ends_with(' ')
    {
        return visible_ascii_value(s.to_owned());
    }
    id_header_value(s)
}

/// Cuts `message` to [`MESSAGE_MOST_BYTES`] on a character boundary,
/// ending it with [`CUT_MARK`] when it was longer.
fn cut_message(message: &mut String) {
    if message.len() <= MESSAGE_MOST_BYTES {
        return;
    }
    let mut end = MESSAGE_MOST_BYTES - CUT_MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(CUT_MARK);
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// What an answer of `status` means for the message and the breaker.
pub(crate) fn classify(
    url: &str,
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<&str>,
    body: &[u8],
) -> Result<Applied, SinkError> {
    if status.is_success() {
        return Ok(Applied::New);
    }
    let excerpt = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)]).into_owned();
    let code = status.as_u16().to_string();
    let location = location.map(crate::redact_http_url);
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        let kind = if status == StatusCode::TOO_MANY_REQUESTS {
            "http_429"
        } else {
            "http_5xx"
        };
        let mut e = SinkError::dependency(kind, format!("HTTP {status} from {url}: {excerpt}"))
            .with_code(code);
        e.retry_after = retry_after;
        return Err(e);
    }
    if status.is_redirection() {
        return Err(SinkError::permanent(
            "http_redirect",
            format!(
                "HTTP {status} from {url} to {}: redirects are not followed",
                location.as_deref().unwrap_or("(no Location)")
            ),
        )
        .with_code(code));
    }
    Err(
        SinkError::permanent("http_4xx", format!("HTTP {status} from {url}: {excerpt}"))
            .with_code(code),
    )
}

impl ForwardTarget {
    /// Sends each event's version, read as `spec` says (`json:/pointer` or
    /// `header:Name`), in a `breakwater-version` header; `None`: no header.
    /// The receiver decides what an older version means.
    pub fn with_version(mut self, spec: Option<&str>) -> Result<Self, SinkSetupError> {
        self.version = spec
            .map(crate::version::VersionSpec::parse)
            .transpose()
            .map_err(|e| crate::SinkSetupError::Settings(format!("version {e}")))?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://svc/hooks";

    #[test]
    fn answers_are_classified_for_the_breaker() {
        assert!(matches!(
            classify(URL, StatusCode::NO_CONTENT, None, None, b""),
            Ok(Applied::New)
        ));
        let e = classify(
            URL,
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(2)),
            None,
            b"down",
        )
        .expect_err("503");
        assert!(e.is_dependency(), "{e}");
        assert_eq!(
            (e.kind, e.retry_after),
            ("http_5xx", Some(Duration::from_secs(2)))
        );
        let e = classify(URL, StatusCode::TOO_MANY_REQUESTS, None, None, b"").expect_err("429");
        assert_eq!((e.kind, e.is_dependency()), ("http_429", true));
        let e = classify(URL, StatusCode::BAD_REQUEST, None, None, &[b'x'; 2000]).expect_err("400");
        assert!(e.is_permanent());
        assert_eq!(e.code.as_deref(), Some("400"));
        assert!(
            e.message.len() < 600,
            "the excerpt is bounded: {}",
            e.message.len()
        );
        let e = classify(
            URL,
            StatusCode::MOVED_PERMANENTLY,
            None,
            Some("http://x/"),
            b"",
        )
        .expect_err("301");
        assert_eq!(e.kind, "http_redirect");
        assert!(e.message.contains("http://x/"), "{e}");
    }

    #[test]
    fn a_redirect_is_followed_to_http_or_a_path_on_the_same_target_only() {
        let from: Uri = "http://10.0.0.5:7000/hooks/stripe?x=1"
            .parse()
            .expect("uri");
        let to = |l: &str| redirect_target(&from, l).map(|u| u.to_string());
        assert_eq!(
            to("/hooks/v2"),
            Some("http://10.0.0.5:7000/hooks/v2".into())
        );
        assert_eq!(to("http://other:81/in"), Some("http://other:81/in".into()));
        assert_eq!(to("https://other/in"), Some("https://other/in".into()));
        let tls: Uri = "https://svc/hooks".parse().expect("uri");
        assert_eq!(
            redirect_target(&tls, "http://svc/in"),
            None,
            "never from TLS to plain text"
        );
        assert_eq!(
            redirect_target(&tls, "/in").map(|u| u.to_string()),
            Some("https://svc/in".into())
        );
        assert_eq!(to("//other/in"), None, "scheme-relative");
        assert_eq!(to("v2"), None, "a relative path");
        assert_eq!(to("ftp://other/in"), None);
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        // Wed, 21 Oct 2015 07:28:00 GMT is 1445412480.
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO),
            "a date past is no wait"
        );
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn a_sender_s_event_id_always_makes_a_header_of_its_own() {
        let key = |id: &str| id_header_value(id).expect("a header value");
        assert_eq!(key("evt_1"), "evt_1");
        assert_eq!(key("a\r\nb"), "a%0D%0Ab");
        assert_eq!(key("ü"), "%C3%BC");
        assert_eq!(key(" a b "), "%20a%20b%20");
        // `%` is encoded too: an id spelled like another's encoding keeps
        // a key of its own.
        assert_eq!(key("c%0A"), "c%250A");
        assert_eq!(key("c\n"), "c%0A");
        assert_ne!(key("c%0A"), key("c\n"));
        assert_eq!(key(""), "");
    }

    #[test]
    fn a_content_type_is_kept_as_sent_when_it_is_a_header_value() {
        let value = |s: &str| content_type_value(s).expect("a header value");
        assert_eq!(
            value("application/json; charset=utf-8"),
            "application/json; charset=utf-8"
        );
        assert_eq!(value("text/plain\n"), "text/plain%0A");
        assert_eq!(value(" x"), "%20x");
    }

    #[test]
    fn a_message_is_cut_on_a_character_boundary() {
        let mut short = "x".repeat(MESSAGE_MOST_BYTES);
        cut_message(&mut short);
        assert_eq!(short.len(), MESSAGE_MOST_BYTES, "not cut at the bound");
        for pad in 0..4 {
            let mut long = format!("{}{}", "x".repeat(pad), "é".repeat(MESSAGE_MOST_BYTES));
            cut_message(&mut long);
            assert!(long.len() <= MESSAGE_MOST_BYTES, "{}", long.len());
            assert!(long.len() > MESSAGE_MOST_BYTES - 8, "{}", long.len());
            assert!(long.ends_with(CUT_MARK), "{long}");
        }
    }

    #[test]
    fn a_redirect_s_location_is_shown_without_its_query_values() {
        let e = classify(
            URL,
            StatusCode::FOUND,
            None,
            Some("https://login.example/in?session=abc123"),
            b"",
        )
        .expect_err("302");
        assert!(!e.message.contains("abc123"), "{e}");
        assert!(e.message.contains("session=<redacted>"), "{e}");
    }

    #[test]
    fn a_target_is_described_without_its_secrets() {
        let spec = ForwardSpec {
            url: "http://u:pw@svc/x?token=t0k".into(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            max_connections: 4,
            secret: Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
            http2: false,
            follow_redirects: 0,
            ca_file: None,
        };
        let target = ForwardTarget::new(spec.clone()).expect("target");
        for shown in [
            format!("{spec:?}"),
            format!("{target:?}"),
            target.destination(),
        ] {
            assert!(
                !shown.contains("pw") && !shown.contains("t0k") && !shown.contains("MfKQ"),
                "{shown}"
            );
            assert!(
                shown.contains("http://u:<redacted>@svc/x?token=<redacted>"),
                "{shown}"
            );
        }
        let mut refused = spec;
        refused.ca_file = Some("/nonexistent/ca.pem".into());
        let err = ForwardTarget::new(refused).expect_err("a CA file on http");
        assert!(!err.to_string().contains("pw"), "{err}");
    }

    #[test]
    fn only_http_and_https_urls_and_sane_bounds_are_taken() {
        let spec = |url: &str| ForwardSpec {
            url: url.into(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            max_connections: 4,
            secret: None,
            http2: false,
            follow_redirects: 0,
            ca_file: None,
        };
        assert!(ForwardTarget::new(spec("http://127.0.0.1:7000/x")).is_ok());
        assert!(ForwardTarget::new(spec("https://svc/x")).is_ok());
        assert!(ForwardTarget::new(spec("ftp://svc/x")).is_err());
        assert!(ForwardTarget::new(spec("not a url")).is_err());
        let mut s = spec("http://svc/x");
        s.ca_file = Some("/etc/hostname".into());
        assert!(
            ForwardTarget::new(s).is_err(),
            "a CA file on a plain http target"
        );
        let mut s = spec("https://svc/x");
        s.ca_file = Some("/nonexistent/ca.pem".into());
        let err = ForwardTarget::new(s).expect_err("no such file").to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let mut s = spec("https://svc/x");
        s.ca_file = Some("/etc/hostname".into());
        let err = ForwardTarget::new(s).expect_err("not PEM").to_string();
        assert!(err.contains("no PEM certificate"), "{err}");
        let mut s = spec("http://svc/x");
        s.secret = Some("whsec_!!".into());
        assert!(
            ForwardTarget::new(s).is_err(),
            "a secret that is not base64"
        );
    }
}
