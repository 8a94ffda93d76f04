//! `istio-nftables explain`: where does a connection go through a pod's live rules, and why,
//! and does the kernel agree.
//!
//! The live rules are read into a small IR ([`ir`]): our nft tables over netlink through the
//! nft backend's read-only view (`live_nft`), or the iptables-legacy tables from
//! `iptables-legacy-save` ([`live_legacy`]). A synthetic first packet of the connection
//! (conntrack NEW, mark 0, the route's interfaces, the sender's uid/gid) walks it hook by hook
//! in priority order with a register-level evaluator (`eval`); the path and the outcome are
//! described with each rule's comment and nft text. An expression the evaluator does not know
//! stops the walk with "cannot evaluate" instead of a guess. [`trace`] asks the kernel (nft: a
//! temporary nftrace chain; iptables-legacy: TRACE rules in the raw table, read over
//! nfnetlink_log; the connection made for real) and [`compare`] sets its path beside the static
//! one, for both backends. Istio's legacy host probe rule, in the node's own namespace, is
//! confirmed from the kernel's record instead (the connection's conntrack entry and the rule
//! counters, [`trace::record_host`]): nothing there may rebind the node's packet logger.
//!
//! This crate only reads rules (the tracer's temporary chain or TRACE rules excepted, removed
//! also after a kill); programming them is the backends' job.

pub mod compare;
mod connection;
mod eval;
mod facts;
mod first_packet;
pub mod ir;
pub mod live_legacy;
mod live_nft;
mod outcome;
pub mod render;
pub mod trace;
mod trace_tag;
pub mod zone;

pub use connection::{Connection, Direction, Invalid, Protocol, Zone};
pub use eval::{CT_STATE_NEW, HookEnd, Packet, RuleRef, Step, StepKind, World, set_contains};
pub use facts::NsFacts;
pub use first_packet::{Described, validate};
pub use outcome::{Decider, Landing, Outcome};
pub use render::render_text;

use ir::{Backend, Hook, Ruleset};
use nft_backend::NftError;
use serde::Serialize;
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

impl From<Invalid> for ExplainError {
    fn from(e: Invalid) -> Self {
        ExplainError::BadInput {
            arg: e.arg,
            value: e.value,
            why: e.why,
        }
    }
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
        let sock = nft_backend::live::socket()?;
        let rs = live_nft::live(&sock)?;
        Ok((rs, read_facts(conn)?))
    })?;
    if rs.is_empty() {
        return Err(ExplainError::NoRules {
            netns: shown(netns),
            looked: "no inet istio-proxy-* or istio-ambient-* tables".into(),
        });
    }
    explain_with(&rs, conn, &facts)
}

/// The live ruleset of our tables in the namespace (for the kernel-trace comparison).
pub fn live_ruleset(netns: Option<&Path>) -> Result<Ruleset, ExplainError> {
    in_netns(netns, || {
        let sock = nft_backend::live::socket()?;
        Ok(live_nft::live(&sock)?)
    })
}

/// Our iptables-legacy rules in the namespace at `netns` (`None`: this one).
pub fn live_legacy_ruleset(netns: Option<&Path>) -> Result<Ruleset, ExplainError> {
    in_netns(netns, || {
        live_legacy::live_ruleset().map_err(|e| legacy_error("the rules", e))
    })
}

/// Istio's legacy host probe rule and its ipsets in the node namespace at `netns`.
pub fn live_legacy_host_ruleset(netns: Option<&Path>) -> Result<Ruleset, ExplainError> {
    in_netns(netns, || {
        live_legacy::host_ruleset().map_err(|e| legacy_error("the host probe rule", e))
    })
}

/// What an explanation of the node's host probe rule (`--host`) through `rs` leaves out, in
/// the node namespace at `netns`: with nft's rule, the other NAT base chains at postrouting
/// (any table and priority: the connection crosses them too); with Istio's legacy rule, nat
/// POSTROUTING's rules after the jump to it. One note each.
pub fn host_notes(netns: Option<&Path>, rs: &Ruleset) -> Result<Vec<String>, ExplainError> {
    in_netns(netns, || match rs.backend {
        Backend::Nft => {
            let sock = nft_backend::live::socket()?;
            let others = live_nft::other_nat_postrouting(&sock)?;
            Ok(others
                .into_iter()
                .map(|c| {
                    format!(
                        "{c} is a NAT chain at postrouting too, not evaluated: it may NAT \
                         this connection"
                    )
                })
                .collect())
        }
        Backend::IptablesLegacy => {
            live_legacy::host_notes().map_err(|e| legacy_error("the host probe rule", e))
        }
    })
}

