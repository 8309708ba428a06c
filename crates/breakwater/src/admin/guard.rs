//! Keeps browsers from driving the admin API: a page the operator opens
//! can make the browser send requests to `127.0.0.1:9090`, and with no
//! token set (the loopback default) nothing else stops them.
//!
//! - **Cross-site writes**: a state-changing request (anything but GET and
//!   HEAD) is refused when it carries a foreign `Origin` (neither loopback
//!   nor this listener's own `Host`: the dashboard's calls are same-origin), a
//!   `Sec-Fetch-Site: cross-site`, or a content type an HTML form can send
//!   without a CORS preflight (`application/x-www-form-urlencoded`,
//!   `multipart/form-data`, `text/plain`). The CLI sends none of these.
//! - **DNS rebinding**: with no token, every request's `Host` must name a
//!   loopback address (or `localhost`), so a name an attacker points at
//!   127.0.0.1 does not reach the API.

use std::net::IpAddr;

use http::{HeaderMap, Method, header};

/// Why a request is refused, for the error's detail.
pub(crate) fn refuse(
    method: &Method,
    headers: &HeaderMap,
    token_set: bool,
) -> Option<&'static str> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if !token_set && !text(header::HOST).is_some_and(is_loopback_authority) {
        return Some("the Host header does not name this loopback listener");
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return None;
    }
    if let Some(origin) = text(header::ORIGIN) {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        let same_origin = authority
            .zip(text(header::HOST))
            .is_some_and(|(a, host)| a.eq_ignore_ascii_case(host));
        if !same_origin && !authority.is_some_and(is_loopback_authority) {
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

/// Whether `authority` (`host[:port]`) names a loopback host, on any port
/// (a tunnel, `ssh -L 19090:...`, names its own; the port adds nothing
/// against a rebound name).
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        // [v6]:port
        rest.split_once(']').map_or(rest, |(h, _)| h)
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
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
        assert_eq!(refuse(&Method::POST, &cli, false), None);
        assert_eq!(refuse(&Method::GET, &cli, false), None);
        let form = headers(&[
            ("host", "127.0.0.1:9090"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        assert!(refuse(&Method::POST, &form, false).is_some());
        let foreign = headers(&[
            ("host", "127.0.0.1:9090"),
            ("origin", "https://evil.example"),
        ]);
        assert!(refuse(&Method::POST, &foreign, false).is_some());
        let same = headers(&[
            ("host", "localhost:9090"),
            ("origin", "http://localhost:9090"),
        ]);
        assert_eq!(refuse(&Method::POST, &same, false), None);
        // The dashboard on a listener beyond loopback (token set) calls
        // its own origin.
        let own = headers(&[
            ("host", "10.0.0.5:9090"),
            ("origin", "http://10.0.0.5:9090"),
        ]);
        assert_eq!(refuse(&Method::POST, &own, true), None);
        let other = headers(&[
            ("host", "10.0.0.5:9090"),
            ("origin", "http://10.0.0.6:9090"),
        ]);
        assert!(refuse(&Method::POST, &other, true).is_some());
    }

    #[test]
    fn a_rebound_name_is_refused_without_a_token() {
        let rebound = headers(&[("host", "evil.example:9090")]);
        assert!(refuse(&Method::GET, &rebound, false).is_some());
        assert_eq!(
            refuse(&Method::GET, &rebound, true),
            None,
            "the token guards"
        );
        let v6 = headers(&[("host", "[::1]:9090")]);
        assert_eq!(refuse(&Method::GET, &v6, false), None);
        let tunnel = headers(&[("host", "localhost:19090")]);
        assert_eq!(
            refuse(&Method::GET, &tunnel, false),
            None,
            "a tunnel's port"
        );
    }
}
