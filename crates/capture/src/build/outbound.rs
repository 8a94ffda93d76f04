//! Steps 8-13 and 15-18 of `Run()`: everything the pod sends goes through ISTIO_OUTPUT, which
//! exempts excluded ports, Envoy's own traffic, localhost and excluded CIDRs, then sends the
//! rest to Envoy.

use super::*;

impl Builder {
    /// 8. All outbound goes through ISTIO_OUTPUT (UDP is filtered inside).
    pub(super) fn outbound_entry(&mut self) {
        let any = Family::Any;
        self.push(app(
            Nat,
            Output,
            rule(any, vec![], Action::Jump(IstioOutput), "outbound"),
        ));
    }

    /// 9. Excluded outbound ports (`-o`), before the self-redirect logic.
    pub(super) fn excluded_outbound_ports(&mut self, c: &Ctx) {
        let any = Family::Any;
        let ox = &c.cfg.outbound_ports_exclude;
        self.step(vec![
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
    }

    /// 10. Inbound passthrough: Envoy forwards to the app from 127.0.0.6 / ::6.
    pub(super) fn inbound_passthrough(&mut self) {
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V4,
                vec![lo_out(), saddr(net(INBOUND_PASSTHROUGH_V4))],
                Action::Return,
                "inbound passthrough from Envoy (127.0.0.6)",
            ),
        ));
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V6,
                vec![lo_out(), saddr(net(INBOUND_PASSTHROUGH_V6))],
                Action::Return,
                "inbound passthrough from Envoy (::6)",
            ),
        ));
    }

    /// 11-12. Envoy's own traffic, per uid then per gid (`-u`, `-g`): loop prevention.
    pub(super) fn proxy_own_traffic(&mut self, c: &Ctx) {
        let any = Family::Any;
        let tunnel = c.cfg.inbound_tunnel_port;
        for (owner, ids) in [
            (Owner::Uid, &c.cfg.proxy_uids),
            (Owner::Gid, &c.cfg.proxy_gids),
        ] {
            for id in ids {
                let w = owner.word();
                // a. Envoy calling its own pod (app -> VIP -> Envoy -> own pod IP): inbound path.
                // The DNS variant also skips port 53, for uids only (as istio-iptables).
                let skip = if c.redirect_dns && matches!(owner, Owner::Uid) {
                    vec![53, tunnel]
                } else {
                    vec![tunnel]
                };
                for (family, lo) in [(Family::V4, c.lo_v4), (Family::V6, c.lo_v6)] {
                    self.push(app(
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
                if !c.include_has_loopback {
                    let matches = if c.redirect_dns {
                        vec![lo_out(), tcp(), not_dport(&[53]), owner.is_not(id)]
                    } else {
                        vec![lo_out(), owner.is_not(id)]
                    };
                    self.push(app(
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
                self.push(app(
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
    }

    /// 13. Owner groups (`ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE]`).
    pub(super) fn owner_groups(&mut self, c: &Ctx) {
        let any = Family::Any;
        match &c.cfg.owner_groups {
            OwnerGroups::All => {}
            OwnerGroups::AllExcept(groups) => {
                self.push(app(
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
                self.push(app(
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
    }

    /// 15. Apps talking to localhost explicitly are not captured.
    pub(super) fn localhost(&mut self, c: &Ctx) {
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V4,
                vec![daddr(c.lo_v4)],
                Action::Return,
                "localhost: not captured",
            ),
        ));
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V6,
                vec![daddr(c.lo_v6)],
                Action::Return,
                "localhost: not captured",
            ),
        ));
    }

    /// 16. Excluded outbound CIDRs (`-x`).
    pub(super) fn excluded_cidrs(&mut self, c: &Ctx) {
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V4,
                vec![daddrs(&c.exclude_v4)],
                Action::Return,
                "excluded outbound CIDR",
            ),
        ));
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                Family::V6,
                vec![daddrs(&c.exclude_v6)],
                Action::Return,
                "excluded outbound CIDR",
            ),
        ));
    }

    /// 17. Outbound ports always captured (`-q`).
    pub(super) fn always_captured_ports(&mut self, c: &Ctx) {
        let any = Family::Any;
        self.push(app(
            Nat,
            IstioOutput,
            rule(
                any,
                vec![tcp(), ports(&c.cfg.outbound_ports_include)],
                Action::Jump(Redirect),
                "outbound port always captured",
            ),
        ));
    }

    /// 18. Captured destinations (`-i`), IPv4 then IPv6; virtual interfaces are rerouted to Envoy too.
    pub(super) fn captured_destinations(&mut self, c: &Ctx) {
        let virt = &c.cfg.reroute_virtual_interfaces;
        for (family, include) in [(Family::V4, &c.include_v4), (Family::V6, &c.include_v6)] {
            if c.include_all {
                self.push(app(
                    Nat,
                    IstioOutput,
                    rule(family, vec![], Action::Jump(Redirect), "outbound to Envoy"),
                ));
                self.push(at(
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
                self.step(step);
            }
        }
    }
}
