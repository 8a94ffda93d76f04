//! The ordered, typed rule plan every backend renders.
//!
//! A plan is a list of `Step`s in istio-iptables' order. A step holds one or more rules; a rule
//! may carry a positive match with several values ("any of these ports"). iptables cannot say
//! "any of", so the legacy backend expands such rules into one rule per value, value by value
//! across the whole step, which reproduces Istio's loops byte for byte. nftables says it with
//! one anonymous set. `Plan::chains` computes the final order of every chain in memory, so no
//! backend ever needs "insert at index".

use crate::ids::Id;
use crate::net::IpNet;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Istio's tables: the sidecar's three and ambient's three (the same netfilter tables in
/// iptables, separate `inet` tables in nftables). The order is iptables-restore's
/// (alphabetical) within each data plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Mangle,
    Nat,
    Raw,
    AmbientMangle,
    AmbientNat,
    AmbientRaw,
}

impl Table {
    /// The sidecar's tables, in nftables creation order.
    pub const ALL: [Table; 3] = [Table::Nat, Table::Mangle, Table::Raw];
    /// Ambient's tables (in-pod; the host rules use `AmbientNat` only), same order.
    pub const AMBIENT: [Table; 3] = [Table::AmbientNat, Table::AmbientMangle, Table::AmbientRaw];

    /// The netfilter table this one is in iptables (`nat` for both `Nat` and `AmbientNat`).
    pub fn netfilter(self) -> Table {
        match self {
            Table::Mangle | Table::AmbientMangle => Table::Mangle,
            Table::Nat | Table::AmbientNat => Table::Nat,
            Table::Raw | Table::AmbientRaw => Table::Raw,
        }
    }

    pub fn is_ambient(self) -> bool {
        self != self.netfilter()
    }

    pub fn iptables_name(self) -> &'static str {
        match self.netfilter() {
            Table::Mangle => "mangle",
            Table::Nat => "nat",
            _ => "raw",
        }
    }

    /// Istio's nft mode table names, all in the `inet` family.
    pub fn nft_name(self) -> &'static str {
        match self {
            Table::Mangle => "istio-proxy-mangle",
            Table::Nat => "istio-proxy-nat",
            Table::Raw => "istio-proxy-raw",
            Table::AmbientMangle => "istio-ambient-mangle",
            Table::AmbientNat => "istio-ambient-nat",
            Table::AmbientRaw => "istio-ambient-raw",
        }
    }

    /// Position in nftables creation order (nat, mangle, raw).
    fn creation_rank(self) -> usize {
        match self.netfilter() {
            Table::Nat => 0,
            Table::Mangle => 1,
            _ => 2,
        }
    }
}

/// The chains istio-iptables uses. `Prerouting`/`Output` are the built-in (nft: base) chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainId {
    Prerouting,
    Output,
    Postrouting,
    Inbound,
    Redirect,
    InRedirect,
    IstioOutput,
    OutputDns,
    Divert,
    Tproxy,
    Drop,
    /// Ambient's in-pod prerouting chain.
    IstioPrerouting,
    /// Ambient's host postrouting chain (kubelet probe SNAT).
    IstioPostrouting,
}

impl ChainId {
    pub fn is_builtin(self) -> bool {
        matches!(
            self,
            ChainId::Prerouting | ChainId::Output | ChainId::Postrouting
        )
    }

    pub fn iptables_name(self) -> &'static str {
        match self {
            ChainId::Prerouting => "PREROUTING",
            ChainId::Output => "OUTPUT",
            ChainId::Postrouting => "POSTROUTING",
            ChainId::Inbound => "ISTIO_INBOUND",
            ChainId::Redirect => "ISTIO_REDIRECT",
            ChainId::InRedirect => "ISTIO_IN_REDIRECT",
            ChainId::IstioOutput => "ISTIO_OUTPUT",
            ChainId::OutputDns => "ISTIO_OUTPUT_DNS",
            ChainId::Divert => "ISTIO_DIVERT",
            ChainId::Tproxy => "ISTIO_TPROXY",
            ChainId::Drop => "ISTIO_DROP",
            ChainId::IstioPrerouting => "ISTIO_PRERT",
            ChainId::IstioPostrouting => "ISTIO_POSTRT",
        }
    }

    pub fn nft_name(self) -> &'static str {
        match self {
            ChainId::Prerouting => "prerouting",
            ChainId::Output => "output",
            ChainId::Postrouting => "postrouting",
            ChainId::Inbound => "istio-inbound",
            ChainId::Redirect => "istio-redirect",
            ChainId::InRedirect => "istio-in-redirect",
            ChainId::IstioOutput => "istio-output",
            ChainId::OutputDns => "istio-output-dns",
            ChainId::Divert => "istio-divert",
            ChainId::Tproxy => "istio-tproxy",
            ChainId::Drop => "istio-drop",
            ChainId::IstioPrerouting => "istio-prerouting",
            ChainId::IstioPostrouting => "istio-postrouting",
        }
    }
}

