//! Plan → the nftables objects to create, the one lowering of a plan: tables, chains (base
//! ones with hook and priority), rules as `nft_ir` values (expression lists and the anonymous
//! sets they look up). Pure; the batch serialises them (`expr::of_ir`), `nft_ir::render` writes
//! them as text (`--dry-run`, error descriptions, `--check`'s reports).

use crate::ir_exprs as expr;
use capture::{Action, ChainId, CtState, Family, IpNet, L4, Match, NamedSet, Plan, Table};
use nft_ir::{BaseHook, ChainType, Expr, Hook, SetKey, Verdict};
use std::net::IpAddr;

/// A base chain's type, hook and priority (Istio's nft mode, istio-reference §2.2).
pub fn base_chain(table: Table, chain: ChainId) -> Option<BaseHook> {
    let hook = match chain {
        ChainId::Prerouting => Hook::Prerouting,
        ChainId::Output => Hook::Output,
        ChainId::Postrouting => Hook::Postrouting,
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
        Table::Nat | Table::AmbientNat if hook == Hook::Postrouting => (ChainType::Nat, 100),
        Table::Nat | Table::AmbientNat => (ChainType::Nat, -100),
        Table::Mangle | Table::AmbientMangle if hook == Hook::Output => (ChainType::Route, -150),
        Table::Mangle | Table::AmbientMangle => (ChainType::Filter, -150),
        Table::Raw | Table::AmbientRaw => (ChainType::Filter, -300),
    };
    Some(BaseHook {
        kind,
        hook,
        priority,
    })
}

/// A plan's named set as declared (its elements are managed on their own: pods come and go).
fn named_set(s: &NamedSet) -> nft_ir::Set {
    nft_ir::Set {
        table: s.table.nft_name().to_string(),
        name: s.name.clone(),
        key: if s.v6 {
            SetKey::Ipv6Addr
        } else {
            SetKey::Ipv4Addr
        },
        interval: false,
        comment: Some(s.comment.clone()),
        elements: Vec::new(),
    }
}

/// One rule of a chain as the kernel holds it: its expressions and comment (`nft_ir::Rule`),
/// and the anonymous sets it looks up (`__setN`, N unique in the batch), created before it.
pub struct RuleSpec {
    pub rule: nft_ir::Rule,
    pub sets: Vec<nft_ir::Set>,
}

impl RuleSpec {
    /// The rule in nft syntax (`nft_ir`'s renderer: `--dry-run`, error messages, `--check`).
    pub fn text(&self, table: &str) -> String {
        nft_ir::render::rule_text(&self.rule, &self.sets, table)
            .unwrap_or_else(|| format!("{:?}", self.rule.exprs))
    }
}

pub struct ChainSpec {
    pub chain: ChainId,
    pub base: Option<BaseHook>,
    pub rules: Vec<RuleSpec>,
}

