//! The report as text (a table, then each pod's details, then the summary line) and the exit
//! status it means. Pure.

use cni_config::status::{Mode, PodEntry, Report, Source, State, Summary};
use std::fmt::Write;

/// Drift lines quoted per pod (`--json` has them all).
const DRIFT_LINES: usize = 5;

/// `12s ago`, `3m ago`, `2h ago`, `4d ago`; `-` when unknown.
pub fn ago(now: u64, t: Option<u64>) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    let d = now.saturating_sub(t);
    match d {
        0..60 => format!("{d}s ago"),
        60..3600 => format!("{}m ago", d / 60),
        3600..86400 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86400),
    }
}

fn pod_name(p: &PodEntry) -> String {
    match (p.namespace.is_empty(), &p.netns) {
        (false, _) => format!("{}/{}", p.namespace, p.name),
        (true, Some(ns)) => ns.clone(),
        (true, None) => "?".into(),
    }
}

fn state_text(s: State) -> &'static str {
    match s {
        State::NotCaptured => "NOT-CAPTURED",
        other => other.as_str(),
    }
}

/// The whole report as text.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let mut head = format!("node {} ({} report", r.node, source(r.source));
    if let Some(b) = &r.node_backend {
        let _ = write!(head, "; backend {b}");
    }
    if let Some(a) = r.ambient_enabled {
        let _ = write!(head, "; ambient {}", if a { "on" } else { "off" });
    }
    let _ = writeln!(out, "{head}): {} pod(s)", r.pods.len());
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let rows: Vec<[String; 7]> = r.pods.iter().map(|p| row(r, p)).collect();
    let header = [
        "POD",
        "MODE",
        "STATE",
        "RULES",
        "BACKEND",
        "PROGRAMMED",
        "REASON",
    ]
    .map(String::from);
    let mut widths = [0usize; 7];
    for cols in std::iter::once(&header).chain(&rows) {
        for (w, c) in widths.iter_mut().zip(cols) {
            *w = (*w).max(c.chars().count());
        }
    }
    if !rows.is_empty() {
        for (cols, p) in std::iter::once((&header, None))
            .chain(rows.iter().zip(&r.pods).map(|(c, p)| (c, Some(p))))
        {
            let mut line = String::new();
            for (i, c) in cols.iter().enumerate() {
                if i + 1 == cols.len() {
                    line.push_str(c);
                } else {
                    let _ = write!(line, "{c:<w$}  ", w = widths[i]);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
            if let Some(p) = p {
                details(&mut out, r, p);
            }
        }
    }
    let _ = writeln!(out, "{}", summary_line(r));
    out
}

fn source(s: Source) -> &'static str {
    match s {
        Source::Daemon => "daemon",
        Source::Kernel => "kernel-only",
    }
}

fn row(r: &Report, p: &PodEntry) -> [String; 7] {
    [
        pod_name(p),
        p.mode.as_str().into(),
        state_text(p.state).into(),
        p.rules.as_str().into(),
        p.backend.clone().unwrap_or_else(|| "-".into()),
        ago(r.generated, p.last_programmed),
        p.reason.clone(),
    ]
}

/// The indented lines under a pod's row: what else is known about it.
fn details(out: &mut String, r: &Report, p: &PodEntry) {
    if let Some(a) = &p.ambient {
        let probe = match a.in_probe_set {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "unknown",
        };
        let acked = if a.acked { "yes" } else { "NO" };
        let _ = writeln!(
            out,
            "    ambient: acked by ztunnel: {acked}; in the host probe set: {probe}"
        );
    }
    if p.last_checked.is_some() {
        let _ = writeln!(
            out,
            "    last checked: {}",
            ago(r.generated, p.last_checked)
        );
    }
    if !p.namespace.is_empty()
        && let Some(ns) = &p.netns
    {
        let _ = writeln!(out, "    netns: {ns}");
    }
    if p.namespace.is_empty() && !p.ips.is_empty() {
        let ips: Vec<String> = p.ips.iter().map(ToString::to_string).collect();
        let uid = p.uid.as_deref().unwrap_or("not named by its cgroups");
        let _ = writeln!(out, "    addresses: {}; pod uid: {uid}", ips.join(", "));
    }
    for d in p.drift.iter().take(DRIFT_LINES) {
        let _ = writeln!(out, "    drift: {d}");
    }
    if p.drift.len() > DRIFT_LINES {
        let _ = writeln!(
            out,
            "    drift: … {} more (--json)",
            p.drift.len() - DRIFT_LINES
        );
    }
    if let Some(d) = &p.detail {
        let _ = writeln!(out, "    {d}");
    }
}

/// `summary: 4 pods: 2 captured, 1 NOT captured, 1 pending (sidecar: …; ambient: …; none: …)`.
pub fn summary_line(r: &Report) -> String {
    let s = &r.summary;
    let mut line = format!(
        "summary: {} pod(s): {} captured, {} not captured, {} pending",
        s.pods, s.captured, s.not_captured, s.pending
    );
    let modes: Vec<String> = [Mode::Sidecar, Mode::Ambient, Mode::None, Mode::Unknown]
        .into_iter()
        .filter_map(|m| by_mode(s, m))
        .collect();
    if !modes.is_empty() {
        let _ = write!(line, " ({})", modes.join("; "));
    }
    line.push_str(match (r.source, s.not_captured) {
        (_, n) if n > 0 => " — pods that should be captured are NOT",
        (Source::Daemon, _) => " — every pod that should be captured is",
        (Source::Kernel, _) => " — without the daemon, what each pod should get is unknown",
    });
    line
}

