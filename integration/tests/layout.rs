//! The architecture's guide rails, checked on every run (ARCHITECTURE.md, "Guide rails"):
//!
//! - no source file over 800 lines and no function over 120 lines outside tests, so every file
//!   and every function fits in a reader's head;
//! - the crates' dependencies form a tree with no cycle, and no crate depends on a crate that
//!   builds a binary (the binaries only wire libraries; none is a library for another).
//!
//! Pure (reads the sources and `cargo metadata`); a failure lists every offender.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

fn metadata() -> Value {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every workspace package's `src/` directory.
fn source_dirs(meta: &Value) -> Vec<PathBuf> {
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Path::new(p["manifest_path"].as_str().unwrap()).with_file_name("src"))
        .filter(|d| d.is_dir())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
    })
}

fn lines(span: proc_macro2::Span) -> usize {
    span.end().line - span.start().line + 1
}

/// Functions and non-test lines of one file.
#[derive(Default)]
struct Measure {
    /// Lines inside `#[cfg(test)]` items.
    test_lines: usize,
    long_fns: Vec<(String, usize)>,
}

impl Measure {
    fn body(&mut self, name: String, span: proc_macro2::Span) {
        let n = lines(span);
        if n > MAX_FN_LINES {
            self.long_fns.push((name, n));
        }
    }
}

impl<'ast> Visit<'ast> for Measure {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(m) => &m.attrs,
            _ => {
                syn::visit::visit_item(self, i);
                return;
            }
        };
        if is_test_only(attrs) {
            self.test_lines += lines(i.span());
            return;
        }
        syn::visit::visit_item(self, i);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.body(f.sig.ident.to_string(), f.span());
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            self.body(f.sig.ident.to_string(), f.span());
        }
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if f.default.is_some() {
            self.body(f.sig.ident.to_string(), f.span());
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn files_and_functions_fit_in_a_readers_head() {
    let meta = metadata();
    let mut files = Vec::new();
    for d in source_dirs(&meta) {
        rust_files(&d, &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let mut m = Measure::default();
        m.visit_file(&ast);
        let own = text.lines().count() - m.test_lines;
        if own > MAX_FILE_LINES {
            offenders.push(format!("{}: {own} lines outside tests", f.display()));
        }
        for (name, n) in m.long_fns {
            offenders.push(format!("{}: fn {name} is {n} lines", f.display()));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: {} source files, none over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES}",
        files.len()
    );
}

#[test]
fn crates_form_a_tree_and_no_crate_uses_a_binary_crate() {
    let meta = metadata();
    let pkgs = meta["packages"].as_array().unwrap();
    let names: BTreeSet<&str> = pkgs.iter().map(|p| p["name"].as_str().unwrap()).collect();
    let has_bin: BTreeSet<&str> = pkgs
        .iter()
        .filter(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        })
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    // Normal (non-dev) dependencies inside the workspace.
    let deps: BTreeMap<&str, Vec<&str>> = pkgs
        .iter()
        .map(|p| {
            let d = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|n| names.contains(n))
                .collect();
            (p["name"].as_str().unwrap(), d)
        })
        .collect();
    let mut offenders = Vec::new();
    for (p, ds) in &deps {
        for d in ds {
            if has_bin.contains(d) {
                offenders.push(format!("{p} depends on {d}, which builds a binary"));
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit<'a>(
        n: &'a str,
        deps: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == n) {
            cycles.push(format!("cycle: {} -> {n}", path[i..].join(" -> ")));
            return;
        }
        if !done.insert(n) {
            return;
        }
        path.push(n);
        for d in deps.get(n).into_iter().flatten() {
            visit(d, deps, path, done, cycles);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for n in deps.keys() {
        visit(n, &deps, &mut Vec::new(), &mut done, &mut offenders);
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: {} crates, {} with binaries ({}), no crate depends on one, no cycle",
        names.len(),
        has_bin.len(),
        has_bin.iter().copied().collect::<Vec<_>>().join(", ")
    );
}
