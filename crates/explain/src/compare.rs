//! The kernel's trace beside the static explanation: the kernel's events (nft's nftrace events,
//! or ip_tables' TRACE lines made into the same events) become steps of the same form (rules
//! looked up in the live ruleset by handle, or for iptables-legacy by chain and position), and
//! the two must agree on the
//! deciding rule of every table the kernel reported, on the whole path through every hook it
//! reported (each rule matched, each end of chain, each policy), and on the outcome.
//! Istio's legacy host probe rule is not traced: [`compare_record`] sets the kernel's record
//! of the connection (its conntrack entry, the verdict; the rule counters, corroboration)
//! beside the static outcome.

use super::ir::{Expr, Hook, Rule, Ruleset, TableFamily, Verdict};
use super::{Explanation, Outcome, RuleRef, Step, StepKind};
use crate::trace::{self, CtEntry, EventKind, KernelPath, KernelRecord, TraceEvent};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Agreement {
    pub agree: bool,
    /// The kernel's path in the explanation's form.
    pub kernel_steps: Vec<Step>,
    /// What the kernel's path amounts to (`redirected to port 15001`, `dropped`, ...).
    pub kernel_outcome: String,
    /// What the traced connection attempt itself saw.
    pub attempt: String,
    /// Every disagreement, readable; empty when they agree.
    pub differences: Vec<String>,
    /// Hooks the static path crosses that the kernel trace did not report.
    pub not_traced: Vec<String>,
    /// Instead of a trace (`kernel_steps` then empty): the kernel's record of the connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordShown>,
}

/// The kernel's record of a connection, as shown beside the static explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecordShown {
    /// Always [`RECORD_METHOD`]: what was read, and that it is not a rule-by-rule path.
    pub method: &'static str,
    /// The original tuple looked up (`tcp SRC -> DST`); `None`: nothing was sent.
    pub looked_up: Option<String>,
    /// The conntrack entry (`tcp SRC -> DST, reply SRC -> DST`); `None`: none.
    pub conntrack: Option<String>,
    /// Each counted rule: `nat CHAIN #N: +P packets (B -> A): RULE`.
    pub counters: Vec<String>,
    /// Whether the counters agree with the conntrack entry (an SNAT rule's counter moved iff
    /// the entry is SNATed); `None` without an entry. Other connections move counters too.
    pub corroborated: Option<bool>,
}

/// How the legacy host probe rule is confirmed.
pub const RECORD_METHOD: &str = "kernel's record (conntrack + rule counters)";

/// The kernel's events as steps. The hook of an event in a regular chain is the hook of the
/// base chain that led there.
pub fn kernel_steps(rs: &Ruleset, kp: &KernelPath) -> Vec<Step> {
    let mut hook = match kp.hook {
        "prerouting" => Hook::Prerouting,
        "postrouting" => Hook::Postrouting,
        _ => Hook::Output,
    };
    let mut out = Vec::new();
    for e in &kp.events {
        let family = family_of(&e.family);
        if let Some(c) = rs.chain(family, &e.table, &e.chain)
            && let Some(b) = c.base
        {
            hook = b.hook;
        }
        out.push(Step {
            hook,
            family: family.name(),
            table: e.table.clone(),
            chain: e.chain.clone(),
            kind: match e.kind {
                EventKind::Rule => StepKind::Rule,
                EventKind::Return => StepKind::Return,
                EventKind::Policy => StepKind::Policy,
            },
            rule: kernel_rule(rs, e),
            verdict: e.verdict.as_ref().map(verdict).unwrap_or(Verdict::Continue),
            effects: Vec::new(),
        });
    }
    out
}

fn family_of(name: &str) -> TableFamily {
    match name {
        "ip" => TableFamily::Ip,
        "ip6" => TableFamily::Ip6,
        _ => TableFamily::Inet,
    }
}

/// The rule a kernel event names: by handle (nft) or by its position in its chain
/// (iptables-legacy); a rule not in `rs` is still named.
fn kernel_rule(rs: &Ruleset, e: &TraceEvent) -> Option<RuleRef> {
    if e.kind != EventKind::Rule {
        return None;
    }
    let found = match (e.rule_handle, e.rule_position) {
        (Some(h), _) => rs.rule_by_handle(&e.table, h).map(|(_, r)| r),
        (None, Some(p)) => rs
            .chain(family_of(&e.family), &e.table, &e.chain)
            .and_then(|c| c.rules.iter().find(|r| r.position == p)),
        (None, None) => None,
    };
    Some(found.map(RuleRef::of).unwrap_or_else(|| RuleRef {
        position: e.rule_position.unwrap_or(0),
        handle: e.rule_handle,
        comment: None,
        text: "(rule not in the dump)".into(),
    }))
}

/// The rule a step names, in `rs`: by handle (nft) or by chain and position (legacy).
fn rule_of<'a>(rs: &'a Ruleset, s: &Step) -> Option<&'a Rule> {
    let r = s.rule.as_ref()?;
    match r.handle {
        Some(h) => rs.rule_by_handle(&s.table, h).map(|(_, r)| r),
        None => rs
            .chain(family_of(s.family), &s.table, &s.chain)?
            .rules
            .iter()
            .find(|x| x.position == r.position),
    }
}

