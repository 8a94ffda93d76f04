//! `Plan::build`: istio-iptables' `Run()` (tools/istio-iptables/pkg/capture/run.go), step by
//! step and in the same order, producing typed rules instead of iptables arguments.

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

impl Plan {
    /// Builds the plan for `cfg` in the namespace described by `facts`.
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
        let mut warnings = Vec::new();

        // DNS capture: resolv.conf servers unless capturing all DNS (istio-reference §1.3).
        let dns_servers: Vec<IpAddr> = if cfg.redirect_dns && !cfg.capture_all_dns {
            cfg.dns_servers
                .clone()
                .unwrap_or_else(|| facts.resolv_conf_servers.clone())
        } else {
            Vec::new()
        };
        let dns_v4: Vec<IpNet> = dns_servers
            .iter()
            .filter(|a| a.is_ipv4())
            .map(|a| IpNet::host(*a))
            .collect();
        let dns_v6: Vec<IpNet> = dns_servers
            .iter()
            .filter(|a| a.is_ipv6())
            .map(|a| IpNet::host(*a))
            .collect();
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

        let tproxy = cfg.inbound_mode == InterceptionMode::Tproxy;
        let lo_v4 = cfg.host_ipv4_loopback;
        let lo_v6 = net(LOOPBACK_V6);
        let mut b = Builder {
            steps: Vec::new(),
            ipv6,
        };
        let any = Family::Any;

        // 1. Excluded interfaces: nothing on them is captured.
        let nics = &cfg.exclude_interfaces;
        b.step(vec![
            app(
                Nat,
                Prerouting,
                rule(
                    any,
                    vec![Match::InIface(nics.clone())],
                    Action::Return,
                    "excluded interface: inbound not captured",
                ),
            ),
            app(
                Nat,
                Output,
                rule(
                    any,
                    vec![Match::OutIface(nics.clone())],
                    Action::Return,
                    "excluded interface: outbound not captured",
                ),
            ),
        ]);
        if tproxy {
            b.step(vec![
                app(
                    Mangle,
                    Prerouting,
                    rule(
                        any,
                        vec![Match::InIface(nics.clone())],
                        Action::Return,
                        "excluded interface: inbound not captured",
                    ),
                ),
                app(
                    Mangle,
                    Output,
                    rule(
                        any,
                        vec![Match::OutIface(nics.clone())],
                        Action::Return,
                        "excluded interface: outbound not captured",
                    ),
                ),
            ]);
        }

        // 2. Virtual (KubeVirt) interfaces are not inbound traffic.
        let virt = &cfg.reroute_virtual_interfaces;
        b.push(at(
            Nat,
            Prerouting,
            Position::Insert(1),
            rule(
                any,
                vec![Match::InIface(virt.clone())],
                Action::Return,
                "virtual interface: not inbound traffic",
            ),
        ));

        // 3. Drop invalid packets rather than let conntrack reset the connection.
        if cfg.drop_invalid {
            b.push(app(
                Mangle,
                Prerouting,
                rule(
                    any,
                    vec![Match::CtState(vec![CtState::Invalid])],
                    Action::Jump(Drop),
                    "drop invalid packets",
                ),
            ));
            b.push(app(
                Mangle,
                Drop,
                rule(any, vec![], Action::Drop, "drop invalid packets"),
            ));
        }

        // 4-6. Tunnel port bypass and the two redirect chains.
        b.push(app(
            Nat,
            Inbound,
            rule(
                any,
                vec![tcp(), dport(cfg.inbound_tunnel_port)],
                Action::Return,
                "HBONE tunnel port: not captured",
            ),
        ));
        b.push(app(
            Nat,
            Redirect,
            rule(
                any,
                vec![tcp()],
                Action::Redirect {
                    port: cfg.proxy_port,
                },
                "redirect outbound to Envoy",
            ),
        ));
        b.push(app(
            Nat,
            InRedirect,
            rule(
                any,
                vec![tcp()],
                Action::Redirect {
                    port: cfg.inbound_capture_port,
                },
                "redirect inbound to Envoy",
            ),
        ));