/// Which IP family a rule applies to. `Any` rules match both (iptables: emitted into both
/// payloads; nft: no family match, or `meta nfproto ipv4` when IPv6 is off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Any,
    V4,
    V6,
}

impl Family {
    pub fn includes(self, v6: bool) -> bool {
        match self {
            Family::Any => true,
            Family::V4 => !v6,
            Family::V6 => v6,
        }
    }
}

/// Where istio-iptables puts a rule: appended, or inserted at a 1-based position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    Append,
    Insert(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum L4 {
    Tcp,
    Udp,
}

impl L4 {
    pub fn name(self) -> &'static str {
        match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtState {
    Invalid,
    Established,
    Related,
}

/// One condition of a rule. A list with several values in a positive match means "any of";
/// in a negated match it means "none of". Matches are kept in istio-iptables' argument order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    InIface(Vec<String>),
    OutIface(Vec<String>),
    Proto(L4),
    DstPort {
        ports: Vec<u16>,
        negate: bool,
    },
    SrcPort(u16),
    Daddr {
        nets: Vec<IpNet>,
        negate: bool,
    },
    Saddr {
        nets: Vec<IpNet>,
        negate: bool,
    },
    Uid {
        ids: Vec<Id>,
        negate: bool,
    },
    Gid {
        ids: Vec<Id>,
        negate: bool,
    },
    Mark {
        mark: u32,
        negate: bool,
    },
    ConnMark(u32),
    CtState(Vec<CtState>),
    /// `! -o IFACE` / `oifname != IFACE`.
    NotOutIface(String),
    /// iptables' explicit `-m tcp` / `-m udp` module load. It matches nothing by itself
    /// (the `-p` match does); kept so the legacy payload is Istio's byte for byte.
    L4Module(L4),
    /// One address as Istio writes it, without a prefix length (`-s 169.254.7.127`).
    FromAddr(IpAddr),
    /// One address as Istio writes it, without a prefix length (`-d 169.254.7.127`).
    ToAddr(IpAddr),
    /// `-m mark [!] --mark M/MASK` / `meta mark & MASK [!=|==] M`.
    MarkMasked {
        mark: u32,
        mask: u32,
        negate: bool,
    },
    /// `-m connmark --mark M/MASK` / `ct mark & MASK == M`.
    ConnMarkMasked {
        mark: u32,
        mask: u32,
    },
    /// Destination in a named address set of the plan (`-m set --match-set NAME dst` /
    /// `ip daddr @NAME`). The set's family decides the rule's.
    DaddrInSet(String),
    /// The packet belongs to a local socket (`-m owner --socket-exists`; nft has no
    /// equivalent and uses `meta skuid >= 0`, which needs the same full socket).
    SocketExists,
}

impl Match {
    /// Number of alternatives of a positive multi-value match (1 for everything else).
    pub fn alternatives(&self) -> usize {
        match self {
            Match::InIface(v) | Match::OutIface(v) => v.len(),
            Match::DstPort {
                ports,
                negate: false,
            } => ports.len(),
            Match::Daddr {
                nets,
                negate: false,
            }
            | Match::Saddr {
                nets,
                negate: false,
            } => nets.len(),
            Match::Uid { ids, negate: false } | Match::Gid { ids, negate: false } => ids.len(),
            _ => 1,
        }
    }

    /// The same match with only its `i`-th alternative.
    pub fn alternative(&self, i: usize) -> Match {
        match self {
            Match::InIface(v) => Match::InIface(vec![v[i].clone()]),
            Match::OutIface(v) => Match::OutIface(vec![v[i].clone()]),
            Match::DstPort {
                ports,
                negate: false,
            } => Match::DstPort {
                ports: vec![ports[i]],
                negate: false,
            },
            Match::Daddr {
                nets,
                negate: false,
            } => Match::Daddr {
                nets: vec![nets[i]],
                negate: false,
            },
            Match::Saddr {
                nets,
                negate: false,
            } => Match::Saddr {
                nets: vec![nets[i]],
                negate: false,
            },
            Match::Uid { ids, negate: false } => Match::Uid {
                ids: vec![ids[i].clone()],
                negate: false,
            },
            Match::Gid { ids, negate: false } => Match::Gid {
                ids: vec![ids[i].clone()],
                negate: false,
            },
            other => other.clone(),
        }
    }
}

/// What a rule does when it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Return,
    Jump(ChainId),
    Accept,
    Drop,
    /// NAT the destination to a local port (`REDIRECT --to-ports`, nft `redirect to :P`).
    Redirect {
        port: u16,
    },
    /// Deliver to a local transparent socket and mark (`TPROXY`). Like iptables, the
    /// packet is dropped when no socket listens, so inbound traffic never bypasses Envoy.
    Tproxy {
        port: u16,
        mark: u32,
    },
    SetMark(u32),
    /// `CONNMARK --save-mark` / `ct mark set meta mark`.
    SaveMark,
    /// `CONNMARK --restore-mark` / `meta mark set ct mark`.
    RestoreMark,
    /// `CT --zone N` / `ct zone set N`.
    CtZone(u16),
    /// `CONNMARK --set-xmark V/MASK` / `ct mark set ct mark & ~MASK | V` (V within MASK, so
    /// xor and or agree).
    SetConnMarkMasked {
        value: u32,
        mask: u32,
    },
    /// `CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff` as Istio's ambient
    /// rules spell it: the same as `RestoreMark`.
    RestoreMarkFullMasks,
    /// `SNAT --to-source A` / `snat ip|ip6 to A`.
    Snat(IpAddr),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub family: Family,
    pub matches: Vec<Match>,
    pub action: Action,
    /// What the rule is for, shown by `nft list ruleset` (at most 128 bytes).
    pub comment: String,
}

