//! Maps PostgreSQL and pool errors to a [`FailureClass`] and a stable kind.
//!
//! The rule of thumb: if waiting and retrying could make the error go away
//! (locks, timeouts, saturation, a lost connection), it is a *dependency*
//! failure and feeds the breaker; if the same message would fail the same
//! way every time (a constraint, bad data), it is *permanent* and goes to
//! the DLQ. Class 42 (syntax error, undefined table or column) is a bug in
//! the configured SQL rather than in the message; it is still classified
//! permanent (`sql`), so a broken statement dead-letters messages instead of
//! tripping the breaker: operators replay them from the DLQ after fixing
//! the config; so is the rest of class 55 but the lock timeout and "object
//! in use". Errors raised by triggers and routines (classes P0, 09, 27, 38,
//! 39) and limits a message's data passes (54, e.g. an index row too
//! large) are permanent too. Unknown codes default to *dependency*:
//! retrying an unknown error is safer than dropping the message into the
//! DLQ.

use std::error::Error as _;

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::error::DbError;

use crate::codes::*;
use crate::{FailureClass, SinkError};

/// The class and kind for a SQLSTATE.
pub(crate) fn classify_sqlstate(code: &str) -> (FailureClass, &'static str) {
    use FailureClass::{Dependency, Permanent};
    match code {
        LOCK_NOT_AVAILABLE => return (Dependency, "lock_timeout"),
        QUERY_CANCELED => return (Dependency, "statement_timeout"),
        DEADLOCK_DETECTED => return (Dependency, "deadlock"),
        SERIALIZATION_FAILURE => return (Dependency, "serialization"),
        TRANSACTION_INTEGRITY_CONSTRAINT_VIOLATION => return (Permanent, "constraint"),
        TOO_MANY_CONNECTIONS => return (Dependency, "too_many_connections"),
        ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW => return (Dependency, "connection"),
        IDLE_IN_TRANSACTION_SESSION_TIMEOUT => return (Dependency, "connection"),
        // Not a lock kind: the worker parks a key only on lock trouble.
        OBJECT_IN_USE => return (Dependency, "object_in_use"),
        _ => {}
    }
    match code.get(..2).unwrap_or("") {
        CLASS_CONNECTION_EXCEPTION | CLASS_OPERATOR_INTERVENTION => (Dependency, "connection"),
        CLASS_INTEGRITY_CONSTRAINT_VIOLATION | CLASS_WITH_CHECK_OPTION => (Permanent, "constraint"),
        CLASS_DATA_EXCEPTION | CLASS_CARDINALITY_VIOLATION | CLASS_PROGRAM_LIMIT_EXCEEDED => {
            (Permanent, "data")
        }
        // The rest of class 55 (e.g. 55000, an UPDATE on a published table
        // without a replica identity) fails the same way every time.
        CLASS_SYNTAX_OR_ACCESS
        | CLASS_FEATURE_NOT_SUPPORTED
        | CLASS_OBJECT_NOT_IN_PREREQUISITE_STATE => (Permanent, "sql"),
        CLASS_PLPGSQL_ERROR
        | CLASS_TRIGGERED_ACTION
        | CLASS_TRIGGERED_DATA_CHANGE
        | CLASS_EXTERNAL_ROUTINE
        | CLASS_EXTERNAL_ROUTINE_INVOCATION => (Permanent, "raised"),
        CLASS_TRANSACTION_ROLLBACK => (Dependency, "serialization"),
        CLASS_INSUFFICIENT_RESOURCES | CLASS_SYSTEM_ERROR => (Dependency, "resources"),
        _ => (Dependency, "database"),
    }
}

fn db_message(db: &DbError) -> String {
    let mut message = db.message().to_owned();
    if let Some(detail) = db.detail() {
        message.push_str(" (");
        message.push_str(detail);
        message.push(')');
    }
    if let Some(constraint) = db.constraint() {
        message.push_str(" [constraint ");
        message.push_str(constraint);
        message.push(']');
    }
    message
}

