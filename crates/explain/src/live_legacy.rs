//! The live iptables-legacy rules as the explain evaluator's IR ([`crate::ir`]):
//! each `iptables-legacy-save` / `ip6tables-legacy-save` rule of the raw, mangle and nat tables
//! becomes the expressions the kernel would evaluate for it in nft terms (`-m owner
//! --uid-owner 1337` → `meta skuid == 1337`, `-d 10.0.0.0/8` → payload & mask == net, ...),
//! so one evaluator explains both backends. The built-in chains are read whole (a pod's
//! namespace holds only our rules; anything else there is traversed too); a match or target
//! this reader does not know becomes an `Unknown` expression, reported rather than guessed.
//!
//! On the node ([`host_ruleset`], module `host`) Istio's legacy host probe rule is read: `nat
//! POSTROUTING` up to its jump to `ISTIO_POSTRT`, the chains those rules jump to, with the
//! ipsets they match (`-m set --match-set istio-inpod-probes-v4 dst`) as sets.

use crate::ir::{
    Backend, BaseHook, Chain, ChainType, Expr, Hook, Rule, Ruleset, Set, SetKey, TableFamily,
    Verdict,
};
use crate::trace_tag::TRACE_CHAIN_PREFIX;
use iptables_legacy::live::{our_save, parse};
use iptables_legacy::trace_rules::comment_of;
use iptables_legacy::{LegacyError, Tools};
use std::collections::HashMap;
use std::net::IpAddr;

mod host;

pub use host::{HOST_CHAIN, host_notes, host_rule_only, host_ruleset, host_ruleset_with};

const REG1: u32 = 1;

/// Our rules in the current namespace, both families; an empty ruleset when there are none.
pub fn live_ruleset() -> Result<Ruleset, LegacyError> {
    live_ruleset_with(&Tools::default())
}

/// [`live_ruleset`] with explicit binary lookup.
pub fn live_ruleset_with(tools: &Tools) -> Result<Ruleset, LegacyError> {
    read_saves(tools, Some)
}

/// Both families' save output (when it holds anything of ours), each narrowed by `select`,
/// as one ruleset.
fn read_saves(
    tools: &Tools,
    select: impl Fn(String) -> Option<String>,
) -> Result<Ruleset, LegacyError> {
    let mut rs = Ruleset {
        backend: Backend::IptablesLegacy,
        chains: Vec::new(),
        sets: Vec::new(),
    };
    for v6 in [false, true] {
        if let Some(text) = our_save(tools, v6)?.and_then(&select) {
            add_family(&mut rs, &text, v6);
        }
    }
    Ok(rs)
}

/// Fills in the ipsets the rules look up (`--match-set`), each from `members`; one that
/// cannot be read stays missing, and the evaluator says so where a rule looks it up.
pub fn load_ipsets(rs: &mut Ruleset, members: impl Fn(&str) -> Result<Vec<IpAddr>, LegacyError>) {
    let mut wanted: Vec<(String, String)> = Vec::new();
    for c in &rs.chains {
        for r in &c.rules {
            for e in &r.exprs {
                if let Expr::Lookup { set, .. } = e
                    && !set.starts_with(MULTIPORT_SET)
                    && rs.set(&c.table, set).is_none()
                    && !wanted.iter().any(|(t, n)| t == &c.table && n == set)
                {
                    wanted.push((c.table.clone(), set.clone()));
                }
            }
        }
    }
    for (table, name) in wanted {
        let Ok(addrs) = members(&name) else { continue };
        // An ipset holds one family; an empty one matches nothing either way.
        let key = if addrs.iter().any(IpAddr::is_ipv6) {
            SetKey::Ipv6Addr
        } else {
            SetKey::Ipv4Addr
        };
        rs.sets.push(Set {
            table,
            elements: addrs.iter().map(|a| (ip_bytes(*a), false)).collect(),
            name,
            key,
            interval: false,
            comment: None,
        });
    }
}

fn ip_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Names of the sets this reader makes for `--dports`/`--sports` lists.
const MULTIPORT_SET: &str = "multiport-";

