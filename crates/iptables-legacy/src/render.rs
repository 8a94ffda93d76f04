use capture::{Action, ChainId, CtState, Family, L4, Match, PlacedRule, Plan, Position, Table};
use std::fmt::Write;

/// The iptables-restore payload for one family, as istio-iptables builds it (`buildRestore`):
/// tables in alphabetical order, chain declarations (`-N`) for every Istio chain with a rule
/// and then every jump target, then the rules in emission order with `-A`/`-I`.
/// Returns an empty string when the family has no rules.
pub fn render_payload(plan: &Plan, v6: bool) -> String {
    if v6 && !plan.ipv6 {
        return String::new();
    }
    let ops: Vec<PlacedRule> = plan
        .ops(|_| true)
        .into_iter()
        .filter(|op| op.rule.family.includes(v6))
        .collect();
    let mut out = String::new();
    let mut tables: Vec<Table> = ops.iter().map(|o| o.table).collect();
    tables.sort();
    tables.dedup();
    for table in tables {
        let in_table: Vec<&PlacedRule> = ops.iter().filter(|o| o.table == table).collect();
        let mut declared: Vec<ChainId> = Vec::new();
        let mut declare = |c: ChainId| {
            if !c.is_builtin() && !declared.contains(&c) {
                declared.push(c);
            }
        };
        in_table.iter().for_each(|o| declare(o.chain));
        in_table.iter().for_each(|o| {
            if let Action::Jump(target) = o.rule.action {
                declare(target)
            }
        });
        let _ = writeln!(out, "* {}", table.iptables_name());
        for c in &declared {
            let _ = writeln!(out, "-N {}", c.iptables_name());
        }
        for o in in_table {
            let head = match o.at {
                Position::Append => format!("-A {}", o.chain.iptables_name()),
                Position::Insert(n) => format!("-I {} {n}", o.chain.iptables_name()),
            };
            let _ = writeln!(
                out,
                "{head} {}",
                rule_args(&o.rule.matches, &o.rule.action, o.rule.family)
            );
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// The iptables arguments of one rule (matches in the plan's order, then the target).
/// Positive multi-value matches must already be expanded (`Plan::ops(|_| true)`).
pub fn rule_args(matches: &[Match], action: &Action, _family: Family) -> String {
    let mut a: Vec<String> = Vec::new();
    let mut proto = None;
    for m in matches {
        match m {
            Match::InIface(v) => a.push(format!("-i {}", v.join(","))),
            Match::OutIface(v) => a.push(format!("-o {}", v.join(","))),
            Match::Proto(p) => {
                proto = Some(*p);
                a.push(format!("-p {}", p.name()));
            }
            Match::DstPort { ports, negate } => {
                let list = ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let not = if *negate { "! " } else { "" };
                if ports.len() > 1 {
                    a.push(format!("-m multiport {not}--dports {list}"));
                } else {
                    a.push(format!("{not}--dport {list}"));
                }
            }
            Match::SrcPort(p) => a.push(format!("--sport {p}")),
            Match::Daddr { nets, negate } | Match::Saddr { nets, negate } => {
                let flag = if matches!(m, Match::Daddr { .. }) {
                    "-d"
                } else {
                    "-s"
                };
                let not = if *negate { "! " } else { "" };
                let list = nets
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                a.push(format!("{not}{flag} {list}"));
            }
            Match::Uid { ids, negate } | Match::Gid { ids, negate } => {
                let flag = if matches!(m, Match::Uid { .. }) {
                    "--uid-owner"
                } else {
                    "--gid-owner"
                };
                let not = if *negate { "! " } else { "" };
                // "None of" is one owner match per id; "any of" arrives here already expanded.
                for id in ids {
                    a.push(format!("-m owner {not}{flag} {id}"));
                }
            }
            Match::Mark { mark, negate } => a.push(format!(
                "-m mark {}--mark {mark}",
                if *negate { "! " } else { "" }
            )),
            Match::ConnMark(mark) => a.push(format!("-m connmark --mark {mark}")),
            Match::CtState(states) => {
                let s: Vec<&str> = states
                    .iter()
                    .map(|s| match s {
                        CtState::Invalid => "INVALID",
                        CtState::Related => "RELATED",
                        CtState::Established => "ESTABLISHED",
                    })
                    .collect();
                a.push(format!("-m conntrack --ctstate {}", s.join(",")));
            }
            Match::NotOutIface(i) => a.push(format!("! -o {i}")),
            Match::L4Module(p) => a.push(format!("-m {}", p.name())),
            Match::FromAddr(ip) => a.push(format!("-s {}", capture::DisplayIp(*ip))),
            Match::ToAddr(ip) => a.push(format!("-d {}", capture::DisplayIp(*ip))),
            Match::MarkMasked { mark, mask, negate } => a.push(format!(
                "-m mark {}--mark {mark:#x}/{mask:#x}",
                if *negate { "! " } else { "" }
            )),
            Match::ConnMarkMasked { mark, mask } => {
                a.push(format!("-m connmark --mark {mark:#x}/{mask:#x}"))
            }
            Match::DaddrInSet(name) => a.push(format!("-m set --match-set {name} dst")),
            Match::SocketExists => a.push("-m owner --socket-exists".into()),
        }
    }
    a.push(match action {
        Action::Return => "-j RETURN".into(),
        Action::Jump(c) => format!("-j {}", c.iptables_name()),
        Action::Accept => "-j ACCEPT".into(),
        Action::Drop => "-j DROP".into(),
        // istio-iptables spells the UDP (DNS) redirect `--to-port`; both are the same option.
        Action::Redirect { port } if proto == Some(L4::Udp) => {
            format!("-j REDIRECT --to-port {port}")
        }
        Action::Redirect { port } => format!("-j REDIRECT --to-ports {port}"),
        Action::Tproxy { port, mark } => {
            format!("-j TPROXY --tproxy-mark {mark}/0xffffffff --on-port {port}")
        }
        Action::SetMark(m) => format!("-j MARK --set-mark {m}"),
        Action::SaveMark => "-j CONNMARK --save-mark".into(),
        Action::RestoreMark => "-j CONNMARK --restore-mark".into(),
        Action::CtZone(z) => format!("-j CT --zone {z}"),
        Action::SetConnMarkMasked { value, mask } => {
            format!("-j CONNMARK --set-xmark {value:#x}/{mask:#x}")
        }
        Action::RestoreMarkFullMasks => {
            "-j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff".into()
        }
        Action::Snat(ip) => format!("-j SNAT --to-source {}", capture::DisplayIp(*ip)),
    });
    a.join(" ")
}
