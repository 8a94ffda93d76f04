//! Kernel trace of one connection (`istio-nftables explain --trace`).
//!
//! The static explanation says where a connection *should* go; this module asks the kernel,
//! through the pod's own backend: on iptables-legacy pods with ip_tables' TRACE target (see
//! the `legacy` module: TRACE rules in the raw table, lines over nfnetlink_log, nothing of
//! nft's added), on nft pods as follows. Both share the connecting thread, the signal
//! handling and the wait (`watch`), and give the same [`KernelPath`]. Istio's legacy host
//! probe rule, in the node's own namespace, is not traced (that would rebind the node's packet
//! logger): [`record_host`] makes the connection and reads the kernel's record of it instead
//! (its conntrack entry and the rule counters: a [`KernelRecord`], not a path).
//!
//! On nft pods [`trace`] adds a temporary base chain to one of our tables in the pod's namespace (hook
//! `output` for outbound, `prerouting` for inbound, priority [`TRACE_PRIORITY`], below every
//! chain of ours) with ONE rule matching exactly that connection and setting `meta nftrace`.
//! It listens for the kernel's trace events (`NFNLGRP_NFTRACE`, the same events `nft monitor
//! trace` prints) on a socket opened in the namespace BEFORE the rule exists, makes the
//! connection itself (or waits for one), and returns the path of the first traced packet
//! through our tables. The chain is added and removed in their own atomic batches; removal
//! is guaranteed by a guard, by SIGINT/SIGTERM handling for the duration of the call, and by
//! the next run removing chains left by a killed process ([`remove_stale_chains`]).
//!
//! What the kernel reports (observed on 6.18, the same events `nft monitor trace` prints):
//! - A `Rule` event for every rule whose expressions all matched, with its handle and verdict
//!   (`continue` for rules without a verdict statement, e.g. `ct zone set`). Rules that did not
//!   match are silent. NAT statements (`redirect`, and `tproxy` when it found a socket) report
//!   `accept`; where the packet went is in the rule's text, which the caller looks up by handle.
//! - Falling off the end of a chain: a rule event WITHOUT a handle, verdict `continue`
//!   (decoded here as [`EventKind::Return`]); at the end of a base chain it is followed by a
//!   `Policy` event. `nft monitor trace` does not print the handle-less one.
//! - The trace id is the same for one packet across hooks and tables (raw, mangle, nat of
//!   `output`), but a packet to a local address coming back over `lo` (redirected, or
//!   rerouted there by a mark and the pod's policy route, as TPROXY pods do for the proxy's
//!   own loopback traffic) gets a new id. So an outbound trace adds a second chain at
//!   `prerouting` marking that second pass (`iifname "lo"`, and the probe's source port, or
//!   with `--wait` the connection's original destination, `ct original`: the looped packet
//!   still carries the conntrack entry of its first pass, whose NAT changed its destination),
//!   and the events of both passes are reported, in order: output, then prerouting.
//! - A packet marked by ANOTHER trace rule also produces events in our chain (end-of-chain
//!   only, as our rule did not match): the packet is ours only when our rule's event came.
//! - TCP: only the SYN is marked (`tcp flags & (syn | ack) == syn`): nat chains see only a
//!   connection's first packet anyway, and later packets of established connections to the
//!   same destination are not mistaken for it.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod connect;
mod conntrack;
mod hook;
mod legacy;
mod listen;
mod nfnl;
mod owner;
mod signals;
mod watch;

use netns::{HeldNetns, NetnsError};
use std::sync::Arc;

// The connection types, for callers of the tracer alone.
pub use crate::connection::{Connection, Direction, Protocol, Zone};
pub use conntrack::{CtEntry, CtTuple};
pub use legacy::host::{KernelRecord, RuleCounter};
pub use owner::{MAX_RUN, MAX_WAIT};

pub use crate::trace_tag::TRACE_CHAIN_PREFIX;

