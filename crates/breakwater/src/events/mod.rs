//! One webhook's story, for `GET /events/{source}/{event_id}` and
//! `breakwater events show`: what the sink's inbox holds (applied, when;
//! superseded, by which newer event),
//! whether it sits in the DLQ (with its reason), which earlier events of
//! its entity key were dead-lettered (its key's later events, this one
//! among them, went on without them), and what this node's
//! workers did with it lately ([`journal`]: each attempt with its time,
//! class and error). The first two are durable and fleet-wide; the
//! attempts are this node's memory.
//!
//! [`look_up`] reads them; [`tell`] decides the state from what was read,
//! with no I/O.

pub mod journal;

use breakwater_admin_api::{
    AppliedRecord, DeadLetter, EARLIER_DEAD_LETTERS_SHOWN, EventState, EventStory, HistoryScope,
};
use breakwater_sink::{InboxLookup, Sink};

use crate::queue::{DlqFilter, DlqPage, Queue, dlq_search};
use journal::{Attempts, EventJournal};

/// Dead letters one lookup reads at most to find the event's.
const DLQ_SCAN_MAX: usize = 100_000;

/// What each place said of one event.
#[derive(Debug, Default)]
pub struct Found {
    /// `None` where no sink was asked (a node without workers).
    pub inbox: Option<InboxLookup>,
    pub dead_letter: Option<DeadLetter>,
    /// Dead letters of its source and entity key received at or before
    /// it (itself apart), in any order.
    pub earlier_dead_letters: Vec<DeadLetter>,
    pub attempts: Option<Attempts>,
    pub destination: Option<String>,
    pub lookup_errors: Vec<String>,
}

/// Reads the event's inbox row (when this node has a sink), its dead
/// letter and this node's attempts, and tells its story.
pub async fn look_up(
    source: &str,
    event_id: &str,
    journal: &EventJournal,
    sink: Option<&dyn Sink>,
    queue: &dyn Queue,
) -> EventStory {
    let mut found = Found {
        attempts: journal.get(source, event_id),
        destination: sink.map(|s| s.destination(source)),
        ..Found::default()
    };
    let inbox = async {
        match sink {
            Some(sink) => Some(sink.inbox_lookup(source, event_id).await),
            None => None,
        }
    };
    let filter = DlqFilter {
        source: Some(source.to_owned()),
        event_id: Some(event_id.to_owned()),
        ..DlqFilter::default()
    };
    let first = DlqPage::first(1);
    let dlq = dlq_search(queue, &filter, &first, DLQ_SCAN_MAX);
    let (inbox, dlq) = tokio::join!(inbox, dlq);
    match inbox {
        Some(Ok(lookup)) => found.inbox = Some(lookup),
        Some(Err(e)) => found
            .lookup_errors
            .push(format!("the inbox could not be read: {e}")),
        None => {}
    }
    match dlq {
        Ok(page) => {
            found.dead_letter = page.items.into_iter().next();
            if found.dead_letter.is_none() && page.next_after.is_some() {
                found.lookup_errors.push(format!(
                    "the DLQ holds more than {DLQ_SCAN_MAX} dead letters: only the oldest were searched"
                ));
            }
        }
        Err(e) => found
            .lookup_errors
            .push(format!("the DLQ could not be read: {e}")),
    }
    if let Some((key, received_at_ms)) = key_and_arrival(&found) {
        let filter = DlqFilter {
            source: Some(source.to_owned()),
            entity_key: Some(key),
            ..DlqFilter::default()
        };
        match dlq_search(queue, &filter, &DlqPage::first(DLQ_PAGE), DLQ_SCAN_MAX).await {
            Ok(page) => {
                found.earlier_dead_letters = page
                    .items
                    .into_iter()
                    .filter(|d| d.event_id != event_id && d.received_at_ms <= received_at_ms)
                    .collect();
            }
            Err(e) => found.lookup_errors.push(format!(
                "the DLQ could not be read for its key's earlier events: {e}"
            )),
        }
    }
    tell(source, event_id, found, journal)
}

/// Dead letters of one key one lookup reads at most.
const DLQ_PAGE: usize = 1_000;

/// The event's entity key and when it was received, where its inbox row
/// or its dead letter tells them.
fn key_and_arrival(found: &Found) -> Option<(String, i64)> {
    if let Some(InboxLookup::Found(r)) = &found.inbox {
        return Some((r.entity_key.clone()?, r.received_at_ms));
    }
    let d = found.dead_letter.as_ref()?;
    Some((d.entity_key.clone()?, d.received_at_ms))
}

