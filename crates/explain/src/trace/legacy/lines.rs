//! The kernel's TRACE lines, pure: an nfnetlink_log packet message decoded
//! ([`LogLine::decode`]), its prefix (`TRACE: nat:ISTIO_OUTPUT:rule:3 `) parsed
//! ([`Prefix::parse`]), the logged packet's headers ([`Headers::parse`]), the lines of the
//! traced connection's first packet picked out of everything logged ([`Collector`]), and those
//! lines as trace events of the explained ruleset ([`events`]).

use super::super::{Connection, Direction, EventKind, TraceEvent, Verdict};
use crate::ir::{Expr, Ruleset, TableFamily, Verdict as IrVerdict};
use crate::live_legacy::{KernelNumbers, Numbered};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// nfnetlink_log attributes (`NFULA_*`).
const NFULA_PACKET_HDR: u16 = 1;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;

/// Netfilter hook numbers (`NF_INET_*`).
pub const HOOK_PREROUTING: u8 = 0;
pub const HOOK_INPUT: u8 = 1;
pub const HOOK_FORWARD: u8 = 2;
pub const HOOK_OUTPUT: u8 = 3;
pub const HOOK_POSTROUTING: u8 = 4;

/// One logged packet: a TRACE line (or anything else logged to the group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// `NFPROTO_IPV4` (2) or `NFPROTO_IPV6` (10).
    pub pf: u8,
    pub hook: u8,
    pub prefix: String,
    pub indev: Option<u32>,
    /// The packet from its network header, as far as copied.
    pub payload: Vec<u8>,
}

impl LogLine {
    /// An `NFULNL_MSG_PACKET` message's payload (after the netlink header).
    pub fn decode(msg: &[u8]) -> Option<LogLine> {
        let pf = *msg.first()?;
        let mut line = LogLine {
            pf,
            hook: u8::MAX,
            prefix: String::new(),
            indev: None,
            payload: Vec::new(),
        };
        for (kind, v) in netlink_wire::attrs(msg.get(4..)?) {
            match kind {
                NFULA_PACKET_HDR => line.hook = *v.get(2)?,
                NFULA_IFINDEX_INDEV => line.indev = Some(u32::from_be_bytes(v.try_into().ok()?)),
                NFULA_PAYLOAD => line.payload = v.to_vec(),
                NFULA_PREFIX => {
                    let s = v.split(|b| *b == 0).next().unwrap_or_default();
                    line.prefix = String::from_utf8_lossy(s).into_owned();
                }
                _ => {}
            }
        }
        Some(line)
    }
}

/// What ip_tables says it did (`TRACE: table:chain:kind:rulenum`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A rule matched.
    Rule,
    /// The end of a user chain, or an unconditional rule with a standard verdict
    /// (`-j ACCEPT`, `-j RETURN`) in one: ip_tables cannot tell them apart.
    Return,
    /// The end of a built-in chain, or an unconditional standard-verdict rule in one.
    Policy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub table: String,
    pub chain: String,
    pub kind: Kind,
    pub rulenum: usize,
}

impl Prefix {
    /// `TRACE: nat:ISTIO_OUTPUT:rule:3 ` (the chain may itself hold `:`).
    pub fn parse(prefix: &str) -> Option<Prefix> {
        let rest = prefix.strip_prefix("TRACE: ")?.trim_end();
        let mut tail = rest.rsplitn(3, ':');
        let rulenum = tail.next()?.parse().ok()?;
        let kind = match tail.next()? {
            "rule" => Kind::Rule,
            "return" => Kind::Return,
            "policy" => Kind::Policy,
            _ => return None,
        };
        let (table, chain) = tail.next()?.split_once(':')?;
        Some(Prefix {
            table: table.into(),
            chain: chain.into(),
            kind,
            rulenum,
        })
    }
}

/// The logged packet's addresses and ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    pub l4: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
}

