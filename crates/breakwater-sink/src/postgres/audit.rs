//! What `breakwater doctor` reads from a live PostgreSQL: the timeouts the
//! sink's role gets by default (a plain session, without the `SET LOCAL`s
//! Breakwater adds to its own transactions), and the inbox's key.

use std::time::Duration;

use tokio_postgres::NoTls;

use super::INBOX_KEY;

/// A role's session defaults and the inbox as the database has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseAudit {
    /// `current_user` of the sink's URL.
    pub role: String,
    /// `SHOW lock_timeout` etc., in milliseconds (0: none).
    pub lock_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub idle_in_transaction_timeout_ms: u64,
    /// The inbox's primary key columns; `None` when there is no inbox table
    /// yet (the first `serve` creates it).
    pub inbox_key: Option<Vec<String>>,
}

/// A PostgreSQL duration setting as `SHOW` prints it (`0`, `500ms`, `1s`,
/// `5min`, `1h`, `1d`, or bare milliseconds) in milliseconds.
pub(crate) fn parse_setting_ms(shown: &str) -> Option<u64> {
    let s = shown.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().ok()?;
    let factor = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "us" => return Some(n / 1_000),
        _ => return None,
    };
    n.checked_mul(factor)
}

/// Connects to `url` as a plain session and reads the audit's facts.
pub(crate) async fn audit(url: &str, timeout: Duration) -> Result<DatabaseAudit, String> {
    let connected = tokio::time::timeout(timeout, tokio_postgres::connect(url, NoTls))
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    let (client, connection) = connected;
    let task = tokio::spawn(connection);
    let result = async {
        let show = |name: &'static str| {
            let client = &client;
            async move {
                let shown: String = client
                    .query_one(&format!("SHOW {name}"), &[])
                    .await
                    .map_err(|e| e.to_string())?
                    .get(0);
                parse_setting_ms(&shown)
                    .ok_or_else(|| format!("{name} = {shown:?}: not a duration"))
            }
        };
        let role: String = client
            .query_one("SELECT current_user::text", &[])
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        let lock_timeout_ms = show("lock_timeout").await?;
        let statement_timeout_ms = show("statement_timeout").await?;
        let idle_in_transaction_timeout_ms = show("idle_in_transaction_session_timeout").await?;
        let has_inbox: bool = client
            .query_one("SELECT to_regclass('breakwater_inbox') IS NOT NULL", &[])
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        let inbox_key = if has_inbox {
            Some(
                client
                    .query_one(INBOX_KEY, &[])
                    .await
                    .map_err(|e| e.to_string())?
                    .get::<_, Vec<String>>(0),
            )
        } else {
            None
        };
        Ok(DatabaseAudit {
            role,
            lock_timeout_ms,
            statement_timeout_ms,
            idle_in_transaction_timeout_ms,
            inbox_key,
        })
    }
    .await;
    task.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::parse_setting_ms;

    #[test]
    fn settings_read_as_postgres_prints_them() {
        assert_eq!(parse_setting_ms("0"), Some(0));
        assert_eq!(parse_setting_ms("500ms"), Some(500));
        assert_eq!(parse_setting_ms("1s"), Some(1_000));
        assert_eq!(parse_setting_ms("5min"), Some(300_000));
        assert_eq!(parse_setting_ms("2h"), Some(7_200_000));
        assert_eq!(parse_setting_ms("1d"), Some(86_400_000));
        assert_eq!(parse_setting_ms("1500"), Some(1_500));
        assert_eq!(parse_setting_ms("soon"), None);
    }
}