fn priority(table: &str) -> Option<i32> {
    match table {
        "raw" => Some(-300),
        "mangle" => Some(-150),
        "nat" => Some(-100),
        _ => None,
    }
}

/// What nft type a built-in chain has: iptables' mangle OUTPUT reroutes a packet whose mark
/// it changed (nft's `route`), nat's chains see first packets only.
fn chain_type(table: &str, hook: Hook) -> ChainType {
    match (table, hook) {
        ("nat", _) => ChainType::Nat,
        ("mangle", Hook::Output) => ChainType::Route,
        _ => ChainType::Filter,
    }
}

/// One family's save output as a ruleset.
pub fn ruleset_of(save_text: &str, v6: bool) -> Ruleset {
    let mut rs = Ruleset {
        backend: Backend::IptablesLegacy,
        chains: Vec::new(),
        sets: Vec::new(),
    };
    add_family(&mut rs, save_text, v6);
    rs
}

/// Whether a save rule is a TRACE rule of `explain --trace` (tagged
/// `istio-explain-…`): not part of the pod's rules, so never explained; the kernel's
/// rule numbers count it ([`KernelNumbers`]).
pub fn is_trace_rule(rule: &str) -> bool {
    rule.trim_end().ends_with("-j TRACE")
        && comment_of(rule).is_some_and(|c| c.starts_with(TRACE_CHAIN_PREFIX))
}

/// Adds one family's save output (raw, mangle and nat tables) to `rs`. The trace rules of
/// `explain --trace` are left out, and so is a table without any other rule (e.g. the raw
/// table a trace instantiated: its built-in chains only accept).
pub fn add_family(rs: &mut Ruleset, save_text: &str, v6: bool) {
    let family = if v6 {
        TableFamily::Ip6
    } else {
        TableFamily::Ip
    };
    for t in parse(save_text) {
        let Some(prio) = priority(&t.name) else {
            continue;
        };
        if t.rules.iter().all(|(_, r)| is_trace_rule(r)) {
            continue;
        }
        for name in &t.chains {
            let hook = match name.as_str() {
                "PREROUTING" => Some(Hook::Prerouting),
                "OUTPUT" => Some(Hook::Output),
                "POSTROUTING" => Some(Hook::Postrouting),
                "INPUT" | "FORWARD" => Some(Hook::Other),
                _ => None,
            };
            let mut rules = Vec::new();
            let kept = t.rules_of(name).filter(|r| !is_trace_rule(r));
            for (i, text) in kept.enumerate() {
                let (exprs, comment) = translate(text, v6, &t.name, &mut rs.sets);
                rules.push(Rule {
                    handle: None,
                    position: i + 1,
                    comment,
                    text: format!("-A {name} {text}"),
                    exprs,
                });
            }
            rs.chains.push(Chain {
                family,
                table: t.name.clone(),
                name: name.clone(),
                base: hook.map(|hook| BaseHook {
                    kind: chain_type(&t.name, hook),
                    hook,
                    priority: prio,
                }),
                rules,
            });
        }
    }
}

/// What the kernel's TRACE rule numbers mean, for one family's save output: ip_tables
/// numbers the rules of a chain from 1 as iptables-save lists them, trace rules included,
/// and the chain's end (its policy, or a user chain's implicit RETURN) is one past the last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelNumbers {
    /// `(table, chain)` → for each kernel rule number - 1: the rule's [`Rule::position`], or
    /// `None` for a trace rule.
    chains: HashMap<(String, String), Vec<Option<usize>>>,
}

/// What a kernel rule number of one chain is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbered {
    /// The rule at this position of the explained ruleset.
    Rule(usize),
    /// A trace rule of `explain --trace`.
    TraceRule,
    /// The end of the chain (policy or implicit return).
    End,
    /// A chain or number the save output does not have (the rules changed meanwhile).
    Unknown,
}

