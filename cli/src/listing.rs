//! Every job (or accounting record) a listing selects, page after page.
//!
//! The controllers answer `ListJobs` and `Accounting` a page at a time (at most 10,000
//! entries, then a token for the next page), so one answer is not the whole. Every command
//! that acts on or shows "all that match" (`squeue`, `scancel -n/-u/-p/-t`, `qstat`,
//! `scontrol show job`, `sacct`) reads through here; reading one page only would make
//! `scancel -n NAME` report success and leave the jobs past the first 10,000 in the queue.

use std::future::Future;

use anyhow::{Result, anyhow};
use docket_proto::v1 as pb;

use crate::client::{Client, rpc};

/// The most entries a page may hold (the controllers' limit).
pub const PAGE_SIZE: u32 = 10_000;

/// The most entries one listing gathers before it is refused: far more than any queue or
/// accounting window holds (the controllers' own limits keep it to a few million), and a
/// server that keeps answering "more" ends here, not in memory.
const MAX_ENTRIES: usize = 20_000_000;

/// A request the controllers answer a page at a time.
pub trait PagedRequest: Clone {
    /// The page size asked for (0: the controllers' default).
    fn page_size(&mut self) -> &mut u32;
    /// The token of the page asked for (empty: the first).
    fn page_token(&mut self) -> &mut String;
}

/// One page of an answer: its entries, and the token of the next page (empty on the last).
pub trait Page {
    type Entry;
    fn into_parts(self) -> (Vec<Self::Entry>, String);
}

impl PagedRequest for pb::ListJobsRequest {
    fn page_size(&mut self) -> &mut u32 {
        &mut self.page_size
    }
    fn page_token(&mut self) -> &mut String {
        &mut self.page_token
    }
}

impl Page for pb::ListJobsResponse {
    type Entry = pb::JobInfo;
    fn into_parts(self) -> (Vec<pb::JobInfo>, String) {
        (self.jobs, self.next_page_token)
    }
}

impl PagedRequest for pb::AccountingRequest {
    fn page_size(&mut self) -> &mut u32 {
        &mut self.page_size
    }
    fn page_token(&mut self) -> &mut String {
        &mut self.page_token
    }
}

impl Page for pb::AccountingResponse {
    type Entry = pb::AccountingRecord;
    fn into_parts(self) -> (Vec<pb::AccountingRecord>, String) {
        (self.records, self.next_page_token)
    }
}

/// Every job `request` selects, asking the controllers page after page.
pub async fn all_jobs(client: &Client, request: pb::ListJobsRequest) -> Result<Vec<pb::JobInfo>> {
    all_pages(request, |req| async move {
        rpc!(client, jobs_read, list_jobs, req.clone()).await
    })
    .await
}

/// Every accounting record `request` selects, page after page.
pub async fn all_records(
    client: &Client,
    request: pb::AccountingRequest,
) -> Result<Vec<pb::AccountingRecord>> {
    all_pages(request, |req| async move {
        rpc!(client, jobs_read, accounting, req.clone()).await
    })
    .await
}

/// Every entry of the pages `fetch` answers for `request`, following each page's token
/// until a page says it is the last. A token seen before (a server going round in circles)
/// is an error, not a loop, and so is a listing past [`MAX_ENTRIES`].
pub async fn all_pages<R, P, F, Fut>(mut request: R, mut fetch: F) -> Result<Vec<P::Entry>>
where
    R: PagedRequest,
    P: Page,
    F: FnMut(R) -> Fut,
    Fut: Future<Output = Result<P>>,
{
    if *request.page_size() == 0 {
        *request.page_size() = PAGE_SIZE;
    }
    let mut entries = Vec::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let (page, next) = fetch(request.clone()).await?.into_parts();
        entries.extend(page);
        if next.is_empty() {
            return Ok(entries);
        }
        if entries.len() > MAX_ENTRIES {
            return Err(anyhow!(
                "the listing did not end within {MAX_ENTRIES} entries; narrow it (users, \
                 partitions, states, job ids, times)"
            ));
        }
        if !seen.insert(next.clone()) {
            return Err(anyhow!(
                "the controller answered the page after {:?} with a token it gave before ({next:?})",
                request.page_token(),
            ));
        }
        *request.page_token() = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue of `n` jobs named by parity, answered `page` at a time as the controllers do
    /// (the token is the last job id of the page).
    fn serve(n: u64, page: usize, req: &pb::ListJobsRequest) -> pb::ListJobsResponse {
        let after: u64 = req.page_token.parse().unwrap_or(0);
        let jobs: Vec<pb::JobInfo> = (after + 1..=n)
            .take(page)
            .map(|id| pb::JobInfo {
                job_id: id,
                name: if id % 2 == 0 { "even" } else { "odd" }.into(),
                ..Default::default()
            })
            .collect();
        let more = jobs.last().is_some_and(|j| j.job_id < n);
        pb::ListJobsResponse {
            next_page_token: if more {
                jobs.last()
                    .map(|j| j.job_id.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            },
            jobs,
        }
    }

    fn block_on<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    #[test]
    fn every_page_is_read_and_the_last_page_ends_the_listing() {
        let mut asked = 0;
        let jobs = block_on(all_pages(pb::ListJobsRequest::default(), |req| {
            asked += 1;
            assert_eq!(req.page_size, PAGE_SIZE, "the request asks for full pages");
            let page = serve(25_001, 10_000, &req);
            async move { Ok(page) }
        }))
        .expect("the listing");
        assert_eq!(asked, 3);
        assert_eq!(jobs.len(), 25_001);
        let ids: Vec<u64> = jobs.iter().map(|j| j.job_id).collect();
        assert!(
            ids.windows(2).all(|w| w[1] == w[0] + 1),
            "in order, once each"
        );
        // What `scancel -n odd` would cancel: the matches on every page, not the first's.
        let odd = jobs.iter().filter(|j| j.name == "odd").count();
        assert_eq!(odd, 12_501);
    }

    /// Lists from a server whose next token after `token` is `next(token)`, which must be
    /// refused as a token given before; how many pages were asked for.
    fn pages_before_a_repeated_token_is_refused(next: fn(&str) -> &'static str) -> usize {
        let mut asked = 0;
        let err = block_on(all_pages(pb::ListJobsRequest::default(), |req| {
            asked += 1;
            let token = next(&req.page_token);
            async move {
                Ok(pb::ListJobsResponse {
                    jobs: vec![pb::JobInfo::default()],
                    next_page_token: token.into(),
                })
            }
        }))
        .expect_err("a repeated token");
        assert!(err.to_string().contains("a token it gave before"), "{err}");
        asked
    }

    #[test]
    fn a_token_that_does_not_move_on_is_an_error_not_a_loop() {
        assert_eq!(pages_before_a_repeated_token_is_refused(|_| "7"), 2);
    }

    #[test]
    fn tokens_that_go_round_in_circles_are_an_error_not_a_loop() {
        // A, B, A, ...
        let cycle = |t: &str| if t == "A" { "B" } else { "A" };
        assert_eq!(pages_before_a_repeated_token_is_refused(cycle), 3);
    }

    #[test]
    fn an_error_on_a_later_page_is_the_listings_error() {
        let mut asked = 0;
        let err = block_on(all_pages(pb::ListJobsRequest::default(), |req| {
            asked += 1;
            let page = serve(30_000, 10_000, &req);
            let fail = asked == 2;
            async move {
                if fail {
                    Err(anyhow!("no controller answered"))
                } else {
                    Ok(page)
                }
            }
        }))
        .expect_err("the second page failed");
        assert!(err.to_string().contains("no controller"), "{err}");
    }
}
