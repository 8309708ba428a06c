//! What becomes of a message once its apply ends, as pure decisions: how
//! the breaker counts the outcome ([`breaker_class`]) and what the queue is
//! told ([`decide`]). The dispatcher acts on them; the simulator
//! (`breakwater-sim`) runs the same two functions under seeded fault
//! schedules, so what it checks is this code, not a copy.

use std::time::Duration;

use breakwater_control::OutcomeClass;
use breakwater_sink::{Applied, FailureClass, SinkError};

/// How the breaker counts an apply's end. `laned`: the message has a key
/// its lane sets aside on a lock failure; `probe`: it ran as a half-open
/// probe; `one_keys_trouble` is asked only for a lock timeout that may be
/// one hot key's (the controller's [`breakwater_control::KeyContention`]).
pub fn breaker_class(
    result: &Result<Applied, SinkError>,
    laned: bool,
    probe: bool,
    one_keys_trouble: impl FnOnce() -> bool,
) -> OutcomeClass {
    match result {
        Ok(_) => OutcomeClass::Success,
        Err(e) if e.class == FailureClass::Permanent => OutcomeClass::Permanent,
        // One of several forward targets, weighed by its own gate: neither
        // a call nor a failure for the process's breaker.
        Err(e) if e.target.is_some() => OutcomeClass::KeyContention,
        // A row lock on a key the lane sets aside: that key's trouble while
        // few keys have it (a probe's outcome always counts).
        Err(e) if e.kind == "lock_timeout" && laned && !probe => {
            if one_keys_trouble() {
                OutcomeClass::KeyContention
            } else {
                OutcomeClass::Dependency
            }
        }
        Err(_) => OutcomeClass::Dependency,
    }
}

/// What the dispatcher knows when an apply ends.
#[derive(Debug, Clone, Copy)]
pub struct SettleFacts {
    /// The lane parked the message's key on this outcome (a row lock), for
    /// this long.
    pub parked_for: Option<Duration>,
    /// The breaker's gate lets workers poll now.
    pub may_poll: bool,
    /// The message ran as a half-open probe.
    pub probe: bool,
    /// Attempts counted before this one.
    pub attempts: u32,
    pub max_attempts: u32,
}

