//! One sink for the workers when some sources forward over HTTP: each
//! event goes to its source's forward target if it has one, else to the
//! database sink. With several targets each one's failures are its own
//! (its gate, `target_gate.rs`), so one failing service pauses neither the
//! other services nor the database. The database's lock view stays the database's; the pool
//! usage the breaker reads is the database pool's and every target's
//! together.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::forward::ForwardTarget;
use crate::{Applied, Event, InboxLookup, LockSnapshot, Sink, SinkError};

/// The database sink, and a forward target per forwarding source.
pub struct RoutedSink {
    database: Arc<dyn Sink>,
    forwards: HashMap<String, ForwardTarget>,
    /// Several targets: each weighs its own failures (its gate), so one
    /// failing service pauses neither the others nor the database.
    scoped: bool,
}

impl std::fmt::Debug for RoutedSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedSink")
            .field("forwards", &self.forwards)
            .finish_non_exhaustive()
    }
}

impl RoutedSink {
    /// Routes the sources of `forwards` to their targets, the rest to
    /// `database`.
    pub fn new(database: Arc<dyn Sink>, forwards: HashMap<String, ForwardTarget>) -> Self {
        let scoped = forwards.len() > 1;
        Self {
            database,
            forwards,
            scoped,
        }
    }
}

#[async_trait]
impl Sink for RoutedSink {
    async fn apply(&self, event: &Event<'_>) -> Result<Applied, SinkError> {
        match self.forwards.get(event.source) {
            Some(target) => target.forward(event, event.attempt, self.scoped).await,
            None => self.database.apply(event).await,
        }
    }

    async fn lock_snapshot(&self) -> Option<LockSnapshot> {
        self.database.lock_snapshot().await
    }

    /// Every target accepts a connection (they are checked together).
    async fn reachable(&self) -> Option<bool> {
        if self.forwards.is_empty() {
            return self.database.reachable().await;
        }
        let checks = self.forwards.values().map(ForwardTarget::reachable);
        Some(
            futures_util::future::join_all(checks)
                .await
                .into_iter()
                .all(|ok| ok),
        )
    }

    fn pool_usage(&self) -> (usize, usize) {
        self.forwards
            .values()
            .map(ForwardTarget::usage)
            .fold(self.database.pool_usage(), |(u, m), (tu, tm)| {
                (u + tu, m + tm)
            })
    }

    async fn inbox_lookup(&self, source: &str, event_id: &str) -> Result<InboxLookup, SinkError> {
        match self.forwards.get(source) {
            Some(_) => Ok(InboxLookup::NotKept),
            None => self.database.inbox_lookup(source, event_id).await,
        }
    }

    fn destination(&self, source: &str) -> String {
        match self.forwards.get(source) {
            Some(target) => target.destination(),
            None => self.database.destination(source),
        }
    }
}
