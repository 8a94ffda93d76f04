//! A rule back in nft syntax, for the expression patterns our backend emits (nft_backend's
//! `model.rs`), so an explanation shows `oifname "lo" meta skuid 1337 counter return` and not
//! bytecode. Anything else returns `None` (a reader of live rules then keeps libnftnl's debug
//! text).

use crate::{Expr, REG1, Rule, Set};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `rule` in nft syntax, its anonymous sets looked up in `sets` (of `table`).
pub fn rule_text(rule: &Rule, sets: &[Set], table: &str) -> Option<String> {
    let mut out: Vec<String> = Vec::new();
    let mut l4 = "th";
    let e = &rule.exprs;
    let mut i = 0;
    while i < e.len() {
        let (words, used) = one(&e[i..], sets, table, &mut l4)?;
        out.push(words);
        i += used;
    }
    if let Some(c) = &rule.comment {
        out.push(format!("comment \"{c}\""));
    }
    Some(out.join(" "))
}

fn neq(op: u32) -> Option<&'static str> {
    match op as i32 {
        libc::NFT_CMP_EQ => Some(""),
        libc::NFT_CMP_NEQ => Some("!= "),
        libc::NFT_CMP_LT => Some("< "),
        libc::NFT_CMP_LTE => Some("<= "),
        libc::NFT_CMP_GT => Some("> "),
        libc::NFT_CMP_GTE => Some(">= "),
        _ => None,
    }
}

fn u32_ne(d: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(d.get(..4)?.try_into().ok()?))
}

fn u16_be(d: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(..2)?.try_into().ok()?))
}

fn addr(d: &[u8]) -> Option<IpAddr> {
    match d.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(d).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(d).ok()?))),
        _ => None,
    }
}

fn prefix_len(mask: &[u8]) -> u32 {
    mask.iter().map(|b| b.count_ones()).sum()
}

/// One statement starting at `e[0]`: its words and how many expressions it used.
fn one(e: &[Expr], sets: &[Set], table: &str, l4: &mut &'static str) -> Option<(String, usize)> {
    use Expr::*;
    Some(match e {
        [Counter, ..] => ("counter".into(), 1),
        [Verdict(v), ..] => (v.to_string(), 1),
        [Meta { key, dreg: REG1 }, Cmp { op, data, .. }, ..] => (meta_cmp(*key, *op, data, l4)?, 2),
        [
            Meta { key, dreg: REG1 },
            Bitwise { mask, xor, .. },
            Cmp { op, data, .. },
            ..,
        ] if *key as i32 == libc::NFT_META_MARK && u32_ne(xor)? == 0 => {
            (masked("meta mark", mask, *op, data)?, 3)
        }
        [
            Ct { key, dreg: REG1 },
            Bitwise { mask, xor, .. },
            Cmp { op, data, .. },
            ..,
        ] if *key as i32 == libc::NFT_CT_MARK && u32_ne(xor)? == 0 => {
            (masked("ct mark", mask, *op, data)?, 3)
        }
        [
            Ct { key, dreg: REG1 },
            Bitwise { mask, xor, .. },
            CtSet { key: ck, .. },
            ..,
        ] if *key as i32 == libc::NFT_CT_MARK && *ck as i32 == libc::NFT_CT_MARK => {
            // As `nft list` writes it: `(x & m) ^ v`, with m and v disjoint, is
            // `x & (m | v) | v`.
            let (m, x) = (u32_ne(mask)?, u32_ne(xor)?);
            if m & x != 0 {
                return None;
            }
            (
                format!("ct mark set ct mark & {:#010x} | {x:#010x}", m | x),
                3,
            )
        }
        [Immediate { data, .. }, Nat { snat, family, .. }, ..] => {
            let f = if *family as i32 == libc::NFPROTO_IPV6 {
                "ip6"
            } else {
                "ip"
            };
            let kind = if *snat { "snat" } else { "dnat" };
            (
                format!("{kind} {f} to {}", capture::DisplayIp(addr(data)?)),
                2,
            )
        }
        [Meta { key, dreg: REG1 }, CtSet { key: ck, .. }, ..]
            if *key as i32 == libc::NFT_META_MARK && *ck as i32 == libc::NFT_CT_MARK =>
        {
            ("ct mark set meta mark".into(), 2)
        }
        [Ct { key, dreg: REG1 }, MetaSet { key: mk, .. }, ..]
            if *key as i32 == libc::NFT_CT_MARK && *mk as i32 == libc::NFT_META_MARK =>
        {
            ("meta mark set ct mark".into(), 2)
        }
        [Ct { key, dreg: REG1 }, Cmp { op, data, .. }, ..] if *key as i32 == libc::NFT_CT_MARK => {
            (format!("ct mark {}{:#010x}", neq(*op)?, u32_ne(data)?), 2)
        }
        [
            Ct { key, dreg: REG1 },
            Bitwise { mask, .. },
            Cmp { op, data, .. },
            ..,
        ] if *key as i32 == libc::NFT_CT_STATE
            && *op as i32 == libc::NFT_CMP_NEQ
            && u32_ne(data)? == 0 =>
        {
            (format!("ct state {}", ct_states(u32_ne(mask)?)), 3)
        }
        [
            Payload {
                base,
                offset,
                len,
                dreg: REG1,
            },
            rest @ ..,
        ] => payload_match(field(*base, *offset, *len, l4)?, rest, sets, table)?,
        [Immediate { data, .. }, Redir { .. }, ..] => {
            (format!("redirect to :{}", u16_be(data)?), 2)
        }
        [Immediate { data, .. }, Tproxy { family, .. }, ..] => {
            let f = match *family as i32 {
                libc::NFPROTO_IPV4 => "ip ",
                libc::NFPROTO_IPV6 => "ip6 ",
                _ => "",
            };
            (format!("tproxy {f}to :{}", u16_be(data)?), 2)
        }
        [Immediate { data, .. }, MetaSet { key, .. }, ..] if *key as i32 == libc::NFT_META_MARK => {
            (format!("meta mark set {:#010x}", u32_ne(data)?), 2)
        }
        [Immediate { data, .. }, CtSet { key, .. }, ..] if *key as i32 == libc::NFT_CT_ZONE => {
            let z = u16::from_ne_bytes(data.get(..2)?.try_into().ok()?);
            (format!("ct zone set {z}"), 2)
        }
        _ => return None,
    })
}

