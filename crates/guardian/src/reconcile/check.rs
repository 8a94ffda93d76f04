//! One pod's check: its plan in its namespace (the cached one while it still holds the pod IP,
//! else found again through /proc), the live rules compared with it (the plugin's CHECK code,
//! `redirect::check_until`) and, on drift, the plan applied again (one atomic replace per
//! backend, `redirect::apply_until`) and read back. Blocking: run it on a blocking thread.

use crate::podplan;
use capture::{Config, Plan};
use netns::NsId;
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
    /// The pod's UID: a namespace kubelet's cgroups give to another pod is never this one's.
    pub uid: Option<String>,
    /// What the plugin programs for this pod.
    pub config: Box<Config>,
    /// The namespace found last time, if any.
    pub netns: Option<Found>,
    /// The namespace found earlier is gone or no longer holds the pod IP (the sandbox died).
    /// Until the pod's next update the IP is not searched for again: the API may not have
    /// caught up yet, and the IP may be another pod's by now.
    pub lost: bool,
}

/// A pod's namespace as found: the path (`<proc>/<pid>/ns/net`) and the namespace it reached
/// then. The path alone proves nothing (the process may be gone and its PID reused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub id: NsId,
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
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let drift = match redirect::check_until(&plan, Some(&netns), backend, deadline(lock_wait)) {
        Ok(d) if d.is_empty() => return Outcome::Ok,
        Ok(d) => d,
        // The namespace stays cached: the next `prepare` confirms it still holds the pod IP.
        Err(e) => {
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

/// The pod's namespace and its plan. A cached namespace that is no longer the one found (the
/// process is gone, its PID reused) or no longer holds the pod IP is dropped, and the pod is
/// `lost`: the IP is searched for through /proc again only once the pod was updated since
/// (see [`Target::lost`]).
fn prepare(t: &mut Target, proc_root: &Path) -> Result<(PathBuf, Plan), PrepareError> {
    if let Some(found) = t.netns.clone() {
        if NsId::of_path(&found.path).ok() == Some(found.id)
            && let Ok((plan, addrs)) = podplan::plan_in(&t.config, &found.path)
            && addrs.contains(&t.ip)
        {
            return Ok((found.path, plan));
        }
        t.netns = None;
        t.lost = true;
    }
    if t.lost {
        return Err(PrepareError::Lost { ip: t.ip });
    }
    let ns = node_view::running::locate(proc_root, t.ip, t.uid.as_deref())?;
    let id = NsId::of_path(&ns).map_err(|source| PrepareError::Identity {
        netns: ns.clone(),
        source,
    })?;
    let (plan, _) = podplan::plan_in(&t.config, &ns)?;
    t.netns = Some(Found {
        path: ns.clone(),
        id,
    });
    Ok((ns, plan))
}

/// Why a check found no namespace or plan to compare with (a `Failed` check, retried later).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// See [`Target::lost`].
    #[error(
        "the pod's network namespace is gone or no longer holds {ip}; waiting for the pod's \
         next update before searching for {ip} again (it may be another pod's now)"
    )]
    Lost { ip: IpAddr },
    #[error(transparent)]
    Locate(#[from] node_view::running::LocateError),
    #[error("reading {}: {source}", netns.display())]
    Identity {
        netns: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Plan(#[from] podplan::PlanError),
}
