//! Kernel trace on iptables-legacy pods: ip_tables' `-j TRACE` instead of nft's `nftrace`.
//!
//! [`trace`] binds nfnetlink_log in the pod's namespace ([`ulog`]) BEFORE any rule exists,
//! inserts TRACE rules matching exactly the connection first in the `raw` table (`OUTPUT` for
//! outbound, `PREROUTING` for inbound; outbound also `PREROUTING -i lo` with the probe's
//! source port for the packet's second pass over lo), makes the connection or waits, deletes
//! the rules and puts the previous logger back. The rules are tagged `-m comment --comment
//! istio-explain-<pid>-<start>-<pidns>-<created>-<n>` (the nft tracer's chain names, see
//! `owner`), inserted and deleted through the
//! backend's own restore under the namespace's lock (`iptables_legacy::trace_rules`);
//! removal is guaranteed as for nft: a guard, SIGINT/SIGTERM handled for the duration of the
//! call, and the next run deleting the rules of a process that is gone ([`remove_stale`]).
//! Nothing of nftables is ever added to a legacy pod (the product never mixes backends in a
//! pod): the backend detection only reads nft's table list.
//!
//! What the kernel reports (observed on 6.18 in a fresh namespace, `iptables-legacy -t raw
//! -I OUTPUT 1 … -j TRACE` and a REDIRECT to a listener, nfnetlink_log bound by hand):
//! - Nothing until nfnetlink_log is bound to the family: a namespace starts with
//!   `nf_log_ipv4`/`nf_log_ipv6` bound, which log nothing outside the node's namespace.
//! - One `NFULNL_MSG_PACKET` per traced packet per matched rule, prefix `TRACE:
//!   table:chain:kind:rulenum ` on group 0, with the hook number and the packet as it is
//!   there (after a REDIRECT, its new destination). `kind` is `rule` for a rule that matched,
//!   `return` at the end of a user chain and `policy` at the end of a built-in one, numbered
//!   one past the chain's last rule. ip_tables reports an UNCONDITIONAL rule with a standard
//!   verdict (`-j ACCEPT`, `-j RETURN` without matches) as `return`/`policy` too, with its own
//!   number: the number tells them apart. Rules that did not match are silent, and no line
//!   says a verdict: a rule's is its target's (see [`lines::events`]).
//! - The TRACE rule that marks the packet is not reported (the packet was not traced yet when
//!   it matched); the rules after it in `raw`, the table's policy and every later table are.
//!   A trace rule matched by an already traced packet is reported, and left out.
//! - The mark survives the loop over lo: the second pass (`raw PREROUTING` on lo, NAT not
//!   consulted again) is reported like the first, so the second-pass rule only makes sure.
//! - Numbers count every rule of the chain, trace rules included: they are mapped to the
//!   explained ruleset's positions through the save output read while the rules were in
//!   place (`live_legacy::KernelNumbers`).
//! - There is no trace id: the traced packet's lines are told from others by its headers and
//!   by their order (`lines::Collector`).

pub mod host;
mod lines;
mod ulog;

use super::{
    Connection, Direction, KernelPath, Netns, Protocol, TRACE_CHAIN_PREFIX, TraceError, TraceHow,
    after_removal, hook, owner, start, watch,
};
use crate::live_legacy::{KernelNumbers, ruleset_of};
use iptables_legacy::Tools;
use iptables_legacy::trace_rules::{self, Tagged, TraceRule};
use netns::NsLock;
use std::time::{Duration, Instant};

/// How long a change waits for the namespace's lock (a CNI ADD or reconcile holds it for tens
/// of ms; a restore waiting on its input at most `-w 30`).
const LOCK_WAIT: Duration = Duration::from_secs(35);

fn legacy_err(what: &str) -> impl FnOnce(iptables_legacy::LegacyError) -> TraceError + '_ {
    move |source| TraceError::Legacy {
        what: what.into(),
        source,
    }
}

/// The namespace's lock, taken by a thread inside it.
fn lock(ns: &Netns) -> Result<NsLock, TraceError> {
    let name = crate::shown(ns.path());
    NsLock::current(&name, Instant::now() + LOCK_WAIT).map_err(|e| TraceError::Legacy {
        what: "taking the namespace's lock".into(),
        source: e.into(),
    })
}

