//! Read-back: what is in the kernel, compared with what the plan would create, as `nft_ir`
//! values. The plan's side is its lowering (`model`, what the batch serialises); the kernel's
//! is a dump read into the same IR (`read`). Chains compare by their base (type, hook,
//! priority), rules by their expressions and comment, an anonymous set by its elements (the
//! kernel picks its name), a named set by its declaration (key type, flags, comment; its
//! elements follow the pods); handles, positions and counters' values are not compared. Reports
//! show each rule in nft syntax (`nft_ir::render`).

use crate::NftError;
use crate::model;
use crate::netlink::Socket;
use capture::Plan;
use nft_ir::{BaseHook, Expr, Rule, Set, TableFamily};

/// A rule as compared: its comment and expressions, each lookup in an anonymous set by the
/// set's elements.
#[derive(Debug, PartialEq, Eq)]
struct Value {
    comment: Option<String>,
    exprs: Vec<Expr>,
}

fn value(rule: &Rule, sets: &[Set], table: &str) -> Value {
    let exprs = rule
        .exprs
        .iter()
        .map(|e| match e {
            Expr::Lookup { sreg, set, invert } if nft_ir::anonymous_id(set).is_some() => {
                let found = sets.iter().find(|s| s.table == table && &s.name == set);
                Expr::Lookup {
                    sreg: *sreg,
                    set: found.map_or_else(|| format!("{set} (missing)"), contents),
                    invert: *invert,
                }
            }
            other => other.clone(),
        })
        .collect();
    Value {
        comment: rule.comment.clone(),
        exprs,
    }
}

/// An anonymous set's elements, in order: an interval set as its ranges `[start, next)`.
fn contents(s: &Set) -> String {
    let mut els = s.elements.clone();
    els.sort();
    let hex = |k: &[u8]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let items: Vec<String> = els
        .iter()
        .enumerate()
        .filter(|(_, (_, end))| !(s.interval && *end))
        .map(|(i, (k, _))| match els.get(i + 1) {
            Some((next, _)) if s.interval => format!("{}-{}", hex(k), hex(next)),
            _ => hex(k),
        })
        .collect();
    format!("{{{}}}", items.join(","))
}

fn header(base: Option<BaseHook>) -> String {
    match base {
        Some(b) => format!(
            "type {} hook {} priority {}",
            b.kind.name(),
            b.hook.name(),
            b.priority
        ),
        None => "regular".into(),
    }
}

/// Readable differences between the plan and the live tables.
pub fn diff(sock: &Socket, plan: &Plan) -> Result<Vec<String>, NftError> {
    let ours: Vec<&str> = plan.owned_tables().iter().map(|t| t.nft_name()).collect();
    let have = crate::read::ruleset(sock, |t| ours.contains(&t), |_| true)?;
    let mut out = Vec::new();
    let mut wanted = Vec::new();
    for t in model::tables(plan) {
        let table = t.table.nft_name();
        out.extend(set_differences(&t.sets, &have.sets, table));
        for c in &t.chains {
            let chain = c.chain.nft_name();
            wanted.push((table, chain));
            let Some(h) = have.chain(TableFamily::Inet, table, chain) else {
                out.push(format!("missing chain {chain} in table inet {table}"));
                continue;
            };
            if h.base != c.base {
                out.push(format!(
                    "chain {chain} in table inet {table}: expected {}, found {}",
                    header(c.base),
                    header(h.base)
                ));
            }
            let w: Vec<(Value, String)> = c
                .rules
                .iter()
                .map(|r| (value(&r.rule, &r.sets, table), r.text(table)))
                .collect();
            let h: Vec<(Value, String)> = h
                .rules
                .iter()
                .map(|r| (value(r, &have.sets, table), r.text.clone()))
                .collect();
            out.extend(rule_differences(
                &w,
                &h,
                &format!("chain {chain} in table inet {table}"),
            ));
        }
    }
    for c in &have.chains {
        if !wanted.contains(&(c.table.as_str(), c.name.as_str())) {
            out.push(format!(
                "unexpected chain {} in table inet {}",
                c.name, c.table
            ));
        }
    }
    Ok(out)
}

/// A named set's declaration as compared: its elements are managed on their own.
fn declaration(s: &Set) -> String {
    let interval = if s.interval { "; flags interval" } else { "" };
    let comment = s.comment.as_deref().unwrap_or("");
    format!("type {}{interval}; comment \"{comment}\"", s.key.name())
}

/// The plan's named sets that are missing in `table` or declared otherwise.
fn set_differences(want: &[Set], have: &[Set], table: &str) -> Vec<String> {
    let mut out = Vec::new();
    for w in want {
        match have.iter().find(|h| h.table == table && h.name == w.name) {
            None => out.push(format!("missing set {} in table inet {table}", w.name)),
            Some(h) if declaration(h) != declaration(w) => out.push(format!(
                "set {} in table inet {table}: expected {}, found {}",
                w.name,
                declaration(w),
                declaration(h)
            )),
            Some(_) => {}
        }
    }
    out
}

/// Missing and unexpected rules of one chain (each with its nft text), or that the same rules
/// are in another order.
fn rule_differences(want: &[(Value, String)], have: &[(Value, String)], at: &str) -> Vec<String> {
    let same = want.len() == have.len() && want.iter().zip(have).all(|(w, h)| w.0 == h.0);
    if same {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (v, text) in want {
        if !have.iter().any(|(h, _)| h == v) {
            out.push(format!("{at}: missing rule: {text}"));
        }
    }
    for (v, text) in have {
        if !want.iter().any(|(w, _)| w == v) {
            out.push(format!("{at}: unexpected rule: {text}"));
        }
    }
    if out.is_empty() {
        out.push(format!(
            "{at}: rules are duplicated or in a different order"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nft_ir::SetKey;

    fn rule(set: &str) -> Rule {
        Rule {
            handle: None,
            position: 1,
            comment: Some("c".into()),
            text: String::new(),
            exprs: vec![Expr::Lookup {
                sreg: 1,
                set: set.into(),
                invert: true,
            }],
        }
    }

    fn set(name: &str, elements: Vec<(Vec<u8>, bool)>) -> Set {
        Set {
            table: "t".into(),
            name: name.into(),
            key: SetKey::Ipv4Addr,
            interval: true,
            comment: None,
            elements,
        }
    }

    /// The kernel names anonymous sets itself and lists elements in its own order: a lookup
    /// compares by the set's elements.
    #[test]
    fn anonymous_sets_compare_by_their_elements() {
        let range = vec![
            (vec![0, 0, 0, 0], true),
            (vec![10, 0, 0, 0], false),
            (vec![11, 0, 0, 0], true),
        ];
        let mut reversed = range.clone();
        reversed.reverse();
        let ours = [set("__set7", range)];
        let kernels = [set("__set0", reversed)];
        assert_eq!(
            value(&rule("__set7"), &ours, "t"),
            value(&rule("__set0"), &kernels, "t")
        );
        let other = [set(
            "__set0",
            vec![(vec![10, 0, 0, 0], false), (vec![12, 0, 0, 0], true)],
        )];
        assert_ne!(
            value(&rule("__set7"), &ours, "t"),
            value(&rule("__set0"), &other, "t")
        );
        // A named set compares by its name.
        assert_ne!(value(&rule("a"), &[], "t"), value(&rule("b"), &[], "t"));
    }
}