/// Classifies an error from a query.
pub(crate) fn classify(err: &tokio_postgres::Error) -> SinkError {
    if let Some(db) = err.as_db_error() {
        let code = db.code().code();
        let (class, kind) = classify_sqlstate(code);
        return SinkError {
            class,
            kind,
            code: Some(code.to_owned()),
            message: db_message(db),
            retry_after: None,
            target: None,
        };
    }
    if let Some(code) = err.code() {
        let (class, kind) = classify_sqlstate(code.code());
        return SinkError {
            class,
            kind,
            code: Some(code.code().to_owned()),
            message: err.to_string(),
            retry_after: None,
            target: None,
        };
    }
    let message = error_chain(err);
    if err.is_closed() || has_io_source(err) {
        return SinkError::dependency("connection", message);
    }
    if message.starts_with("error serializing parameter") {
        return SinkError::permanent("data", message);
    }
    // Protocol errors, timeouts while connecting, unexpected messages:
    // all about the link to the database, none about the payload.
    SinkError::dependency("connection", message)
}

/// Classifies a failure to get a connection from the pool. Every one is a
/// dependency failure: even an authentication error or a missing database
/// means nothing can be applied until the database side is fixed.
pub(crate) fn classify_pool(err: PoolError) -> SinkError {
    match err {
        PoolError::Timeout(TimeoutType::Wait) => SinkError::dependency(
            "pool_timeout",
            "timed out waiting for a pooled connection (pool exhausted)",
        ),
        // Not `connection`: a slow database that is up times out new
        // connections too, and a reachability check would not clear it.
        PoolError::Timeout(TimeoutType::Create) => {
            SinkError::dependency("connect_timeout", "timed out opening a connection")
        }
        PoolError::Timeout(TimeoutType::Recycle) => {
            SinkError::dependency("connection", "timed out checking a pooled connection")
        }
        PoolError::Backend(e) => {
            let mut classified = classify(&e);
            // Refused at login (a rotated password, a missing database):
            // the database answers, so not `connection`.
            if classified.class == FailureClass::Permanent {
                classified.class = FailureClass::Dependency;
                classified.kind = "session";
            }
            classified
        }
        other => SinkError::dependency("connection", other.to_string()),
    }
}

fn has_io_source(err: &tokio_postgres::Error) -> bool {
    let mut source = err.source();
    while let Some(e) = source {
        if e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// `outer: inner: innermost`, so "connection refused" is not lost behind
/// "error connecting to server".
fn error_chain(err: &tokio_postgres::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = e.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureClass::{Dependency, Permanent};

    #[test]
    fn sqlstates_map_to_classes() {
        let cases = [
            ("55P03", Dependency, "lock_timeout"),
            ("57014", Dependency, "statement_timeout"),
            ("40P01", Dependency, "deadlock"),
            ("40001", Dependency, "serialization"),
            ("53300", Dependency, "too_many_connections"),
            ("57P01", Dependency, "connection"),
            ("57P02", Dependency, "connection"),
            ("57P03", Dependency, "connection"),
            ("08006", Dependency, "connection"),
            ("08001", Dependency, "connection"),
            ("25P03", Dependency, "connection"),
            ("23505", Permanent, "constraint"),
            ("23514", Permanent, "constraint"),
            ("23502", Permanent, "constraint"),
            ("40002", Permanent, "constraint"),
            ("22P02", Permanent, "data"),
            ("22003", Permanent, "data"),
            ("21000", Permanent, "data"),
            ("42P01", Permanent, "sql"),
            ("42703", Permanent, "sql"),
            ("42601", Permanent, "sql"),
            ("P0001", Permanent, "raised"),
            ("09000", Permanent, "raised"),
            ("27000", Permanent, "raised"),
            ("38001", Permanent, "raised"),
            ("39P01", Permanent, "raised"),
            ("44000", Permanent, "constraint"),
            ("54000", Permanent, "data"),
            ("55000", Permanent, "sql"),
            ("55P04", Permanent, "sql"),
            ("55006", Dependency, "object_in_use"),
            ("53100", Dependency, "resources"),
            ("XX000", Dependency, "database"),
        ];
        for (code, class, kind) in cases {
            assert_eq!(classify_sqlstate(code), (class, kind), "{code}");
        }
    }

    #[test]
    fn pool_wait_timeout_is_a_dependency_failure() {
        let err = classify_pool(PoolError::Timeout(TimeoutType::Wait));
        assert_eq!((err.class, err.kind), (Dependency, "pool_timeout"));
        let err = classify_pool(PoolError::Closed);
        assert_eq!((err.class, err.kind), (Dependency, "connection"));
    }
}
