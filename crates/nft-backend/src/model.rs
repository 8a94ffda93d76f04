//! Plan → the nftables objects to create: tables, chains (base ones with hook and priority),
//! rules as expression lists, and the anonymous sets rules look up. Pure; shared by the batch
//! builder, the read-back check and the text rendering.

use crate::expr::{self, Expr};
use capture::{Action, ChainId, CtState, Family, IpNet, L4, Match, NamedSet, Plan, Table};
use std::net::IpAddr;

/// A base chain's type, hook and priority (Istio's nft mode, istio-reference §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub kind: &'static str,
    pub hook: &'static str,
    pub priority: i32,
}

pub fn base_chain(table: Table, chain: ChainId) -> Option<BaseChain> {
    let hook = match chain {
        ChainId::Prerouting => "prerouting",
        ChainId::Output => "output",
        ChainId::Postrouting => "postrouting",
        // Istio's own chains: regular chains, reached by jumps.
        ChainId::Inbound
        | ChainId::Redirect
        | ChainId::InRedirect
        | ChainId::IstioOutput
        | ChainId::OutputDns
        | ChainId::Divert
        | ChainId::Tproxy
        | ChainId::Drop
        | ChainId::IstioPrerouting
        | ChainId::IstioPostrouting => return None,
    };
    let (kind, priority) = match table {
        Table::Nat | Table::AmbientNat if hook == "postrouting" => ("nat", 100),
        Table::Nat | Table::AmbientNat => ("nat", -100),
        Table::Mangle | Table::AmbientMangle if hook == "output" => ("route", -150),
        Table::Mangle | Table::AmbientMangle => ("filter", -150),
        Table::Raw | Table::AmbientRaw => ("filter", -300),
    };
    Some(BaseChain {
        kind,
        hook,
        priority,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetKeyKind {
    Port,
    V4,
    V6,
}

/// An anonymous constant set. `elements` are (key, is_interval_end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSpec {
    pub id: u32,
    pub key: SetKeyKind,
    pub interval: bool,
    pub elements: Vec<(Vec<u8>, bool)>,
    /// The values as nft writes them, for the text rendering.
    pub text: Vec<String>,
}

pub struct RuleSpec {
    pub exprs: Vec<Expr>,
    pub sets: Vec<SetSpec>,
    pub comment: String,
    /// nft syntax of the rule (for `--dry-run` and error messages).
    pub text: String,
}

pub struct ChainSpec {
    pub chain: ChainId,
    pub base: Option<BaseChain>,
    pub rules: Vec<RuleSpec>,
}

pub struct TableSpec {
    pub table: Table,
    /// Named sets of the table (created before the rules that look them up).
    pub sets: Vec<NamedSet>,
    pub chains: Vec<ChainSpec>,
}

/// Multi-value matches nft cannot put in an anonymous set cheaply (interface names, owners)
/// are expanded into one rule per value, exactly as iptables does.
pub fn expand_for_nft(m: &Match) -> bool {
    match m {
        Match::InIface(_) | Match::OutIface(_) => true,
        Match::Uid { negate, .. } | Match::Gid { negate, .. } => !negate,
        // One anonymous set (ports, addresses) or a single value.
        Match::Proto(_)
        | Match::DstPort { .. }
        | Match::SrcPort(_)
        | Match::Daddr { .. }
        | Match::Saddr { .. }
        | Match::Mark { .. }
        | Match::ConnMark(_)
        | Match::CtState(_)
        | Match::NotOutIface(_)
        | Match::L4Module(_)
        | Match::FromAddr(_)
        | Match::ToAddr(_)
        | Match::MarkMasked { .. }
        | Match::ConnMarkMasked { .. }
        | Match::DaddrInSet(_)
        | Match::SocketExists => false,
    }
}

/// Builds every table of the plan. Set ids are unique across the whole batch. `with_text`
/// also renders each rule in nft syntax (for `--dry-run`, `--check` and error messages).
pub fn tables(plan: &Plan, with_text: bool) -> Vec<TableSpec> {
    let mut set_ids = 0u32;
    let chains = plan.chains(expand_for_nft);
    plan.tables()
        .into_iter()
        .map(|table| TableSpec {
            table,
            sets: plan
                .sets
                .iter()
                .filter(|s| s.table == table)
                .cloned()
                .collect(),
            chains: chains
                .iter()
                .filter(|c| c.table == table)
                .map(|c| {
                    let base = base_chain(table, c.chain);
                    let rules = c
                        .rules
                        .iter()
                        .flat_map(|r| {
                            rule_specs(r, base.is_some(), plan.ipv6, with_text, &mut set_ids)
                        })
                        .collect();
                    ChainSpec {
                        chain: c.chain,
                        base,
                        rules,
                    }
                })
                .collect(),
        })
        .collect()
}

/// Records nft text for a rule, only when text was asked for: formatting is a large part of
/// building the batch, and the hot path (CNI ADD) never prints it.
macro_rules! say {
    ($b:expr, $($t:tt)*) => {
        if $b.with_text {
            $b.text.push(String::from($($t)*));
        }
    };
}

/// Accumulates the expressions and the nft text of one rule.
struct RuleBuilder<'a> {
    with_text: bool,
    exprs: Vec<Expr>,
    text: Vec<String>,
    sets: Vec<SetSpec>,
    set_ids: &'a mut u32,
}

impl RuleBuilder<'_> {
    fn push(&mut self, e: Expr) {
        self.exprs.push(e);
    }
    fn new_set(
        &mut self,
        key: SetKeyKind,
        interval: bool,
        elements: Vec<(Vec<u8>, bool)>,
        text: Vec<String>,
    ) -> (String, u32) {
        let id = *self.set_ids;
        *self.set_ids += 1;
        self.sets.push(SetSpec {
            id,
            key,
            interval,
            elements,
            text,
        });
        ("__set%d".to_string(), id)
    }
}