/// What the queue is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Applied (`applied`), already applied (`duplicate`), or older than
    /// its entity key's newest version (`superseded`).
    Ack(&'static str),
    /// To the DLQ: `permanent` (the message's fault) or `exhausted`.
    DeadLetter {
        class: &'static str,
        note: &'static str,
    },
    /// Back untried after `delay` (no attempt counted).
    Release { delay: Duration, note: &'static str },
    /// Failed attempt: back after the retry backoff, one attempt counted.
    Retry,
}

/// The settle decision. A message that has used its attempts is
/// dead-lettered as `exhausted` only when the fault may be its own: not
/// when its last failure was the dependency out of reach (no connection,
/// no pooled session: it was never tried), nor while `dependency_trouble`
/// (the dependency looks like the fault:
/// [`breakwater_control::Breaker::dependency_trouble`], asked only then)
/// holds. Such a message is retried at the backoff's pace until the
/// dependency is back.
pub fn decide(
    result: &Result<Applied, SinkError>,
    facts: &SettleFacts,
    dependency_trouble: impl FnOnce() -> bool,
) -> Settle {
    let e = match result {
        Ok(Applied::New) => return Settle::Ack("applied"),
        Ok(Applied::Duplicate) => return Settle::Ack("duplicate"),
        // Older than what its key already holds: settled, not a failure.
        Ok(Applied::Superseded { .. }) => return Settle::Ack("superseded"),
        Err(e) => e,
    };
    if e.class == FailureClass::Permanent {
        Settle::DeadLetter {
            class: "permanent",
            note: "permanent failure: dead-lettered at once",
        }
    } else if e.target.is_some_and(|t| t.in_trouble) {
        // Its forward target is failing, behind its own gate: back
        // untried, for when the gate lets it through.
        Settle::Release {
            delay: e.retry_after.unwrap_or(Duration::from_secs(1)),
            note: "its forward target is failing: back untried",
        }
    } else if let Some(park) = facts.parked_for {
        Settle::Release {
            delay: park,
            note: "row lock: its key parked, back untried",
        }
    } else if !facts.may_poll && !facts.probe {
        // The breaker opened while this one ran: hand it back untried. (A
        // failed probe is what re-opened it: that one counts an attempt
        // below, so a message that always fails cannot hold the fleet
        // paused for ever.)
        Settle::Release {
            delay: Duration::ZERO,
            note: "the breaker opened meanwhile: back untried",
        }
    } else if facts.attempts.saturating_add(1) >= facts.max_attempts
        && !e.is_unreachable()
        && !dependency_trouble()
    {
        Settle::DeadLetter {
            class: "exhausted",
            note: "retries exhausted",
        }
    } else {
        Settle::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> SettleFacts {
        SettleFacts {
            parked_for: None,
            may_poll: true,
            probe: false,
            attempts: 0,
            max_attempts: 3,
        }
    }

    fn failed(kind: &'static str) -> Result<Applied, SinkError> {
        Err(SinkError::dependency(kind, "boom"))
    }

    #[test]
    fn a_poison_message_is_dead_lettered_and_never_counted_against_the_database() {
        let poison = Err(SinkError::permanent("constraint", "check violated"));
        assert_eq!(
            breaker_class(&poison, true, false, || unreachable!()),
            OutcomeClass::Permanent
        );
        assert!(matches!(
            decide(&poison, &facts(), || unreachable!()),
            Settle::DeadLetter {
                class: "permanent",
                ..
            }
        ));
    }

    #[test]
    fn a_superseded_event_is_acked_as_a_success() {
        let superseded = Ok(Applied::Superseded { by: "evt_2".into() });
        assert_eq!(
            breaker_class(&superseded, true, false, || unreachable!()),
            OutcomeClass::Success
        );
        let last_attempt = SettleFacts {
            attempts: 2,
            ..facts()
        };
        assert_eq!(
            decide(&superseded, &last_attempt, || unreachable!()),
            Settle::Ack("superseded")
        );
    }

    #[test]
    fn a_lock_timeout_is_the_keys_trouble_only_while_few_keys_have_one() {
        let lock = failed("lock_timeout");
        assert_eq!(
            breaker_class(&lock, true, false, || true),
            OutcomeClass::KeyContention
        );
        assert_eq!(
            breaker_class(&lock, true, false, || false),
            OutcomeClass::Dependency
        );
        assert_eq!(
            breaker_class(&lock, true, true, || unreachable!()),
            OutcomeClass::Dependency,
            "a probe's outcome always counts"
        );
        assert_eq!(
            breaker_class(&lock, false, false, || unreachable!()),
            OutcomeClass::Dependency
        );
    }

    /// A count a broker's metadata carries may be anything, `u32::MAX`
    /// too: it is past every limit, never an overflow.
    #[test]
    fn an_attempt_count_at_its_maximum_is_exhausted_without_overflow() {
        let f = SettleFacts {
            attempts: u32::MAX,
            ..facts()
        };
        assert!(matches!(
            decide(&failed("statement_timeout"), &f, || false),
            Settle::DeadLetter {
                class: "exhausted",
                ..
            }
        ));
    }

    #[test]
    fn a_message_is_dead_lettered_for_its_attempts_only_when_the_database_looks_fine() {
        let f = SettleFacts {
            attempts: 2,
            ..facts()
        };
        assert!(matches!(
            decide(&failed("statement_timeout"), &f, || false),
            Settle::DeadLetter {
                class: "exhausted",
                ..
            }
        ));
        assert_eq!(
            decide(&failed("statement_timeout"), &f, || true),
            Settle::Retry
        );
    }

    /// A database that flaps can refuse one message's every attempt while
    /// the calls around them succeed (so no trouble shows): out of reach,
    /// the message was never tried, and it is never `exhausted` for it.
    #[test]
    fn a_message_the_database_was_out_of_reach_for_is_never_exhausted() {
        let f = SettleFacts {
            attempts: 2,
            ..facts()
        };
        for kind in ["connection", "pool_timeout", "too_many_connections"] {
            assert_eq!(decide(&failed(kind), &f, || false), Settle::Retry, "{kind}");
        }
        let far_past = SettleFacts {
            attempts: 1_000,
            ..facts()
        };
        assert_eq!(
            decide(&failed("connection"), &far_past, || false),
            Settle::Retry
        );
    }

    #[test]
    fn a_failure_after_the_breaker_opened_goes_back_untried_unless_it_was_the_probe() {
        let closed_gate = SettleFacts {
            may_poll: false,
            ..facts()
        };
        assert!(matches!(
            decide(&failed("connection"), &closed_gate, || true),
            Settle::Release { delay, .. } if delay.is_zero()
        ));
        let probe = SettleFacts {
            probe: true,
            ..closed_gate
        };
        assert_eq!(
            decide(&failed("connection"), &probe, || true),
            Settle::Retry
        );
        let parked = SettleFacts {
            parked_for: Some(Duration::from_millis(300)),
            ..facts()
        };
        assert!(matches!(
            decide(&failed("lock_timeout"), &parked, || true),
            Settle::Release { delay, .. } if delay == Duration::from_millis(300)
        ));
    }
}
