//! Dead letters filtered by source, class or event id, on every backend:
//! the contract's `dlq_list` read page by page and filtered here. The DLQ
//! is small and rare next to the queue, so a scan is cheap, and bounded
//! (`scan_max` per call) so one request cannot walk a huge one; the
//! answer's `next_after` says where the next call goes on.

use std::future::Future;

use serde::{Deserialize, Serialize};

use crate::{DeadLetter, DlqPage, Queue, QueueError};

/// Which dead letters a search keeps: every field set must match exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DlqFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `permanent` or `exhausted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_key: Option<String>,
}

impl DlqFilter {
    /// Keeps every dead letter.
    pub fn is_empty(&self) -> bool {
        self.source.is_none()
            && self.class.is_none()
            && self.event_id.is_none()
            && self.entity_key.is_none()
    }

    pub fn matches(&self, d: &DeadLetter) -> bool {
        let same = |want: &Option<String>, got: &str| want.as_deref().is_none_or(|w| w == got);
        same(&self.source, &d.source)
            && same(&self.class, &d.class)
            && same(&self.event_id, &d.event_id)
            && self
                .entity_key
                .as_deref()
                .is_none_or(|w| d.entity_key.as_deref() == Some(w))
    }
}

/// One page of a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqSearch {
    /// Up to the page's `limit` matches, oldest first.
    pub items: Vec<DeadLetter>,
    /// Where the next page starts (the `after` of the next call); `None`
    /// when the DLQ has nothing past this page.
    pub next_after: Option<String>,
    /// Dead letters read to find these.
    pub scanned: usize,
}

/// Dead letters after `page.after` that pass `filter`, up to `page.limit`,
/// reading at most `scan_max` of them.
pub async fn dlq_search(
    queue: &dyn Queue,
    filter: &DlqFilter,
    page: &DlqPage,
    scan_max: usize,
) -> Result<DlqSearch, QueueError> {
    search_pages(
        |p| async move { queue.dlq_list(&p).await },
        filter,
        page,
        scan_max,
    )
    .await
}

/// [`dlq_search`] over any lister of pages.
async fn search_pages<L, F>(
    mut list: L,
    filter: &DlqFilter,
    page: &DlqPage,
    scan_max: usize,
) -> Result<DlqSearch, QueueError>
where
    L: FnMut(DlqPage) -> F,
    F: Future<Output = Result<Vec<DeadLetter>, QueueError>>,
{
    let limit = page.limit.max(1);
    // Unfiltered, one page of the contract is the answer.
    let chunk = if filter.is_empty() {
        limit
    } else {
        limit.clamp(100, 1000)
    };
    let mut after = page.after.clone();
    let mut found = DlqSearch {
        items: Vec::new(),
        next_after: None,
        scanned: 0,
    };
    loop {
        let want = chunk.min(scan_max.saturating_sub(found.scanned)).max(1);
        let read = list(DlqPage {
            limit: want,
            after: after.clone(),
        })
        .await?;
        let full = read.len() == want;
        for d in read {
            found.scanned += 1;
            after = Some(d.id.clone());
            if filter.matches(&d) {
                found.items.push(d);
                if found.items.len() == limit {
                    // The rest of this chunk is read again next time.
                    found.next_after = after;
                    return Ok(found);
                }
            }
        }
        if !full {
            return Ok(found);
        }
        if found.scanned >= scan_max {
            found.next_after = after;
            return Ok(found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(id: u32, source: &str, class: &str) -> DeadLetter {
        DeadLetter {
            id: format!("{id:04}"),
            source: source.to_owned(),
            event_id: format!("evt_{id}"),
            entity_key: None,
            attempts: 1,
            replays: 0,
            class: class.to_owned(),
            error: "boom".to_owned(),
            received_at_ms: 0,
            dead_at_ms: 0,
            body: None,
        }
    }

    /// A DLQ of `n` letters, every third from `github` and `exhausted`.
    fn dlq(n: u32) -> Vec<DeadLetter> {
        (1..=n)
            .map(|i| {
                if i % 3 == 0 {
                    letter(i, "github", "exhausted")
                } else {
                    letter(i, "stripe", "permanent")
                }
            })
            .collect()
    }

    async fn search(
        all: &[DeadLetter],
        filter: &DlqFilter,
        page: &DlqPage,
        scan_max: usize,
    ) -> DlqSearch {
        let lister = |p: DlqPage| {
            let start = p.after.as_ref().map_or(0, |a| {
                all.iter()
                    .position(|d| &d.id == a)
                    .map_or(all.len(), |i| i + 1)
            });
            let items: Vec<DeadLetter> = all[start..].iter().take(p.limit).cloned().collect();
            async move { Ok(items) }
        };
        search_pages(lister, filter, page, scan_max)
            .await
            .expect("the fake lister never fails")
    }

    #[tokio::test]
    async fn a_filtered_search_pages_through_every_match_once() {
        let all = dlq(1000);
        let filter = DlqFilter {
            source: Some("github".to_owned()),
            ..DlqFilter::default()
        };
        let mut seen = Vec::new();
        let mut page = DlqPage::first(50);
        loop {
            let found = search(&all, &filter, &page, 10_000).await;
            assert!(found.items.len() <= 50);
            assert!(found.items.iter().all(|d| d.source == "github"));
            seen.extend(found.items.into_iter().map(|d| d.id));
            match found.next_after {
                Some(after) => page.after = Some(after),
                None => break,
            }
        }
        let expected: Vec<String> = all
            .iter()
            .filter(|d| d.source == "github")
            .map(|d| d.id.clone())
            .collect();
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn a_search_stops_after_scan_max_and_says_where_to_go_on() {
        let all = dlq(1000);
        let filter = DlqFilter {
            event_id: Some("evt_900".to_owned()),
            ..DlqFilter::default()
        };
        let first = search(&all, &filter, &DlqPage::first(10), 300).await;
        assert!(first.items.is_empty());
        assert_eq!(first.scanned, 300);
        assert_eq!(first.next_after.as_deref(), Some("0300"));
        let mut page = DlqPage::first(10);
        page.after = first.next_after;
        let rest = search(&all, &filter, &page, 10_000).await;
        assert_eq!(rest.items.len(), 1);
        assert_eq!(rest.items[0].id, "0900");
        assert_eq!(rest.next_after, None, "the scan reached the end");
    }

    #[tokio::test]
    async fn every_field_of_the_filter_must_match() {
        let all = dlq(30);
        let filter = DlqFilter {
            source: Some("stripe".to_owned()),
            class: Some("exhausted".to_owned()),
            event_id: None,
            entity_key: None,
        };
        let found = search(&all, &filter, &DlqPage::first(100), 10_000).await;
        assert!(found.items.is_empty(), "no stripe letter is exhausted");
        let unfiltered = search(&all, &DlqFilter::default(), &DlqPage::first(100), 10_000).await;
        assert_eq!(unfiltered.items.len(), 30);
    }
}
