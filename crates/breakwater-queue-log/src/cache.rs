//! How much of the log stays in the page cache: the newest `cache_bytes`
//! the writer wrote, and no more.
//!
//! Written pages stay cached until memory runs short, so a store that only
//! grows (a flood, or a backlog piling up while the database is down)
//! takes page cache from the database beside it. And on a VM whose host
//! takes freed guest memory back (free page reporting: this machine's
//! kernel runs with `page_reporting.page_reporting_order=11`), every page
//! the cache grows into is guest memory touched afresh: writing new file
//! pages cost about 12 µs of CPU a page here past the first half gigabyte,
//! against 1.5–2.5 µs for a page freed a moment before and taken again
//! (`docs/measurements.md`, "Page cache"). So the writer lets go of what
//! lies more than `cache_bytes` behind its head (`POSIX_FADV_DONTNEED`),
//! a mebibyte or more at a time as it writes, and its next writes take
//! the pages it just freed before the host can reclaim them.
//!
//! What is let go is long synced: `cache_bytes` behind the head is many
//! group commits back. A drain that reaches it reads it back from disk,
//! in order (the kernel's read-ahead). A segment some of whose pages were
//! let go is deleted once settled, never recycled or kept free: the
//! writer's first partial write into each uncached page would read it from
//! disk first, on the group commit's path.
//!
//! [`CacheWindow`] is the bookkeeping only (no I/O): the writer tells it
//! where its head is and it answers which ranges to let go.

use std::collections::{HashSet, VecDeque};

/// Pages are let go whole: a range's edges are rounded to this.
const PAGE: u64 = 4096;
/// Nothing is let go until this much is over the bound: one call a
/// mebibyte, not one a group.
const STEP: u64 = 1 << 20;

/// A range of a segment to let go of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LetGo {
    pub segment: u64,
    pub offset: u64,
    pub len: u64,
}

/// Written bytes of one segment still counted as cached.
#[derive(Debug)]
struct Span {
    segment: u64,
    /// Page-aligned: everything before it was let go.
    from: u64,
    /// The writer's head in this segment.
    to: u64,
}

/// The newest written bytes, oldest first, and what to let go of when
/// they pass the bound.
#[derive(Debug)]
pub(crate) struct CacheWindow {
    /// 0: no bound.
    limit: u64,
    spans: VecDeque<Span>,
    cached: u64,
    /// Segments with pages let go.
    let_go: HashSet<u64>,
}

