//! Which offsets of an assigned partition are unfinished, and how far a
//! commit may go: workers finish messages out of order, so a commit goes
//! only up to the lowest unfinished offset, and a crash redelivers from
//! there (the sink's inbox applies a redelivered event once) and never
//! skips one. Pure: no I/O.

use std::collections::BTreeSet;

/// One assigned partition's offsets.
#[derive(Debug, Default)]
pub(crate) struct PartitionOffsets {
    /// Taken from the consumer and not finished: fetched, due later,
    /// claimed.
    unfinished: BTreeSet<i64>,
    /// One past the highest offset taken.
    next: Option<i64>,
    /// The last position committed (or read as committed).
    committed: Option<i64>,
}

impl PartitionOffsets {
    /// A record at `offset` came from the consumer. False when it was taken
    /// already (a fetch repeated after a pause): the caller drops it.
    pub(crate) fn take(&mut self, offset: i64) -> bool {
        if self.next.is_some_and(|next| offset < next) {
            return false;
        }
        self.unfinished.insert(offset);
        self.next = Some(offset + 1);
        true
    }

    /// The record at `offset` is done with (applied, retried elsewhere,
    /// dead-lettered). False when it was not unfinished.
    pub(crate) fn finish(&mut self, offset: i64) -> bool {
        self.unfinished.remove(&offset)
    }

    /// Where the group may resume from: the lowest unfinished offset, or
    /// past everything taken; `None` before anything was taken.
    pub(crate) fn position(&self) -> Option<i64> {
        self.unfinished.first().copied().or(self.next)
    }

    /// [`Self::position`] when it moved since the last commit.
    pub(crate) fn to_commit(&self) -> Option<i64> {
        self.position().filter(|p| self.committed != Some(*p))
    }

    /// `position` was committed.
    pub(crate) fn committed(&mut self, position: i64) {
        self.committed = Some(position);
    }

    /// One past the highest offset taken.
    pub(crate) fn next(&self) -> Option<i64> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_never_passes_an_unfinished_offset() {
        let mut p = PartitionOffsets::default();
        assert_eq!(p.position(), None, "nothing taken, nothing to commit");
        for o in 10..15 {
            assert!(p.take(o));
        }
        assert_eq!(p.position(), Some(10));
        // Finished out of order: 11, 12 and 14 done, 10 and 13 not.
        for o in [11, 12, 14] {
            assert!(p.finish(o));
        }
        assert_eq!(p.position(), Some(10));
        assert!(p.finish(10));
        assert_eq!(p.position(), Some(13), "up to the lowest unfinished");
        assert!(p.finish(13));
        assert_eq!(p.position(), Some(15), "past everything taken");
        assert!(!p.finish(13), "finished once");
    }

    #[test]
    fn a_repeated_fetch_is_dropped_and_a_commit_is_made_once() {
        let mut p = PartitionOffsets::default();
        assert!(p.take(0) && p.take(1));
        assert!(!p.take(1), "taken already");
        assert!(!p.take(0));
        assert!(p.take(2));
        assert_eq!(p.next(), Some(3));
        p.finish(0);
        assert_eq!(p.to_commit(), Some(1));
        p.committed(1);
        assert_eq!(p.to_commit(), None, "nothing moved since");
        p.finish(1);
        assert_eq!(p.to_commit(), Some(2));
    }
}
