//! A simulated database: how long one apply takes and how it ends, from
//! the schedule (down, slow, flapping, locked rows) and the message
//! (poison), with the inbox that makes a second apply of one event a
//! duplicate; and the effects, counted per event.

use std::time::Duration;

use breakwater_sink::{Applied, SinkError};

use crate::schedule::{DbFault, Ms, Schedule};

/// The sink's settings the simulation follows (the defaults of `[sink]`).
pub const LOCK_TIMEOUT_MS: Ms = 500;
pub const STATEMENT_TIMEOUT_MS: Ms = 3_000;
pub const CONNECT_TIMEOUT_MS: Ms = 1_000;
/// The PostgreSQL sink's client-side deadline for a transaction of one
/// statement (statement timeout x 4 round trips + 1 s): a database that
/// answers nothing is given up on then.
pub const CLIENT_DEADLINE_MS: Ms = STATEMENT_TIMEOUT_MS * 4 + 1_000;
/// An apply's own time on a healthy database.
pub const BASE_MS: Ms = 3;

/// How an apply will end, and when.
#[derive(Debug, Clone)]
pub struct Planned {
    pub took: Ms,
    pub result: Result<Applied, SinkError>,
    /// Whether it waits on a row lock (for the lock-waiter signals).
    pub lock_wait: bool,
}

/// Plans the apply of a message with `key` (poison or not) starting at
/// `now`. Whether it is new or a duplicate is settled when it commits.
pub fn plan(schedule: &Schedule, key: Option<u32>, poison: bool, now: Ms) -> Planned {
    let ok = |took| Planned {
        took,
        result: Ok(Applied::New),
        lock_wait: false,
    };
    let fail = |took, kind: &'static str, lock_wait| Planned {
        took,
        result: Err(SinkError::dependency(kind, format!("simulated {kind}"))),
        lock_wait,
    };
    match schedule.db_fault(now) {
        Some(DbFault::Down) => return fail(CONNECT_TIMEOUT_MS.min(50), "connection", false),
        Some(DbFault::Flapping { period_ms }) if (now / period_ms).is_multiple_of(2) => {
            return fail(20, "connection", false);
        }
        Some(DbFault::Blackhole) => {
            return fail(CLIENT_DEADLINE_MS, "statement_timeout", false);
        }
        _ => {}
    }
    let extra = match schedule.db_fault(now) {
        Some(DbFault::Slow { extra_ms }) => extra_ms,
        _ => 0,
    };
    // A locked row: wait for it, up to the lock timeout.
    let wait = match key.and_then(|k| schedule.row_locked_until(k, now)) {
        Some(until) if until - now >= LOCK_TIMEOUT_MS => {
            return fail(LOCK_TIMEOUT_MS, "lock_timeout", true);
        }
        Some(until) => until - now,
        None => 0,
    };
    let took = wait + BASE_MS + extra;
    if took >= STATEMENT_TIMEOUT_MS {
        return fail(STATEMENT_TIMEOUT_MS, "statement_timeout", wait > 0);
    }
    if poison {
        return Planned {
            took,
            result: Err(SinkError::permanent(
                "constraint",
                "simulated check constraint violated",
            )),
            lock_wait: wait > 0,
        };
    }
    Planned {
        lock_wait: wait > 0,
        ..ok(took)
    }
}

/// The inbox and the effects: how many times each event's statements ran.
#[derive(Debug, Default)]
pub struct SimDb {
    pub effects: Vec<u32>,
    /// Applies that committed (first or duplicate).
    pub commits: u64,
    /// The applies whose statements ran (first commits, not duplicates),
    /// in the order they committed: when, which message.
    pub applies: Vec<(Ms, u32)>,
}

impl SimDb {
    /// A planned success commits at `now`: the first time the statements
    /// run, after that the inbox answers duplicate.
    pub fn commit(&mut self, id: u32, now: Ms) -> Applied {
        let i = id as usize;
        if self.effects.len() <= i {
            self.effects.resize(i + 1, 0);
        }
        self.commits += 1;
        if self.effects[i] > 0 {
            Applied::Duplicate
        } else {
            self.effects[i] = 1;
            self.applies.push((now, id));
            Applied::New
        }
    }
}

pub fn ms(d: Duration) -> Ms {
    u64::try_from(d.as_millis()).unwrap_or(Ms::MAX)
}
