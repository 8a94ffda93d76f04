//! docs/reference.md is generated from the code, and this test fails when it is stale:
//!
//! 1. the daemon's flags and env vars: `install-cni --help` and `install-cni --list-env`, run
//!    with an empty environment (the product binary, as every node test finds it);
//! 2. the chart's values: every key of `deploy/helm/istio-cni/values.yaml` with the comment
//!    above it and its default;
//! 3. the conflist fields the plugin reads: `cni_config::PluginSettings`' entry as install-cni
//!    writes it, with each field's doc comment;
//! 4. the names `pod-policy` reads from pods: its string constants (annotation and label keys,
//!    container env, container names);
//! 5. the metrics the daemon exports: the `istio_cni_*` families created in the crates whose
//!    jobs register into `/metrics`.
//!
//! Regenerate: build the binaries (`cargo build -p install-cni`, or `ISTIO_CNI_BIN_DIR` as
//! test.sh sets it), then `UPDATE_REFERENCE=1 cargo test -p integration --test reference_doc`.
//! Parsing is kept plain on purpose: lines and a few patterns, no Rust parser.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const DOC: &str = "docs/reference.md";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A markdown table cell: one line, no unescaped `|`.
fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn code(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("`{}`", s.replace('|', "\\|"))
    }
}

/// The text before the first `#[cfg(test)]`: the tests' own names and strings are not read.
fn without_tests(src: &str) -> &str {
    src.split("#[cfg(test)]").next().unwrap_or(src)
}

fn rust_files(rel: &str) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join(rel), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root()).unwrap().display().to_string();
            let text = std::fs::read_to_string(&p).unwrap();
            (rel, text)
        })
        .collect()
}

// ---------------------------------------------------------------- 1. the daemon's flags

/// `install-cni`, from the build the node tests use; refused when its sources are newer.
fn install_cni() -> PathBuf {
    let dir = testbed::node::product_bin_dir().unwrap_or_else(|e| {
        panic!(
            "{e}: build the binaries first (cargo build -p install-cni) or set ISTIO_CNI_BIN_DIR"
        )
    });
    let bin = dir.join("install-cni");
    if std::env::var_os("ISTIO_CNI_BIN_DIR").is_none() {
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).unwrap();
        for (rel, _) in rust_files("crates/install-cni/src") {
            let changed = std::fs::metadata(root().join(&rel))
                .and_then(|m| m.modified())
                .unwrap();
            assert!(
                changed <= built,
                "{rel} is newer than {}: cargo build -p install-cni first",
                bin.display()
            );
        }
    }
    bin
}

fn run_empty_env(bin: &Path, arg: &str) -> String {
    let out = Command::new(bin)
        .arg(arg)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("{} {arg}: {e}", bin.display()));
    assert!(out.status.success(), "{} {arg}: {out:?}", bin.display());
    String::from_utf8(out.stdout).unwrap()
}

/// One option of clap's long help: flag line, description, and the `[env: …]`, `[default: …]`
/// and `[possible values: …]` notes.
#[derive(Default)]
struct Opt {
    flag: String,
    about: Vec<String>,
    env: String,
    default: String,
    values: String,
}

fn parse_help(help: &str) -> Vec<Opt> {
    let mut opts: Vec<Opt> = Vec::new();
    let options = help.split("\nOptions:\n").nth(1).unwrap_or("");
    for line in options.lines() {
        let t = line.trim();
        if t.starts_with('-') && line.starts_with("  ") && !line.starts_with("          ") {
            opts.push(Opt {
                flag: t.to_string(),
                ..Opt::default()
            });
            continue;
        }
        let Some(o) = opts.last_mut() else { continue };
        let note = |p: &str| t.strip_prefix(p).and_then(|r| r.strip_suffix(']'));
        if let Some(v) = note("[env: ") {
            o.env = v.trim_end_matches('=').to_string();
        } else if let Some(v) = note("[default: ") {
            o.default = v.to_string();
        } else if let Some(v) = note("[possible values: ") {
            o.values = v.to_string();
        } else if !t.is_empty() {
            o.about.push(t.to_string());
        }
    }
    opts
}

