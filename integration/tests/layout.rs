//! The architecture's guide rails, checked on every run (ARCHITECTURE.md, "Guide rails"):
//!
//! - no source file over 800 lines and no function over 120 lines outside tests, so every file
//!   and every function fits in a reader's head (the file limit also holds for examples and the
//!   tests' shared modules, e.g. `tests/common/`; a test target's own file has none);
//! - the crates' dependencies, dev- and build-dependencies included, have no cycle, and no crate
//!   depends in any way on a crate that builds a binary (the binaries only wire libraries; none
//!   is a library for another); `testbed`, the rigs every crate's tests use, depends on no crate
//!   of the workspace;
//! - ARCHITECTURE.md's `| crate | uses |` tables are the real normal dependencies between the
//!   workspace's crates, every crate in exactly one row;
//! - the rigs have one fake Kubernetes API server, `testbed::kube_api::FakeKube`;
//! - no file-level import cycle inside a crate (`imports`).
//! - a backend lowers every rule type of the plan exhaustively: no `match` in `nft-backend` or
//!   `iptables-legacy` that names a variant of `capture`'s rule enums (`Match`, `Action`, …) has
//!   a catch-all arm, so a new variant does not compile until each backend says what it does
//!   (`exhaustive`).
//!
//! Pure (reads the sources and `cargo metadata`); a failure lists every offender.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::spanned::Spanned;
use syn::visit::Visit;

#[path = "layout/exhaustive.rs"]
mod exhaustive;
#[path = "layout/imports.rs"]
mod imports;

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

fn workspace_root(meta: &Value) -> PathBuf {
    PathBuf::from(meta["workspace_root"].as_str().unwrap())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            let name = e.file_name();
            // A build directory inside the tree (generated code) is not ours to measure.
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// How a file under `crates/` or `integration/` is measured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `src/`, `examples/`, `benches/`, build scripts: both limits.
    Source,
    /// A test target's shared module (`tests/common/…`, `tests/<dir>/<module>.rs`): the file
    /// limit only (test code may have long functions).
    TestSupport,
    /// A test target's own file (`tests/<name>.rs`, `tests/<dir>/main.rs`): no limit.
    TestTarget,
}

fn kind(file: &Path) -> Kind {
    let parts: Vec<_> = file.components().map(|c| c.as_os_str()).collect();
    let Some(t) = parts.iter().rposition(|c| *c == "tests") else {
        return Kind::Source;
    };
    let below = &parts[t + 1..];
    if below.len() == 1 || (below.len() == 2 && below[1] == "main.rs") {
        Kind::TestTarget
    } else {
        Kind::TestSupport
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

    // A closure is a function too: one in a `static` (`LazyLock::new(|| …)`) or a `const`
    // sits in no fn whose length would count it.
    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        let at = c.span().start().line;
        self.body(format!("(closure at line {at})"), c.span());
        syn::visit::visit_expr_closure(self, c);
    }
}