/// Priority of the temporary chain: below raw (-300), the lowest priority of our chains, so the
/// packet is marked before any of our rules sees it.
pub const TRACE_PRIORITY: i32 = -350;

/// How long [`TraceHow::Connect`] waits for a TCP handshake before reporting a timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How the traced packet comes about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceHow {
    /// Make the connection: outbound from inside the namespace as `uid`/`gid`; inbound from
    /// the CALLING THREAD's namespace (call `trace` inside `netns::run_in` to connect from
    /// elsewhere). TCP: a connect with [`CONNECT_TIMEOUT`]; UDP: one datagram.
    Connect,
    /// Wait up to this long for a connection of that shape made by someone else.
    Wait(Duration),
}

/// What kind of trace event (the kernel's `NFT_TRACETYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A rule matched (all its expressions passed); `verdict` is what it decided (`continue`
    /// for a rule without a verdict statement, e.g. one that only counts or sets a mark).
    Rule,
    /// The end of the chain was reached without a verdict (`verdict` is `continue`): a
    /// regular chain returns to its caller; at the end of a base chain a `Policy` event
    /// follows. (Kernels report this as a rule event without a rule handle; older ones as
    /// `NFT_TRACETYPE_RETURN`.) An explicit `return` statement is a `Rule` event instead.
    Return,
    /// The end of a base chain was reached: its policy decided.
    Policy,
}

/// A verdict as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Continue,
    Break,
    Return,
    Jump(String),
    Goto(String),
    /// To userspace queue `num`.
    Queue(u16),
    Stolen,
    /// Any other code, as received.
    Other(i32),
}

impl Verdict {
    /// Whether the verdict ends the packet's walk through the hook (accept, drop, queue, stolen).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Verdict::Accept | Verdict::Drop | Verdict::Queue(_) | Verdict::Stolen
        )
    }
}

impl fmt::Display for Verdict {
    /// nft's spelling: `accept`, `jump istio-output`, `queue 3`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Break => f.write_str("break"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
            Verdict::Queue(n) => write!(f, "queue {n}"),
            Verdict::Stolen => f.write_str("stolen"),
            Verdict::Other(c) => write!(f, "verdict {c}"),
        }
    }
}

/// One trace event of the kernel, in arrival (= evaluation) order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// The kernel's trace id: the same for every event of one packet in one pass through the
    /// stack.
    pub id: u32,
    /// Table family (`inet`, `ip`, `ip6`, ...).
    pub family: String,
    pub table: String,
    pub chain: String,
    /// The handle of the rule that matched (`Rule` events only; nft).
    pub rule_handle: Option<u64>,
    /// iptables-legacy: the matched rule's position in its chain, as the explained ruleset
    /// numbers it (`Rule` events only; ip_tables rules have no handle).
    pub rule_position: Option<usize>,
    pub kind: EventKind,
    /// The rule's verdict, or for `Policy` the chain's policy.
    pub verdict: Option<Verdict>,
    /// The packet's protocol family (`NFPROTO_IPV4` = 2, `NFPROTO_IPV6` = 10), if reported.
    pub nfproto: Option<u32>,
}

impl fmt::Display for TraceEvent {
    /// `inet istio-proxy-nat istio-output rule handle 12 (verdict jump istio-redirect)`, in the
    /// spirit of `nft monitor trace`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.family, self.table, self.chain)?;
        match self.kind {
            EventKind::Rule => {
                f.write_str(" rule")?;
                if let Some(h) = self.rule_handle {
                    write!(f, " handle {h}")?;
                }
            }
            EventKind::Return => return f.write_str(" end of chain (return)"),
            EventKind::Policy => f.write_str(" policy")?,
        }
        if let Some(v) = &self.verdict {
            write!(f, " (verdict {v})")?;
        }
        Ok(())
    }
}