const NFPROTO_IPV4: u8 = libc::NFPROTO_IPV4 as u8;
const NFPROTO_IPV6: u8 = libc::NFPROTO_IPV6 as u8;

fn cmp_op(negate: bool) -> u32 {
    if negate {
        libc::NFT_CMP_NEQ as u32
    } else {
        libc::NFT_CMP_EQ as u32
    }
}

fn neq(negate: bool) -> &'static str {
    if negate { "!= " } else { "" }
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The rules one plan rule becomes (two for TPROXY: the redirect and its fail-closed drop).
fn rule_specs(
    rule: &capture::Rule,
    base: bool,
    ipv6: bool,
    with_text: bool,
    set_ids: &mut u32,
) -> Vec<RuleSpec> {
    let build = |b: &mut RuleBuilder, action: &Action| {
        matches_into(b, rule, base, ipv6);
        b.push(expr::counter());
        say!(b, "counter");
        action_into(b, action, rule.family);
    };
    let mut out = Vec::new();
    let mut one = |action: &Action, comment: String| {
        let mut b = RuleBuilder {
            with_text,
            exprs: Vec::new(),
            text: Vec::new(),
            sets: Vec::new(),
            set_ids,
        };
        build(&mut b, action);
        let text = if with_text {
            format!("{} comment \"{comment}\"", b.text.join(" "))
        } else {
            String::new()
        };
        out.push(RuleSpec {
            exprs: b.exprs,
            sets: b.sets,
            comment,
            text,
        });
    };
    one(&rule.action, rule.comment.clone());
    if matches!(rule.action, Action::Tproxy { .. }) {
        // iptables' TPROXY drops the packet when no socket listens on the port; nft's tproxy
        // just does not match. Dropping the same packets keeps inbound fail-closed.
        one(
            &Action::Drop,
            "TPROXY found no Envoy listener: drop (fail closed)".into(),
        );
    }
    out
}