/// Traces `conn` through the pod's iptables-legacy rules (see the module doc).
pub(super) fn trace(
    ns: &Netns,
    conn: &Connection,
    how: TraceHow,
) -> Result<KernelPath, TraceError> {
    let tools = Tools::default();
    let pf = if conn.is_ipv6() {
        libc::NFPROTO_IPV6
    } else {
        libc::NFPROTO_IPV4
    } as u8;
    // Bound before the rules exist: no line of the traced packet can be missed. And before
    // stale rules are deleted: a run refused because another trace holds the namespace
    // changes nothing.
    let mut listener = ns.run(|| ulog::LogSocket::open(pf))?;
    if let Err(e) = ns.run(|| remove_stale(ns, &tools)) {
        let _ = ns.run(|| listener.restore());
        return Err(e);
    }
    let st = match start(ns, conn, how) {
        Ok(st) => st,
        Err(e) => {
            let _ = ns.run(|| listener.restore());
            return Err(e);
        }
    };
    let watched = TempRules::add(ns, &tools, conn, st.sport).and_then(|rules| {
        let mut c = lines::Collector::new(conn, st.sport);
        let watched = watch::watch(&mut listener, &st.signals, st.prober.as_ref(), &mut c, how);
        let (tag, save) = (rules.tag.clone(), rules.save.clone());
        // Removed before the signal handlers go back to their defaults.
        let attempt = after_removal(watched, rules.remove())?;
        Ok((tag, save, c, attempt))
    });
    let restored = ns.run(|| listener.restore());
    drop(st);
    let (tag, save, c, attempt) = watched?;
    restored?;
    let rs = ruleset_of(&save, conn.is_ipv6());
    let seen = c.seen();
    Ok(KernelPath {
        table: "raw".into(),
        hook: conn.hook(),
        trace_chain: tag,
        // ip_tables has no trace id.
        trace_id: seen.then_some(0),
        events: lines::events(&c.lines, &rs, &KernelNumbers::of(&save)),
        attempt,
    })
}

/// The TRACE rules for `conn` (tag `tag`): at its first hook, and outbound at prerouting on
/// lo for its second pass (`sport`: the probe's source port, known when we connect).
pub fn rules(conn: &Connection, sport: Option<u16>, tag: &str) -> Vec<TraceRule> {
    let mut out = vec![TraceRule {
        chain: match conn.direction {
            Direction::Outbound => "OUTPUT",
            Direction::Inbound => "PREROUTING",
        },
        spec: spec(conn, sport, hook::Pass::First, tag),
    }];
    if conn.direction == Direction::Outbound {
        out.push(TraceRule {
            chain: "PREROUTING",
            spec: spec(conn, sport, hook::Pass::LoopedBack, tag),
        });
    }
    out
}

/// One rule's matches, as the nft trace rule's (`hook::rule_exprs`), in iptables syntax.
fn spec(conn: &Connection, sport: Option<u16>, pass: hook::Pass, tag: &str) -> String {
    let p = conn.protocol.name();
    let host = if conn.is_ipv6() { 128 } else { 32 };
    let mut s = format!("-p {p}");
    if pass == hook::Pass::LoopedBack {
        s += " -i lo";
    }
    // A looped-back packet is recognised by its source port (its destination may be NATed).
    let match_dst = pass == hook::Pass::First || sport.is_none();
    if match_dst {
        s += &format!(" -d {}/{host}", conn.dst.ip());
    }
    if let Some(src) = conn.src {
        s += &format!(" -s {src}/{host}");
    }
    s += &format!(" -m {p}");
    if let Some(sp) = sport {
        s += &format!(" --sport {sp}");
    }
    if match_dst {
        s += &format!(" --dport {}", conn.dst.port());
    }
    if conn.protocol == Protocol::Tcp {
        // Only the connection's first packet: SYN without ACK.
        s += " --tcp-flags SYN,ACK SYN";
    }
    if conn.direction == Direction::Outbound && pass == hook::Pass::First {
        let owner: Vec<String> = [("--uid-owner", conn.uid), ("--gid-owner", conn.gid)]
            .into_iter()
            .filter_map(|(o, id)| id.map(|id| format!("{o} {id}")))
            .collect();
        if !owner.is_empty() {
            s += &format!(" -m owner {}", owner.join(" "));
        }
    }
    s + &format!(" -m comment --comment {tag} -j TRACE")
}

/// Our trace rules in the namespace (current namespace: call inside it).
fn ours(tools: &Tools, select: impl Fn(&str) -> bool) -> Result<Vec<Tagged>, TraceError> {
    trace_rules::tagged(tools, |c| c.starts_with(TRACE_CHAIN_PREFIX) && select(c))
        .map_err(legacy_err("reading the raw table"))
}

