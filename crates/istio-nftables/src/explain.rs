//! `istio-nftables explain`: where does this connection go through the pod's live rules, and
//! why (and, with `--trace`, what the kernel says).

use clap::{Parser, ValueEnum};
use explain::trace::{self, TraceHow};
use explain::{
    self as ex, Connection, Direction, ExplainError, Protocol, Zone, compare::Agreement,
};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

const JSON_HELP: &str = "\
JSON output (--json), one object; field names are stable:
  backend            \"nft\" | \"iptables-legacy\"
  connection         {direction, protocol, src, dst, uid, gid, mark?, iif, oif, assumed[]}
  steps[]            the path, in evaluation order:
                     {hook, family, table, chain, kind: rule|return|policy,
                      rule?: {position, handle?, comment?, text}, verdict, effects[]?}
                     verdict: {kind: accept|drop|return|continue|jump|goto, chain?}
  outcome            {kind: redirected|tproxied|snatted|dropped|not-captured|untouched|
                      cannot-evaluate, to?, port?, from?, local?, reason?, expr?, chain?, rule?,
                      by?: {family, table, chain, rule}}
  summary            the outcome in one line
  notes[]            facts the explanation relied on
  trace              (--trace only) {agree, kernel_steps[] (as steps), kernel_outcome,
                      attempt, differences[], not_traced[], record?}
                     record (Istio's legacy host rule, kernel_steps then empty): the kernel's
                     record, not a path: {method: \"kernel's record (conntrack + rule
                      counters)\", looked_up?, conntrack?, counters[], corroborated?}

Exit status: 0 explained (and, with --trace, the kernel agrees); 1 failure, or a rule
uses an expression the evaluator does not know (outcome cannot-evaluate); 2 bad input
(the message names the argument and value); 3 --trace disagrees with the static explanation;
4 --trace is not confirmed: the kernel reported nothing at a hook the static path crosses
(e.g. the connection never reached the pod: an inbound trace runs from the caller's namespace;
Istio's legacy host rule: conntrack holds no entry for the connection).";

#[derive(Parser, Debug)]
#[command(
    name = "istio-nftables explain",
    about = "Explain where a connection goes through a pod's live istio rules, and why.",
    long_about = "Reads the live rules of our tables (nft: inet istio-proxy-{raw,mangle,nat} of \
                  sidecar pods, inet istio-ambient-{raw,mangle,nat} of ambient pods; \
                  iptables-legacy: the raw, mangle and nat tables holding ISTIO_* chains, built-in \
                  chains included) \
                  in the pod's network namespace (--network-namespace, or --pod NAMESPACE/NAME \
                  found as the node daemon finds it; --host: the node's ambient probe rule, \
                  nft's or Istio's legacy ISTIO_POSTRT with its ipsets), walks a synthetic first packet of the \
                  connection through them hook by hook, and prints each chain entered, the \
                  rule that decided (comment and text) and the outcome. --trace confirms it \
                  with the kernel (nft: a temporary nftrace chain; iptables-legacy: TRACE \
                  rules in the raw table; Istio's legacy host rule: not traced, which would \
                  rebind the node's packet logger, but the kernel's record of the connection \
                  (conntrack + rule counters), not a rule-by-rule path).",
    after_help = JSON_HELP
)]
pub struct ExplainArgs {
    /// The pod's network namespace (e.g. /var/run/netns/NAME or /proc/PID/ns/net); with
    /// --host the node's (default: this one).
    #[arg(
        long = "network-namespace",
        value_name = "PATH",
        conflicts_with = "pod"
    )]
    netns: Option<PathBuf>,
    /// The pod, by name: its IP from the Kubernetes API, its network namespace through
    /// --proc-root (as the node daemon finds running pods). Sidecar and ambient pods.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pod: Option<String>,
    /// With --pod: the kubeconfig (default: KUBECONFIG, else in-cluster).
    #[arg(long, value_name = "PATH", requires = "pod")]
    kubeconfig: Option<PathBuf>,
    /// With --pod: the host's /proc (in the node daemon's container usually /host/proc).
    #[arg(
        long = "proc-root",
        value_name = "DIR",
        default_value = "/proc",
        requires = "pod"
    )]
    proc_root: PathBuf,
    /// Explain a connection made on the node (e.g. kubelet's probe, --uid its uid) through
    /// ambient's host probe rule: inet istio-ambient-nat postrouting (nft), or Istio's legacy
    /// nat ISTIO_POSTRT with its ipsets (iptables-legacy); --backend picks, auto finds it.
    #[arg(long, conflicts_with = "pod")]
    host: bool,
    /// outbound: made by a process in the pod; inbound: arriving at the pod.
    #[arg(long, value_enum, default_value = "outbound")]
    direction: Dir,
    #[arg(long, value_enum, default_value = "tcp")]
    protocol: Proto,
    /// Destination address and port: `10.0.0.1:80`, `[fd00::1]:443`; a link-local address with
    /// its zone, an interface of the pod (name or index): [fe80::1%eth0]:80. Inbound, the
    /// zone is the interface it arrives on (needed only if the address is on several).
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_dst)]
    dst: Dst,
    /// Source address (outbound: an address of the pod; inbound: the remote peer).
    #[arg(long, value_name = "ADDR")]
    src: Option<IpAddr>,
    /// uid of the sending process (outbound only; default 0).
    #[arg(long)]
    uid: Option<u32>,
    /// gid of the sending process (outbound only; default 0).
    #[arg(long)]
    gid: Option<u32>,
    /// The sending socket's mark (outbound only; default 0), e.g. ztunnel's 0x539: decimal
    /// or 0x-hex. --trace sets it with SO_MARK (needs uid 0).
    #[arg(long, value_parser = parse_mark)]
    mark: Option<u32>,
    /// Which rules to read: auto (nft if our nft tables exist, else iptables-legacy).
    #[arg(long, value_enum, default_value = "auto")]
    backend: Which,
    /// Confirm with the kernel: trace the connection (made by this command, as --uid/--gid,
    /// inside the namespace) and compare. Both backends; Istio's legacy host rule is
    /// confirmed from the kernel's record instead (conntrack entry + rule counters, not a
    /// rule-by-rule path; no --wait).
    #[arg(long)]
    trace: bool,
    /// With --trace: wait up to SECONDS (at most 3600) for a real connection instead of making
    /// one.
    #[arg(long, value_name = "SECONDS", requires = "trace")]
    wait: Option<f64>,
    /// Print JSON (see below) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Dir {
    Outbound,
    Inbound,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Proto {
    Tcp,
    Udp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    Auto,
    Nft,
    IptablesLegacy,
}