/// Where nft writes a match within a rule: interfaces, protocol, (family,) addresses, ports,
/// then meta and conntrack keys, so listings read as `nft` writes them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Interface,
    Protocol,
    Address,
    Port,
    Meta,
    /// Nothing to emit (see `slot`).
    Nothing,
}

/// Every match of the plan has its slot: a new `Match` variant does not compile until it is
/// placed here and lowered in `match_into`.
fn slot(m: &Match) -> Slot {
    match m {
        Match::InIface(_) | Match::OutIface(_) | Match::NotOutIface(_) => Slot::Interface,
        Match::Proto(_) => Slot::Protocol,
        Match::Saddr { .. }
        | Match::Daddr { .. }
        | Match::FromAddr(_)
        | Match::ToAddr(_)
        | Match::DaddrInSet(_) => Slot::Address,
        Match::DstPort { .. } | Match::SrcPort(_) => Slot::Port,
        Match::Uid { .. }
        | Match::Gid { .. }
        | Match::Mark { .. }
        | Match::MarkMasked { .. }
        | Match::ConnMark(_)
        | Match::ConnMarkMasked { .. }
        | Match::SocketExists
        | Match::CtState(_) => Slot::Meta,
        // iptables' `-m tcp`/`-m udp` module load matches nothing by itself (the `Proto`
        // match does); nft has no module to load.
        Match::L4Module(_) => Slot::Nothing,
    }
}

/// A rule's matches as expressions, slot by slot (see `Slot`); within a slot in the plan's order.
fn matches_into(b: &mut RuleBuilder, rule: &capture::Rule, base: bool, ipv6: bool) {
    // With IPv6 off, IPv6 must not enter our chains at all (iptables installs nothing for it);
    // guarding the base-chain rules is enough since other chains are only reached from them.
    if rule.family == Family::Any && base && !ipv6 {
        nfproto(b, false);
    }
    let mut ctx = MatchCtx {
        l4: None,
        v6: rule.family == Family::V6,
    };
    let in_slot = |s: Slot| rule.matches.iter().filter(move |m| slot(m) == s);
    for m in in_slot(Slot::Interface).chain(in_slot(Slot::Protocol)) {
        match_into(b, m, &mut ctx);
    }
    if rule.family != Family::Any {
        nfproto(b, rule.family == Family::V6);
    }
    for s in [Slot::Address, Slot::Port, Slot::Meta] {
        for m in in_slot(s) {
            match_into(b, m, &mut ctx);
        }
    }
}

/// What the lowering of one match needs from the rest of its rule.
struct MatchCtx {
    /// The protocol of a `Proto` match before (port matches name it: `tcp dport`).
    l4: Option<L4>,
    /// The rule is IPv6-only (a named set lookup then reads the IPv6 header).
    v6: bool,
}

