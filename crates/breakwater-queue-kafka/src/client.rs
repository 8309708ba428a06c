//! The librdkafka clients of one queue: the producer, the workers' group
//! consumer, a consumer that never joins (committed offsets, watermarks,
//! dead-letter scans), and the admin client that makes the topics. Every
//! one starts from the same properties: the bootstrap servers and
//! `[queue.librdkafka]`.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaConfig;
use crate::names::Names;

/// A consumer's longest wait on the broker for a fetch with nothing to
/// return (`fetch.wait.max.ms`).
const FETCH_WAIT_MS: u64 = 20;

/// The socket timeout for `request_timeout_ms`: at least a second over a
/// fetch's wait, which librdkafka asks of `socket.timeout.ms` (it warns at
/// every client created otherwise, and an idle fetch could time out).
fn socket_timeout_ms(request_timeout_ms: u64) -> u64 {
    request_timeout_ms.max(FETCH_WAIT_MS + 1_000)
}

/// The properties every client of the queue starts from.
pub(crate) fn base(url: &str, config: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", url)
        .set("client.id", "breakwater")
        .set(
            "socket.timeout.ms",
            socket_timeout_ms(config.request_timeout_ms).to_string(),
        );
    for (k, v) in &config.librdkafka {
        c.set(k, v);
    }
    c
}

/// The producer: `acks=all` and idempotence, a delivery report within
/// `request_timeout_ms` or an error.
pub(crate) fn producer(url: &str, config: &KafkaConfig) -> Result<FutureProducer, KafkaError> {
    base(url, config)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set(
            "message.timeout.ms",
            config.request_timeout_ms.max(10).to_string(),
        )
        .create()
}

/// The properties of a consumer of `group` that commits only what it is
/// told to and starts a new group at the oldest record.
pub(crate) fn consumer_config(url: &str, config: &KafkaConfig, group: &str) -> ClientConfig {
    let mut c = base(url, config);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", config.session_timeout_ms.to_string())
        .set(
            "max.poll.interval.ms",
            config
                .max_poll_interval_ms
                .max(config.session_timeout_ms)
                .to_string(),
        )
        .set("enable.partition.eof", "false")
        // A fetch with nothing to return waits at most this long on the
        // broker: what a webhook arriving meanwhile may wait before a worker
        // sees it, where a broker does not answer a waiting fetch as soon
        // as data comes (librdkafka's default is 500 ms).
        .set("fetch.wait.max.ms", FETCH_WAIT_MS.to_string());
    c
}

/// A consumer that never subscribes: what it asks of the group (committed
/// offsets) does not make it a member.
pub(crate) fn lone_consumer(
    url: &str,
    config: &KafkaConfig,
    group: &str,
) -> Result<BaseConsumer, KafkaError> {
    consumer_config(url, config, group).create()
}

/// How many partitions `topic` has; `None` when the broker has no such
/// topic.
pub(crate) fn partitions_of(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>, KafkaError> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| i32::try_from(t.partitions().len()).unwrap_or(i32::MAX)))
}

/// Makes every topic of `names` that is missing (an existing one keeps its
/// partitions and settings).
pub(crate) async fn create_topics(
    url: &str,
    config: &KafkaConfig,
    names: &Names,
) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        base(url, config).create().map_err(|e| e.to_string())?;
    let replication = || TopicReplication::Fixed(config.replication_factor);
    let partitions = config.partitions.max(1);
    let mut topics: Vec<NewTopic<'_>> = names
        .subscribed()
        .into_iter()
        .map(|t| NewTopic::new(t, partitions, replication()))
        .collect();
    topics.push(NewTopic::new(&names.dlq, 1, replication()).set("cleanup.policy", "compact"));
    let options = AdminOptions::new()
        .operation_timeout(Some(Duration::from_millis(config.request_timeout_ms)))
        .request_timeout(Some(Duration::from_millis(config.request_timeout_ms)));
    let results = admin
        .create_topics(&topics, &options)
        .await
        .map_err(|e| e.to_string())?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic}: {code}")),
        }
    }
    Ok(())
}

/// Deletes every topic of `names` (tests and the lab, which make their
/// own); errors are ignored.
pub(crate) async fn delete_topics(url: &str, config: &KafkaConfig, names: &Names) {
    let Ok(admin) = base(url, config).create::<AdminClient<DefaultClientContext>>() else {
        return;
    };
    let mut topics = names.subscribed();
    topics.push(&names.dlq);
    let options = AdminOptions::new()
        .operation_timeout(Some(Duration::from_millis(config.request_timeout_ms)));
    let _ = admin.delete_topics(&topics, &options).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short request timeout still leaves librdkafka a second over the
    /// fetch wait; a longer one is taken as it is.
    #[test]
    fn the_socket_timeout_stays_a_second_over_the_fetch_wait() {
        assert_eq!(socket_timeout_ms(500), FETCH_WAIT_MS + 1_000);
        assert_eq!(socket_timeout_ms(5_000), 5_000);
        let config = KafkaConfig {
            request_timeout_ms: 10,
            ..KafkaConfig::default()
        };
        let c = base("127.0.0.1:9092", &config);
        assert_eq!(c.get("socket.timeout.ms"), Some("1020"));
    }
}