impl KernelNumbers {
    pub fn of(save_text: &str) -> Self {
        let mut chains = HashMap::new();
        for t in parse(save_text) {
            for name in &t.chains {
                let mut position = 0;
                let numbers = t
                    .rules_of(name)
                    .map(|r| {
                        (!is_trace_rule(r)).then(|| {
                            position += 1;
                            position
                        })
                    })
                    .collect();
                chains.insert((t.name.clone(), name.clone()), numbers);
            }
        }
        KernelNumbers { chains }
    }

    /// Rule number `n` (1-based) of `table`'s `chain`.
    pub fn get(&self, table: &str, chain: &str, n: usize) -> Numbered {
        let Some(rules) = self.chains.get(&(table.to_string(), chain.to_string())) else {
            return Numbered::Unknown;
        };
        match n.checked_sub(1).map(|i| rules.get(i)) {
            Some(Some(Some(p))) => Numbered::Rule(*p),
            Some(Some(None)) => Numbered::TraceRule,
            Some(None) if n == rules.len() + 1 => Numbered::End,
            _ => Numbered::Unknown,
        }
    }
}

/// Splits a save line into words, keeping `"quoted strings"` whole.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn cmp(negate: bool, data: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg: REG1,
        op: if negate {
            libc::NFT_CMP_NEQ as u32
        } else {
            libc::NFT_CMP_EQ as u32
        },
        data,
    }
}

fn meta(key: i32) -> Expr {
    Expr::Meta {
        key: key as u32,
        dreg: REG1,
    }
}

fn ifname(name: &str) -> Vec<u8> {
    // `eth+` is a prefix match: compare only the bytes before the `+`.
    match name.strip_suffix('+') {
        Some(prefix) => prefix.as_bytes().to_vec(),
        None => {
            let mut b = vec![0u8; libc::IFNAMSIZ];
            b[..name.len().min(libc::IFNAMSIZ)]
                .copy_from_slice(&name.as_bytes()[..name.len().min(libc::IFNAMSIZ)]);
            b
        }
    }
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `VALUE[/MASK]` (mask all ones when absent).
fn value_mask(s: &str) -> Option<(u32, u32)> {
    match s.split_once('/') {
        Some((v, m)) => Some((parse_u32(v)?, parse_u32(m)?)),
        None => Some((parse_u32(s)?, u32::MAX)),
    }
}

/// `VALUE[/MASK]` with the mask required to be all ones (or absent).
fn full_mask_value(s: &str) -> Option<u32> {
    match s.split_once('/') {
        Some((v, m)) if parse_u32(m) == Some(u32::MAX) => parse_u32(v),
        Some(_) => None,
        None => parse_u32(s),
    }
}

fn addr_match(v6: bool, source: bool, cidr: &str, negate: bool) -> Option<Vec<Expr>> {
    let (a, p) = cidr
        .split_once('/')
        .unwrap_or((cidr, if v6 { "128" } else { "32" }));
    let a: IpAddr = a.parse().ok()?;
    let p: u32 = p.parse().ok()?;
    let (bytes, offset) = match (a, source) {
        (IpAddr::V4(a), true) => (a.octets().to_vec(), 12),
        (IpAddr::V4(a), false) => (a.octets().to_vec(), 16),
        (IpAddr::V6(a), true) => (a.octets().to_vec(), 8),
        (IpAddr::V6(a), false) => (a.octets().to_vec(), 24),
    };
    let len = bytes.len();
    let mask: Vec<u8> = (0..len)
        .map(|i| {
            let bits = (p as i32 - i as i32 * 8).clamp(0, 8);
            if bits == 0 { 0 } else { 0xffu8 << (8 - bits) }
        })
        .collect();
    let net: Vec<u8> = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
    Some(vec![
        Expr::Payload {
            base: libc::NFT_PAYLOAD_NETWORK_HEADER as u32,
            offset,
            len: len as u32,
            dreg: REG1,
        },
        Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask,
            xor: vec![0; len],
        },
        cmp(negate, net),
    ])
}

fn port_payload(offset: u32) -> Expr {
    Expr::Payload {
        base: libc::NFT_PAYLOAD_TRANSPORT_HEADER as u32,
        offset,
        len: 2,
        dreg: REG1,
    }
}

