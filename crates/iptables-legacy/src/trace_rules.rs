//! The temporary `-j TRACE` rules of `istio-nftables explain --trace` on iptables-legacy pods.
//! The `explain` crate decides what they match and tags each with a comment; this module
//! inserts them first in a `raw` built-in chain, finds them again by their tag (the run that
//! added them, a later run cleaning up after a killed one, tests) and deletes them. Every
//! change is one `*-legacy-restore --noflush` under the caller's hold of the namespace's lock,
//! as the backend's own restores are (see the crate docs): a restore already fed its input
//! commits even if we are killed, and never interleaves with a CNI ADD or a reconcile.
//!
//! Works on the calling thread's namespace, as the rest of the crate.

use crate::save::parse;
use crate::tools::Fam;
use crate::{LegacyError, Tools, tables_instantiated};
use netns::NsLock;

/// The only table TRACE is valid in.
const TABLE: &str = "raw";

/// One TRACE rule to insert: `-I <chain> 1 <spec>`; `spec` ends with `-j TRACE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRule {
    pub chain: &'static str,
    pub spec: String,
}

/// A tagged rule found in the raw table: its family, chain and text as iptables-save prints
/// it (after `-A CHAIN `), and its comment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tagged {
    pub v6: bool,
    pub chain: String,
    pub rule: String,
    pub comment: String,
}

fn fam(v6: bool) -> Fam {
    if v6 { Fam::V6 } else { Fam::V4 }
}

/// Inserts `rules` (one family) in one restore, each first in its chain.
pub fn insert(
    tools: &Tools,
    v6: bool,
    rules: &[TraceRule],
    held: &NsLock,
) -> Result<(), LegacyError> {
    let mut input = format!("*{TABLE}\n");
    for r in rules {
        input.push_str(&format!("-I {} 1 {}\n", r.chain, r.spec));
    }
    input.push_str("COMMIT\n");
    tools.restore(fam(v6), &input, Some(held), false)
}

/// The raw table's rules (both families) whose comment `select` accepts.
pub fn tagged(tools: &Tools, select: impl Fn(&str) -> bool) -> Result<Vec<Tagged>, LegacyError> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        if !tables_instantiated(fam(v6))? {
            continue;
        }
        let text = tools.save(fam(v6))?;
        out.extend(tagged_in(&text, v6, &select));
    }
    Ok(out)
}

/// [`tagged`] on one family's save output. Pure.
pub fn tagged_in(save_text: &str, v6: bool, select: &impl Fn(&str) -> bool) -> Vec<Tagged> {
    parse(save_text)
        .into_iter()
        .filter(|t| t.name == TABLE)
        .flat_map(|t| t.rules)
        .filter_map(|(chain, rule)| {
            let comment = comment_of(&rule)?.to_string();
            select(&comment).then_some(Tagged {
                v6,
                comment,
                chain,
                rule,
            })
        })
        .collect()
}

/// The `--comment` of a save rule (a tag of ours has no spaces or quotes).
pub fn comment_of(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    words.find(|w| *w == "--comment")?;
    words.next().map(|c| c.trim_matches('"'))
}

/// Deletes `rules`, one restore per family that has any.
pub fn delete(tools: &Tools, rules: &[Tagged], held: &NsLock) -> Result<(), LegacyError> {
    for v6 in [false, true] {
        let mine: Vec<&Tagged> = rules.iter().filter(|r| r.v6 == v6).collect();
        if mine.is_empty() {
            continue;
        }
        let mut input = format!("*{TABLE}\n");
        for r in mine {
            input.push_str(&format!("-D {} {}\n", r.chain, r.rule));
        }
        input.push_str("COMMIT\n");
        tools.restore(fam(v6), &input, Some(held), false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_tagged_rules_in_raw_only() {
        let save = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -i lo -p tcp -m tcp --sport 40123 -m comment --comment istio-explain-1-1 -j TRACE\n-A OUTPUT -p udp -m udp --dport 53 -m owner --uid-owner 1337 -j CT --zone 1\n-A OUTPUT -p tcp -m comment --comment \"other words\" -j TRACE\nCOMMIT\n*nat\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -m comment --comment istio-explain-1-2 -j RETURN\nCOMMIT\n";
        let got = tagged_in(save, true, &|c: &str| c.starts_with("istio-explain-"));
        assert_eq!(
            got,
            vec![Tagged {
                v6: true,
                chain: "PREROUTING".into(),
                rule: "-i lo -p tcp -m tcp --sport 40123 -m comment --comment istio-explain-1-1 -j TRACE".into(),
                comment: "istio-explain-1-1".into(),
            }]
        );
        assert_eq!(comment_of("-p tcp -j RETURN"), None);
    }
}
