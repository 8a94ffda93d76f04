//! The evaluator: a synthetic first packet of the connection walks the ruleset hook by hook,
//! chain by chain, expression by expression, with registers, as the kernel does. Pure.

use super::ir::{BaseHook, Chain, Expr, Hook, Rule, Ruleset, Set, TableFamily, Verdict};
use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// conntrack state bits as `ct state` sees them.
pub const CT_STATE_NEW: u32 = 8;

/// The packet as it stands at one point of the walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub l4proto: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub iif: Option<String>,
    pub oif: Option<String>,
    /// The sending socket's owner (locally generated packets only).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mark: u32,
    pub ct_state: u32,
    pub ct_mark: u32,
    pub ct_zone: u16,
}

impl Packet {
    pub fn is_ipv6(&self) -> bool {
        self.dst.is_ipv6()
    }

    /// The network header followed by the transport header, as payload expressions read them.
    fn headers(&self) -> (Vec<u8>, Vec<u8>) {
        let net = match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = vec![0u8; 20];
                h[0] = 0x45;
                h[8] = 64;
                h[9] = self.l4proto;
                h[12..16].copy_from_slice(&s.octets());
                h[16..20].copy_from_slice(&d.octets());
                h
            }
            (s, d) => {
                let mut h = vec![0u8; 40];
                h[0] = 0x60;
                h[6] = self.l4proto;
                h[7] = 64;
                h[8..24].copy_from_slice(&v6(s).octets());
                h[24..40].copy_from_slice(&v6(d).octets());
                h
            }
        };
        let mut l4 = vec![0u8; if self.l4proto == 6 { 20 } else { 8 }];
        l4[0..2].copy_from_slice(&self.src.port().to_be_bytes());
        l4[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
        if self.l4proto == 6 {
            l4[12] = 0x50;
            l4[13] = 0x02; // SYN
        }
        (net, l4)
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// What the evaluator needs to know about the namespace beyond the packet.
pub trait World {
    /// A TCP socket listening on `port` for that family (TPROXY's listener lookup).
    fn has_listener(&self, ipv6: bool, port: u16) -> bool;
    /// Where a prerouting `redirect` of a packet to `dst` arriving on `iface` sends it: the
    /// first address of `iface` of that family, for IPv6 of a scope the destination's has
    /// (a link-local destination is redirected to a link-local address).
    fn redirect_address(&self, iface: &str, dst: IpAddr) -> Option<IpAddr>;
}

/// What kind of step the walk recorded (the kernel's trace event types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// A rule matched; `verdict` is what it decided (`continue` for counting/marking rules).
    Rule,
    /// The end of a chain was reached.
    Return,
    /// The end of a base chain: its policy.
    Policy,
}

/// A rule as shown in a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleRef {
    pub position: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    pub text: String,
}

impl RuleRef {
    pub fn of(r: &Rule) -> Self {
        RuleRef {
            position: r.position,
            handle: r.handle,
            comment: r.comment.clone(),
            text: r.text.clone(),
        }
    }
}

/// One step of the path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    pub hook: Hook,
    pub family: &'static str,
    pub table: String,
    pub chain: String,
    pub kind: StepKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleRef>,
    pub verdict: Verdict,
    /// What the rule did besides its verdict (`redirect to 127.0.0.1:15001`, `meta mark set
    /// 0x0000053a`, `tproxy to port 15006`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<String>,
}

/// What happened to the packet in one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookEnd {
    /// Went on (accepted or end of every chain).
    Passed,
    Dropped,
    /// An expression we cannot evaluate.
    Unknown {
        rule: RuleRef,
        chain: String,
        expr: String,
    },
}

/// The side effects the outcome needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// `redirect`: the new destination and the rule that did it.
    pub redirected: Option<(SocketAddr, RuleRef)>,
    /// `tproxy` took the packet: the port and the rule.
    pub tproxied: Option<(u16, RuleRef)>,
    /// `tproxy` found no listener on this port.
    pub tproxy_missed: Option<u16>,
    /// `snat`: the new source address and the rule that did it.
    pub snatted: Option<(IpAddr, RuleRef)>,
}

