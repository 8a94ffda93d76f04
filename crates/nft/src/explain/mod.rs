//! `istio-nftables explain`: where does a connection go through our live rules, and why.
//!
//! The live ruleset of our tables is dumped over netlink ([`dump`], or the iptables-legacy
//! reader in that crate) into a small IR ([`ir`]); a synthetic first packet of the connection
//! (conntrack NEW, mark 0, the route's interfaces, the sender's uid/gid) walks it hook by hook
//! in priority order with a register-level evaluator ([`eval`]); the path and the outcome are
//! described with each rule's comment and nft text. An expression the evaluator does not know
//! stops the walk with "cannot evaluate" instead of a guess. [`compare`] sets the kernel's own
//! trace (`crate::trace`) beside it.

pub mod compare;
mod dump;
mod eval;
mod facts;
pub mod ir;
pub mod render;
mod text;

pub use crate::trace::{Connection, Direction, Protocol};
pub use eval::{CT_STATE_NEW, HookEnd, Packet, RuleRef, Step, StepKind, World, set_contains};
pub use facts::NsFacts;
pub use render::render_text;

use crate::NftError;
use ir::{Backend, Hook, Ruleset, Verdict};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// The source port assumed for the synthetic packet (any ephemeral port; none of our rules
/// matches source ports in that range).
pub const ASSUMED_SPORT: u16 = 40000;

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The command line names something impossible (exit 2).
    #[error("{arg} {value}: {why}")]
    BadInput {
        arg: &'static str,
        value: String,
        why: String,
    },
    /// The namespace has none of our rules (exit 2).
    #[error("--network-namespace {netns}: no istio rules there ({looked})")]
    NoRules { netns: String, looked: String },
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl ExplainError {
    /// Whether this is the caller's mistake (exit 2) rather than a failure (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            ExplainError::BadInput { .. } | ExplainError::NoRules { .. }
        )
    }
}

/// The connection as explained, with every assumption made explicit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Described {
    pub direction: &'static str,
    pub protocol: &'static str,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub iif: Option<String>,
    pub oif: Option<String>,
    /// Values not given on the command line and what was assumed for them.
    pub assumed: Vec<String>,
}

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
    Redirected {
        to: SocketAddr,
        by: Decider,
    },
    /// TPROXY handed it to the transparent listener on `port`; the destination is unchanged.
    Tproxied {
        port: u16,
        by: Decider,
    },
    Dropped {
        by: Option<Decider>,
        reason: String,
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
fn reason_of(d: &Decider) -> String {
    let w = d.why();
    w.strip_suffix(": not captured")
        .map(str::to_string)
        .unwrap_or(w)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub backend: Backend,
    pub connection: Described,
    pub steps: Vec<Step>,
    pub outcome: Outcome,
    pub summary: String,
    pub notes: Vec<String>,
}

/// Explains `conn` against the live rules of the namespace at `netns` (`None`: this one).
pub fn explain(netns: Option<&Path>, conn: &Connection) -> Result<Explanation, ExplainError> {
    let (rs, facts) = in_netns(netns, || {
        let sock = crate::netlink::Socket::open().map_err(crate::open_err)?;
        let rs = dump::live(&sock)?;
        Ok((rs, read_facts(conn)?))
    })?;
    if rs.is_empty() {
        return Err(ExplainError::NoRules {
            netns: shown(netns),
            looked: "no inet istio-proxy-* tables".into(),
        });
    }
    explain_with(&rs, conn, &facts)
}

/// The live ruleset of our tables in the namespace (for the kernel-trace comparison).
pub fn live_ruleset(netns: Option<&Path>) -> Result<Ruleset, ExplainError> {
    in_netns(netns, || {
        let sock = crate::netlink::Socket::open().map_err(crate::open_err)?;
        Ok(dump::live(&sock)?)
    })
}

/// The namespace's addresses, listeners and route to `conn`'s destination.
pub fn namespace_facts(netns: Option<&Path>, conn: &Connection) -> Result<NsFacts, ExplainError> {
    in_netns(netns, || read_facts(conn))
}

fn read_facts(conn: &Connection) -> Result<NsFacts, ExplainError> {
    let mut f = NsFacts::read().map_err(|source| ExplainError::Io {
        context: "reading the namespace's addresses".into(),
        source,
    })?;
    if conn.direction == Direction::Outbound {
        f.route = Some(
            f.route_to(conn.dst.ip())
                .map_err(|e| ExplainError::BadInput {
                    arg: "--dst",
                    value: conn.dst.to_string(),
                    why: format!("no route from the pod: {e}"),
                })?,
        );
    }
    Ok(f)
}

pub fn shown(netns: Option<&Path>) -> String {
    netns
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "(current)".into())
}

