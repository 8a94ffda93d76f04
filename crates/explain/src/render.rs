//! The explanation as text for a person: the connection, each hook and chain entered, every
//! rule that matched (position, handle, comment, nft text, verdict), and the outcome.

use super::{Explanation, Step, StepKind};
use std::fmt::Write;

pub fn render_text(e: &Explanation) -> String {
    let mut o = String::new();
    let c = &e.connection;
    let dst = match &c.zone {
        Some(z) => format!("[{}%{z}]:{}", c.dst.ip(), c.dst.port()),
        None => c.dst.to_string(),
    };
    let _ = write!(
        o,
        "connection: {} {} {} -> {dst}",
        c.direction, c.protocol, c.src
    );
    if let (Some(u), Some(g)) = (c.uid, c.gid) {
        let _ = write!(o, ", uid {u} gid {g}");
    }
    if let Some(m) = c.mark {
        let _ = write!(o, ", mark {m:#x}");
    }
    if let Some(i) = &c.oif {
        let _ = write!(o, ", out via {i}");
    }
    if let Some(i) = &c.iif {
        let _ = write!(o, ", in via {i}");
    }
    o.push('\n');
    if !c.assumed.is_empty() {
        let _ = writeln!(o, "assumed: {}", c.assumed.join(", "));
    }
    let _ = writeln!(
        o,
        "rules: live {} rules of this namespace",
        e.backend.name()
    );
    o.push_str(&render_steps(&e.steps));
    for n in &e.notes {
        let _ = writeln!(o, "note: {n}");
    }
    let _ = writeln!(o, "outcome: {}", e.summary);
    if let Some(d) = decider(&e.outcome) {
        let _ = writeln!(
            o,
            "decided by: rule {} of {} {} {}: {}",
            d.rule.position, d.family, d.table, d.chain, d.rule.text
        );
    }
    o
}

fn decider(o: &super::Outcome) -> Option<&super::Decider> {
    use super::Outcome::*;
    match o {
        Redirected { by, .. } | Tproxied { by, .. } | Snatted { by, .. } => Some(by),
        Dropped { by, .. } | NotCaptured { by, .. } => by.as_ref(),
        _ => None,
    }
}

/// The path: a heading per hook, a line per chain entered, an indented line per step.
pub fn render_steps(steps: &[Step]) -> String {
    let mut o = String::new();
    let mut hook = None;
    let mut chain: Option<(&str, &str)> = None;
    for s in steps {
        if hook != Some(s.hook) {
            let _ = writeln!(o, "hook {}:", s.hook.name());
            hook = Some(s.hook);
            chain = None;
        }
        if chain != Some((s.table.as_str(), s.chain.as_str())) {
            let _ = writeln!(o, "  {} {} {}", s.family, s.table, s.chain);
            chain = Some((s.table.as_str(), s.chain.as_str()));
        }
        match s.kind {
            StepKind::Rule => {
                let r = s.rule.as_ref().expect("rule steps name their rule");
                let handle = r
                    .handle
                    .map(|h| format!(" (handle {h})"))
                    .unwrap_or_default();
                let comment = r
                    .comment
                    .as_ref()
                    .map(|c| format!(" \"{c}\""))
                    .unwrap_or_default();
                let _ = writeln!(
                    o,
                    "    rule {}{handle}{comment} -> {}",
                    r.position, s.verdict
                );
                let _ = writeln!(o, "        {}", r.text);
                for fx in &s.effects {
                    let _ = writeln!(o, "        => {fx}");
                }
            }
            StepKind::Return => {
                let _ = writeln!(o, "    end of chain");
            }
            StepKind::Policy => {
                let _ = writeln!(o, "    policy {}", s.verdict);
            }
        }
    }
    o
}
