//! The latency and failure metrics on a real node (#33 items 2 and 3), and the Grafana
//! dashboard in `deploy/grafana/` checked against what the daemon really exports.
//!
//! 1. One sidecar ADD through the real CNI chain (cnitool) is observed in each family it should
//!    be: the ADD by mode and result, the lookup by source, the daemon's lookup wait, the pod
//!    watch's lag; an ADD whose pod has an invalid annotation fails and is counted by reason.
//!    Every family keeps Prometheus' conventions (`_total` counters; `_bucket` with `le` up to
//!    `+Inf`, `_sum`, `_count` for each histogram series).
//! 2. Every PromQL expression of the dashboard (its panels' targets and its variables' queries)
//!    names only series the daemon exports, with only the labels they carry (plus `instance` and
//!    `job`, which Prometheus adds at scrape), and only label values they take; every family of
//!    `node_status::figures` has a panel. What is exported is scraped from real daemons: the
//!    sidecar node above after its ADDs, and an ambient one (Istio's ambient-only families).
//!
//! Needs root, cnitool and the product's binaries; under `CI=true` nothing skips.

use integration::TestNetns;
use integration::cni::require_cni_tools;
use integration::node::{Daemon, Node, NodeOptions, product_bin_dir, wait_until};
use integration::pods::{DemoPod, PodKind};
use integration::ztunnel::metric_sum;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

const DASHBOARD: &str = "deploy/grafana/istio-cni-dashboard.json";
/// Labels Prometheus adds to every series at scrape (the target's), never the daemon.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// A full-API node (the daemon's pod watch answers the plugin) after one sidecar ADD and one
/// failed ADD, and its /metrics once the plugin's figures for both have arrived.
fn sidecar_node_after_two_adds() -> (Node, String) {
    require_cni_tools();
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.full_api = true;
    let mut node = Node::new(opts).unwrap();
    node.start_daemon().unwrap();
    node.wait_pod_cache_listed();
    let mut pod = DemoPod::new(PodKind::Sidecar, "timed");
    // A write time for the watch's lag (the fake API server sets none).
    pod.json["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z".into();
    node.serve(&pod);
    let ns = TestNetns::with_prefix("dash").unwrap();
    node.add(&ns, &pod).assert_ok();
    // A pod the plugin cannot decide: an interception mode istio-iptables does not know.
    let mut invalid = DemoPod::new(PodKind::Sidecar, "invalid");
    invalid.json["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] = "BOGUS".into();
    node.serve(&invalid);
    let ns2 = TestNetns::with_prefix("dash").unwrap();
    let failed = node.add(&ns2, &invalid);
    assert!(!failed.ok, "{}", failed.stdout);
    let d = node.daemon();
    let arrived = || {
        let m = d.get("/metrics").1;
        let count = |mode, result| {
            let labels = [("mode", mode), ("result", result)];
            metric_sum(&m, "istio_cni_plugin_add_duration_seconds_count", &labels)
        };
        count("sidecar", "success") >= 1.0 && count("unknown", "failure") >= 1.0
    };
    assert!(
        wait_until(Duration::from_secs(5), arrived),
        "the plugin's figures never arrived:\n{}\n{}",
        d.get("/metrics").1,
        d.log()
    );
    let metrics = d.get("/metrics").1;
    (node, metrics)
}

#[test]
fn one_add_through_the_chain_is_observed_and_a_failed_one_is_counted_by_reason() {
    let (node, m) = sidecar_node_after_two_adds();
    let v = |name: &str, labels: &[(&str, &str)]| metric_sum(&m, name, labels);
    let add = "istio_cni_plugin_add_duration_seconds";
    let ok = [("mode", "sidecar"), ("result", "success")];
    assert_eq!(v(&format!("{add}_count"), &ok), 1.0, "{m}");
    let inf = [ok[0], ok[1], ("le", "+Inf")];
    assert_eq!(v(&format!("{add}_bucket"), &inf), 1.0, "{m}");
    let took = v(&format!("{add}_sum"), &ok);
    assert!(took > 0.0 && took < 5.0, "{took}");
    let failed = [("mode", "unknown"), ("result", "failure")];
    assert_eq!(v(&format!("{add}_count"), &failed), 1.0, "{m}");
    // Both pods from the daemon's cache, none from the API server.
    let lookup = "istio_cni_pod_lookup_duration_seconds_count";
    assert_eq!(v(lookup, &[("source", "cache")]), 2.0, "{m}");
    assert_eq!(v(lookup, &[("source", "api")]), 0.0, "{m}");
    let wait = "istio_cni_pod_lookup_wait_seconds_count";
    assert!(v(wait, &[("result", "found")]) >= 2.0, "{m}");
    // One failure, at the decision.
    let failures = "istio_cni_enrollment_failures_total";
    assert_eq!(v(failures, &[("reason", "decide_failed")]), 1.0, "{m}");
    assert_eq!(v(failures, &[]), 1.0, "{m}");
    // The served pod's ADDED event, timed from its creation.
    let lag = "istio_cni_watch_lag_seconds_count";
    assert!(v(lag, &[("resource", "pods")]) >= 1.0, "{m}");
    conventions(&m);
    // The plugin's last line carries the same figures for a reader of the log.
    let log = node.plugin_log();
    assert!(
        log.lines()
            .any(|l| l.contains("command succeeded") && l.contains("\"mode\":\"sidecar\"")),
        "{log}"
    );
}

/// `_total` counters; each histogram series with `le` buckets up to `+Inf`, `_sum`, `_count`.
fn conventions(metrics: &str) {
    let exported = Exported::parse(metrics);
    for (family, kind) in &exported.types {
        match kind.as_str() {
            "counter" => assert!(family.ends_with("_total"), "counter {family}"),
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    let name = format!("{family}{suffix}");
                    assert!(exported.labels.contains_key(&name), "{name}:\n{metrics}");
                }
                let buckets = metrics
                    .lines()
                    .filter(|l| l.starts_with(&format!("{family}_bucket{{")));
                let inf = buckets
                    .clone()
                    .filter(|l| l.contains("le=\"+Inf\""))
                    .count();
                let counts = metrics
                    .lines()
                    .filter(|l| l.starts_with(&format!("{family}_count")))
                    .count();
                assert!(
                    inf > 0 && inf == counts,
                    "{family}: {inf} +Inf, {counts} counts"
                );
                assert!(buckets.clone().all(|l| l.contains("le=\"")), "{family}");
            }
            _ => {}
        }
    }
}

