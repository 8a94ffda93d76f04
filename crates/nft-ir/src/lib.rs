//! Rules as the kernel holds them, typed: chains with their hook and priority, rules as the
//! kernel's expression lists (its numbers: `NFT_META_*`, `NFT_CMP_*`, registers), and the sets
//! rules look up. `explain` reads the live nft tables and the iptables-legacy tables into it
//! (one evaluator explains both backends); [`render`] writes a rule back in nft syntax, the one
//! renderer for every reader. Pure.

pub mod render;

use serde::Serialize;

/// Register 1 (data) and the verdict register, as nft uses them.
pub const REG1: u32 = libc::NFT_REG_1 as u32;
pub const REG_VERDICT: u32 = libc::NFT_REG_VERDICT as u32;

/// Which packets a table sees: `inet` both families, `ip`/`ip6` one (iptables' tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TableFamily {
    Inet,
    Ip,
    Ip6,
}

impl TableFamily {
    pub fn name(self) -> &'static str {
        match self {
            TableFamily::Inet => "inet",
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
        }
    }
    pub fn sees(self, ipv6: bool) -> bool {
        match self {
            TableFamily::Inet => true,
            TableFamily::Ip => !ipv6,
            TableFamily::Ip6 => ipv6,
        }
    }
}

/// The netfilter hooks our chains use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hook {
    Prerouting,
    Output,
    /// The node's host probe rule (ambient's kubelet-probe SNAT).
    Postrouting,
    /// Any other hook (not traversed by the connections we explain).
    Other,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
            Hook::Other => "other",
        }
    }
}

/// A base chain's type (nft's `type filter|nat|route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChainType {
    Filter,
    Nat,
    /// `route`: an output chain whose mark/address changes reroute the packet.
    Route,
}

impl ChainType {
    pub fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        }
    }
    /// The type nft names `name`; `None` for a type we do not know.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "filter" => Some(ChainType::Filter),
            "nat" => Some(ChainType::Nat),
            "route" => Some(ChainType::Route),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseHook {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

impl BaseHook {
    /// `nat` chains are consulted only for a connection's first packet, once per direction.
    pub fn nat(self) -> bool {
        self.kind == ChainType::Nat
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub family: TableFamily,
    pub table: String,
    pub name: String,
    pub base: Option<BaseHook>,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The kernel's handle (nft); `None` for iptables rules.
    pub handle: Option<u64>,
    /// 1-based position in its chain.
    pub position: usize,
    pub comment: Option<String>,
    /// The rule as a person writes it: nft syntax, or the iptables-save line.
    pub text: String,
    pub exprs: Vec<Expr>,
}

/// The name of nft's anonymous sets: `__set` and a number (`__set%d` in a batch, the kernel
/// picks the number).
pub const ANONYMOUS_SET: &str = "__set";

/// A set's key type, with nft's numbers (`NFTNL_SET_KEY_TYPE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetKey {
    Ipv4Addr,
    Ipv6Addr,
    /// A port (`inet_service`).
    InetService,
    /// Any other type, by its number.
    Other(u32),
}

impl SetKey {
    /// nft's number for the type (`TYPE_IPADDR` 7, `TYPE_IP6ADDR` 8, `TYPE_INET_SERVICE` 13).
    pub const fn id(self) -> u32 {
        match self {
            SetKey::Ipv4Addr => 7,
            SetKey::Ipv6Addr => 8,
            SetKey::InetService => 13,
            SetKey::Other(n) => n,
        }
    }
    pub fn from_id(id: u32) -> Self {
        match id {
            7 => SetKey::Ipv4Addr,
            8 => SetKey::Ipv6Addr,
            13 => SetKey::InetService,
            n => SetKey::Other(n),
        }
    }
    /// A key's length in bytes (0 for a type we do not know).
    pub const fn key_len(self) -> u32 {
        match self {
            SetKey::Ipv4Addr => 4,
            SetKey::Ipv6Addr => 16,
            SetKey::InetService => 2,
            SetKey::Other(_) => 0,
        }
    }
    /// The type as nft names it (`type ipv4_addr`).
    pub fn name(self) -> String {
        match self {
            SetKey::Ipv4Addr => "ipv4_addr".into(),
            SetKey::Ipv6Addr => "ipv6_addr".into(),
            SetKey::InetService => "inet_service".into(),
            SetKey::Other(n) => format!("type#{n}"),
        }
    }
}

/// A set: nft's anonymous sets `__setN`, a named set (its declaration: key type, flags,
/// comment; its elements as read), or a set the legacy reader made for a multiport/CIDR list
/// or an ipset. Interval sets hold `(start, false)` and `(end exclusive, true)` elements, as
/// the kernel does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub table: String,
    pub name: String,
    pub key: SetKey,
    pub interval: bool,
    pub comment: Option<String>,
    pub elements: Vec<(Vec<u8>, bool)>,
}