/// How a step's rule is named when paths are compared: `handle N` (nft), `#N` (its position:
/// iptables-legacy rules have no handle).
fn rule_id(s: &Step) -> Option<String> {
    s.rule.as_ref().map(|r| match r.handle {
        Some(h) => format!("handle {h}"),
        None => format!("#{}", r.position),
    })
}

fn verdict(v: &trace::Verdict) -> Verdict {
    match v {
        trace::Verdict::Accept => Verdict::Accept,
        trace::Verdict::Drop => Verdict::Drop,
        trace::Verdict::Return => Verdict::Return,
        trace::Verdict::Jump(c) => Verdict::Jump(c.clone()),
        trace::Verdict::Goto(c) => Verdict::Goto(c.clone()),
        _ => Verdict::Continue,
    }
}

/// The rule that decided in one table and hook: the last matched rule with a verdict that
/// ends a chain (accept, drop, return); `None` = nothing decided, the policy did.
fn deciding(steps: &[Step], hook: Hook, table: &str) -> Option<String> {
    steps
        .iter()
        .rfind(|s| {
            s.hook == hook
                && s.table == table
                && s.kind == StepKind::Rule
                && matches!(s.verdict, Verdict::Accept | Verdict::Drop | Verdict::Return)
        })
        .and_then(rule_id)
}

/// The whole path through one hook, step by step: `table chain kind [handle] verdict`.
fn path(steps: &[Step], hook: Hook) -> Vec<String> {
    steps
        .iter()
        .filter(|s| s.hook == hook)
        .map(|s| {
            let kind = match s.kind {
                StepKind::Rule => "rule",
                StepKind::Return => "end of chain",
                StepKind::Policy => "policy",
            };
            let handle = rule_id(s).map(|id| format!(" {id}")).unwrap_or_default();
            format!("{} {} {kind}{handle} {}", s.table, s.chain, s.verdict)
        })
        .collect()
}

/// The outcome class of a path: what its accepting/dropping rules do.
fn class_of(rs: &Ruleset, steps: &[Step]) -> String {
    let mut class = "not captured".to_string();
    for s in steps.iter().filter(|s| s.kind == StepKind::Rule) {
        let Some(r) = rule_of(rs, s) else {
            continue;
        };
        let port = r.exprs.iter().find_map(|e| match e {
            Expr::Immediate { data, .. } if data.len() == 2 => {
                Some(u16::from_be_bytes([data[0], data[1]]))
            }
            _ => None,
        });
        let port = port.map(|p| p.to_string()).unwrap_or_default();
        if s.verdict == Verdict::Drop {
            return "dropped".into();
        }
        if s.verdict == Verdict::Accept
            && let Some(Expr::Immediate { data, .. }) = r.exprs.iter().rev().find(|e| {
                matches!(e, Expr::Immediate { data, .. } if data.len() == 4 || data.len() == 16)
            })
            && r.exprs.iter().any(|e| matches!(e, Expr::Nat { snat: true, .. }))
        {
            class = format!("source NATed to {}", snat_addr(data));
        }
        if r.exprs.iter().any(|e| matches!(e, Expr::Redir { .. })) {
            class = format!("redirected to port {port}");
        }
        if r.exprs.iter().any(|e| matches!(e, Expr::Tproxy { .. })) && s.verdict == Verdict::Accept
        {
            class = format!("diverted by TPROXY to port {port}");
        }
    }
    class
}

fn snat_addr(data: &[u8]) -> std::net::IpAddr {
    match <[u8; 4]>::try_from(data) {
        Ok(a) => a.into(),
        Err(_) => <[u8; 16]>::try_from(data).unwrap_or([0; 16]).into(),
    }
}

fn static_class(o: &Outcome) -> String {
    match o {
        Outcome::Redirected { to, .. } => format!("redirected to port {}", to.port()),
        Outcome::Tproxied { port, .. } => format!("diverted by TPROXY to port {port}"),
        Outcome::Dropped {
            redirected_to: Some(to),
            ..
        } => format!("redirected to port {}{THEN_DROPPED}", to.port()),
        Outcome::Dropped { .. } => "dropped".into(),
        Outcome::Snatted { from, .. } => format!("source NATed to {from}"),
        Outcome::NotCaptured { .. } | Outcome::Untouched { .. } => "not captured".into(),
        Outcome::CannotEvaluate { .. } => "cannot evaluate".into(),
    }
}

/// The kernel's outcome when it reported nothing of the connection.
pub const NOTHING_REPORTED: &str = "nothing reported";

/// A redirect the kernel drops after our rules (no route to the new destination).
const THEN_DROPPED: &str = ", then dropped";

