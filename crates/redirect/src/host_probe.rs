//! Ambient's host probe rule on the node's backend: kubelet's probes to ambient pods SNATed to
//! 169.254.7.127 so the pods' rules let them through to the app. The rule follows the backend
//! of the pods' rules, as Istio pairs them: `inet istio-ambient-nat` with its nft sets
//! (`nft_backend::ambient_host`), or Istio's legacy rule, `nat ISTIO_POSTRT` with the ipsets
//! `istio-inpod-probes-v4/v6` (`iptables_legacy::ambient_host`).
//!
//! Every call works in the node's network namespace: the calling thread's own, or the one
//! [`crate::host_netns`] switches to (Istio's chart runs the daemon in a pod network).

use crate::backend::{self, RuleBackend};
use crate::{Backend, RedirectError};
use capture::{Plan, ProbeSource};
use std::net::IpAddr;

/// The host rule of one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostProbeRule {
    backend: Backend,
}

impl HostProbeRule {
    pub fn new(backend: Backend) -> HostProbeRule {
        HostProbeRule { backend }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn rules(&self) -> &'static dyn RuleBackend {
        backend::of(self.backend)
    }

    /// Which local traffic is a probe, as Istio has it per backend: with nft kubelet's sockets
    /// when its uid is known (else any local socket); with iptables-legacy any local socket
    /// (`-m owner --socket-exists`), so the payload is Istio's own, byte for byte.
    pub fn probe_source(&self, kubelet_uid: Option<u32>) -> ProbeSource {
        self.rules().probe_source(kubelet_uid)
    }

    /// Whether this backend's rule tells probes by the kubelet's uid (then the caller looks
    /// the uid up for [`HostProbeRule::probe_source`]; otherwise it needs none).
    pub fn wants_kubelet_uid(&self) -> bool {
        matches!(self.probe_source(Some(0)), ProbeSource::KubeletUid(_))
    }

    /// Where the rule lives, for logs.
    pub fn describe(&self) -> &'static str {
        self.rules().host_describe()
    }

    /// Writes the rule and its sets (elements already there stay). A host rule of another
    /// backend (the node's backend changed since it was written) is removed first; failing to
    /// remove it is logged, not fatal: this backend's rule works either way.
    pub fn ensure(&self, plan: &Plan) -> Result<(), RedirectError> {
        crate::host_netns::run(|| ensure_among(&backend::all(), self.backend, plan))
    }

    /// Adds a pod's IPs to the sets, commented with its UID (IPv6 skipped without IPv6 sets).
    pub fn add_pod_ips(
        &self,
        plan: &Plan,
        ips: &[IpAddr],
        pod_uid: &str,
    ) -> Result<(), RedirectError> {
        self.add_pods_ips(plan, &[(pod_uid, ips)])
    }

    /// [`HostProbeRule::add_pod_ips`] of many pods (`(pod UID, its IPs)`), e.g. to re-assert
    /// every served pod's addresses (one `ipset restore` on iptables-legacy).
    pub fn add_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<(), RedirectError> {
        crate::host_netns::run(|| self.rules().host_add_pods_ips(plan, pods))
    }

    /// The addresses in the sets now.
    pub fn pod_ips(&self, plan: &Plan) -> Result<Vec<IpAddr>, RedirectError> {
        crate::host_netns::run(|| self.rules().host_pod_ips(plan))
    }

    /// Makes the sets hold exactly the addresses of `pods` (`(pod UID, its IPs)`): missing ones
    /// added with their pod's UID, every other one removed (one batch on nft, one `ipset
    /// restore` on iptables-legacy), as Istio prunes its sets (`pruneHostIPset`). Returns the
    /// addresses removed.
    pub fn sync_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError> {
        crate::host_netns::run(|| self.rules().host_sync_pods_ips(plan, pods))
    }

    /// Removes IPs from the sets; IPs that are not there are ignored.
    pub fn remove_pod_ips(&self, plan: &Plan, ips: &[IpAddr]) -> Result<(), RedirectError> {
        crate::host_netns::run(|| self.rules().host_remove_pod_ips(plan, ips))
    }

    /// Differences between the node's host rule and `plan` (empty: in sync): the rule, the
    /// jump to it and the sets; their elements are not compared (the agent re-adds its pods'
    /// addresses, which is idempotent).
    pub fn check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        crate::host_netns::run(|| self.rules().host_check(plan))
    }

    /// Removes the rule and its sets. Returns whether they existed.
    pub fn remove_all(&self) -> Result<bool, RedirectError> {
        crate::host_netns::run(|| self.rules().host_remove_all())
    }
}

/// [`HostProbeRule::ensure`] in the node's namespace, over `backends`.
pub(crate) fn ensure_among(
    backends: &[&dyn RuleBackend],
    chosen: Backend,
    plan: &Plan,
) -> Result<(), RedirectError> {
    for other in backends.iter().filter(|b| b.kind() != chosen) {
        match other.host_remove_all() {
            Ok(true) => tracing::info!(
                removed = other.host_describe(),
                "host probe rule of the other backend removed"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "removing the host probe rule of the other backend failed"
            ),
        }
    }
    backend::among(backends, chosen).host_ensure(plan)
}

/// Removes the host rule of every backend (uninstall: the node's backend may have changed
/// between runs). All are tried; the first error is returned. Returns whether any existed.
pub fn remove_all_backends() -> Result<bool, RedirectError> {
    crate::host_netns::run(|| remove_all_among(&backend::all()))
}

pub(crate) fn remove_all_among(backends: &[&dyn RuleBackend]) -> Result<bool, RedirectError> {
    let mut any = false;
    let mut first_err = None;
    for b in backends {
        match b.host_remove_all() {
            Ok(existed) => any |= existed,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(any),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_probes_are_istios_any_local_socket() {
        let legacy = HostProbeRule::new(Backend::IptablesLegacy);
        assert_eq!(legacy.probe_source(Some(7)), ProbeSource::AnyLocalSocket);
        let nft = HostProbeRule::new(Backend::Nft);
        assert_eq!(nft.probe_source(Some(7)), ProbeSource::KubeletUid(7));
        assert_eq!(nft.probe_source(None), ProbeSource::AnyLocalSocket);
        assert!(nft.wants_kubelet_uid() && !legacy.wants_kubelet_uid());
    }
}