/// What the connection attempt itself saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// TCP handshake completed; `local` is the client's address.
    Connected { local: SocketAddr },
    /// TCP: reset (no listener where the kernel sent it).
    Refused,
    /// TCP: no answer within [`CONNECT_TIMEOUT`] (dropped, or a blackhole).
    TimedOut,
    /// UDP: the datagram was sent from `local`.
    Sent { local: SocketAddr },
    /// The kernel refused before sending (e.g. no route); the message names the errno.
    Failed(String),
    /// [`TraceHow::Wait`]: someone else's packet was traced.
    Observed,
}

/// The kernel's path for the first traced packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelPath {
    /// `inet <table>` that hosted the temporary chain.
    pub table: String,
    /// `output` or `prerouting`.
    pub hook: &'static str,
    /// The temporary chain's name (gone by the time this is returned).
    pub trace_chain: String,
    /// The trace id of the first traced packet; `None` if no packet reached the hook (e.g. the
    /// connect failed before sending).
    pub trace_id: Option<u32>,
    /// Events of that packet in our tables (`inet istio-*`), in evaluation order, without the
    /// temporary chain's own event.
    pub events: Vec<TraceEvent>,
    pub attempt: Attempt,
}

impl KernelPath {
    /// The event that decided the packet's fate in the last hook it traversed: the last event
    /// with a final verdict (accept/drop/queue/stolen, incl. a policy), if any.
    pub fn deciding_event(&self) -> Option<&TraceEvent> {
        self.events
            .iter()
            .rev()
            .find(|e| e.verdict.as_ref().is_some_and(Verdict::is_final))
    }

    /// The chains entered, in order, each once per entry (base chains and jump/goto targets).
    pub fn chains(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for e in &self.events {
            let here = (e.table.as_str(), e.chain.as_str());
            if out.last() != Some(&here) {
                out.push(here);
            }
        }
        out
    }

    /// Whether any of our tables saw the packet at all.
    pub fn touched_our_tables(&self) -> bool {
        !self.events.is_empty()
    }
}

/// Why a trace failed. Every variant names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("network namespace {path}: {source}")]
    Namespace { path: PathBuf, source: io::Error },
    #[error("no istio rules in this namespace{}", at(.netns))]
    NoIstioRules { netns: Option<PathBuf> },
    #[error("invalid connection: {0}")]
    InvalidConnection(String),
    #[error("{what}: {source}")]
    Netlink { what: String, source: io::Error },
    #[error("the kernel refused {what}: {source}")]
    Refused { what: String, source: io::Error },
    #[error("making the connection: {what}: {source}")]
    Connect { what: String, source: io::Error },
    #[error("no packet of that connection within {}s", .waited.as_secs_f64())]
    NothingSeen { waited: Duration },
    #[error("{what}: {source}")]
    Legacy {
        what: String,
        source: iptables_legacy::LegacyError,
    },
    #[error("interrupted by signal {signal}; the temporary chain was removed")]
    Interrupted { signal: i32 },
}

impl From<crate::connection::Invalid> for TraceError {
    fn from(e: crate::connection::Invalid) -> Self {
        TraceError::InvalidConnection(e.to_string())
    }
}

fn at(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| format!(" ({})", p.display()))
        .unwrap_or_default()
}

/// Traces `conn` through the live rules of the namespace at `netns` (`None`: the caller's).
///
/// Removes stale temporary chains of dead processes first, then: opens the trace listener,
/// adds the temporary chain, makes the connection or waits, removes the chain (also on error
/// and on SIGINT/SIGTERM, which are handled for the duration of the call and reported as
/// [`TraceError::Interrupted`]: the caller should then exit, e.g. with 128 + signal).
pub fn trace(
    netns: Option<&Path>,
    conn: &Connection,
    how: TraceHow,
) -> Result<KernelPath, TraceError> {
    conn.validate()?;
    validate_wait(how)?;
    let ns = Netns::open(netns)?;
    refuse_inbound_from_inside(&ns, conn, how)?;
    match ns.run(|| backend(&ns, None))? {
        Host::Nft(table) => trace_nft(&ns, table, conn, how),
        Host::Legacy => legacy::trace(&ns, conn, how),
    }
}