/// One match as expressions. Exhaustive: every variant of the plan's `Match` is named.
fn match_into(b: &mut RuleBuilder, m: &Match, ctx: &mut MatchCtx) {
    let l4name = ctx.l4.map(L4::name).unwrap_or("th");
    match m {
        Match::InIface(v) => iface_match(b, libc::NFT_META_IIFNAME, "iifname", &v[0], false),
        Match::OutIface(v) => iface_match(b, libc::NFT_META_OIFNAME, "oifname", &v[0], false),
        Match::NotOutIface(name) => iface_match(b, libc::NFT_META_OIFNAME, "oifname", name, true),
        Match::Proto(p) => {
            ctx.l4 = Some(*p);
            proto_match(b, *p);
        }
        Match::Saddr { nets, negate } => addr_match(b, nets, *negate, true),
        Match::Daddr { nets, negate } => addr_match(b, nets, *negate, false),
        Match::FromAddr(a) => addr_match(b, &[IpNet::host(*a)], false, true),
        Match::ToAddr(a) => addr_match(b, &[IpNet::host(*a)], false, false),
        Match::DaddrInSet(name) => named_set_match(b, name, ctx.v6),
        Match::DstPort { ports, negate } => port_match(b, l4name, 2, "dport", ports, *negate),
        Match::SrcPort(p) => port_match(b, l4name, 0, "sport", &[*p], false),
        Match::Uid { ids, negate } => owner_match(b, libc::NFT_META_SKUID, "skuid", ids, *negate),
        Match::Gid { ids, negate } => owner_match(b, libc::NFT_META_SKGID, "skgid", ids, *negate),
        Match::Mark { mark, negate } => {
            b.push(expr::meta_load(libc::NFT_META_MARK as u32));
            b.push(expr::cmp(cmp_op(*negate), &mark.to_ne_bytes()));
            say!(b, format!("meta mark {}{mark:#010x}", neq(*negate)));
        }
        Match::MarkMasked { mark, mask, negate } => {
            b.push(expr::meta_load(libc::NFT_META_MARK as u32));
            b.push(expr::bitwise_and(&mask.to_ne_bytes()));
            b.push(expr::cmp(cmp_op(*negate), &mark.to_ne_bytes()));
            let op = if *negate { "!=" } else { "==" };
            say!(b, format!("meta mark & {mask:#010x} {op} {mark:#010x}"));
        }
        Match::ConnMark(mark) => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::cmp(libc::NFT_CMP_EQ as u32, &mark.to_ne_bytes()));
            say!(b, format!("ct mark {mark:#010x}"));
        }
        Match::ConnMarkMasked { mark, mask } => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::bitwise_and(&mask.to_ne_bytes()));
            b.push(expr::cmp(libc::NFT_CMP_EQ as u32, &mark.to_ne_bytes()));
            say!(b, format!("ct mark & {mask:#010x} == {mark:#010x}"));
        }
        Match::SocketExists => {
            // `meta skuid` only loads for a packet with a full local socket (else the
            // rule stops), as `-m owner --socket-exists`; every uid is >= 0.
            b.push(expr::meta_load(libc::NFT_META_SKUID as u32));
            b.push(expr::cmp(libc::NFT_CMP_GTE as u32, &0u32.to_ne_bytes()));
            say!(b, "meta skuid >= 0");
        }
        Match::CtState(states) => ct_state_match(b, states),
        // Matches nothing by itself (see `slot`): nothing to emit.
        Match::L4Module(_) => {}
    }
}

fn nfproto(b: &mut RuleBuilder, v6: bool) {
    b.push(expr::meta_load(libc::NFT_META_NFPROTO as u32));
    b.push(expr::cmp(
        libc::NFT_CMP_EQ as u32,
        &[if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 }],
    ));
    say!(
        b,
        if v6 {
            "meta nfproto ipv6"
        } else {
            "meta nfproto ipv4"
        }
    );
}

/// `iifname "X"`, `oifname [!=] "X"`. Positive lists arrive expanded (`expand_for_nft`).
fn iface_match(b: &mut RuleBuilder, key: libc::c_int, word: &str, name: &str, negate: bool) {
    b.push(expr::meta_load(key as u32));
    b.push(expr::cmp(cmp_op(negate), &expr::ifname_bytes(name)));
    say!(b, format!("{word} {}\"{name}\"", neq(negate)));
}

/// `meta l4proto tcp|udp`.
fn proto_match(b: &mut RuleBuilder, p: L4) {
    let n = match p {
        L4::Tcp => libc::IPPROTO_TCP,
        L4::Udp => libc::IPPROTO_UDP,
    } as u8;
    b.push(expr::meta_load(libc::NFT_META_L4PROTO as u32));
    b.push(expr::cmp(libc::NFT_CMP_EQ as u32, &[n]));
    say!(b, format!("meta l4proto {}", p.name()));
}