/// Walks the base chains of `hook` in priority order. `skip_nat`: the connection's NAT was
/// already decided (a looped-back packet's second pass).
pub fn run_hook(
    rs: &Ruleset,
    hook: Hook,
    skip_nat: bool,
    pkt: &mut Packet,
    world: &dyn World,
    steps: &mut Vec<Step>,
    fx: &mut Effects,
) -> HookEnd {
    for base in rs.base_chains(hook, pkt.is_ipv6()) {
        if skip_nat && base.base.is_some_and(BaseHook::nat) {
            continue;
        }
        let mut w = Walker {
            rs,
            hook,
            pkt: &mut *pkt,
            world,
            steps: &mut *steps,
            fx: &mut *fx,
        };
        match w.base_chain(base) {
            HookEnd::Passed => {}
            other => return other,
        }
    }
    HookEnd::Passed
}

struct Walker<'a> {
    rs: &'a Ruleset,
    hook: Hook,
    pkt: &'a mut Packet,
    world: &'a dyn World,
    steps: &'a mut Vec<Step>,
    fx: &'a mut Effects,
}

/// The result of one rule.
enum RuleResult {
    NoMatch,
    Matched(Verdict, Vec<String>),
    Unknown(String),
}

/// What one expression tells the rule to do next.
enum Flow {
    Next,
    NoMatch,
    Verdict(Verdict),
    Unknown(String),
}

/// The registers and effects of the rule being evaluated, and the packet's headers.
struct RuleState {
    regs: HashMap<u32, Vec<u8>>,
    effects: Vec<String>,
    /// (network header, transport header)
    headers: (Vec<u8>, Vec<u8>),
}

impl RuleState {
    fn set(&mut self, reg: u32, v: Vec<u8>) -> Flow {
        self.regs.insert(reg, v);
        Flow::Next
    }
    fn get(&self, reg: u32) -> Option<&Vec<u8>> {
        self.regs.get(&reg)
    }
    fn u32(&self, reg: u32) -> u32 {
        self.regs
            .get(&reg)
            .and_then(|b| b.get(..4))
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0)
    }
    /// A port loaded into a register (network byte order), if the statement names one.
    fn port(&self, reg: Option<u32>) -> Option<u16> {
        reg.and_then(|r| self.regs.get(&r))
            .and_then(|b| b.get(..2))
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32) -> Flow {
        let hdr = match base as i32 {
            libc::NFT_PAYLOAD_NETWORK_HEADER => &self.headers.0,
            libc::NFT_PAYLOAD_TRANSPORT_HEADER => &self.headers.1,
            b => return Flow::Unknown(format!("payload base {b}")),
        };
        let (o, l) = (offset as usize, len as usize);
        match hdr.get(o..o + l) {
            Some(v) => {
                let v = v.to_vec();
                self.set(dreg, v)
            }
            None => Flow::NoMatch,
        }
    }
}

impl<'a> Walker<'a> {
    fn step(
        &mut self,
        c: &Chain,
        kind: StepKind,
        rule: Option<&Rule>,
        v: Verdict,
        fx: Vec<String>,
    ) {
        self.steps.push(Step {
            hook: self.hook,
            family: c.family.name(),
            table: c.table.clone(),
            chain: c.name.clone(),
            kind,
            rule: rule.map(RuleRef::of),
            verdict: v,
            effects: fx,
        });
    }

