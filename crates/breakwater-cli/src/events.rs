//! `breakwater events show SOURCE EVENT_ID`: one webhook's story, read
//! through the admin API (`GET /events/{source}/{event_id}`).

use breakwater_admin_api::{EventState, EventStory};
use http::Method;

use crate::admin_target::{AdminTarget, path_segment};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum EventsCommand {
    /// Applied (when, where), dead-lettered (why), pending or unknown, and
    /// each attempt the answering node made: time, outcome, class, error.
    /// Exits non-zero for a dead-lettered or unknown event.
    Show {
        /// The source's name, as in `[[source]] name`.
        source: String,
        /// The event id the ingress extracted (the issuer's id, or
        /// `sha256:<hex>` of the body).
        event_id: String,
        /// Print the admin API's JSON instead.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(admin: &AdminTarget, command: EventsCommand) -> anyhow::Result<()> {
    let EventsCommand::Show {
        source,
        event_id,
        json,
    } = command;
    let story: EventStory = admin
        .call(
            Method::GET,
            &format!(
                "/events/{}/{}",
                path_segment(&source),
                path_segment(&event_id)
            ),
        )
        .await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&story)?);
    } else {
        print_story(&story)?;
    }
    match story.state {
        EventState::Applied | EventState::Pending => Ok(()),
        EventState::DeadLettered => anyhow::bail!("{} {} is dead-lettered", source, event_id),
        EventState::Unknown => anyhow::bail!("{} {} is not known here", source, event_id),
    }
}

fn print_story(story: &EventStory) -> anyhow::Result<()> {
    outln!("event        {} {}", story.source, story.event_id);
    outln!("state        {}", state_name(story.state));
    outln!("             {}", story.detail);
    if let Some(d) = &story.destination {
        outln!("destination  {d}");
    }
    if let Some(a) = &story.applied {
        outln!("received     {}", timestamp(a.received_at_ms));
        if let Some(at) = a.applied_at_ms {
            outln!("applied      {}", timestamp(at));
        }
        if let Some(key) = &a.entity_key {
            outln!("entity key   {key}");
        }
        if let Some(by) = &a.superseded_by {
            outln!("superseded   by {by}: its statements did not run");
        }
    }
    if let Some(d) = &story.dead_letter {
        outln!(
            "dead letter  id {} ({}, after {} attempt(s), replayed {} time(s)), {}",
            d.id,
            d.class,
            d.attempts,
            d.replays,
            timestamp(d.dead_at_ms)
        );
        outln!("             {}", d.error);
    }
    for d in &story.earlier_dead_letters {
        outln!(
            "earlier      {} of its key dead-lettered ({}), DLQ id {}: the key went on without it",
            d.event_id,
            d.class,
            d.id
        );
    }
    outln!(
        "attempts     on {} (it remembers {} of at most {} events)",
        story.history.node,
        story.history.events,
        story.history.capacity
    );
    if story.attempts_dropped > 0 {
        outln!("  ({} older attempts not kept)", story.attempts_dropped);
    }
    if story.attempts.is_empty() {
        outln!("  none");
    }
    for a in &story.attempts {
        let failure = match (&a.class, &a.kind) {
            (Some(class), Some(kind)) => format!(" {class}/{kind}"),
            _ => String::new(),
        };
        outln!(
            "  {}  #{:<3} {:<14}{} {} ms{}",
            timestamp(a.at_ms),
            a.attempt,
            a.outcome,
            failure,
            a.apply_ms,
            if a.probe { " (probe)" } else { "" }
        );
        if let Some(note) = &a.note {
            outln!("      {note}");
        }
        if let Some(error) = &a.error {
            outln!("      {error}");
        }
    }
    for e in &story.lookup_errors {
        outln!("warning      {e}");
    }
    Ok(())
}

fn state_name(state: EventState) -> &'static str {
    match state {
        EventState::Applied => "applied",
        EventState::DeadLettered => "dead-lettered",
        EventState::Pending => "pending",
        EventState::Unknown => "unknown",
    }
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time.
fn timestamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms} ms"),
        |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
    )
}