/// Socket owner: "none of" is one comparison per id (as Istio's nft mode writes it); "any
/// of" arrives expanded (`expand_for_nft`).
fn owner_match(
    b: &mut RuleBuilder,
    key: libc::c_int,
    word: &str,
    ids: &[capture::Id],
    negate: bool,
) {
    for id in ids {
        b.push(expr::meta_load(key as u32));
        b.push(expr::cmp(cmp_op(negate), &id.id.to_ne_bytes()));
        say!(b, format!("meta {word} {}{}", neq(negate), id.id));
    }
}

fn ct_state_match(b: &mut RuleBuilder, states: &[CtState]) {
    let mut mask = 0u32;
    let mut words = Vec::new();
    for s in states {
        let (bit, word) = match s {
            CtState::Invalid => (1, "invalid"),
            CtState::Established => (2, "established"),
            CtState::Related => (4, "related"),
        };
        mask |= bit;
        words.push(word);
    }
    b.push(expr::ct_load(libc::NFT_CT_STATE as u32));
    b.push(expr::bitwise_and(&mask.to_ne_bytes()));
    b.push(expr::cmp(libc::NFT_CMP_NEQ as u32, &0u32.to_ne_bytes()));
    say!(b, format!("ct state {}", words.join(",")));
}

fn addr_match(b: &mut RuleBuilder, nets: &[IpNet], negate: bool, source: bool) {
    let v6 = !nets[0].is_ipv4();
    let offset = match (v6, source) {
        (false, true) => 12,
        (false, false) => 16,
        (true, true) => 8,
        (true, false) => 24,
    };
    let len = if v6 { 16 } else { 4 };
    let word = format!(
        "{} {}",
        if v6 { "ip6" } else { "ip" },
        if source { "saddr" } else { "daddr" }
    );
    b.push(expr::payload(
        libc::NFT_PAYLOAD_NETWORK_HEADER as u32,
        offset,
        len,
    ));
    if nets.len() == 1 {
        let n = nets[0];
        if !n.is_host() {
            b.push(expr::bitwise_and(&prefix_mask(n.prefix, len as usize)));
        }
        b.push(expr::cmp(cmp_op(negate), &addr_bytes(n.network())));
        let shown = if n.is_host() {
            capture::DisplayIp(n.addr).to_string()
        } else {
            format!("{}/{}", capture::DisplayIp(n.network()), n.prefix)
        };
        say!(b, format!("{word} {}{shown}", neq(negate)));
    } else {
        let (elements, text) = interval_elements(nets);
        let key = if v6 { SetKeyKind::V6 } else { SetKeyKind::V4 };
        let (name, id) = b.new_set(key, true, elements, text.clone());
        b.push(expr::lookup(&name, id, negate));
        say!(
            b,
            format!("{word} {}{{ {} }}", neq(negate), text.join(", "))
        );
    }
}

/// `ip[6] daddr @NAME`: a lookup in one of the plan's named sets.
fn named_set_match(b: &mut RuleBuilder, name: &str, v6: bool) {
    let (offset, len, word) = if v6 { (24, 16, "ip6") } else { (16, 4, "ip") };
    b.push(expr::payload(
        libc::NFT_PAYLOAD_NETWORK_HEADER as u32,
        offset,
        len,
    ));
    b.push(expr::lookup_named(name));
    say!(b, format!("{word} daddr @{name}"));
}

fn port_match(b: &mut RuleBuilder, l4: &str, offset: u32, word: &str, ports: &[u16], negate: bool) {
    b.push(expr::payload(
        libc::NFT_PAYLOAD_TRANSPORT_HEADER as u32,
        offset,
        2,
    ));
    if ports.len() == 1 {
        b.push(expr::cmp(cmp_op(negate), &ports[0].to_be_bytes()));
        say!(b, format!("{l4} {word} {}{}", neq(negate), ports[0]));
    } else {
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let elements = sorted
            .iter()
            .map(|p| (p.to_be_bytes().to_vec(), false))
            .collect();
        let text: Vec<String> = sorted.iter().map(u16::to_string).collect();
        let (name, id) = b.new_set(SetKeyKind::Port, false, elements, text.clone());
        b.push(expr::lookup(&name, id, negate));
        say!(
            b,
            format!("{l4} {word} {}{{ {} }}", neq(negate), text.join(", "))
        );
    }
}

