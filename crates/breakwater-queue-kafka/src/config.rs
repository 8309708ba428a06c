//! The Kafka backend's own keys of the `[queue]` table (beside `backend`,
//! `url` (the bootstrap servers), `name` (the topic) and `lease_ms`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `[queue]` keys of the `kafka` backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// The consumer group every worker process joins; `<name>.workers`
    /// when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Partitions of the topic and of each retry tier topic, when
    /// Breakwater creates them (an existing topic keeps its own). One
    /// entity's events stay on one partition, in order.
    pub partitions: i32,
    /// Replicas of each topic Breakwater creates; -1 takes the broker's
    /// `default.replication.factor`.
    pub replication_factor: i32,
    /// The retry tiers, in milliseconds, ascending: one topic each
    /// (`<name>.retry.<ms>`). A retry or a delayed release waits in the
    /// smallest tier at least as long as its delay (the longest caps it)
    /// and is handed out once its own delay has passed.
    pub delay_tiers_ms: Vec<u64>,
    /// Most records this process holds fetched and not claimed yet (a
    /// bound on its memory: about 20 MB at the default with 1 KiB
    /// bodies); past it every partition pauses until half of them are
    /// claimed. A pause drops what librdkafka had fetched ahead, so a small
    /// bound costs throughput (`bench drain`: 2,191/s at 2,048, 4,198/s at
    /// 16,384).
    pub max_fetched: usize,
    /// Longest wait for `acks=all` on a produce, or for an answer from the
    /// broker, in milliseconds (the socket timeout is never under 1,020 ms,
    /// a second over a consumer's fetch wait, as librdkafka asks).
    pub request_timeout_ms: u64,
    /// The consumer's group session timeout (`session.timeout.ms`).
    pub session_timeout_ms: u64,
    /// The consumer's `max.poll.interval.ms`. Breakwater polls all the time,
    /// paused or not, so an open breaker never overruns it.
    pub max_poll_interval_ms: u64,
    /// How often finished offsets are committed, in milliseconds (a crash
    /// redelivers at most this much work; the inbox applies it once).
    pub commit_interval_ms: u64,
    /// Most dead letters a `dlq` command reads (Kafka cannot address a
    /// record by id: listing reads the dead-letter topic).
    pub dlq_scan_max: usize,
    /// Properties passed to librdkafka as they are, for the producer and
    /// the consumers: `security.protocol`, `sasl.mechanism`,
    /// `sasl.username`, `sasl.password`, `ssl.ca.location`, ...
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub librdkafka: BTreeMap<String, String>,
    /// The order claims keep (`workers.order`, set by the service; not a
    /// `[queue]` key).
    #[serde(skip)]
    pub key_order: breakwater_queue::KeyOrder,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            group: None,
            partitions: 6,
            replication_factor: -1,
            delay_tiers_ms: vec![250, 1_000, 5_000, 30_000, 120_000, 600_000, 3_600_000],
            max_fetched: 16_384,
            request_timeout_ms: 5_000,
            session_timeout_ms: 10_000,
            max_poll_interval_ms: 300_000,
            commit_interval_ms: 250,
            dlq_scan_max: 10_000,
            librdkafka: BTreeMap::new(),
            key_order: breakwater_queue::KeyOrder::default(),
        }
    }
}
