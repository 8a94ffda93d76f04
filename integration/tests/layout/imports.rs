//! No file-level import cycle inside a crate: for every target of every workspace crate (its
//! library, binaries, tests, examples, build script), the graph of its module files, one
//! edge from a file to each module file it names (`use crate::…`, `super::…`, `self::…`, a
//! child module's `name::…`, in `use` declarations, paths anywhere and macro arguments), has
//! no cycle.
//!
//! A file naming one of its own ancestors (`super::Item` in a child, `crate::Error` anywhere)
//! is no edge: a parent declares its children and is their facade, so children using the
//! items of the modules they sit in is the module tree itself, not a tangle. Every other
//! reference is one, parent to child included: `a.rs` → `b/c.rs` → `a.rs` is a cycle even
//! when `b/mod.rs` is between them. A path is attributed to the module it names (a
//! re-export is not followed to where it leads).

use super::{metadata, workspace_root};
use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A module by its path from the target's root (`[]` is the root, `["trace", "legacy"]`).
type ModPath = Vec<String>;

/// Cycles known and accepted, as the files of the cycle (relative to the workspace root) in
/// any order, with the reason. Empty: every cycle found so far was fixed.
const ALLOWED: &[(&[&str], &str)] = &[];

/// One target's module files and the edges between them.
#[derive(Default)]
pub struct ModGraph {
    /// Module path → the file that holds it (inline modules map to their file's module).
    files: BTreeMap<ModPath, PathBuf>,
    /// Every module, inline ones included (for resolving paths), → its file module.
    modules: BTreeMap<ModPath, ModPath>,
    /// File module → the file modules it names.
    pub edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

impl ModGraph {
    /// The graph of the target whose root file is `root`.
    pub fn of_target(root: &Path) -> ModGraph {
        let mut g = ModGraph::default();
        let mut paths: BTreeMap<ModPath, Vec<Vec<String>>> = BTreeMap::new();
        g.load(root, Vec::new(), true, &mut paths);
        for (from, refs) in paths {
            for r in refs {
                g.add_edge(&from, &r);
            }
        }
        g
    }