fn daemon_section(out: &mut String) {
    let bin = install_cni();
    let help = run_empty_env(&bin, "--help");
    let listed: Vec<String> = run_empty_env(&bin, "--list-env")
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let opts = parse_help(&help);
    let about = help.split("\nUsage:").next().unwrap_or("").trim();
    writeln!(out, "## install-cni: flags and environment\n").unwrap();
    writeln!(
        out,
        "From `install-cni --help` and `install-cni --list-env`. {}\n",
        cell(about)
    )
    .unwrap();
    writeln!(out, "| flag | env | default | meaning |\n|---|---|---|---|").unwrap();
    for o in &opts {
        let mut meaning = o.about.join(" ");
        if !o.values.is_empty() {
            write!(meaning, " (one of: {})", o.values).unwrap();
        }
        let default = if o.default.is_empty() { "" } else { &o.default };
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            code(&o.flag),
            code(&o.env),
            code(default),
            cell(&meaning)
        )
        .unwrap();
    }
    let with_flag: BTreeSet<&str> = opts.iter().map(|o| o.env.as_str()).collect();
    let env_only: Vec<String> = listed
        .iter()
        .filter(|e| !with_flag.contains(e.as_str()))
        .map(|e| code(e))
        .collect();
    writeln!(
        out,
        "\n`--list-env` names {} variables. Read from the environment only (no flag): {}.\n",
        listed.len(),
        if env_only.is_empty() {
            "none".to_string()
        } else {
            env_only.join(", ")
        }
    )
    .unwrap();
    let unlisted: Vec<String> = opts
        .iter()
        .filter(|o| !o.env.is_empty() && !listed.contains(&o.env))
        .map(|o| code(&o.env))
        .collect();
    if !unlisted.is_empty() {
        writeln!(
            out,
            "In `--help` but not in `--list-env`: {}.\n",
            unlisted.join(", ")
        )
        .unwrap();
    }
}

// ---------------------------------------------------------------- 2. the chart's values

fn yaml_at<'a>(v: &'a serde_yaml::Value, path: &[String]) -> Option<&'a serde_yaml::Value> {
    path.iter()
        .try_fold(v, |v, k| v.as_mapping()?.get(k.as_str()))
}

/// Every key of values.yaml in file order: its path, the comment lines right above it, and its
/// default (from the parsed YAML). Keys inside lists and block values are not walked.
fn chart_section(out: &mut String) {
    const FILE: &str = "deploy/helm/istio-cni/values.yaml";
    let text = read(FILE);
    let values: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    writeln!(out, "## Chart values\n").unwrap();
    writeln!(
        out,
        "From `{FILE}`: each key, its default and the comment above it. Keys under \
         `_internal_defaults_do_not_set` (Istio's layout) are shown as set: without that \
         prefix. [`deploy/helm/istio-cni/README.md`](../deploy/helm/istio-cni/README.md) \
         explains them.\n"
    )
    .unwrap();
    writeln!(out, "| value | default | comment |\n|---|---|---|").unwrap();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    let mut skip_deeper_than: Option<usize> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if let Some(limit) = skip_deeper_than {
            if t.is_empty() || indent > limit || t.starts_with('-') && indent == limit {
                comment.clear();
                continue;
            }
            skip_deeper_than = None;
        }
        if let Some(c) = t.strip_prefix('#') {
            comment.push(c.trim().to_string());
            continue;
        }
        let key = t
            .split_once(':')
            .filter(|(k, rest)| {
                !k.is_empty()
                    && !k.starts_with('-')
                    && !k.contains(' ')
                    && (rest.is_empty() || rest.starts_with(' '))
            })
            .map(|(k, _)| k.trim_matches(|c| c == '"' || c == '\'').to_string());
        let Some(key) = key else {
            comment.clear();
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        stack.push((indent, key));
        let path: Vec<String> = stack.iter().map(|(_, k)| k.clone()).collect();
        let Some(v) = yaml_at(&values, &path) else {
            comment.clear();
            continue;
        };
        let shown: Vec<&str> = path
            .iter()
            .map(String::as_str)
            .filter(|k| *k != "_internal_defaults_do_not_set")
            .collect();
        let is_map = v.as_mapping().is_some_and(|m| !m.is_empty());
        if !is_map {
            skip_deeper_than = Some(indent);
        }
        if !shown.is_empty() {
            let default = if is_map {
                String::new()
            } else {
                code(&serde_json::to_string(v).unwrap())
            };
            writeln!(
                out,
                "| {} | {} | {} |",
                code(&shown.join(".")),
                default,
                cell(&comment.join(" "))
            )
            .unwrap();
        }
        comment.clear();
    }
    out.push('\n');
}

// ---------------------------------------------------------------- 3. the conflist fields

