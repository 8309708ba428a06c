//! SQLSTATE codes the PostgreSQL sink classifies, in one place.
//!
//! The classifier in `postgres::classify` matches on these constants (and on
//! two-character classes) rather than on scattered string literals, so the
//! mapping from a database error to a [`crate::FailureClass`] can be read
//! and reviewed in one file.

/// `lock_not_available`: `lock_timeout` expired (or `NOWAIT`).
pub const LOCK_NOT_AVAILABLE: &str = "55P03";
/// `query_canceled`: `statement_timeout` expired (or a cancel request).
pub const QUERY_CANCELED: &str = "57014";
/// `deadlock_detected`.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// `serialization_failure`.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// `transaction_integrity_constraint_violation` (a deferred constraint).
pub const TRANSACTION_INTEGRITY_CONSTRAINT_VIOLATION: &str = "40002";
/// `too_many_connections`.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// `admin_shutdown`: the server is shutting down (or the backend was
/// terminated).
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// `crash_shutdown`.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// `cannot_connect_now`: the server is starting up or in recovery.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// `idle_in_transaction_session_timeout`: the server ended our session.
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";

/// Class 08: connection exception.
pub const CLASS_CONNECTION_EXCEPTION: &str = "08";
/// Class 21: cardinality violation (a scalar subquery returned many rows).
pub const CLASS_CARDINALITY_VIOLATION: &str = "21";
/// Class 22: data exception (invalid input syntax, out of range, ...).
pub const CLASS_DATA_EXCEPTION: &str = "22";
/// Class 23: integrity constraint violation (unique, check, not null, FK).
pub const CLASS_INTEGRITY_CONSTRAINT_VIOLATION: &str = "23";
/// Class 40: transaction rollback.
pub const CLASS_TRANSACTION_ROLLBACK: &str = "40";
/// Class 42: syntax error or access rule violation (a configuration bug).
pub const CLASS_SYNTAX_OR_ACCESS: &str = "42";
/// Class 0A: feature not supported.
pub const CLASS_FEATURE_NOT_SUPPORTED: &str = "0A";
/// Class 53: insufficient resources (disk full, out of memory, ...).
pub const CLASS_INSUFFICIENT_RESOURCES: &str = "53";
/// Class 55: object not in prerequisite state (55P03, the lock timeout,
/// is matched on its own first).
pub const CLASS_OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55";
/// 55006: object in use (e.g. a table another session is altering).
pub const OBJECT_IN_USE: &str = "55006";
/// Class 09: triggered action exception.
pub const CLASS_TRIGGERED_ACTION: &str = "09";
/// Class 27: triggered data change violation.
pub const CLASS_TRIGGERED_DATA_CHANGE: &str = "27";
/// Class 38: external routine exception.
pub const CLASS_EXTERNAL_ROUTINE: &str = "38";
/// Class 39: external routine invocation exception.
pub const CLASS_EXTERNAL_ROUTINE_INVOCATION: &str = "39";
/// Class 44: `WITH CHECK OPTION` violation.
pub const CLASS_WITH_CHECK_OPTION: &str = "44";
/// Class 54: program limit exceeded (e.g. an index row too large).
pub const CLASS_PROGRAM_LIMIT_EXCEEDED: &str = "54";
/// Class 57: operator intervention.
pub const CLASS_OPERATOR_INTERVENTION: &str = "57";
/// Class 58: system error (I/O errors on the server).
pub const CLASS_SYSTEM_ERROR: &str = "58";
/// Class P0: PL/pgSQL error, e.g. `RAISE EXCEPTION` in a trigger.
pub const CLASS_PLPGSQL_ERROR: &str = "P0";
