//! A running pod's redirect as the plugin would program it, in named steps: Pod → verdict and
//! capture Config (the plugin's own routing and mapping) → network namespace (found through the
//! host's /proc by the pod IP) → Plan (from the namespace's addresses). Shared by the repair
//! controller and the continuous reconciler, so both program exactly what ADD would.

use capture::{Config, Plan};
use k8s_openapi::api::core::v1::Pod;
use pod_policy::{Decision, Labels, Policy, PolicyError};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Why guardian leaves an ambient pod ([`Decision::Ambient`]) alone.
pub const AMBIENT_POD: &str = "an ambient pod: the node agent keeps its rules";

/// The plugin's decision (`pod_policy::decide`, without namespace labels): guardian programs
/// [`Decision::Sidecar`] pods and leaves the others ([`Decision::Skip`]'s reason, or
/// [`AMBIENT_POD`]). Pure. `Err` is an invalid pod configuration (the plugin would refuse the
/// pod too).
pub fn verdict(pod: &Pod, policy: &Policy) -> Result<Decision, InvalidPod> {
    Ok(pod_policy::decide(pod, &Labels::new(), policy)?)
}

/// The pod's annotations cannot be used (the error names the annotation and its value).
#[derive(Debug, thiserror::Error)]
#[error("invalid pod configuration: {0}")]
pub struct InvalidPod(#[from] pub PolicyError);

/// Why the plan for a pod's namespace could not be made; both name the namespace.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("reading the addresses in {}: {source}", .netns.display())]
    Facts {
        netns: PathBuf,
        source: redirect::RedirectError,
    },
    #[error("building the redirect rules for {}: {source}", .netns.display())]
    Build {
        netns: PathBuf,
        source: capture::ConfigError,
    },
}

/// The plan for `config` in the namespace, plus its addresses (to confirm the namespace still
/// holds the pod IP). Blocking (enters the namespace).
pub fn plan_in(config: &Config, netns: &Path) -> Result<(Plan, Vec<IpAddr>), PlanError> {
    let facts = redirect::read_facts(Some(netns), None).map_err(|source| PlanError::Facts {
        netns: netns.into(),
        source,
    })?;
    let plan = Plan::build(config, &facts).map_err(|source| PlanError::Build {
        netns: netns.into(),
        source,
    })?;
    Ok((plan, facts.local_addrs))
}
