//! The backend interface: what `redirect` asks of a mechanism that programs our rules, and the
//! one list of the mechanisms there are ([`all`]). Everything else in this crate (apply, check,
//! cleanup, detection, migration, the host probe rule) works over that list, so "never two
//! kinds in one namespace" is "clean every backend other than the chosen one", and adding a
//! backend is its crate, an implementation here and one line in [`all`], plus its
//! [`Backend`] kind (`capture::Backend`: its name, which every parser of `--backend`,
//! `REDIRECT_BACKEND` and Istio's `FORCE_IPTABLES_BINARY` reads from there, and
//! `Backend::ALL`). The node's detection (`node.rs`) chooses among kinds by their host state,
//! and explain reads each kind's live rules: those learn about a new kind by design.
//!
//! Every method works in the calling thread's network namespace: a pod's (entered by
//! `crate::locked`, which also holds its lock and passes the hold to the writes) or the
//! node's (`crate::host_netns`, for the `host_*` methods).

mod legacy;
mod nft;
#[cfg(test)]
pub(crate) mod null;

pub use legacy::LegacyRules;
pub use nft::NftRules;

use crate::{Backend, RedirectError, Scope};
use capture::{Plan, ProbeSource};
use netns::NsLock;
use std::fmt;
use std::net::IpAddr;

/// One mechanism that programs a [`Plan`] into a namespace, and ambient's host probe rule on
/// the node. Writes take the caller's hold on the namespace's lock (`held`): a backend that
/// starts processes lets them inherit it; one that writes in-process ignores it. The lock is
/// taken once, by the caller, not by each backend: "clean every other backend, then apply this
/// one" is one critical section, which a lock taken per backend would split (another caller
/// could write between the clean-up and the apply).
pub trait RuleBackend: Send + Sync + fmt::Debug {
    /// Which backend this is (how users name it).
    fn kind(&self) -> Backend;

    /// Why this kernel cannot run this backend; `None` when it can.
    fn unsupported(&self) -> Option<String>;

    /// Why a namespace must stay on this backend (it already holds rules of this kind, ours
    /// or not: mixing would make rule order depend on hook registration); `None` when nothing
    /// binds it here. What cannot be read binds nothing.
    fn claims(&self) -> Option<String>;

    /// Programs `plan` (atomically, replacing our rules of this kind).
    fn apply(&self, plan: &Plan, held: &NsLock) -> Result<(), RedirectError>;

    /// Differences between our live rules of this kind and `plan` (empty: in sync); the
    /// shared routes are not this method's (`pod_routes::drift`).
    fn check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError>;

    /// Removes our rules of this kind in `scope`, without knowing the plan that made them
    /// (a DEL, or the backend not chosen for the namespace).
    fn cleanup(&self, scope: Scope, held: &NsLock) -> Result<(), RedirectError>;

    /// Removes our rules of this kind that `plan` made, verified, leaving the shared routes
    /// (a migration away from this backend: nothing of it may stay behind).
    fn remove_plan(&self, plan: &Plan, held: &NsLock) -> Result<(), RedirectError>;

    /// Whether the namespace holds rules of ours of this kind.
    fn has_ours(&self) -> Result<bool, RedirectError>;

    /// `plan`'s rules as this backend writes them, for `--dry-run`.
    fn dry_run(&self, plan: &Plan) -> String;

    /// Which local traffic is a kubelet probe for the host probe rule.
    fn probe_source(&self, kubelet_uid: Option<u32>) -> ProbeSource;

    /// Where the host probe rule lives, for logs.
    fn host_describe(&self) -> &'static str;

    /// Writes the host probe rule and its sets (elements already there stay).
    fn host_ensure(&self, plan: &Plan) -> Result<(), RedirectError>;

    /// Adds pods' addresses (`(pod UID, its IPs)`) to the host rule's sets.
    fn host_add_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<(), RedirectError>;

    /// The addresses in the host rule's sets.
    fn host_pod_ips(&self, plan: &Plan) -> Result<Vec<IpAddr>, RedirectError>;

    /// Makes the sets hold exactly `pods`' addresses; returns those removed.
    fn host_sync_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError>;

    /// Removes addresses from the sets (absent ones are ignored).
    fn host_remove_pod_ips(&self, plan: &Plan, ips: &[IpAddr]) -> Result<(), RedirectError>;

    /// Differences between the host rule (and its sets, not their elements) and `plan`.
    fn host_check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError>;

    /// Removes the host rule and its sets; returns whether they existed.
    fn host_remove_all(&self) -> Result<bool, RedirectError>;
}

static NFT: NftRules = NftRules::new();
static LEGACY: LegacyRules = LegacyRules::new();

/// Every backend, the preferred one first (detection's default). The one place listing them.
pub fn all() -> [&'static dyn RuleBackend; 2] {
    [&NFT, &LEGACY]
}

/// The backend of kind `kind`.
pub fn of(kind: Backend) -> &'static dyn RuleBackend {
    among(&all(), kind)
}

/// The backend of kind `kind` in `backends` (every kind has one: [`all`] lists them all).
pub(crate) fn among<'a>(backends: &[&'a dyn RuleBackend], kind: Backend) -> &'a dyn RuleBackend {
    backends
        .iter()
        .copied()
        .find(|b| b.kind() == kind)
        .unwrap_or_else(|| panic!("no {kind} backend registered"))
}