/// `///` comments above each `pub field:` of `struct NAME` in `src`.
fn field_docs(src: &str, name: &str) -> Vec<(String, String)> {
    let start = format!("pub struct {name} {{");
    let body = src.split(&start).nth(1).unwrap_or("");
    let body = body.split("\n}").next().unwrap_or("");
    let mut docs = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in body.lines().map(str::trim) {
        if let Some(d) = line.strip_prefix("///") {
            // rustdoc's intra-doc links (`[`X`]`) read as plain code here.
            doc.push(d.trim());
        } else if let Some(f) = line.strip_prefix("pub ") {
            let field = f.split(':').next().unwrap_or("").trim().to_string();
            docs.push((field, doc.join(" ").replace("[`", "`").replace("`]", "`")));
            doc.clear();
        } else if !line.starts_with("#[") {
            doc.clear();
        }
    }
    docs
}

fn conflist_section(out: &mut String) {
    const FILE: &str = "crates/cni-config/src/lib.rs";
    let docs = field_docs(&read(FILE), "PluginSettings");
    let entry = cni_config::PluginSettings::default().to_plugin_entry();
    writeln!(out, "## The plugin's conflist entry\n").unwrap();
    writeln!(
        out,
        "The fields of `cni_config::PluginSettings` (`{FILE}`) as install-cni writes them by \
         default; unknown fields are ignored. Meanings, with install-cni's variable for each: \
         [operations.md](operations.md#configuration).\n"
    )
    .unwrap();
    writeln!(out, "| field | default | meaning |\n|---|---|---|").unwrap();
    for (k, v) in entry.as_object().unwrap() {
        let doc = docs
            .iter()
            .find(|(f, _)| f == k)
            .map(|(_, d)| d.as_str())
            .unwrap_or(if k == "name" || k == "type" {
                "Plugin type and name as installed."
            } else {
                ""
            });
        writeln!(
            out,
            "| {} | {} | {} |",
            code(k),
            code(&v.to_string()),
            cell(doc)
        )
        .unwrap();
    }
    out.push('\n');
}

// ---------------------------------------------------------------- 4. names read from pods

fn pod_names_section(out: &mut String) {
    writeln!(out, "## What the plugin and the daemon read from pods\n").unwrap();
    writeln!(
        out,
        "Every string constant of `crates/pod-policy` outside its tests: the annotation and \
         label keys, container env and container names by which Istio's pods are judged \
         (`pod_policy::decide`, used by the plugin, the daemon and the CLI). How each maps \
         onto istio-iptables' flags: [operations.md](operations.md#configuration).\n"
    )
    .unwrap();
    writeln!(
        out,
        "| name | kind | constant | meaning |\n|---|---|---|---|"
    )
    .unwrap();
    for (file, text) in rust_files("crates/pod-policy/src") {
        let module = Path::new(&file).file_stem().unwrap().to_string_lossy();
        let mut inner: Option<String> = None;
        let mut doc: Vec<&str> = Vec::new();
        for line in without_tests(&text).lines().map(str::trim) {
            if let Some(m) = line
                .strip_prefix("pub mod ")
                .and_then(|m| m.strip_suffix(" {"))
            {
                inner = Some(m.to_string());
            } else if line == "}" {
                inner = None;
            }
            if let Some(d) = line.strip_prefix("///") {
                doc.push(d.trim());
                continue;
            }
            let konst = line
                .strip_prefix("pub const ")
                .and_then(|r| r.split_once(": &str = \""))
                .and_then(|(n, v)| Some((n, v.strip_suffix("\";")?)));
            if let Some((name, value)) = konst {
                let path = match &inner {
                    Some(m) => format!("{module}::{m}::{name}"),
                    None => format!("{module}::{name}"),
                };
                let kind = if value.contains('/') {
                    "annotation or label key"
                } else if value.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
                    "istio-proxy env"
                } else {
                    "name or value"
                };
                let row = [code(value), kind.into(), code(&path), cell(&doc.join(" "))];
                writeln!(out, "| {} |", row.join(" | ")).unwrap();
            }
            doc.clear();
        }
    }
    out.push('\n');
}

// ---------------------------------------------------------------- 5. metrics

/// The string literal that starts `s` (after whitespace), and what follows it.
fn literal(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start().strip_prefix('"')?;
    let end = s.find('"')?;
    Some((&s[..end], &s[end + 1..]))
}

