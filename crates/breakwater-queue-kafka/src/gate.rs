//! Which assigned partitions flow and which are paused, from the breaker's
//! flow, how much this process holds, and the retry tiers' due times.
//! Pure: no I/O; the pump applies the answer with `pause` and `resume`
//! while it keeps polling, so the consumer stays in its group however long
//! the breaker is open.
//!
//! - Paused: every partition.
//! - Probing with `p` probes: `p` partitions of the queue topic (a
//!   different set at each half-open, so no partition waits behind a bad
//!   one for ever) and the retry tiers; the rest as the ramp proceeds.
//! - Flowing: every partition.
//! - Whatever the flow, every partition pauses while this process has its
//!   window (`max_fetched`) fetched and not claimed, and resumes once half
//!   of it is claimed (the claims, not the fetch, follow the breaker's
//!   limit); a tier's partition pauses while
//!   this process holds [`TIER_HOLD`] of its records waiting for their
//!   time (fetching on meanwhile, so a retry is handed out at its time,
//!   not a fetch after it).

use breakwater_queue::Flow;

use crate::names::TopicIx;

/// Most records of one tier partition held waiting for their time; past
/// it the partition pauses until the first of them is due.
pub(crate) const TIER_HOLD: usize = 512;

/// A partition of a subscribed topic.
pub(crate) type Tp = (TopicIx, i32);

/// The gate's memory between two decisions.
#[derive(Debug)]
pub(crate) struct Gate {
    flow: Flow,
    max_fetched: usize,
    /// Which set of partitions probes this half-open.
    probe_turn: usize,
    /// Held the whole window; resumes at half of it.
    full: bool,
}

impl Gate {
    pub(crate) fn new(max_fetched: usize) -> Self {
        Self {
            flow: Flow::Flowing { limit: 0 },
            max_fetched,
            probe_turn: 0,
            full: false,
        }
    }

    pub(crate) fn flow(&self) -> Flow {
        self.flow
    }

    /// The breaker's new flow; a new half-open probes the next partitions.
    pub(crate) fn set_flow(&mut self, flow: Flow) {
        if matches!(flow, Flow::Probing { .. }) && !matches!(self.flow, Flow::Probing { .. }) {
            self.probe_turn = self.probe_turn.wrapping_add(1);
        }
        self.flow = flow;
    }

    /// Most messages this process fetches ahead of its claims under the
    /// flow.
    pub(crate) fn window(&self) -> usize {
        if self.flow.delivers() {
            self.max_fetched.max(1)
        } else {
            0
        }
    }

    /// Which of `assigned` (sorted) flow, given that this process holds
    /// `held` messages and `tier_full(tp)` says a tier partition holds
    /// [`TIER_HOLD`] records waiting. Returns the flowing ones.
    pub(crate) fn flowing(
        &mut self,
        assigned: &[Tp],
        held: usize,
        tier_full: impl Fn(Tp) -> bool,
    ) -> Vec<Tp> {
        let window = self.window();
        if held >= window {
            self.full = true;
        } else if held <= window / 2 {
            self.full = false;
        }
        if self.full || !self.flow.delivers() {
            return Vec::new();
        }
        let queue: Vec<Tp> = assigned
            .iter()
            .copied()
            .filter(|(ix, _)| !ix.is_tier())
            .collect();
        let from_queue: Vec<Tp> = match self.flow {
            Flow::Probing { probes } if !queue.is_empty() => (0..(probes as usize)
                .min(queue.len()))
                .map(|i| queue[(self.probe_turn + i) % queue.len()])
                .collect(),
            _ => queue,
        };
        let tiers = assigned
            .iter()
            .copied()
            .filter(|tp| tp.0.is_tier() && !tier_full(*tp));
        let mut out: Vec<Tp> = from_queue.into_iter().chain(tiers).collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned() -> Vec<Tp> {
        let mut v: Vec<Tp> = (0..4).map(|p| (TopicIx::QUEUE, p)).collect();
        v.extend((0..2).map(|p| (TopicIx(1), p)));
        v
    }

    #[test]
    fn paused_nothing_flows_and_flowing_everything_does() {
        let mut g = Gate::new(8);
        g.set_flow(Flow::Paused);
        assert!(g.flowing(&assigned(), 0, |_| false).is_empty());
        g.set_flow(Flow::Flowing { limit: 4 });
        assert_eq!(g.flowing(&assigned(), 0, |_| false), assigned());
    }

    #[test]
    fn half_open_resumes_as_many_queue_partitions_as_probes_a_new_set_each_time() {
        let mut g = Gate::new(8);
        g.set_flow(Flow::Probing { probes: 2 });
        let first = g.flowing(&assigned(), 0, |_| false);
        let queue_parts = |v: &[Tp]| v.iter().filter(|t| !t.0.is_tier()).count();
        assert_eq!(queue_parts(&first), 2);
        assert_eq!(first.len(), 4, "and the tiers: {first:?}");
        assert_eq!(
            g.flowing(&assigned(), 0, |_| false),
            first,
            "stable within one half-open"
        );
        g.set_flow(Flow::Paused);
        g.set_flow(Flow::Probing { probes: 2 });
        let second = g.flowing(&assigned(), 0, |_| false);
        assert_ne!(first, second, "the next half-open probes other partitions");
        g.set_flow(Flow::Probing { probes: 9 });
        assert_eq!(queue_parts(&g.flowing(&assigned(), 0, |_| false)), 4);
    }

    #[test]
    fn a_full_window_pauses_everything_until_half_of_it_is_taken() {
        let mut g = Gate::new(8);
        g.set_flow(Flow::Flowing { limit: 2 });
        assert!(
            g.flowing(&assigned(), 8, |_| false).is_empty(),
            "8 of 8 held"
        );
        assert!(
            g.flowing(&assigned(), 5, |_| false).is_empty(),
            "still above half"
        );
        assert_eq!(g.flowing(&assigned(), 4, |_| false).len(), 6);
        assert_eq!(
            g.flowing(&assigned(), 7, |_| false).len(),
            6,
            "not full yet"
        );
    }

    #[test]
    fn a_tier_holding_its_fill_of_waiting_records_pauses() {
        let mut g = Gate::new(4);
        g.set_flow(Flow::Flowing { limit: 4 });
        let f = g.flowing(&assigned(), 0, |tp| tp == (TopicIx(1), 1));
        assert!(!f.contains(&(TopicIx(1), 1)));
        assert!(f.contains(&(TopicIx(1), 0)));
    }
}