fn legacy_error(what: &str, e: iptables_legacy::LegacyError) -> ExplainError {
    ExplainError::Io {
        context: format!("reading {what} from iptables-legacy"),
        source: std::io::Error::other(e.to_string()),
    }
}

/// The namespace's addresses, listeners and route to `conn`'s destination.
pub fn namespace_facts(netns: Option<&Path>, conn: &Connection) -> Result<NsFacts, ExplainError> {
    in_netns(netns, || read_facts(conn))
}

fn read_facts(conn: &Connection) -> Result<NsFacts, ExplainError> {
    conn.refuse_mapped()?;
    let mut f = NsFacts::read().map_err(|source| ExplainError::Io {
        context: "reading the namespace's addresses".into(),
        source,
    })?;
    f.zone = zone::check(conn, &f)?;
    if conn.direction == Direction::Outbound {
        f.route = Some(f.route_to(conn.dst.ip(), f.zone.as_ref()).map_err(|e| {
            ExplainError::BadInput {
                arg: "--dst",
                value: conn.dst_shown(),
                why: format!("no route from the pod: {e}"),
            }
        })?);
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

/// Explains `conn` against `rs` with the namespace described by `facts`. Pure.
pub fn explain_with(
    rs: &Ruleset,
    conn: &Connection,
    facts: &NsFacts,
) -> Result<Explanation, ExplainError> {
    validate(conn, facts)?;
    let (mut pkt, assumed) = first_packet::first_packet(conn, facts)?;
    let connection = Described::of(conn, &pkt, facts, assumed);
    let mut w = Walk {
        rs,
        facts,
        steps: Vec::new(),
        fx: eval::Effects::default(),
        notes: Vec::new(),
    };
    let end = match conn.direction {
        Direction::Inbound => w.hook(Hook::Prerouting, false, &mut pkt),
        Direction::Outbound => match w.hook(Hook::Output, false, &mut pkt) {
            HookEnd::Passed => match w.hook(Hook::Postrouting, false, &mut pkt) {
                HookEnd::Passed if facts.is_local(pkt.dst.ip()) => w.loop_back(&mut pkt),
                end => end,
            },
            end => end,
        },
    };
    let outcome = outcome::outcome(rs, conn, &pkt, facts, &w.steps, &w.fx, end);
    let outcome = outcome::after_reroute(outcome, conn, facts);
    w.note_tproxy(&outcome);
    Ok(Explanation {
        backend: rs.backend,
        connection,
        summary: outcome.summary(),
        steps: w.steps,
        outcome,
        notes: w.notes,
    })
}

/// The walk's accumulated path, effects and notes.
struct Walk<'a> {
    rs: &'a Ruleset,
    facts: &'a NsFacts,
    steps: Vec<Step>,
    fx: eval::Effects,
    notes: Vec<String>,
}

impl Walk<'_> {
    fn hook(&mut self, hook: Hook, skip_nat: bool, pkt: &mut Packet) -> HookEnd {
        eval::run_hook(
            self.rs,
            hook,
            skip_nat,
            pkt,
            self.facts,
            &mut self.steps,
            &mut self.fx,
        )
    }

    /// Local delivery: the packet comes back in over lo (without its socket) and crosses
    /// prerouting, where NAT is not consulted again (the connection's NAT is decided).
    fn loop_back(&mut self, pkt: &mut Packet) -> HookEnd {
        self.notes.push(format!(
            "{} is local: the packet loops back over lo through prerouting (NAT already decided)",
            pkt.dst
        ));
        pkt.iif = Some("lo".into());
        pkt.oif = None;
        pkt.uid = None;
        pkt.gid = None;
        self.hook(Hook::Prerouting, true, pkt)
    }

    fn note_tproxy(&mut self, outcome: &Outcome) {
        if let Some(port) = self.fx.tproxy_missed {
            self.notes.push(format!(
                "TPROXY found no TCP listener on port {port} in the namespace"
            ));
        }
        if let Outcome::Tproxied { port, .. } = outcome {
            self.notes.push(format!(
                "a TCP listener on port {port} exists (TPROXY needs it to be transparent, as Envoy's is)"
            ));
        }
    }
}
