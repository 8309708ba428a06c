//! Keeps browsers from driving the admin API: a page the operator opens
//! can make the browser send requests to `127.0.0.1:9090`, and with no
//! token set (the loopback default) nothing else stops them.
//!
//! - **Cross-site writes**: a state-changing request (anything but GET and
//!   HEAD) is refused when it carries a foreign `Origin`, a
//!   `Sec-Fetch-Site: cross-site`, or a content type an HTML form can send
//!   without a CORS preflight (`application/x-www-form-urlencoded`,
//!   `multipart/form-data`, `text/plain`). The CLI sends none of these.
//! - **DNS rebinding**: with no token, every request's `Host` must name a
//!   loopback address (or `localhost`) and the listener's port, so a name
//!   an attacker points at 127.0.0.1 does not reach the API.

use std::net::IpAddr;

use http::{HeaderMap, Method, header};

/// Why a request is refused, for the error's detail.
pub(crate) fn refuse(
    method: &Method,
    headers: &HeaderMap,
    port: u16,
    token_set: bool,
) -> Option<&'static str> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if !token_set && !text(header::HOST).is_some_and(|h| is_loopback_authority(h, port)) {
        return Some("the Host header does not name this loopback listener");
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return None;
    }
    if let Some(origin) = text(header::ORIGIN) {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if !authority.is_some_and(|a| is_loopback_authority(a, port)) {
            return Some("a cross-site request (foreign Origin)");
        }
    }
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"))
    {
        return Some("a cross-site request (Sec-Fetch-Site)");
    }
    if let Some(ct) = text(header::CONTENT_TYPE) {
        let media = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if matches!(
            media.as_str(),
            "application/x-www-form-urlencoded" | "multipart/form-data" | "text/plain"
        ) {
            return Some("a form's content type, which any web page can send");
        }
    }
    None
}

/// Whether `authority` (`host:port`) is a loopback host with `port`.
fn is_loopback_authority(authority: &str, port: u16) -> bool {
    let (host, given_port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h, p.parse::<u16>().ok())
        }
        _ => (authority, None),
    };
    // Without a port the browser meant 80: not this listener unless it is.
    if given_port.unwrap_or(80) != port {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn the_cli_passes_and_a_page_does_not() {
        let cli = headers(&[("host", "127.0.0.1:9090")]);
        assert_eq!(refuse(&Method::POST, &cli, 9090, false), None);
        assert_eq!(refuse(&Method::GET, &cli, 9090, false), None);
        let form = headers(&[
            ("host", "127.0.0.1:9090"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        assert!(refuse(&Method::POST, &form, 9090, false).is_some());
        let foreign = headers(&[
            ("host", "127.0.0.1:9090"),
            ("origin", "https://evil.example"),
        ]);
        assert!(refuse(&Method::POST, &foreign, 9090, false).is_some());
        let same = headers(&[
            ("host", "localhost:9090"),
            ("origin", "http://localhost:9090"),
        ]);
        assert_eq!(refuse(&Method::POST, &same, 9090, false), None);
    }

    #[test]
    fn a_rebound_name_is_refused_without_a_token() {
        let rebound = headers(&[("host", "evil.example:9090")]);
        assert!(refuse(&Method::GET, &rebound, 9090, false).is_some());
        assert_eq!(
            refuse(&Method::GET, &rebound, 9090, true),
            None,
            "the token guards"
        );
        let v6 = headers(&[("host", "[::1]:9090")]);
        assert_eq!(refuse(&Method::GET, &v6, 9090, false), None);
        let other_port = headers(&[("host", "127.0.0.1:8080")]);
        assert!(refuse(&Method::GET, &other_port, 9090, false).is_some());
    }
}
