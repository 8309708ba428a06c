//! Why a queue operation failed.

/// Why a queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue cannot take more right now; the caller should retry (the
    /// ingress answers 503 with `Retry-After`).
    #[error("queue is full ({pending} operations pending)")]
    Full { pending: usize },
    /// The queue is shutting down, or the thread or connection behind it is
    /// gone.
    #[error("queue is closed")]
    Closed,
    /// The broker cannot be reached now; the caller should retry.
    #[error("queue backend unavailable: {0}")]
    Unavailable(String),
    /// The lease behind a receipt ran out (or the message was settled).
    #[error("lease lost for message {id}")]
    LeaseLost { id: String },
    /// No message of that id (a DLQ id, most often).
    #[error("no such message {id}")]
    NotFound { id: String },
    /// A read-only command found no queue where the config points.
    #[error("no queue at {location}: nothing has been queued there yet (is --config right?)")]
    Missing { location: String },
    /// A receipt that another backend issued.
    #[error("a receipt of another queue backend")]
    ForeignReceipt,
    /// The message is larger than the broker takes (SQS: its queue's
    /// `MaximumMessageSize`); the ingress answers 413.
    #[error("message of {bytes} bytes is larger than the queue takes ({max} bytes)")]
    TooLarge { bytes: usize, max: usize },
    /// The queue's own storage failed.
    #[error("queue storage error: {0}")]
    Storage(String),
}