        // 7. Inbound capture.
        if cfg.inbound_ports != InboundPorts::None {
            let table = if tproxy { Mangle } else { Nat };
            if tproxy {
                b.push(app(
                    Mangle,
                    Divert,
                    rule(
                        any,
                        vec![],
                        Action::SetMark(cfg.tproxy_mark),
                        "mark established inbound for policy routing",
                    ),
                ));
                b.push(app(
                    Mangle,
                    Divert,
                    rule(any, vec![], Action::Accept, "accept established inbound"),
                ));
                let tp = Action::Tproxy {
                    port: cfg.inbound_capture_port,
                    mark: cfg.tproxy_mark,
                };
                b.push(app(
                    Mangle,
                    Tproxy,
                    rule(
                        Family::V4,
                        vec![not_daddr(lo_v4), tcp()],
                        tp.clone(),
                        "TPROXY inbound to Envoy",
                    ),
                ));
                b.push(app(
                    Mangle,
                    Tproxy,
                    rule(
                        Family::V6,
                        vec![not_daddr(lo_v6), tcp()],
                        tp,
                        "TPROXY inbound to Envoy",
                    ),
                ));
            }
            b.push(app(
                table,
                Prerouting,
                rule(any, vec![tcp()], Action::Jump(Inbound), "inbound TCP"),
            ));
            match &cfg.inbound_ports {
                InboundPorts::All => {
                    b.push(app(
                        table,
                        Inbound,
                        rule(
                            any,
                            vec![tcp(), ports(&cfg.inbound_ports_exclude)],
                            Action::Return,
                            "inbound port excluded from capture",
                        ),
                    ));
                    if tproxy {
                        b.push(app(
                            Mangle,
                            Inbound,
                            rule(
                                any,
                                vec![
                                    tcp(),
                                    Match::CtState(vec![CtState::Related, CtState::Established]),
                                ],
                                Action::Jump(Divert),
                                "established inbound",
                            ),
                        ));
                        b.push(app(
                            Mangle,
                            Inbound,
                            rule(
                                any,
                                vec![tcp()],
                                Action::Jump(Tproxy),
                                "new inbound connection to Envoy",
                            ),
                        ));
                    } else {
                        b.push(app(
                            Nat,
                            Inbound,
                            rule(
                                any,
                                vec![tcp()],
                                Action::Jump(InRedirect),
                                "inbound to Envoy",
                            ),
                        ));
                    }
                }
                InboundPorts::List(list) => {
                    if tproxy {
                        b.step(vec![
                            app(
                                Mangle,
                                Inbound,
                                rule(
                                    any,
                                    vec![
                                        tcp(),
                                        ports(list),
                                        Match::CtState(vec![
                                            CtState::Related,
                                            CtState::Established,
                                        ]),
                                    ],
                                    Action::Jump(Divert),
                                    "established inbound on a captured port",
                                ),
                            ),
                            app(
                                Mangle,
                                Inbound,
                                rule(
                                    any,
                                    vec![tcp(), ports(list)],
                                    Action::Jump(Tproxy),
                                    "new inbound connection on a captured port",
                                ),
                            ),
                        ]);
                    } else {
                        b.push(app(
                            Nat,
                            Inbound,
                            rule(
                                any,
                                vec![tcp(), ports(list)],
                                Action::Jump(InRedirect),
                                "inbound port captured",
                            ),
                        ));
                    }
                }
                InboundPorts::None => unreachable!(),
            }
        }

        // 8. All outbound goes through ISTIO_OUTPUT (UDP is filtered inside).
        b.push(app(
            Nat,
            Output,
            rule(any, vec![], Action::Jump(IstioOutput), "outbound"),
        ));

        // 9. Excluded outbound ports, before the self-redirect logic.
        let ox = &cfg.outbound_ports_exclude;
        b.step(vec![
            app(
                Nat,
                IstioOutput,
                rule(
                    any,
                    vec![tcp(), ports(ox)],
                    Action::Return,
                    "outbound port excluded from capture",
                ),
            ),
            app(
                Nat,
                IstioOutput,
                rule(
                    any,
                    vec![udp(), ports(ox)],
                    Action::Return,
                    "outbound port excluded from capture",
                ),
            ),
        ]);