impl Rule {
    pub fn alternatives(&self) -> usize {
        self.matches
            .iter()
            .map(Match::alternatives)
            .max()
            .unwrap_or(1)
    }

    fn alternative(&self, i: usize, split: &impl Fn(&Match) -> bool) -> Rule {
        Rule {
            matches: self
                .matches
                .iter()
                .map(|m| {
                    if split(m) && m.alternatives() > 1 {
                        m.alternative(i)
                    } else {
                        m.clone()
                    }
                })
                .collect(),
            ..self.clone()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedRule {
    pub table: Table,
    pub chain: ChainId,
    pub at: Position,
    pub rule: Rule,
}

/// Rules istio-iptables emits together in one loop over the same values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step(pub Vec<PlacedRule>);

/// Policy routing TPROXY needs: `ip rule fwmark M[/MASK] [pref P] lookup T` and
/// `local default dev lo table T`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TproxyRoutes {
    pub mark: u32,
    pub table: u32,
    pub ipv6: bool,
    /// `fwmark M/MASK` (ambient: 0x111/0xfff); `None` = the whole mark.
    pub mask: Option<u32>,
    /// `pref P` (ambient: 32764); `None` = the kernel picks.
    pub priority: Option<u32>,
}

/// A named address set the plan's rules look up (`-m set` / `@NAME`). In nftables it lives
/// in `table` and its elements are managed on their own (pods come and go); iptables' ipsets
/// are outside the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedSet {
    pub table: Table,
    pub name: String,
    pub v6: bool,
    pub comment: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Whether IPv6 rules are installed (else IPv6 traffic is left untouched).
    pub ipv6: bool,
    /// Set in TPROXY mode with inbound capture.
    pub tproxy_routes: Option<TproxyRoutes>,
    /// Add `::6/128` to lo (IPv6 has no 127/8 to bind the inbound passthrough source from).
    pub ipv6_passthrough_addr: bool,
    /// Things the operator should know (e.g. DNS capture disabled for lack of servers).
    pub warnings: Vec<String>,
    /// Named sets rules refer to (ambient host rules), created with the plan's tables.
    pub sets: Vec<NamedSet>,
}

/// A chain's final content, in evaluation order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainRules {
    pub table: Table,
    pub chain: ChainId,
    pub rules: Vec<Rule>,
}

impl Plan {
    /// Rules in istio-iptables' emission order. Positive multi-value matches for which `split`
    /// is true are expanded into one rule per value, value by value across each step.
    pub fn ops(&self, split: impl Fn(&Match) -> bool) -> Vec<PlacedRule> {
        let mut out = Vec::new();
        for step in &self.steps {
            let n = step
                .0
                .iter()
                .map(|r| split_count(&r.rule, &split))
                .max()
                .unwrap_or(1);
            for i in 0..n {
                for placed in &step.0 {
                    if split_count(&placed.rule, &split) > 1 || i == 0 {
                        out.push(PlacedRule {
                            rule: placed.rule.alternative(i, &split),
                            ..placed.clone()
                        });
                    }
                }
            }
        }
        out
    }

