//! A running pod's redirect as the plugin would program it, in named steps: Pod → verdict and
//! capture Config (the plugin's own routing and mapping) → network namespace (found through the
//! host's /proc by the pod IP) → Plan (from the namespace's addresses). Shared by the repair
//! controller and the continuous reconciler, so both program exactly what ADD would.

use capture::{Config, Plan};
use k8s_openapi::api::core::v1::Pod;
use pod_policy::{Decision, Labels, Policy};
use std::net::IpAddr;
use std::path::Path;

/// Why guardian leaves an ambient pod ([`Decision::Ambient`]) alone.
pub const AMBIENT_POD: &str = "an ambient pod: the node agent keeps its rules";

/// The plugin's decision (`pod_policy::decide`, without namespace labels): guardian programs
/// [`Decision::Sidecar`] pods and leaves the others ([`Decision::Skip`]'s reason, or
/// [`AMBIENT_POD`]). Pure. `Err` is an invalid pod configuration (the plugin would refuse the
/// pod too).
pub fn verdict(pod: &Pod, policy: &Policy) -> Result<Decision, String> {
    pod_policy::decide(pod, &Labels::new(), policy)
        .map_err(|e| format!("invalid pod configuration: {e}"))
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
