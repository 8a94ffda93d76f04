//! A backend lowers every rule type of the plan exhaustively: no `match` in `nft-backend` or
//! `iptables-legacy` that names a variant of `capture`'s rule enums (`Match`, `Action`, …) has
//! a catch-all arm, so a new variant does not compile until each backend says what it does.

use super::{metadata, rust_files, workspace_root};
use std::collections::BTreeSet;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// `capture`'s enums a backend lowers into rules: the plan's rule types.
const PLAN_ENUMS: [&str; 8] = [
    "Match", "Action", "ChainId", "Table", "Family", "L4", "CtState", "Position",
];

/// The backends' sources: every `match` over the plan's rule types there is exhaustive.
const BACKEND_SOURCES: [&str; 2] = ["crates/nft-backend/src", "crates/iptables-legacy/src"];

/// Every plan enum a pattern names (`Match::Uid { .. }`, `capture::Action::Drop`, …).
fn plan_enums_named(p: &syn::Pat, out: &mut BTreeSet<String>) {
    let mut path = |path: &syn::Path| {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let [.., owner, _variant] = segs.as_slice()
            && PLAN_ENUMS.contains(&owner.as_str())
        {
            out.insert(owner.clone());
        }
    };
    match p {
        syn::Pat::Path(x) => path(&x.path),
        syn::Pat::TupleStruct(x) => {
            path(&x.path);
            x.elems.iter().for_each(|e| plan_enums_named(e, out));
        }
        syn::Pat::Struct(x) => {
            path(&x.path);
            x.fields.iter().for_each(|f| plan_enums_named(&f.pat, out));
        }
        syn::Pat::Or(x) => x.cases.iter().for_each(|c| plan_enums_named(c, out)),
        syn::Pat::Tuple(x) => x.elems.iter().for_each(|e| plan_enums_named(e, out)),
        syn::Pat::Reference(x) => plan_enums_named(&x.pat, out),
        syn::Pat::Paren(x) => plan_enums_named(&x.pat, out),
        syn::Pat::Ident(x) => {
            if let Some((_, sub)) = &x.subpat {
                plan_enums_named(sub, out);
            }
        }
        _ => {}
    }
}

/// An arm that takes whatever the other arms leave: `_`, a bare binding (`other`), or a tuple
/// of those.
fn is_catch_all(p: &syn::Pat) -> bool {
    match p {
        syn::Pat::Wild(_) => true,
        syn::Pat::Ident(x) => x.subpat.is_none(),
        syn::Pat::Tuple(x) => x.elems.iter().all(is_catch_all),
        syn::Pat::Paren(x) => is_catch_all(&x.pat),
        syn::Pat::Reference(x) => is_catch_all(&x.pat),
        _ => false,
    }
}

/// `match`es naming a plan enum with an unguarded catch-all arm: `(line, enums named)`.
#[derive(Default)]
struct CatchAlls(Vec<(usize, String)>);

impl<'ast> Visit<'ast> for CatchAlls {
    fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
        let mut named = BTreeSet::new();
        for arm in &m.arms {
            plan_enums_named(&arm.pat, &mut named);
        }
        let wild = m
            .arms
            .iter()
            .find(|a| a.guard.is_none() && is_catch_all(&a.pat));
        if let Some(arm) = wild
            && !named.is_empty()
        {
            let enums: Vec<String> = named.into_iter().collect();
            self.0.push((arm.pat.span().start().line, enums.join(", ")));
        }
        syn::visit::visit_expr_match(self, m);
    }
}

/// The catch-all arms over plan enums in one source file.
fn catch_alls(source: &str) -> Vec<(usize, String)> {
    let ast = syn::parse_file(source).expect("parses");
    let mut v = CatchAlls::default();
    v.visit_file(&ast);
    v.0
}

#[test]
fn backends_lower_every_rule_type_of_the_plan_exhaustively() {
    let meta = metadata();
    let root = workspace_root(&meta);
    let mut files = Vec::new();
    for d in BACKEND_SOURCES {
        rust_files(&root.join(d), &mut files);
    }
    assert!(
        files.len() >= 10,
        "found only {} backend files",
        files.len()
    );
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (line, enums) in catch_alls(&text) {
            offenders.push(format!(
                "{}:{line}: a catch-all arm in a match over {enums}: name every variant \
                 (one nft or iptables cannot express is an explicit error or a commented no-op)",
                f.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    println!(
        "layout: {} backend files, every match over the plan's rule types names every variant",
        files.len()
    );
}

/// The detector itself, on small sources.
#[test]
fn catch_all_detector_finds_wildcards_over_plan_enums_only() {
    let wildcard = r#"
        fn f(m: &Match) -> u8 {
            match m {
                Match::Proto(_) => 1,
                _ => 0,
            }
        }"#;
    assert_eq!(catch_alls(wildcard), vec![(5, "Match".to_string())]);
    let binding = r#"
        fn f(a: &capture::Action) -> u8 {
            match a { capture::Action::Drop => 1, other => g(other) }
        }"#;
    assert_eq!(catch_alls(binding), vec![(3, "Action".to_string())]);
    let tuple = r#"
        fn f(t: Table, c: ChainId) -> u8 {
            match (t, c) { (Table::Nat, ChainId::Output) => 1, (_, _) => 0 }
        }"#;
    assert_eq!(catch_alls(tuple), vec![(3, "ChainId, Table".to_string())]);
    let nested = r#"
        fn f(m: &Match) -> u8 {
            match m {
                Match::Proto(p) => match p { L4::Tcp => 1, L4::Udp => 2 },
                Match::Uid { ids, .. } => match ids.len() { 0 => 0, _ => 1 },
                Match::Gid { .. } | Match::SocketExists => 3,
            }
        }"#;
    assert!(catch_alls(nested).is_empty(), "{:?}", catch_alls(nested));
    // Other enums and guarded arms are not the rail's business.
    let other = r#"
        fn f(x: Option<u8>, m: &Match) -> u8 {
            let a = match x { Some(1) => 1, _ => 0 };
            match m { Match::SrcPort(p) if *p > 0 => 1, Match::SrcPort(_) => 0, _ if a > 0 => 2 }
        }"#;
    assert!(catch_alls(other).is_empty(), "{:?}", catch_alls(other));
}