/// Compares the kernel's path with the static explanation.
pub fn compare(rs: &Ruleset, ex: &Explanation, kp: &KernelPath) -> Agreement {
    let ks = kernel_steps(rs, kp);
    let mut differences = Vec::new();
    let mut not_traced = Vec::new();
    let mut hooks: Vec<Hook> = ex.steps.iter().map(|s| s.hook).collect();
    hooks.dedup();
    for hook in hooks {
        if !ks.iter().any(|s| s.hook == hook) {
            not_traced.push(hook.name().to_string());
            continue;
        }
        let mut tables: Vec<&str> = ex
            .steps
            .iter()
            .chain(&ks)
            .filter(|s| s.hook == hook)
            .map(|s| s.table.as_str())
            .collect();
        tables.sort();
        tables.dedup();
        for t in tables {
            let (a, b) = (deciding(&ex.steps, hook, t), deciding(&ks, hook, t));
            if a != b {
                let show = |h: Option<String>| {
                    h.map(|h| format!("rule {h}"))
                        .unwrap_or_else(|| "no rule (policy)".into())
                };
                differences.push(format!(
                    "hook {} table {t}: static path decided by {}, the kernel's by {}",
                    hook.name(),
                    show(a),
                    show(b)
                ));
            }
        }
        let (a, b) = (path(&ex.steps, hook), path(&ks, hook));
        if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
            let at = |v: &[String]| v.get(i).cloned().unwrap_or_else(|| "(nothing)".into());
            differences.push(format!(
                "hook {}: paths differ at step {}: static {}, kernel {}",
                hook.name(),
                i + 1,
                at(&a),
                at(&b)
            ));
        }
    }
    let mut kernel_outcome = if ks.is_empty() {
        NOTHING_REPORTED.to_string()
    } else {
        class_of(rs, &ks)
    };
    if kernel_outcome.starts_with("redirected") && kp.attempt == trace::Attempt::TimedOut {
        // Redirected, and never answered: dropped after our rules (the reroute).
        kernel_outcome += THEN_DROPPED;
    }
    let mut mine = static_class(&ex.outcome);
    if kp.attempt == trace::Attempt::Observed
        && let Some(rules) = mine.strip_suffix(THEN_DROPPED)
    {
        // A connection waited for, not made: nothing times out, and the drop after our rules
        // (the reroute) is no rule's, so no event reports it. What the kernel reported is
        // compared: the rules' outcome.
        mine = rules.to_string();
    }
    // The kernel reported nothing of the connection (it never reached the pod as given, e.g.
    // SNATed on the way): nothing disagrees, nothing is confirmed (`not_traced`).
    if kernel_outcome != mine && !ks.is_empty() {
        differences.push(format!(
            "outcome: static path says {mine}, the kernel's path {kernel_outcome}"
        ));
    }
    Agreement {
        agree: differences.is_empty(),
        kernel_steps: ks,
        kernel_outcome,
        attempt: format!("{:?}", kp.attempt),
        differences,
        not_traced,
        record: None,
    }
}

/// What a conntrack entry says the kernel did, in [`static_class`]'s terms.
fn record_class(e: &CtEntry) -> String {
    match (e.snat(), e.dnat()) {
        (Some(a), _) => format!("source NATed to {a}"),
        (None, Some(d)) => format!("redirected to port {}", d.port()),
        (None, None) => "not captured".into(),
    }
}

/// Compares the kernel's record of a connection (`trace::record_host`: Istio's legacy host
/// probe rule) with the static explanation: the conntrack entry decides, the counters
/// corroborate. No entry: nothing disagrees, but nothing is confirmed (`not_traced`).
pub fn compare_record(ex: &Explanation, rec: &KernelRecord) -> Agreement {
    let mine = static_class(&ex.outcome);
    let mut differences = Vec::new();
    let mut not_traced = Vec::new();
    let kernel_outcome = match &rec.conntrack {
        Some(e) => record_class(e),
        None => {
            let mut hooks: Vec<String> = ex.steps.iter().map(|s| s.hook.name().into()).collect();
            hooks.dedup();
            not_traced = hooks;
            "no conntrack entry".into()
        }
    };
    if let Some(e) = &rec.conntrack
        && kernel_outcome != mine
    {
        differences.push(format!(
            "outcome: static path says {mine}, the kernel's conntrack entry says {kernel_outcome} ({e})"
        ));
    }
    let snat_moved = rec.counters.iter().any(|c| c.is_snat() && c.moved() > 0);
    Agreement {
        agree: differences.is_empty(),
        kernel_steps: Vec::new(),
        kernel_outcome,
        attempt: format!("{:?}", rec.attempt),
        differences,
        not_traced,
        record: Some(RecordShown {
            method: RECORD_METHOD,
            looked_up: rec
                .original
                .map(|t| format!("{} {t}", ex.connection.protocol)),
            conntrack: rec.conntrack.as_ref().map(ToString::to_string),
            counters: rec.counters.iter().map(counter_line).collect(),
            corroborated: rec
                .conntrack
                .as_ref()
                .map(|e| e.snat().is_some() == snat_moved),
        }),
    }
}

fn counter_line(c: &trace::RuleCounter) -> String {
    format!(
        "nat {} #{}: +{} packets ({} -> {}): {}",
        c.chain,
        c.position,
        c.moved(),
        c.before,
        c.after,
        c.text
    )
}