/// Match modules whose options [`matcher`] reads (`-m tcp` itself adds nothing).
const MODULES: [&str; 9] = [
    "tcp",
    "udp",
    "owner",
    "mark",
    "connmark",
    "conntrack",
    "multiport",
    "comment",
    "set",
];

/// One save rule (after `-A CHAIN`) as expressions, and its `-m comment`. The first thing
/// this reader does not know ends the rule with an `Unknown` expression.
fn translate(
    text: &str,
    v6: bool,
    table: &str,
    sets: &mut Vec<Set>,
) -> (Vec<Expr>, Option<String>) {
    let w = words(text);
    let mut out = Vec::new();
    let mut comment = None;
    let mut negate = false;
    let mut i = 0;
    while i < w.len() {
        let (tok, arg) = (
            w[i].as_str(),
            w.get(i + 1).map(String::as_str).unwrap_or(""),
        );
        match tok {
            "!" => {
                negate = true;
                i += 1;
                continue;
            }
            "-j" | "-g" => {
                target(&w[i + 1..], tok == "-g", &mut out);
                break;
            }
            "--comment" => comment = Some(arg.to_string()),
            "-m" if MODULES.contains(&arg) => {}
            // xt_owner: only a packet with a full local socket matches; `meta skuid` loads
            // only for those (as the nft host rule says it).
            "--socket-exists" if !negate => {
                out.extend([
                    meta(libc::NFT_META_SKUID),
                    Expr::Cmp {
                        sreg: REG1,
                        op: libc::NFT_CMP_GTE as u32,
                        data: 0u32.to_ne_bytes().to_vec(),
                    },
                ]);
                i += 1;
                continue;
            }
            "--match-set" => {
                let dir = w.get(i + 2).map(String::as_str).unwrap_or("");
                match match_set(arg, dir, negate, v6) {
                    Some(e) => out.extend(e),
                    None => {
                        out.push(Expr::Unknown(format!("--match-set {arg} {dir}")));
                        break;
                    }
                }
                negate = false;
                i += 3;
                continue;
            }
            _ => {
                let ctx = Ctx {
                    v6,
                    table,
                    before: &w[..i],
                };
                match matcher(tok, arg, negate, &ctx, sets) {
                    Ok(e) => out.extend(e),
                    Err(what) => {
                        out.push(Expr::Unknown(what));
                        break;
                    }
                }
            }
        }
        negate = false;
        i += 2;
    }
    (out, comment)
}

/// Where a match option stands: the family, the table, and the words before it.
struct Ctx<'a> {
    v6: bool,
    table: &'a str,
    before: &'a [String],
}

