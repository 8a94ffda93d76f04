//! iptables-legacy backend: the same `Plan` as the nft backend, rendered in istio-iptables'
//! restore format (byte-identical to Istio's payloads) and applied with
//! `iptables-legacy-restore --noflush` / `ip6tables-legacy-restore --noflush`, one call per
//! family, atomic per table.
//!
//! Every function works on the *calling thread's* network namespace (enter it first, e.g.
//! with `netns::run_in`). Every call that runs a binary takes the [`Tools`] that say where
//! binaries are looked up (`Tools::default()`: `$PATH`, then /usr/sbin and /sbin); `redirect`'s
//! legacy backend carries them.
//!
//! Re-applying is idempotent: when our `ISTIO_*` chains already exist, the same restore
//! first deletes the jumps to them and the plan's own rules in built-in chains, flushes and
//! deletes our chains, then re-creates everything, so a rerun yields exactly the same rules.
//! Comparisons with live rules are made in iptables-save's canonical form: the expected rules
//! are restored into a private scratch namespace and saved back (see [`check`]).
//!
//! # Concurrency
//!
//! Reading the live rules and writing the removal + payload is a read-modify-write: two
//! calls on one namespace at once would both see "fresh" and the second restore would fail
//! (`-N ISTIO_INBOUND`: chain exists), or both remove the same chains (`Couldn't load target`).
//! So [`apply`] and [`cleanup`] take the caller's hold on the namespace's lock
//! ([`netns::NsLock`], taken by `redirect` for every backend, check and cleanup), and each
//! restore child inherits that hold. The children's own xtables lock is then redundant and is
//! pointed at a file nobody else locks (the namespace file, Istio's choice, is our lock itself;
//! see `tools.rs`).
//!
//! # What a kill can leave
//!
//! Each family is one `*-restore` process fed its complete input; the kernel commits it table
//! by table (each table one atomic replace). The IPv4 restore runs before the IPv6 one, then
//! the routes (`::6` on lo for IPv6, TPROXY's policy routes). A restore child already started
//! holds the namespace's lock and finishes even if its caller is SIGKILLed, so killing *our*
//! process leaves one of:
//!
//! 1. nothing changed (killed before the IPv4 commit);
//! 2. IPv4 complete, IPv6 as before (killed between the two restores): on a dual-stack pod,
//!    "IPv4 rules only";
//! 3. both families complete, `::6`/TPROXY routes not yet added (killed before the routes);
//! 4. complete.
//!
//! [`check`] reports 2 as drift (`IPv6 nat ISTIO_…: missing chain`), `redirect::check` also 3
//! (`pod_routes::drift`: `::6`, TPROXY's rule and route), and the next apply repairs
//! both (it removes what is there and re-creates everything; routes already there are kept). A kill of the restore child itself (e.g.
//! the whole cgroup) can also stop between two tables of one family (TPROXY plans use
//! `mangle` and `nat`): our chains then exist in one table only, which [`check`] reports and
//! apply repairs the same way. The nft backend has no states 2 or a table split: its rules are
//! one batch, committed all or nothing, then the same routes (state 3).

pub mod ambient_host;
mod render;
mod save;
mod tools;
pub mod trace_rules;

pub use render::{render_payload, rule_args};
pub use tools::{NODE_XTABLES_LOCK, Tools};

use capture::Plan;
use netns::NsLock;
use save::{Owns, SavedTable, is_ours};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use tools::Fam;

