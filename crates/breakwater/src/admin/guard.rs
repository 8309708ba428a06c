//! Keeps browsers from driving the admin API: a page the operator opens
//! can make the browser send requests to `127.0.0.1:9090`, and with no
//! token set (the loopback default) nothing else stops them.
//!
//! - **Writes from another origin**: a state-changing request (anything
//!   but GET and HEAD) is refused when its `Origin` is not the listener's
//!   own, its `Sec-Fetch-Site` is anything but `same-origin` or `none`, or
//!   it has no content type or one an HTML form or a `no-cors` fetch can
//!   send without a CORS preflight (`application/x-www-form-urlencoded`,
//!   `multipart/form-data`, `text/plain`). Its own origin is scheme, host
//!   and port: the `Host` the request was sent to (the page the browser
//!   shows came from there: the dashboard, or a tunnel's port), or the
//!   listener's address, under `localhost` too when that reaches it. A
//!   page on another port of the same host (`http://127.0.0.1:17080`) is
//!   another origin, though browsers call it `same-site`. The CLI and the
//!   dashboard send `Content-Type: application/json` with every write; a
//!   page of another origin cannot without a preflight, which this API
//!   never answers.
//! - **DNS rebinding**: with no token, every request's `Host` must name a
//!   loopback address (or `localhost`), so a name an attacker points at
//!   127.0.0.1 does not reach the API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::{HeaderMap, Method, header};

/// What the admin listener takes as a browser's request of its own.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    token_set: bool,
    /// The origins the listener's own address gives, lower case
    /// (`http://127.0.0.1:9090`, `http://localhost:9090`).
    own_origins: Vec<String>,
}

impl Guard {
    /// The guard of a listener bound to `listen`, with or without a token.
    pub(crate) fn new(listen: SocketAddr, token_set: bool) -> Self {
        let port = listen.port();
        let mut hosts: Vec<String> = Vec::new();
        let mut add = |ip: IpAddr| {
            hosts.push(match ip {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            });
        };
        match listen.ip() {
            // Bound to every address: reachable on loopback too (IPv6's
            // unspecified address takes IPv4 as well on a dual-stack host).
            IpAddr::V4(v4) if v4.is_unspecified() => add(Ipv4Addr::LOCALHOST.into()),
            IpAddr::V6(v6) if v6.is_unspecified() => {
                add(Ipv4Addr::LOCALHOST.into());
                add(Ipv6Addr::LOCALHOST.into());
            }
            ip => add(ip),
        }
        if listen.ip().is_loopback() || listen.ip().is_unspecified() {
            hosts.push("localhost".to_owned());
        }
        Self {
            token_set,
            own_origins: hosts
                .into_iter()
                .map(|h| format!("http://{h}:{port}"))
                .collect(),
        }
    }

    /// Why a request is refused, for the error's detail.
    pub(crate) fn refuse(&self, method: &Method, headers: &HeaderMap) -> Option<&'static str> {
        let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let host = text(header::HOST);
        if !self.token_set && !host.is_some_and(is_loopback_authority) {
            return Some("the Host header does not name this loopback listener");
        }
        if matches!(*method, Method::GET | Method::HEAD) {
            return None;
        }
        if headers.contains_key(header::ORIGIN) {
            let own = text(header::ORIGIN).is_some_and(|o| self.is_own_origin(o, host));
            if !own {
                return Some("a request from another origin (Origin)");
            }
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            let ours = site.to_str().is_ok_and(|v| {
                v.eq_ignore_ascii_case("same-origin") || v.eq_ignore_ascii_case("none")
            });
            if !ours {
                return Some("a request from another origin (Sec-Fetch-Site)");
            }
        }
        match headers.get(header::CONTENT_TYPE) {
            None => Some(
                "a state change without a content type, which any web page can send                  (send Content-Type: application/json)",
            ),
            Some(ct) if is_form_type(ct.as_bytes()) => {
                Some("a form's content type, which any web page can send")
            }
            Some(_) => None,
        }
    }

    /// Whether `origin` (`scheme://host[:port]`) is the listener's own: the
    /// authority the request was sent to (`host`), or one of its address's.
    fn is_own_origin(&self, origin: &str, host: Option<&str>) -> bool {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        let sent_here = authority
            .zip(host)
            .is_some_and(|(a, host)| !a.is_empty() && a.eq_ignore_ascii_case(host));
        sent_here
            || self
                .own_origins
                .iter()
                .any(|o| o.eq_ignore_ascii_case(origin))
    }
}

