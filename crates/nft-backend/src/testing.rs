//! Test support, outside every production path: a plan the kernel refuses at its very end,
//! built from the plan's public pieces, to prove that a refused batch leaves the namespace
//! exactly as it was (this crate's tests, redirect's migration tests).

use capture::{Action, Family, Match, PlacedRule, Plan, Position, Rule, Step};

/// The comment of the refused rule (the error names it).
pub const POISONED: &str = "poisoned: looks up a set that does not exist";

/// `plan` plus one last rule, in the last chain the batch creates, that looks up a set the
/// table does not have: the kernel refuses it after creating (or deleting) everything else.
pub fn poisoned(plan: &Plan) -> Plan {
    let mut out = plan.clone();
    if let Some(last) = plan.chains(crate::expand_for_nft).pop() {
        out.steps.push(Step(vec![PlacedRule {
            table: last.table,
            chain: last.chain,
            at: Position::Append,
            rule: Rule {
                family: Family::V4,
                matches: vec![Match::DaddrInSet("no-such-set".into())],
                action: Action::Return,
                comment: POISONED.into(),
            },
        }]));
    }
    out
}
