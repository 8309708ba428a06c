//! Reading a store back: every segment scanned in order and replayed into
//! an [`Index`], damaged frames logged. The writer does this at start;
//! [`crate::inspect`] does it read-only, without the lock, to see what a
//! store holds.

use std::collections::HashSet;
use std::path::Path;

use breakwater_queue::QueueError;

use crate::index::{Index, Location};
use crate::record::{Record, StoredMessage};
use crate::segment::{self, Scanned};

/// What replaying the segments found.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// The segments, oldest first.
    pub segments: Vec<u64>,
    /// The newest segment and how its scan ended.
    pub last: Option<(u64, Scanned)>,
    /// The one before it, likewise.
    pub previous: Option<(u64, Scanned)>,
    /// Frames skipped for a failed checksum.
    pub corrupt_frames: usize,
    /// The newest segment, when a crash cut its creation short: it holds
    /// nothing and is not among `segments`.
    pub unfinished: Option<u64>,
    /// Segments of the first format (frames not salted).
    pub unsalted: HashSet<u64>,
}

/// Replays every segment in `dir` into `index`, showing each record to
/// `also` first.
pub(crate) fn replay_segments(
    dir: &Path,
    index: &mut Index,
    now: i64,
    mut also: impl FnMut(u64, &Record),
) -> Result<Replayed, QueueError> {
    let storage = |e: &dyn std::fmt::Display| QueueError::Storage(e.to_string());
    let mut replayed = Replayed {
        segments: segment::list(dir).map_err(|e| storage(&e))?,
        ..Replayed::default()
    };
    let newest = replayed.segments.last().copied();
    for &s in &replayed.segments {
        index.add_segment(s);
        let scanned = segment::scan(dir, s, |offset, id, r, len| {
            also(id, &r);
            let loc = Location {
                segment: s,
                offset,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            };
            index.replay(id, loc, r, StoredMessage::dedup_hash, now);
        });
        let scanned = match scanned {
            Err(segment::ScanError::Unfinished { .. }) if Some(s) == newest => {
                index.remove_segment(s);
                replayed.unfinished = Some(s);
                break;
            }
            other => other.map_err(|e| storage(&e))?,
        };
        for c in &scanned.corrupt {
            tracing::error!(
                segment = s,
                offset = c.offset,
                error = %c.error,
                "a record of the queue's log failed its checksum and was skipped"
            );
        }
        replayed.corrupt_frames += scanned.corrupt.len();
        if scanned.salt == crate::record::NO_SALT {
            replayed.unsalted.insert(s);
        }
        replayed.previous = replayed.last.replace((s, scanned));
    }
    if replayed.unfinished.is_some() {
        // It is the newest: the last listed.
        replayed.segments.pop();
    }
    Ok(replayed)
}