#[test]
fn every_query_of_the_dashboard_is_one_the_daemon_exports() {
    let (_node, sidecar) = sidecar_node_after_two_adds();
    let (_ambient_node, ambient) = ambient_daemon_metrics();
    let exported = Exported::parse(&format!("{sidecar}\n{ambient}"));
    let text = std::fs::read_to_string(root().join(DASHBOARD)).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let queries = queries(&dashboard);
    assert!(queries.len() > 20, "{queries:?}");
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for q in &queries {
        for p in exported.check(q, &mut used) {
            problems.push(format!("{p}\n    in: {q}"));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    // Every family of #33's figures and Istio's own have a panel.
    let mut wanted: Vec<String> = figures_families();
    wanted.extend(
        [
            "istio_cni_install_ready",
            "istio_cni_installs_total",
            "ztunnel_connected",
            "istio_cni_plugin_requests_total",
            "nodeagent_reconcile_events_total",
            "istio_cni_pods",
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
        ]
        .map(String::from),
    );
    let families: BTreeSet<String> = used.iter().map(|n| exported.family(n)).collect();
    let missing: Vec<_> = wanted.iter().filter(|f| !families.contains(*f)).collect();
    assert!(missing.is_empty(), "no panel for {missing:?}");
}

/// The families `node_status::figures` renders, from its own text.
fn figures_families() -> Vec<String> {
    let mut text = String::new();
    node_status::metrics::Metrics::render(node_status::figures::global(), &mut text);
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// An ambient node agent (no ztunnel: it waits for one) and its /metrics, with Istio's
/// ambient-only families in it.
fn ambient_daemon_metrics() -> (Node, String) {
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.full_api = true;
    let mut node = Node::new(opts).unwrap();
    let zds = node.root.join("var/run/ztunnel/ztunnel.sock");
    std::fs::create_dir_all(zds.parent().unwrap()).unwrap();
    let proc_root = node.root.join("host/proc");
    std::fs::create_dir_all(&proc_root).unwrap();
    node.opts.env = [
        ("AMBIENT_ENABLED", "true".to_string()),
        ("ZTUNNEL_UDS_ADDRESS", zds.display().to_string()),
        ("REPAIR_PROC_ROOT", proc_root.display().to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec();
    // Not ready without ztunnel: started by hand, not with `start_daemon`.
    let mut cmd = Command::new(node.opts.bin_source.join("install-cni"));
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(node.daemon_env());
    let d = Daemon::spawn(cmd, Some(&node.ns)).unwrap();
    let up = || {
        let m = d.get("/metrics").1;
        m.contains("\nztunnel_connected ") && m.contains("\nistio_cni_plugin_requests_total{")
    };
    assert!(
        wait_until(Duration::from_secs(20), up),
        "no ambient metrics:\n{}\n{}",
        d.get("/metrics").1,
        d.log()
    );
    let m = d.get("/metrics").1;
    drop(d);
    (node, m)
}

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

// ------------------------------------------------------------------ the dashboard's queries

/// Every `expr` of every panel (rows' panels included) and every variable's query.
fn queries(dashboard: &Value) -> Vec<String> {
    fn panels(v: &Value, out: &mut Vec<String>) {
        for p in v.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_string());
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let q = &var["query"];
            let q = q["query"].as_str().or(q.as_str()).unwrap_or_default();
            out.push(q.to_string());
        }
    }
    out
}

/// What a scrape exports: each series name's label names and values, each family's type.
#[derive(Default)]
struct Exported {
    labels: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    types: BTreeMap<String, String>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut e = Exported::default();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let mut w = t.split_whitespace();
                if let (Some(n), Some(k)) = (w.next(), w.next()) {
                    e.types.insert(n.into(), k.into());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
            let (name, set) = series.split_once('{').unwrap_or((series, ""));
            let entry = e.labels.entry(name.to_string()).or_default();
            for pair in set
                .trim_end_matches('}')
                .split(',')
                .filter(|p| !p.is_empty())
            {
                let (k, v) = pair.split_once('=').expect("label=value");
                let v = v.trim_matches('"').to_string();
                entry.entry(k.to_string()).or_default().insert(v);
            }
        }
        e
    }

    /// A series name's family (a histogram's `_bucket`, `_sum`, `_count` are its own).
    fn family(&self, name: &str) -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix)
                && self.types.get(base).is_some_and(|k| k == "histogram")
            {
                return base.to_string();
            }
        }
        name.to_string()
    }

    /// What in `query` the daemon does not export; the series names it uses go into `used`.
    fn check(&self, query: &str, used: &mut BTreeSet<String>) -> Vec<String> {
        let q = match promql::parse(query) {
            Ok(q) => q,
            Err(e) => return vec![format!("cannot read the query: {e}")],
        };
        let mut problems = Vec::new();
        if q.selectors.is_empty() {
            problems.push("no metric in the query".to_string());
        }
        let mut known_labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
        for s in &q.selectors {
            used.insert(s.name.clone());
            let Some(labels) = self.labels.get(&s.name) else {
                problems.push(format!("{} is not exported", s.name));
                continue;
            };
            known_labels.extend(labels.keys().map(String::as_str));
            for (label, op, value) in &s.matchers {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                match labels.get(label) {
                    None => problems.push(format!("{} has no label {label}", s.name)),
                    Some(values) if op == "=" && !value.contains('$') => {
                        if !values.contains(value) {
                            problems.push(format!("{}{{{label}}} is never {value:?}", s.name));
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        for label in &q.grouping {
            if !known_labels.contains(label.as_str()) {
                problems.push(format!("no series of the query has the label {label}"));
            }
        }
        problems
    }
}

/// Just enough of PromQL to find what a query reads: its series (name and label matchers) and
/// the labels of its `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` clauses; Grafana's
/// `label_values(metric, label)` as a selector and a label.
mod promql {
    #[derive(Debug, Default, PartialEq)]
    pub struct Query {
        pub selectors: Vec<Selector>,
        pub grouping: Vec<String>,
    }

    #[derive(Debug, PartialEq)]
    pub struct Selector {
        pub name: String,
        /// (label, operator, value).
        pub matchers: Vec<(String, String, String)>,
    }

    #[derive(Clone, Debug, PartialEq)]
    enum Tok {
        Ident(String),
        Str(String),
        Op(String),
        Open(char),
        Close(char),
        Comma,
    }

    const CLAUSES: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const WORDS: [&str; 17] = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    ];

    fn lex(q: &str) -> Result<Vec<Tok>, String> {
        let c: Vec<char> = q.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
        while i < c.len() {
            let ch = c[i];
            match ch {
                _ if ch.is_whitespace() => i += 1,
                '"' | '\'' => {
                    let mut s = String::new();
                    i += 1;
                    while i < c.len() && c[i] != ch {
                        if c[i] == '\\' {
                            i += 1;
                        }
                        s.extend(c.get(i));
                        i += 1;
                    }
                    if i == c.len() {
                        return Err("unterminated string".into());
                    }
                    i += 1;
                    out.push(Tok::Str(s));
                }
                // A range or subquery: durations and Grafana's interval variables.
                '[' => {
                    let end = c[i..].iter().position(|x| *x == ']').ok_or("no ]")?;
                    i += end + 1;
                }
                '$' => {
                    i += 1;
                    if c.get(i) == Some(&'{') {
                        i += c[i..].iter().position(|x| *x == '}').ok_or("no }")? + 1;
                    } else {
                        while i < c.len() && ident(c[i]) {
                            i += 1;
                        }
                    }
                }
                '(' | '{' => {
                    out.push(Tok::Open(ch));
                    i += 1;
                }
                ')' | '}' => {
                    out.push(Tok::Close(ch));
                    i += 1;
                }
                ',' => {
                    out.push(Tok::Comma);
                    i += 1;
                }
                _ if ch.is_ascii_digit() || ch == '.' => {
                    while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                        i += 1;
                    }
                }
                _ if ident(ch) => {
                    let start = i;
                    while i < c.len() && ident(c[i]) {
                        i += 1;
                    }
                    out.push(Tok::Ident(c[start..i].iter().collect()));
                }
                _ => {
                    let start = i;
                    while i < c.len() && "=!~<>+-*/%^".contains(c[i]) {
                        i += 1;
                    }
                    if i == start {
                        return Err(format!("unexpected {ch:?}"));
                    }
                    out.push(Tok::Op(c[start..i].iter().collect()));
                }
            }
        }
        Ok(out)
    }

    pub fn parse(q: &str) -> Result<Query, String> {
        if let Some(args) = q
            .trim()
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
        {
            let (metric, label) = args.rsplit_once(',').ok_or("label_values(metric, label)")?;
            let mut query = parse(metric)?;
            query.grouping.push(label.trim().to_string());
            return Ok(query);
        }
        let t = lex(q)?;
        let mut query = Query::default();
        let mut i = 0;
        while i < t.len() {
            let Tok::Ident(word) = &t[i] else {
                i += 1;
                continue;
            };
            let next = t.get(i + 1);
            if CLAUSES.contains(&word.as_str()) {
                i += 1;
                if next == Some(&Tok::Open('(')) {
                    i += 1;
                    while let Some(tok) = t.get(i) {
                        i += 1;
                        match tok {
                            Tok::Ident(l) => query.grouping.push(l.clone()),
                            Tok::Comma => {}
                            Tok::Close(')') => break,
                            other => return Err(format!("{word}: unexpected {other:?}")),
                        }
                    }
                }
            } else if next == Some(&Tok::Open('(')) || WORDS.contains(&word.as_str()) {
                i += 1; // a function or an aggregation
            } else {
                let (selector, after) = selector(word, &t, i + 1)?;
                query.selectors.push(selector);
                i = after;
            }
        }
        Ok(query)
    }

    /// The series `name` with its matchers (from `t[at]` when it is `{`); where it ends.
    fn selector(name: &str, t: &[Tok], mut at: usize) -> Result<(Selector, usize), String> {
        let mut s = Selector {
            name: name.to_string(),
            matchers: Vec::new(),
        };
        if t.get(at) != Some(&Tok::Open('{')) {
            return Ok((s, at));
        }
        at += 1;
        loop {
            match (t.get(at), t.get(at + 1), t.get(at + 2)) {
                (Some(Tok::Close('}')), _, _) => return Ok((s, at + 1)),
                (Some(Tok::Comma), _, _) => at += 1,
                (Some(Tok::Ident(l)), Some(Tok::Op(op)), Some(Tok::Str(v))) => {
                    s.matchers.push((l.clone(), op.clone(), v.clone()));
                    at += 3;
                }
                other => return Err(format!("{name}{{…}}: unexpected {other:?}")),
            }
        }
    }
}

#[test]
fn the_query_reader_finds_series_matchers_and_clauses() {
    let q = promql::parse(
        r#"histogram_quantile(0.99, sum by (le, mode) (rate(x_bucket{instance=~"$instance", result="success"}[$__rate_interval])))"#,
    )
    .unwrap();
    assert_eq!(q.grouping, ["le", "mode"]);
    assert_eq!(q.selectors.len(), 1);
    assert_eq!(q.selectors[0].name, "x_bucket");
    assert_eq!(
        q.selectors[0].matchers,
        [
            ("instance".into(), "=~".into(), "$instance".into()),
            ("result".into(), "=".into(), "success".into())
        ]
    );
    let q = promql::parse(
        "sum by (source) (rate(a_count[5m])) / ignoring (source) group_left sum(rate(a_count[1h:5m]))",
    )
    .unwrap();
    let names: Vec<_> = q.selectors.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((names, q.grouping.len()), (vec!["a_count", "a_count"], 2));
    let q = promql::parse("label_values(up{job=\"x\"}, instance)").unwrap();
    assert_eq!(
        (q.selectors[0].name.as_str(), q.grouping[0].as_str()),
        ("up", "instance")
    );

    // A scrape, and what the check makes of typos in names, labels and values.
    let e = Exported::parse(
        "# TYPE h histogram\nh_bucket{mode=\"a\",le=\"+Inf\"} 1\nh_sum{mode=\"a\"} 1\nh_count{mode=\"a\"} 1\nc_total{reason=\"x\"} 0\n",
    );
    let mut used = BTreeSet::new();
    let ok = r#"histogram_quantile(0.5, sum by (le, mode) (rate(h_bucket{mode="a", instance=~"$i"}[5m])))"#;
    assert!(e.check(ok, &mut used).is_empty());
    assert_eq!(e.family("h_bucket"), "h");
    for (bad, problem) in [
        ("rate(h_buckets[5m])", "h_buckets is not exported"),
        (
            "sum by (mdoe) (h_count)",
            "no series of the query has the label mdoe",
        ),
        ("c_total{reasn=\"x\"}", "c_total has no label reasn"),
        ("c_total{reason=\"y\"}", "c_total{reason} is never \"y\""),
        ("sum(rate(c_total{reason=\"x\"[5m]))", "cannot read"),
    ] {
        let got = e.check(bad, &mut used);
        assert!(got.iter().any(|p| p.contains(problem)), "{bad}: {got:?}");
    }
}

/// An ambient pod's ADD through the chain, with a real ztunnel: the plugin's ADD is timed as
/// `ambient`, and the agent's enroll up to ztunnel's Ack as a success.
#[test]
fn an_ambient_add_is_timed_up_to_ztunnels_ack() {
    use integration::ambient::{AmbientNode, AmbientOptions, Mode, PodPlan};
    require_cni_tools();
    let Some(bin) = integration::ztunnel::ztunnel_binary() else {
        return;
    };
    let plan = PodPlan::new("timed", [10, 88, 1, 10], Mode::Ambient);
    let n = AmbientNode::start(
        &bin,
        &AmbientOptions::default(),
        std::slice::from_ref(&plan),
    )
    .unwrap();
    let _pod = n.start_pod(&plan);
    let metrics = || n.node.daemon_get("/metrics").1;
    let ambient = [("mode", "ambient"), ("result", "success")];
    let count = "istio_cni_plugin_add_duration_seconds_count";
    let arrived = || metric_sum(&metrics(), count, &ambient) == 1.0;
    assert!(wait_until(Duration::from_secs(5), arrived), "{}", metrics());
    let m = metrics();
    let enroll = "istio_cni_ambient_enroll_duration_seconds";
    let ok = [("result", "success")];
    assert!(
        metric_sum(&m, &format!("{enroll}_count"), &ok) >= 1.0,
        "{m}"
    );
    let took = metric_sum(&m, &format!("{enroll}_sum"), &ok);
    assert!(took > 0.0 && took < 5.0, "{took}");
    assert_eq!(
        metric_sum(&m, "istio_cni_enrollment_failures_total", &[]),
        0.0,
        "{m}"
    );
    conventions(&m);
}
