//! One pod's check: its plan in its namespace (the cached one while it still holds the pod IP,
//! else found again through /proc), the live rules compared with it (the plugin's CHECK code,
//! `redirect::check_until`) and, on drift, the plan applied again (one atomic replace per
//! backend, `redirect::apply_until`) and read back. Blocking: run it on a blocking thread.

use crate::podplan;
use redirect::capture::{Config, Plan};
use redirect::{Backend, BackendChoice};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a check needs about a pod.
#[derive(Clone, Debug)]
pub struct Target {
    /// `namespace/name`, for messages.
    pub key: String,
    pub ip: IpAddr,
    /// What the plugin programs for this pod.
    pub config: Box<Config>,
    /// The namespace found last time (`<proc>/<pid>/ns/net`), if any.
    pub netns: Option<PathBuf>,
}

/// The result of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The live rules match the plan.
    Ok,
    /// They did not (`drift`, CHECK's lines); the plan was applied again and now matches.
    Repaired {
        drift: Vec<String>,
        backend: Backend,
    },
    /// They did not because the pod's rules were on another backend than the node's (`from`):
    /// they were migrated in place (`redirect::migrate`: the new program first, then the old
    /// rules removed, verified).
    Migrated {
        drift: Vec<String>,
        from: Vec<Backend>,
        to: Backend,
    },
    /// They did not, and applying the plan failed or left a difference.
    RepairFailed { drift: Vec<String>, error: String },
    /// No comparison was possible (namespace not found, lock busy, netlink error).
    Failed(String),
}

/// Checks `t` and repairs drift. `lock_wait` bounds each wait for the namespace's lock (an
/// ADD/DEL in flight); a busy namespace is a `Failed` check, retried later.
pub fn run(
    t: &mut Target,
    proc_root: &Path,
    backend: BackendChoice,
    lock_wait: Duration,
) -> Outcome {
    let (netns, plan) = match prepare(t, proc_root) {
        Ok(x) => x,
        Err(e) => return Outcome::Failed(e),
    };
    let drift = match redirect::check_until(&plan, Some(&netns), backend, deadline(lock_wait)) {
        Ok(d) if d.is_empty() => return Outcome::Ok,
        Ok(d) => d,
        Err(e) => {
            t.netns = None;
            return Outcome::Failed(format!("checking the rules in {}: {e}", netns.display()));
        }
    };
    let failed = |error: String| Outcome::RepairFailed {
        drift: drift.clone(),
        error,
    };
    // The node's backend is fixed and the pod holds the other one's rules: move them.
    if let BackendChoice::Fixed(to) = backend {
        match redirect::migrate(&plan, Some(&netns), to, deadline(lock_wait)) {
            Ok(m) if m.changed && m.found.iter().any(|b| *b != to) => {
                return Outcome::Migrated {
                    drift,
                    from: m.found,
                    to,
                };
            }
            // No rules of ours were there: `to`'s are now programmed and verified.
            Ok(m) if m.changed => {
                return Outcome::Repaired { drift, backend: to };
            }
            // Only `to`'s rules, drifted: the ordinary re-apply below.
            Ok(_) => {}
            Err(e) => return failed(format!("migrating {} to {to}: {e}", netns.display())),
        }
    }
    let applied = match redirect::apply_until(&plan, Some(&netns), backend, deadline(lock_wait)) {
        Ok(d) => d,
        Err(e) => return failed(format!("re-applying in {}: {e}", netns.display())),
    };
    match redirect::check_until(&plan, Some(&netns), backend, deadline(lock_wait)) {
        Ok(left) if left.is_empty() => Outcome::Repaired {
            drift,
            backend: applied.backend,
        },
        Ok(left) => failed(format!(
            "still differs after re-applying: {}",
            left.join("; ")
        )),
        Err(e) => failed(format!("reading back {}: {e}", netns.display())),
    }
}

fn deadline(wait: Duration) -> Instant {
    Instant::now() + wait
}

/// The pod's namespace and its plan. A cached namespace that no longer holds the pod IP (the
/// process is gone, its PID reused) is dropped and the namespace found again.
fn prepare(t: &mut Target, proc_root: &Path) -> Result<(PathBuf, Plan), String> {
    if let Some(ns) = t.netns.clone() {
        if let Ok((plan, addrs)) = podplan::plan_in(&t.config, &ns)
            && addrs.contains(&t.ip)
        {
            return Ok((ns, plan));
        }
        t.netns = None;
    }
    let ns = podplan::locate(proc_root, t.ip)?;
    let (plan, _) = podplan::plan_in(&t.config, &ns)?;
    t.netns = Some(ns.clone());
    Ok((ns, plan))
}
