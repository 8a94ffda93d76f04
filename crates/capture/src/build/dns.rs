//! Step 14 of `Run()`: DNS capture and its conntrack zones.

use super::*;

impl Builder {
    /// 14. DNS capture (`--redirect-dns`): `SetupDNSRedir`, then `addDNSConntrackZones`.
    pub(super) fn dns(&mut self, c: &Ctx) {
        if c.redirect_dns {
            self.dns_to_agent(c);
            self.dns_conntrack_zones(c);
        }
    }

    /// DNS queries (all port-53 traffic, or to the known servers) to istio-agent's 15053.
    fn dns_to_agent(&mut self, c: &Ctx) {
        let (b, cfg, v4, v6) = (self, c.cfg, &c.dns_v4[..], &c.dns_v6[..]);
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
    }

    /// Conntrack zones that keep the app's DNS flows (zone 2) apart from istio-agent's
    /// upstream ones (zone 1), so the NATed replies find their way back.
    fn dns_conntrack_zones(&mut self, c: &Ctx) {
        let (b, cfg, v4, v6) = (self, c.cfg, &c.dns_v4[..], &c.dns_v6[..]);
        let any = Family::Any;
        let all = cfg.capture_all_dns;
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
}