    fn base_chain(&mut self, base: &'a Chain) -> HookEnd {
        let mut stack: Vec<(&'a Chain, usize)> = Vec::new();
        let mut chain = base;
        let mut i = 0;
        loop {
            let Some(rule) = chain.rules.get(i) else {
                self.step(chain, StepKind::Return, None, Verdict::Continue, vec![]);
                match stack.pop() {
                    Some((c, next)) => {
                        chain = c;
                        i = next;
                        continue;
                    }
                    None => {
                        self.step(chain, StepKind::Policy, None, Verdict::Accept, vec![]);
                        return HookEnd::Passed;
                    }
                }
            };
            i += 1;
            let (verdict, effects) = match self.rule(chain, rule) {
                RuleResult::NoMatch => continue,
                RuleResult::Unknown(expr) => {
                    return HookEnd::Unknown {
                        rule: RuleRef::of(rule),
                        chain: format!("{} {} {}", chain.family.name(), chain.table, chain.name),
                        expr,
                    };
                }
                RuleResult::Matched(v, fx) => (v, fx),
            };
            self.step(chain, StepKind::Rule, Some(rule), verdict.clone(), effects);
            match verdict {
                Verdict::Continue => {}
                Verdict::Accept => return HookEnd::Passed,
                Verdict::Drop => return HookEnd::Dropped,
                Verdict::Jump(ref target) | Verdict::Goto(ref target) => {
                    let Some(next) = self.rs.chain(chain.family, &chain.table, target) else {
                        return HookEnd::Unknown {
                            rule: RuleRef::of(rule),
                            chain: chain.name.clone(),
                            expr: format!("jump to missing chain {target}"),
                        };
                    };
                    if matches!(verdict, Verdict::Jump(_)) {
                        stack.push((chain, i));
                    }
                    chain = next;
                    i = 0;
                }
                Verdict::Return => match stack.pop() {
                    Some((c, next)) => {
                        chain = c;
                        i = next;
                    }
                    None => {
                        self.step(chain, StepKind::Policy, None, Verdict::Accept, vec![]);
                        return HookEnd::Passed;
                    }
                },
            }
        }
    }

    fn rule(&mut self, chain: &Chain, rule: &Rule) -> RuleResult {
        let mut r = RuleState {
            regs: HashMap::new(),
            effects: Vec::new(),
            headers: self.pkt.headers(),
        };
        for e in &rule.exprs {
            match self.expr(e, chain, rule, &mut r) {
                Flow::Next => {}
                Flow::NoMatch => return RuleResult::NoMatch,
                Flow::Verdict(v) => return RuleResult::Matched(v, r.effects),
                Flow::Unknown(what) => return RuleResult::Unknown(what),
            }
        }
        RuleResult::Matched(Verdict::Continue, r.effects)
    }

    /// One expression, as the kernel evaluates it.
    fn expr(&mut self, e: &Expr, chain: &Chain, rule: &Rule, r: &mut RuleState) -> Flow {
        match e {
            Expr::Counter => Flow::Next,
            Expr::Meta { key, dreg } => match self.meta(*key) {
                Ok(Some(v)) => r.set(*dreg, v),
                Ok(None) => Flow::NoMatch,
                Err(u) => Flow::Unknown(u),
            },
            Expr::Ct { key, dreg } => match self.ct(*key) {
                Some(v) => r.set(*dreg, v),
                None => Flow::Unknown(format!("ct load key {key}")),
            },
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => r.payload(*base, *offset, *len, *dreg),
            Expr::Cmp { sreg, op, data } => match r.get(*sreg) {
                Some(have) => match cmp(*op, &have[..data.len().min(have.len())], data) {
                    Some(true) => Flow::Next,
                    Some(false) => Flow::NoMatch,
                    None => Flow::Unknown(format!("cmp op {op}")),
                },
                None => Flow::Unknown(format!("cmp of unset register {sreg}")),
            },
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => match r.get(*sreg) {
                Some(have) => {
                    let v = (0..mask.len())
                        .map(|i| {
                            (have.get(i).copied().unwrap_or(0) & mask[i])
                                ^ xor.get(i).copied().unwrap_or(0)
                        })
                        .collect();
                    r.set(*dreg, v)
                }
                None => Flow::Unknown(format!("bitwise of unset register {sreg}")),
            },
            Expr::Lookup { sreg, set, invert } => {
                let Some(s) = self.rs.set(&chain.table, set) else {
                    return Flow::Unknown(format!("lookup in missing set {set}"));
                };
                match r.get(*sreg) {
                    Some(key) if set_contains(s, key) != *invert => Flow::Next,
                    Some(_) => Flow::NoMatch,
                    None => Flow::Unknown(format!("lookup of unset register {sreg}")),
                }
            }
            Expr::Immediate { dreg, data } => r.set(*dreg, data.clone()),
            Expr::Verdict(v) => Flow::Verdict(v.clone()),
            Expr::MetaSet { key, sreg } => self.meta_set(*key, r.u32(*sreg), r),
            Expr::CtSet { key, sreg } => self.ct_set(*key, *sreg, r),
            Expr::Redir { port_reg } => self.redirect(r.port(*port_reg), rule, r),
            Expr::Tproxy {
                port_reg,
                miss_drops,
                ..
            } => self.tproxy(r.port(*port_reg), *miss_drops, rule, r),
            Expr::Nat {
                snat,
                addr_reg,
                port_reg,
                ..
            } => self.nat(*snat, *addr_reg, *port_reg, rule, r),
            Expr::Unknown(name) => Flow::Unknown(name.clone()),
        }
    }

    /// `snat to ADDR` (the host probe rule): the source becomes ADDR; like every NAT
    /// statement it ends the rule with accept. `dnat` and port mapping are not ours.
    fn nat(
        &mut self,
        snat: bool,
        addr_reg: Option<u32>,
        port_reg: Option<u32>,
        rule: &Rule,
        r: &mut RuleState,
    ) -> Flow {
        let addr = addr_reg
            .and_then(|reg| r.get(reg))
            .and_then(|b| match b.len() {
                4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
                _ => None,
            });
        let (true, Some(addr), None) = (snat, addr, port_reg) else {
            let what = match (snat, port_reg) {
                (false, _) => "dnat",
                (true, Some(_)) => "snat with a port",
                (true, None) => "snat without an address",
            };
            return Flow::Unknown(what.into());
        };
        if addr.is_ipv6() != self.pkt.is_ipv6() {
            return Flow::Unknown(format!("snat to {addr} for another family"));
        }
        self.pkt.src.set_ip(addr);
        r.effects.push(format!("snat to {addr}"));
        self.fx.snatted = Some((addr, RuleRef::of(rule)));
        Flow::Verdict(Verdict::Accept)
    }

    fn meta_set(&mut self, key: u32, v: u32, r: &mut RuleState) -> Flow {
        if key == libc::NFT_META_MARK as u32 {
            self.pkt.mark = v;
            r.effects.push(format!("meta mark set {v:#010x}"));
        } else if key != libc::NFT_META_NFTRACE as u32 {
            return Flow::Unknown(format!("meta set {}", meta_key_name(key)));
        }
        Flow::Next
    }

    fn ct_set(&mut self, key: u32, sreg: u32, r: &mut RuleState) -> Flow {
        match key as i32 {
            libc::NFT_CT_MARK => {
                let v = r.u32(sreg);
                self.pkt.ct_mark = v;
                r.effects.push(format!("ct mark set {v:#010x}"));
            }
            libc::NFT_CT_ZONE => {
                let z = r
                    .get(sreg)
                    .and_then(|b| b.get(..2))
                    .map(|b| u16::from_ne_bytes([b[0], b[1]]))
                    .unwrap_or(0);
                self.pkt.ct_zone = z;
                r.effects.push(format!("ct zone set {z}"));
            }
            k => return Flow::Unknown(format!("ct set key {k}")),
        }
        Flow::Next
    }

    /// `redirect`: NAT to a local address; like every NAT statement it ends the rule with
    /// accept.
    fn redirect(&mut self, port: Option<u16>, rule: &Rule, r: &mut RuleState) -> Flow {
        let port = port.unwrap_or(self.pkt.dst.port());
        let Some(to) = self.redirect_target(port) else {
            return Flow::Unknown("redirect without a local address on the input interface".into());
        };
        self.pkt.dst = to;
        r.effects.push(format!("redirect to {to}"));
        self.fx.redirected = Some((to, RuleRef::of(rule)));
        Flow::Verdict(Verdict::Accept)
    }

    /// `tproxy`: takes the packet when a listener is there; otherwise nft's does not match,
    /// iptables' TPROXY drops.
    fn tproxy(
        &mut self,
        port: Option<u16>,
        miss_drops: bool,
        rule: &Rule,
        r: &mut RuleState,
    ) -> Flow {
        let port = port.unwrap_or(self.pkt.dst.port());
        if self.world.has_listener(self.pkt.is_ipv6(), port) {
            r.effects.push(format!("tproxy to port {port}"));
            self.fx.tproxied = Some((port, RuleRef::of(rule)));
            return Flow::Next;
        }
        self.fx.tproxy_missed = Some(port);
        if miss_drops {
            r.effects
                .push(format!("tproxy: no listener on port {port}"));
            return Flow::Verdict(Verdict::Drop);
        }
        Flow::NoMatch
    }

    /// `Ok(None)`: the key has no value for this packet (e.g. no socket): the rule does not match.
    fn meta(&self, key: u32) -> Result<Option<Vec<u8>>, String> {
        let p = &self.pkt;
        let k = key as i32;
        Ok(match k {
            libc::NFT_META_L4PROTO => Some(vec![p.l4proto]),
            libc::NFT_META_NFPROTO => Some(vec![if p.is_ipv6() {
                libc::NFPROTO_IPV6 as u8
            } else {
                libc::NFPROTO_IPV4 as u8
            }]),
            libc::NFT_META_PROTOCOL => Some(
                (if p.is_ipv6() { 0x86ddu16 } else { 0x0800 })
                    .to_be_bytes()
                    .to_vec(),
            ),
            libc::NFT_META_SKUID => p.uid.map(|u| u.to_ne_bytes().to_vec()),
            libc::NFT_META_SKGID => p.gid.map(|g| g.to_ne_bytes().to_vec()),
            libc::NFT_META_OIFNAME => p.oif.as_deref().map(|n| ifname(n).to_vec()),
            libc::NFT_META_IIFNAME => p.iif.as_deref().map(|n| ifname(n).to_vec()),
            libc::NFT_META_MARK => Some(p.mark.to_ne_bytes().to_vec()),
            _ => return Err(format!("meta {}", meta_key_name(key))),
        })
    }

    fn ct(&self, key: u32) -> Option<Vec<u8>> {
        let p = &self.pkt;
        Some(match key as i32 {
            libc::NFT_CT_STATE => p.ct_state.to_ne_bytes().to_vec(),
            libc::NFT_CT_MARK => p.ct_mark.to_ne_bytes().to_vec(),
            libc::NFT_CT_ZONE => p.ct_zone.to_ne_bytes().to_vec(),
            libc::NFT_CT_DIRECTION => vec![0],
            _ => return None,
        })
    }

    /// Where `redirect` sends: loopback for locally generated packets, else an address of the
    /// input interface ([`World::redirect_address`]).
    fn redirect_target(&self, port: u16) -> Option<SocketAddr> {
        let v6 = self.pkt.is_ipv6();
        let addr = match (&self.pkt.iif, self.hook) {
            (Some(iif), Hook::Prerouting) => self.world.redirect_address(iif, self.pkt.dst.ip())?,
            _ if v6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
            _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        Some(SocketAddr::new(addr, port))
    }
}

/// nft's word for a meta key, for "cannot evaluate" messages.
fn meta_key_name(key: u32) -> String {
    match key as i32 {
        libc::NFT_META_LEN => "length".into(),
        libc::NFT_META_PRIORITY => "priority".into(),
        libc::NFT_META_IIF => "iif".into(),
        libc::NFT_META_OIF => "oif".into(),
        libc::NFT_META_IIFTYPE => "iiftype".into(),
        libc::NFT_META_OIFTYPE => "oiftype".into(),
        libc::NFT_META_PKTTYPE => "pkttype".into(),
        libc::NFT_META_CPU => "cpu".into(),
        libc::NFT_META_CGROUP => "cgroup".into(),
        libc::NFT_META_RTCLASSID => "rtclassid".into(),
        libc::NFT_META_SECMARK => "secmark".into(),
        _ => format!("key {key}"),
    }
}

/// The kernel compares with memcmp for every operator.
fn cmp(op: u32, have: &[u8], want: &[u8]) -> Option<bool> {
    let o = have.cmp(want);
    use std::cmp::Ordering::*;
    Some(match op as i32 {
        libc::NFT_CMP_EQ => o == Equal,
        libc::NFT_CMP_NEQ => o != Equal,
        libc::NFT_CMP_LT => o == Less,
        libc::NFT_CMP_LTE => o != Greater,
        libc::NFT_CMP_GT => o == Greater,
        libc::NFT_CMP_GTE => o != Less,
        _ => return None,
    })
}

fn ifname(n: &str) -> [u8; libc::IFNAMSIZ] {
    nft_backend::expr::ifname_bytes(n)
}

/// Membership as the kernel decides it: exact keys, or for an interval set the closest
/// element at or below the key, which must be a start and not an interval end.
pub fn set_contains(s: &Set, reg: &[u8]) -> bool {
    let Some(len) = s.elements.first().map(|e| e.0.len()) else {
        return false;
    };
    let key = &reg[..len.min(reg.len())];
    if !s.interval {
        return s.elements.iter().any(|(k, _)| k.as_slice() == key);
    }
    let mut best: Option<&(Vec<u8>, bool)> = None;
    for e in &s.elements {
        if e.0.as_slice() <= key && best.is_none_or(|b| e.0 > b.0 || (e.0 == b.0 && !e.1)) {
            best = Some(e);
        }
    }
    best.is_some_and(|(_, end)| !end)
}

/// Whether the walk ever reaches a rule whose first condition is not `meta nfproto ipv4`
/// from a base chain: false means IPv6 packets cannot match anything of ours.
pub fn ipv4_only(rs: &Ruleset) -> bool {
    let v4 = [libc::NFPROTO_IPV4 as u8];
    rs.chains
        .iter()
        .filter(|c| c.base.is_some() && c.family == TableFamily::Inet)
        .flat_map(|c| &c.rules)
        .all(|r| {
            matches!(
                r.exprs.as_slice(),
                [Expr::Meta { key, .. }, Expr::Cmp { op, data, .. }, ..]
                    if *key == libc::NFT_META_NFPROTO as u32
                        && *op == libc::NFT_CMP_EQ as u32
                        && data.as_slice() == v4
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Backend, Chain, ChainType, Rule, SetKey};

    struct NoWorld;
    impl World for NoWorld {
        fn has_listener(&self, _: bool, _: u16) -> bool {
            false
        }
        fn redirect_address(&self, _: &str, _: IpAddr) -> Option<IpAddr> {
            None
        }
    }

    fn set(interval: bool, elements: &[(&[u8], bool)]) -> Set {
        Set {
            table: "t".into(),
            name: "s".into(),
            key: SetKey::Ipv4Addr,
            interval,
            comment: None,
            elements: elements.iter().map(|(k, e)| (k.to_vec(), *e)).collect(),
        }
    }

    #[test]
    fn interval_sets_match_inside_ranges_only() {
        // 0.0.0.0 end, [10.0.0.0, 11.0.0.0), [192.168.1.1, 192.168.1.2)
        let s = set(
            true,
            &[
                (&[0, 0, 0, 0], true),
                (&[10, 0, 0, 0], false),
                (&[11, 0, 0, 0], true),
                (&[192, 168, 1, 1], false),
                (&[192, 168, 1, 2], true),
            ],
        );
        assert!(set_contains(&s, &[10, 1, 2, 3]));
        assert!(!set_contains(&s, &[11, 0, 0, 0]));
        assert!(!set_contains(&s, &[9, 255, 255, 255]));
        assert!(set_contains(&s, &[192, 168, 1, 1]));
        assert!(!set_contains(&s, &[192, 168, 1, 2]));
        let ports = set(false, &[(&[0, 53], false), (&[0x3a, 0x98], false)]);
        assert!(set_contains(&ports, &[0, 53, 0, 0]));
        assert!(!set_contains(&ports, &[0, 54]));
    }

    fn packet() -> Packet {
        Packet {
            l4proto: 6,
            src: "10.0.0.2:40000".parse().unwrap(),
            dst: "10.0.0.1:80".parse().unwrap(),
            iif: None,
            oif: Some("eth0".into()),
            uid: Some(1337),
            gid: Some(1337),
            mark: 0,
            ct_state: CT_STATE_NEW,
            ct_mark: 0,
            ct_zone: 0,
        }
    }

    fn ruleset(rules: Vec<Vec<Expr>>) -> Ruleset {
        Ruleset {
            backend: Backend::Nft,
            sets: vec![],
            chains: vec![Chain {
                family: TableFamily::Inet,
                table: "istio-proxy-nat".into(),
                name: "output".into(),
                base: Some(BaseHook {
                    kind: ChainType::Nat,
                    hook: Hook::Output,
                    priority: -100,
                }),
                rules: rules
                    .into_iter()
                    .enumerate()
                    .map(|(i, exprs)| Rule {
                        handle: Some(i as u64 + 1),
                        position: i + 1,
                        comment: None,
                        text: String::new(),
                        exprs,
                    })
                    .collect(),
            }],
        }
    }

    fn skuid(op: i32, id: u32) -> Vec<Expr> {
        vec![
            Expr::Meta {
                key: libc::NFT_META_SKUID as u32,
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: op as u32,
                data: id.to_ne_bytes().to_vec(),
            },
        ]
    }

    fn walk(rs: &Ruleset, pkt: &mut Packet) -> (HookEnd, Vec<Step>) {
        let mut steps = Vec::new();
        let mut fx = Effects::default();
        let end = run_hook(rs, Hook::Output, false, pkt, &NoWorld, &mut steps, &mut fx);
        (end, steps)
    }

    #[test]
    fn first_matching_rule_decides_and_unknown_expressions_stop_the_walk() {
        let mut ret = skuid(libc::NFT_CMP_EQ, 1337);
        ret.push(Expr::Verdict(Verdict::Return));
        let mut drop = skuid(libc::NFT_CMP_NEQ, 1337);
        drop.push(Expr::Verdict(Verdict::Drop));
        let rs = ruleset(vec![drop.clone(), ret.clone()]);
        let (end, steps) = walk(&rs, &mut packet());
        assert_eq!(end, HookEnd::Passed);
        assert_eq!(steps[0].rule.as_ref().unwrap().position, 2);
        assert_eq!(steps[0].verdict, Verdict::Return);
        assert_eq!(steps.last().unwrap().kind, StepKind::Policy);

        // No socket (uid unknown): neither `==` nor `!=` matches, as in the kernel.
        let mut p = packet();
        p.uid = None;
        let (_, steps) = walk(&rs, &mut p);
        assert!(steps.iter().all(|s| s.kind != StepKind::Rule));

        let rs = ruleset(vec![vec![Expr::Unknown("limit".into())], ret]);
        let (end, _) = walk(&rs, &mut packet());
        assert!(
            matches!(&end, HookEnd::Unknown { expr, rule, .. } if expr == "limit" && rule.position == 1),
            "{end:?}"
        );
    }

    #[test]
    fn prefix_match_through_bitwise() {
        let rule = vec![
            Expr::Payload {
                base: libc::NFT_PAYLOAD_NETWORK_HEADER as u32,
                offset: 16,
                len: 4,
                dreg: 1,
            },
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                mask: vec![255, 255, 0, 0],
                xor: vec![0; 4],
            },
            Expr::Cmp {
                sreg: 1,
                op: libc::NFT_CMP_EQ as u32,
                data: vec![10, 0, 0, 0],
            },
            Expr::Verdict(Verdict::Accept),
        ];
        let rs = ruleset(vec![rule]);
        let (_, steps) = walk(&rs, &mut packet());
        assert_eq!(steps[0].verdict, Verdict::Accept);
        let mut p = packet();
        p.dst = "10.1.0.1:80".parse().unwrap();
        let (_, steps) = walk(&rs, &mut p);
        assert_eq!(steps[0].kind, StepKind::Return);
    }
}