impl Set {
    /// The number of an anonymous set (`__setN`); `None` for a named set.
    pub fn anonymous_id(&self) -> Option<u32> {
        anonymous_id(&self.name)
    }
}

/// The number of an anonymous set's name (`__setN`); `None` for a named set.
pub fn anonymous_id(name: &str) -> Option<u32> {
    name.strip_prefix(ANONYMOUS_SET)?.parse().ok()
}

/// One expression, with the kernel's numbers (`NFT_META_*`, `NFT_CMP_*`, registers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Meta {
        key: u32,
        dreg: u32,
    },
    MetaSet {
        key: u32,
        sreg: u32,
    },
    Ct {
        key: u32,
        dreg: u32,
    },
    CtSet {
        key: u32,
        sreg: u32,
    },
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    Lookup {
        sreg: u32,
        set: String,
        invert: bool,
    },
    Immediate {
        dreg: u32,
        data: Vec<u8>,
    },
    Verdict(Verdict),
    Counter,
    /// `redirect`: to the port in `port_reg` (if any) on the local address.
    Redir {
        port_reg: Option<u32>,
    },
    /// `tproxy`: to the port in `port_reg`. When no transparent socket takes the packet, nft's
    /// tproxy just does not match (`miss_drops == false`); iptables' TPROXY target drops it.
    Tproxy {
        /// `NFPROTO_IPV4`/`NFPROTO_IPV6` (`tproxy ip|ip6`), 0 when not given.
        family: u32,
        port_reg: Option<u32>,
        miss_drops: bool,
    },
    /// `snat`/`dnat` to the address in `addr_reg` (`family`: `NFPROTO_IPV4`/`IPV6`).
    Nat {
        snat: bool,
        family: u32,
        addr_reg: Option<u32>,
        port_reg: Option<u32>,
    },
    /// Anything else: the evaluator stops and says so instead of guessing.
    Unknown(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "chain")]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Continue,
    Jump(String),
    Goto(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// Which rules a ruleset came from: the backend kind, defined once in `capture`.
pub use capture::Backend;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruleset {
    pub backend: Backend,
    pub chains: Vec<Chain>,
    pub sets: Vec<Set>,
}

impl Ruleset {
    pub fn chain(&self, family: TableFamily, table: &str, name: &str) -> Option<&Chain> {
        self.chains
            .iter()
            .find(|c| c.family == family && c.table == table && c.name == name)
    }

    pub fn set(&self, table: &str, name: &str) -> Option<&Set> {
        self.sets
            .iter()
            .find(|s| s.table == table && s.name == name)
    }

    /// The base chains on `hook` a packet of that family traverses, in priority order
    /// (raw -300, mangle -150, nat -100; ties in table order).
    pub fn base_chains(&self, hook: Hook, ipv6: bool) -> Vec<&Chain> {
        let mut v: Vec<&Chain> = self
            .chains
            .iter()
            .filter(|c| c.base.is_some_and(|b| b.hook == hook) && c.family.sees(ipv6))
            .collect();
        v.sort_by_key(|c| c.base.map(|b| b.priority));
        v
    }

    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// A rule by its kernel handle (nft), for matching trace events.
    pub fn rule_by_handle(&self, table: &str, handle: u64) -> Option<(&Chain, &Rule)> {
        self.chains
            .iter()
            .filter(|c| c.table == table)
            .flat_map(|c| c.rules.iter().map(move |r| (c, r)))
            .find(|(_, r)| r.handle == Some(handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader turns the kernel's names and numbers into these; the batch turns them back.
    #[test]
    fn chain_types_and_set_keys_round_trip() {
        for t in [ChainType::Filter, ChainType::Nat, ChainType::Route] {
            assert_eq!(ChainType::from_name(t.name()), Some(t));
        }
        assert_eq!(ChainType::from_name("bridge"), None);
        let keys = [
            SetKey::Ipv4Addr,
            SetKey::Ipv6Addr,
            SetKey::InetService,
            SetKey::Other(99),
        ];
        for k in keys {
            assert_eq!(SetKey::from_id(k.id()), k);
        }
        let nat = BaseHook {
            kind: ChainType::Nat,
            hook: Hook::Output,
            priority: -100,
        };
        assert!(nat.nat());
        assert!(
            !BaseHook {
                kind: ChainType::Route,
                ..nat
            }
            .nat()
        );
    }
}