/// Whether a content type is one a page can send without a preflight (a
/// CORS-safelisted one): its essence, before any `;`, in any case, spaces
/// around it ignored.
fn is_form_type(value: &[u8]) -> bool {
    let essence = value.split(|b| *b == b';').next().unwrap_or_default();
    let essence = essence.trim_ascii();
    [
        &b"application/x-www-form-urlencoded"[..],
        b"multipart/form-data",
        b"text/plain",
    ]
    .iter()
    .any(|form| essence.eq_ignore_ascii_case(form))
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

    fn loopback(token_set: bool) -> Guard {
        Guard::new("127.0.0.1:9090".parse().expect("addr"), token_set)
    }

    const JSON: (&str, &str) = ("content-type", "application/json");

    #[test]
    fn the_cli_passes_and_a_page_does_not() {
        let guard = loopback(false);
        let cli = headers(&[("host", "127.0.0.1:9090"), JSON]);
        assert_eq!(guard.refuse(&Method::POST, &cli), None);
        assert_eq!(guard.refuse(&Method::GET, &cli), None);
        let form = headers(&[
            ("host", "127.0.0.1:9090"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        assert!(guard.refuse(&Method::POST, &form).is_some());
        let foreign = headers(&[
            ("host", "127.0.0.1:9090"),
            ("origin", "https://evil.example"),
            JSON,
        ]);
        assert!(guard.refuse(&Method::POST, &foreign).is_some());
        let same = headers(&[
            ("host", "localhost:9090"),
            ("origin", "http://localhost:9090"),
            ("sec-fetch-site", "same-origin"),
            JSON,
        ]);
        assert_eq!(guard.refuse(&Method::POST, &same), None);
        // The dashboard on a listener beyond loopback (token set) calls
        // its own origin.
        let wide = Guard::new("0.0.0.0:9090".parse().expect("addr"), true);
        let own = headers(&[
            ("host", "10.0.0.5:9090"),
            ("origin", "http://10.0.0.5:9090"),
            JSON,
        ]);
        assert_eq!(wide.refuse(&Method::POST, &own), None);
        let other = headers(&[
            ("host", "10.0.0.5:9090"),
            ("origin", "http://10.0.0.6:9090"),
            JSON,
        ]);
        assert!(wide.refuse(&Method::POST, &other).is_some());
    }

    /// What Chrome sends for `fetch(admin + "/breaker/trip", {method:
    /// "POST", mode: "no-cors"})` from a page on another port of
    /// 127.0.0.1.
    #[test]
    fn a_page_on_another_loopback_port_is_another_origin() {
        let guard = loopback(false);
        let chrome = headers(&[
            ("host", "127.0.0.1:9090"),
            ("origin", "http://127.0.0.1:17080"),
            ("sec-fetch-site", "same-site"),
            ("sec-fetch-mode", "no-cors"),
        ]);
        assert!(guard.refuse(&Method::POST, &chrome).is_some());
        for origin in [
            "http://127.0.0.1:17080",
            "http://localhost:17080",
            "http://[::1]:9090",
            "https://127.0.0.1:9091",
            "null",
        ] {
            let h = headers(&[("host", "127.0.0.1:9090"), ("origin", origin), JSON]);
            assert!(guard.refuse(&Method::POST, &h).is_some(), "{origin}");
        }
        // The listener's own address, under the name too.
        for origin in ["http://127.0.0.1:9090", "http://LOCALHOST:9090"] {
            let h = headers(&[("host", "127.0.0.1:9090"), ("origin", origin), JSON]);
            assert_eq!(guard.refuse(&Method::POST, &h), None, "{origin}");
        }
        // Sec-Fetch-Site alone, with a JSON type.
        for site in ["same-site", "cross-site", "bogus"] {
            let h = headers(&[("host", "127.0.0.1:9090"), ("sec-fetch-site", site), JSON]);
            assert!(guard.refuse(&Method::POST, &h).is_some(), "{site}");
        }
        for site in ["same-origin", "none"] {
            let h = headers(&[("host", "127.0.0.1:9090"), ("sec-fetch-site", site), JSON]);
            assert_eq!(guard.refuse(&Method::POST, &h), None, "{site}");
        }
        // Reads stay open: a page of another origin cannot read the answer.
        assert_eq!(guard.refuse(&Method::GET, &chrome), None);
    }

    #[test]
    fn a_write_without_a_content_type_or_with_a_form_type_is_refused() {
        let guard = loopback(false);
        let bare = headers(&[("host", "127.0.0.1:9090")]);
        assert!(guard.refuse(&Method::POST, &bare).is_some());
        assert!(guard.refuse(&Method::DELETE, &bare).is_some());
        for ct in [
            "text/plain",
            "TEXT/PLAIN; charset=utf-8",
            " multipart/form-data ; boundary=x",
            "application/x-www-form-urlencoded",
        ] {
            let h = headers(&[("host", "127.0.0.1:9090"), ("content-type", ct)]);
            assert!(guard.refuse(&Method::POST, &h).is_some(), "{ct}");
        }
        let json = headers(&[
            ("host", "127.0.0.1:9090"),
            ("content-type", "application/json; charset=utf-8"),
        ]);
        assert_eq!(guard.refuse(&Method::POST, &json), None);
    }

    #[test]
    fn the_own_origins_follow_the_address_the_listener_is_bound_to() {
        let own = |listen: &str| Guard::new(listen.parse().expect("addr"), false).own_origins;
        assert_eq!(
            own("127.0.0.1:9090"),
            ["http://127.0.0.1:9090", "http://localhost:9090"]
        );
        assert_eq!(
            own("[::1]:9090"),
            ["http://[::1]:9090", "http://localhost:9090"]
        );
        assert_eq!(
            own("[::]:9090"),
            [
                "http://127.0.0.1:9090",
                "http://[::1]:9090",
                "http://localhost:9090"
            ]
        );
        assert_eq!(own("10.0.0.5:9090"), ["http://10.0.0.5:9090"]);
    }

    #[test]
    fn a_rebound_name_is_refused_without_a_token() {
        let rebound = headers(&[("host", "evil.example:9090")]);
        assert!(loopback(false).refuse(&Method::GET, &rebound).is_some());
        assert_eq!(
            loopback(true).refuse(&Method::GET, &rebound),
            None,
            "the token guards"
        );
        let v6 = headers(&[("host", "[::1]:9090")]);
        assert_eq!(loopback(false).refuse(&Method::GET, &v6), None);
        let tunnel = headers(&[("host", "localhost:19090")]);
        assert_eq!(
            loopback(false).refuse(&Method::GET, &tunnel),
            None,
            "a tunnel's port"
        );
        // Through the tunnel, the dashboard's writes are same-origin.
        let tunnelled = headers(&[
            ("host", "localhost:19090"),
            ("origin", "http://localhost:19090"),
            ("sec-fetch-site", "same-origin"),
            JSON,
        ]);
        assert_eq!(loopback(false).refuse(&Method::POST, &tunnelled), None);
    }
}