/// One match option (`-p tcp`, `! -d 10.0.0.0/8`, `--uid-owner 1337`, ...) as expressions.
fn matcher(
    tok: &str,
    arg: &str,
    negate: bool,
    ctx: &Ctx,
    sets: &mut Vec<Set>,
) -> Result<Vec<Expr>, String> {
    let unknown = || format!("{tok} {arg}");
    Ok(match tok {
        "-p" => {
            let n = match arg {
                "tcp" => libc::IPPROTO_TCP,
                "udp" => libc::IPPROTO_UDP,
                _ => return Err(unknown()),
            };
            vec![meta(libc::NFT_META_L4PROTO), cmp(negate, vec![n as u8])]
        }
        "-s" | "-d" => addr_match(ctx.v6, tok == "-s", arg, negate).ok_or_else(unknown)?,
        "-i" | "-o" => {
            let key = if tok == "-i" {
                libc::NFT_META_IIFNAME
            } else {
                libc::NFT_META_OIFNAME
            };
            vec![meta(key), cmp(negate, ifname(arg))]
        }
        "--dport" | "--sport" => {
            let p: u16 = arg.parse().map_err(|_| unknown())?;
            vec![
                port_payload(if tok == "--dport" { 2 } else { 0 }),
                cmp(negate, p.to_be_bytes().to_vec()),
            ]
        }
        "--dports" | "--sports" => {
            let ports: Vec<u16> = arg
                .split(',')
                .map(|p| p.parse().map_err(|_| unknown()))
                .collect::<Result<_, _>>()?;
            let name = format!("{MULTIPORT_SET}{}", sets.len());
            sets.push(Set {
                table: ctx.table.to_string(),
                name: name.clone(),
                key: SetKey::InetService,
                interval: false,
                comment: None,
                elements: ports
                    .iter()
                    .map(|p| (p.to_be_bytes().to_vec(), false))
                    .collect(),
            });
            vec![
                port_payload(if tok == "--dports" { 2 } else { 0 }),
                Expr::Lookup {
                    sreg: REG1,
                    set: name,
                    invert: negate,
                },
            ]
        }
        // Without a socket (forwarded or looped-back packets) xt_owner's negated match is
        // true while nft's `meta skuid !=` does not match; Istio only matches owners in OUTPUT,
        // where every locally generated packet has its socket, so the two agree there.
        "--uid-owner" | "--gid-owner" => {
            let id: u32 = arg.parse().map_err(|_| unknown())?;
            let key = if tok == "--uid-owner" {
                libc::NFT_META_SKUID
            } else {
                libc::NFT_META_SKGID
            };
            vec![meta(key), cmp(negate, id.to_ne_bytes().to_vec())]
        }
        "--mark" => mark_match(arg, negate, ctx).ok_or_else(unknown)?,
        "--ctstate" if !negate => {
            let mut mask = 0u32;
            for s in arg.split(',') {
                mask |= match s {
                    "INVALID" => 1,
                    "ESTABLISHED" => 2,
                    "RELATED" => 4,
                    "NEW" => 8,
                    "UNTRACKED" => 64,
                    _ => return Err(unknown()),
                };
            }
            vec![
                Expr::Ct {
                    key: libc::NFT_CT_STATE as u32,
                    dreg: REG1,
                },
                Expr::Bitwise {
                    sreg: REG1,
                    dreg: REG1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                },
                cmp(true, 0u32.to_ne_bytes().to_vec()),
            ]
        }
        "-m" => return Err(unknown()),
        _ => return Err(tok.to_string()),
    })
}

/// `-m set --match-set NAME src|dst`: the packet's source or destination address looked up in
/// the ipset (loaded by [`load_ipsets`]). One direction only: hash:ip sets of addresses.
fn match_set(name: &str, dir: &str, negate: bool, v6: bool) -> Option<Vec<Expr>> {
    let source = match dir {
        "src" => true,
        "dst" => false,
        _ => return None,
    };
    let (offset, len) = match (v6, source) {
        (false, true) => (12, 4),
        (false, false) => (16, 4),
        (true, true) => (8, 16),
        (true, false) => (24, 16),
    };
    Some(vec![
        Expr::Payload {
            base: libc::NFT_PAYLOAD_NETWORK_HEADER as u32,
            offset,
            len,
            dreg: REG1,
        },
        Expr::Lookup {
            sreg: REG1,
            set: name.to_string(),
            invert: negate,
        },
    ])
}

/// `-m mark --mark V[/M]` or `-m connmark --mark V[/M]`: the latest of the two modules says
/// which; xt_mark compares `(mark & M) == V`.
fn mark_match(arg: &str, negate: bool, ctx: &Ctx) -> Option<Vec<Expr>> {
    // `-m mark --mark` or `-m connmark --mark`: the latest of the two modules says which.
    let module = ctx
        .before
        .iter()
        .rev()
        .find(|t| matches!(t.as_str(), "mark" | "connmark"));
    let (v, mask) = value_mask(arg)?;
    let load = if module.is_some_and(|t| t == "connmark") {
        Expr::Ct {
            key: libc::NFT_CT_MARK as u32,
            dreg: REG1,
        }
    } else {
        meta(libc::NFT_META_MARK)
    };
    let mut e = vec![load];
    // xt_mark: (mark & mask) == value (ambient's `0x539/0xfff`).
    if mask != u32::MAX {
        e.push(Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask: mask.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        });
    }
    e.push(cmp(negate, (v & mask).to_ne_bytes().to_vec()));
    Some(e)
}

