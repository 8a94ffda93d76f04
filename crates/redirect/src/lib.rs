//! The path every binary takes: facts from the namespace → `Plan` → backend, inside the
//! target namespace. Policy lives in `capture`; kernel work in the backends.
//!
//! [`apply`], [`check`] and [`cleanup`] hold the namespace's lock ([`netns::NsLock`]) for
//! their whole work, so calls on one namespace never interleave (see `locked`). [`migrate()`]
//! moves a running pod's rules from one backend to the other without a capture gap.
//! [`node`] decides, once per node, which backend its pods get. Each backend is a
//! [`backend::RuleBackend`]; [`backend::all`] is the one list of them.

use backend::RuleBackend;
use capture::{Facts, Plan};
use netns::NsLock;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

pub use migrate::{MigrateOptions, Migration, migrate, migrate_with};

pub mod backend;
pub mod branch_eni;
pub mod host_netns;
pub mod host_probe;
mod migrate;
pub mod node;
pub mod present;

/// The mechanism that programs the rules (defined in `capture`, which `explain` shares).
pub use capture::Backend;

/// `--backend` / `redirect_backend` / `REDIRECT_BACKEND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    #[default]
    Auto,
    Fixed(Backend),
}

/// A backend name no backend has.
#[derive(Debug, thiserror::Error)]
#[error("expected auto, {}", Backend::ALL.map(Backend::name).join(" or "))]
pub struct UnknownBackend;