impl CacheWindow {
    /// A window of `limit` bytes; 0 keeps everything (the kernel decides).
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            spans: VecDeque::new(),
            cached: 0,
            let_go: HashSet::new(),
        }
    }

    /// The writer's head is at `end` in `segment`: all of it before `end`
    /// is written. Segments come in the order they are written. Returns
    /// the ranges to let go of, oldest first.
    pub(crate) fn wrote(&mut self, segment: u64, end: u64) -> Vec<LetGo> {
        match self.spans.back_mut() {
            Some(span) if span.segment == segment => {
                if end > span.to {
                    self.cached += end - span.to;
                    span.to = end;
                }
            }
            _ => {
                self.spans.push_back(Span {
                    segment,
                    from: 0,
                    to: end,
                });
                self.cached += end;
            }
        }
        if self.limit == 0 || self.cached < self.limit + STEP {
            return Vec::new();
        }
        let mut over = self.cached - self.limit;
        let mut out = Vec::new();
        while over > 0 {
            let sealed = self.spans.len() > 1;
            let Some(span) = self.spans.front_mut() else {
                break;
            };
            let held = span.to - span.from;
            if sealed && over >= held {
                // All of a sealed segment: its last page too.
                out.push(LetGo {
                    segment: span.segment,
                    offset: span.from,
                    len: span.to.next_multiple_of(PAGE) - span.from,
                });
                self.let_go.insert(span.segment);
                self.cached -= held;
                over -= held;
                self.spans.pop_front();
                continue;
            }
            let upto = (span.from + over) / PAGE * PAGE;
            if upto > span.from {
                out.push(LetGo {
                    segment: span.segment,
                    offset: span.from,
                    len: upto - span.from,
                });
                self.let_go.insert(span.segment);
                self.cached -= upto - span.from;
                span.from = upto;
            }
            break;
        }
        out
    }

    /// `segment` was reclaimed: stops counting it. True when some of its
    /// pages were let go (it must not be written into again).
    pub(crate) fn forget(&mut self, segment: u64) -> bool {
        if let Some(at) = self.spans.iter().position(|s| s.segment == segment)
            && let Some(span) = self.spans.remove(at)
        {
            self.cached -= span.to - span.from;
        }
        self.let_go.remove(&segment)
    }

    /// Bytes counted as cached.
    #[cfg(test)]
    fn cached(&self) -> u64 {
        self.cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn total(ranges: &[LetGo]) -> u64 {
        ranges.iter().map(|r| r.len).sum()
    }

    #[test]
    fn nothing_is_let_go_under_the_bound() {
        let mut w = CacheWindow::new(8 * MIB);
        for end in (1..=8).map(|m| m * MIB) {
            assert!(w.wrote(1, end).is_empty());
        }
        assert!(w.wrote(1, 9 * MIB - 1).is_empty(), "less than a step over");
        assert_eq!(w.cached(), 9 * MIB - 1);
        assert!(!w.forget(1));
    }

    #[test]
    fn the_oldest_pages_of_the_current_segment_go_a_step_at_a_time() {
        let mut w = CacheWindow::new(8 * MIB);
        w.wrote(1, 8 * MIB);
        let gone = w.wrote(1, 9 * MIB + 100);
        assert_eq!(
            gone,
            vec![LetGo {
                segment: 1,
                offset: 0,
                len: MIB
            }],
            "whole pages, from the segment's start"
        );
        assert_eq!(w.cached(), 8 * MIB + 100);
        let gone = w.wrote(1, 10 * MIB + 200);
        assert_eq!(gone[0].offset, MIB, "on from where the last one ended");
        assert_eq!(gone[0].len % PAGE, 0);
        assert!(w.cached() >= 8 * MIB && w.cached() < 8 * MIB + PAGE);
        assert!(w.forget(1), "a segment with pages let go is marked");
    }

    #[test]
    fn a_sealed_segment_goes_whole_before_the_next_is_touched() {
        let mut w = CacheWindow::new(4 * MIB);
        assert!(w.wrote(1, 3 * MIB + 10).is_empty());
        assert_eq!(
            w.wrote(2, 3 * MIB),
            vec![LetGo {
                segment: 1,
                offset: 0,
                len: 2 * MIB
            }],
            "the sealed segment first, page-aligned down"
        );
        assert_eq!(
            w.wrote(2, 5 * MIB),
            vec![
                LetGo {
                    segment: 1,
                    offset: 2 * MIB,
                    len: MIB + PAGE
                },
                LetGo {
                    segment: 2,
                    offset: 0,
                    len: MIB
                },
            ],
            "the rest of segment 1 with its last, partial page; then what is still over"
        );
        assert_eq!(w.cached(), 4 * MIB);
        assert!(w.forget(1) && w.forget(2));
    }

    #[test]
    fn the_bound_holds_however_the_writes_come() {
        let mut w = CacheWindow::new(16 * MIB);
        let (mut segment, mut end, mut let_go) = (1, 0, 0);
        for i in 0..20_000u64 {
            end += 700 + (i * 7919) % 60_000;
            if end > 64 * MIB {
                segment += 1;
                end = 4096;
            }
            let_go += total(&w.wrote(segment, end));
            assert!(w.cached() < 16 * MIB + STEP + 64 * 1024);
        }
        assert!(let_go > 0);
    }

    #[test]
    fn a_reclaimed_segment_stops_counting() {
        let mut w = CacheWindow::new(8 * MIB);
        w.wrote(1, 2 * MIB);
        w.wrote(2, MIB);
        assert!(!w.forget(1), "nothing of it was let go");
        assert_eq!(w.cached(), MIB);
    }

    #[test]
    fn no_bound_keeps_everything() {
        let mut w = CacheWindow::new(0);
        for s in 1..100 {
            assert!(w.wrote(s, 64 * MIB).is_empty());
        }
    }
}
