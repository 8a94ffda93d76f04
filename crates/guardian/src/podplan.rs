//! A running pod's redirect as the plugin would program it, in named steps: Pod → verdict and
//! capture Config (the plugin's own routing and mapping) → network namespace (found through the
//! host's /proc by the pod IP) → Plan (from the namespace's addresses). Shared by the repair
//! controller and the continuous reconciler, so both program exactly what ADD would.

use k8s_openapi::api::core::v1::Pod;
use pod_policy::{Decision, Labels, PodConfig, Policy};
use redirect::capture::{Config, Plan};
use std::net::IpAddr;
use std::path::Path;

pub use node_view::running::locate;
pub use pod_policy::bypass::{finished, pod_ip};

/// What the plugin would do with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not programmed by the plugin (why).
    Skip(String),
    /// A mesh pod: the plugin programs this config (warnings: what it tolerated).
    Mesh(Box<PodConfig>),
}

/// The plugin's decision (`pod_policy::decide`) for a sidecar pod. Pure. `Err` is an invalid
/// pod configuration (the plugin would refuse the pod too).
pub fn verdict(pod: &Pod, policy: &Policy) -> Result<Verdict, String> {
    match pod_policy::decide(pod, &Labels::new(), policy) {
        Ok(Decision::Skip(why)) => Ok(Verdict::Skip(why)),
        Ok(Decision::Sidecar(pc)) => Ok(Verdict::Mesh(pc)),
        Ok(Decision::Ambient(_)) => Ok(Verdict::Skip(
            "an ambient pod: the node agent keeps its rules".into(),
        )),
        Err(e) => Err(format!("invalid pod configuration: {e}")),
    }
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
