//! Flow control: what the breaker's gate asks of a queue backend.

/// How much a backend may deliver, set by the dispatcher from the breaker's
/// gate at every transition ([`crate::Queue::set_flow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Breaker open: deliver nothing. Push brokers cancel their consumer and
    /// release what they had buffered, untried.
    Paused,
    /// Half-open: at most `probes` messages outstanding (a push broker's
    /// prefetch).
    Probing { probes: u32 },
    /// Closed or ramping: at most `limit` messages outstanding.
    Flowing { limit: u32 },
}

impl Flow {
    /// Whether a claim may hand out anything.
    pub fn delivers(self) -> bool {
        !matches!(self, Self::Paused)
    }

    /// Most messages outstanding at once under this flow (0 when paused).
    pub fn window(self) -> u32 {
        match self {
            Self::Paused => 0,
            Self::Probing { probes } => probes,
            Self::Flowing { limit } => limit,
        }
    }
}
