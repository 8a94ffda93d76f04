//! Istio's AWS branch ENI probe rules (`AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`) in the node's
//! network namespace: the `tcp_early_demux` gate, detection of an ambient pod address routed by
//! aws-vpc-cni through a branch ENI (Security Groups for Pods), and the two `ip rule`s that send
//! kubelet's probes to it through its veth (`pod_routes::branch_eni`). Every call runs where the
//! host probe rule does ([`crate::host_netns`]), as Istio runs them inside `RunAsHost`.

use crate::RedirectError;
use pod_routes::branch_eni::kernel;
use std::net::IpAddr;

pub use pod_routes::branch_eni::{BranchEni, forward_rule, return_rule};

/// Whether `net.ipv4.tcp_early_demux` is 0 in the node's namespace (AWS requires it for SGP;
/// the kernel's default is 1). Unreadable: `Ok(false)`, logged at debug level, as Istio has it.
pub fn early_demux_disabled() -> Result<bool, RedirectError> {
    crate::host_netns::run(|| match kernel::tcp_early_demux_disabled() {
        Ok(disabled) => Ok(disabled),
        Err(e) => {
            tracing::debug!(error = %e, "could not read net.ipv4.tcp_early_demux, assuming default (enabled)");
            Ok(false)
        }
    })
}

/// The branch ENI layout of `pod`, if aws-vpc-cni routes it through one (the gate is the
/// caller's).
pub fn detect(pod: IpAddr) -> Result<Option<BranchEni>, RedirectError> {
    crate::host_netns::run(|| Ok(kernel::detect(pod)?))
}

/// Adds the forward and return rules for `pod` (idempotent).
pub fn add(pod: IpAddr, eni: &BranchEni) -> Result<(), RedirectError> {
    crate::host_netns::run(|| Ok(kernel::add(pod, eni)?))
}

/// Removes them; a rule already gone is not an error. Returns what failed.
pub fn remove(pod: IpAddr, eni: &BranchEni) -> Result<Vec<String>, RedirectError> {
    crate::host_netns::run(|| {
        Ok(kernel::remove(pod, eni)
            .into_iter()
            .map(|e| e.to_string())
            .collect())
    })
}