/// `"istio_cni_x", "help", &["label", …]` as the families are created; and the
/// `("suffix", "help", …)` rows a `format!("istio_cni_prefix_{name}")` loop renders.
fn metric_families(src: &str) -> Vec<(String, String, String, String)> {
    let mut found = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("\"istio_cni_") {
        let before = &rest[..i];
        let kind = match before.rfind(['(', '{']).map(|p| &before[..p]) {
            Some(b) if b.ends_with("Gauge::new") || b.ends_with("gauge") => "gauge",
            Some(b) if b.ends_with("Histograms::new") => "histogram",
            _ => "counter",
        };
        let (name, after) = literal(&rest[i..]).unwrap();
        rest = after;
        if let Some(prefix) = name.strip_suffix("{name}") {
            for (suffix, help) in tuples(before) {
                found.push((
                    format!("{prefix}{suffix}"),
                    help,
                    "counter".into(),
                    "".into(),
                ));
            }
            continue;
        }
        let Some((help, after)) = after.trim_start().strip_prefix(',').and_then(literal) else {
            continue;
        };
        let labels = after
            .trim_start()
            .strip_prefix(",")
            .map(str::trim_start)
            .and_then(|a| a.strip_prefix("&["))
            .and_then(|a| a.split_once(']'))
            .map(|(l, _)| l.replace(['"', ' ', '\n'], ""))
            .unwrap_or_default();
        found.push((name.into(), help.into(), kind.into(), labels));
    }
    found
}

/// `("suffix", "help",` rows in the function that ends with `before`.
fn tuples(before: &str) -> Vec<(String, String)> {
    let body = before.rsplit("fn ").next().unwrap_or(before);
    let mut rows = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find("(\n") {
        rest = &rest[i + 1..];
        let Some((suffix, after)) = literal(rest) else {
            continue;
        };
        let Some((help, _)) = after.trim_start().strip_prefix(',').and_then(literal) else {
            continue;
        };
        rows.push((suffix.to_string(), help.to_string()));
    }
    rows
}

fn metrics_section(out: &mut String) {
    const CRATES: [&str; 5] = [
        "node-status",
        "cni-installer",
        "guardian",
        "node-view",
        "ambient-agent",
    ];
    writeln!(out, "## Metrics\n").unwrap();
    writeln!(
        out,
        "Prometheus text on `MONITORING_PORT` (`/metrics`): the `istio_cni_*` families created \
         in `crates/{{{}}}` (outside tests). Every series exists from the start, zeros \
         included.\n",
        CRATES.join(",")
    )
    .unwrap();
    writeln!(
        out,
        "| metric | type | labels | help | defined in |\n|---|---|---|---|---|"
    )
    .unwrap();
    let mut seen = BTreeSet::new();
    for c in CRATES {
        for (file, text) in rust_files(&format!("crates/{c}/src")) {
            for (name, help, kind, labels) in metric_families(without_tests(&text)) {
                if seen.insert(name.clone()) {
                    let row = [code(&name), kind, code(&labels), cell(&help), code(&file)];
                    writeln!(out, "| {} |", row.join(" | ")).unwrap();
                }
            }
        }
    }
    out.push('\n');
}

// ---------------------------------------------------------------- the document

fn reference() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated by integration/tests/reference_doc.rs; do not edit. Regenerate with\n\
         UPDATE_REFERENCE=1 cargo test -p integration --test reference_doc -->\n\n\
         Generated from the code: the daemon's own `--help`, the chart's `values.yaml`, the \
         plugin's settings type, the pod names `pod-policy` reads and the metric families the \
         daemon's jobs create. What each setting means in practice, and how they fit together: \
         [operations.md](operations.md).\n\n",
    );
    daemon_section(&mut out);
    chart_section(&mut out);
    conflist_section(&mut out);
    pod_names_section(&mut out);
    metrics_section(&mut out);
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
        + "\n"
}

#[test]
fn reference_md_is_generated_from_the_code() {
    let want = reference();
    let path = root().join(DOC);
    if std::env::var_os("UPDATE_REFERENCE").is_some() {
        std::fs::write(&path, &want).unwrap();
        eprintln!("reference_doc: wrote {}", path.display());
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have == want {
        return;
    }
    let (h, w): (Vec<&str>, Vec<&str>) = (have.lines().collect(), want.lines().collect());
    let first = (0..h.len().max(w.len()))
        .find(|&i| h.get(i) != w.get(i))
        .unwrap_or(0);
    panic!(
        "{DOC} is stale (first difference at line {}):\n  in the file: {:?}\n  generated:   {:?}\n\
         Regenerate: UPDATE_REFERENCE=1 cargo test -p integration --test reference_doc",
        first + 1,
        h.get(first).unwrap_or(&"<end of file>"),
        w.get(first).unwrap_or(&"<end of file>"),
    );
}
