//! What happened to the connection, derived from the walk: the outcome, the rule that decided
//! and the reason in words.

use super::Connection;
use super::eval::{self, Effects, HookEnd, Packet, RuleRef, Step, StepKind};
use super::facts::NsFacts;
use super::ir::{Ruleset, Verdict};
use serde::Serialize;
use std::net::SocketAddr;

/// The rule that decided, and where it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decider {
    pub family: &'static str,
    pub table: String,
    pub chain: String,
    pub rule: RuleRef,
}

impl Decider {
    fn of(s: &Step) -> Option<Decider> {
        Some(Decider {
            family: s.family,
            table: s.table.clone(),
            chain: s.chain.clone(),
            rule: s.rule.clone()?,
        })
    }
    /// The rule's comment, or its text when it has none.
    pub fn why(&self) -> String {
        self.rule
            .comment
            .clone()
            .unwrap_or_else(|| self.rule.text.clone())
    }
}

/// Where the connection ends up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    /// `redirect` (NAT) sent it to a local port.
    Redirected { to: SocketAddr, by: Decider },
    /// TPROXY handed it to the transparent listener on `port`; the destination is unchanged.
    Tproxied { port: u16, by: Decider },
    Dropped {
        by: Option<Decider>,
        reason: String,
        /// Set when `by` redirected it and the kernel then found no route to that address
        /// (a socket bound to an interface by a link-local zone): the redirect's target.
        #[serde(skip_serializing_if = "Option::is_none")]
        redirected_to: Option<SocketAddr>,
    },
    /// The host probe rule rewrote its source to `from` (kubelet's probe to an ambient pod);
    /// it leaves the node for `to`.
    Snatted {
        from: std::net::IpAddr,
        to: SocketAddr,
        by: Decider,
    },
    /// Our rules let it through unchanged, because of `by`.
    NotCaptured {
        by: Option<Decider>,
        reason: String,
        to: SocketAddr,
        local: bool,
    },
    /// None of our rules applied at all.
    Untouched {
        reason: String,
        to: SocketAddr,
        local: bool,
    },
    /// The evaluator met an expression it does not know.
    CannotEvaluate {
        chain: String,
        rule: RuleRef,
        expr: String,
    },
}

/// Where a real connection would land (what the tests compare with the probe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    /// On a listener in the pod on this port.
    Pod(u16),
    /// Leaves the pod towards this destination.
    Away(SocketAddr),
    Dropped,
    Unknown,
}

impl Outcome {
    pub fn landing(&self) -> Landing {
        match self {
            Outcome::Redirected { to, .. } => Landing::Pod(to.port()),
            Outcome::Tproxied { port, .. } => Landing::Pod(*port),
            Outcome::Dropped { .. } => Landing::Dropped,
            Outcome::Snatted { to, .. } => Landing::Away(*to),
            Outcome::NotCaptured { to, local, .. } | Outcome::Untouched { to, local, .. } => {
                if *local {
                    Landing::Pod(to.port())
                } else {
                    Landing::Away(*to)
                }
            }
            Outcome::CannotEvaluate { .. } => Landing::Unknown,
        }
    }

    /// One line: `redirected to 127.0.0.1:15001`, `not captured: Envoy (uid 1337) traffic`.
    pub fn summary(&self) -> String {
        match self {
            Outcome::Redirected { to, by } => format!("redirected to {to} ({})", by.why()),
            Outcome::Tproxied { port, .. } => {
                format!("diverted by TPROXY to the listener on port {port}")
            }
            Outcome::Dropped { reason, .. } => format!("dropped: {reason}"),
            Outcome::Snatted { from, to, by } => {
                format!("source NATed to {from} ({}); leaves for {to}", by.why())
            }
            Outcome::NotCaptured {
                reason, to, local, ..
            } => format!("not captured: {reason}; {}", destination(*to, *local)),
            Outcome::Untouched { reason, to, local } => {
                format!("untouched: {reason}; {}", destination(*to, *local))
            }
            Outcome::CannotEvaluate { chain, rule, expr } => format!(
                "cannot evaluate rule {} of {chain}: unknown expression {expr}",
                rule.position
            ),
        }
    }
}

