//! The node daemon's view of Kubernetes, shared by every job so the node never opens a second
//! watch or scans /proc twice for the same thing:
//!
//! - [`client`]: how the daemon reaches the API server (in-cluster or `KUBECONFIG`);
//! - [`cache`]: ONE list + watch of this node's pods (and one of namespaces), with client-go's
//!   fault handling, fanned out to subscribers (repair, reconcile, the ambient agent);
//! - [`lookup`]: the plugin's pod lookup (`pods.sock`) answered from those caches;
//! - [`running`]: a running pod's network namespace, found through the host's /proc by its IP
//!   (and its UID, from [`cgroup`], where kubelet's cgroups name it);
//! - [`kubelet`]: the kubelet's uid, found through the host's /proc (ambient's host probe rule);
//! - [`background`]: the API writes made in the background (Events, annotations), bounded.

pub mod background;
pub mod cache;
pub mod cgroup;
pub mod client;
pub mod events;
pub mod kubelet;
mod line_cap;
pub mod lookup;
pub mod running;

pub use cache::{CacheEvent, NamespaceCache, PodCache, PodEvent, Subscription};

use std::path::PathBuf;
use std::time::Duration;

/// The node's identity and how it reaches the API server (validated by the daemon's
/// configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub api: client::ApiServer,
    /// This node's name: the pod watch's `spec.nodeName`.
    pub node_name: String,
    /// The host's /proc as mounted (`<proc_root>/1/ns/net` is the host's namespace).
    pub proc_root: PathBuf,
    /// `timeoutSeconds` of the pod and namespace watches.
    pub watch_timeout: Duration,
}

/// An error with its whole chain of causes (`client error (Connect): tcp connect error:
/// Connection refused`): kube's own text names only the outermost layer.
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        // Some layers repeat their source in their own text.
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    msg
}