/// Runs `f` inside the namespace; a missing or unusable namespace is bad input.
pub fn in_netns<T: Send>(
    netns: Option<&Path>,
    f: impl FnOnce() -> Result<T, ExplainError> + Send,
) -> Result<T, ExplainError> {
    if let Some(p) = netns
        && !p.exists()
    {
        return Err(ExplainError::BadInput {
            arg: "--network-namespace",
            value: p.display().to_string(),
            why: "no such file".into(),
        });
    }
    netns::run_in(netns, f).map_err(|e| ExplainError::BadInput {
        arg: "--network-namespace",
        value: shown(netns),
        why: format!("not a usable network namespace: {e}"),
    })?
}

fn bad(arg: &'static str, value: impl ToString, why: impl Into<String>) -> ExplainError {
    ExplainError::BadInput {
        arg,
        value: value.to_string(),
        why: why.into(),
    }
}

/// Checks the connection makes sense for this namespace (before any evaluation).
pub fn validate(conn: &Connection, facts: &NsFacts) -> Result<(), ExplainError> {
    if conn.dst.port() == 0 {
        return Err(bad("--dst", conn.dst, "port 0 is not a connection's port"));
    }
    if let Some(src) = conn.src {
        if src.is_ipv6() != conn.is_ipv6() {
            return Err(bad(
                "--src",
                src,
                format!("is not of the same IP family as --dst {}", conn.dst),
            ));
        }
        if src.is_unspecified() {
            return Err(bad("--src", src, "the unspecified address sends nothing"));
        }
    }
    if conn.dst.ip().is_unspecified() || conn.dst.ip().is_multicast() {
        return Err(bad("--dst", conn.dst, "not a unicast destination"));
    }
    match conn.direction {
        Direction::Inbound => {
            if conn.uid.is_some() || conn.gid.is_some() {
                let (arg, v) = match conn.uid {
                    Some(u) => ("--uid", u),
                    None => ("--gid", conn.gid.unwrap_or(0)),
                };
                return Err(bad(
                    arg,
                    v,
                    "an inbound connection's sender is outside the pod: uid/gid apply to outbound only",
                ));
            }
            if !facts.is_local(conn.dst.ip()) {
                return Err(bad(
                    "--dst",
                    conn.dst,
                    format!(
                        "an inbound destination must be an address of the pod ({})",
                        facts.address_list()
                    ),
                ));
            }
        }
        Direction::Outbound => {
            if let Some(src) = conn.src
                && !facts.is_local(src)
            {
                return Err(bad(
                    "--src",
                    src,
                    format!(
                        "an outbound source must be an address of the pod ({})",
                        facts.address_list()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The first packet of `conn` as the first hook sees it, and what was assumed.
fn first_packet(conn: &Connection, facts: &NsFacts) -> Result<(Packet, Vec<String>), ExplainError> {
    let v6 = conn.is_ipv6();
    let mut assumed = vec![format!("source port {ASSUMED_SPORT}")];
    let l4proto = match conn.protocol {
        Protocol::Tcp => libc::IPPROTO_TCP as u8,
        Protocol::Udp => libc::IPPROTO_UDP as u8,
    };
    let mut p = Packet {
        l4proto,
        src: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), ASSUMED_SPORT),
        dst: conn.dst,
        iif: None,
        oif: None,
        uid: None,
        gid: None,
        mark: 0,
        ct_state: CT_STATE_NEW,
        ct_mark: 0,
        ct_zone: 0,
    };
    match conn.direction {
        Direction::Outbound => {
            let Some((oif, src)) = facts.route.clone() else {
                return Err(bad("--dst", conn.dst, "no route from the pod"));
            };
            p.oif = Some(oif);
            p.src.set_ip(conn.src.unwrap_or(src));
            if conn.src.is_none() {
                assumed.push(format!("source address {src} (the route's)"));
            }
            p.uid = Some(conn.uid.unwrap_or(0));
            p.gid = Some(conn.gid.unwrap_or(0));
            if conn.uid.is_none() {
                assumed.push("uid 0".into());
            }
            if conn.gid.is_none() {
                assumed.push("gid 0".into());
            }
        }
        Direction::Inbound => {
            let iif = facts.iface_of(conn.dst.ip()).unwrap_or("lo").to_string();
            p.iif = Some(iif);
            let src = conn.src.unwrap_or(if v6 {
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1))
            } else {
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))
            });
            if conn.src.is_none() {
                assumed.push(format!("source address {src} (outside the pod)"));
            }
            p.src.set_ip(src);
        }
    }
    Ok((p, assumed))
}

/// Explains `conn` against `rs` with the namespace described by `facts`. Pure.
pub fn explain_with(
    rs: &Ruleset,
    conn: &Connection,
    facts: &NsFacts,
) -> Result<Explanation, ExplainError> {
    validate(conn, facts)?;
    let (mut pkt, assumed) = first_packet(conn, facts)?;
    let connection = Described {
        direction: match conn.direction {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        },
        protocol: conn.protocol.name(),
        src: pkt.src,
        dst: pkt.dst,
        uid: pkt.uid,
        gid: pkt.gid,
        iif: pkt.iif.clone(),
        oif: pkt.oif.clone(),
        assumed,
    };
    let mut steps = Vec::new();
    let mut fx = eval::Effects::default();
    let mut notes = Vec::new();
    let end = match conn.direction {
        Direction::Inbound => eval::run_hook(
            rs,
            Hook::Prerouting,
            false,
            &mut pkt,
            facts,
            &mut steps,
            &mut fx,
        ),
        Direction::Outbound => {
            let end = eval::run_hook(
                rs,
                Hook::Output,
                false,
                &mut pkt,
                facts,
                &mut steps,
                &mut fx,
            );
            if end == HookEnd::Passed && facts.is_local(pkt.dst.ip()) {
                // Local delivery: the packet comes back in over lo and crosses prerouting,
                // where NAT is not consulted again (the connection's NAT is decided).
                notes.push(format!(
                    "{} is local: the packet loops back over lo through prerouting (NAT already decided)",
                    pkt.dst
                ));
                pkt.iif = Some("lo".into());
                pkt.oif = None;
                pkt.uid = None;
                pkt.gid = None;
                eval::run_hook(
                    rs,
                    Hook::Prerouting,
                    true,
                    &mut pkt,
                    facts,
                    &mut steps,
                    &mut fx,
                )
            } else {
                end
            }
        }
    };
    let outcome = outcome(rs, conn, &pkt, facts, &steps, &fx, end);
    if let Some(port) = fx.tproxy_missed {
        notes.push(format!(
            "TPROXY found no TCP listener on port {port} in the namespace"
        ));
    }
    if let Outcome::Tproxied { port, .. } = &outcome {
        notes.push(format!(
            "a TCP listener on port {port} exists (TPROXY needs it to be transparent, as Envoy's is)"
        ));
    }
    Ok(Explanation {
        backend: rs.backend,
        connection,
        summary: outcome.summary(),
        steps,
        outcome,
        notes,
    })
}

fn outcome(
    rs: &Ruleset,
    conn: &Connection,
    pkt: &Packet,
    facts: &NsFacts,
    steps: &[Step],
    fx: &eval::Effects,
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
            Outcome::Dropped { by, reason }
        }
        HookEnd::Passed => {
            if let Some((port, rule)) = &fx.tproxied {
                let by = decider_for(steps, rule);
                return Outcome::Tproxied { port: *port, by };
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

fn decider_for(steps: &[Step], rule: &RuleRef) -> Decider {
    steps
        .iter()
        .rev()
        .find(|s| s.rule.as_ref() == Some(rule))
        .and_then(Decider::of)
        .expect("the rule that redirected was recorded as a step")
}
