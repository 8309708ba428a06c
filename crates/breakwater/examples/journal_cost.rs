//! What the attempt history costs a worker per settled attempt: records
//! 2 million attempts (unique events, and a tenth of them retried) into a
//! journal of the default 50,000 events, and prints nanoseconds per record.
//!
//! `cargo run --release -p breakwater --example journal_cost`

use std::time::Instant;

use breakwater::events::journal::EventJournal;
use breakwater_admin_api::AttemptRecord;

fn main() {
    let journal = EventJournal::new(50_000, "bench");
    let n = 2_000_000u32;
    let started = Instant::now();
    for i in 0..n {
        // One event in ten comes back for a second attempt.
        let event = if i % 10 == 9 { i - 5 } else { i };
        journal.record(
            "stripe",
            &format!("evt_{event}"),
            AttemptRecord {
                at_ms: i64::from(i),
                attempt: 1,
                outcome: "applied".to_owned(),
                class: None,
                kind: None,
                error: None,
                note: None,
                apply_ms: 2,
                probe: false,
            },
        );
    }
    let took = started.elapsed();
    println!(
        "{n} records into a journal of {} events: {:.0} ns per record ({} kept)",
        journal.capacity(),
        took.as_nanos() as f64 / f64::from(n),
        journal.len()
    );
}