#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error(
        "{binary} not found (searched {searched}); install {} or use the nft backend",
        tools::package_of(binary)
    )]
    BinaryNotFound { binary: String, searched: String },
    #[error("could not run {command}: {source}")]
    Spawn { command: String, source: io::Error },
    #[error("{command} failed ({status}): {stderr}{}", offending_line.as_ref().map(|l| format!(" [input line: {l}]")).unwrap_or_default())]
    Command {
        command: String,
        status: String,
        stderr: String,
        /// The restore input line the tool complained about, when it said which.
        offending_line: Option<String>,
    },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("preparing a scratch namespace to compare rules: {0}")]
    Scratch(io::Error),
    /// Another call kept the node namespace's lock past the deadline (`ambient_host`).
    #[error(transparent)]
    Lock(#[from] netns::LockError),
    /// A pod UID that cannot be an ipset comment (quotes, control characters, > 255 bytes).
    #[error("pod UID {uid:?} cannot be an ipset comment: {reason}")]
    PodUid { uid: String, reason: &'static str },
    #[error("{family} rules of ours still there after removing them: {rules}")]
    LeftBehind { family: &'static str, rules: String },
    /// TPROXY policy routing or the IPv6 inbound passthrough address (shared with nft).
    #[error(transparent)]
    Routes(#[from] pod_routes::RouteError),
}

/// Programs `plan` into the current network namespace with iptables-legacy-restore.
/// `held` is the caller's hold on this namespace's lock (see the crate docs).
///
/// Order of work, so that failures leave the namespace as it was: every binary is located
/// first; then each family's complete input (removal of our old rules + the new payload) is
/// checked with `--test`; only then are the families committed. A kernel-side refusal while
/// committing (e.g. a missing module) cannot be caught by `--test`: if IPv6 fails after IPv4
/// was committed, our IPv4 rules are removed again so the pod is never half-programmed.
/// Finally the plan's routes/addresses are installed (`pod_routes::apply`).
pub fn apply(plan: &Plan, held: &NsLock, tools: &Tools) -> Result<(), LegacyError> {
    let mut inputs: Vec<(Fam, String)> = Vec::new();
    for fam in [Fam::V4, Fam::V6] {
        let payload = render_payload(plan, fam == Fam::V6);
        let wanted = !payload.is_empty();
        // A family the plan does not use still gets our old rules removed, but its binaries
        // are only required when there is something to remove (Istio tolerates a missing
        // ip6tables when IPv6 is off).
        let live = if wanted {
            tools.find(fam.restore())?;
            live_tables(tools, fam)?
        } else if tables_instantiated(fam)? {
            let live = live_tables(tools, fam)?;
            if live.iter().any(SavedTable::has_ours) {
                tools.find(fam.restore())?;
            }
            live
        } else {
            Vec::new()
        };
        let input = if live.iter().any(SavedTable::has_ours) {
            // Only a rerun pays for the scratch namespace: the plan's built-in-chain rules
            // must be recognised in canonical form to be removed before being re-added.
            let expected = canonical(tools, fam, &payload, &|| Ok(()))?;
            with_removal(&payload, &removal(&live, &expected))
        } else {
            payload
        };
        if !input.is_empty() {
            inputs.push((fam, input));
        }
    }
    for (fam, input) in &inputs {
        tools.restore(*fam, input, Some(held), true)?;
    }
    for (i, (fam, input)) in inputs.iter().enumerate() {
        if let Err(e) = tools.restore(*fam, input, Some(held), false) {
            for (done, _) in &inputs[..i] {
                let _ = cleanup_family(tools, *done, held);
            }
            return Err(e);
        }
    }
    // What the plan needs beyond netfilter (TPROXY's `fwmark → local table` routes, ::6 on
    // lo), the same code the nft backend uses. On failure our rules go again, as in nft:
    // TPROXY rules without their routes would black-hole inbound traffic.
    if let Err(e) = pod_routes::apply(plan) {
        let _ = cleanup(held, tools);
        return Err(e.into());
    }
    Ok(())
}

/// Differences between the live rules and `plan` (empty = in sync), as readable lines
/// naming the family, table and chain. Our chains must match exactly, in order; in the
/// built-in chains only the plan's rules and jumps to our chains are compared (foreign rules
/// are ignored), again in order.
pub fn check(plan: &Plan, tools: &Tools) -> Result<Vec<String>, LegacyError> {
    check_owned(plan, tools, Owns::POD, &|| Ok(()))
}

/// [`check`] of what `owns` accepts only; `prepare` runs in the scratch namespace before
/// the plan is restored there (e.g. creating the ipsets its rules name: iptables refuses a
/// rule naming a missing set).
fn check_owned(
    plan: &Plan,
    tools: &Tools,
    owns: Owns,
    prepare: &Prepare<'_>,
) -> Result<Vec<String>, LegacyError> {
    let mut drift = Vec::new();
    for fam in [Fam::V4, Fam::V6] {
        let payload = render_payload(plan, fam == Fam::V6);
        if payload.is_empty() && !tables_instantiated(fam)? {
            continue;
        }
        let live = live_tables(tools, fam)?;
        let expected = canonical(tools, fam, &payload, prepare)?;
        diff(fam, &expected, &live, owns, &mut drift);
    }
    Ok(drift)
}

/// Removes our chains, the jumps to them and the rules of the shapes Istio writes straight
/// into built-in chains (`-c`/`-k` interface RETURNs, TPROXY's mark rules:
/// see `save::is_builtin_shape`), both families. Returns whether any existed.
pub fn cleanup(held: &NsLock, tools: &Tools) -> Result<bool, LegacyError> {
    let mut any = false;
    for fam in [Fam::V4, Fam::V6] {
        any |= cleanup_family(tools, fam, held)?;
    }
    Ok(any)
}

/// [`cleanup`] knowing the plan the rules were programmed from: also removes the rules
/// the plan put directly into built-in chains (interface RETURNs, TPROXY marks), which a
/// plan-less cleanup cannot recognise. For a backend migration (`redirect::migrate`), where
/// nothing of ours may stay behind: a leftover would also make `--backend auto` keep choosing
/// iptables-legacy for the namespace. Verifies by reading the rules back. Returns whether
/// anything of ours existed.
pub fn cleanup_plan(plan: &Plan, held: &NsLock, tools: &Tools) -> Result<bool, LegacyError> {
    let mut any = false;
    for fam in [Fam::V4, Fam::V6] {
        if !tables_instantiated(fam)? {
            continue;
        }
        let live = live_tables(tools, fam)?;
        if !live.iter().any(SavedTable::has_ours) {
            continue;
        }
        let expected = canonical(
            tools,
            fam,
            &render_payload(plan, fam == Fam::V6),
            &|| Ok(()),
        )?;
        tools.restore(
            fam,
            &with_removal("", &removal(&live, &expected)),
            Some(held),
            false,
        )?;
        any = true;
        let left = ours_left(&live_tables(tools, fam)?, &expected);
        if !left.is_empty() {
            return Err(LegacyError::LeftBehind {
                family: fam.label(),
                rules: left.join("; "),
            });
        }
    }
    Ok(any)
}

/// Our chains, jumps to them and the plan's rules (`expected`) still in `live`.
fn ours_left(live: &[SavedTable], expected: &[SavedTable]) -> Vec<String> {
    let mut left = Vec::new();
    for t in live {
        left.extend(t.our_chains().map(|c| format!("{} chain {c}", t.name)));
        let exp = expected.iter().find(|e| e.name == t.name);
        for (chain, rule) in &t.rules {
            let planned = exp.is_some_and(|e| e.rules_of(chain).any(|r| r == rule));
            if !is_ours(chain) && (planned || Owns::POD.rule(&t.name, chain, rule)) {
                left.push(format!("{} -A {chain} {rule}", t.name));
            }
        }
    }
    left
}

/// Whether the current namespace holds any iptables-legacy tables with rules.
///
/// Reads the kernel's table list first, so
/// a namespace that never used legacy iptables costs no process.
pub fn has_legacy_rules(tools: &Tools) -> Result<bool, LegacyError> {
    for fam in [Fam::V4, Fam::V6] {
        if tables_instantiated(fam)? && live_tables(tools, fam)?.iter().any(|t| !t.rules.is_empty())
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The IPv4 tables the legacy ip_tables module has instantiated in the calling thread's
/// namespace (`ip_tables_names`; empty when nobody ever used legacy iptables here).
pub fn instantiated_ipv4_tables() -> Vec<String> {
    std::fs::read_to_string(Fam::V4.names_file())
        .map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// `iptables-legacy-save` of the calling thread's namespace.
pub fn save_ipv4(tools: &Tools) -> Result<String, LegacyError> {
    tools.save(Fam::V4)
}

/// A read-only view of the live iptables-legacy rules, for tools that read them (the
/// `explain` crate).
pub mod live {
    use crate::tools::{Fam, Tools};
    use crate::{LegacyError, save, tables_instantiated};
    use std::net::IpAddr;

    pub use crate::save::{SavedTable, parse};

    /// The family's `*-legacy-save` output in the calling thread's namespace, when it holds
    /// anything of ours (`None`: nothing, or no legacy table was ever used there).
    pub fn our_save(tools: &Tools, v6: bool) -> Result<Option<String>, LegacyError> {
        let fam = if v6 { Fam::V6 } else { Fam::V4 };
        if !tables_instantiated(fam)? {
            return Ok(None);
        }
        let text = tools.save(fam)?;
        Ok(save::parse(&text)
            .iter()
            .any(SavedTable::has_ours)
            .then_some(text))
    }

    /// The family's table `table` as `*-legacy-save -c -t TABLE` prints it (every rule with
    /// its `[packets:bytes]` counters) in the calling thread's namespace; `None` when that
    /// table does not exist there (asking for a missing table would instantiate it).
    pub fn table_with_counters(
        tools: &Tools,
        v6: bool,
        table: &str,
    ) -> Result<Option<String>, LegacyError> {
        let fam = if v6 { Fam::V6 } else { Fam::V4 };
        if !crate::table_instantiated(fam, table)? {
            return Ok(None);
        }
        tools.save_with(fam, &["-c", "-t", table]).map(Some)
    }

    /// The members of the ipset `name` in the calling thread's namespace (`ipset save`).
    pub fn ipset_members(tools: &Tools, name: &str) -> Result<Vec<IpsetMember>, LegacyError> {
        Ok(parse_ipset_save(&tools.ipset(&["save", name], None)?, name))
    }

    /// One element of a hash:ip set: its address and its comment (ours: the pod's UID).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct IpsetMember {
        pub addr: IpAddr,
        pub comment: Option<String>,
    }

    /// The `add NAME ADDR [comment "TEXT"]` lines for the set `name`.
    pub fn parse_ipset_save(text: &str, name: &str) -> Vec<IpsetMember> {
        text.lines()
            .filter_map(|l| {
                l.strip_prefix("add ")?
                    .strip_prefix(name)?
                    .strip_prefix(' ')
            })
            .filter_map(|rest| {
                Some(IpsetMember {
                    addr: rest.split_whitespace().next()?.parse().ok()?,
                    comment: rest
                        .split_once(" comment ")
                        .map(|(_, c)| c.trim().trim_matches('"').to_string()),
                })
            })
            .collect()
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn parses_ipset_save() {
            let text = "create istio-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x1\nadd istio-inpod-probes-v4 10.88.1.10 comment \"uid-a\"\nadd istio-inpod-probes-v4x 10.88.1.99\nadd istio-inpod-probes-v4 10.88.1.11\n";
            let member = |addr: &str, comment: Option<&str>| super::IpsetMember {
                addr: addr.parse().unwrap(),
                comment: comment.map(str::to_string),
            };
            let want = vec![
                member("10.88.1.10", Some("uid-a")),
                member("10.88.1.11", None),
            ];
            assert_eq!(super::parse_ipset_save(text, "istio-inpod-probes-v4"), want);
        }
    }
}

/// Whether our ISTIO_* chains exist in iptables-legacy in the current namespace.
pub fn has_our_chains(tools: &Tools) -> Result<bool, LegacyError> {
    for fam in [Fam::V4, Fam::V6] {
        if tables_instantiated(fam)? && live_tables(tools, fam)?.iter().any(SavedTable::has_ours) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn cleanup_family(tools: &Tools, fam: Fam, held: &NsLock) -> Result<bool, LegacyError> {
    if !tables_instantiated(fam)? {
        return Ok(false);
    }
    let live = live_tables(tools, fam)?;
    if !live.iter().any(SavedTable::has_ours) {
        return Ok(false);
    }
    let input = with_removal("", &removal(&live, &[]));
    tools.restore(fam, &input, Some(held), false)?;
    Ok(true)
}

/// Whether the kernel has instantiated any legacy table of this family in this namespace.
/// Tables appear on first use, so an empty list means nobody ever used legacy iptables here.
fn tables_instantiated(fam: Fam) -> Result<bool, LegacyError> {
    Ok(!instantiated_tables(fam)?.is_empty())
}

/// Whether the family's table `table` exists in the calling thread's namespace.
fn table_instantiated(fam: Fam, table: &str) -> Result<bool, LegacyError> {
    Ok(instantiated_tables(fam)?.iter().any(|t| t == table))
}

/// The family's instantiated legacy tables (none when its module is not even loaded).
fn instantiated_tables(fam: Fam) -> Result<Vec<String>, LegacyError> {
    match std::fs::read_to_string(fam.names_file()) {
        Ok(s) => Ok(s.split_whitespace().map(str::to_string).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(LegacyError::Read {
            path: fam.names_file().into(),
            source,
        }),
    }
}

fn live_tables(tools: &Tools, fam: Fam) -> Result<Vec<SavedTable>, LegacyError> {
    Ok(save::parse(&tools.save(fam)?))
}

/// The plan's rules in iptables-save's canonical form: restored into a fresh, private network
/// namespace (on a short-lived thread; it disappears with the thread) and saved back.
/// What must exist in the scratch namespace before a plan can be restored there.
type Prepare<'a> = dyn Fn() -> Result<(), LegacyError> + Sync + 'a;

fn canonical(
    tools: &Tools,
    fam: Fam,
    payload: &str,
    prepare: &Prepare<'_>,
) -> Result<Vec<SavedTable>, LegacyError> {
    if payload.is_empty() {
        return Ok(Vec::new());
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare only affects the calling (scratch) thread's namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(LegacyError::Scratch(io::Error::last_os_error()));
            }
            prepare()?;
            // Private to this thread: no lock to hold.
            tools.restore(fam, payload, None, false)?;
            live_tables(tools, fam)
        })
        .join()
        .unwrap_or_else(|_| {
            Err(LegacyError::Scratch(io::Error::other(
                "scratch thread panicked",
            )))
        })
    })
}

/// Restore lines (per table) that remove what we own from a pod's namespace (`live`): jumps
/// to our chains from other chains, the plan's own rules in built-in chains (`expected`,
/// canonical form) and any rule of the shapes Istio writes there (an earlier plan's), then
/// flush and delete our chains. Flushing all before deleting any lets chains that jump to
/// each other go in one pass.
fn removal(live: &[SavedTable], expected: &[SavedTable]) -> BTreeMap<String, Vec<String>> {
    removal_owned(live, expected, Owns::POD)
}

/// [`removal`] of what `owns` accepts only.
fn removal_owned(
    live: &[SavedTable],
    expected: &[SavedTable],
    owns: Owns,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for t in live.iter().filter(|t| t.has_owned(owns)) {
        let exp = expected.iter().find(|e| e.name == t.name);
        let mut lines = Vec::new();
        for (chain, rule) in &t.rules {
            if (owns.chain)(chain) {
                continue;
            }
            let planned = exp.is_some_and(|e| e.rules_of(chain).any(|r| r == rule));
            if planned || owns.rule(&t.name, chain, rule) {
                lines.push(format!("-D {chain} {rule}"));
            }
        }
        lines.extend(t.owned_chains(owns).map(|c| format!("-F {c}")));
        lines.extend(t.owned_chains(owns).map(|c| format!("-X {c}")));
        out.insert(t.name.clone(), lines);
    }
    out
}

/// `payload` with the removal lines placed at the top of each table's section (tables only
/// in `removal` get a section of their own). With nothing to remove, `payload` is returned
/// unchanged: a first apply feeds iptables exactly Istio's bytes.
fn with_removal(payload: &str, removal: &BTreeMap<String, Vec<String>>) -> String {
    if removal.is_empty() {
        return payload.to_string();
    }
    // Split the payload into (table, header line, body lines).
    let mut sections: Vec<(String, String, Vec<&str>)> = Vec::new();
    for line in payload.lines() {
        if let Some(name) = line.strip_prefix('*') {
            sections.push((name.trim().to_string(), line.to_string(), Vec::new()));
        } else if line != "COMMIT"
            && let Some(s) = sections.last_mut()
        {
            s.2.push(line);
        }
    }
    for name in removal.keys() {
        if !sections.iter().any(|s| &s.0 == name) {
            sections.push((name.clone(), format!("*{name}"), Vec::new()));
        }
    }
    sections.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (name, header, body) in sections {
        out.push_str(&header);
        out.push('\n');
        for l in removal.get(&name).into_iter().flatten() {
            out.push_str(l);
            out.push('\n');
        }
        for l in body {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Appends readable drift lines for one family, of the chains `owns` accepts.
fn diff(fam: Fam, expected: &[SavedTable], live: &[SavedTable], owns: Owns, out: &mut Vec<String>) {
    let empty = SavedTable::default();
    let mut names: Vec<&str> = expected.iter().map(|t| t.name.as_str()).collect();
    names.extend(
        live.iter()
            .filter(|t| t.has_owned(owns))
            .map(|t| t.name.as_str()),
    );
    names.sort();
    names.dedup();
    for name in names {
        let exp = expected.iter().find(|t| t.name == name).unwrap_or(&empty);
        let liv = live.iter().find(|t| t.name == name).unwrap_or(&empty);
        let at = |chain: &str| format!("{} {name} {chain}", fam.label());
        for c in exp.owned_chains(owns) {
            if !liv.chains.iter().any(|l| l == c) {
                out.push(format!("{}: missing chain", at(c)));
            }
        }
        for c in liv.owned_chains(owns) {
            if !exp.chains.iter().any(|e| e == c) {
                out.push(format!("{}: unexpected chain", at(c)));
            }
        }
        // Rule by rule: every non-ISTIO chain of either side (built-ins; a foreign chain only
        // counts for jumps into ours) and our chains present on both sides.
        let mut chains: Vec<&str> = Vec::new();
        for c in exp.chains.iter().chain(&liv.chains).map(String::as_str) {
            let both = exp.chains.iter().any(|e| e == c) && liv.chains.iter().any(|l| l == c);
            if (!(owns.chain)(c) || both) && !chains.contains(&c) {
                chains.push(c);
            }
        }
        for chain in chains {
            let want: Vec<&str> = exp.rules_of(chain).collect();
            let have: Vec<&str> = liv
                .rules_of(chain)
                .filter(|r| {
                    // In shared built-in chains only what we own counts.
                    (owns.chain)(chain) || want.contains(r) || owns.rule(name, chain, r)
                })
                .collect();
            diff_rules(&at(chain), chain, &want, &have, out);
        }
    }
}

fn diff_rules(at: &str, chain: &str, want: &[&str], have: &[&str], out: &mut Vec<String>) {
    if want == have {
        return;
    }
    let mut unmatched: Vec<&str> = have.to_vec();
    let mut missing = false;
    for w in want {
        if let Some(i) = unmatched.iter().position(|h| h == w) {
            unmatched.remove(i);
        } else {
            missing = true;
            out.push(format!("{at}: missing rule: -A {chain} {w}"));
        }
    }
    for h in &unmatched {
        out.push(format!("{at}: unexpected rule: -A {chain} {h}"));
    }
    if !missing && unmatched.is_empty() {
        out.push(format!("{at}: rules are in a different order than planned"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Vec<SavedTable> {
        save::parse(text)
    }

    #[test]
    fn no_residue_keeps_istio_bytes() {
        let p = "* nat\n-N ISTIO_X\n-A OUTPUT -j ISTIO_X\nCOMMIT\n";
        assert_eq!(with_removal(p, &BTreeMap::new()), p);
    }

    #[test]
    fn removal_goes_first_in_each_table() {
        let live = table(
            "*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_X - [0:0]\n:FOREIGN - [0:0]\n-A OUTPUT -j ISTIO_X\n-A OUTPUT -j FOREIGN\n-A OUTPUT -o eth9 -j RETURN\n-A ISTIO_X -j RETURN\nCOMMIT\n*raw\n:OUTPUT ACCEPT [0:0]\n:ISTIO_Y - [0:0]\nCOMMIT\n",
        );
        let expected = table("*nat\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -o eth9 -j RETURN\nCOMMIT\n");
        let p = "* nat\n-N ISTIO_X\n-A OUTPUT -j ISTIO_X\nCOMMIT\n";
        let got = with_removal(p, &removal(&live, &expected));
        assert_eq!(
            got,
            "* nat\n-D OUTPUT -j ISTIO_X\n-D OUTPUT -o eth9 -j RETURN\n-F ISTIO_X\n-X ISTIO_X\n-N ISTIO_X\n-A OUTPUT -j ISTIO_X\nCOMMIT\n*raw\n-F ISTIO_Y\n-X ISTIO_Y\nCOMMIT\n"
        );
    }

    #[test]
    fn diff_reports_missing_unexpected_and_order() {
        let exp = table(
            "*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_X - [0:0]\n:ISTIO_Z - [0:0]\n-A OUTPUT -j ISTIO_X\n-A ISTIO_X -p tcp -j RETURN\n-A ISTIO_X -p udp -j RETURN\nCOMMIT\n",
        );
        let live = table(
            "*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_X - [0:0]\n:ISTIO_Y - [0:0]\n-A OUTPUT -j FOREIGN\n-A ISTIO_X -p udp -j RETURN\n-A ISTIO_X -p tcp -j RETURN\nCOMMIT\n",
        );
        let mut out = Vec::new();
        diff(Fam::V4, &exp, &live, Owns::POD, &mut out);
        assert_eq!(
            out,
            [
                "IPv4 nat ISTIO_Z: missing chain",
                "IPv4 nat ISTIO_Y: unexpected chain",
                "IPv4 nat OUTPUT: missing rule: -A OUTPUT -j ISTIO_X",
                "IPv4 nat ISTIO_X: rules are in a different order than planned",
            ]
        );
        let mut none = Vec::new();
        diff(Fam::V4, &exp, &exp, Owns::POD, &mut none);
        assert!(none.is_empty(), "{none:?}");
    }
}
