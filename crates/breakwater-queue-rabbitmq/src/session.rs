//! One connection to the broker and the channels Breakwater keeps on it: a
//! publishing channel in confirm mode and a consuming channel. A lost
//! connection is replaced whole by a new session of the next generation
//! (see the supervisor in `lib.rs`); receipts name the generation they
//! came from, since a delivery tag means nothing on another channel.

use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};

use crate::config::RabbitMqConfig;
use crate::topology::{self, Names};

/// Why a session could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("cannot reach RabbitMQ at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("no queue {queue} on the broker")]
    Missing { queue: String },
    #[error("declaring {queue}: {reason}")]
    Declare { queue: String, reason: String },
    #[error("RabbitMQ did not answer within {0:?}")]
    Timeout(Duration),
}

/// A connection and its channels.
pub(crate) struct Session {
    pub(crate) conn: Connection,
    /// Publishes with confirms: enqueue, retries, dead letters, replays.
    pub(crate) publish: Channel,
    /// Carries the consumer (and its prefetch).
    pub(crate) consume: Channel,
    pub(crate) generation: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

async fn within<T, E: std::fmt::Display>(
    timeout: Duration,
    f: impl Future<Output = Result<T, E>>,
    wrap: impl FnOnce(String) -> SessionError,
) -> Result<T, SessionError> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(wrap(e.to_string())),
        Err(_) => Err(SessionError::Timeout(timeout)),
    }
}

impl Session {
    /// Connects and opens the channels.
    pub(crate) async fn connect(
        url: &str,
        generation: u64,
        timeout: Duration,
    ) -> Result<Self, SessionError> {
        let failed = |reason| SessionError::Connect {
            url: redact(url),
            reason,
        };
        let props = ConnectionProperties::default()
            .with_connection_name(format!("breakwater-{}", std::process::id()).into());
        let conn = within(timeout, Connection::connect(url, props), failed).await?;
        let publish = within(timeout, conn.create_channel(), failed).await?;
        within(
            timeout,
            publish.confirm_select(ConfirmSelectOptions::default()),
            failed,
        )
        .await?;
        let consume = within(timeout, conn.create_channel(), failed).await?;
        Ok(Self {
            conn,
            publish,
            consume,
            generation,
        })
    }

    /// Whether the connection and both channels are up.
    pub(crate) fn healthy(&self) -> bool {
        self.conn.status().connected()
            && self.publish.status().connected()
            && self.consume.status().connected()
    }

    /// A channel of its own, for a call that may close it (a passive
    /// declare of a missing queue, a DLQ scan that hands its messages back
    /// by closing).
    pub(crate) async fn side_channel(&self, timeout: Duration) -> Result<Channel, SessionError> {
        within(timeout, self.conn.create_channel(), |reason| {
            SessionError::Connect {
                url: String::new(),
                reason,
            }
        })
        .await
    }

    /// Declares the queue, its DLQ and its delay tiers, idempotently (the
    /// same arguments again are a no-op; other arguments on an existing
    /// queue are refused by the broker, and named).
    pub(crate) async fn declare(
        &self,
        names: &Names,
        config: &RabbitMqConfig,
    ) -> Result<(), SessionError> {
        let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
        let qt = config.queue_type;
        let mut queues = vec![
            (names.dlq.clone(), topology::dlq_args(qt)),
            (names.queue.clone(), topology::queue_args(names, qt)),
        ];
        for ms in &config.delay_tiers_ms {
            queues.push((names.delay(*ms), topology::delay_args(names, qt, *ms)));
        }
        for (queue, args) in queues {
            // A refused declaration closes its channel: one per queue.
            let channel = self.side_channel(timeout).await?;
            let declared = within(
                timeout,
                channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), args),
                |reason| SessionError::Declare {
                    queue: queue.clone(),
                    reason,
                },
            )
            .await;
            let _ = channel.close(200, "declared".into()).await;
            declared?;
        }
        Ok(())
    }

    /// The ready count and consumer count of each of `queues` (passive
    /// declares on one channel); [`SessionError::Missing`] naming the
    /// first that does not exist.
    pub(crate) async fn counts(
        &self,
        queues: &[String],
        timeout: Duration,
    ) -> Result<Vec<(u32, u32)>, SessionError> {
        let channel = self.side_channel(timeout).await?;
        let mut out = Vec::with_capacity(queues.len());
        let mut failed = None;
        for queue in queues {
            let declared = tokio::time::timeout(
                timeout,
                channel.queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::default().passive(),
                    FieldTable::default(),
                ),
            )
            .await;
            match declared {
                Ok(Ok(q)) => out.push((q.message_count(), q.consumer_count())),
                // A missing queue closes the channel: stop there.
                Ok(Err(e)) if e.to_string().contains("NOT_FOUND") => {
                    failed = Some(SessionError::Missing {
                        queue: queue.clone(),
                    });
                    break;
                }
                Ok(Err(e)) => {
                    failed = Some(SessionError::Declare {
                        queue: queue.clone(),
                        reason: e.to_string(),
                    });
                    break;
                }
                Err(_) => {
                    failed = Some(SessionError::Timeout(timeout));
                    break;
                }
            }
        }
        let _ = channel.close(200, "counted".into()).await;
        failed.map_or(Ok(out), Err)
    }
}

/// `url` with its password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:<redacted>{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn the_password_never_shows() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:<redacted>@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
    }
}