/// `--dst`: the address and port, and a link-local address's zone as written.
#[derive(Clone, Debug)]
struct Dst(SocketAddr, Option<Zone>);

fn parse_dst(s: &str) -> Result<Dst, String> {
    let (a, zone) = explain::zone::parse_dst(s)?;
    if a.port() == 0 {
        return Err("port 0 is not a connection's port".into());
    }
    Ok(Dst(a, zone))
}

fn parse_mark(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|_| "expected a 32-bit mark, decimal or 0x-hex".into())
}

impl ExplainArgs {
    fn connection(&self) -> Connection {
        let mut c = Connection::new(
            match self.direction {
                Dir::Outbound => Direction::Outbound,
                Dir::Inbound => Direction::Inbound,
            },
            match self.protocol {
                Proto::Tcp => Protocol::Tcp,
                Proto::Udp => Protocol::Udp,
            },
            self.dst.0,
        );
        c.zone = self.dst.1.clone();
        c.src = self.src;
        c.uid = self.uid;
        c.gid = self.gid;
        c.mark = self.mark;
        c
    }

    /// The namespace to explain in: --pod's, --network-namespace, or with --host the node's
    /// (`None`: this one).
    fn target(&self) -> Result<Option<PathBuf>, ExplainError> {
        if let Some(pod) = &self.pod {
            return crate::pod::netns_of(pod, self.kubeconfig.as_deref(), &self.proc_root)
                .map(Some);
        }
        match (&self.netns, self.host) {
            (Some(p), _) => {
                // Its type read before anything opens it, as the plugin does: a FIFO (or a
                // link to one) is refused at once instead of blocking every later open.
                netns::HeldNetns::open(p).map_err(|e| ExplainError::BadInput {
                    arg: "--network-namespace",
                    value: p.display().to_string(),
                    why: e.to_string(),
                })?;
                Ok(Some(p.clone()))
            }
            (None, true) => Ok(None),
            (None, false) => Err(ExplainError::BadInput {
                arg: "--network-namespace",
                value: String::new(),
                why: "required (or --pod NAMESPACE/NAME, or --host for the node's probe rule)"
                    .into(),
            }),
        }
    }