        // 10. Inbound passthrough: Envoy forwards to the app from 127.0.0.6 / ::6.
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V4,
                vec![lo_out(), saddr(net(INBOUND_PASSTHROUGH_V4))],
                Action::Return,
                "inbound passthrough from Envoy (127.0.0.6)",
            ),
        ));
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V6,
                vec![lo_out(), saddr(net(INBOUND_PASSTHROUGH_V6))],
                Action::Return,
                "inbound passthrough from Envoy (::6)",
            ),
        ));

        // 11-12. Envoy's own traffic, per uid then per gid.
        let tunnel = cfg.inbound_tunnel_port;
        for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
            for id in ids {
                let w = owner.word();
                // a. Envoy calling its own pod (app -> VIP -> Envoy -> own pod IP): inbound path.
                // The DNS variant also skips port 53, for uids only (as istio-iptables).
                let skip = if redirect_dns && matches!(owner, Owner::Uid) {
                    vec![53, tunnel]
                } else {
                    vec![tunnel]
                };
                for (family, lo) in [(Family::V4, lo_v4), (Family::V6, lo_v6)] {
                    b.push(app(
                        Nat,
                        IstioOutput,
                        rule(
                            family,
                            vec![
                                lo_out(),
                                not_daddr(lo),
                                tcp(),
                                not_dport(&skip),
                                owner.is(id),
                            ],
                            Action::Jump(InRedirect),
                            format!("Envoy ({w} {id}) to own pod over lo: inbound path"),
                        ),
                    ));
                }
                // b. Other processes talking over lo (app to its own pod IP) are not captured.
                if !include_has_loopback {
                    let matches = if redirect_dns {
                        vec![lo_out(), tcp(), not_dport(&[53]), owner.is_not(id)]
                    } else {
                        vec![lo_out(), owner.is_not(id)]
                    };
                    b.push(app(
                        Nat,
                        IstioOutput,
                        rule(
                            any,
                            matches,
                            Action::Return,
                            format!("non-Envoy ({w} != {id}) traffic over lo: not captured"),
                        ),
                    ));
                }
                // c. Everything else Envoy sends: never captured (loop prevention).
                b.push(app(
                    Nat,
                    IstioOutput,
                    rule(
                        any,
                        vec![owner.is(id)],
                        Action::Return,
                        format!("Envoy ({w} {id}) traffic: not captured"),
                    ),
                ));
            }
        }

        // 13. Owner groups.
        match &cfg.owner_groups {
            OwnerGroups::All => {}
            OwnerGroups::AllExcept(groups) => {
                b.push(app(
                    Nat,
                    IstioOutput,
                    rule(
                        any,
                        vec![Match::Gid {
                            ids: groups.clone(),
                            negate: false,
                        }],
                        Action::Return,
                        "owner group excluded from capture",
                    ),
                ));
            }
            OwnerGroups::Only(groups) => {
                b.push(app(
                    Nat,
                    IstioOutput,
                    rule(
                        any,
                        vec![Match::Gid {
                            ids: groups.clone(),
                            negate: true,
                        }],
                        Action::Return,
                        "owner group not captured",
                    ),
                ));
            }
        }

        // 14. DNS capture.
        if redirect_dns {
            add_dns(&mut b, cfg, &dns_v4, &dns_v6);
        }

        // 15. Apps talking to localhost explicitly.
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V4,
                vec![daddr(lo_v4)],
                Action::Return,
                "localhost: not captured",
            ),
        ));
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V6,
                vec![daddr(lo_v6)],
                Action::Return,
                "localhost: not captured",
            ),
        ));

        // 16. Excluded CIDRs.
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V4,
                vec![daddrs(&exclude_v4)],
                Action::Return,
                "excluded outbound CIDR",
            ),
        ));
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V6,
                vec![daddrs(&exclude_v6)],
                Action::Return,
                "excluded outbound CIDR",
            ),
        ));

        // 17. Always-captured outbound ports.
        b.push(app(
            Nat,
            IstioOutput,
            rule(
                any,
                vec![tcp(), ports(&cfg.outbound_ports_include)],
                Action::Jump(Redirect),
                "outbound port always captured",
            ),
        ));

        // 18. Captured destinations, v4 then v6; virtual interfaces are rerouted to Envoy too.
        for (family, include) in [(Family::V4, &include_v4), (Family::V6, &include_v6)] {
            if include_all {
                b.push(app(
                    Nat,
                    IstioOutput,
                    rule(family, vec![], Action::Jump(Redirect), "outbound to Envoy"),
                ));
                b.push(at(
                    Nat,
                    Prerouting,
                    Position::Insert(1),
                    rule(
                        family,
                        vec![Match::InIface(virt.clone())],
                        Action::Jump(Redirect),
                        "virtual interface traffic to Envoy outbound",
                    ),
                ));
            } else if !include.is_empty() {
                let mut step: Vec<PlacedRule> = virt
                    .iter()
                    .map(|nic| {
                        at(
                            Nat,
                            Prerouting,
                            Position::Insert(1),
                            rule(
                                family,
                                vec![Match::InIface(vec![nic.clone()]), daddrs(include)],
                                Action::Jump(Redirect),
                                "virtual interface traffic to Envoy outbound",
                            ),
                        )
                    })
                    .collect();
                step.push(app(
                    Nat,
                    IstioOutput,
                    rule(
                        family,
                        vec![daddrs(include)],
                        Action::Jump(Redirect),
                        "captured outbound CIDR to Envoy",
                    ),
                ));
                b.step(step);
            }
        }

        // 19. TPROXY marks.
        if tproxy {
            let m = cfg.tproxy_mark;
            b.push(app(
                Mangle,
                Prerouting,
                rule(
                    any,
                    vec![
                        tcp(),
                        Match::Mark {
                            mark: m,
                            negate: false,
                        },
                    ],
                    Action::SaveMark,
                    "save TPROXY mark to the connection",
                ),
            ));
            b.push(app(
                Mangle,
                Output,
                rule(
                    any,
                    vec![
                        tcp(),
                        lo_out(),
                        Match::Mark {
                            mark: m,
                            negate: false,
                        },
                    ],
                    Action::Return,
                    "Envoy to app: already marked",
                ),
            ));
            for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
                for id in ids {
                    for (family, lo) in [(Family::V4, lo_v4), (Family::V6, lo_v6)] {
                        b.push(app(
                            Mangle,
                            Output,
                            rule(
                                family,
                                vec![not_daddr(lo), tcp(), lo_out(), owner.is(id)],
                                Action::SetMark(OUTBOUND_MARK),
                                format!(
                                    "Envoy ({} {id}) to own pod: mark for inbound",
                                    owner.word()
                                ),
                            ),
                        ));
                    }
                }
            }
            b.push(app(
                Mangle,
                Output,
                rule(
                    any,
                    vec![tcp(), Match::ConnMark(m)],
                    Action::RestoreMark,
                    "restore TPROXY mark for policy routing",
                ),
            ));
            b.push(at(
                Mangle,
                Inbound,
                Position::Insert(1),
                rule(
                    any,
                    vec![
                        tcp(),
                        Match::Mark {
                            mark: m,
                            negate: false,
                        },
                    ],
                    Action::Return,
                    "already diverted",
                ),
            ));
            b.push(at(
                Mangle,
                Inbound,
                Position::Insert(2),
                rule(
                    Family::V4,
                    vec![tcp(), saddr(net(INBOUND_PASSTHROUGH_V4)), lo_in()],
                    Action::Return,
                    "inbound passthrough from Envoy (127.0.0.6)",
                ),
            ));
            b.push(at(
                Mangle,
                Inbound,
                Position::Insert(2),
                rule(
                    Family::V6,
                    vec![tcp(), saddr(net(INBOUND_PASSTHROUGH_V6)), lo_in()],
                    Action::Return,
                    "inbound passthrough from Envoy (::6)",
                ),
            ));
            b.push(at(
                Mangle,
                Inbound,
                Position::Insert(3),
                rule(
                    any,
                    vec![
                        tcp(),
                        lo_in(),
                        Match::Mark {
                            mark: OUTBOUND_MARK,
                            negate: true,
                        },
                    ],
                    Action::Return,
                    "app to own pod over lo: not captured",
                ),
            ));
        }

        let captures_inbound = cfg.inbound_ports != InboundPorts::None;
        Ok(Plan {
            steps: b.steps,
            ipv6,
            tproxy_routes: (tproxy && captures_inbound).then_some(TproxyRoutes {
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

/// `SetupDNSRedir` + `addDNSConntrackZones`.
fn add_dns(b: &mut Builder, cfg: &Config, v4: &[IpNet], v6: &[IpNet]) {
    let any = Family::Any;
    let all = cfg.capture_all_dns;
    let to_agent = Action::Redirect {
        port: DNS_AGENT_PORT,
    };
    b.push(app(
        Raw,
        Output,
        rule(any, vec![], Action::Jump(OutputDns), "DNS conntrack zones"),
    ));
    if all || !v4.is_empty() {
        b.push(app(
            Nat,
            IstioOutput,
            rule(Family::V4, vec![], Action::Jump(OutputDns), "DNS capture"),
        ));
    }
    if all || !v6.is_empty() {
        b.push(app(
            Nat,
            IstioOutput,
            rule(Family::V6, vec![], Action::Jump(OutputDns), "DNS capture"),
        ));
    }
    for proto in [tcp(), udp()] {
        let comment = "DNS to istio-agent";
        if all {
            b.push(app(
                Nat,
                OutputDns,
                rule(
                    any,
                    vec![proto.clone(), dport(53)],
                    to_agent.clone(),
                    comment,
                ),
            ));
        } else {
            b.push(app(
                Nat,
                OutputDns,
                rule(
                    Family::V4,
                    vec![proto.clone(), dport(53), daddrs(v4)],
                    to_agent.clone(),
                    comment,
                ),
            ));
            b.push(app(
                Nat,
                OutputDns,
                rule(
                    Family::V6,
                    vec![proto.clone(), dport(53), daddrs(v6)],
                    to_agent.clone(),
                    comment,
                ),
            ));
        }
    }
    for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
        for id in ids {
            b.push(app(
                Raw,
                OutputDns,
                rule(
                    any,
                    vec![udp(), dport(53), owner.is(id)],
                    Action::CtZone(1),
                    "istio-agent to upstream DNS: zone 1",
                ),
            ));
            b.push(app(
                Raw,
                OutputDns,
                rule(
                    any,
                    vec![udp(), Match::SrcPort(DNS_AGENT_PORT), owner.is(id)],
                    Action::CtZone(2),
                    "istio-agent DNS replies: zone 2",
                ),
            ));
        }
    }
    if all {
        b.push(app(
            Raw,
            Prerouting,
            rule(any, vec![], Action::Jump(Inbound), "DNS conntrack zones"),
        ));
        b.push(app(
            Raw,
            OutputDns,
            rule(
                any,
                vec![udp(), dport(53)],
                Action::CtZone(2),
                "app DNS queries: zone 2",
            ),
        ));
        b.push(app(
            Raw,
            Inbound,
            rule(
                any,
                vec![udp(), Match::SrcPort(53)],
                Action::CtZone(1),
                "DNS responses: zone 1",
            ),
        ));
    } else {
        for (family, servers) in [(Family::V4, v4), (Family::V6, v6)] {
            if !servers.is_empty() {
                b.push(app(
                    Raw,
                    Prerouting,
                    rule(family, vec![], Action::Jump(Inbound), "DNS conntrack zones"),
                ));
            }
            b.step(vec![
                app(
                    Raw,
                    OutputDns,
                    rule(
                        family,
                        vec![udp(), dport(53), daddrs(servers)],
                        Action::CtZone(2),
                        "app DNS queries: zone 2",
                    ),
                ),
                app(
                    Raw,
                    Inbound,
                    rule(
                        family,
                        vec![
                            udp(),
                            Match::SrcPort(53),
                            Match::Saddr {
                                nets: servers.to_vec(),
                                negate: false,
                            },
                        ],
                        Action::CtZone(1),
                        "DNS responses: zone 1",
                    ),
                ),
            ]);
        }
    }
}
