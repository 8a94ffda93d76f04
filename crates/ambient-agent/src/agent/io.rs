//! What the agent asks of the world outside it, as two traits: the [`Kernel`] (a pod's in-pod
//! rules, the node's host probe rule) and [`Ztunnel`] (ZDS). The daemon passes the live ones
//! ([`LiveKernel`], `zds::ZdsServer`); the agent's unit tests pass recording fakes, so every
//! ordering and failure path of an enroll or a release is checked without root
//! (`agent/tests.rs`), as ztunnel's own `inpod` state manager is tested behind its traits.

use capture::Plan;
use redirect::host_probe::HostProbeRule;
use redirect::{BackendChoice, RedirectError};
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;
use zds::{DelOutcome, WorkloadInfo, ZdsError, ZdsServer};

/// The kernel work of the agent. Blocking calls: the agent runs them off the async threads.
/// The pod calls work in the namespace `netns` names, each under that namespace's lock (waited
/// for until `deadline`); the `host_*` calls in the node's, with the host probe rule's `plan`.
pub trait Kernel: Send + Sync + 'static {
    /// Programs the pod's in-pod rules: one atomic batch.
    fn program(&self, plan: &Plan, netns: &Path, deadline: Instant) -> Result<(), RedirectError>;

    /// Differences between the pod's live rules and `plan` (empty: in sync).
    fn check(
        &self,
        plan: &Plan,
        netns: &Path,
        deadline: Instant,
    ) -> Result<Vec<String>, RedirectError>;

    /// Removes our ambient rules from the namespace, whatever plan made them.
    fn unprogram(&self, netns: &Path, deadline: Instant) -> Result<(), RedirectError>;

    /// Writes the host probe rule and its sets (elements already there stay).
    fn host_ensure(&self, plan: &Plan) -> Result<(), RedirectError>;

    /// Differences between the host rule (not its sets' elements) and `plan`.
    fn host_check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError>;

    /// Adds pods' addresses (`(pod UID, its IPs)`) to the probe sets.
    fn host_add_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<(), RedirectError>;

    /// Makes the probe sets hold exactly `pods`' addresses; returns those removed.
    fn host_sync_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError>;

    /// Takes addresses out of the probe sets (absent ones are ignored).
    fn host_remove_pod_ips(&self, plan: &Plan, ips: &[IpAddr]) -> Result<(), RedirectError>;

    /// Removes the host rule and its sets; returns whether they existed.
    fn host_remove_all(&self) -> Result<bool, RedirectError>;
}

/// ztunnel, as the agent reaches it over ZDS.
pub trait Ztunnel: Send + Sync + 'static {
    /// Whether a ztunnel is connected and has acknowledged its snapshot.
    fn is_ready(&self) -> bool;

    /// Where ztunnel connects (for errors).
    fn socket_path(&self) -> &Path;

    /// The pods ztunnel is told about (the next snapshot's).
    fn known_workloads(&self) -> Vec<String>;

    /// Hands the pod's namespace to ztunnel; returns once ztunnel acknowledged it.
    fn add_workload(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: OwnedFd,
    ) -> impl Future<Output = Result<(), ZdsError>> + Send;

    /// Stops ztunnel serving the pod.
    fn del_workload(&self, uid: &str) -> impl Future<Output = Result<DelOutcome, ZdsError>> + Send;
}

/// The node's kernel through `redirect`: in-pod rules on the node's backend, and the host
/// probe rule on the same backend (as Istio pairs them).
#[derive(Clone, Copy, Debug)]
pub struct LiveKernel {
    pub backend: BackendChoice,
    pub host: HostProbeRule,
}

impl Kernel for LiveKernel {
    fn program(&self, plan: &Plan, netns: &Path, deadline: Instant) -> Result<(), RedirectError> {
        redirect::apply_until(plan, Some(netns), self.backend, deadline).map(|_| ())
    }

    fn check(
        &self,
        plan: &Plan,
        netns: &Path,
        deadline: Instant,
    ) -> Result<Vec<String>, RedirectError> {
        redirect::check_until(plan, Some(netns), self.backend, deadline)
    }

    fn unprogram(&self, netns: &Path, deadline: Instant) -> Result<(), RedirectError> {
        redirect::cleanup_scope_until(Some(netns), redirect::Scope::AMBIENT, deadline)
    }

    fn host_ensure(&self, plan: &Plan) -> Result<(), RedirectError> {
        self.host.ensure(plan)
    }

    fn host_check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        self.host.check(plan)
    }

    fn host_add_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<(), RedirectError> {
        self.host.add_pods_ips(plan, pods)
    }

    fn host_sync_pods_ips(
        &self,
        plan: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError> {
        self.host.sync_pods_ips(plan, pods)
    }

    fn host_remove_pod_ips(&self, plan: &Plan, ips: &[IpAddr]) -> Result<(), RedirectError> {
        self.host.remove_pod_ips(plan, ips)
    }

    fn host_remove_all(&self) -> Result<bool, RedirectError> {
        self.host.remove_all()
    }
}

impl Ztunnel for ZdsServer {
    fn is_ready(&self) -> bool {
        ZdsServer::is_ready(self)
    }

    fn socket_path(&self) -> &Path {
        ZdsServer::socket_path(self)
    }

    fn known_workloads(&self) -> Vec<String> {
        ZdsServer::known_workloads(self)
    }

    fn add_workload(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: OwnedFd,
    ) -> impl Future<Output = Result<(), ZdsError>> + Send {
        ZdsServer::add_workload(self, uid, info, netns)
    }

    fn del_workload(&self, uid: &str) -> impl Future<Output = Result<DelOutcome, ZdsError>> + Send {
        ZdsServer::del_workload(self, uid)
    }
}