    /// --host: a connection from the node.
    fn check_host(&self) -> Result<(), ExplainError> {
        if self.host && matches!(self.direction, Dir::Inbound) {
            return Err(ExplainError::BadInput {
                arg: "--direction",
                value: "inbound".into(),
                why: "--host explains connections made on the node (outbound)".into(),
            });
        }
        Ok(())
    }
}

/// Entry point for `istio-nftables explain ARGS…` (`argv` without the program name).
pub fn main(argv: Vec<String>) -> ExitCode {
    let args = match ExplainArgs::try_parse_from(
        std::iter::once("istio-nftables explain".to_string()).chain(argv),
    ) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("istio-nftables explain: {e}");
            ExitCode::from(if e.is_bad_input() { 2 } else { 1 })
        }
    }
}

fn run(a: &ExplainArgs) -> Result<ExitCode, ExplainError> {
    let conn = a.connection();
    a.check_host()?;
    let target = a.target()?;
    let netns = target.as_deref();
    let (rs, backend) = if a.host {
        host_ruleset(netns, a.backend)?
    } else {
        ruleset(netns, a.backend)?
    };
    let legacy_host = a.host && rs.backend == ex::ir::Backend::IptablesLegacy;
    if a.trace && legacy_host && a.wait.is_some() {
        return Err(ExplainError::BadInput {
            arg: "--wait",
            value: a.wait.map(|w| w.to_string()).unwrap_or_default(),
            why: format!(
                "this node's host probe rule is {backend}: it is confirmed from the kernel's \
                 record of a connection this command makes, not by waiting for one"
            ),
        });
    }
    let facts = ex::namespace_facts(netns, &conn)?;
    let mut explanation = ex::explain_with(&rs, &conn, &facts)?;
    if a.host {
        explanation.notes.extend(ex::host_notes(netns, &rs)?);
    }
    let agreement = match a.trace {
        false => None,
        // Not traced (TRACE would rebind the node's own packet logger): the kernel's record.
        true if legacy_host => {
            let rec = trace::record_host(netns, &conn).map_err(trace_err)?;
            Some(ex::compare::compare_record(&explanation, &rec))
        }
        true => match traced(a, netns, &conn, &rs, &explanation)? {
            Ok(ag) => Some(ag),
            Err(code) => return Ok(code),
        },
    };
    let note = agreement
        .as_ref()
        .and_then(|ag| probe_snat_note(&conn, &rs, ag));
    if a.json {
        let mut v = serde_json::to_value(&explanation).expect("serialisable");
        if let Some(ag) = &agreement {
            v["trace"] = serde_json::to_value(ag).expect("serialisable");
            if let Some(n) = &note {
                v["trace"]["note"] = n.as_str().into();
            }
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("serialisable")
        );
    } else {
        print!("{}", ex::render_text(&explanation));
        if let Some(ag) = &agreement {
            print!("{}", render_agreement(ag));
        }
        if let Some(n) = &note {
            println!("note: {n}");
        }
    }
    if matches!(explanation.outcome, ex::Outcome::CannotEvaluate { .. }) {
        return Ok(ExitCode::from(1));
    }
    Ok(match agreement {
        Some(ag) if !ag.agree => ExitCode::from(3),
        Some(ag) if !ag.not_traced.is_empty() => ExitCode::from(4),
        _ => ExitCode::SUCCESS,
    })
}