/// `-j TARGET options…` as expressions (always the last thing of a rule).
fn target(w: &[String], goto: bool, out: &mut Vec<Expr>) {
    let opt = |name: &str| {
        w.iter()
            .position(|t| t == name)
            .and_then(|p| w.get(p + 1))
            .map(String::as_str)
    };
    let imm = |data: Vec<u8>| Expr::Immediate { dreg: REG1, data };
    let t = w.first().map(String::as_str).unwrap_or("");
    match t {
        "RETURN" => out.push(Expr::Verdict(Verdict::Return)),
        "ACCEPT" => out.push(Expr::Verdict(Verdict::Accept)),
        "DROP" => out.push(Expr::Verdict(Verdict::Drop)),
        "REDIRECT" => {
            let port = opt("--to-ports")
                .or(opt("--to-port"))
                .and_then(|p| p.parse::<u16>().ok());
            match port {
                Some(p) => {
                    out.push(imm(p.to_be_bytes().to_vec()));
                    out.push(Expr::Redir {
                        port_reg: Some(REG1),
                    });
                }
                None => out.push(Expr::Redir { port_reg: None }),
            }
        }
        "TPROXY" => {
            let port = opt("--on-port").and_then(|p| p.parse::<u16>().ok());
            let mark = opt("--tproxy-mark").and_then(full_mask_value);
            let (Some(port), Some(mark)) = (port, mark) else {
                out.push(Expr::Unknown(format!("-j {}", w.join(" "))));
                return;
            };
            out.push(imm(port.to_be_bytes().to_vec()));
            out.push(Expr::Tproxy {
                family: 0,
                port_reg: Some(REG1),
                miss_drops: true,
            });
            out.push(imm(mark.to_ne_bytes().to_vec()));
            out.push(Expr::MetaSet {
                key: libc::NFT_META_MARK as u32,
                sreg: REG1,
            });
            out.push(Expr::Verdict(Verdict::Accept));
        }
        "MARK" => match opt("--set-xmark")
            .or(opt("--set-mark"))
            .and_then(full_mask_value)
        {
            Some(m) => {
                out.push(imm(m.to_ne_bytes().to_vec()));
                out.push(Expr::MetaSet {
                    key: libc::NFT_META_MARK as u32,
                    sreg: REG1,
                });
            }
            None => out.push(Expr::Unknown(format!("-j {}", w.join(" ")))),
        },
        "CONNMARK" => connmark(w, out),
        // The host probe rule's `-j SNAT --to-source 169.254.7.127` (an address, no port).
        "SNAT" => match opt("--to-source").and_then(|a| a.parse::<IpAddr>().ok()) {
            Some(addr) => {
                out.push(imm(ip_bytes(addr)));
                out.push(Expr::Nat {
                    snat: true,
                    family: if addr.is_ipv6() {
                        libc::NFPROTO_IPV6 as u32
                    } else {
                        libc::NFPROTO_IPV4 as u32
                    },
                    addr_reg: Some(REG1),
                    port_reg: None,
                });
            }
            None => out.push(Expr::Unknown(format!("-j {}", w.join(" ")))),
        },
        "CT" => match opt("--zone").and_then(|z| z.parse::<u16>().ok()) {
            Some(z) => {
                out.push(imm(z.to_ne_bytes().to_vec()));
                out.push(Expr::CtSet {
                    key: libc::NFT_CT_ZONE as u32,
                    sreg: REG1,
                });
            }
            None => out.push(Expr::Unknown(format!("-j {}", w.join(" ")))),
        },
        // Extension targets that need no option (`-j MASQUERADE`): not evaluated, named.
        "MASQUERADE" | "REJECT" | "LOG" | "NFLOG" | "NOTRACK" | "TRACE" | "AUDIT" | "CHECKSUM"
        | "TCPMSS" | "NETMAP" | "DNAT" => out.push(Expr::Unknown(format!("-j {}", w.join(" ")))),
        // Any other target is a user chain (`-j ISTIO_OUTPUT`): targets with options are
        // upper-case names we handled above or do not know (they fail the lookup below).
        chain if !chain.is_empty() && w.len() == 1 => {
            out.push(Expr::Verdict(if goto {
                Verdict::Goto(chain.to_string())
            } else {
                Verdict::Jump(chain.to_string())
            }));
        }
        _ => out.push(Expr::Unknown(format!("-j {}", w.join(" ")))),
    }
}

