//! `Plan::build`: istio-iptables' `Run()` (tools/istio-iptables/pkg/capture/run.go), step by
//! step and in the same order, producing typed rules instead of iptables arguments.
//!
//! [`Plan::build`] reads as the table of contents of `Run()`: one named step per numbered block
//! of it, in order ([`inbound`]: 1-7, [`outbound`]: 8-13 and 15-18, [`dns`]: 14, [`tproxy`]:
//! 19). The facts each step needs are derived once, up front ([`Ctx`]); building is pure.

mod dns;
mod inbound;
mod outbound;
mod tproxy;

use crate::config::*;
use crate::constants::*;
use crate::ids::Id;
use crate::net::IpNet;
use crate::plan::*;
use std::net::IpAddr;

use ChainId::*;
use Table::*;

struct Builder {
    steps: Vec<Step>,
    ipv6: bool,
}

/// What the steps are built from: the configuration, and what istio-iptables derives from it
/// and from the namespace before it writes the first rule.
struct Ctx<'a> {
    cfg: &'a Config,
    /// DNS capture in force (off when no server is known and not capturing all DNS).
    redirect_dns: bool,
    /// The DNS servers captured (empty when capturing all DNS).
    dns_v4: Vec<IpNet>,
    dns_v6: Vec<IpNet>,
    exclude_v4: Vec<IpNet>,
    exclude_v6: Vec<IpNet>,
    include_v4: Vec<IpNet>,
    include_v6: Vec<IpNet>,
    /// `-i '*'`: every destination is captured.
    include_all: bool,
    /// A captured CIDR is a loopback one: traffic over lo is not exempted wholesale.
    include_has_loopback: bool,
    tproxy: bool,
    lo_v4: IpNet,
    lo_v6: IpNet,
}

fn rule(family: Family, matches: Vec<Match>, action: Action, comment: impl Into<String>) -> Rule {
    Rule {
        family,
        matches,
        action,
        comment: comment.into(),
    }
}

fn at(table: Table, chain: ChainId, at: Position, rule: Rule) -> PlacedRule {
    PlacedRule {
        table,
        chain,
        at,
        rule,
    }
}

fn app(table: Table, chain: ChainId, rule: Rule) -> PlacedRule {
    at(table, chain, Position::Append, rule)
}

fn tcp() -> Match {
    Match::Proto(L4::Tcp)
}

fn udp() -> Match {
    Match::Proto(L4::Udp)
}

fn dport(p: u16) -> Match {
    Match::DstPort {
        ports: vec![p],
        negate: false,
    }
}

fn ports(p: &[u16]) -> Match {
    Match::DstPort {
        ports: p.to_vec(),
        negate: false,
    }
}

fn not_dport(p: &[u16]) -> Match {
    Match::DstPort {
        ports: p.to_vec(),
        negate: true,
    }
}

fn daddr(n: IpNet) -> Match {
    Match::Daddr {
        nets: vec![n],
        negate: false,
    }
}

fn daddrs(n: &[IpNet]) -> Match {
    Match::Daddr {
        nets: n.to_vec(),
        negate: false,
    }
}

fn not_daddr(n: IpNet) -> Match {
    Match::Daddr {
        nets: vec![n],
        negate: true,
    }
}

fn saddr(n: IpNet) -> Match {
    Match::Saddr {
        nets: vec![n],
        negate: false,
    }
}

fn lo_out() -> Match {
    Match::OutIface(vec!["lo".into()])
}

fn lo_in() -> Match {
    Match::InIface(vec!["lo".into()])
}

fn net(s: &str) -> IpNet {
    s.parse().expect("constant prefix")
}

/// Owner match for one uid or gid of the proxy.
#[derive(Clone, Copy)]
enum Owner {
    Uid,
    Gid,
}

impl Owner {
    fn is(self, id: &Id) -> Match {
        self.matching(id, false)
    }
    fn is_not(self, id: &Id) -> Match {
        self.matching(id, true)
    }
    fn matching(self, id: &Id, negate: bool) -> Match {
        match self {
            Owner::Uid => Match::Uid {
                ids: vec![id.clone()],
                negate,
            },
            Owner::Gid => Match::Gid {
                ids: vec![id.clone()],
                negate,
            },
        }
    }
    fn word(self) -> &'static str {
        match self {
            Owner::Uid => "uid",
            Owner::Gid => "gid",
        }
    }
}

impl Builder {
    /// Adds one step, dropping IPv6 rules when IPv6 is off and rules whose "any of" list is
    /// empty (istio-iptables loops over nothing).
    fn step(&mut self, rules: Vec<PlacedRule>) {
        let rules: Vec<PlacedRule> = rules
            .into_iter()
            .filter(|r| self.ipv6 || r.rule.family != Family::V6)
            .filter(|r| r.rule.matches.iter().all(|m| m.alternatives() > 0))
            .collect();
        if !rules.is_empty() {
            self.steps.push(Step(rules));
        }
    }

    fn push(&mut self, r: PlacedRule) {
        self.step(vec![r]);
    }
}

/// Split a CIDR list by family; whether any prefix is a loopback address.
fn split_families(nets: &[IpNet]) -> (Vec<IpNet>, Vec<IpNet>) {
    nets.iter().partition(|n| n.is_ipv4())
}