/// The story of one event from what [`look_up`] found.
pub fn tell(source: &str, event_id: &str, found: Found, journal: &EventJournal) -> EventStory {
    let Found {
        inbox,
        dead_letter,
        mut earlier_dead_letters,
        attempts,
        destination,
        lookup_errors,
    } = found;
    let applied = match &inbox {
        Some(InboxLookup::Found(r)) => Some(AppliedRecord {
            received_at_ms: r.received_at_ms,
            applied_at_ms: r.applied_at_ms,
            entity_key: r.entity_key.clone(),
            superseded_by: r.superseded_by.clone(),
        }),
        _ => None,
    };
    let Attempts { kept, dropped } = attempts.unwrap_or_default();
    let last = kept.back().map(|a| a.outcome.as_str());
    let superseded_by = applied.as_ref().and_then(|a| a.superseded_by.as_deref());
    let (state, detail) = if let Some(by) = superseded_by {
        // Settled: its inbox row is kept, so it is never applied later.
        (
            EventState::Applied,
            format!(
                "superseded by {by}: its entity key already held a newer version, so its \
                 statements did not run (its inbox row is kept)"
            ),
        )
    } else if applied.is_some() {
        (
            EventState::Applied,
            "applied: its row is in the inbox, committed with its effects".to_owned(),
        )
    } else if let Some(d) = &dead_letter {
        (
            EventState::DeadLettered,
            format!(
                "dead-lettered ({}) after {} attempt(s): {}",
                d.class, d.attempts, d.error
            ),
        )
    } else if matches!(last, Some("applied" | "duplicate")) {
        // A forward target keeps no inbox: its 2xx is the proof.
        (
            EventState::Applied,
            "applied: the target answered 2xx".to_owned(),
        )
    } else if let Some(outcome) = last {
        (
            EventState::Pending,
            format!(
                "not settled yet: its last attempt here was {outcome}, it comes back from the queue"
            ),
        )
    } else {
        let beyond = match &inbox {
            Some(InboxLookup::Absent) => "not in the inbox, ",
            _ => "",
        };
        (
            EventState::Unknown,
            format!(
                "{beyond}not in the DLQ, and not tried on this node lately: still queued, settled by \
                 another node, older than this node's history, or never accepted (the ingress \
                 answered 2xx for it?)"
            ),
        )
    };
    earlier_dead_letters.sort_by(|a, b| (b.received_at_ms, &b.id).cmp(&(a.received_at_ms, &a.id)));
    let earlier_count = earlier_dead_letters.len();
    earlier_dead_letters.truncate(EARLIER_DEAD_LETTERS_SHOWN);
    let detail = if earlier_count == 0 {
        detail
    } else {
        let ids: Vec<&str> = earlier_dead_letters
            .iter()
            .map(|d| d.event_id.as_str())
            .collect();
        format!(
            "{detail}; {earlier_count} earlier event(s) of its entity key were dead-lettered \
             ({}{}): the key's later events went on without them",
            ids.join(", "),
            if earlier_count > ids.len() {
                ", ..."
            } else {
                ""
            }
        )
    };
    EventStory {
        source: source.to_owned(),
        event_id: event_id.to_owned(),
        state,
        detail,
        destination,
        applied,
        dead_letter: dead_letter.map(|d| DeadLetter { body: None, ..d }),
        earlier_dead_letters: earlier_dead_letters
            .into_iter()
            .map(|d| DeadLetter { body: None, ..d })
            .collect(),
        attempts: kept.into(),
        attempts_dropped: dropped,
        history: HistoryScope {
            node: journal.node().to_owned(),
            events: journal.len(),
            capacity: journal.capacity(),
        },
        lookup_errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use breakwater_admin_api::AttemptRecord;
    use breakwater_sink::InboxRecord;

    fn attempt(n: u32, outcome: &str) -> AttemptRecord {
        AttemptRecord {
            at_ms: 1_000 * i64::from(n),
            attempt: n,
            outcome: outcome.to_owned(),
            class: None,
            kind: None,
            error: None,
            note: None,
            apply_ms: 3,
            probe: false,
        }
    }

    fn journal_with(outcomes: &[&str]) -> EventJournal {
        let j = EventJournal::new(10, "node-a");
        for (i, o) in outcomes.iter().enumerate() {
            j.record("stripe", "evt_1", attempt(i as u32 + 1, o));
        }
        j
    }

    #[test]
    fn an_inbox_row_makes_it_applied_whatever_this_node_remembers() {
        let j = journal_with(&["retried"]);
        let found = Found {
            inbox: Some(InboxLookup::Found(InboxRecord {
                received_at_ms: 5,
                applied_at_ms: Some(9),
                entity_key: Some("order-1".into()),
                superseded_by: None,
            })),
            attempts: j.get("stripe", "evt_1"),
            ..Found::default()
        };
        let story = tell("stripe", "evt_1", found, &j);
        assert_eq!(story.state, EventState::Applied);
        assert_eq!(story.applied.and_then(|a| a.applied_at_ms), Some(9));
        assert_eq!(story.attempts.len(), 1);
        assert_eq!(story.history.node, "node-a");
    }

    #[test]
    fn a_superseded_event_says_by_which_event() {
        let j = journal_with(&["superseded"]);
        let found = Found {
            inbox: Some(InboxLookup::Found(InboxRecord {
                received_at_ms: 5,
                applied_at_ms: Some(9),
                entity_key: Some("order-1".into()),
                superseded_by: Some("evt_2".into()),
            })),
            attempts: j.get("stripe", "evt_1"),
            ..Found::default()
        };
        let story = tell("stripe", "evt_1", found, &j);
        assert_eq!(story.state, EventState::Applied);
        assert!(
            story.detail.starts_with("superseded by evt_2"),
            "{}",
            story.detail
        );
        assert_eq!(
            story.applied.and_then(|a| a.superseded_by).as_deref(),
            Some("evt_2")
        );
    }

    #[test]
    fn a_dead_letter_is_told_with_its_reason_and_without_its_body() {
        let j = journal_with(&["dead_lettered"]);
        let found = Found {
            inbox: Some(InboxLookup::Absent),
            dead_letter: Some(DeadLetter {
                id: "7".into(),
                source: "stripe".into(),
                event_id: "evt_1".into(),
                entity_key: None,
                attempts: 1,
                replays: 0,
                class: "permanent".into(),
                error: "constraint: orders_amount_check".into(),
                received_at_ms: 0,
                dead_at_ms: 0,
                body: Some("{\"secret\":1}".into()),
            }),
            ..Found::default()
        };
        let story = tell("stripe", "evt_1", found, &j);
        assert_eq!(story.state, EventState::DeadLettered);
        assert!(
            story.detail.contains("orders_amount_check"),
            "{}",
            story.detail
        );
        assert_eq!(story.dead_letter.and_then(|d| d.body), None);
    }

    fn dead_letter(id: &str, event_id: &str, received_at_ms: i64) -> DeadLetter {
        DeadLetter {
            id: id.into(),
            source: "stripe".into(),
            event_id: event_id.into(),
            entity_key: Some("order-1".into()),
            attempts: 1,
            replays: 0,
            class: "permanent".into(),
            error: "constraint".into(),
            received_at_ms,
            dead_at_ms: received_at_ms + 1,
            body: Some("{}".into()),
        }
    }

    #[test]
    fn earlier_dead_letters_of_its_key_are_named_newest_first_without_bodies() {
        let j = EventJournal::off();
        let found = Found {
            inbox: Some(InboxLookup::Found(InboxRecord {
                received_at_ms: 50,
                applied_at_ms: Some(60),
                entity_key: Some("order-1".into()),
                superseded_by: None,
            })),
            earlier_dead_letters: (1..=7)
                .map(|i| dead_letter(&i.to_string(), &format!("evt_{i}"), i * 5))
                .collect(),
            ..Found::default()
        };
        let story = tell("stripe", "evt_9", found, &j);
        assert_eq!(story.state, EventState::Applied);
        let ids: Vec<&str> = story
            .earlier_dead_letters
            .iter()
            .map(|d| d.event_id.as_str())
            .collect();
        assert_eq!(ids, ["evt_7", "evt_6", "evt_5", "evt_4", "evt_3"]);
        assert!(story.earlier_dead_letters.iter().all(|d| d.body.is_none()));
        assert!(
            story
                .detail
                .contains("7 earlier event(s) of its entity key were dead-lettered (evt_7, "),
            "{}",
            story.detail
        );
    }

    #[test]
    fn a_forwarded_event_is_applied_on_its_2xx_and_a_retried_one_pending() {
        let j = journal_with(&["retried", "applied"]);
        let found = Found {
            inbox: Some(InboxLookup::NotKept),
            attempts: j.get("stripe", "evt_1"),
            ..Found::default()
        };
        assert_eq!(
            tell("stripe", "evt_1", found, &j).state,
            EventState::Applied
        );

        let j = journal_with(&["retried"]);
        let found = Found {
            inbox: Some(InboxLookup::Absent),
            attempts: j.get("stripe", "evt_1"),
            ..Found::default()
        };
        assert_eq!(
            tell("stripe", "evt_1", found, &j).state,
            EventState::Pending
        );
    }

    #[test]
    fn nothing_found_anywhere_is_unknown_and_says_where_else_it_may_be() {
        let j = EventJournal::off();
        let found = Found {
            inbox: Some(InboxLookup::Absent),
            ..Found::default()
        };
        let story = tell("stripe", "evt_9", found, &j);
        assert_eq!(story.state, EventState::Unknown);
        assert!(story.detail.contains("another node"), "{}", story.detail);
        assert!(story.attempts.is_empty());
    }
}