fn by_mode(s: &Summary, m: Mode) -> Option<String> {
    let parts: Vec<String> = s
        .counts
        .iter()
        .filter(|c| c.mode == m)
        .map(|c| format!("{} {}", c.pods, c.state.as_str()))
        .collect();
    (!parts.is_empty()).then(|| format!("{}: {}", m.as_str(), parts.join(", ")))
}

/// The exit status: 1 when a pod that should be captured is not; 3 when the report is the
/// kernel's alone and nothing is provably wrong (what pods should get is unknown); else 0.
pub fn exit_code(r: &Report) -> u8 {
    match (r.summary.not_captured, r.source) {
        (n, _) if n > 0 => 1,
        (_, Source::Kernel) => 3,
        (_, Source::Daemon) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_config::status::{AmbientState, Rules};

    fn pod(name: &str, mode: Mode, rules: Rules, state: State) -> PodEntry {
        PodEntry {
            ips: vec!["10.0.0.1".parse().unwrap()],
            mode,
            reason: format!("why {name}"),
            netns: Some("/proc/42/ns/net".into()),
            rules,
            backend: Some("nft".into()),
            state,
            ..PodEntry::unknown("shop".into(), name.into(), Some(format!("uid-{name}")))
        }
    }

    fn report(source: Source, pods: Vec<PodEntry>) -> Report {
        Report {
            source,
            node: "worker-1".into(),
            node_backend: Some("nft".into()),
            ambient_enabled: Some(true),
            generated: 10_000,
            summary: Summary::of(&pods),
            pods,
            notes: Vec::new(),
        }
    }

    #[test]
    fn times_are_said_relative_to_the_report() {
        assert_eq!(ago(100, None), "-");
        assert_eq!(ago(100, Some(88)), "12s ago");
        assert_eq!(ago(1000, Some(100)), "15m ago");
        assert_eq!(ago(100_000, Some(100)), "1d ago");
        assert_eq!(ago(100, Some(200)), "0s ago", "a clock step back is now");
    }

    #[test]
    fn the_table_has_a_row_per_pod_its_details_and_the_summary() {
        let mut web = pod("web", Mode::Sidecar, Rules::Ok, State::Captured);
        web.last_programmed = Some(9_990);
        web.last_checked = Some(9_995);
        let mut db = pod("db", Mode::Sidecar, Rules::Drifted, State::NotCaptured);
        db.drift = (1..=7).map(|i| format!("line {i}")).collect();
        let mut amb = pod("amb", Mode::Ambient, Rules::Ok, State::Captured);
        amb.ambient = Some(AmbientState {
            acked: true,
            in_probe_set: Some(true),
        });
        let skip = pod("plain", Mode::None, Rules::None, State::Skipped);
        let r = report(Source::Daemon, vec![web, db, amb, skip]);
        let t = text(&r);
        assert!(
            t.starts_with("node worker-1 (daemon report; backend nft; ambient on): 4 pod(s)\n"),
            "{t}"
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].starts_with("POD         MODE     STATE"), "{t}");
        assert!(
            t.contains(
                "shop/web    sidecar  captured      ok       nft      10s ago     why web\n"
            ),
            "{t}"
        );
        assert!(t.contains("    last checked: 5s ago\n"), "{t}");
        assert!(
            t.contains("shop/db     sidecar  NOT-CAPTURED  drifted"),
            "{t}"
        );
        assert!(
            t.contains("    drift: line 5\n    drift: … 2 more (--json)\n"),
            "{t}"
        );
        assert!(
            t.contains("    ambient: acked by ztunnel: yes; in the host probe set: yes\n"),
            "{t}"
        );
        let last = lines.last().unwrap();
        assert_eq!(
            *last,
            "summary: 4 pod(s): 2 captured, 1 not captured, 0 pending (sidecar: 1 captured, 1 not_captured; ambient: 1 captured; none: 1 skipped) — pods that should be captured are NOT"
        );
        assert_eq!(exit_code(&r), 1);
    }

    #[test]
    fn exit_status_says_captured_not_captured_or_cannot_tell() {
        let ok = report(
            Source::Daemon,
            vec![pod("web", Mode::Sidecar, Rules::Ok, State::Captured)],
        );
        assert_eq!(exit_code(&ok), 0);
        assert!(summary_line(&ok).ends_with("every pod that should be captured is"));
        let mut k = pod("", Mode::Unknown, Rules::Present, State::Unknown);
        k.namespace.clear();
        let kernel = report(Source::Kernel, vec![k.clone()]);
        assert_eq!(exit_code(&kernel), 3);
        let t = text(&kernel);
        assert!(t.contains("/proc/42/ns/net  unknown"), "{t}");
        assert!(
            t.contains("    addresses: 10.0.0.1; pod uid: uid-\n"),
            "{t}"
        );
        k.rules = Rules::BothBackends;
        k.state = State::NotCaptured;
        assert_eq!(exit_code(&report(Source::Kernel, vec![k])), 1);
        let empty = report(Source::Daemon, Vec::new());
        assert_eq!(
            text(&empty),
            "node worker-1 (daemon report; backend nft; ambient on): 0 pod(s)\nsummary: 0 pod(s): 0 captured, 0 not captured, 0 pending — every pod that should be captured is\n"
        );
    }
}