    /// Reads `file` (module `at`), its out-of-line child modules recursively; collects the
    /// paths each inline or file module names, by the module it is named in.
    fn load(
        &mut self,
        file: &Path,
        at: ModPath,
        owns_dir: bool,
        paths: &mut BTreeMap<ModPath, Vec<Vec<String>>>,
    ) {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        self.files.insert(at.clone(), file.to_path_buf());
        // Children of `a/b.rs` live in `a/b/`; of `lib.rs`, `main.rs`, `mod.rs`, beside them.
        let dir = if owns_dir {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        self.items(&ast.items, file, &at, &at, &dir, paths);
    }

    fn items(
        &mut self,
        items: &[syn::Item],
        file: &Path,
        file_mod: &ModPath,
        at: &ModPath,
        dir: &Path,
        paths: &mut BTreeMap<ModPath, Vec<Vec<String>>>,
    ) {
        self.modules.insert(at.clone(), file_mod.clone());
        let mut names = Names::default();
        for item in items {
            let syn::Item::Mod(m) = item else {
                names.visit_item(item);
                continue;
            };
            let mut child = at.clone();
            child.push(m.ident.to_string());
            let sub_dir = dir.join(m.ident.to_string());
            match &m.content {
                Some((_, inner)) => self.items(inner, file, file_mod, &child, &sub_dir, paths),
                None => {
                    let (path, owns_dir) = child_file(m, dir);
                    assert!(
                        path.exists(),
                        "{}: mod {}: no file",
                        file.display(),
                        m.ident
                    );
                    self.load(&path, child, owns_dir, paths);
                }
            }
        }
        paths.entry(at.clone()).or_default().extend(names.paths);
    }

    /// The edge for the path `p` named in module `from`, if it names another file module
    /// that is not one of `from`'s ancestors.
    fn add_edge(&mut self, from: &ModPath, p: &[String]) {
        let Some(target) = self.resolve(from, p) else {
            return;
        };
        let from_file = self.modules[from].clone();
        let to_file = self.modules[&target].clone();
        if to_file == from_file || from_file.starts_with(&to_file) {
            return;
        }
        self.edges.entry(from_file).or_default().insert(to_file);
    }

    /// The deepest module `p` names from module `from`, if it starts at one of ours.
    fn resolve(&self, from: &ModPath, p: &[String]) -> Option<ModPath> {
        let (mut at, rest): (ModPath, &[String]) = match p.first()?.as_str() {
            "crate" => (Vec::new(), &p[1..]),
            "self" => (from.clone(), &p[1..]),
            "super" => {
                let mut at = from.clone();
                let mut i = 0;
                while p.get(i).is_some_and(|s| s == "super") {
                    at.pop()?;
                    i += 1;
                }
                (at, &p[i..])
            }
            // A child module's item (`hook::remove_stale`); a lone name is a local.
            first if p.len() > 1 => {
                let mut child = from.clone();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                (child, &p[1..])
            }
            _ => return None,
        };
        for seg in rest {
            let mut next = at.clone();
            next.push(seg.clone());
            if !self.modules.contains_key(&next) {
                break;
            }
            at = next;
        }
        Some(at)
    }

    /// Every cycle a depth-first search finds (at least one per tangle), as files.
    pub fn cycles(&self) -> Vec<Vec<PathBuf>> {
        fn visit(
            n: &ModPath,
            g: &ModGraph,
            path: &mut Vec<ModPath>,
            done: &mut BTreeSet<ModPath>,
            out: &mut Vec<Vec<PathBuf>>,
        ) {
            if let Some(i) = path.iter().position(|p| p == n) {
                let mut ring: Vec<PathBuf> = path[i..].iter().map(|m| g.files[m].clone()).collect();
                ring.push(g.files[n].clone());
                out.push(ring);
                return;
            }
            if !done.insert(n.clone()) {
                return;
            }
            path.push(n.clone());
            for d in g.edges.get(n).into_iter().flatten() {
                visit(d, g, path, done, out);
            }
            path.pop();
        }
        let mut out = Vec::new();
        let mut done = BTreeSet::new();
        for n in self.files.keys() {
            visit(n, self, &mut Vec::new(), &mut done, &mut out);
        }
        out
    }
}

/// The file of `mod name;` in a module whose children live in `dir`, and whether that file
/// owns its directory (`name/mod.rs`, or a `#[path]` file).
fn child_file(m: &syn::ItemMod, dir: &Path) -> (PathBuf, bool) {
    for a in &m.attrs {
        if let syn::Meta::NameValue(nv) = &a.meta
            && nv.path.is_ident("path")
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
        {
            return (dir.join(s.value()), true);
        }
    }
    let name = m.ident.to_string();
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        (flat, false)
    } else {
        (dir.join(name).join("mod.rs"), true)
    }
}

/// The paths named in one module's items (not in its child modules').
#[derive(Default)]
struct Names {
    paths: Vec<Vec<String>>,
}

impl Names {
    fn use_tree(&mut self, prefix: &mut Vec<String>, t: &syn::UseTree) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.leaf(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.leaf(prefix, &r.ident),
            syn::UseTree::Glob(_) => self.paths.push(prefix.clone()),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }

    /// `use a::b::{self}` names `a::b`; `use a::b::c` names `a::b::c` (maybe a module).
    fn leaf(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut p = prefix.to_vec();
        if ident != "self" {
            p.push(ident.to_string());
        }
        // `use super::X` / `use crate::X` names that module even when X is an item.
        if p.len() == 1 && ident != "self" {
            p.insert(0, "self".into());
        }
        self.paths.push(p);
    }

