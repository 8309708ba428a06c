//! [`SinkSettings`]: how to reach the sink database and the guardrails every
//! transaction runs under (lock and statement timeouts, idle-in-transaction
//! timeout, a bounded pool with a short acquire timeout).
//!
//! Kept apart from the backends so the service can build and validate
//! settings from its config without touching a database.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::SinkSetupError;

/// Where the sink is and the guardrails it applies.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkSettings {
    /// `postgres://user@host/db`, `postgresql://...`, `sqlite://path` or
    /// `sqlite::memory:`.
    pub url: String,
    /// `SET LOCAL lock_timeout` for PostgreSQL, `busy_timeout` for SQLite.
    pub lock_timeout: Duration,
    /// `SET LOCAL statement_timeout`; must be larger than `lock_timeout`,
    /// or the lock timeout never fires.
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout` of every pooled session.
    pub idle_in_transaction_timeout: Duration,
    /// Most connections the apply pool opens.
    pub pool_max: usize,
    /// Longest wait for a pooled connection (and to open one).
    pub acquire_timeout: Duration,
    /// Which lock waiters [`crate::Sink::lock_snapshot`] counts.
    pub lock_waiters_scope: LockWaitersScope,
    /// Per source, where its events carry their version for the
    /// stale-event guard (`json:/pointer` or `header:Name`); a source not
    /// named has no guard.
    pub versions: BTreeMap<String, String>,
}

/// Which sessions waiting on a lock the PostgreSQL sink reports to the
/// breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockWaitersScope {
    /// Those that concern Breakwater: its own sessions (by
    /// `application_name`), sessions its sessions block, and sessions
    /// waiting for a relation-level lock on a relation its sessions hold or
    /// wait for a lock on (a row wait behind another application's
    /// transaction is not seen). Another application's lock waits elsewhere
    /// in the database do not count.
    #[default]
    Breakwater,
    /// Every session of the database waiting on a lock.
    Database,
}

impl SinkSettings {
    /// Settings for `url` with the default guardrails.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            lock_timeout: Duration::from_millis(1000),
            statement_timeout: Duration::from_millis(5000),
            idle_in_transaction_timeout: Duration::from_secs(10),
            pool_max: 20,
            acquire_timeout: Duration::from_secs(2),
            lock_waiters_scope: LockWaitersScope::default(),
            versions: BTreeMap::new(),
        }
    }

    /// Checks the guardrails make sense together.
    pub fn validate(&self) -> Result<(), SinkSetupError> {
        let invalid = |m: String| Err(SinkSetupError::Settings(m));
        if self.lock_timeout.is_zero() {
            return invalid("lock_timeout must be larger than 0".into());
        }
        if self.statement_timeout <= self.lock_timeout {
            return invalid(format!(
                "statement_timeout ({} ms) must be larger than lock_timeout ({} ms)",
                self.statement_timeout.as_millis(),
                self.lock_timeout.as_millis()
            ));
        }
        if self.idle_in_transaction_timeout.is_zero() {
            return invalid("idle_in_transaction_timeout must be larger than 0".into());
        }
        if self.pool_max == 0 {
            return invalid("pool_max must be at least 1".into());
        }
        if self.acquire_timeout.is_zero() {
            return invalid("acquire_timeout must be larger than 0".into());
        }
        Ok(())
    }
}

impl Default for SinkSettings {
    fn default() -> Self {
        Self::new("sqlite://data/breakwater.db")
    }
}

impl fmt::Debug for SinkSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkSettings")
            .field("url", &redact_url(&self.url))
            .field("lock_timeout", &self.lock_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field(
                "idle_in_transaction_timeout",
                &self.idle_in_transaction_timeout,
            )
            .field("pool_max", &self.pool_max)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("lock_waiters_scope", &self.lock_waiters_scope)
            .field("versions", &self.versions)
            .finish()
    }
}

/// Query keys whose value is a secret to libpq or tokio-postgres:
/// `password`, `sslpassword` (libpq's, for an encrypted client key) and
/// `oauth_client_secret` (libpq 18's). Compared as the drivers read a key:
/// percent-decoded, and here whatever its case.
const SECRET_QUERY_KEYS: [&str; 3] = ["password", "sslpassword", "oauth_client_secret"];

/// `url` (a database's or a broker's) with its password, if any, replaced
/// by `<redacted>`: the one in the user info and the value of every query
/// key a driver reads as a secret (`password`, `sslpassword`,
/// `oauth_client_secret`, percent-encoded or not: both drivers decode a key
/// before they read it, so `pass%77ord` is `password`). The user info ends,
/// as libpq reads it, at the first `@` met before any `/`, or past that at
/// the last `@` before the next `/`, so a password holding `?` or `@` is
/// hidden whole. The other query parameters stay readable.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let start = scheme_end + 3;
    let rest = &url[start..];
    // Where the user info ends, as libpq reads it (the last `@` of the
    // authority) and as tokio-postgres does (the first `@` anywhere): the
    // later of the two, so whatever either driver would send as a
    // password is hidden.
    let libpq = rest
        .find(['@', '/'])
        .filter(|&i| rest[i..].starts_with('@'))
        .map(|first| {
            let authority_end = rest[first..].find('/').map_or(rest.len(), |i| first + i);
            rest[..authority_end].rfind('@').unwrap_or(first)
        });
    let tokio_postgres = rest.find('@');
    redacted(
        &url[..start],
        rest,
        libpq.max(tokio_postgres),
        HiddenValues::DriverSecrets,
    )
}

/// An HTTP URL (a forward target's, or a redirect's `Location`, which may
/// be a path alone) for people: the user info's password and the value of
/// every query parameter replaced by `<redacted>`, the names kept (a
/// parameter without a value is hidden whole). A target takes tokens in
/// any parameter, so none is shown. The user info ends where the HTTP
/// client ends it (RFC 3986: the last `@` before the first `/`, `?` or
/// `#`); when what precedes that `/`, `?` or `#` cannot be a host and port
/// (`user:pa/ss@host`, a password whose `/` was not written `%2F`), at the
/// first `@`, so what was meant as a password is hidden all the same.
pub fn redact_http_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        // A path (`/next?token=...`): no user info.
        None => ("", url),
    };
    let userinfo_end = if scheme.is_empty() {
        None
    } else {
        http_userinfo_end(rest)
    };
    redacted(scheme, rest, userinfo_end, HiddenValues::All)
}