/// The kernel trace of `conn`, compared; `Err(code)`: interrupted, exit with `code`.
fn traced(
    a: &ExplainArgs,
    netns: Option<&Path>,
    conn: &Connection,
    rs: &ex::ir::Ruleset,
    explanation: &ex::Explanation,
) -> Result<Result<Agreement, ExitCode>, ExplainError> {
    let how = match a.wait {
        Some(s) if s > 0.0 && s <= trace::MAX_WAIT.as_secs_f64() => {
            TraceHow::Wait(Duration::from_secs_f64(s))
        }
        Some(s) => {
            return Err(ExplainError::BadInput {
                arg: "--wait",
                value: s.to_string(),
                why: format!(
                    "must be a positive number of seconds, at most {}",
                    trace::MAX_WAIT.as_secs()
                ),
            });
        }
        None => TraceHow::Connect,
    };
    match trace::trace_with(netns, conn, how, rs.backend) {
        Ok(kp) => Ok(Ok(ex::compare::compare(rs, explanation, &kp))),
        // The temporary chain is already gone; exit as the signal asked.
        Err(trace::TraceError::Interrupted { signal }) => {
            eprintln!("istio-nftables explain: interrupted (signal {signal}); nothing left behind");
            Ok(Err(ExitCode::from(128u8.saturating_add(signal as u8))))
        }
        Err(e) => Err(trace_err(e)),
    }
}