fn is_loopback(n: &IpNet) -> bool {
    n.addr.is_loopback()
}

/// Istio's `getLocalIP`: the family of the first global address decides; with dual stack any
/// global IPv6 address turns IPv6 on.
pub fn detect_ipv6(addrs: &[IpAddr], dual_stack: bool) -> Option<bool> {
    let mut found = None;
    for a in addrs {
        let link_local = match a {
            IpAddr::V4(v4) => {
                v4.is_link_local()
                    || (v4.octets()[0] == 224 && v4.octets()[1] == 0 && v4.octets()[2] == 0)
            }
            IpAddr::V6(v6) => {
                (v6.segments()[0] & 0xffc0) == 0xfe80 || (v6.segments()[0] & 0xff0f) == 0xff02
            }
        };
        if a.is_loopback() || link_local {
            continue;
        }
        if !dual_stack {
            return Some(a.is_ipv6());
        }
        if a.is_ipv6() {
            return Some(true);
        }
        found = Some(false);
    }
    found
}

impl<'a> Ctx<'a> {
    /// istio-iptables' derived settings (`FillConfigFromEnvironment` and the top of `Run()`);
    /// the warnings say what was tolerated.
    fn derive(cfg: &'a Config, facts: &Facts) -> (Ctx<'a>, Vec<String>) {
        let mut warnings = Vec::new();
        // DNS capture: resolv.conf servers unless capturing all DNS (istio-reference §1.3).
        let dns_servers: Vec<IpAddr> = if cfg.redirect_dns && !cfg.capture_all_dns {
            cfg.dns_servers
                .clone()
                .unwrap_or_else(|| facts.resolv_conf_servers.clone())
        } else {
            Vec::new()
        };
        let hosts = |v6: bool| -> Vec<IpNet> {
            dns_servers
                .iter()
                .filter(|a| a.is_ipv6() == v6)
                .map(|a| IpNet::host(*a))
                .collect()
        };
        let mut redirect_dns = cfg.redirect_dns;
        if redirect_dns && !cfg.capture_all_dns && dns_servers.is_empty() {
            warnings.push(
                "DNS capture is on, but capture-all-dns is off and no DNS servers are known: DNS capture disabled".into(),
            );
            redirect_dns = false;
        }
        let (exclude_v4, exclude_v6) = split_families(&cfg.outbound_ranges_exclude);
        let (include_v4, include_v6, include_all) = match &cfg.outbound_ranges {
            OutboundRanges::All => (Vec::new(), Vec::new(), true),
            OutboundRanges::List(l) => {
                let (a, b) = split_families(l);
                (a, b, false)
            }
            OutboundRanges::None => (Vec::new(), Vec::new(), false),
        };
        let include_has_loopback = include_v4.iter().chain(&include_v6).any(is_loopback);
        let ctx = Ctx {
            cfg,
            redirect_dns,
            dns_v4: hosts(false),
            dns_v6: hosts(true),
            exclude_v4,
            exclude_v6,
            include_v4,
            include_v6,
            include_all,
            include_has_loopback,
            tproxy: cfg.inbound_mode == InterceptionMode::Tproxy,
            lo_v4: cfg.host_ipv4_loopback,
            lo_v6: net(LOOPBACK_V6),
        };
        (ctx, warnings)
    }
}

impl Plan {
    /// Builds the plan for `cfg` in the namespace described by `facts`: istio-iptables'
    /// `Run()`, its numbered steps in order.
    pub fn build(cfg: &Config, facts: &Facts) -> Result<Plan, ConfigError> {
        let ipv6 = match cfg.ipv6 {
            Ipv6Mode::On => true,
            Ipv6Mode::Off => false,
            Ipv6Mode::Auto => detect_ipv6(&facts.local_addrs, cfg.dual_stack).ok_or_else(|| {
                ConfigError::new(
                    "--ipv6",
                    "auto",
                    "the namespace has no non-loopback address to detect the IP family from; pass --ipv6 on or --ipv6 off",
                )
            })?,
        };
        let (c, warnings) = Ctx::derive(cfg, facts);
        let mut b = Builder {
            steps: Vec::new(),
            ipv6,
        };
        // Inbound (1-7).
        b.excluded_interfaces(&c);
        b.virtual_interfaces_are_not_inbound(&c);
        b.drop_invalid(&c);
        b.redirect_chains(&c);
        b.inbound_capture(&c);
        // Outbound (8-18).
        b.outbound_entry();
        b.excluded_outbound_ports(&c);
        b.inbound_passthrough();
        b.proxy_own_traffic(&c);
        b.owner_groups(&c);
        b.dns(&c);
        b.localhost(&c);
        b.excluded_cidrs(&c);
        b.always_captured_ports(&c);
        b.captured_destinations(&c);
        // TPROXY (19).
        b.tproxy_marks(&c);
        let captures_inbound = cfg.inbound_ports != InboundPorts::None;
        Ok(Plan {
            steps: b.steps,
            ipv6,
            tproxy_routes: (c.tproxy && captures_inbound).then_some(TproxyRoutes {
                mark: cfg.tproxy_mark,
                table: cfg.tproxy_route_table,
                ipv6,
                mask: None,
                priority: None,
            }),
            ipv6_passthrough_addr: ipv6,
            warnings,
            sets: Vec::new(),
        })
    }
}