/// `meta mark & 0x00000fff != 0x00000539`.
fn masked(what: &str, mask: &[u8], op: u32, data: &[u8]) -> Option<String> {
    let op = match op as i32 {
        libc::NFT_CMP_EQ => "==",
        libc::NFT_CMP_NEQ => "!=",
        _ => return None,
    };
    Some(format!(
        "{what} & {:#010x} {op} {:#010x}",
        u32_ne(mask)?,
        u32_ne(data)?
    ))
}

/// `meta KEY [!=] VALUE` (the protocol also remembered for the port matches that follow).
fn meta_cmp(key: u32, op: u32, data: &[u8], l4: &mut &'static str) -> Option<String> {
    let n = neq(op)?;
    Some(match key as i32 {
        libc::NFT_META_L4PROTO => {
            let p = match data.first()? {
                6 => "tcp",
                17 => "udp",
                _ => return None,
            };
            *l4 = p;
            format!("meta l4proto {n}{p}")
        }
        libc::NFT_META_NFPROTO => match *data.first()? as i32 {
            libc::NFPROTO_IPV4 => format!("meta nfproto {n}ipv4"),
            libc::NFPROTO_IPV6 => format!("meta nfproto {n}ipv6"),
            _ => return None,
        },
        libc::NFT_META_OIFNAME | libc::NFT_META_IIFNAME => {
            let name = String::from_utf8_lossy(data.split(|b| *b == 0).next()?);
            let w = if key as i32 == libc::NFT_META_OIFNAME {
                "oifname"
            } else {
                "iifname"
            };
            format!("{w} {n}\"{name}\"")
        }
        libc::NFT_META_SKUID => format!("meta skuid {n}{}", u32_ne(data)?),
        libc::NFT_META_SKGID => format!("meta skgid {n}{}", u32_ne(data)?),
        libc::NFT_META_MARK => format!("meta mark {n}{:#010x}", u32_ne(data)?),
        _ => return None,
    })
}

