//! nftables (`nft_backend`): one atomic netlink batch per plan, in-process, so the namespace's
//! lock is held by the caller alone.

use super::RuleBackend;
use crate::{Backend, RedirectError, Scope};
use capture::{Plan, ProbeSource};
use netns::NsLock;
use std::net::IpAddr;

/// The nft backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NftRules {
    /// Test hook: programs are sent with a message the kernel refuses
    /// (`nft_backend::testing::poisoned`), to prove a failed program leaves the old rules.
    poison: bool,
}

impl NftRules {
    pub const fn new() -> NftRules {
        NftRules { poison: false }
    }

    /// [`NftRules::new`] whose programs the kernel refuses (tests of failure paths).
    #[doc(hidden)]
    pub const fn poisoned() -> NftRules {
        NftRules { poison: true }
    }
}

impl RuleBackend for NftRules {
    fn kind(&self) -> Backend {
        Backend::Nft
    }

    fn unsupported(&self) -> Option<String> {
        (!nft_backend::kernel_supports_nftables())
            .then(|| "the kernel has no nf_tables support".into())
    }

    /// nft is the default: foreign nftables tables (kube-proxy's) never bind a namespace.
    fn claims(&self) -> Option<String> {
        None
    }

    fn apply(&self, plan: &Plan, _held: &NsLock) -> Result<(), RedirectError> {
        match self.poison {
            true => nft_backend::apply(&nft_backend::testing::poisoned(plan))?,
            false => nft_backend::apply(plan)?,
        };
        Ok(())
    }

    fn check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        Ok(nft_backend::check(plan)?)
    }

    fn cleanup(&self, scope: Scope, _held: &NsLock) -> Result<(), RedirectError> {
        if scope.sidecar {
            nft_backend::cleanup()?;
        }
        if scope.ambient {
            nft_backend::cleanup_ambient()?;
        }
        Ok(())
    }

    /// Our sidecar tables: the tables are the whole program (nothing of a plan sits outside
    /// them), and the routes are shared.
    fn remove_plan(&self, _plan: &Plan, _held: &NsLock) -> Result<(), RedirectError> {
        nft_backend::cleanup()?;
        Ok(())
    }

    fn has_ours(&self) -> Result<bool, RedirectError> {
        Ok(nft_backend::has_our_tables()?)
    }

    fn dry_run(&self, plan: &Plan) -> String {
        nft_backend::render_text(plan)
    }

    /// Kubelet's sockets when its uid is known, else any local socket.
    fn probe_source(&self, kubelet_uid: Option<u32>) -> ProbeSource {
        match kubelet_uid {
            Some(uid) => ProbeSource::KubeletUid(uid),
            None => ProbeSource::AnyLocalSocket,
        }
    }

    fn host_describe(&self) -> &'static str {
        "nftables inet istio-ambient-nat"
    }

    fn host_ensure(&self, plan: &Plan) -> Result<(), RedirectError> {
        Ok(nft_backend::ambient_host::ensure(plan)?)
    }

    /// One batch per pod and set.
    fn host_add_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<(), RedirectError> {
        for (uid, ips) in pods {
            nft_backend::ambient_host::add_pod_ips(plan, ips, uid)?;
        }
        Ok(())
    }

    fn host_pod_ips(&self, plan: &Plan) -> Result<Vec<IpAddr>, RedirectError> {
        Ok(nft_backend::ambient_host::pod_ips(plan)?)
    }

    fn host_sync_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError> {
        Ok(nft_backend::ambient_host::sync_pods_ips(plan, pods)?)
    }

    fn host_remove_pod_ips(&self, plan: &Plan, ips: &[IpAddr]) -> Result<(), RedirectError> {
        Ok(nft_backend::ambient_host::remove_pod_ips(plan, ips)?)
    }

    /// The host table is read back like any table of ours.
    fn host_check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        Ok(nft_backend::check(plan)?)
    }

    fn host_remove_all(&self) -> Result<bool, RedirectError> {
        Ok(nft_backend::ambient_host::remove_all()?)
    }
}