impl FromStr for BackendChoice {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" | "" => Ok(BackendChoice::Auto),
            name => Backend::from_name(name)
                .map(BackendChoice::Fixed)
                .ok_or(UnknownBackend),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    /// Another call kept the namespace's lock past the deadline (or it could not be taken).
    #[error(transparent)]
    Lock(#[from] netns::LockError),
    #[error("nftables: {0}")]
    Nft(#[from] nft_backend::NftError),
    #[error("iptables-legacy: {0}")]
    Legacy(#[from] iptables_legacy::LegacyError),
    #[error("reading the namespace's addresses: {0}")]
    Addresses(nix::Error),
    /// Policy routing outside a pod (the node's branch ENI probe rules, [`branch_eni`]).
    #[error("policy routing: {0}")]
    Routes(#[from] pod_routes::RouteError),
    /// The live rules differ from the plan (one line per difference).
    #[error("the rules differ from the plan: {}", .0.join("; "))]
    Drift(Vec<String>),
    /// [`migrate()`] stopped at `step`; `state` is what the namespace holds now.
    #[error("migrating to {to}: {step} failed: {cause}; the namespace now holds {state}")]
    Migrate {
        to: Backend,
        step: &'static str,
        cause: Box<RedirectError>,
        state: String,
    },
}

/// The backend chosen for a namespace and why (for logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    pub backend: Backend,
    pub reason: String,
}

/// Addresses of the namespace's interfaces (+ nameservers from `resolv_conf`, a host path).
pub fn read_facts(
    netns: Option<&Path>,
    resolv_conf: Option<&Path>,
) -> Result<Facts, RedirectError> {
    Ok(Facts {
        local_addrs: read_local_addrs(netns)?,
        resolv_conf_servers: resolv_conf.map(read_resolv_conf).unwrap_or_default(),
    })
}

/// [`read_facts`] of only what `Plan::build` reads for `cfg`: a one-shot apply whose flags
/// settle the family and the DNS servers skips the address dump and the file.
pub fn read_facts_for(
    cfg: &capture::Config,
    netns: Option<&Path>,
    resolv_conf: Option<&Path>,
) -> Result<Facts, RedirectError> {
    Ok(Facts {
        local_addrs: match cfg.reads_local_addrs() {
            true => read_local_addrs(netns)?,
            false => Vec::new(),
        },
        resolv_conf_servers: match (cfg.reads_resolv_conf(), resolv_conf) {
            (true, Some(p)) => read_resolv_conf(p),
            _ => Vec::new(),
        },
    })
}

fn read_local_addrs(netns: Option<&Path>) -> Result<Vec<std::net::IpAddr>, RedirectError> {
    netns::run_in(netns, || -> Result<Vec<std::net::IpAddr>, nix::Error> {
        Ok(nix::ifaddrs::getifaddrs()?
            .filter_map(|i| i.address)
            .filter_map(|a| {
                a.as_sockaddr_in()
                    .map(|s| std::net::IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| std::net::IpAddr::V6(s.ip())))
            })
            .collect())
    })?
    .map_err(RedirectError::Addresses)
}

/// Nameservers of a resolv.conf; none when it cannot be read (as istio-iptables).
fn read_resolv_conf(path: &Path) -> Vec<std::net::IpAddr> {
    std::fs::read_to_string(path)
        .map(|t| capture::parse_resolv_conf(&t))
        .unwrap_or_default()
}

/// `--backend auto`: nft, unless the kernel has no nf_tables or the namespace already holds
/// iptables-legacy rules (then mixing would make rule order depend on hook registration).
/// A snapshot for logs and `--dry-run`: [`apply`] decides again under the namespace's lock.
pub fn detect(netns: Option<&Path>) -> Result<Detection, RedirectError> {
    netns::run_in(netns, || Ok(detect_among(&backend::all())))?
}

/// [`detect`] for the calling thread's namespace, over `backends` (preferred first): the
/// preferred one, unless the kernel cannot run it (then the first it can) or another one
/// claims the namespace (it already holds rules of that kind).
fn detect_among(backends: &[&dyn RuleBackend]) -> Detection {
    let found = |b: &dyn RuleBackend, reason: String| Detection {
        backend: b.kind(),
        reason,
    };
    let (preferred, others) = backends.split_first().expect("a backend is registered");
    if let Some(reason) = preferred.unsupported() {
        let fallback = others.iter().find(|b| b.unsupported().is_none());
        return found(*fallback.unwrap_or(preferred), reason);
    }
    for b in others {
        if let Some(reason) = b.claims() {
            return found(*b, reason);
        }
    }
    found(*preferred, "default".into())
}

fn resolve_among(backends: &[&dyn RuleBackend], choice: BackendChoice) -> Detection {
    match choice {
        BackendChoice::Fixed(backend) => Detection {
            backend,
            reason: "configured".into(),
        },
        BackendChoice::Auto => detect_among(backends),
    }
}

/// How long [`apply`], [`check`] and [`cleanup`] wait for the namespace's lock while other
/// calls on the same namespace run (the `*_until` variants take the caller's deadline). A
/// call holds it for a few ms (nft) to tens of ms (iptables-legacy), so this covers hundreds
/// of queued calls and stays far inside the runtimes' CNI timeouts (the CRI request
/// timeout, kubelet's default 2 min).
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(15);

/// Runs `f` inside the namespace (`None`: the caller's own) while holding its lock, so that
/// every call reading or changing our rules there — ADD, CHECK, DEL, the CLI, the repair
/// controller, with either backend — runs alone: detection, the other backend's cleanup and
/// the apply form one step, and a reader never sees a half-applied state.
fn locked<T: Send>(
    netns: Option<&Path>,
    deadline: Instant,
    f: impl FnOnce(&NsLock) -> Result<T, RedirectError> + Send,
) -> Result<T, RedirectError> {
    netns::run_in(netns, || {
        // By path when there is one: the same inode as the namespace just entered, and half
        // the cost of going through /proc/thread-self (measured ~6-10 µs against ~15-18 µs).
        let held = match netns {
            Some(path) => NsLock::path(path, deadline)?,
            None => NsLock::current(&"(the current namespace)", deadline)?,
        };
        f(&held)
    })?
}

/// Programs `plan` into the namespace (atomically per backend). Returns the backend used.
/// Waits up to [`DEFAULT_LOCK_WAIT`] for other calls on the namespace.
pub fn apply(
    plan: &Plan,
    netns: Option<&Path>,
    choice: BackendChoice,
) -> Result<Detection, RedirectError> {
    apply_until(plan, netns, choice, Instant::now() + DEFAULT_LOCK_WAIT)
}

/// [`apply`], giving up on the namespace's lock at `deadline`.
pub fn apply_until(
    plan: &Plan,
    netns: Option<&Path>,
    choice: BackendChoice,
    deadline: Instant,
) -> Result<Detection, RedirectError> {
    locked(netns, deadline, |held| {
        apply_among(&backend::all(), plan, choice, held)
    })
}

/// [`apply_until`]'s work in the calling thread's namespace, its lock `held`, over `backends`.
fn apply_among(
    backends: &[&dyn RuleBackend],
    plan: &Plan,
    choice: BackendChoice,
    held: &NsLock,
) -> Result<Detection, RedirectError> {
    let detection = resolve_among(backends, choice);
    let scope = match is_ambient(plan) {
        true => Scope::ALL,
        false => Scope::SIDECAR,
    };
    // Never two kinds in one namespace: every other backend's rules of ours go first.
    for other in backends.iter().filter(|b| b.kind() != detection.backend) {
        other.cleanup(scope, held)?;
    }
    backend::among(backends, detection.backend).apply(plan, held)?;
    Ok(detection)
}

/// Differences between the live rules (and the routes/addresses they need) and `plan`;
/// empty when in sync. Waits up to [`DEFAULT_LOCK_WAIT`] for other calls on the namespace.
pub fn check(
    plan: &Plan,
    netns: Option<&Path>,
    choice: BackendChoice,
) -> Result<Vec<String>, RedirectError> {
    check_until(plan, netns, choice, Instant::now() + DEFAULT_LOCK_WAIT)
}

/// [`check`], giving up on the namespace's lock at `deadline`.
pub fn check_until(
    plan: &Plan,
    netns: Option<&Path>,
    choice: BackendChoice,
    deadline: Instant,
) -> Result<Vec<String>, RedirectError> {
    locked(netns, deadline, |_held| {
        let backends = backend::all();
        let mut drift = check_among(&backends, plan, choice)?;
        drift.extend(pod_routes::drift(plan).map_err(nft_backend::NftError::from)?);
        Ok(drift)
    })
}

/// [`check_until`]'s work but the routes, in the calling thread's namespace, over `backends`.
fn check_among(
    backends: &[&dyn RuleBackend],
    plan: &Plan,
    choice: BackendChoice,
) -> Result<Vec<String>, RedirectError> {
    let chosen = resolve_among(backends, choice).backend;
    let mut drift = backend::among(backends, chosen).check(plan)?;
    drift.extend(other_kinds_here(backends, chosen));
    Ok(drift)
}

/// A drift line for each other backend whose rules of ours the calling thread's namespace
/// also holds (a migration killed between its program and the removal, a node that switched
/// backends): never two kinds in one namespace, even when `chosen`'s alone match the plan.
/// What cannot be read counts as absent, as in [`apply_until`]'s cleanup.
fn other_kinds_here(backends: &[&dyn RuleBackend], chosen: Backend) -> Vec<String> {
    backends
        .iter()
        .filter(|b| b.kind() != chosen && b.has_ours().unwrap_or(false))
        .map(|b| format!("rules of ours on the other backend ({}) too", b.kind()))
        .collect()
}

/// Which of our rule sets a cleanup removes. Our iptables-legacy chains go in every scope: a
/// namespace holds either kind, and `ISTIO_*` chains are ours whichever plan made them
/// ([`RuleBackend::cleanup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The sidecar tables (`Table::ALL`) and TPROXY's routes.
    pub sidecar: bool,
    /// Ambient's in-pod tables (`Table::AMBIENT`) and its policy routing.
    pub ambient: bool,
}

impl Scope {
    pub const SIDECAR: Scope = Scope {
        sidecar: true,
        ambient: false,
    };
    pub const AMBIENT: Scope = Scope {
        sidecar: false,
        ambient: true,
    };
    pub const ALL: Scope = Scope {
        sidecar: true,
        ambient: true,
    };
}

/// Removes our sidecar rules of every kind from the namespace. Waits up to
/// [`DEFAULT_LOCK_WAIT`] for other calls on the namespace.
pub fn cleanup(netns: Option<&Path>) -> Result<(), RedirectError> {
    cleanup_until(netns, Instant::now() + DEFAULT_LOCK_WAIT)
}

/// [`cleanup`], giving up on the namespace's lock at `deadline`.
pub fn cleanup_until(netns: Option<&Path>, deadline: Instant) -> Result<(), RedirectError> {
    cleanup_scope_until(netns, Scope::SIDECAR, deadline)
}

/// Removes our rules in `scope` (nft tables, iptables-legacy chains, routes) from the
/// namespace under its lock, giving up on the lock at `deadline`. `Scope::AMBIENT`: the pod
/// left ambient; `Scope::ALL`: the pod is going away on an ambient node.
pub fn cleanup_scope_until(
    netns: Option<&Path>,
    scope: Scope,
    deadline: Instant,
) -> Result<(), RedirectError> {
    locked(netns, deadline, |held| {
        backend::all()
            .iter()
            .try_for_each(|b| b.cleanup(scope, held))
    })
}

fn is_ambient(plan: &Plan) -> bool {
    plan.owned_tables()
        .iter()
        .any(|t| capture::Table::AMBIENT.contains(t))
}

/// The rules as text for `--dry-run`: nft syntax, or iptables-restore payloads.
pub fn dry_run(plan: &Plan, backend: Backend) -> String {
    backend::of(backend).dry_run(plan)
}

#[cfg(test)]
mod tests;