/// Where the user info of `rest` (an HTTP URL past `scheme://`) ends: see
/// [`redact_http_url`].
fn http_userinfo_end(rest: &str) -> Option<usize> {
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if let Some(at) = authority.rfind('@') {
        return Some(at);
    }
    // `[v6]:port` or `host:port`: the port, if any, must be digits.
    let host_port = authority
        .rsplit_once(']')
        .map_or(authority, |(_, after)| after);
    let port_is_digits = host_port
        .rsplit_once(':')
        .is_none_or(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()));
    if port_is_digits { None } else { rest.find('@') }
}

/// Which query values a redacted URL hides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HiddenValues {
    /// Those of the keys a database driver reads as secrets
    /// ([`SECRET_QUERY_KEYS`]); a parameter without a value stays.
    DriverSecrets,
    /// Every value, and every parameter without one.
    All,
}

impl HiddenValues {
    fn hides(self, key: &str) -> bool {
        match self {
            Self::All => true,
            Self::DriverSecrets => {
                let key = percent_decoded(key);
                SECRET_QUERY_KEYS
                    .iter()
                    .any(|secret| key.eq_ignore_ascii_case(secret))
            }
        }
    }
}

/// `scheme` and `rest` again, with the password of the user info (the
/// part of `rest` before `userinfo_end`) and the query values `hidden`
/// says replaced by `<redacted>`.
fn redacted(scheme: &str, rest: &str, userinfo_end: Option<usize>, hidden: HiddenValues) -> String {
    let mut out = String::with_capacity(scheme.len() + rest.len());
    out.push_str(scheme);
    let mut tail = rest;
    if let Some(at) = userinfo_end {
        let userinfo = &rest[..at];
        match userinfo.find(':') {
            Some(colon) => {
                out.push_str(&userinfo[..colon]);
                out.push_str(":<redacted>");
            }
            None => out.push_str(userinfo),
        }
        tail = &rest[at..];
    }
    let Some((path, query)) = tail.split_once('?') else {
        out.push_str(tail);
        return out;
    };
    out.push_str(path);
    out.push('?');
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((key, _)) if hidden.hides(key) => {
                out.push_str(key);
                out.push_str("=<redacted>");
            }
            // A bare parameter: a secret where every value may be one.
            None if !pair.is_empty() && hidden == HiddenValues::All => {
                out.push_str("<redacted>");
            }
            _ => out.push_str(pair),
        }
    }
    out
}