/// Deletes trace rules whose run is provably gone (current namespace; see `owner`). Returns
/// their tags.
pub fn remove_stale(ns: &Netns, tools: &Tools) -> Result<Vec<String>, TraceError> {
    let dead = owner::is_dead;
    if ours(tools, dead)?.is_empty() {
        return Ok(Vec::new());
    }
    let held = lock(ns)?;
    // Read again under the lock: another run may have removed them meanwhile.
    let stale = ours(tools, dead)?;
    trace_rules::delete(tools, &stale, &held).map_err(legacy_err("deleting stale TRACE rules"))?;
    for r in &stale {
        tracing::info!(
            tag = r.comment,
            chain = r.chain,
            "removed a TRACE rule left by a killed run"
        );
    }
    Ok(stale.into_iter().map(|r| r.comment).collect())
}

/// The tags of every trace rule in the namespace (current namespace).
pub fn list(tools: &Tools) -> Result<Vec<String>, TraceError> {
    Ok(ours(tools, |_| true)?
        .into_iter()
        .map(|r| r.comment)
        .collect())
}

impl watch::Source for ulog::LogSocket {
    type Item = lines::LogLine;
    fn drain(&mut self) -> Result<Vec<lines::LogLine>, TraceError> {
        ulog::LogSocket::drain(self)
    }
    fn raw_fd(&self) -> i32 {
        ulog::LogSocket::raw_fd(self)
    }
}

impl watch::Collect<lines::LogLine> for lines::Collector {
    fn feed(&mut self, line: lines::LogLine) {
        lines::Collector::feed(self, line)
    }
    fn seen(&self) -> bool {
        lines::Collector::seen(self)
    }
}

/// The inserted rules; deleted when dropped (error paths, panics); [`TempRules::remove`]
/// reports errors.
struct TempRules {
    netns: Netns,
    tools: Tools,
    tag: String,
    /// The family's save output while the rules were in place.
    save: String,
    removed: bool,
}

impl TempRules {
    fn add(
        ns: &Netns,
        tools: &Tools,
        conn: &Connection,
        sport: Option<u16>,
    ) -> Result<TempRules, TraceError> {
        let mut guard = TempRules {
            netns: ns.clone(),
            tools: tools.clone(),
            tag: owner::unique_name(),
            save: String::new(),
            removed: false,
        };
        let v6 = conn.is_ipv6();
        let wanted = rules(conn, sport, &guard.tag);
        guard.save = ns.run(|| {
            let held = lock(ns)?;
            trace_rules::insert(tools, v6, &wanted, &held)
                .map_err(legacy_err("inserting the TRACE rules"))?;
            iptables_legacy::live::our_save(tools, v6)
                .map_err(legacy_err("reading the rules back"))
                .map(Option::unwrap_or_default)
        })?;
        Ok(guard)
    }

    fn delete(&self) -> Result<(), TraceError> {
        let tag = self.tag.clone();
        self.netns.run(|| {
            let held = lock(&self.netns)?;
            let mine = ours(&self.tools, |c| c == tag)?;
            trace_rules::delete(&self.tools, &mine, &held)
                .map_err(legacy_err("deleting the TRACE rules"))
        })
    }

    fn remove(mut self) -> Result<(), TraceError> {
        self.removed = true;
        self.delete()
    }
}

impl Drop for TempRules {
    fn drop(&mut self) {
        if !self.removed
            && let Err(e) = self.delete()
        {
            tracing::error!(tag = %self.tag, "could not delete the TRACE rules: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_exactly_the_connection() {
        let c = Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            "10.0.0.1:80".parse().unwrap(),
        )
        .uid(1000)
        .gid(1001);
        let r = rules(&c, Some(40000), "istio-explain-1-0");
        assert_eq!(r[0].chain, "OUTPUT");
        assert_eq!(
            r[0].spec,
            "-p tcp -d 10.0.0.1/32 -m tcp --sport 40000 --dport 80 --tcp-flags SYN,ACK SYN \
             -m owner --uid-owner 1000 --gid-owner 1001 -m comment --comment istio-explain-1-0 -j TRACE"
        );
        assert_eq!(r[1].chain, "PREROUTING");
        assert_eq!(
            r[1].spec,
            "-p tcp -i lo -m tcp --sport 40000 --tcp-flags SYN,ACK SYN \
             -m comment --comment istio-explain-1-0 -j TRACE"
        );
        let c = Connection::new(
            Direction::Inbound,
            Protocol::Udp,
            "[fd00::2]:53".parse().unwrap(),
        )
        .src("fd00::1".parse().unwrap());
        let r = rules(&c, None, "t");
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0].spec,
            "-p udp -d fd00::2/128 -s fd00::1/128 -m udp --dport 53 -m comment --comment t -j TRACE"
        );
    }
}