fn prefix_mask(prefix: u8, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    for (i, byte) in m.iter_mut().enumerate() {
        let bits = (prefix as i32 - (i as i32) * 8).clamp(0, 8);
        *byte = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    m
}

/// Interval-set elements for a CIDR list, as nft builds them: ranges merged and sorted, each
/// `[start, end)` as a start element plus an interval-end element, and a leading end element
/// at the zero address when the first range does not start there.
pub fn interval_elements(nets: &[IpNet]) -> (Vec<(Vec<u8>, bool)>, Vec<String>) {
    let v6 = !nets[0].is_ipv4();
    let to_u128 = |a: IpAddr| match a {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    };
    let to_bytes = |x: u128| {
        if v6 {
            x.to_be_bytes().to_vec()
        } else {
            (x as u32).to_be_bytes().to_vec()
        }
    };
    // (start, end exclusive or None for "to the end of the space")
    let mut ranges: Vec<(u128, Option<u128>, IpNet)> = nets
        .iter()
        .map(|n| (to_u128(n.network()), n.end_exclusive().map(to_u128), *n))
        .collect();
    ranges.sort_by_key(|r| r.0);
    let mut merged: Vec<(u128, Option<u128>)> = Vec::new();
    for (s, e, _) in &ranges {
        if let Some(last) = merged.last_mut() {
            match last.1 {
                None => continue,
                Some(le) if *s <= le => {
                    last.1 = match (last.1, e) {
                        (Some(a), Some(b)) => Some(a.max(*b)),
                        _ => None,
                    };
                    continue;
                }
                _ => {}
            }
        }
        merged.push((*s, *e));
    }
    let mut elements = Vec::new();
    if merged.first().is_some_and(|r| r.0 != 0) {
        elements.push((to_bytes(0), true));
    }
    for (s, e) in &merged {
        elements.push((to_bytes(*s), false));
        if let Some(e) = e {
            elements.push((to_bytes(*e), true));
        }
    }
    let mut text_nets: Vec<IpNet> = nets.to_vec();
    text_nets.sort_by_key(|n| to_u128(n.network()));
    let text = text_nets
        .iter()
        .map(|n| {
            if n.is_host() {
                capture::DisplayIp(n.addr).to_string()
            } else {
                format!("{}/{}", capture::DisplayIp(n.network()), n.prefix)
            }
        })
        .collect();
    (elements, text)
}

fn action_into(b: &mut RuleBuilder, action: &Action, family: Family) {
    match action {
        Action::Return => {
            b.push(expr::verdict(libc::NFT_RETURN));
            say!(b, "return");
        }
        Action::Accept => {
            b.push(expr::verdict(libc::NF_ACCEPT));
            say!(b, "accept");
        }
        Action::Drop => {
            b.push(expr::verdict(libc::NF_DROP));
            say!(b, "drop");
        }
        Action::Jump(c) => {
            b.push(expr::jump(c.nft_name()));
            say!(b, format!("jump {}", c.nft_name()));
        }
        Action::Redirect { port } => {
            b.push(expr::immediate(&port.to_be_bytes()));
            b.push(expr::redir());
            say!(b, format!("redirect to :{port}"));
        }
        Action::Tproxy { port, mark } => {
            let (nfproto, word) = if family == Family::V6 {
                (libc::NFPROTO_IPV6, "ip6")
            } else {
                (libc::NFPROTO_IPV4, "ip")
            };
            b.push(expr::immediate(&port.to_be_bytes()));
            b.push(expr::tproxy(nfproto as u32));
            b.push(expr::immediate(&mark.to_ne_bytes()));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
            b.push(expr::verdict(libc::NF_ACCEPT));
            say!(
                b,
                format!("tproxy {word} to :{port} meta mark set {mark:#010x} accept")
            );
        }
        Action::SetMark(m) => {
            b.push(expr::immediate(&m.to_ne_bytes()));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
            say!(b, format!("meta mark set {m:#010x}"));
        }
        Action::SaveMark => {
            b.push(expr::meta_load(libc::NFT_META_MARK as u32));
            b.push(expr::ct_set(libc::NFT_CT_MARK as u32));
            say!(b, "ct mark set meta mark");
        }
        Action::RestoreMark => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
            say!(b, "meta mark set ct mark");
        }
        Action::SetConnMarkMasked { value, mask } => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::bitwise_and_xor(
                &(!mask).to_ne_bytes(),
                &value.to_ne_bytes(),
            ));
            b.push(expr::ct_set(libc::NFT_CT_MARK as u32));
            say!(
                b,
                format!("ct mark set ct mark & {:#010x} | {value:#010x}", !mask)
            );
        }
        Action::RestoreMarkFullMasks => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
            say!(b, "meta mark set ct mark");
        }
        Action::Snat(ip) => {
            let (nfproto, word) = if ip.is_ipv6() {
                (libc::NFPROTO_IPV6, "ip6")
            } else {
                (libc::NFPROTO_IPV4, "ip")
            };
            b.push(expr::immediate(&addr_bytes(*ip)));
            b.push(expr::snat(nfproto as u32));
            say!(b, format!("snat {word} to {}", capture::DisplayIp(*ip)));
        }
        Action::CtZone(z) => {
            b.push(expr::immediate(&z.to_ne_bytes()));
            b.push(expr::ct_set(libc::NFT_CT_ZONE as u32));
            say!(b, format!("ct zone set {z}"));
        }
    }
}

