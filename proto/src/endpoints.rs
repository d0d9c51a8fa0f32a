//! The replicas a client asks, in order, following the leader a refusal names.
//!
//! Every client of the controllers — the commands, the node agents — holds the same few
//! addresses and the same rules: ask them in turn; a replica that does not lead refuses a
//! call only the leader serves and names the leader ([`crate::metadata::LEADER`]), which is
//! asked next; one that did not answer is asked last from then on. This is those rules,
//! written once; what counts as "did not answer" and how long to keep trying is each
//! client's own.

use std::collections::VecDeque;

/// The controllers' addresses and the order to ask them in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Every address, in the order a round asks them (the silent ones last).
    order: Vec<String>,
    /// What the current round has still to ask, first first.
    round: VecDeque<String>,
}

impl Endpoints {
    /// `addrs` in that order; the first round begins.
    pub fn new(addrs: Vec<String>) -> Endpoints {
        let round = addrs.iter().cloned().collect();
        Endpoints {
            order: addrs,
            round,
        }
    }

    /// Every address, in the order a round asks them.
    pub fn all(&self) -> &[String] {
        &self.order
    }

    /// The next address of this round; None once every one was asked.
    pub fn next_to_ask(&mut self) -> Option<String> {
        self.round.pop_front()
    }

    /// Begins another round, in the current order.
    pub fn next_round(&mut self) {
        self.round = self.order.iter().cloned().collect();
    }

    /// `addr` did not answer: every later round asks it last.
    pub fn ask_last(&mut self, addr: &str) {
        if let Some(pos) = self.order.iter().position(|a| a == addr) {
            let moved = self.order.remove(pos);
            self.order.push(moved);
        }
    }

    /// Asks `addr` again, before anything else of this round.
    pub fn ask_again(&mut self, addr: String) {
        self.round.push_front(addr);
    }

    /// If `refusal` names the leader and it is not `from` (which just refused), asks it
    /// next; whether it did.
    pub fn follow(&mut self, refusal: &tonic::Status, from: &str) -> bool {
        match leader_hint(refusal) {
            Some(leader) if leader != from => {
                self.round.push_front(leader.to_owned());
                true
            }
            _ => false,
        }
    }
}

/// The leader a refusal names, if it names one.
pub fn leader_hint(refusal: &tonic::Status) -> Option<&str> {
    refusal
        .metadata()
        .get(crate::metadata::LEADER)
        .and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(leader: &str) -> tonic::Status {
        let mut s = tonic::Status::failed_precondition("not the leader");
        s.metadata_mut()
            .insert(crate::metadata::LEADER, leader.parse().unwrap());
        s
    }

    #[test]
    fn rounds_follow_the_named_leader_and_ask_the_silent_last() {
        let mut e = Endpoints::new(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(e.next_to_ask().as_deref(), Some("a"));
        // a refuses and names c: c is next, then the round goes on.
        assert!(e.follow(&refusal("c"), "a"));
        assert_eq!(e.next_to_ask().as_deref(), Some("c"));
        assert_eq!(e.next_to_ask().as_deref(), Some("b"));
        // A replica that names itself is not asked again at once.
        assert!(!e.follow(&refusal("b"), "b"));
        // A plain refusal names nobody.
        assert!(!e.follow(&tonic::Status::unavailable("no leader yet"), "b"));
        assert_eq!(e.next_to_ask().as_deref(), Some("c"));
        assert_eq!(e.next_to_ask(), None);
        // a was silent: later rounds ask it last.
        e.ask_last("a");
        e.next_round();
        let round: Vec<String> = std::iter::from_fn(|| e.next_to_ask()).collect();
        assert_eq!(round, ["b", "c", "a"]);
        e.ask_again("c".into());
        assert_eq!(e.next_to_ask().as_deref(), Some("c"));
        assert_eq!(e.all(), ["b", "c", "a"]);
    }
}