/// [`trace`] through the rules of `backend` (the one the explanation read), not the one found.
pub fn trace_with(
    netns: Option<&Path>,
    conn: &Connection,
    how: TraceHow,
    backend: crate::ir::Backend,
) -> Result<KernelPath, TraceError> {
    conn.validate()?;
    validate_wait(how)?;
    let ns = Netns::open(netns)?;
    refuse_inbound_from_inside(&ns, conn, how)?;
    match ns.run(|| self::backend(&ns, Some(backend)))? {
        Host::Nft(table) => trace_nft(&ns, table, conn, how),
        Host::Legacy => legacy::trace(&ns, conn, how),
    }
}

/// The kernel's record (conntrack entry + rule counters, NOT a rule-by-rule path) of `conn`
/// made from the node namespace at `netns` (`None`: the caller's) through Istio's legacy host
/// probe rule: the connection is made for real, nothing is added or rebound (see
/// `legacy::host`). Outbound only (a connection the node makes).
pub fn record_host(netns: Option<&Path>, conn: &Connection) -> Result<KernelRecord, TraceError> {
    conn.validate()?;
    if conn.direction != Direction::Outbound {
        return Err(TraceError::InvalidConnection(
            "the host probe rule sees connections the node makes (outbound)".into(),
        ));
    }
    legacy::host::record(&Netns::open(netns)?, conn)
}

/// A wait longer than [`MAX_WAIT`] is refused: the next run takes a chain older than
/// [`MAX_RUN`] from another PID namespace for a dead run's.
fn validate_wait(how: TraceHow) -> Result<(), TraceError> {
    match how {
        TraceHow::Wait(d) if d > MAX_WAIT => Err(TraceError::InvalidConnection(format!(
            "waiting {}s, longer than the longest wait ({}s)",
            d.as_secs_f64(),
            MAX_WAIT.as_secs()
        ))),
        _ => Ok(()),
    }
}

fn refuse_inbound_from_inside(
    ns: &Netns,
    conn: &Connection,
    how: TraceHow,
) -> Result<(), TraceError> {
    if conn.direction == Direction::Inbound && how == TraceHow::Connect && ns.is_callers()? {
        // From inside the pod the packet would leave through `output` and come back over
        // lo: not the path of a connection arriving from outside.
        return Err(TraceError::InvalidConnection(
            "an inbound connection cannot be made from inside the pod's own namespace: run \
             from another namespace (e.g. the host's) or wait for a real one"
                .into(),
        ));
    }
    Ok(())
}

/// The traced namespace, held open for the whole trace ([`HeldNetns`]): the chain's removal
/// runs in the same namespace even if its path is unmounted meanwhile. `held: None` is the
/// caller's namespace, where work runs on the caller's thread.
#[derive(Clone)]
struct Netns {
    /// The path as given, for messages.
    given: Option<PathBuf>,
    held: Option<Arc<HeldNetns>>,
}

impl Netns {
    fn open(path: Option<&Path>) -> Result<Self, TraceError> {
        let held = path.map(|p| {
            HeldNetns::open(p).map_err(|e| TraceError::Namespace {
                path: p.to_path_buf(),
                source: match e {
                    netns::ForeignError::Io { source, .. } => source,
                    other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
                },
            })
        });
        Ok(Self {
            given: path.map(Path::to_path_buf),
            held: held.transpose()?.map(Arc::new),
        })
    }

    /// The caller's namespace.
    fn callers() -> Self {
        Self {
            given: None,
            held: None,
        }
    }

    fn path(&self) -> Option<&Path> {
        self.given.as_deref()
    }

    /// Whether the calling thread is already in this namespace.
    fn is_callers(&self) -> Result<bool, TraceError> {
        match &self.held {
            None => Ok(true),
            Some(h) => h.is_current().map_err(|e| self.err(e)),
        }
    }