fn trace_err(e: trace::TraceError) -> ExplainError {
    match e {
        trace::TraceError::InvalidConnection(why) => ExplainError::BadInput {
            arg: "connection",
            value: String::new(),
            why,
        },
        other => ExplainError::Io {
            context: "kernel trace".into(),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// The kernel's record (legacy host probe rule) in place of a trace's path.
fn render_record(r: &ex::compare::RecordShown) -> String {
    let mut o = format!("{}; not a rule-by-rule path:\n", r.method);
    let none = |what: &str| format!("none ({what})");
    let entry = r.conntrack.clone().unwrap_or_else(|| {
        none(match r.looked_up {
            Some(_) => "the kernel holds no entry for it",
            None => "no packet was sent",
        })
    });
    if let Some(l) = &r.looked_up {
        o.push_str(&format!("  looked up: {l}\n"));
    }
    o.push_str(&format!("  conntrack: {entry}\n"));
    for c in &r.counters {
        o.push_str(&format!("  counter: {c}\n"));
    }
    o.push_str(match r.corroborated {
        Some(true) => "  counters corroborate the conntrack entry\n",
        Some(false) => {
            "  counters do not corroborate it (other connections move them too; conntrack decides)\n"
        }
        None => "",
    });
    o
}

/// Why an inbound trace of an ambient pod may see nothing: made from an ambient node's own
/// namespace, the host probe rule SNATs the connection to the probe address on the way out,
/// so the trace rule (which matches the source given) never sees it.
fn probe_snat_note(conn: &Connection, rs: &ex::ir::Ruleset, ag: &Agreement) -> Option<String> {
    use capture::ambient_constants::{HOST_PROBE_SNAT_V4, HOST_PROBE_SNAT_V6};
    let probe = match conn.is_ipv6() {
        false => IpAddr::from(HOST_PROBE_SNAT_V4),
        true => IpAddr::from(HOST_PROBE_SNAT_V6),
    };
    let ambient = rs
        .chains
        .iter()
        .any(|c| c.table.starts_with("istio-ambient") || c.name == "ISTIO_PRERT");
    let nothing = ag.record.is_none() && ag.kernel_steps.is_empty();
    (conn.direction == Direction::Inbound && ambient && nothing && conn.src != Some(probe)).then(
        || {
            format!(
                "the kernel saw nothing of this connection. Made from an ambient node's own \
                 namespace, a connection to an ambient pod is SNATed to {probe} by the node's \
                 host probe rule before it reaches the pod: explain and trace it with --src {probe}"
            )
        },
    )
}

fn render_agreement(ag: &Agreement) -> String {
    let mut o = match &ag.record {
        Some(r) => render_record(r),
        None => format!(
            "kernel trace:\n{}",
            ex::render::render_steps(&ag.kernel_steps)
        ),
    };
    o.push_str(&format!(
        "kernel: {} (attempt: {})\n",
        ag.kernel_outcome, ag.attempt
    ));
    if !ag.not_traced.is_empty() {
        o.push_str(&format!(
            "note: the kernel trace did not report hook(s) {}\n",
            ag.not_traced.join(", ")
        ));
    }
    if ag.agree && !ag.not_traced.is_empty() {
        o.push_str("agree: not confirmed (nothing the kernel reported disagrees, but it did not report every hook)\n");
    } else if ag.agree && ag.record.is_some() {
        o.push_str("agree: yes (conntrack confirms the same outcome)\n");
    } else if ag.agree {
        o.push_str("agree: yes (same deciding rule in every table, same outcome)\n");
    } else {
        o.push_str("agree: NO\n");
        for d in &ag.differences {
            o.push_str(&format!("  {d}\n"));
        }
    }
    o
}

fn has_host_rule(rs: &ex::ir::Ruleset) -> bool {
    rs.chains.iter().any(|c| {
        (c.table == "istio-ambient-nat"
            && c.base.is_some_and(|b| b.hook == ex::ir::Hook::Postrouting))
            || c.name == explain::live_legacy::HOST_CHAIN
    })
}

/// The node's host probe rule, and which backend it is: nft's, Istio's legacy one, or with
/// auto whichever the node has (nft first, as the agent writes only one).
fn host_ruleset(
    netns: Option<&Path>,
    which: Which,
) -> Result<(ex::ir::Ruleset, &'static str), ExplainError> {
    let nft = || ex::live_ruleset(netns).map(|rs| Some(rs).filter(has_host_rule));
    let legacy = || ex::live_legacy_host_ruleset(netns).map(|rs| Some(rs).filter(has_host_rule));
    let found = match which {
        Which::Nft => nft()?,
        Which::IptablesLegacy => legacy()?,
        Which::Auto => match nft()? {
            Some(rs) => Some(rs),
            None => legacy()?,
        },
    };
    let Some(rs) = found else {
        return Err(ExplainError::NoRules {
            netns: ex::shown(netns),
            looked: match which {
                Which::Nft => "no host probe rule (inet istio-ambient-nat, chain postrouting)",
                Which::IptablesLegacy => "no host probe rule (iptables-legacy nat ISTIO_POSTRT)",
                Which::Auto => {
                    "no host probe rule (inet istio-ambient-nat, chain postrouting; \
                     iptables-legacy nat ISTIO_POSTRT)"
                }
            }
            .into(),
        });
    };
    let name = rs.backend.name();
    Ok((rs, name))
}

/// The live rules to explain, and which backend they are.
fn ruleset(
    netns: Option<&Path>,
    which: Which,
) -> Result<(ex::ir::Ruleset, &'static str), ExplainError> {
    let nft = || ex::live_ruleset(netns);
    let legacy = || ex::live_legacy_ruleset(netns);
    let rs = match which {
        Which::Nft => nft()?,
        Which::IptablesLegacy => legacy()?,
        Which::Auto => {
            let n = nft()?;
            if n.is_empty() { legacy()? } else { n }
        }
    };
    if rs.is_empty() {
        return Err(ExplainError::NoRules {
            netns: ex::shown(netns),
            looked: match which {
                Which::Nft => "no inet istio-proxy-* or istio-ambient-* tables",
                Which::IptablesLegacy => "no ISTIO_* chains in iptables-legacy",
                Which::Auto => {
                    "no inet istio-proxy-* or istio-ambient-* tables, no ISTIO_* chains in \
                     iptables-legacy"
                }
            }
            .into(),
        });
    }
    let name = rs.backend.name();
    Ok((rs, name))
}