impl Headers {
    /// From the network header on (IPv6 without extension headers, as our probes send).
    pub fn parse(pf: u8, p: &[u8]) -> Option<Headers> {
        let (l4, src, dst, th): (u8, IpAddr, IpAddr, &[u8]) = if pf as i32 == libc::NFPROTO_IPV6 {
            let a = |o: usize| -> Option<IpAddr> {
                Some(Ipv6Addr::from(<[u8; 16]>::try_from(p.get(o..o + 16)?).ok()?).into())
            };
            (*p.get(6)?, a(8)?, a(24)?, p.get(40..)?)
        } else {
            let ihl = (*p.first()? & 0x0f) as usize * 4;
            let a = |o: usize| -> Option<IpAddr> {
                Some(Ipv4Addr::from(<[u8; 4]>::try_from(p.get(o..o + 4)?).ok()?).into())
            };
            (*p.get(9)?, a(12)?, a(16)?, p.get(ihl..)?)
        };
        let port = |o: usize| Some(u16::from_be_bytes([*th.get(o)?, *th.get(o + 1)?]));
        Some(Headers {
            l4,
            src,
            dst,
            sport: port(0)?,
            dport: port(2)?,
        })
    }
}

/// Where a line stands in one packet's life: hooks in the order the packet meets them, then
/// tables in priority order within the hook. One packet's lines never go back.
fn rank(direction: Direction, hook: u8, table: &str) -> (u8, u8) {
    let hook_rank = match (direction, hook) {
        (Direction::Outbound, HOOK_OUTPUT) | (Direction::Inbound, HOOK_PREROUTING) => 0,
        (Direction::Outbound, HOOK_POSTROUTING) => 1,
        (Direction::Outbound, HOOK_PREROUTING) => 2,
        (Direction::Inbound, HOOK_INPUT | HOOK_FORWARD) => 1,
        (Direction::Inbound, HOOK_POSTROUTING) => 2,
        _ => 3,
    };
    // nat is DNAT (-100) in prerouting/output, SNAT (+100) in input/postrouting.
    let snat_hook = matches!(hook, HOOK_INPUT | HOOK_POSTROUTING);
    let table_rank = match table {
        "raw" => 0,
        "mangle" => 1,
        "nat" if !snat_hook => 2,
        "filter" => 3,
        "security" => 4,
        "nat" => 5,
        _ => 6,
    };
    (hook_rank, table_rank)
}

/// A line with its parsed prefix and headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traced {
    pub pf: u8,
    pub hook: u8,
    pub prefix: Prefix,
}

/// Keeps the lines of the first packet of the traced connection: it starts with a line at
/// the connection's first hook whose headers are the connection's (with the probe's source
/// port when known), and goes on, through the second pass over lo, with lines of the same
/// flow (protocol, source address and port: our rules only rewrite destinations) that do not
/// go back in [`rank`]. A line that goes back is the next packet (a retransmission) and ends
/// the collection.
pub struct Collector {
    conn: Connection,
    sport: Option<u16>,
    flow: Option<(u8, IpAddr, u16)>,
    last: (u8, u8),
    done: bool,
    pub lines: Vec<Traced>,
}

impl Collector {
    pub fn new(conn: &Connection, sport: Option<u16>) -> Self {
        Collector {
            conn: conn.clone(),
            sport,
            flow: None,
            last: (0, 0),
            done: false,
            lines: Vec::new(),
        }
    }

    pub fn seen(&self) -> bool {
        self.flow.is_some()
    }

    fn first_hook(&self) -> u8 {
        match self.conn.direction {
            Direction::Outbound => HOOK_OUTPUT,
            Direction::Inbound => HOOK_PREROUTING,
        }
    }

    /// Whether `h` is the connection's first packet as it enters its first hook.
    fn starts(&self, h: &Headers) -> bool {
        let l4 = match self.conn.protocol {
            super::super::Protocol::Tcp => libc::IPPROTO_TCP,
            super::super::Protocol::Udp => libc::IPPROTO_UDP,
        } as u8;
        h.l4 == l4
            && h.dst == self.conn.dst.ip()
            && h.dport == self.conn.dst.port()
            && self.conn.src.is_none_or(|s| s == h.src)
            && self.sport.is_none_or(|p| p == h.sport)
    }

