//! Step 19 of `Run()`: TPROXY mode's marks.

use super::*;

impl Builder {
    /// 19. TPROXY mode: the marks that route Envoy's and the app's loopback traffic back through the inbound path.
    pub(super) fn tproxy_marks(&mut self, c: &Ctx) {
        let any = Family::Any;
        if c.tproxy {
            let m = c.cfg.tproxy_mark;
            self.push(app(
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
            self.push(app(
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
            for (owner, ids) in [
                (Owner::Uid, &c.cfg.proxy_uids),
                (Owner::Gid, &c.cfg.proxy_gids),
            ] {
                for id in ids {
                    for (family, lo) in [(Family::V4, c.lo_v4), (Family::V6, c.lo_v6)] {
                        self.push(app(
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
            self.push(app(
                Mangle,
                Output,
                rule(
                    any,
                    vec![tcp(), Match::ConnMark(m)],
                    Action::RestoreMark,
                    "restore TPROXY mark for policy routing",
                ),
            ));
            self.tproxy_inbound_exemptions(c);
        }
    }

    /// What the TPROXY inbound chain must not divert: packets already diverted, Envoy's
    /// passthrough to the app (127.0.0.6 / ::6) and the app talking to its own pod over lo.
    fn tproxy_inbound_exemptions(&mut self, c: &Ctx) {
        let any = Family::Any;
        let m = c.cfg.tproxy_mark;
        self.push(at(
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
        self.push(at(
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
        self.push(at(
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
        self.push(at(
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
}
