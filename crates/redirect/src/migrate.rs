//! Live migration of a running pod's rules from one backend to another (issue 13, item 2).
//!
//! Everywhere else the rule is "never two kinds in one namespace" ([`crate::apply_until`]
//! removes every other kind before programming). Migration relaxes it on purpose for a moment:
//! the new backend is programmed completely and verified *before* the old one is removed, so
//! at every instant one complete capture is in place. The whole step runs under one hold of
//! the namespace's lock, so no other caller (ADD, CHECK, DEL, the CLI, the daemon) ever
//! observes the overlap or creates one of its own.
//!
//! # Why the overlap captures every connection, whichever hook runs first
//!
//! Both backends register NAT base chains at the same hooks and priorities (nat prerouting /
//! output at -100, postrouting at 100; mangle at -150), and netfilter runs equal priorities in
//! registration order, so during the overlap the *old* backend's chains usually see a packet
//! first. It does not matter, because of how NAT is bound: for a new connection, the NAT core
//! (`nf_nat_inet_fn`) calls the NAT chains of a hook one after another and stops at the first
//! one that sets up a NAT binding (REDIRECT); a chain that lets the packet pass without NAT (an
//! exclusion: RETURN / accept) hands it to the next chain. The binding is made once, on the
//! connection's first packet, and conntrack applies it to every later packet. Both chains
//! render the SAME plan, so:
//!
//! - a connection the plan redirects is redirected by whichever chain sees it first, to the
//!   same port (15001 / 15006): it lands on Envoy either way;
//! - a connection the plan excludes passes the first chain without NAT and is excluded again
//!   by the second: the union of two identical policies is that policy;
//! - connections that started before (or during) the overlap keep their binding when the old
//!   chains go away, because conntrack no longer consults the chains for them.
//!
//! Non-NAT rules (TPROXY's mangle marks and `tproxy` statements) are idempotent the same way:
//! both set the same mark and divert to the same port. So neither registration order needs
//! forcing, and the only order that matters is ours: new complete and verified first, old
//! removed after. Removing the other way round would leave a window with no capture at all.

use crate::backend::{self, RuleBackend};
use crate::{Backend, RedirectError, locked};
use capture::Plan;
use netns::NsLock;
use std::fmt;
use std::path::Path;
use std::time::Instant;

/// What [`migrate`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migration {
    /// The backends whose rules of ours the namespace held before (empty: none; both: an
    /// earlier migration was interrupted).
    pub found: Vec<Backend>,
    pub to: Backend,
    /// False when only `to`'s rules were there: nothing was touched.
    pub changed: bool,
}

impl fmt::Display for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let found = kinds_text(&self.found);
        if self.changed {
            write!(
                f,
                "migrated from {found} to {}: {} programmed and verified, then the old rules removed",
                self.to, self.to
            )
        } else {
            write!(f, "already on {}: nothing to do", self.to)
        }
    }
}

fn kinds_text(kinds: &[Backend]) -> String {
    match kinds {
        [] => "no rules of ours".into(),
        [one] => one.to_string(),
        _ => kinds
            .iter()
            .map(Backend::to_string)
            .collect::<Vec<_>>()
            .join(" + "),
    }
}

/// How [`migrate_with`] works; the default uses the registry's backends ([`backend::all`]),
/// as every other call does.
#[derive(Debug, Default)]
pub struct MigrateOptions {
    /// Backends used instead of the registry's of the same kind: e.g. a
    /// `LegacyRules::with_tools` looking its binaries up elsewhere, or (tests) an
    /// `NftRules::poisoned`, to prove a failed program leaves the old rules.
    pub replace: Vec<Box<dyn RuleBackend>>,
}

/// Moves the namespace's rules for `plan` to backend `to` in place: program `to` completely and
/// verify it, then remove the other backend's rules, then verify the end state (only `to`'s
/// rules, no drift). No connection escapes capture meanwhile (see the module docs). Gives up on
/// the namespace's lock at `deadline`.
///
/// If only `to`'s rules are there, nothing is done. If programming or verifying `to` fails, the
/// old rules are left as they were (the pod keeps its capture) and the error says so; if
/// removing the old rules fails, both complete sets stay (capture intact) and the error says
/// so: running `migrate` again finishes the job.
pub fn migrate(
    plan: &Plan,
    netns: Option<&Path>,
    to: Backend,
    deadline: Instant,
) -> Result<Migration, RedirectError> {
    migrate_with(plan, netns, to, deadline, &MigrateOptions::default())
}

/// [`migrate`] with explicit options.
pub fn migrate_with(
    plan: &Plan,
    netns: Option<&Path>,
    to: Backend,
    deadline: Instant,
    opts: &MigrateOptions,
) -> Result<Migration, RedirectError> {
    let backends = backend::all().map(|b| {
        let replaced = opts.replace.iter().find(|r| r.kind() == b.kind());
        replaced.map_or(b, |r| r.as_ref())
    });
    locked(netns, deadline, |held| {
        migrate_among(&backends, plan, to, held)
    })
}

