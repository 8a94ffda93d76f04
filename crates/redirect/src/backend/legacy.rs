//! iptables-legacy (`iptables_legacy`): restore payloads run by child processes, which inherit
//! the caller's hold on the namespace's lock; the host rule's calls take the node namespace's
//! lock themselves. The value carries where its binaries are looked up.

use super::RuleBackend;
use crate::{Backend, RedirectError, Scope};
use capture::{Plan, ProbeSource};
use iptables_legacy::{Tools, ambient_host};
use netns::NsLock;
use std::borrow::Cow;
use std::net::IpAddr;

/// The iptables-legacy backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LegacyRules {
    /// `None`: [`Tools::default`], looked up on each call (`$PATH` as the caller has it then).
    tools: Option<Tools>,
}

impl LegacyRules {
    pub const fn new() -> LegacyRules {
        LegacyRules { tools: None }
    }

    /// Looks its binaries up with `tools`.
    pub fn with_tools(tools: Tools) -> LegacyRules {
        LegacyRules { tools: Some(tools) }
    }

    fn tools(&self) -> Cow<'_, Tools> {
        match &self.tools {
            Some(t) => Cow::Borrowed(t),
            None => Cow::Owned(Tools::default()),
        }
    }
}

impl RuleBackend for LegacyRules {
    fn kind(&self) -> Backend {
        Backend::IptablesLegacy
    }

    /// Always usable here: a missing binary is named when it is needed.
    fn unsupported(&self) -> Option<String> {
        None
    }

    fn claims(&self) -> Option<String> {
        iptables_legacy::has_legacy_rules(&self.tools())
            .unwrap_or(false)
            .then(|| "the namespace already holds iptables-legacy rules".into())
    }

    fn apply(&self, plan: &Plan, held: &NsLock) -> Result<(), RedirectError> {
        Ok(iptables_legacy::apply(plan, held, &self.tools())?)
    }

    fn check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        Ok(iptables_legacy::check(plan, &self.tools())?)
    }

    /// Every chain of ours whatever the scope: `ISTIO_*` chains are ours whichever plan made
    /// them. What cannot be read counts as absent.
    fn cleanup(&self, _scope: Scope, held: &NsLock) -> Result<(), RedirectError> {
        let tools = self.tools();
        if iptables_legacy::has_our_chains(&tools).unwrap_or(false) {
            iptables_legacy::cleanup(held, &tools)?;
        }
        Ok(())
    }

    /// Also the plan's rules in built-in chains, verified by reading back.
    fn remove_plan(&self, plan: &Plan, held: &NsLock) -> Result<(), RedirectError> {
        iptables_legacy::cleanup_plan(plan, held, &self.tools())?;
        Ok(())
    }

    fn has_ours(&self) -> Result<bool, RedirectError> {
        Ok(iptables_legacy::has_our_chains(&self.tools())?)
    }

    /// Both families' restore payloads.
    fn dry_run(&self, plan: &Plan) -> String {
        iptables_legacy::render_payload(plan, false) + &iptables_legacy::render_payload(plan, true)
    }

    /// Istio's `-m owner --socket-exists`, so the payload is Istio's own, byte for byte.
    fn probe_source(&self, _kubelet_uid: Option<u32>) -> ProbeSource {
        ProbeSource::AnyLocalSocket
    }

    fn host_describe(&self) -> &'static str {
        "iptables-legacy nat ISTIO_POSTRT, ipsets istio-inpod-probes-v4/v6"
    }

    fn host_ensure(&self, plan: &Plan) -> Result<(), RedirectError> {
        Ok(ambient_host::ensure(plan, &self.tools())?)
    }

    /// One `ipset restore` for every pod.
    fn host_add_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<(), RedirectError> {
        Ok(ambient_host::add_pods_ips(plan, pods, &self.tools())?)
    }

    fn host_pod_ips(&self, plan: &Plan) -> Result<Vec<IpAddr>, RedirectError> {
        Ok(ambient_host::pod_ips(plan, &self.tools())?)
    }

    fn host_sync_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError> {
        Ok(ambient_host::sync_pods_ips(plan, pods, &self.tools())?)
    }

    fn host_remove_pod_ips(&self, plan: &Plan, ips: &[IpAddr]) -> Result<(), RedirectError> {
        Ok(ambient_host::remove_pod_ips(plan, ips, &self.tools())?)
    }

    fn host_check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        Ok(ambient_host::check(plan, &self.tools())?)
    }

    fn host_remove_all(&self) -> Result<bool, RedirectError> {
        Ok(ambient_host::remove_all(&self.tools())?)
    }
}