fn destination(to: SocketAddr, local: bool) -> String {
    if local {
        format!("delivered to {to} in the pod")
    } else {
        format!("leaves the pod for {to}")
    }
}

/// A rule's comment as a reason: `Envoy (uid 1337) traffic: not captured` → `Envoy (uid 1337)
/// traffic`.
pub(super) fn reason_of(d: &Decider) -> String {
    let w = d.why();
    w.strip_suffix(": not captured")
        .map(str::to_string)
        .unwrap_or(w)
}

pub(super) fn outcome(
    rs: &Ruleset,
    conn: &Connection,
    pkt: &Packet,
    facts: &NsFacts,
    steps: &[Step],
    fx: &Effects,
    end: HookEnd,
) -> Outcome {
    let rules = || steps.iter().filter(|s| s.kind == StepKind::Rule);
    match end {
        HookEnd::Unknown { rule, chain, expr } => Outcome::CannotEvaluate { chain, rule, expr },
        HookEnd::Dropped => {
            let by = rules()
                .rfind(|s| s.verdict == Verdict::Drop)
                .and_then(Decider::of);
            let reason = match (fx.tproxy_missed, &by) {
                (Some(port), _) => format!("TPROXY with no listener on port {port}"),
                (None, Some(d)) => d.why(),
                (None, None) => "dropped".into(),
            };
            Outcome::Dropped {
                by,
                reason,
                redirected_to: None,
            }
        }
        HookEnd::Passed => {
            if let Some((port, rule)) = &fx.tproxied {
                let by = decider_for(steps, rule);
                return Outcome::Tproxied { port: *port, by };
            }
            if let Some((from, rule)) = &fx.snatted {
                let by = decider_for(steps, rule);
                return Outcome::Snatted {
                    from: *from,
                    to: pkt.dst,
                    by,
                };
            }
            if let Some((to, rule)) = &fx.redirected {
                let by = decider_for(steps, rule);
                return Outcome::Redirected { to: *to, by };
            }
            let local = facts.is_local(pkt.dst.ip());
            let ends = |s: &&Step| matches!(s.verdict, Verdict::Return | Verdict::Accept);
            let by = rules()
                .rfind(|s| ends(s) && s.table.contains("nat"))
                .or_else(|| rules().rfind(ends))
                .and_then(Decider::of);
            match by {
                Some(d) => Outcome::NotCaptured {
                    reason: reason_of(&d),
                    by: Some(d),
                    to: pkt.dst,
                    local,
                },
                None if rules().next().is_none() => {
                    let reason = if conn.is_ipv6() && eval::ipv4_only(rs) {
                        "IPv6 is not captured in this pod".to_string()
                    } else {
                        "no rule of ours matches it".to_string()
                    };
                    Outcome::Untouched {
                        reason,
                        to: pkt.dst,
                        local,
                    }
                }
                None => Outcome::NotCaptured {
                    by: None,
                    reason: "no rule of ours captures it (end of our chains, policy accept)".into(),
                    to: pkt.dst,
                    local,
                },
            }
        }
    }
}

/// An outbound connection to a link-local destination is made on a socket bound to the
/// zone's interface; when our rules redirect it to a loopback address, the kernel's reroute
/// after NAT looks for that address through the bound interface only, finds no route and
/// drops the packet: the connection times out.
pub(super) fn after_reroute(o: Outcome, conn: &Connection, facts: &NsFacts) -> Outcome {
    let bound = match &facts.zone {
        Some((name, _)) if conn.direction == super::Direction::Outbound => name,
        _ => return o,
    };
    match o {
        Outcome::Redirected { to, by } if to.ip().is_loopback() => Outcome::Dropped {
            reason: format!(
                "redirected to {to} ({}), but the socket is bound to {bound} by the zone of \
                 its link-local destination: the kernel finds no route to {} through {bound} \
                 after the redirect and drops it (the connection times out)",
                by.why(),
                to.ip()
            ),
            by: Some(by),
            redirected_to: Some(to),
        },
        o => o,
    }
}

fn decider_for(steps: &[Step], rule: &RuleRef) -> Decider {
    steps
        .iter()
        .rev()
        .find(|s| s.rule.as_ref() == Some(rule))
        .and_then(Decider::of)
        .expect("the rule that redirected was recorded as a step")
}
