//! The node's network namespace for the daemon's node-level work (the host probe rule and its
//! sets, the node backend's probe): Istio's `ALLOW_SWITCH_TO_HOST_NS` and `RunAsHost`. Our
//! chart runs the daemon with `hostNetwork: true`, so that work runs where the daemon is;
//! Istio's chart runs it in a pod network with the host's /proc at `/host/proc`, and that
//! work must enter `/host/proc/1/ns/net` instead. Set once at startup, before any such work.

use crate::RedirectError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static HOST_NETNS: OnceLock<PathBuf> = OnceLock::new();

/// From now on node-level work runs in the namespace at `path` (e.g. `/host/proc/1/ns/net`).
/// Only the first call counts; a later one with another path is an error.
pub fn switch_to(path: &Path) -> Result<(), AlreadySwitched> {
    let set = HOST_NETNS.get_or_init(|| path.to_path_buf());
    if set != path {
        return Err(AlreadySwitched {
            current: set.clone(),
            requested: path.to_path_buf(),
        });
    }
    Ok(())
}

/// [`switch_to`] was called before with another path: node-level work stays in `current`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the host network namespace is already {}, not {}", current.display(), requested.display())]
pub struct AlreadySwitched {
    pub current: PathBuf,
    pub requested: PathBuf,
}

/// The namespace node-level work runs in: `None` is the caller's own.
pub fn path() -> Option<&'static Path> {
    HOST_NETNS.get().map(PathBuf::as_path)
}

/// Runs `f` in the node's namespace: on the caller's thread when no switch was set or the
/// thread is already there, else on a thread inside it (processes it starts, such as
/// `iptables-legacy-restore` or `ipset`, inherit it).
pub fn run<T: Send>(
    f: impl FnOnce() -> Result<T, RedirectError> + Send,
) -> Result<T, RedirectError> {
    match path() {
        Some(p) if !already_in(p) => netns::run_in(Some(p), f)?,
        _ => f(),
    }
}

fn already_in(path: &Path) -> bool {
    matches!(
        (netns::NsId::of_path(path), netns::NsId::current()),
        (Ok(target), Ok(here)) if target == here
    )
}
