//! A running pod's redirect as the plugin would program it, in named steps: Pod → verdict and
//! capture Config (the plugin's own routing and mapping) → network namespace (found through the
//! host's /proc by the pod IP) → Plan (from the namespace's addresses). Shared by the repair
//! controller and the continuous reconciler, so both program exactly what ADD would.

use crate::repair::procfs;
use istio_cni::pod::PodConfig;
use k8s_openapi::api::core::v1::Pod;
use redirect::capture::{Config, Plan};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// What the plugin would do with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not programmed by the plugin (why).
    Skip(String),
    /// A mesh pod: the plugin programs this config (warnings: what it tolerated).
    Mesh(Box<PodConfig>),
}

/// The plugin's routing (self-bypass, excluded namespaces, host network) and its pod → config
/// mapping. Pure. `Err` is an invalid pod configuration (the plugin would refuse the pod too).
pub fn verdict(
    pod: &Pod,
    exclude_namespaces: &[String],
    cni_namespace: &str,
) -> Result<Verdict, String> {
    if let Some(why) = bypassed(pod, exclude_namespaces, cni_namespace) {
        return Ok(Verdict::Skip(why));
    }
    match istio_cni::pod::decide(pod) {
        Ok(istio_cni::pod::Decision::Skip(reason)) => Ok(Verdict::Skip(format!(
            "the plugin would not program it: {reason}"
        ))),
        Ok(istio_cni::pod::Decision::Capture(pc)) => Ok(Verdict::Mesh(pc)),
        Err(e) => Err(format!("invalid pod configuration: {e}")),
    }
}

/// The plugin's routing before any decision (host network, its own pods, excluded
/// namespaces): `Some(why)` when it would pass the pod through. Pure; shared by the sidecar
/// verdict and the ambient agent.
pub fn bypassed(pod: &Pod, exclude_namespaces: &[String], cni_namespace: &str) -> Option<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return Some("host-network pod".into());
    }
    if pod_policy::bypass::is_self(name, ns, cni_namespace) {
        return Some("istio-cni's own pod".into());
    }
    if exclude_namespaces.iter().any(|n| n == ns) {
        return Some(format!("namespace {ns} is excluded"));
    }
    None
}

/// `Some(why)` when the pod has no running sandbox to keep rules in (terminating, or its
/// phase is Succeeded or Failed).
pub fn finished(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("terminating".into());
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if let Some(p @ ("Succeeded" | "Failed")) = phase {
        return Some(format!("phase {p}"));
    }
    None
}

/// `status.podIP`, parsed.
pub fn pod_ip(pod: &Pod) -> Result<IpAddr, String> {
    let text = pod
        .status
        .as_ref()
        .and_then(|st| st.pod_ip.as_deref())
        .unwrap_or("");
    text.parse()
        .map_err(|_| format!("pod has no usable status.podIP ({text:?})"))
}

/// The pod's network namespace under the host's /proc. Blocking.
pub fn locate(proc_root: &Path, ip: IpAddr) -> Result<PathBuf, String> {
    procfs::find_pod_netns(proc_root, ip)
        .map_err(|e| format!("finding the pod's network namespace: {e}"))
}

/// The plan for `config` in the namespace, plus its addresses (to confirm the namespace still
/// holds the pod IP). Blocking (enters the namespace).
pub fn plan_in(config: &Config, netns: &Path) -> Result<(Plan, Vec<IpAddr>), String> {
    let facts = redirect::read_facts(Some(netns), None)
        .map_err(|e| format!("reading the addresses in {}: {e}", netns.display()))?;
    let plan = Plan::build(config, &facts)
        .map_err(|e| format!("building the redirect rules for {}: {e}", netns.display()))?;
    Ok((plan, facts.local_addrs))
}