/// [`migrate_with`]'s work in the calling thread's namespace, its lock `held`, over `backends`.
pub(crate) fn migrate_among(
    backends: &[&dyn RuleBackend],
    plan: &Plan,
    to: Backend,
    held: &NsLock,
) -> Result<Migration, RedirectError> {
    let found = kinds_here(backends)?;
    if found == [to] {
        return Ok(Migration {
            found,
            to,
            changed: false,
        });
    }
    let step = Step { to, backends, held };
    step.program_and_verify(plan, &found)?;
    step.remove_old(plan, &found)?;
    step.verify_end(plan)?;
    tracing::info!(from = %kinds_text(&found), %to, "migrated");
    Ok(Migration {
        found,
        to,
        changed: true,
    })
}

/// Which backends' rules of ours the calling thread's namespace holds, the registry's order
/// reversed (the fallbacks before the preferred one, as [`Migration::found`] has always
/// listed them: `iptables-legacy + nft`).
fn kinds_here(backends: &[&dyn RuleBackend]) -> Result<Vec<Backend>, RedirectError> {
    let mut kinds = Vec::new();
    for b in backends.iter().rev() {
        if b.has_ours()? {
            kinds.push(b.kind());
        }
    }
    Ok(kinds)
}

/// One migration's steps, inside the namespace with its lock held.
struct Step<'a> {
    to: Backend,
    backends: &'a [&'a dyn RuleBackend],
    held: &'a NsLock,
}

impl Step<'_> {
    fn fail(&self, step: &'static str, cause: RedirectError, state: String) -> RedirectError {
        RedirectError::Migrate {
            to: self.to,
            step,
            cause: Box::new(cause),
            state,
        }
    }

    /// Programs `to` and checks it; on failure removes what was programmed (unless `to`'s rules
    /// were already there before), so the old rules alone remain.
    fn program_and_verify(&self, plan: &Plan, found: &[Backend]) -> Result<(), RedirectError> {
        let before = kinds_text(found);
        if let Err(e) = self.program(plan) {
            // Both backends' apply leave the namespace as it was when they fail.
            return Err(self.fail("programming", e, format!("{before}, unchanged")));
        }
        let drift = match self.drift(plan) {
            Ok(d) => d,
            Err(e) => vec![format!("could not read back: {e}")],
        };
        if drift.is_empty() {
            return Ok(());
        }
        let state = if found.contains(&self.to) {
            format!("{before} (the {} rules re-programmed)", self.to)
        } else {
            match self.remove(self.to, plan) {
                Ok(()) => format!("{before}, unchanged"),
                Err(e) => format!("{before} + a partial {} program ({e})", self.to),
            }
        };
        Err(self.fail("verifying", RedirectError::Drift(drift), state))
    }

    /// Removes every other backend's rules that were there.
    fn remove_old(&self, plan: &Plan, found: &[Backend]) -> Result<(), RedirectError> {
        for &old in found.iter().filter(|&&b| b != self.to) {
            self.remove(old, plan).map_err(|e| {
                self.fail(
                    "removing the old rules",
                    e,
                    format!("{} (complete) + what is left of {old}", self.to),
                )
            })?;
        }
        Ok(())
    }

    /// Only `to`'s rules, in sync with the plan.
    fn verify_end(&self, plan: &Plan) -> Result<(), RedirectError> {
        let kinds = kinds_here(self.backends)?;
        let drift = self.drift(plan)?;
        if kinds == [self.to] && drift.is_empty() {
            return Ok(());
        }
        let state = kinds_text(&kinds);
        let mut what = drift;
        if kinds != [self.to] {
            what.insert(0, format!("expected only {} rules, found {state}", self.to));
        }
        Err(self.fail("verifying the end state", RedirectError::Drift(what), state))
    }

    fn program(&self, plan: &Plan) -> Result<(), RedirectError> {
        backend::among(self.backends, self.to).apply(plan, self.held)
    }

    /// `to`'s drift against the plan, routes included (what `check` reports).
    fn drift(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        let mut drift = backend::among(self.backends, self.to).check(plan)?;
        drift.extend(pod_routes::drift(plan).map_err(nft_backend::NftError::from)?);
        Ok(drift)
    }

    /// Removes one backend's rules only, the plan's rules in legacy's built-in chains included
    /// (verified by reading back). The shared routes stay: the remaining backend needs them.
    fn remove(&self, backend: Backend, plan: &Plan) -> Result<(), RedirectError> {
        backend::among(self.backends, backend).remove_plan(plan, self.held)
    }
}
