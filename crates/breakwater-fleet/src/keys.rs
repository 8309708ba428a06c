//! Every Redis key and channel of one deployment, under its prefix, so
//! deployments that share a Redis never see each other's state.

/// The names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The names under `prefix` (e.g. `bw:orders`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches(':').to_owned(),
        }
    }

    /// The prefix itself.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The breaker record: a JSON string, changed by compare-and-set.
    pub fn record(&self) -> String {
        format!("{}:breaker", self.prefix)
    }

    /// The channel each new record is published on.
    pub fn channel(&self) -> String {
        format!("{}:breaker:changes", self.prefix)
    }

    /// The channel hot-key parks are announced on.
    pub fn key_parks(&self) -> String {
        format!("{}:keys:parked", self.prefix)
    }

    /// The controller lease: `<node> <expires at, Unix ms>`, with a TTL.
    pub fn lease(&self) -> String {
        format!("{}:lease", self.prefix)
    }

    /// The nodes' heartbeats: a hash, node id -> beat JSON.
    pub fn beats(&self) -> String {
        format!("{}:nodes", self.prefix)
    }

    /// The probe slots held in half-open `period`: a sorted set, slot id
    /// scored by its expiry.
    pub fn probes(&self, period: u64) -> String {
        format!("{}:probes:{period}", self.prefix)
    }

    /// The probe successes counted in half-open `period`.
    pub fn probe_successes(&self, period: u64) -> String {
        format!("{}:probes:{period}:ok", self.prefix)
    }

    /// The counter probe slot ids are drawn from.
    pub fn probe_ids(&self) -> String {
        format!("{}:probe-ids", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_under_the_prefix() {
        let k = Keys::new("bw:orders:");
        for name in [
            k.record(),
            k.channel(),
            k.lease(),
            k.beats(),
            k.probes(3),
            k.probe_successes(3),
            k.probe_ids(),
            k.key_parks(),
        ] {
            assert!(name.starts_with("bw:orders:"), "{name}");
            assert!(!name.starts_with("bw:orders::"), "{name}");
        }
        assert_ne!(Keys::new("a").record(), Keys::new("b").record());
    }
}
