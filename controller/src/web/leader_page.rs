//! Where the leader's status page is, for a follower's page to link to.
//!
//! Replicas know each other's Raft addresses, not their HTTP ones: each reports its own
//! page's URL in its Raft status ([`docket_raft::status::ReplicaStatus::status_page`]). A
//! follower asks the leader once per leader and term, within a short deadline, before it
//! takes its turn to render, and keeps the answer; a leader that does not answer is left
//! alone for a while, and a page rendered meanwhile simply has no link.
//!
//! The URL comes from a replica (certificate-authenticated), but it lands in an `href` on a
//! page anyone may open, so only a plain `http://` or `https://` URL of bounded length is
//! ever linked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use docket_raft::ReplicaId;
use docket_raft::replica::Replica;
use docket_raft::status::Role;

use crate::machine::CoreMachine;

/// How long a page waits for the leader's answer.
const ASK_WITHIN: Duration = Duration::from_millis(500);
/// The longest URL linked.
const MAX_URL: usize = 512;

/// An answer: the leader and term it is for, and its page if it named one.
type Answer = (ReplicaId, u64, Option<String>);

/// How long a leader that did not answer is left alone before it is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The last answer, and when a leader last failed to give one.
#[derive(Debug, Default)]
struct Known {
    answer: Option<Answer>,
    failed: Option<(ReplicaId, u64, tokio::time::Instant)>,
}

/// The leader's page as followers last heard it. One ask at a time: a page rendered while
/// another asks goes without the link rather than waiting.
#[derive(Debug, Default, Clone)]
pub struct LeaderPages {
    known: Arc<Mutex<Known>>,
    asking: Arc<tokio::sync::Mutex<()>>,
}

impl LeaderPages {
    /// The leader's page as `replica` sees the leader now; `None` on the leader itself, with
    /// no leader, or when the leader names none, does not answer in time, or is being asked.
    pub async fn find(&self, replica: &Replica<CoreMachine>) -> Option<String> {
        let me = replica.status();
        if me.role == Role::Leader {
            return None;
        }
        let (leader, addr) = (me.leader?, me.leader_addr?);
        {
            let known = self.lock();
            if let Some((id, term, page)) = &known.answer
                && (*id, *term) == (leader, me.term)
            {
                return page.clone();
            }
            if let Some((id, term, at)) = known.failed
                && (id, term) == (leader, me.term)
                && at.elapsed() < RETRY_AFTER
            {
                return None;
            }
        }
        let _asking = self.asking.try_lock().ok()?;
        match replica.channels().status(&addr, ASK_WITHIN).await {
            Ok(answer) => {
                let page = answer.status_page.filter(|url| linkable(url));
                self.lock().answer = Some((leader, me.term, page.clone()));
                page
            }
            Err(_) => {
                self.lock().failed = Some((leader, me.term, tokio::time::Instant::now()));
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A URL safe to put in a link: `http(s)://`, printable ASCII without spaces or quotes.
pub fn linkable(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() <= MAX_URL
        && url
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'<' | b'>' | b'`'))
}

#[cfg(test)]
mod tests {
    use super::linkable;

    #[test]
    fn only_plain_web_urls_are_linked() {
        assert!(linkable("http://10.0.0.1:7180/"));
        assert!(linkable("https://ctl1.example.org/"));
        for bad in [
            "javascript:alert(1)",
            "data:text/html,x",
            "http://x/\" onmouseover=\"alert(1)",
            "http://x/ y",
            "//evil.example/",
            &format!("http://{}", "a".repeat(600)),
        ] {
            assert!(!linkable(bad), "{bad}");
        }
    }
}