/// The conntrack states of a `ct state` mask, in nft's words.
fn ct_states(mask: u32) -> String {
    [
        (1, "invalid"),
        (2, "established"),
        (4, "related"),
        (8, "new"),
    ]
    .iter()
    .filter(|(b, _)| mask & b != 0)
    .map(|(_, w)| *w)
    .collect::<Vec<_>>()
    .join(",")
}

/// A header field compared with a value, a prefix, or a set (`ip daddr != { ... }`).
fn payload_match(
    word: String,
    rest: &[Expr],
    sets: &[Set],
    table: &str,
) -> Option<(String, usize)> {
    use Expr::*;
    Some(match rest {
        [Cmp { op, data, .. }, ..] => (format!("{word} {}{}", neq(*op)?, value(&word, data)?), 2),
        [Bitwise { mask, .. }, Cmp { op, data, .. }, ..] => (
            format!("{word} {}{}/{}", neq(*op)?, addr(data)?, prefix_len(mask)),
            3,
        ),
        [Lookup { set, invert, .. }, ..] if !set.starts_with("__set") => {
            let n = if *invert { "!= " } else { "" };
            (format!("{word} {n}@{set}"), 2)
        }
        [Lookup { set, invert, .. }, ..] => {
            let s = sets.iter().find(|s| s.table == table && &s.name == set)?;
            let items = set_items(s, &word)?;
            let n = if *invert { "!= " } else { "" };
            (format!("{word} {n}{{ {} }}", items.join(", ")), 2)
        }
        _ => return None,
    })
}

fn field(base: u32, offset: u32, len: u32, l4: &str) -> Option<String> {
    Some(match (base as i32, offset, len) {
        (libc::NFT_PAYLOAD_NETWORK_HEADER, 12, 4) => "ip saddr".into(),
        (libc::NFT_PAYLOAD_NETWORK_HEADER, 16, 4) => "ip daddr".into(),
        (libc::NFT_PAYLOAD_NETWORK_HEADER, 8, 16) => "ip6 saddr".into(),
        (libc::NFT_PAYLOAD_NETWORK_HEADER, 24, 16) => "ip6 daddr".into(),
        (libc::NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2) => format!("{l4} sport"),
        (libc::NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2) => format!("{l4} dport"),
        _ => return None,
    })
}

fn value(word: &str, data: &[u8]) -> Option<String> {
    if word.ends_with("port") {
        Some(u16_be(data)?.to_string())
    } else {
        Some(capture::DisplayIp(addr(data)?).to_string())
    }
}

/// Set elements as nft writes them: ports, addresses, or CIDRs for interval sets.
fn set_items(s: &Set, word: &str) -> Option<Vec<String>> {
    if !s.interval {
        return s.elements.iter().map(|(k, _)| value(word, k)).collect();
    }
    let mut out = Vec::new();
    let els = &s.elements;
    for (i, (start, end)) in els.iter().enumerate() {
        if *end {
            continue;
        }
        let next = els.get(i + 1).map(|(k, _)| k.clone());
        out.push(range_text(start, next.as_deref())?);
    }
    Some(out)
}

/// `[start, end)` as a CIDR when it is one, else `a-b`.
fn range_text(start: &[u8], end: Option<&[u8]>) -> Option<String> {
    let bits = start.len() as u32 * 8;
    let to = |b: &[u8]| b.iter().fold(0u128, |a, x| (a << 8) | *x as u128);
    let s = to(start);
    let size = match end {
        Some(e) => to(e).wrapping_sub(s),
        None => (1u128 << (bits - 1)).wrapping_mul(2).wrapping_sub(s),
    };
    let a = addr(start)?;
    if size.is_power_of_two() && s % size == 0 {
        let prefix = bits - size.trailing_zeros();
        if prefix == bits {
            return Some(capture::DisplayIp(a).to_string());
        }
        return Some(format!("{}/{prefix}", capture::DisplayIp(a)));
    }
    let last = s.wrapping_add(size).wrapping_sub(1);
    let last = if bits == 32 {
        IpAddr::V4(Ipv4Addr::from(last as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(last))
    };
    Some(format!(
        "{}-{}",
        capture::DisplayIp(a),
        capture::DisplayIp(last)
    ))
}
