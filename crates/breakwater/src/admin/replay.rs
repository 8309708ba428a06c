//! `POST /dlq/replay` runs in the background, and `GET /dlq/replay` follows it.
//!
//! One replay at a time, at a bounded rate. It waits while the breaker is
//! open: there is no point feeding a dependency that is being protected.
//! A process that runs no breaker replays without waiting.
//!
//! It is built on the queue contract's [`replay_at_rate`], so it works on
//! every backend.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use breakwater_admin_api::{ReplayRequest, ReplayStatus};

use crate::queue::{Queue, replay_at_rate};
use crate::worker::Controller;

/// How often a replay held by an open breaker looks again.
const BREAKER_POLL: Duration = Duration::from_millis(250);

/// The replay running now, or the last one.
#[derive(Default)]
pub struct Replays {
    last: Mutex<Option<Job>>,
}

struct Job {
    started: Instant,
    status: Arc<Mutex<ReplayStatus>>,
}

impl Job {
    fn status(&self) -> ReplayStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        s.started_ago_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        s
    }
}

/// A replay or purge names dead letters (`ids`) or takes them `all`,
/// not both, not neither.
pub(super) fn names_or_all(ids: &[String], all: bool) -> Result<(), String> {
    if all == ids.is_empty() {
        Ok(())
    } else {
        Err("name the dead letters in `ids`, or set `all` (not both)".to_owned())
    }
}

/// Why a replay request is refused before it starts (a 400).
pub(super) fn check(request: &ReplayRequest) -> Result<(), String> {
    names_or_all(&request.ids, request.all)?;
    if !(request.rate.is_finite() && (1.0 / 3600.0..=1e6).contains(&request.rate)) {
        return Err(format!(
            "rate {} is not between 0.0003 (one an hour) and 1000000 messages per second",
            request.rate
        ));
    }
    Ok(())
}

impl Replays {
    /// The replay running now, or the last one; `None` before the first.
    pub fn status(&self) -> Option<ReplayStatus> {
        self.lock().as_ref().map(Job::status)
    }

    /// Starts `request` (checked by [`check`]); while another replay runs,
    /// `Err` with that one's status.
    pub fn start(
        &self,
        queue: Arc<dyn Queue>,
        controller: Option<Arc<Controller>>,
        request: ReplayRequest,
    ) -> Result<ReplayStatus, ReplayStatus> {
        let mut last = self.lock();
        if let Some(job) = last.as_ref().filter(|j| j.status().running) {
            return Err(job.status());
        }
        let status = Arc::new(Mutex::new(ReplayStatus {
            running: true,
            requested: (!request.all).then_some(request.ids.len()),
            rate: request.rate,
            replayed: 0,
            skipped: 0,
            waiting_for_breaker: false,
            started_ago_ms: 0,
            error: None,
        }));
        let job = Job {
            started: Instant::now(),
            status: Arc::clone(&status),
        };
        let answer = job.status();
        *last = Some(job);
        drop(last);
        tokio::spawn(run(queue, controller, request, status));
        Ok(answer)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Job>> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn run(
    queue: Arc<dyn Queue>,
    controller: Option<Arc<Controller>>,
    request: ReplayRequest,
    status: Arc<Mutex<ReplayStatus>>,
) {
    let update = |f: &dyn Fn(&mut ReplayStatus)| {
        f(&mut status.lock().unwrap_or_else(PoisonError::into_inner));
    };
    let wait_while_open = || {
        let (controller, status) = (controller.clone(), Arc::clone(&status));
        async move {
            loop {
                let open = controller.as_ref().is_some_and(|c| !c.gate().may_poll);
                status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .waiting_for_breaker = open;
                if !open {
                    return;
                }
                tokio::time::sleep(BREAKER_POLL).await;
            }
        }
    };
    let ids = if request.all { Vec::new() } else { request.ids };
    let done = replay_at_rate(
        queue.as_ref(),
        &ids,
        request.rate,
        request.max_replays,
        wait_while_open,
        |p| {
            update(&|s| {
                s.replayed = p.replayed;
                s.skipped = p.skipped;
            });
        },
    )
    .await;
    match &done {
        Ok(p) => tracing::info!(
            replayed = p.replayed,
            skipped = p.skipped,
            "DLQ replay done"
        ),
        Err(e) => tracing::warn!(error = %e, "DLQ replay stopped"),
    }
    update(&|s| {
        s.running = false;
        s.waiting_for_breaker = false;
        if let Ok(p) = &done {
            s.replayed = p.replayed;
            s.skipped = p.skipped;
        }
        if let Err(e) = &done {
            s.error = Some(e.to_string());
        }
    });
}