/// `-j CONNMARK --set-xmark V/M | --save-mark | --restore-mark`.
fn connmark(w: &[String], out: &mut Vec<Expr>) {
    let has = |name: &str| w.iter().any(|t| t == name);
    let xmark = w
        .iter()
        .position(|t| t == "--set-xmark")
        .map(|p| w.get(p + 1).and_then(|v| value_mask(v)));
    let ct_load = Expr::Ct {
        key: libc::NFT_CT_MARK as u32,
        dreg: REG1,
    };
    let ct_set = Expr::CtSet {
        key: libc::NFT_CT_MARK as u32,
        sreg: REG1,
    };
    if let Some(Some((v, mask))) = xmark {
        // ctmark = (ctmark & ~mask) ^ value.
        out.push(ct_load);
        out.push(Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask: (!mask).to_ne_bytes().to_vec(),
            xor: v.to_ne_bytes().to_vec(),
        });
        out.push(ct_set);
    } else if xmark.is_none() && has("--save-mark") {
        out.push(meta(libc::NFT_META_MARK));
        out.push(ct_set);
    } else if xmark.is_none() && has("--restore-mark") {
        out.push(ct_load);
        out.push(Expr::MetaSet {
            key: libc::NFT_META_MARK as u32,
            sreg: REG1,
        });
    } else {
        out.push(Expr::Unknown(format!("-j {}", w.join(" "))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_istio_rules() {
        let mut sets = Vec::new();
        let (e, c) = translate(
            "! -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 15008 -m owner --uid-owner 1337 -m comment --comment \"hi there\" -j ISTIO_IN_REDIRECT",
            false,
            "nat",
            &mut sets,
        );
        assert_eq!(c.as_deref(), Some("hi there"));
        assert!(!e.iter().any(|x| matches!(x, Expr::Unknown(_))), "{e:?}");
        assert_eq!(
            e.last(),
            Some(&Expr::Verdict(Verdict::Jump("ISTIO_IN_REDIRECT".into())))
        );
        let (e, _) = translate(
            "-p tcp -m multiport --dports 15020,15021 -j RETURN",
            false,
            "nat",
            &mut sets,
        );
        assert!(matches!(e[3], Expr::Lookup { invert: false, .. }));
        assert_eq!(sets.len(), 1);
        let (e, _) = translate("-p tcp -m foo --bar -j RETURN", false, "nat", &mut sets);
        assert_eq!(e.last(), Some(&Expr::Unknown("-m foo".into())));
    }

    #[test]
    fn translates_ambient_rules() {
        let save = "*mangle\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_PRERT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A PREROUTING -j ISTIO_PRERT\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff\n-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_PRERT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A PREROUTING -j ISTIO_PRERT\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT\n-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006\n-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053\nCOMMIT\n";
        let mut rs = Ruleset {
            backend: Backend::IptablesLegacy,
            chains: Vec::new(),
            sets: Vec::new(),
        };
        add_family(&mut rs, save, false);
        let all: Vec<&Expr> = rs
            .chains
            .iter()
            .flat_map(|c| &c.rules)
            .flat_map(|r| &r.exprs)
            .collect();
        assert!(
            !all.iter().any(|e| matches!(e, Expr::Unknown(_))),
            "{all:?}"
        );
        // `--set-xmark 0x111/0xfff`: ctmark = (ctmark & ~0xfff) ^ 0x111.
        assert!(all.contains(&&Expr::Bitwise {
            sreg: REG1,
            dreg: REG1,
            mask: 0xffff_f000u32.to_ne_bytes().to_vec(),
            xor: 0x111u32.to_ne_bytes().to_vec(),
        }));
        // `! --mark 0x539/0xfff`: (mark & 0xfff) != 0x539.
        assert!(all.contains(&&cmp(true, 0x539u32.to_ne_bytes().to_vec())));
        // nat's chains are nat type, mangle's OUTPUT route type, its PREROUTING filter.
        let kind = |table, chain| rs.chain(TableFamily::Ip, table, chain).unwrap().base;
        let kind = |table, chain| kind(table, chain).map(|b| b.kind);
        assert_eq!(kind("nat", "OUTPUT"), Some(ChainType::Nat));
        assert_eq!(kind("mangle", "OUTPUT"), Some(ChainType::Route));
        assert_eq!(kind("mangle", "PREROUTING"), Some(ChainType::Filter));
        assert_eq!(kind("mangle", "ISTIO_OUTPUT"), None);
    }

    #[test]
    fn trace_rules_are_not_explained_but_counted_by_the_kernel() {
        let save = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -p tcp -m comment --comment istio-explain-9-0 -j TRACE\nCOMMIT\n*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A OUTPUT -p tcp -m comment --comment istio-explain-9-1 -j TRACE\n-A OUTPUT -p tcp -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -o lo -j RETURN\nCOMMIT\n";
        let mut rs = Ruleset {
            backend: Backend::IptablesLegacy,
            chains: Vec::new(),
            sets: Vec::new(),
        };
        add_family(&mut rs, save, false);
        assert!(rs.chains.iter().all(|c| c.table == "nat"), "{rs:?}");
        let out = rs.chain(TableFamily::Ip, "nat", "OUTPUT").unwrap();
        assert_eq!(out.rules.len(), 1);
        assert_eq!(out.rules[0].position, 1);
        let k = KernelNumbers::of(save);
        assert_eq!(k.get("nat", "OUTPUT", 1), Numbered::TraceRule);
        assert_eq!(k.get("nat", "OUTPUT", 2), Numbered::Rule(1));
        assert_eq!(k.get("nat", "OUTPUT", 3), Numbered::End);
        assert_eq!(k.get("nat", "OUTPUT", 4), Numbered::Unknown);
        assert_eq!(k.get("nat", "ISTIO_OUTPUT", 1), Numbered::Rule(1));
        assert_eq!(k.get("raw", "OUTPUT", 2), Numbered::End);
        assert_eq!(k.get("mangle", "OUTPUT", 1), Numbered::Unknown);
        assert!(!is_trace_rule(
            "-p tcp -m comment --comment istio-explain-1-0 -j RETURN"
        ));
    }

    #[test]
    fn reads_only_the_host_rule_on_a_node_and_its_ipset() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-POSTROUTING - [0:0]\n:ISTIO_POSTRT - [0:0]\n-A POSTROUTING -j ISTIO_POSTRT\n-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127\nCOMMIT\n";
        let host = host_rule_only(save).expect("the host rule");
        assert!(!host.contains("KUBE-"), "{host}");
        let mut rs = Ruleset {
            backend: Backend::IptablesLegacy,
            chains: Vec::new(),
            sets: Vec::new(),
        };
        add_family(&mut rs, &host, false);
        let post = rs.chain(TableFamily::Ip, "nat", "POSTROUTING").unwrap();
        assert_eq!(post.base.map(|b| b.hook), Some(Hook::Postrouting));
        let rule = &rs.chain(TableFamily::Ip, "nat", HOST_CHAIN).unwrap().rules[0];
        assert!(
            !rule.exprs.iter().any(|e| matches!(e, Expr::Unknown(_))),
            "{:?}",
            rule.exprs
        );
        assert!(matches!(
            rule.exprs.last(),
            Some(Expr::Nat {
                snat: true,
                addr_reg: Some(_),
                port_reg: None,
                ..
            })
        ));
        let pod: IpAddr = "10.88.1.10".parse().unwrap();
        load_ipsets(&mut rs, |name| {
            assert_eq!(name, "istio-inpod-probes-v4");
            Ok(vec![pod])
        });
        let set = rs.set("nat", "istio-inpod-probes-v4").unwrap();
        assert_eq!(set.elements, [(vec![10, 88, 1, 10], false)]);
        assert_eq!(
            host_rule_only("*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"),
            None
        );
    }
}
