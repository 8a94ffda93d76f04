//! `explain --host --trace` on iptables-legacy nodes: the kernel's RECORD of the connection,
//! not a trace of it.
//!
//! ip_tables' TRACE lines go to whichever nf_log logger is bound to the family in the
//! namespace; in the node's own namespace that is the node admin's (syslog for LOG/TRACE), and
//! binding nfnetlink_log there would take their output away for the duration (and for good
//! after a SIGKILL). So nothing is bound and no rule is added: [`record`] makes the real
//! connection from the node namespace (as `--uid`/`--gid`, the same connecting thread as every
//! trace), then reads what the kernel kept of it:
//! - its conntrack entry over ctnetlink, by the original tuple (the verdict: the reply tuple's
//!   destination is the source an SNAT gave it, or its own when nothing NATed it);
//! - the packet counters of nat `ISTIO_POSTRT`'s rules and POSTROUTING's jumps to it, before
//!   and after (`iptables-legacy-save -c -t nat`; corroboration only: concurrent probes move
//!   them too).
//!
//! Nothing is left to clean up, so no signal handling is needed: a kill leaves nothing behind.

use super::super::conntrack::{self, CtEntry, CtTuple};
use super::super::{Attempt, CONNECT_TIMEOUT, Connection, Netns, TraceError, connect};
use crate::live_legacy::HOST_CHAIN;
use iptables_legacy::Tools;
use std::time::Duration;

/// What `explain --host --trace` reports on an iptables-legacy node, for [`crate::compare`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRecord {
    /// What the connection attempt itself saw.
    pub attempt: Attempt,
    /// The original tuple looked up in conntrack; `None`: no packet left the socket.
    pub original: Option<CtTuple>,
    /// The connection's conntrack entry; `None`: the kernel holds none.
    pub conntrack: Option<CtEntry>,
    /// The host rule's packet counters around the connection.
    pub counters: Vec<RuleCounter>,
}

/// One rule's packet counter before and after the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleCounter {
    pub chain: String,
    /// Its position in its chain as the kernel numbers it (1-based).
    pub position: usize,
    /// The rule as iptables-legacy-save prints it (`-A ISTIO_POSTRT ...`).
    pub text: String,
    pub before: u64,
    pub after: u64,
}

impl RuleCounter {
    /// Packets counted meanwhile (ours, and any other connection's).
    pub fn moved(&self) -> u64 {
        self.after.saturating_sub(self.before)
    }

    /// Whether the rule rewrites the source (`-j SNAT`).
    pub fn is_snat(&self) -> bool {
        self.text.contains("-j SNAT")
    }
}

/// How long the connection may take: it gives up by itself after [`CONNECT_TIMEOUT`].
const ATTEMPT_WAIT: Duration = Duration::from_secs(CONNECT_TIMEOUT.as_secs() + 1);

/// Makes `conn` from the node namespace `ns` and reads the kernel's record of it (see the
/// module doc).
pub(in crate::trace) fn record(ns: &Netns, conn: &Connection) -> Result<KernelRecord, TraceError> {
    let tools = Tools::default();
    let v6 = conn.is_ipv6();
    let before = ns.run(|| counters(&tools, v6))?;
    // Subscribed before the connection: its entry is kept even if the kernel destroys it
    // before it is read (a refused connection's RST ends the unassured entry at once).
    let events = ns.run(conntrack::Events::subscribe)?;
    let prober = connect::Prober::start(ns, conn)?;
    prober.go();
    let attempt = prober.wait(ATTEMPT_WAIT).unwrap_or(Attempt::TimedOut);
    let original = prober.sent_from().map(|src| CtTuple { src, dst: conn.dst });
    let entry = match &original {
        Some(t) => match ns.run(|| conntrack::get(conn.protocol, t))? {
            Some(e) => Some(e),
            None => events.find(conn.protocol, t)?,
        },
        None => None,
    };
    let after = ns.run(|| counters(&tools, v6))?;
    tracing::debug!(
        ?attempt,
        ?entry,
        "the kernel's record of the host connection"
    );
    Ok(KernelRecord {
        attempt,
        original,
        conntrack: entry,
        counters: joined(before, after),
    })
}

/// A rule's counter as read once: chain, position, text, packets.
type Counted = (String, usize, String, u64);

/// The host rule's counters now (current namespace). No nat table: no rule, none counted.
fn counters(tools: &Tools, v6: bool) -> Result<Vec<Counted>, TraceError> {
    let text = iptables_legacy::live::table_with_counters(tools, v6, "nat").map_err(|source| {
        TraceError::Legacy {
            what: "reading the host rule's counters (iptables-legacy-save -c -t nat)".into(),
            source,
        }
    })?;
    Ok(text.as_deref().map(host_counters).unwrap_or_default())
}

/// The counters of `ISTIO_POSTRT`'s rules and of POSTROUTING's jumps to it in `-c` save
/// output (`[packets:bytes] -A CHAIN ...`). Pure.
pub fn host_counters(save_text: &str) -> Vec<Counted> {
    let jump = format!("-j {HOST_CHAIN}");
    let mut positions: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    for line in save_text.lines() {
        let Some((counts, rule)) = line.strip_prefix('[').and_then(|l| l.split_once("] ")) else {
            continue;
        };
        let Some(chain) = rule
            .strip_prefix("-A ")
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        let position = match positions.iter_mut().find(|(c, _)| c == chain) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                positions.push((chain.to_string(), 1));
                1
            }
        };
        let ours = chain == HOST_CHAIN || (chain == "POSTROUTING" && rule.ends_with(&jump));
        let packets = counts.split(':').next().and_then(|p| p.parse().ok());
        if let (true, Some(packets)) = (ours, packets) {
            out.push((chain.to_string(), position, rule.to_string(), packets));
        }
    }
    out
}

/// Before and after, rule by rule (a rule only in one of them is left out: it changed).
fn joined(before: Vec<Counted>, after: Vec<Counted>) -> Vec<RuleCounter> {
    after
        .into_iter()
        .filter_map(|(chain, position, text, now)| {
            let (_, _, _, then) = before
                .iter()
                .find(|(c, p, t, _)| *c == chain && *p == position && *t == text)?;
            Some(RuleCounter {
                chain,
                position,
                text,
                before: *then,
                after: now,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_the_host_rule_and_its_jump_only() {
        let save = "# Generated by iptables-save\n*nat\n:POSTROUTING ACCEPT [9:540]\n\
                    :ISTIO_POSTRT - [0:0]\n:KUBE-POSTROUTING - [0:0]\n\
                    [7:420] -A POSTROUTING -j KUBE-POSTROUTING\n\
                    [3:180] -A POSTROUTING -j ISTIO_POSTRT\n\
                    [2:120] -A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127\n\
                    [5:300] -A KUBE-POSTROUTING -j RETURN\nCOMMIT\n";
        let c = host_counters(save);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(
            (c[0].0.as_str(), c[0].1, c[0].3),
            ("POSTROUTING", 2, 3),
            "the real position in POSTROUTING"
        );
        assert_eq!((c[1].0.as_str(), c[1].1, c[1].3), (HOST_CHAIN, 1, 2));
        assert!(c[1].2.starts_with("-A ISTIO_POSTRT -p tcp"));
        let after: Vec<Counted> = c
            .iter()
            .map(|(a, b, t, n)| (a.clone(), *b, t.clone(), n + 1))
            .collect();
        let j = joined(c, after);
        assert_eq!(j[1].moved(), 1);
        assert!(j[1].is_snat() && !j[0].is_snat());
    }
}
