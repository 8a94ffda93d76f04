//! Istio's legacy host probe rule on the node: `nat POSTROUTING`'s rules up to its (last) jump
//! to [`HOST_CHAIN`], numbered as the kernel numbers them, with every user chain they jump
//! to (kube-proxy's beside it included, so a rule before our jump is evaluated, or named as
//! one that cannot be), and the ipsets they match as sets. The rules after our jump are not
//! read: [`host_notes`] names them.

use super::{load_ipsets, read_saves};
use crate::ir::Ruleset;
use iptables_legacy::live::{SavedTable, ipset_members, our_save, parse};
use iptables_legacy::{LegacyError, Tools};

/// The chain of Istio's legacy host probe rule (nat, jumped to from POSTROUTING).
pub const HOST_CHAIN: &str = "ISTIO_POSTRT";

/// The node's host probe rule (both families), with the ipsets it matches; an empty ruleset
/// when there is none.
pub fn host_ruleset() -> Result<Ruleset, LegacyError> {
    host_ruleset_with(&Tools::default())
}

/// [`host_ruleset`] with explicit binary lookup.
pub fn host_ruleset_with(tools: &Tools) -> Result<Ruleset, LegacyError> {
    let mut rs = read_saves(tools, |text| host_rule_only(&text))?;
    load_ipsets(&mut rs, |name| {
        Ok(ipset_members(tools, name)?.iter().map(|m| m.addr).collect())
    });
    Ok(rs)
}

/// What the explanation of the node's rules leaves out (both families): the rules of `nat
/// POSTROUTING` after the jump to [`HOST_CHAIN`].
pub fn host_notes() -> Result<Vec<String>, LegacyError> {
    let tools = Tools::default();
    let mut notes = Vec::new();
    for v6 in [false, true] {
        if let Some(text) = our_save(&tools, v6)? {
            notes.extend(after_our_jump(&text, v6));
        }
    }
    Ok(notes)
}

fn nat(save_text: &str) -> Option<SavedTable> {
    parse(save_text).into_iter().find(|t| t.name == "nat")
}

/// The (1-based, as the kernel numbers them) position of POSTROUTING's last jump to
/// [`HOST_CHAIN`].
fn our_jump(nat: &SavedTable) -> Option<usize> {
    let jump = format!("-j {HOST_CHAIN}");
    nat.rules_of("POSTROUTING")
        .enumerate()
        .filter(|(_, r)| r.trim() == jump)
        .map(|(i, _)| i + 1)
        .last()
}

/// The user chain a rule jumps or goes to, if it names one of `nat`'s.
fn jumps_to<'a>(nat: &'a SavedTable, rule: &str) -> Option<&'a str> {
    let w: Vec<&str> = rule.split_whitespace().collect();
    let t = w
        .windows(2)
        .find(|p| p[0] == "-j" || p[0] == "-g")
        .map(|p| p[1])?;
    nat.chains
        .iter()
        .find(|c| *c == t && !is_builtin(c))
        .map(String::as_str)
}

fn is_builtin(chain: &str) -> bool {
    matches!(
        chain,
        "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
    )
}

/// The save text of `nat` reduced to what a connection from the node crosses up to the host
/// probe rule: POSTROUTING's rules up to and including its last jump to [`HOST_CHAIN`] (so
/// they keep the kernel's numbers), and every user chain reachable from them; `None` without
/// the host rule.
pub fn host_rule_only(save_text: &str) -> Option<String> {
    let nat = nat(save_text)?;
    if !nat.chains.iter().any(|c| c == HOST_CHAIN) {
        return None;
    }
    let upto = our_jump(&nat).unwrap_or(0);
    let post: Vec<&str> = nat.rules_of("POSTROUTING").take(upto).collect();
    let mut chains: Vec<&str> = vec![HOST_CHAIN];
    let mut i = 0;
    let mut pending: Vec<&str> = post.clone();
    loop {
        for r in std::mem::take(&mut pending) {
            if let Some(c) = jumps_to(&nat, r)
                && !chains.contains(&c)
            {
                chains.push(c);
            }
        }
        let Some(c) = chains.get(i) else { break };
        pending.extend(nat.rules_of(c));
        i += 1;
    }
    let mut out = "*nat\n:POSTROUTING ACCEPT [0:0]\n".to_string();
    for c in &chains {
        out.push_str(&format!(":{c} - [0:0]\n"));
    }
    for r in post {
        out.push_str(&format!("-A POSTROUTING {r}\n"));
    }
    for c in &chains {
        for r in nat.rules_of(c) {
            out.push_str(&format!("-A {c} {r}\n"));
        }
    }
    out.push_str("COMMIT\n");
    Some(out)
}

/// A note naming POSTROUTING's rules after the jump to [`HOST_CHAIN`] (not read: a connection
/// the host rule SNATs never reaches them; one it does not may be NATed by them).
fn after_our_jump(save_text: &str, v6: bool) -> Option<String> {
    let nat = nat(save_text)?;
    let at = our_jump(&nat)?;
    let total = nat.rules_of("POSTROUTING").count();
    (total > at).then(|| {
        let fam = if v6 { "ip6" } else { "ip" };
        let which = if total == at + 1 {
            format!("rule {total}")
        } else {
            format!("rules {}-{total}", at + 1)
        };
        format!(
            "{fam} nat POSTROUTING: {which} after the jump to {HOST_CHAIN} (rule {at}) not \
             evaluated: a connection {HOST_CHAIN} does not SNAT reaches them, and they may NAT it"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBE: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-OTHER - [0:0]\n:ISTIO_POSTRT - [0:0]\n-A POSTROUTING -d 10.79.0.2/32 -p tcp -m tcp --dport 8080 -j MASQUERADE\n-A POSTROUTING -j KUBE-POSTROUTING\n-A POSTROUTING -j ISTIO_POSTRT\n-A POSTROUTING -j KUBE-OTHER\n-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-OTHER -j MASQUERADE\n-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127\nCOMMIT\n";

    #[test]
    fn keeps_the_rules_before_our_jump_with_the_chains_they_jump_to() {
        let host = host_rule_only(KUBE).unwrap();
        let post: Vec<&str> = host
            .lines()
            .filter(|l| l.starts_with("-A POSTROUTING"))
            .collect();
        assert_eq!(
            post,
            [
                "-A POSTROUTING -d 10.79.0.2/32 -p tcp -m tcp --dport 8080 -j MASQUERADE",
                "-A POSTROUTING -j KUBE-POSTROUTING",
                "-A POSTROUTING -j ISTIO_POSTRT",
            ]
        );
        assert!(host.contains(":KUBE-POSTROUTING - [0:0]\n"), "{host}");
        assert!(host.contains("-A KUBE-POSTROUTING -m mark"), "{host}");
        assert!(!host.contains("KUBE-OTHER"), "{host}");
        assert_eq!(
            after_our_jump(KUBE, false).unwrap(),
            "ip nat POSTROUTING: rule 4 after the jump to ISTIO_POSTRT (rule 3) not \
             evaluated: a connection ISTIO_POSTRT does not SNAT reaches them, and they may NAT it"
        );
    }
}
