//! Where the leader's status page is, for a follower's page to link to.
//!
//! Replicas know each other's Raft addresses, not their HTTP ones: each reports its own
//! page's URL in its Raft status ([`docket_raft::status::ReplicaStatus::status_page`]). A
//! follower asks the leader once per leader and term, within a short deadline, and keeps the
//! answer; a page rendered while the leader does not answer simply has no link.
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

/// The last answer.
#[derive(Debug, Default, Clone)]
pub struct LeaderPages {
    known: Arc<Mutex<Option<Answer>>>,
}

impl LeaderPages {
    /// The leader's page as `replica` sees the leader now; `None` on the leader itself, with
    /// no leader, or when the leader names none or does not answer in time.
    pub async fn find(&self, replica: &Replica<CoreMachine>) -> Option<String> {
        let me = replica.status();
        if me.role == Role::Leader {
            return None;
        }
        let (leader, addr) = (me.leader?, me.leader_addr?);
        if let Some((id, term, page)) = self.lock().as_ref()
            && (*id, *term) == (leader, me.term)
        {
            return page.clone();
        }
        // An unanswered ask is not kept: the next page asks again.
        let answer = replica.channels().status(&addr, ASK_WITHIN).await.ok()?;
        let page = answer.status_page.filter(|url| linkable(url));
        *self.lock() = Some((leader, me.term, page.clone()));
        page
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Answer>> {
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