    pub fn feed(&mut self, line: LogLine) {
        if self.done {
            return;
        }
        let (Some(prefix), Some(h)) = (
            Prefix::parse(&line.prefix),
            Headers::parse(line.pf, &line.payload),
        ) else {
            return;
        };
        let here = rank(self.conn.direction, line.hook, &prefix.table);
        match self.flow {
            None if line.hook == self.first_hook() && self.starts(&h) => {
                self.flow = Some((h.l4, h.src, h.sport));
            }
            None => return,
            Some(f) if f != (h.l4, h.src, h.sport) => return,
            Some(_) if here < self.last => {
                self.done = true;
                return;
            }
            Some(_) => {}
        }
        self.last = here;
        self.lines.push(Traced {
            pf: line.pf,
            hook: line.hook,
            prefix,
        });
    }
}

/// The collected lines as trace events of the ruleset `rs` read with `numbers` from the same
/// save output: lines in tables or chains `rs` does not explain (filter, a raw table holding
/// only trace rules) and the trace rules' own lines are left out. ip_tables does not log a
/// verdict: a rule's is its target's (a jump, `RETURN`, `ACCEPT`, `DROP`; `REDIRECT` and
/// `SNAT` accept), except TPROXY, which accepts when it found a socket and drops otherwise:
/// the packet's next line, if any, says it went on.
pub fn events(lines: &[Traced], rs: &Ruleset, numbers: &KernelNumbers) -> Vec<TraceEvent> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let v6 = l.pf as i32 == libc::NFPROTO_IPV6;
        let family = if v6 {
            TableFamily::Ip6
        } else {
            TableFamily::Ip
        };
        let p = &l.prefix;
        let Some(chain) = rs.chain(family, &p.table, &p.chain) else {
            continue;
        };
        let event = |kind, position, verdict| TraceEvent {
            id: 0,
            family: family.name().into(),
            table: p.table.clone(),
            chain: p.chain.clone(),
            rule_handle: None,
            rule_position: position,
            kind,
            verdict: Some(verdict),
            nfproto: Some(l.pf as u32),
        };
        match numbers.get(&p.table, &p.chain, p.rulenum) {
            Numbered::TraceRule | Numbered::Unknown => {}
            Numbered::End if p.kind == Kind::Policy => {
                // nft (and the explanation) report falling off a base chain as its end, then
                // its policy; ip_tables only as the policy. After a `RETURN` rule there is no
                // end of chain in either.
                let returned = out.last().is_some_and(|e: &TraceEvent| {
                    e.table == p.table && e.chain == p.chain && e.verdict == Some(Verdict::Return)
                });
                if !returned {
                    out.push(event(EventKind::Return, None, Verdict::Continue));
                }
                out.push(event(EventKind::Policy, None, Verdict::Accept));
            }
            Numbered::End => out.push(event(EventKind::Return, None, Verdict::Continue)),
            Numbered::Rule(pos) => {
                if let Some(rule) = chain.rules.iter().find(|r| r.position == pos) {
                    let went_on = i + 1 < lines.len();
                    let v = verdict_of(&rule.exprs, went_on);
                    out.push(event(EventKind::Rule, Some(pos), v));
                }
            }
        }
    }
    out
}

