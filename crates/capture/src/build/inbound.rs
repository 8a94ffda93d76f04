//! Steps 1-7 of `Run()`: what is never captured inbound, the redirect chains, and the inbound
//! capture itself (REDIRECT, or TPROXY in mangle).

use super::*;

impl Builder {
    /// 1. Excluded interfaces: nothing on them is captured (`-c`).
    pub(super) fn excluded_interfaces(&mut self, c: &Ctx) {
        let any = Family::Any;
        let nics = &c.cfg.exclude_interfaces;
        self.step(vec![
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
        if c.tproxy {
            self.step(vec![
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
    }

    /// 2. Virtual (KubeVirt) interfaces are not inbound traffic (`-k`).
    pub(super) fn virtual_interfaces_are_not_inbound(&mut self, c: &Ctx) {
        let any = Family::Any;
        let virt = &c.cfg.reroute_virtual_interfaces;
        self.push(at(
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
    }

    /// 3. Invalid packets dropped rather than reset by conntrack (`--drop-invalid`).
    pub(super) fn drop_invalid(&mut self, c: &Ctx) {
        let any = Family::Any;
        if c.cfg.drop_invalid {
            self.push(app(
                Mangle,
                Prerouting,
                rule(
                    any,
                    vec![Match::CtState(vec![CtState::Invalid])],
                    Action::Jump(Drop),
                    "drop invalid packets",
                ),
            ));
            self.push(app(
                Mangle,
                Drop,
                rule(any, vec![], Action::Drop, "drop invalid packets"),
            ));
        }
    }

    /// 4-6. The tunnel port bypass and the two redirect chains (to Envoy outbound and inbound).
    pub(super) fn redirect_chains(&mut self, c: &Ctx) {
        let any = Family::Any;
        self.push(app(
            Nat,
            Inbound,
            rule(
                any,
                vec![tcp(), dport(c.cfg.inbound_tunnel_port)],
                Action::Return,
                "HBONE tunnel port: not captured",
            ),
        ));
        self.push(app(
            Nat,
            Redirect,
            rule(
                any,
                vec![tcp()],
                Action::Redirect {
                    port: c.cfg.proxy_port,
                },
                "redirect outbound to Envoy",
            ),
        ));
        self.push(app(
            Nat,
            InRedirect,
            rule(
                any,
                vec![tcp()],
                Action::Redirect {
                    port: c.cfg.inbound_capture_port,
                },
                "redirect inbound to Envoy",
            ),
        ));
    }

    /// 7. Inbound capture (`-b`, `-d`): REDIRECT in nat, or TPROXY in mangle.
    pub(super) fn inbound_capture(&mut self, c: &Ctx) {
        if c.cfg.inbound_ports == InboundPorts::None {
            return;
        }
        let table = if c.tproxy { Mangle } else { Nat };
        if c.tproxy {
            self.tproxy_chains(c);
        }
        self.push(app(
            table,
            Prerouting,
            rule(
                Family::Any,
                vec![tcp()],
                Action::Jump(Inbound),
                "inbound TCP",
            ),
        ));
        match &c.cfg.inbound_ports {
            InboundPorts::All => self.inbound_all_ports(c, table),
            InboundPorts::List(list) => self.inbound_listed_ports(c, list),
            InboundPorts::None => unreachable!(),
        }
    }

    /// TPROXY mode: ISTIO_DIVERT (established inbound: mark and accept) and ISTIO_TPROXY
    /// (new inbound: to Envoy's inbound port, not for loopback destinations).
    fn tproxy_chains(&mut self, c: &Ctx) {
        let any = Family::Any;
        self.push(app(
            Mangle,
            Divert,
            rule(
                any,
                vec![],
                Action::SetMark(c.cfg.tproxy_mark),
                "mark established inbound for policy routing",
            ),
        ));
        self.push(app(
            Mangle,
            Divert,
            rule(any, vec![], Action::Accept, "accept established inbound"),
        ));
        let tp = Action::Tproxy {
            port: c.cfg.inbound_capture_port,
            mark: c.cfg.tproxy_mark,
        };
        self.push(app(
            Mangle,
            Tproxy,
            rule(
                Family::V4,
                vec![not_daddr(c.lo_v4), tcp()],
                tp.clone(),
                "TPROXY inbound to Envoy",
            ),
        ));
        self.push(app(
            Mangle,
            Tproxy,
            rule(
                Family::V6,
                vec![not_daddr(c.lo_v6), tcp()],
                tp,
                "TPROXY inbound to Envoy",
            ),
        ));
    }

    /// `-b '*'`: every inbound port but the excluded ones.
    fn inbound_all_ports(&mut self, c: &Ctx, table: Table) {
        let any = Family::Any;
        self.push(app(
            table,
            Inbound,
            rule(
                any,
                vec![tcp(), ports(&c.cfg.inbound_ports_exclude)],
                Action::Return,
                "inbound port excluded from capture",
            ),
        ));
        if c.tproxy {
            self.push(app(
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
            self.push(app(
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
            self.push(app(
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

    /// `-b LIST`: only the listed inbound ports.
    fn inbound_listed_ports(&mut self, c: &Ctx, list: &[u16]) {
        let any = Family::Any;
        if c.tproxy {
            self.step(vec![
                app(
                    Mangle,
                    Inbound,
                    rule(
                        any,
                        vec![
                            tcp(),
                            ports(list),
                            Match::CtState(vec![CtState::Related, CtState::Established]),
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
            self.push(app(
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
}