    /// Runs `f` in the namespace on a fresh thread (or in place for the caller's namespace).
    fn run<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, TraceError> + Send,
    ) -> Result<T, TraceError> {
        match &self.held {
            None => f(),
            Some(h) => h.run(f).map_err(|e| self.entering(e))?,
        }
    }

    /// Why [`netns::run_in`] could not run work in the namespace.
    fn entering(&self, e: NetnsError) -> TraceError {
        self.err(match e {
            NetnsError::Open { source, .. } | NetnsError::Spawn { source, .. } => source,
            NetnsError::Enter { source, .. } => source.into(),
            NetnsError::Panicked { .. } => io::Error::other("worker thread panicked"),
        })
    }

    fn err(&self, source: io::Error) -> TraceError {
        TraceError::Namespace {
            path: self.given.clone().unwrap_or_default(),
            source,
        }
    }
}

/// Where the pod's rules are, so where the trace goes.
enum Host {
    /// One of our nft tables (hosts the temporary chain).
    Nft(&'static str),
    /// Our iptables-legacy chains (TRACE rules in the raw table).
    Legacy,
}

/// Our nft tables if there are any (removing stale temporary chains of ours first), else our
/// iptables-legacy chains (current namespace); `wanted` picks one. Reading nft's tables creates
/// nothing.
fn backend(ns: &Netns, wanted: Option<crate::ir::Backend>) -> Result<Host, TraceError> {
    if wanted == Some(crate::ir::Backend::IptablesLegacy) {
        return Ok(Host::Legacy);
    }
    hook::remove_stale()?;
    match hook::host_table(ns) {
        Err(e @ TraceError::NoIstioRules { .. }) if wanted.is_some() => Err(e),
        Ok(t) => Ok(Host::Nft(t)),
        Err(TraceError::NoIstioRules { netns }) => {
            let legacy = iptables_legacy::has_our_chains(&iptables_legacy::Tools::default())
                .map_err(|e| TraceError::Legacy {
                    what: "looking for iptables-legacy rules".into(),
                    source: e,
                })?;
            if legacy {
                Ok(Host::Legacy)
            } else {
                Err(TraceError::NoIstioRules { netns })
            }
        }
        Err(e) => Err(e),
    }
}

/// What every trace sets up once its listener is subscribed: SIGINT/SIGTERM handling, and
/// the connecting thread with its socket bound (outbound, its source port: nothing rewrites
/// it before the first hook, so the trace rule can match it).
struct Started {
    signals: signals::Guard,
    prober: Option<connect::Prober>,
    sport: Option<u16>,
}

fn start(ns: &Netns, conn: &Connection, how: TraceHow) -> Result<Started, TraceError> {
    let signals = signals::Guard::install().map_err(|source| TraceError::Netlink {
        what: "installing SIGINT/SIGTERM handlers".into(),
        source,
    })?;
    let prober = match how {
        TraceHow::Connect => Some(connect::Prober::start(ns, conn)?),
        TraceHow::Wait(_) => None,
    };
    let sport = prober
        .as_ref()
        .filter(|_| conn.direction == Direction::Outbound)
        .map(|p| p.local.port());
    Ok(Started {
        signals,
        prober,
        sport,
    })
}

/// The outcome of the watch, unless removing the trace rules failed: something may be left
/// behind, and that matters more than how the watch ended.
fn after_removal<T>(
    watched: Result<T, TraceError>,
    removed: Result<(), TraceError>,
) -> Result<T, TraceError> {
    if let Err(e) = removed {
        if let Err(w) = &watched {
            tracing::warn!("trace ended with: {w}");
        }
        return Err(e);
    }
    watched
}

fn trace_nft(
    ns: &Netns,
    table: &'static str,
    conn: &Connection,
    how: TraceHow,
) -> Result<KernelPath, TraceError> {
    // Subscribed before the rule exists: no event of the traced packet can be missed.
    let mut listener = ns.run(listen::TraceSocket::open)?;
    let st = start(ns, conn, how)?;
    let extra = hook::Extra { sport: st.sport };
    let chain = hook::TempChain::add(ns, table, conn, extra)?;
    let name = chain.name.clone();
    let mut c = Collector::new(&name, chain.looped.as_deref());
    let watched = watch::watch(&mut listener, &st.signals, st.prober.as_ref(), &mut c, how);
    // Removed before the signal handlers go back to their defaults.
    let removed = chain.remove();
    drop(st);
    let attempt = after_removal(watched, removed)?;
    Ok(KernelPath {
        table: table.to_string(),
        hook: conn.hook(),
        trace_chain: name,
        trace_id: c.trace_id,
        events: c.events,
        attempt,
    })
}

impl watch::Source for listen::TraceSocket {
    type Item = TraceEvent;
    fn drain(&mut self) -> Result<Vec<TraceEvent>, TraceError> {
        listen::TraceSocket::drain(self)
    }
    fn raw_fd(&self) -> i32 {
        listen::TraceSocket::raw_fd(self)
    }
}

impl watch::Collect<TraceEvent> for Collector {
    fn feed(&mut self, e: TraceEvent) {
        Collector::feed(self, e)
    }
    fn seen(&self) -> bool {
        self.trace_id.is_some()
    }
}

/// Keeps the events of the first packet our temporary chain marked, in our tables only, and
/// those of its second pass over lo (marked by the `looped` chain after the first pass).
struct Collector {
    chain: String,
    looped: Option<String>,
    trace_id: Option<u32>,
    looped_id: Option<u32>,
    events: Vec<TraceEvent>,
}

impl Collector {
    fn new(chain: &str, looped: Option<&str>) -> Self {
        Self {
            chain: chain.to_string(),
            looped: looped.map(str::to_string),
            trace_id: None,
            looped_id: None,
            events: Vec::new(),
        }
    }