pub struct TableSpec {
    pub table: Table,
    /// Named sets of the table, declared without elements (created before the rules that
    /// look them up).
    pub sets: Vec<nft_ir::Set>,
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

/// Builds every table of the plan: the one lowering of a plan into `nft_ir` values. Set ids
/// are unique across the whole batch.
pub fn tables(plan: &Plan) -> Vec<TableSpec> {
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
                .map(named_set)
                .collect(),
            chains: chains
                .iter()
                .filter(|c| c.table == table)
                .map(|c| {
                    let base = base_chain(table, c.chain);
                    let mut rules: Vec<RuleSpec> = c
                        .rules
                        .iter()
                        .flat_map(|r| {
                            let t = table.nft_name();
                            rule_specs(r, t, base.is_some(), plan.ipv6, &mut set_ids)
                        })
                        .collect();
                    for (i, r) in rules.iter_mut().enumerate() {
                        r.rule.position = i + 1;
                    }
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

/// Accumulates the expressions and the anonymous sets of one rule.
struct RuleBuilder<'a> {
    table: &'a str,
    exprs: Vec<Expr>,
    sets: Vec<nft_ir::Set>,
    set_ids: &'a mut u32,
}

impl RuleBuilder<'_> {
    fn push(&mut self, e: Expr) {
        self.exprs.push(e);
    }
    /// A new anonymous set of the rule; its name.
    fn new_set(&mut self, key: SetKey, interval: bool, elements: Vec<(Vec<u8>, bool)>) -> String {
        let name = format!("{}{}", nft_ir::ANONYMOUS_SET, *self.set_ids);
        *self.set_ids += 1;
        self.sets.push(nft_ir::Set {
            table: self.table.to_string(),
            name: name.clone(),
            key,
            interval,
            comment: None,
            elements,
        });
        name
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

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The rules one plan rule becomes (two for TPROXY: the redirect and its fail-closed drop).
fn rule_specs(
    rule: &capture::Rule,
    table: &str,
    base: bool,
    ipv6: bool,
    set_ids: &mut u32,
) -> Vec<RuleSpec> {
    let mut out = Vec::new();
    let mut one = |action: &Action, comment: String| {
        let mut b = RuleBuilder {
            table,
            exprs: Vec::new(),
            sets: Vec::new(),
            set_ids,
        };
        matches_into(&mut b, rule, base, ipv6);
        b.push(expr::counter());
        action_into(&mut b, action, rule.family);
        out.push(RuleSpec {
            rule: nft_ir::Rule {
                handle: None,
                position: 0,
                comment: Some(comment),
                text: String::new(),
                exprs: b.exprs,
            },
            sets: b.sets,
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
    // A named set lookup reads the IPv6 header in an IPv6-only rule.
    let v6 = rule.family == Family::V6;
    let in_slot = |s: Slot| rule.matches.iter().filter(move |m| slot(m) == s);
    for m in in_slot(Slot::Interface).chain(in_slot(Slot::Protocol)) {
        match_into(b, m, v6);
    }
    if rule.family != Family::Any {
        nfproto(b, rule.family == Family::V6);
    }
    for s in [Slot::Address, Slot::Port, Slot::Meta] {
        for m in in_slot(s) {
            match_into(b, m, v6);
        }
    }
}

/// One match as expressions. Exhaustive: every variant of the plan's `Match` is named.
fn match_into(b: &mut RuleBuilder, m: &Match, v6: bool) {
    match m {
        Match::InIface(v) => iface_match(b, libc::NFT_META_IIFNAME, &v[0], false),
        Match::OutIface(v) => iface_match(b, libc::NFT_META_OIFNAME, &v[0], false),
        Match::NotOutIface(name) => iface_match(b, libc::NFT_META_OIFNAME, name, true),
        Match::Proto(p) => proto_match(b, *p),
        Match::Saddr { nets, negate } => addr_match(b, nets, *negate, true),
        Match::Daddr { nets, negate } => addr_match(b, nets, *negate, false),
        Match::FromAddr(a) => addr_match(b, &[IpNet::host(*a)], false, true),
        Match::ToAddr(a) => addr_match(b, &[IpNet::host(*a)], false, false),
        Match::DaddrInSet(name) => named_set_match(b, name, v6),
        Match::DstPort { ports, negate } => port_match(b, 2, ports, *negate),
        Match::SrcPort(p) => port_match(b, 0, &[*p], false),
        Match::Uid { ids, negate } => owner_match(b, libc::NFT_META_SKUID, ids, *negate),
        Match::Gid { ids, negate } => owner_match(b, libc::NFT_META_SKGID, ids, *negate),
        Match::Mark { mark, negate } => {
            b.push(expr::meta_load(libc::NFT_META_MARK as u32));
            b.push(expr::cmp(cmp_op(*negate), &mark.to_ne_bytes()));
        }
        Match::MarkMasked { mark, mask, negate } => {
            b.push(expr::meta_load(libc::NFT_META_MARK as u32));
            b.push(expr::bitwise_and(&mask.to_ne_bytes()));
            b.push(expr::cmp(cmp_op(*negate), &mark.to_ne_bytes()));
        }
        Match::ConnMark(mark) => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::cmp(libc::NFT_CMP_EQ as u32, &mark.to_ne_bytes()));
        }
        Match::ConnMarkMasked { mark, mask } => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::bitwise_and(&mask.to_ne_bytes()));
            b.push(expr::cmp(libc::NFT_CMP_EQ as u32, &mark.to_ne_bytes()));
        }
        Match::SocketExists => {
            // `meta skuid` only loads for a packet with a full local socket (else the
            // rule stops), as `-m owner --socket-exists`; every uid is >= 0.
            b.push(expr::meta_load(libc::NFT_META_SKUID as u32));
            b.push(expr::cmp(libc::NFT_CMP_GTE as u32, &0u32.to_ne_bytes()));
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
}

/// `iifname "X"`, `oifname [!=] "X"`. Positive lists arrive expanded (`expand_for_nft`).
fn iface_match(b: &mut RuleBuilder, key: libc::c_int, name: &str, negate: bool) {
    b.push(expr::meta_load(key as u32));
    b.push(expr::cmp(cmp_op(negate), &crate::expr::ifname_bytes(name)));
}

/// `meta l4proto tcp|udp`.
fn proto_match(b: &mut RuleBuilder, p: L4) {
    let n = match p {
        L4::Tcp => libc::IPPROTO_TCP,
        L4::Udp => libc::IPPROTO_UDP,
    } as u8;
    b.push(expr::meta_load(libc::NFT_META_L4PROTO as u32));
    b.push(expr::cmp(libc::NFT_CMP_EQ as u32, &[n]));
}

/// Socket owner: "none of" is one comparison per id (as Istio's nft mode writes it); "any
/// of" arrives expanded (`expand_for_nft`).
fn owner_match(b: &mut RuleBuilder, key: libc::c_int, ids: &[capture::Id], negate: bool) {
    for id in ids {
        b.push(expr::meta_load(key as u32));
        b.push(expr::cmp(cmp_op(negate), &id.id.to_ne_bytes()));
    }
}

fn ct_state_match(b: &mut RuleBuilder, states: &[CtState]) {
    let mut mask = 0u32;
    for s in states {
        mask |= match s {
            CtState::Invalid => 1,
            CtState::Established => 2,
            CtState::Related => 4,
        };
    }
    b.push(expr::ct_load(libc::NFT_CT_STATE as u32));
    b.push(expr::bitwise_and(&mask.to_ne_bytes()));
    b.push(expr::cmp(libc::NFT_CMP_NEQ as u32, &0u32.to_ne_bytes()));
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
    } else {
        let key = if v6 {
            SetKey::Ipv6Addr
        } else {
            SetKey::Ipv4Addr
        };
        let name = b.new_set(key, true, interval_elements(nets));
        b.push(expr::lookup(&name, negate));
    }
}

/// `ip[6] daddr @NAME`: a lookup in one of the plan's named sets.
fn named_set_match(b: &mut RuleBuilder, name: &str, v6: bool) {
    let (offset, len) = if v6 { (24, 16) } else { (16, 4) };
    b.push(expr::payload(
        libc::NFT_PAYLOAD_NETWORK_HEADER as u32,
        offset,
        len,
    ));
    b.push(expr::lookup(name, false));
}

fn port_match(b: &mut RuleBuilder, offset: u32, ports: &[u16], negate: bool) {
    b.push(expr::payload(
        libc::NFT_PAYLOAD_TRANSPORT_HEADER as u32,
        offset,
        2,
    ));
    if ports.len() == 1 {
        b.push(expr::cmp(cmp_op(negate), &ports[0].to_be_bytes()));
    } else {
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let elements = sorted
            .iter()
            .map(|p| (p.to_be_bytes().to_vec(), false))
            .collect();
        let name = b.new_set(SetKey::InetService, false, elements);
        b.push(expr::lookup(&name, negate));
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
pub fn interval_elements(nets: &[IpNet]) -> Vec<(Vec<u8>, bool)> {
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
    elements
}

fn action_into(b: &mut RuleBuilder, action: &Action, family: Family) {
    match action {
        Action::Return => {
            b.push(expr::verdict(Verdict::Return));
        }
        Action::Accept => {
            b.push(expr::verdict(Verdict::Accept));
        }
        Action::Drop => {
            b.push(expr::verdict(Verdict::Drop));
        }
        Action::Jump(c) => {
            b.push(expr::verdict(Verdict::Jump(c.nft_name().into())));
        }
        Action::Redirect { port } => {
            b.push(expr::immediate(&port.to_be_bytes()));
            b.push(expr::redir());
        }
        Action::Tproxy { port, mark } => {
            let nfproto = if family == Family::V6 {
                libc::NFPROTO_IPV6
            } else {
                libc::NFPROTO_IPV4
            };
            b.push(expr::immediate(&port.to_be_bytes()));
            b.push(expr::tproxy(nfproto as u32));
            b.push(expr::immediate(&mark.to_ne_bytes()));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
            b.push(expr::verdict(Verdict::Accept));
        }
        Action::SetMark(m) => {
            b.push(expr::immediate(&m.to_ne_bytes()));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
        }
        Action::SaveMark => {
            b.push(expr::meta_load(libc::NFT_META_MARK as u32));
            b.push(expr::ct_set(libc::NFT_CT_MARK as u32));
        }
        Action::RestoreMark => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
        }
        Action::SetConnMarkMasked { value, mask } => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::bitwise_and_xor(
                &(!mask).to_ne_bytes(),
                &value.to_ne_bytes(),
            ));
            b.push(expr::ct_set(libc::NFT_CT_MARK as u32));
        }
        Action::RestoreMarkFullMasks => {
            b.push(expr::ct_load(libc::NFT_CT_MARK as u32));
            b.push(expr::meta_set(libc::NFT_META_MARK as u32));
        }
        Action::Snat(ip) => {
            let nfproto = if ip.is_ipv6() {
                libc::NFPROTO_IPV6
            } else {
                libc::NFPROTO_IPV4
            };
            b.push(expr::immediate(&addr_bytes(*ip)));
            b.push(expr::snat(nfproto as u32));
        }
        Action::CtZone(z) => {
            b.push(expr::immediate(&z.to_ne_bytes()));
            b.push(expr::ct_set(libc::NFT_CT_ZONE as u32));
        }
    }
}

/// The ruleset in `nft -f` syntax (what `--dry-run` prints; `nft -f` accepts it).
pub fn render_text(plan: &Plan) -> String {
    let mut out = String::new();
    for t in tables(plan) {
        let tname = t.table.nft_name();
        out.push_str(&format!("table inet {} {{\n", t.table.nft_name()));
        for s in &t.sets {
            out.push_str(&format!("\tset {} {{\n\t\ttype {}\n", s.name, s.key.name()));
            if let Some(comment) = &s.comment {
                out.push_str(&format!("\t\tcomment \"{comment}\"\n"));
            }
            out.push_str("\t}\n");
        }
        for c in &t.chains {
            out.push_str(&format!("\tchain {} {{\n", c.chain.nft_name()));
            if let Some(b) = c.base {
                out.push_str(&format!(
                    "\t\ttype {} hook {} priority {}; policy accept;\n",
                    b.kind.name(),
                    b.hook.name(),
                    b.priority
                ));
            }
            for r in &c.rules {
                out.push_str(&format!("\t\t{}\n", r.text(tname)));
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
        let e = interval_elements(&nets);
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
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(8, 4), vec![255, 0, 0, 0]);
        assert_eq!(prefix_mask(20, 4), vec![255, 255, 240, 0]);
    }
}