    /// `crate::a::b`, `super::x`, `name::item` sequences in a macro's tokens.
    fn tokens(&mut self, ts: TokenStream) {
        let tokens: Vec<TokenTree> = ts.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(_) => {
                    let mut p = Vec::new();
                    let mut j = i;
                    while let Some(TokenTree::Ident(id)) = tokens.get(j) {
                        p.push(id.to_string());
                        if !is_colon2(&tokens, j + 1) {
                            break;
                        }
                        j += 3;
                    }
                    if p.len() > 1 {
                        self.paths.push(p);
                    }
                    i = j;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

fn is_colon2(t: &[TokenTree], i: usize) -> bool {
    let colon = |k: usize| matches!(t.get(k), Some(TokenTree::Punct(p)) if p.as_char() == ':');
    colon(i) && colon(i + 1)
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.paths
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    // A nested inline module's items are its own (reached through `ModGraph::items`).
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

/// Every target's root file: `(crate, target kind and name, root file)`.
fn targets() -> (PathBuf, Vec<(String, String, PathBuf)>) {
    let meta = metadata();
    let root = workspace_root(&meta);
    let mut out = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push((
                p["name"].as_str().unwrap().to_string(),
                format!(
                    "{} {}",
                    t["kind"][0].as_str().unwrap(),
                    t["name"].as_str().unwrap()
                ),
                PathBuf::from(t["src_path"].as_str().unwrap()),
            ));
        }
    }
    (root, out)
}

#[test]
fn no_file_level_import_cycle_inside_a_crate() {
    let (root, targets) = targets();
    let mut offenders = Vec::new();
    let mut files = 0;
    for (krate, target, src) in &targets {
        let g = ModGraph::of_target(src);
        files += g.files.len();
        for ring in g.cycles() {
            let shown: Vec<String> = ring
                .iter()
                .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
                .collect();
            let members: BTreeSet<&str> = shown.iter().map(String::as_str).collect();
            let allowed = ALLOWED
                .iter()
                .any(|(fs, _)| fs.iter().copied().collect::<BTreeSet<_>>() == members);
            if !allowed {
                offenders.push(format!("{krate} ({target}): cycle {}", shown.join(" → ")));
            }
        }
    }
    assert!(files > 100, "found only {files} module files");
    offenders.sort();
    offenders.dedup();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: {} targets, {files} module files, no file-level import cycle",
        targets.len()
    );
}

/// The detector on a tiny crate: `a.rs` → `b/c.rs` (through `b/mod.rs`, its parent) →
/// `a.rs` is a cycle; a child using its parent (`super::`) is none.
#[test]
fn the_cycle_detector_names_a_cycle_through_a_parent_and_ignores_ancestors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rel: &str, text: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod a; mod b; pub struct E; fn f() { a::g(); }");
    write("a.rs", "use crate::b::c::C; pub fn g() {}");
    write("b/mod.rs", "mod c; pub use c::C; pub struct D;");
    write(
        "b/c.rs",
        "pub struct C; fn h() { let _ = super::D; tracing::info!(\"{}\", crate::a::g()); }",
    );
    let g = ModGraph::of_target(&dir.path().join("lib.rs"));
    let cycles = g.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    let names: Vec<String> = cycles[0]
        .iter()
        .map(|f| f.strip_prefix(dir.path()).unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["a.rs", "b/c.rs", "a.rs"]);
    // lib.rs → a (a child's item), b/mod.rs → b/c.rs; nothing upward.
    let edge = |f: &[&str], t: &[&str]| {
        let m = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        g.edges.get(&m(f)).is_some_and(|e| e.contains(&m(t)))
    };
    assert!(edge(&[], &["a"]) && edge(&["b"], &["b", "c"]) && edge(&["a"], &["b", "c"]));
    assert!(!edge(&["b", "c"], &["b"]) && !edge(&["b", "c"], &[]));

    // Without the macro's path back to a.rs: no cycle.
    write("b/c.rs", "pub struct C; fn h() { let _ = super::D; }");
    assert!(
        ModGraph::of_target(&dir.path().join("lib.rs"))
            .cycles()
            .is_empty()
    );
}

/// explain's kernel tracer (`trace/`, what the kernel did to a real connection) and its
/// evaluator (`eval.rs`, where the rules say it goes) never name each other: each can be read,
/// tested and replaced alone. `compare.rs` is where the two meet.
#[test]
fn explains_tracer_and_evaluator_never_name_each_other() {
    let root = workspace_root(&metadata());
    let g = ModGraph::of_target(&root.join("crates/explain/src/lib.rs"));
    let is = |m: &ModPath, top: &str| m.first().is_some_and(|s| s == top);
    let mut crossing = Vec::new();
    for (from, tos) in &g.edges {
        for to in tos {
            let (tracer_to_eval, eval_to_tracer) = (
                is(from, "trace") && is(to, "eval"),
                is(from, "eval") && is(to, "trace"),
            );
            if tracer_to_eval || eval_to_tracer {
                crossing.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        g.edges.keys().any(|m| is(m, "trace")) && g.edges.contains_key(&vec!["eval".to_string()]),
        "explain's trace/ and eval.rs not found: update this rail"
    );
    assert!(
        crossing.is_empty(),
        "tracer and evaluator name each other: {crossing:?}"
    );
}