    /// Final content of every non-empty chain, in the order nftables should create them:
    /// per table, built-in chains first, then the others in order of first use. IPv4 and IPv6
    /// orders are computed separately (inserts count positions per family, as in iptables)
    /// and merged, family-specific rules placed v4 first, as Istio's nft mode does.
    pub fn chains(&self, split: impl Fn(&Match) -> bool) -> Vec<ChainRules> {
        let ops = self.ops(split);
        let v4 = final_order(&ops, false);
        let v6 = if self.ipv6 {
            final_order(&ops, true)
        } else {
            BTreeMap::new()
        };

        let mut order: Vec<(Table, ChainId)> = Vec::new();
        let mut note = |key: (Table, ChainId)| {
            if !order.contains(&key) {
                order.push(key);
            }
        };
        for op in &ops {
            note((op.table, op.chain));
            if let Action::Jump(target) = op.rule.action {
                note((op.table, target));
            }
        }
        order.sort_by_key(|(t, c)| (t.creation_rank(), !c.is_builtin()));
        // `sort_by_key` is stable, so first-use order survives within each group.

        order
            .into_iter()
            .map(|key| {
                let a = v4.get(&key).map(Vec::as_slice).unwrap_or_default();
                let b = v6.get(&key).map(Vec::as_slice).unwrap_or_default();
                ChainRules {
                    table: key.0,
                    chain: key.1,
                    rules: merge(a, b)
                        .into_iter()
                        .map(|i| ops[i].rule.clone())
                        .collect(),
                }
            })
            .collect()
    }

    /// Tables that get at least one rule, in nftables creation order (nat, mangle, raw).
    pub fn tables(&self) -> Vec<Table> {
        Table::ALL
            .into_iter()
            .chain(Table::AMBIENT)
            .filter(|t| self.steps.iter().any(|s| s.0.iter().any(|r| r.table == *t)))
            .collect()
    }

    /// The tables this plan owns in its namespace: a re-apply replaces them, cleanup deletes
    /// them. A sidecar plan owns the sidecar's three, an ambient plan ambient's three.
    pub fn owned_tables(&self) -> &'static [Table] {
        if self.tables().iter().any(|t| t.is_ambient()) {
            &Table::AMBIENT
        } else {
            &Table::ALL
        }
    }
}

fn split_count(rule: &Rule, split: &impl Fn(&Match) -> bool) -> usize {
    rule.matches
        .iter()
        .filter(|m| split(m))
        .map(Match::alternatives)
        .max()
        .unwrap_or(1)
}

/// Replays appends and inserts for one family; returns op indices per chain.
fn final_order(ops: &[PlacedRule], v6: bool) -> BTreeMap<(Table, ChainId), Vec<usize>> {
    let mut chains: BTreeMap<(Table, ChainId), Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if !op.rule.family.includes(v6) {
            continue;
        }
        let chain = chains.entry((op.table, op.chain)).or_default();
        match op.at {
            Position::Append => chain.push(i),
            Position::Insert(pos) => chain.insert((pos.max(1) as usize - 1).min(chain.len()), i),
        }
    }
    chains
}

/// Merges the IPv4 and IPv6 orders of one chain. Shared (`Any`) rules appear in both in the
/// same relative order; family-specific rules are placed before the next shared rule.
fn merge(v4: &[usize], v6: &[usize]) -> Vec<usize> {
    let in_v6: std::collections::HashSet<usize> = v6.iter().copied().collect();
    let in_v4: std::collections::HashSet<usize> = v4.iter().copied().collect();
    let mut emitted = std::collections::HashSet::new();
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(v4.len() + v6.len());
    while i < v4.len() || j < v6.len() {
        // A shared rule already placed from the other list is behind us in both orders.
        if i < v4.len() && emitted.contains(&v4[i]) {
            i += 1;
            continue;
        }
        if j < v6.len() && emitted.contains(&v6[j]) {
            j += 1;
            continue;
        }
        let pick = if i < v4.len() && !in_v6.contains(&v4[i]) {
            i += 1;
            v4[i - 1]
        } else if j < v6.len() && !in_v4.contains(&v6[j]) {
            j += 1;
            v6[j - 1]
        } else if i < v4.len() {
            i += 1;
            v4[i - 1]
        } else {
            j += 1;
            v6[j - 1]
        };
        emitted.insert(pick);
        out.push(pick);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn merge_keeps_family_rules_before_the_next_shared_rule() {
        // shared: 0, 3, 6; v4-only: 1, 4; v6-only: 2, 5
        assert_eq!(
            merge(&[0, 1, 3, 4, 6], &[0, 2, 3, 5, 6]),
            vec![0, 1, 2, 3, 4, 5, 6]
        );
        // v6 starts with a family rule, v4 with a shared one.
        assert_eq!(merge(&[0, 3], &[2, 0, 5, 3]), vec![2, 0, 5, 3]);
    }
}