/// `s` percent-decoded (`%XX` as the byte it spells, anything else as it
/// is), read as UTF-8 with invalid sequences replaced.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits: below 256.
            out.push(u8::try_from(high * 16 + low).unwrap_or(u8::MAX));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whole milliseconds, at least 1, as PostgreSQL settings take them.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let s = SinkSettings::new("postgres://localhost/db");
        assert_eq!(s.lock_timeout, Duration::from_millis(1000));
        assert_eq!(s.statement_timeout, Duration::from_millis(5000));
        assert_eq!(s.pool_max, 20);
        s.validate().expect("defaults are valid");
    }

    #[test]
    fn statement_timeout_must_exceed_lock_timeout() {
        let mut s = SinkSettings::new("postgres://localhost/db");
        s.statement_timeout = s.lock_timeout;
        let err = s.validate().expect_err("equal timeouts are rejected");
        assert!(err.to_string().contains("statement_timeout"), "{err}");
    }

    #[test]
    fn debug_redacts_the_password() {
        let s = SinkSettings::new("postgres://bw:hunter2@db:5432/app");
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("postgres://bw:<redacted>@db:5432/app"),
            "{shown}"
        );
    }

    #[test]
    fn every_place_a_password_can_be_is_redacted() {
        assert_eq!(redact_url("sqlite://data/x.db"), "sqlite://data/x.db");
        assert_eq!(redact_url("postgres://bw@db/app"), "postgres://bw@db/app");
        assert_eq!(
            redact_url("postgres://bw:p@s?s@db:5432/app?application_name=a@b"),
            "postgres://bw:<redacted>@db:5432/app?application_name=a@b"
        );
        // tokio-postgres reads the user info up to the first `@`, so here
        // it would send "b" as the password: hidden.
        assert_eq!(
            redact_url("postgres://db/app?application_name=a:b@c"),
            "postgres://db/app?application_name=a:<redacted>@c"
        );
        // A `/` in the password: the driver still reads it as one.
        let driver: tokio_postgres::Config = "postgres://u:ab/cd@host/db".parse().expect("url");
        assert_eq!(driver.get_password(), Some(&b"ab/cd"[..]));
        assert_eq!(
            redact_url("postgres://u:ab/cd@host/db"),
            "postgres://u:<redacted>@host/db"
        );
        assert_eq!(
            redact_url("postgres://u@host/db?sslpassword=k3y&sslmode=require"),
            "postgres://u@host/db?sslpassword=<redacted>&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://bw@db/app?sslmode=require&password=hunter2"),
            "postgres://bw@db/app?sslmode=require&password=<redacted>"
        );
    }

    #[test]
    fn a_secret_key_is_recognised_as_the_driver_decodes_it() {
        // tokio-postgres percent-decodes a key before it reads it.
        let url = "postgres://u@host/db?application_name=a&pass%77ord=s3cret";
        let driver: tokio_postgres::Config = url.parse().expect("url");
        assert_eq!(driver.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(
            redact_url(url),
            "postgres://u@host/db?application_name=a&pass%77ord=<redacted>"
        );
        assert_eq!(
            redact_url(
                "postgres://u@h/db?%70%61%73%73%77%6F%72%64=a&%73slpassword=b\
                 &oauth_client_secret=c&PASSWORD=d&sslmode=require"
            ),
            "postgres://u@h/db?%70%61%73%73%77%6F%72%64=<redacted>&%73slpassword=<redacted>\
             &oauth_client_secret=<redacted>&PASSWORD=<redacted>&sslmode=require"
        );
        // Not a secret key: `%` not followed by two hex digits, a longer
        // name.
        assert_eq!(
            redact_url("postgres://u@h/db?pass%7word=a&passwords=b"),
            "postgres://u@h/db?pass%7word=a&passwords=b"
        );
        assert_eq!(percent_decoded("a%2Fb%zz%4"), "a/b%zz%4");
    }

    #[test]
    fn an_http_url_shows_neither_its_password_nor_its_query_values() {
        assert_eq!(
            redact_http_url("http://user:PASSWORD@host:8080/hook?token=TOKEN&v=2"),
            "http://user:<redacted>@host:8080/hook?token=<redacted>&v=<redacted>"
        );
        assert_eq!(
            redact_http_url("https://svc/hooks/stripe"),
            "https://svc/hooks/stripe"
        );
        assert_eq!(redact_http_url("https://tok@svc/x"), "https://tok@svc/x");
        // An `@` in the query or the path is not the user info's.
        assert_eq!(
            redact_http_url("http://svc:7000/users/@me?mail=a@b&key"),
            "http://svc:7000/users/@me?mail=<redacted>&<redacted>"
        );
        assert_eq!(
            redact_http_url("http://[::1]:7000/@x?a=1"),
            "http://[::1]:7000/@x?a=<redacted>"
        );
        // The client's user info runs to the authority's last `@`.
        assert_eq!(
            redact_http_url("http://u:p@ss@host/x"),
            "http://u:<redacted>@host/x"
        );
        // A `/` or `?` left unescaped in a password ends the authority for
        // the client (which reads `pa` as a port): hidden all the same.
        assert_eq!(
            redact_http_url("http://u:pa/ss@host/x?t=1"),
            "http://u:<redacted>@host/x?t=<redacted>"
        );
        assert_eq!(
            redact_http_url("http://u:pa?ss@host/x"),
            "http://u:<redacted>@host/x"
        );
        // A redirect's `Location` may be a path alone.
        assert_eq!(
            redact_http_url("/next?session=abc&&x="),
            "/next?session=<redacted>&&x=<redacted>"
        );
        assert_eq!(redact_http_url("/a@b:c"), "/a@b:c");
    }
}