fn verdict_of(exprs: &[Expr], went_on: bool) -> Verdict {
    // TPROXY decides before the accept the reader writes after it.
    if exprs.iter().any(|e| matches!(e, Expr::Tproxy { .. })) {
        return if went_on {
            Verdict::Accept
        } else {
            Verdict::Drop
        };
    }
    for e in exprs.iter().rev() {
        match e {
            Expr::Verdict(v) => {
                return match v {
                    IrVerdict::Accept => Verdict::Accept,
                    IrVerdict::Drop => Verdict::Drop,
                    IrVerdict::Return => Verdict::Return,
                    IrVerdict::Continue => Verdict::Continue,
                    IrVerdict::Jump(c) => Verdict::Jump(c.clone()),
                    IrVerdict::Goto(c) => Verdict::Goto(c.clone()),
                };
            }
            Expr::Redir { .. } | Expr::Nat { .. } => return Verdict::Accept,
            _ => {}
        }
    }
    Verdict::Continue
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Protocol;

    #[test]
    fn prefixes_parse_into_table_chain_kind_and_number() {
        assert_eq!(
            Prefix::parse("TRACE: nat:ISTIO_OUTPUT:rule:3 "),
            Some(Prefix {
                table: "nat".into(),
                chain: "ISTIO_OUTPUT".into(),
                kind: Kind::Rule,
                rulenum: 3
            })
        );
        let p = Prefix::parse("TRACE: raw:OUTPUT:policy:2 ").unwrap();
        assert_eq!((p.kind, p.rulenum), (Kind::Policy, 2));
        let p = Prefix::parse("TRACE: mangle:A:B:return:7 ").unwrap();
        assert_eq!((p.chain.as_str(), p.kind), ("A:B", Kind::Return));
        assert_eq!(Prefix::parse("TRACE: nat:OUTPUT:jump:1 "), None);
        assert_eq!(Prefix::parse("IN=eth0 OUT="), None);
        assert_eq!(Prefix::parse("TRACE: nat:OUTPUT:rule:x "), None);
    }

    fn nla(kind: u16, v: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        netlink_wire::put_attr(&mut b, kind, v);
        b
    }

    /// A SYN from 10.0.0.2:40123 to 10.1.2.3:80 (as logged on 6.18).
    const SYN: &str =
        "4500003c56ec40004006cdca0a0000020a0102039cbb0050aab8bcd100000000a002faf016340000020405b4";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn packet_messages_decode() {
        let mut msg = vec![2, 0, 0, 0];
        msg.extend(nla(NFULA_PACKET_HDR, &[0x08, 0x00, HOOK_OUTPUT, 0]));
        msg.extend(nla(NFULA_PREFIX, b"TRACE: raw:OUTPUT:policy:2 \0"));
        msg.extend(nla(NFULA_PAYLOAD, &hex(SYN)));
        let l = LogLine::decode(&msg).unwrap();
        assert_eq!((l.pf, l.hook, l.indev), (2, HOOK_OUTPUT, None));
        assert_eq!(l.prefix, "TRACE: raw:OUTPUT:policy:2 ");
        let h = Headers::parse(l.pf, &l.payload).unwrap();
        assert_eq!(h.src, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(h.dst, "10.1.2.3".parse::<IpAddr>().unwrap());
        assert_eq!((h.l4, h.sport, h.dport), (6, 40123, 80));
        assert_eq!(Headers::parse(2, &hex(SYN)[..22]), None);
    }

    fn line(hook: u8, prefix: &str, payload: &[u8]) -> LogLine {
        LogLine {
            pf: 2,
            hook,
            prefix: prefix.into(),
            indev: None,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn collector_keeps_the_first_packet_through_its_second_pass() {
        let conn = Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            "10.1.2.3:80".parse().unwrap(),
        );
        let syn = hex(SYN);
        let mut redirected = syn.clone();
        redirected[16..20].copy_from_slice(&[127, 0, 0, 1]);
        redirected[22..24].copy_from_slice(&15001u16.to_be_bytes());
        let mut other = syn.clone();
        other[20..22].copy_from_slice(&40124u16.to_be_bytes());
        let mut c = Collector::new(&conn, Some(40123));
        c.feed(line(HOOK_OUTPUT, "TRACE: raw:OUTPUT:policy:2 ", &other)); // not ours
        c.feed(line(
            HOOK_POSTROUTING,
            "TRACE: nat:POSTROUTING:policy:1 ",
            &syn,
        )); // not a start
        assert!(!c.seen());
        c.feed(line(HOOK_OUTPUT, "TRACE: raw:OUTPUT:policy:2 ", &syn));
        c.feed(line(HOOK_OUTPUT, "TRACE: nat:ISTIO_OUTPUT:rule:2 ", &syn));
        c.feed(line(HOOK_OUTPUT, "TRACE: nat:OUTPUT:rule:1 ", &other)); // another flow
        c.feed(line(
            HOOK_POSTROUTING,
            "TRACE: nat:POSTROUTING:policy:1 ",
            &redirected,
        ));
        c.feed(line(
            HOOK_PREROUTING,
            "TRACE: raw:PREROUTING:rule:1 ",
            &redirected,
        ));
        c.feed(line(HOOK_OUTPUT, "TRACE: raw:OUTPUT:policy:2 ", &syn)); // retransmission
        c.feed(line(
            HOOK_PREROUTING,
            "TRACE: raw:PREROUTING:policy:2 ",
            &syn,
        ));
        assert!(c.seen());
        let got: Vec<String> = c
            .lines
            .iter()
            .map(|l| format!("{}:{}", l.prefix.table, l.prefix.chain))
            .collect();
        assert_eq!(
            got,
            [
                "raw:OUTPUT",
                "nat:ISTIO_OUTPUT",
                "nat:POSTROUTING",
                "raw:PREROUTING"
            ]
        );
    }

    #[test]
    fn nat_after_filter_in_input_is_the_same_packet() {
        assert!(
            rank(Direction::Inbound, HOOK_INPUT, "filter")
                < rank(Direction::Inbound, HOOK_INPUT, "nat")
        );
        assert!(
            rank(Direction::Inbound, HOOK_PREROUTING, "nat")
                < rank(Direction::Inbound, HOOK_INPUT, "mangle")
        );
        assert!(
            rank(Direction::Outbound, HOOK_PREROUTING, "raw")
                > rank(Direction::Outbound, HOOK_POSTROUTING, "nat")
        );
    }

    #[test]
    fn tproxy_accepts_only_when_the_packet_went_on() {
        let tproxy = [
            Expr::Tproxy {
                family: 0,
                port_reg: Some(1),
                miss_drops: true,
            },
            Expr::Verdict(IrVerdict::Accept),
        ];
        // The accept after TPROXY is the reader's; the kernel's TPROXY decides first.
        assert_eq!(verdict_of(&tproxy, true), Verdict::Accept);
        assert_eq!(verdict_of(&tproxy, false), Verdict::Drop);
        assert_eq!(
            verdict_of(&[Expr::Verdict(IrVerdict::Jump("X".into()))], false),
            Verdict::Jump("X".into())
        );
        assert_eq!(verdict_of(&[Expr::Counter], true), Verdict::Continue);
    }

    #[test]
    fn lines_become_events_of_the_explained_rules() {
        let save = "*raw\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -p tcp -m comment --comment istio-explain-1-0 -j TRACE\nCOMMIT\n*nat\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A OUTPUT -p tcp -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -o lo -j RETURN\n-A ISTIO_OUTPUT -p tcp -j REDIRECT --to-ports 15001\nCOMMIT\n";
        let rs = crate::live_legacy::ruleset_of(save, false);
        let t = |hook, prefix: &str| Traced {
            pf: 2,
            hook,
            prefix: Prefix::parse(prefix).unwrap(),
        };
        let lines = [
            t(HOOK_OUTPUT, "TRACE: raw:OUTPUT:policy:2 "), // a table of trace rules only
            t(HOOK_OUTPUT, "TRACE: nat:OUTPUT:rule:1 "),
            t(HOOK_OUTPUT, "TRACE: nat:ISTIO_OUTPUT:rule:2 "),
            t(HOOK_POSTROUTING, "TRACE: nat:POSTROUTING:policy:1 "),
            t(HOOK_POSTROUTING, "TRACE: filter:POSTROUTING:policy:1 "), // not explained
        ];
        let got: Vec<String> = events(&lines, &rs, &KernelNumbers::of(save))
            .iter()
            .map(|e| {
                format!(
                    "{} {} {:?} {:?} {:?}",
                    e.family, e.chain, e.kind, e.rule_position, e.verdict
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                "ip OUTPUT Rule Some(1) Some(Jump(\"ISTIO_OUTPUT\"))",
                "ip ISTIO_OUTPUT Rule Some(2) Some(Accept)",
                "ip POSTROUTING Return None Some(Continue)",
                "ip POSTROUTING Policy None Some(Accept)",
            ]
        );
    }
}
