//! What the types of the config cannot express: timeouts that must be
//! ordered, a lease that outlives the longest apply, a token off loopback,
//! the queue backend's own keys, the sources.

use super::{Config, ConfigError};

impl Config {
    /// Checks what the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sink = &self.sink;
        if sink.statement_timeout_ms <= sink.lock_timeout_ms {
            return Err(ConfigError::invalid(
                "sink.statement_timeout_ms",
                format!(
                    "must be larger than sink.lock_timeout_ms ({} <= {}); otherwise the \
                     statement timeout fires first and the lock timeout never does",
                    sink.statement_timeout_ms, sink.lock_timeout_ms
                ),
            ));
        }
        if sink.pool_max == 0 {
            return Err(ConfigError::invalid("sink.pool_max", "must be at least 1"));
        }
        if self.workers.max_concurrency == 0 {
            return Err(ConfigError::invalid(
                "workers.max_concurrency",
                "must be at least 1",
            ));
        }
        if let Some(fleet) = &self.fleet {
            if !(fleet.redis_url.starts_with("redis://")
                || fleet.redis_url.starts_with("rediss://"))
            {
                return Err(ConfigError::invalid(
                    "fleet.redis_url",
                    "must be a redis:// (or rediss://) URL",
                ));
            }
            if fleet.prefix.is_empty() {
                return Err(ConfigError::invalid("fleet.prefix", "must not be empty"));
            }
            if fleet.beat_ms == 0 || fleet.lease_ms < 2 * fleet.beat_ms {
                return Err(ConfigError::invalid(
                    "fleet.lease_ms",
                    format!(
                        "must be at least twice fleet.beat_ms ({} < 2 x {}): the holder renews \
                         the lease at each beat, and one late beat must not lose it",
                        fleet.lease_ms, fleet.beat_ms
                    ),
                ));
            }
        }
        if i32::from(self.workers.nice) > 19 {
            return Err(ConfigError::invalid(
                "workers.nice",
                format!(
                    "{} is past the lowest priority there is: 0 (the ingress's) to 19",
                    self.workers.nice
                ),
            ));
        }
        if self.workers.max_attempts == 0 {
            return Err(ConfigError::invalid(
                "workers.max_attempts",
                "must be at least 1",
            ));
        }
        // `serve` sets the breaker's maximum to the pool's size; a value of
        // its own would be silently replaced.
        if self.breaker.max_concurrency
            != breakwater_control::BreakerConfig::default().max_concurrency
        {
            return Err(ConfigError::invalid(
                "breaker.max_concurrency",
                "the breaker's maximum is the workers' pool: set workers.max_concurrency \
                 (BREAKWATER_WORKERS_MAX_CONCURRENCY) instead",
            ));
        }
        let limiter = &self.breaker.limiter;
        let pool = u32::try_from(sink.pool_max).unwrap_or(u32::MAX);
        if limiter.enabled && limiter.max_concurrency > pool {
            return Err(ConfigError::invalid(
                "breaker.limiter.max_concurrency",
                format!(
                    "{} is above sink.pool_max ({pool}): applies past the pool would only \
                     wait for a connection",
                    limiter.max_concurrency
                ),
            ));
        }
        self.breaker_config().validate().map_err(|e| match e {
            breakwater_control::ConfigError::Invalid { key, problem } => {
                ConfigError::invalid(format!("breaker.{key}"), problem)
            }
        })?;
        for (key, value) in [
            (
                "ingress.max_connections",
                self.ingress.max_connections as u64,
            ),
            ("ingress.header_timeout_ms", self.ingress.header_timeout_ms),
            (
                "ingress.request_timeout_ms",
                self.ingress.request_timeout_ms,
            ),
            ("ingress.max_in_flight", self.ingress.max_in_flight as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if self.ingress.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "ingress.max_body_bytes",
                "must be at least 1",
            ));
        }
        // A lease must outlive the longest apply (pool wait, then the
        // inbox insert and each statement, every one under the statement
        // timeout), or a slow apply's message is handed to a second worker.
        let statements = self
            .sources
            .iter()
            .map(|s| s.statements.len())
            .max()
            .unwrap_or(0)
            .max(1) as u64
            + 1;
        let longest_apply = sink
            .statement_timeout_ms
            .saturating_mul(statements)
            .saturating_add(sink.acquire_timeout_ms);
        if self.queue.lease_ms < longest_apply.max(1000) {
            return Err(ConfigError::invalid(
                "queue.lease_ms",
                format!(
                    "must be at least {} ms (sink.acquire_timeout_ms + {statements} x \
                     sink.statement_timeout_ms: the inbox insert and the most statements \
                     of any source), or a slow apply outlives its lease and runs twice",
                    longest_apply.max(1000)
                ),
            ));
        }
        if self
            .admin
            .token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(ConfigError::invalid(
                "admin.token",
                "is empty: set a secret, or leave the key out on a loopback admin.listen",
            ));
        }
        // A webhook of the largest size must fit in the single-node
        // writer's byte budget, or it would be refused with 503 every time.
        let pending_bytes = match self.queue.backend.as_str() {
            "embedded" => breakwater_queue_embedded::EmbeddedConfig::from_section(&self.queue)
                .ok()
                .map(|c| c.max_pending_bytes),
            breakwater_queue_log::BACKEND_NAME => {
                breakwater_queue_log::LogConfig::from_section(&self.queue)
                    .ok()
                    .map(|c| c.max_pending_bytes)
            }
            _ => None,
        };
        if let Some(pending_bytes) = pending_bytes
            && pending_bytes < self.ingress.max_body_bytes.saturating_add(64 * 1024)
        {
            return Err(ConfigError::invalid(
                "queue.max_pending_bytes",
                format!(
                    "must be at least ingress.max_body_bytes + 64 KiB ({} bytes), or the \
                     largest webhook is refused every time",
                    self.ingress.max_body_bytes.saturating_add(64 * 1024)
                ),
            ));
        }
        crate::queue::check(&self.queue).map_err(|problem| {
            let key = problem.key.as_deref().unwrap_or("backend");
            ConfigError::invalid(
                format!("queue.{key}"),
                super::parse_error::hide_values(&problem.message),
            )
        })?;
        if self.workers.order == Some(crate::queue::KeyOrder::Key) {
            let backend = crate::queue::backend(&self.queue)
                .map_err(|problem| ConfigError::invalid("queue.backend", problem.message))?;
            backend.keeps_key_order(&self.queue).map_err(|why| {
                ConfigError::invalid(
                    "workers.order",
                    format!("\"key\" cannot be kept here: {why}; set \"none\" to say so"),
                )
            })?;
        }
        if self.admin.event_history > super::EVENT_HISTORY_MAX {
            return Err(ConfigError::invalid(
                "admin.event_history",
                format!(
                    "must be at most {} events (about 300 bytes each, in memory)",
                    super::EVENT_HISTORY_MAX
                ),
            ));
        }
        if !self.admin.listen.ip().is_loopback() && self.admin.token.is_none() {
            return Err(ConfigError::invalid(
                "admin.token",
                "required when admin.listen is not a loopback address",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, source) in self.sources.iter().enumerate() {
            let key = format!("source[{i}]");
            if source.name.is_empty()
                || !source
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(ConfigError::invalid(
                    format!("{key}.name"),
                    "must be non-empty and use only letters, digits, '-' and '_'",
                ));
            }
            if !names.insert(source.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{key}.name"),
                    format!("duplicate source name \"{}\"", source.name),
                ));
            }
            if source.scheme == super::SchemeName::Hmac && source.header.is_none() {
                return Err(ConfigError::invalid(
                    format!("{key}.header"),
                    "the hmac scheme needs the name of the signature header",
                ));
            }
            crate::source::check_extractors(source)
                .map_err(|(field, m)| ConfigError::invalid(format!("{key}.{field}"), m))?;
            if let Some(forward) = &source.forward {
                if !source.statements.is_empty() {
                    return Err(ConfigError::invalid(
                        format!("{key}.forward"),
                        "a source forwards over HTTP or runs statements, not both",
                    ));
                }
                breakwater_sink::ForwardTarget::new(forward.spec(None))
                    .map_err(|e| ConfigError::invalid(format!("{key}.forward"), e.to_string()))?;
            }
        }
        Ok(())
    }
}