    fn feed(&mut self, e: TraceEvent) {
        // Our rule matched (not merely: the packet, marked by someone else's trace rule,
        // passed through our chain).
        let ours = e.kind == EventKind::Rule;
        if self.trace_id.is_none() && e.chain == self.chain && ours {
            self.trace_id = Some(e.id);
        }
        if self.trace_id.is_some()
            && self.looped_id.is_none()
            && Some(&e.chain) == self.looped.as_ref()
            && ours
        {
            self.looped_id = Some(e.id);
        }
        let of_ours = self.trace_id == Some(e.id) || self.looped_id == Some(e.id);
        if !of_ours
            || !hook::is_our_table(&e.family, &e.table)
            || e.chain.starts_with(TRACE_CHAIN_PREFIX)
        {
            return;
        }
        self.events.push(e);
    }
}

/// Removes temporary chains (`istio-explain-…`) in our nft tables and TRACE rules tagged so in
/// the iptables-legacy raw table whose run is provably gone (a run killed with SIGKILL): in
/// our PID namespace its process is gone, a zombie or another process with its pid; from
/// another PID namespace (e.g. `kubectl exec` and the host) the tag is older than [`MAX_RUN`].
/// Returns the names removed. [`trace`] calls it itself.
pub fn remove_stale_chains(netns: Option<&Path>) -> Result<Vec<String>, TraceError> {
    let ns = Netns::open(netns)?;
    ns.run(|| {
        let mut removed = hook::remove_stale()?;
        removed.extend(legacy::remove_stale(
            &ns,
            &iptables_legacy::Tools::default(),
        )?);
        Ok(removed)
    })
}

/// Names of all temporary chains in our nft tables and tags of all TRACE rules of ours in the
/// iptables-legacy raw table (for tests and diagnostics).
pub fn list_trace_chains(netns: Option<&Path>) -> Result<Vec<String>, TraceError> {
    Netns::open(netns)?.run(|| {
        let mut names: Vec<String> = hook::list()?.into_iter().map(|(_, c)| c).collect();
        names.extend(legacy::list(&iptables_legacy::Tools::default())?);
        Ok(names)
    })
}

/// The temporary rule for `conn`, in nft syntax (what `--trace` adds; for display). The
/// source port of the probe socket is added to it when `--trace` connects outbound.
pub fn trace_rule_text(conn: &Connection) -> String {
    hook::rule_text(conn, hook::Extra::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: u32, table: &str, chain: &str) -> TraceEvent {
        TraceEvent {
            id,
            family: "inet".into(),
            table: table.into(),
            chain: chain.into(),
            rule_handle: Some(1),
            rule_position: None,
            kind: EventKind::Rule,
            verdict: Some(Verdict::Continue),
            nfproto: Some(2),
        }
    }

    #[test]
    fn collector_keeps_the_first_marked_packet_in_our_tables() {
        let mut c = Collector::new("istio-explain-1-0", None);
        c.feed(ev(7, "istio-proxy-nat", "output")); // before our mark: another packet
        let mut passing = ev(8, "istio-proxy-nat", "istio-explain-1-0");
        passing.kind = EventKind::Return; // marked by another trace, our rule did not match
        c.feed(passing);
        c.feed(ev(9, "istio-proxy-nat", "istio-explain-1-0"));
        c.feed(ev(9, "filter", "output")); // not ours
        c.feed(ev(9, "istio-proxy-nat", "output"));
        c.feed(ev(9, "istio-proxy-nat", "istio-explain-2-0")); // someone else's trace chain
        c.feed(ev(11, "istio-proxy-nat", "istio-explain-1-0")); // a retransmission
        c.feed(ev(11, "istio-proxy-nat", "output"));
        assert_eq!(c.trace_id, Some(9));
        assert_eq!(c.events, vec![ev(9, "istio-proxy-nat", "output")]);
    }

    #[test]
    fn collector_follows_the_second_pass_over_lo() {
        let mut c = Collector::new("istio-explain-1-0", Some("istio-explain-1-1"));
        c.feed(ev(5, "istio-proxy-nat", "istio-explain-1-1")); // before the first pass
        c.feed(ev(9, "istio-proxy-nat", "istio-explain-1-0"));
        c.feed(ev(9, "istio-proxy-mangle", "output"));
        c.feed(ev(12, "istio-proxy-mangle", "prerouting")); // not marked by our second rule
        c.feed(ev(13, "istio-proxy-nat", "istio-explain-1-1"));
        c.feed(ev(13, "istio-proxy-mangle", "prerouting"));
        c.feed(ev(14, "istio-proxy-nat", "istio-explain-1-1")); // a retransmission
        c.feed(ev(14, "istio-proxy-mangle", "prerouting"));
        assert_eq!((c.trace_id, c.looped_id), (Some(9), Some(13)));
        assert_eq!(
            c.events,
            vec![
                ev(9, "istio-proxy-mangle", "output"),
                ev(13, "istio-proxy-mangle", "prerouting")
            ]
        );
    }

    #[test]
    fn inconsistent_connections_are_refused_by_name_before_anything_is_opened() {
        let nowhere = Some(Path::new("/nonexistent/netns"));
        let c = Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            "10.0.0.1:80".parse().unwrap(),
        )
        .src("::1".parse().unwrap());
        let e = trace(nowhere, &c, TraceHow::Connect).unwrap_err();
        assert!(
            matches!(&e, TraceError::InvalidConnection(w) if w.contains("::1")),
            "{e}"
        );
        let c = Connection::new(
            Direction::Inbound,
            Protocol::Tcp,
            "10.0.0.1:80".parse().unwrap(),
        )
        .uid(1);
        let e = record_host(nowhere, &c).unwrap_err();
        assert!(
            matches!(&e, TraceError::InvalidConnection(w) if w.contains("uid")),
            "{e}"
        );
    }
}
