//! Network namespaces for a local cluster whose replicas can really be cut off from each
//! other: each replica runs in its own namespace with one veth into a bridge in the host's
//! namespace (so replica-to-replica traffic is switched, no IP forwarding needed), on its own
//! address in a /24 private to the cluster; agents and clients stay in the host's namespace
//! and reach replicas over the bridge.
//!
//! A partition is a set of blackhole routes inside the namespaces involved: packets to the
//! other side are silently dropped, as a cut cable would drop them (no reset, no error),
//! until the routes are removed. Needs root; every name carries the cluster's tag so two
//! clusters on one host never touch each other's links.

use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::LaunchError;

/// The links and namespaces of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Net {
    /// `10.A.B` of the cluster's /24.
    pub prefix: String,
    pub bridge: String,
    /// Per replica id: (namespace, host-side veth).
    pub replicas: Vec<(u64, String, String)>,
}

fn ip(args: &[&str]) -> Result<(), LaunchError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(LaunchError::io("running ip (iproute2)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LaunchError::Invalid(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Net {
    /// Names and addresses for `replicas` replicas of the cluster tagged `tag` (8 hex).
    pub fn plan(tag: &str, replicas: u64) -> Net {
        let short: String = tag.chars().take(6).collect();
        let n = u32::from_str_radix(&short, 16).unwrap_or(0);
        let prefix = format!("10.{}.{}", 200 + n % 50, (n >> 8) % 250);
        Net {
            prefix,
            bridge: format!("dkb{short}"),
            replicas: (1..=replicas)
                .map(|id| (id, format!("dk{short}r{id}"), format!("dk{short}h{id}")))
                .collect(),
        }
    }

    /// The address replica `id` listens on.
    pub fn addr(&self, id: u64) -> String {
        format!("{}.{}", self.prefix, 10 + id)
    }

    /// The host's address on the bridge (the source of agents' and clients' packets).
    pub fn host_addr(&self) -> String {
        format!("{}.1", self.prefix)
    }

    fn ns_of(&self, id: u64) -> Result<&str, LaunchError> {
        self.replicas
            .iter()
            .find(|r| r.0 == id)
            .map(|r| r.1.as_str())
            .ok_or_else(|| LaunchError::Invalid(format!("no namespace for replica {id}")))
    }

    /// Creates the bridge, the namespaces and the links (tearing down leftovers first).
    pub fn create(&self) -> Result<(), LaunchError> {
        self.destroy();
        ip(&["link", "add", &self.bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", self.host_addr()),
            "dev",
            &self.bridge,
        ])?;
        ip(&["link", "set", &self.bridge, "up"])?;
        for (id, ns, host) in &self.replicas {
            let peer = format!("{host}p");
            ip(&["netns", "add", ns])?;
            ip(&["link", "add", host, "type", "veth", "peer", "name", &peer])?;
            ip(&["link", "set", &peer, "netns", ns])?;
            ip(&["link", "set", host, "master", &self.bridge])?;
            ip(&["link", "set", host, "up"])?;
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", ns, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            inside(&["link", "set", "lo", "up"])?;
            inside(&["link", "set", &peer, "name", "eth0"])?;
            inside(&[
                "addr",
                "add",
                &format!("{}/24", self.addr(*id)),
                "dev",
                "eth0",
            ])?;
            inside(&["link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// Removes everything `create` made (what is missing is skipped).
    pub fn destroy(&self) {
        for (_, ns, host) in &self.replicas {
            let _ = ip(&["netns", "del", ns]);
            let _ = ip(&["link", "del", host]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }

    /// `ip netns exec NS` for replica `id`'s processes.
    pub fn exec_prefix(&self, id: u64) -> Result<Vec<String>, LaunchError> {
        Ok(vec![
            "netns".into(),
            "exec".into(),
            self.ns_of(id)?.to_owned(),
        ])
    }

    fn route(&self, id: u64, verb: &str, to: &str) -> Result<(), LaunchError> {
        let ns = self.ns_of(id)?;
        ip(&[
            "netns",
            "exec",
            ns,
            "ip",
            "route",
            verb,
            "blackhole",
            &format!("{to}/32"),
        ])
    }

    /// Drops every packet between replica `a` and replica `b`, both ways.
    pub fn cut(&self, a: u64, b: u64) -> Result<(), LaunchError> {
        self.route(a, "add", &self.addr(b))?;
        self.route(b, "add", &self.addr(a))
    }

    /// Drops every packet between replica `id` and the host's namespace (agents, clients).
    pub fn cut_from_host(&self, id: u64) -> Result<(), LaunchError> {
        self.route(id, "add", &self.host_addr())
    }

    /// Removes every cut involving replica `id`.
    pub fn heal(&self, id: u64) -> Result<(), LaunchError> {
        let _ = self.route(id, "del", &self.host_addr());
        for (other, _, _) in &self.replicas {
            if *other != id {
                let _ = self.route(id, "del", &self.addr(*other));
                let _ = self.route(*other, "del", &self.addr(id));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_addresses_are_private_to_the_tag() {
        let a = Net::plan("deadbeef", 5);
        let b = Net::plan("0badf00d", 5);
        assert_ne!(a.prefix, b.prefix);
        assert!(a.prefix.starts_with("10.2"));
        for (_, ns, host) in &a.replicas {
            assert!(host.len() < 15, "{host}p is too long for a link name");
            assert!(ns.len() <= 15);
        }
        assert_eq!(a.addr(3), format!("{}.13", a.prefix));
        assert_eq!(a.host_addr(), format!("{}.1", a.prefix));
    }
}