#[test]
fn files_and_functions_fit_in_a_readers_head() {
    let meta = metadata();
    let root = workspace_root(&meta);
    let mut files = Vec::new();
    for d in ["crates", "integration"] {
        rust_files(&root.join(d), &mut files);
    }
    let measured: Vec<(PathBuf, Kind)> = files
        .into_iter()
        .map(|f| {
            let k = kind(f.strip_prefix(&root).unwrap());
            (f, k)
        })
        .filter(|(_, k)| *k != Kind::TestTarget)
        .collect();
    let support = measured
        .iter()
        .filter(|(_, k)| *k == Kind::TestSupport)
        .count();
    assert!(
        measured.len() > 50 && support > 5,
        "found only {} files ({support} test support modules)",
        measured.len()
    );
    let mut offenders = Vec::new();
    for (f, k) in &measured {
        let text = std::fs::read_to_string(f).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let mut m = Measure::default();
        m.visit_file(&ast);
        let own = text.lines().count() - m.test_lines;
        if own > MAX_FILE_LINES {
            offenders.push(format!("{}: {own} lines outside tests", f.display()));
        }
        if *k == Kind::Source {
            for (name, n) in m.long_fns {
                offenders.push(format!("{}: fn {name} is {n} lines", f.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: {} files ({support} of them tests' shared modules), none over {MAX_FILE_LINES} \
         lines, no function outside tests over {MAX_FN_LINES}",
        measured.len()
    );
}

/// The workspace's crates and their dependencies on each other.
struct Graph {
    names: BTreeSet<String>,
    /// Crates with a `bin` target.
    has_bin: BTreeSet<String>,
    /// Each crate's manifest directory, relative to the workspace root.
    dirs: BTreeMap<String, PathBuf>,
    /// `(from, to)` → the kinds of that edge (`normal`, `dev`, `build`).
    edges: BTreeMap<(String, String), BTreeSet<&'static str>>,
}

impl Graph {
    fn of(meta: &Value) -> Graph {
        let root = workspace_root(meta);
        let pkgs = meta["packages"].as_array().unwrap();
        let name = |p: &Value| p["name"].as_str().unwrap().to_string();
        let names: BTreeSet<String> = pkgs.iter().map(name).collect();
        let has_bin = pkgs
            .iter()
            .filter(|p| {
                p["targets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
            })
            .map(name)
            .collect();
        let dirs = pkgs
            .iter()
            .map(|p| {
                let manifest = Path::new(p["manifest_path"].as_str().unwrap());
                let dir = manifest.parent().unwrap().strip_prefix(&root).unwrap();
                (name(p), dir.to_path_buf())
            })
            .collect();
        let mut edges: BTreeMap<(String, String), BTreeSet<&'static str>> = BTreeMap::new();
        for p in pkgs {
            for d in p["dependencies"].as_array().unwrap() {
                let to = d["name"].as_str().unwrap();
                if !names.contains(to) {
                    continue;
                }
                let kind = match d["kind"].as_str() {
                    None => "normal",
                    Some("dev") => "dev",
                    Some("build") => "build",
                    Some(k) => panic!("{}: dependency kind {k}", name(p)),
                };
                edges
                    .entry((name(p), to.to_string()))
                    .or_default()
                    .insert(kind);
            }
        }
        Graph {
            names,
            has_bin,
            dirs,
            edges,
        }
    }

    /// `from`'s dependencies of any kind.
    fn deps_of<'a>(&'a self, from: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.edges
            .keys()
            .filter(move |(f, _)| f == from)
            .map(|(_, t)| t.as_str())
    }

    fn describe(&self, from: &str, to: &str) -> String {
        let kinds = &self.edges[&(from.to_string(), to.to_string())];
        let kinds: Vec<&str> = kinds.iter().copied().collect();
        format!("{from} -({})-> {to}", kinds.join("+"))
    }
}

#[test]
fn no_cycle_and_no_crate_uses_a_binary_crate_counting_dev_and_build_dependencies() {
    let g = Graph::of(&metadata());
    let mut offenders = Vec::new();
    for (from, to) in g.edges.keys() {
        if g.has_bin.contains(to) {
            offenders.push(format!("{}, which builds a binary", g.describe(from, to)));
        }
    }
    // Depth-first search for a cycle over every edge: a dev-dependency cycle makes cargo build
    // the crate twice and the layers meaningless just as a normal one does.
    fn visit<'a>(
        n: &'a str,
        g: &'a Graph,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == n) {
            let mut ring: Vec<&str> = path[i..].to_vec();
            ring.push(n);
            let hops: Vec<String> = ring.windows(2).map(|w| g.describe(w[0], w[1])).collect();
            cycles.push(format!("cycle: {}", hops.join(", ")));
            return;
        }
        if !done.insert(n) {
            return;
        }
        path.push(n);
        for d in g.deps_of(n) {
            visit(d, g, path, done, cycles);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for n in &g.names {
        visit(n, &g, &mut Vec::new(), &mut done, &mut offenders);
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: {} crates, {} edges (normal, dev, build), {} with binaries ({}), no crate \
         depends on one, no cycle",
        g.names.len(),
        g.edges.len(),
        g.has_bin.len(),
        g.has_bin.iter().cloned().collect::<Vec<_>>().join(", ")
    );
}

/// The rigs sit below the product: `testbed`, which every crate's tests use, depends on no
/// crate of the workspace (so no crate's tests can close a cycle through it), and
/// `integration`, which needs the product's own types, is used only inside `integration/`
/// (its tests, the benchmarks), never by a product crate.
#[test]
fn the_test_rigs_sit_below_the_product() {
    let g = Graph::of(&metadata());
    let mut offenders = Vec::new();
    for (from, to) in g.edges.keys() {
        if from == "testbed" {
            offenders.push(format!(
                "{}: testbed must use no crate of ours",
                g.describe(from, to)
            ));
        }
        if to == "integration" && !g.dirs[from].starts_with("integration") {
            offenders.push(format!(
                "{} ({}): only integration/ uses integration; a product crate's tests use testbed",
                g.describe(from, to),
                g.dirs[from].display()
            ));
        }
    }
    assert!(g.names.contains("testbed") && g.names.contains("integration"));
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// Names in backticks in `cell`, leaving out what is in parentheses (a row's comments, e.g.
/// "`node-view` (`explain --pod`)").
fn crate_names(cell: &str) -> Vec<String> {
    let mut depth = 0usize;
    let mut outside = String::new();
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// ARCHITECTURE.md's `| crate | uses |` tables, as `(crate, the crates it uses)` per row and
/// crate named in the row's first cell.
fn architecture_tables(text: &str) -> Vec<(String, BTreeSet<String>)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let line = line.trim();
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() == 4 && cells[1] == "crate" && cells[2] == "uses" {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if cells.len() != 4 || cells[1].starts_with("---") {
            continue;
        }
        let uses: BTreeSet<String> = crate_names(cells[2]).into_iter().collect();
        for c in crate_names(cells[1]) {
            rows.push((c, uses.clone()));
        }
    }
    rows
}

/// ARCHITECTURE.md's edge tables say exactly what the manifests say. Every workspace crate has
/// its row, the test rigs and tools included (in their own table), so a new crate or a new
/// dependency cannot land without the page that explains the layout; only normal
/// dependencies are listed (tests' dev-dependencies are checked above instead).
#[test]
fn architecture_md_lists_the_real_normal_dependencies() {
    let meta = metadata();
    let g = Graph::of(&meta);
    let text = std::fs::read_to_string(workspace_root(&meta).join("ARCHITECTURE.md")).unwrap();
    let rows = architecture_tables(&text);
    assert!(
        rows.len() > 10,
        "found only {} rows in ARCHITECTURE.md",
        rows.len()
    );
    let mut offenders = Vec::new();
    let mut listed: BTreeMap<&str, &BTreeSet<String>> = BTreeMap::new();
    for (c, uses) in &rows {
        if !g.names.contains(c) {
            offenders.push(format!(
                "ARCHITECTURE.md has a row for {c}, not a workspace crate"
            ));
        }
        if listed.insert(c, uses).is_some() {
            offenders.push(format!("ARCHITECTURE.md has two rows for {c}"));
        }
    }
    for c in &g.names {
        let real: BTreeSet<String> = g
            .edges
            .iter()
            .filter(|((f, _), kinds)| f == c && kinds.contains("normal"))
            .map(|((_, t), _)| t.clone())
            .collect();
        let Some(table) = listed.get(c.as_str()) else {
            offenders.push(format!("ARCHITECTURE.md has no row for {c}"));
            continue;
        };
        for d in real.difference(table) {
            offenders.push(format!("missing in ARCHITECTURE.md: {c} uses {d}"));
        }
        for d in table.difference(&real) {
            offenders.push(format!("extra in ARCHITECTURE.md: {c} does not use {d}"));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: ARCHITECTURE.md's tables list the {} crates' normal dependencies",
        g.names.len()
    );
}

/// The levels of ARCHITECTURE.md's picture (the ```text block after "## Who uses whom"): each
/// line names crates, a line starting with a number opens that level. `crate → level`.
fn picture_levels(text: &str, names: &BTreeSet<String>) -> BTreeMap<String, usize> {
    let after = text.split("## Who uses whom").nth(1).unwrap_or("");
    let block = after.split("```text").nth(1).unwrap_or("");
    let block = block.split("```").next().unwrap_or("");
    let mut levels = BTreeMap::new();
    let mut level = None;
    for line in block.lines() {
        let mut words = line.split_whitespace().peekable();
        if let Some(n) = words.peek().and_then(|w| w.parse::<usize>().ok()) {
            level = Some(n);
            words.next();
        }
        let Some(l) = level else { continue };
        for w in words.take_while(|w| names.contains(*w)) {
            levels.insert(w.to_string(), l);
        }
    }
    levels
}

#[test]
fn architecture_md_puts_each_product_crate_on_its_level() {
    let meta = metadata();
    let g = Graph::of(&meta);
    let text = std::fs::read_to_string(workspace_root(&meta).join("ARCHITECTURE.md")).unwrap();
    let drawn = picture_levels(&text, &g.names);
    let uses = |c: &str| -> Vec<String> {
        g.edges
            .iter()
            .filter(|((f, _), kinds)| f == c && kinds.contains("normal"))
            .map(|((_, t), _)| t.clone())
            .collect()
    };
    // A crate's level: the length of its longest chain of normal dependencies.
    fn level(
        c: &str,
        uses: &dyn Fn(&str) -> Vec<String>,
        memo: &mut BTreeMap<String, usize>,
    ) -> usize {
        if let Some(l) = memo.get(c) {
            return *l;
        }
        let l = uses(c)
            .iter()
            .map(|d| level(d, uses, memo) + 1)
            .max()
            .unwrap_or(0);
        memo.insert(c.to_string(), l);
        l
    }
    let mut memo = BTreeMap::new();
    let mut offenders = Vec::new();
    // The test rigs and tools live outside the picture (their own table).
    let product = g
        .names
        .iter()
        .filter(|c| !g.dirs[*c].starts_with("integration"));
    for c in product {
        let real = level(c, &uses, &mut memo);
        match drawn.get(c) {
            None => offenders.push(format!("{c} is not in the picture (its level is {real})")),
            Some(l) if *l != real => {
                offenders.push(format!("{c} is drawn on level {l}, its level is {real}"))
            }
            Some(_) => {}
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: ARCHITECTURE.md's picture puts {} crates on their levels",
        drawn.len()
    );
}

/// Whether `text` (one file, or a module's files together) is a fake Kubernetes API server: it
/// names the API's paths (`/api/v1…`, or routes on `"api", "v1"`) and binds a TCP listener,
/// which is how the plugin and the daemon reach an API server. A client of the API (a test
/// that filters recorded requests by path) binds none; the hostile servers of the run dir's
/// sockets bind Unix listeners.
fn is_fake_api_server(text: &str) -> bool {
    let names_api_paths = text.contains("/api/v1") || text.contains(r#""api", "v1""#);
    names_api_paths && text.contains("TcpListener::bind")
}

/// The places fake API servers would be written in: the rigs (`testbed`, `integration`'s lib)
/// and every test directory. Each file is judged alone, and a module directory (one with a
/// `mod.rs`, e.g. `tests/common/`) as a whole too, so a server split over its files counts.
fn fake_api_servers(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![
        root.join("integration/testbed/src"),
        root.join("integration/src"),
        root.join("integration/tests"),
    ];
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        dirs.push(e.path().join("tests"));
    }
    let mut files = Vec::new();
    for d in dirs.iter().filter(|d| d.is_dir()) {
        rust_files(d, &mut files);
    }
    // This file spells the signals out.
    files.retain(|f| !f.ends_with("integration/tests/layout.rs"));
    let mut modules: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut servers = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        if is_fake_api_server(&text) {
            servers.insert(f.clone());
        }
        let dir = f.parent().unwrap();
        if dir.join("mod.rs").is_file() {
            modules
                .entry(dir.to_path_buf())
                .or_default()
                .push_str(&text);
        }
    }
    for (dir, text) in &modules {
        let counted = servers.iter().any(|s| s.starts_with(dir));
        if !counted && is_fake_api_server(text) {
            servers.insert(dir.clone());
        }
    }
    servers.into_iter().collect()
}

/// One fake Kubernetes API server in the rigs, `testbed::kube_api::FakeKube`, with every fault
/// mode (issue #32): a new test adds the fault it needs there instead of a server of its own.
#[test]
fn the_rigs_have_one_fake_api_server() {
    let root = workspace_root(&metadata());
    let servers: Vec<String> = fake_api_servers(&root)
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    let kube_api = |s: &String| s.starts_with("integration/testbed/src/kube_api");
    assert!(
        servers.iter().any(kube_api),
        "testbed's kube_api is not recognised as the fake API server: {servers:?}"
    );
    let others: Vec<&String> = servers.iter().filter(|s| !kube_api(s)).collect();
    assert!(
        others.is_empty(),
        "a fake Kubernetes API server besides testbed::kube_api::FakeKube (add the fault mode \
         you need to FakeKube instead): {others:?}"
    );
}

#[test]
fn the_fake_api_detector_tells_servers_from_clients() {
    // FakeApi as it was in testbed's cni.rs: a server of its own.
    let server = r#"let listener = ns.run(|| TcpListener::bind("127.0.0.1:0"))??;
        .insert(format!("/api/v1/namespaces/{namespace}/pods/{name}"), pod);"#;
    assert!(is_fake_api_server(server));
    // kube_api's router: slice patterns, no path literal.
    let router = r#"("GET", ["api", "v1", "pods"]) => list_pods(&mut conn, inner, query),
        Self::serve_on(TcpListener::bind("127.0.0.1:0").unwrap())"#;
    assert!(is_fake_api_server(router));
    // A test that reads what the fake API recorded, and one with a hostile run-dir socket.
    let client = r#"let path = format!("/api/v1/namespaces/{}/pods/{}", ns, name);
        kube.requests().into_iter().filter(|r| r.path == path)"#;
    assert!(!is_fake_api_server(client));
    let uds = r#"node.api.answer("/api/v1/namespaces/default/pods/web", "200 OK", other);
        let listener = UnixListener::bind(path).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");"#;
    assert!(!is_fake_api_server(uds));
    // A server split over a module's files is found by its module.
    let dir = std::env::temp_dir().join(format!("layout-fake-api-{}", std::process::id()));
    let module = dir.join("crates/some-crate/tests/common");
    std::fs::create_dir_all(&module).unwrap();
    std::fs::write(module.join("mod.rs"), "let l = TcpListener::bind(a);").unwrap();
    std::fs::write(
        module.join("routes.rs"),
        r#"("GET", ["api", "v1", "pods"]) => {}"#,
    )
    .unwrap();
    std::fs::write(dir.join("crates/some-crate/tests/t.rs"), client).unwrap();
    let found = fake_api_servers(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, [module]);
}
