//! The dead-letter topic. Kafka cannot address or delete one record, so a
//! dead letter is a record keyed by its id on a compacted topic, and a
//! replayed or purged one is a tombstone (the same key, no value): reading
//! the topic from the start, the last record of each key says whether it is
//! still there. Ids sort by the time of death, so a listing is oldest
//! first.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use breakwater_queue::envelope::Meta;
use breakwater_queue::{DeadLetter, QueueError};
use bytes::Bytes;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::{Offset, TopicPartitionList};

use crate::wire;

/// How long the scan polls on past the high watermark for records the
/// broker did not count.
const QUIET: Duration = Duration::from_millis(100);

/// A new dead letter's id: its time of death, then a random part.
pub(crate) fn new_id(dead_at_ms: i64) -> String {
    format!("{dead_at_ms:013}-{:08x}", rand::rng().random::<u32>())
}

/// A dead letter as the topic holds it.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) meta: Meta,
    pub(crate) body: Bytes,
}

impl Record {
    pub(crate) fn to_dead_letter(&self, id: &str, with_body: bool) -> DeadLetter {
        let body = with_body.then(|| String::from_utf8_lossy(&self.body).into_owned());
        self.meta.dead_letter(id.to_owned(), body)
    }
}

/// Reads the dead-letter topic `topic` from the start to its end (at most
/// `max` records, within `timeout`) with `consumer` (one that never
/// joins its group); returns the dead letters still there, by id.
///
/// The end is the high watermark, and then whatever a further poll still
/// brings within [`QUIET`]: a broker may report a watermark short of the
/// records it holds (tansu counts a batch of several records as one), and
/// the last batch comes whole anyway.
pub(crate) fn scan(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: i32,
    max: usize,
    timeout: Duration,
) -> Result<BTreeMap<String, Record>, QueueError> {
    let unavailable = |e: rdkafka::error::KafkaError| QueueError::Unavailable(e.to_string());
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions.max(1) {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(unavailable)?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(unavailable)?;
        }
    }
    let mut live = BTreeMap::new();
    if ends.is_empty() {
        return Ok(live);
    }
    consumer.assign(&tpl).map_err(unavailable)?;
    let deadline = Instant::now() + timeout;
    let mut read = 0usize;
    while read < max {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            let _ = consumer.unassign();
            return Err(QueueError::Unavailable(format!(
                "the dead-letter topic {topic} was not read to its end within {timeout:?}"
            )));
        };
        let past_the_end = ends.is_empty();
        let wait = if past_the_end {
            QUIET
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(left.min(wait)) {
            Some(Ok(m)) => {
                read += 1;
                if ends
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() + 1 >= *end)
                {
                    ends.remove(&m.partition());
                }
                let Some(id) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                    continue;
                };
                let value = m.payload().unwrap_or_default();
                let meta = m
                    .headers()
                    .and_then(|h| wire::read(h.iter().map(|h| (h.key, h.value)), value).ok());
                match meta {
                    Some(read) => {
                        let body = Bytes::copy_from_slice(value);
                        live.insert(
                            id.to_owned(),
                            Record {
                                meta: read.meta,
                                body,
                            },
                        );
                    }
                    // A tombstone (no value, no headers): replayed or
                    // purged.
                    None => {
                        live.remove(id);
                    }
                }
            }
            Some(Err(e)) => {
                let _ = consumer.unassign();
                return Err(unavailable(e));
            }
            None if past_the_end => break,
            None => {}
        }
    }
    let _ = consumer.unassign();
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_the_time_of_death() {
        let (a, b, c) = (new_id(9), new_id(10), new_id(1_700_000_000_000));
        assert!(a < b && b < c, "{a} {b} {c}");
    }
}