/// The ruleset in `nft -f` syntax (what `--dry-run` prints; `nft -f` accepts it).
pub fn render_text(plan: &Plan) -> String {
    let mut out = String::new();
    for t in tables(plan, true) {
        out.push_str(&format!("table inet {} {{\n", t.table.nft_name()));
        for s in &t.sets {
            out.push_str(&format!(
                "\tset {} {{\n\t\ttype {}\n\t\tcomment \"{}\"\n\t}}\n",
                s.name,
                if s.v6 { "ipv6_addr" } else { "ipv4_addr" },
                s.comment
            ));
        }
        for c in &t.chains {
            out.push_str(&format!("\tchain {} {{\n", c.chain.nft_name()));
            if let Some(b) = c.base {
                out.push_str(&format!(
                    "\t\ttype {} hook {} priority {}; policy accept;\n",
                    b.kind, b.hook, b.priority
                ));
            }
            for r in &c.rules {
                out.push_str(&format!("\t\t{}\n", r.text));
            }
            out.push_str("\t}\n");
        }
        out.push_str("}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_elements_merge_and_lead_with_zero() {
        let nets: Vec<IpNet> = ["10.1.0.0/16", "10.0.0.0/8", "192.168.1.1/32"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let (e, text) = interval_elements(&nets);
        let shown: Vec<(String, bool)> = e
            .iter()
            .map(|(b, end)| (format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]), *end))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("0.0.0.0".into(), true),
                ("10.0.0.0".into(), false),
                ("11.0.0.0".into(), true),
                ("192.168.1.1".into(), false),
                ("192.168.1.2".into(), true)
            ]
        );
        assert_eq!(text, vec!["10.0.0.0/8", "10.1.0.0/16", "192.168.1.1"]);
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(8, 4), vec![255, 0, 0, 0]);
        assert_eq!(prefix_mask(20, 4), vec![255, 255, 240, 0]);
    }
}
