//! Which queue backend the lab and the benches run on, and the queue
//! section for it: the embedded store under a folder of the run's own, or
//! a broker on a queue name of the run's own, removed afterwards.

use serde::Serialize;

/// Which queue backend holds the webhooks of a lab or bench run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LabBackend {
    /// The segment-log store (`backend = "log"`, the default), under
    /// --data-dir.
    #[default]
    Log,
    /// The embedded SQLite store, under --data-dir.
    Embedded,
    /// NATS JetStream at --queue-url, on streams of the run's own, removed
    /// afterwards.
    Nats,
    /// RabbitMQ at --queue-url, on queues of the run's own, removed
    /// afterwards.
    Rabbitmq,
    /// Amazon SQS at --queue-url (an endpoint such as a local moto), on
    /// queues of the run's own, removed afterwards.
    Sqs,
    /// Kafka at --queue-url (bootstrap servers), on topics and a group of
    /// the run's own, removed afterwards.
    Kafka,
}

impl LabBackend {
    /// The broker's address: `given`, or the broker's usual local one.
    pub fn url(self, given: Option<&str>) -> String {
        given.map_or_else(
            || {
                match self {
                    Self::Embedded | Self::Log => "",
                    Self::Nats => "nats://127.0.0.1:4222",
                    Self::Rabbitmq => "amqp://guest:guest@127.0.0.1:5672/%2f",
                    Self::Sqs => "http://127.0.0.1:4566",
                    Self::Kafka => "127.0.0.1:9092",
                }
                .to_owned()
            },
            str::to_owned,
        )
    }

    /// The `[queue]` table for a broker queue `name` at `url`, or for the
    /// log store in `dir`; `None` for the embedded store (the caller's
    /// config already points at it).
    pub fn section(
        self,
        url: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Option<breakwater::queue::QueueSection> {
        let backend = match self {
            Self::Embedded => return None,
            Self::Log => return Some(breakwater_queue_log::LogConfig::at(dir).section()),
            Self::Nats => "nats",
            Self::Rabbitmq => "rabbitmq",
            Self::Sqs => "sqs",
            Self::Kafka => "kafka",
        };
        Some(breakwater::queue::QueueSection {
            backend: backend.to_owned(),
            url: Some(url.to_owned()),
            name: Some(name.to_owned()),
            ..breakwater::queue::QueueSection::default()
        })
    }

    /// Removes what a run made on the broker (nothing for the local
    /// stores, whose folder the caller removes).
    pub async fn remove(self, url: &str, name: &str) {
        let removed = match self {
            Self::Embedded | Self::Log => Ok(()),
            Self::Nats => breakwater_queue_nats::NatsQueue::destroy(url, name).await,
            Self::Rabbitmq => {
                let config = breakwater_queue_rabbitmq::RabbitMqConfig::default();
                breakwater_queue_rabbitmq::RabbitMqQueue::destroy(url, name, &config).await
            }
            Self::Sqs => {
                let endpoint = breakwater_queue_sqs::Endpoint::at(Some(url.to_owned()));
                let config = breakwater_queue_sqs::SqsConfig::default();
                breakwater_queue_sqs::SqsQueue::destroy(&endpoint, name, &config).await
            }
            Self::Kafka => {
                let config = breakwater_queue_kafka::KafkaConfig::default();
                breakwater_queue_kafka::KafkaQueue::destroy(url, name, &config).await;
                Ok(())
            }
        };
        if let Err(e) = removed {
            tracing::warn!(error = %e, queue = name, "the run's broker queues were not removed");
        }
    }
}
