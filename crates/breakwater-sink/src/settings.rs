//! [`SinkSettings`]: how to reach the sink database and the guardrails every
//! transaction runs under (lock and statement timeouts, idle-in-transaction
//! timeout, a bounded pool with a short acquire timeout).
//!
//! Kept apart from the backends so the service can build and validate
//! settings from its config without touching a database.

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
            .finish()
    }
}

/// `url` with its password, if any, replaced by `<redacted>`: the one in
/// the user info and a `password=` query parameter (libpq reads one there
/// too). The user info ends, as libpq reads it, at the first `@` met before
/// any `/`, or past that at the last `@` before the next `/`, so a password
/// holding `?` or `@` is hidden whole.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let start = scheme_end + 3;
    let rest = &url[start..];
    let mut out = String::with_capacity(url.len());
    let mut tail = rest;
    out.push_str(&url[..start]);
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
    if let Some(at) = libpq.max(tokio_postgres) {
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
    match tail.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _))
                        if key.eq_ignore_ascii_case("password")
                            || key.eq_ignore_ascii_case("sslpassword") =>
                    {
                        format!("{key}=<redacted>")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(tail),
    }
    out
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
}
