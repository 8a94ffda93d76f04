//! The one place that enrolls an ambient pod and releases it, in named steps: in-pod rules
//! (one atomic batch under the namespace's lock) → the pod's IPs in the host probe sets →
//! ztunnel's Ack over ZDS. A failed step undoes the ones before it, so a pod is either fully
//! served or left as it was. Calls on ONE pod are serialized (the plugin's ADD/DEL, the pod
//! watch and the reconciler never interleave on it); different pods proceed at once: their
//! rules live in different namespaces (each under its own lock), a probe-set update is one
//! small atomic write, and ZDS keeps what ztunnel needs in order (one message at a time).
//!
//! The agent's state is its `book` (pure, unit-tested); the kernel and ztunnel are behind
//! the traits of [`io`], so the order of every step and every failure path is unit-tested
//! without root in `agent/tests.rs`.

use crate::branch_eni::BranchEniProbe;
use book::{Book, Enrolled, Taken};
use capture::{AmbientConfig, AmbientPod, Plan, ProbeSnat};
use redirect::host_probe::HostProbeRule;
use redirect::{BackendChoice, RedirectError};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use zds::{WorkloadInfo, ZdsError, ZdsServer};

mod book;
// The step an enroll failed at, for the failure counter.
mod figures;
mod host;
pub mod io;
#[cfg(test)]
mod tests;

pub use io::{Kernel, LiveKernel, Ztunnel};

/// The agent bounds each pod operation well inside the plugin's handoff timeout (20 s), so the
/// plugin gets the agent's reason rather than its own timeout.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// What the agent needs to know about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmbientPodRef {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub ips: Vec<IpAddr>,
    pub settings: AmbientPod,
}

impl AmbientPodRef {
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The node's settings for every ambient pod.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    pub backend: BackendChoice,
    pub dns_capture: bool,
    pub ipv6: bool,
    /// Where kubelet's probes come from inside a pod (`HOST_PROBE_SNAT_IP`/`_IPV6`): the
    /// in-pod rules let this address in, the host rule SNATs probes to it.
    pub probe_snat: ProbeSnat,
    /// The host probe rule (`Plan::ambient_host`), installed with the first pod.
    pub host_plan: Plan,
    /// The host rule's backend: the node's, the same as the pods' rules (as Istio pairs them).
    pub host: HostProbeRule,
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`: branch ENI pods' probe rules ([`BranchEniProbe`]).
    pub aws_branch_eni_probe: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("pod {pod}: its ambient rules: {source}")]
    Plan {
        pod: String,
        source: capture::ConfigError,
    },
    #[error("pod {pod}: programming its ambient rules: {source}")]
    Rules { pod: String, source: RedirectError },
    #[error("pod {pod}: the host probe rule: {source}")]
    Host { pod: String, source: RedirectError },
    #[error("checking the host probe rule: {0}")]
    HostCheck(#[source] RedirectError),
    #[error("pod {pod}: {source}")]
    Ztunnel { pod: String, source: ZdsError },
    #[error("{what}: the agent's worker failed: {source}")]
    Worker { what: String, source: WorkerError },
    #[error("pod {pod}: removing its leftover ambient rules: {source}")]
    Clear { pod: String, source: RedirectError },
}

/// Why the agent could not run a step at all (not the step's own failure).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("its blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("duplicating the netns fd: {0}")]
    Dup(#[from] std::io::Error),
}

impl AgentError {
    /// ztunnel is not there, gone mid-way or busy past the queue bound (a slow snapshot): the
    /// plugin may retry later (CNI code 11).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            AgentError::Ztunnel {
                source: ZdsError::NotConnected { .. }
                    | ZdsError::Link { .. }
                    | ZdsError::Busy { .. },
                ..
            }
        ) || matches!(
            self,
            AgentError::Rules {
                source: RedirectError::Lock(_),
                ..
            }
        )
    }

    fn worker(what: impl Into<String>) -> impl FnOnce(tokio::task::JoinError) -> AgentError {
        let what = what.into();
        move |e| AgentError::Worker {
            what,
            source: WorkerError::Join(e),
        }
    }
}

/// The agent: its book of the node, and the world it acts on (ztunnel `Z`, the kernel `K`;
/// the daemon's are ZDS and the node's kernel).
pub struct Agent<Z = ZdsServer, K = LiveKernel> {
    zds: Z,
    kernel: Arc<K>,
    settings: AgentSettings,
    /// Held briefly (the book), never across a pod's kernel work or ZDS.
    book: Mutex<Book>,
    /// One lock per pod UID: one operation on a pod at a time.
    pod_locks: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// With the probe addresses: branch ENI pods' rules (added and removed with them).
    branch_eni: Arc<BranchEniProbe>,
}

/// How an enrolled pod's namespace is reached for rule work: through our fd.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Whether `path` names the namespace `fd` holds (device and inode: a namespace's identity).
/// A path that cannot be read (empty, gone) is not provably the same.
fn same_namespace(fd: &OwnedFd, path: &Path) -> bool {
    use netns::NsId;
    match (NsId::of_path(&fd_path(fd)), NsId::of_path(path)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl Agent {
    /// The daemon's agent: ZDS and the node's kernel, serving no pod yet; pods of the startup
    /// snapshot come through [`Agent::adopt`].
    pub fn new(zds: ZdsServer, settings: AgentSettings) -> Agent {
        let kernel = LiveKernel {
            backend: settings.backend,
            host: settings.host,
        };
        Agent::with_io(zds, kernel, settings)
    }
}

impl<Z: Ztunnel, K: Kernel> Agent<Z, K> {
    /// An agent acting through `zds` and `kernel`.
    pub fn with_io(zds: Z, kernel: K, settings: AgentSettings) -> Agent<Z, K> {
        Agent {
            zds,
            kernel: Arc::new(kernel),
            branch_eni: Arc::new(BranchEniProbe::new(settings.aws_branch_eni_probe)),
            settings,
            book: Mutex::new(Book::default()),
            pod_locks: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Waits for the pod's own lock (other pods' operations do not queue here).
    async fn lock_pod(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.pod_locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(uid.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// Forgets a released pod's lock once nobody holds or waits for it.
    fn forget_pod_lock(&self, uid: &str) {
        let mut locks = self.pod_locks.lock().unwrap_or_else(|e| e.into_inner());
        if locks.get(uid).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(uid);
        }
    }

    pub fn zds(&self) -> &Z {
        &self.zds
    }

    /// The node's settings for every ambient pod (the host probe rule and its plan).
    pub fn settings(&self) -> &AgentSettings {
        &self.settings
    }

    /// The branch ENI pods' probe rules this agent added (blocking calls).
    pub fn branch_eni(&self) -> &Arc<BranchEniProbe> {
        &self.branch_eni
    }

    /// The in-pod plan for a pod.
    pub fn plan_for(&self, pod: &AmbientPodRef) -> Result<Plan, AgentError> {
        Plan::ambient(&AmbientConfig {
            redirect_dns: self.settings.dns_capture,
            ipv6: self.settings.ipv6,
            pod: pod.settings.clone(),
            host_probe_snat_v4: self.settings.probe_snat.v4,
            host_probe_snat_v6: self.settings.probe_snat.v6,
        })
        .map_err(|source| AgentError::Plan {
            pod: pod.label(),
            source,
        })
    }

    pub async fn is_enrolled(&self, uid: &str) -> bool {
        self.book.lock().await.pods.contains_key(uid)
    }

    pub async fn enrolled(&self) -> Vec<(AmbientPodRef, Arc<OwnedFd>)> {
        let g = self.book.lock().await;
        g.pods
            .values()
            .map(|e| (e.pod.clone(), e.netns.clone()))
            .collect()
    }

    pub async fn uid_of(&self, namespace: &str, name: &str) -> Option<String> {
        let g = self.book.lock().await;
        g.pods
            .values()
            .find(|e| e.pod.namespace == namespace && e.pod.name == name)
            .map(|e| e.pod.uid.clone())
    }

    /// Records a pod the startup snapshot handed to ztunnel (rules already reconciled).
    pub async fn adopt(&self, pod: AmbientPodRef, netns: OwnedFd) -> Result<(), AgentError> {
        let mut g = self.book.lock().await;
        self.ensure_host(&mut g, &pod).await?;
        self.add_probe_ips(&pod).await?;
        g.adopt(pod, netns);
        Ok(())
    }

    /// Serves a pod: rules, probe IPs, ztunnel. Enrolling an enrolled pod again re-applies its
    /// rules and re-sends it (idempotent), e.g. a sandbox re-ADDed by the runtime.
    pub async fn enroll(&self, pod: AmbientPodRef, netns: OwnedFd) -> Result<(), AgentError> {
        let started = Instant::now();
        let served = self.enroll_untimed(pod, netns).await;
        let failed = served.as_ref().err().map(figures::failure_reason);
        node_status::figures::global().observe_enroll(started.elapsed(), failed);
        served
    }

    async fn enroll_untimed(&self, pod: AmbientPodRef, netns: OwnedFd) -> Result<(), AgentError> {
        let started = Instant::now();
        // Without ztunnel the enroll cannot finish: fail before touching anything.
        if !self.zds.is_ready() {
            return Err(AgentError::Ztunnel {
                pod: pod.label(),
                source: ZdsError::NotConnected {
                    socket: self.zds.socket_path().to_path_buf(),
                    pod: pod.label(),
                },
            });
        }
        let _pod = self.lock_pod(&pod.uid).await;
        let queued = started.elapsed();
        let plan = self.plan_for(&pod)?;
        let netns = Arc::new(netns);
        self.program_plan(&pod, &plan, &netns).await?;
        if let Err(e) = self.begin(&pod).await {
            // No host probe rule: the rules just written would send the pod's traffic to a
            // ztunnel that never gets it, and a pod the agent enrolled itself gets no DEL.
            self.undo_rules(&pod, &netns).await;
            return Err(e);
        }
        let served = self.serve(&pod, &netns).await;
        let previous = self.book.lock().await.finish(&pod, &netns, served.is_ok());
        if let Err(e) = served {
            self.undo(&pod, &netns).await;
            return Err(e);
        }
        if let Some(old) = previous {
            self.drop_old_addresses(&pod, old).await;
        }
        tracing::info!(pod = %pod.label(), uid = %pod.uid, ips = ?pod.ips, queued_us = queued.as_micros() as u64, took_us = (started.elapsed() - queued).as_micros() as u64, "ambient pod enrolled: ztunnel serves it");
        Ok(())
    }

    /// The host rule is in (installed with the first pod) and stays while this enroll runs.
    async fn begin(&self, pod: &AmbientPodRef) -> Result<(), AgentError> {
        let mut g = self.book.lock().await;
        self.ensure_host(&mut g, pod).await?;
        g.begin(pod);
        Ok(())
    }

    /// The probe IPs, then ztunnel's Ack.
    async fn serve(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) -> Result<(), AgentError> {
        self.add_probe_ips(pod).await?;
        let fd = netns.try_clone().map_err(|e| AgentError::Worker {
            what: format!("pod {}", pod.label()),
            source: WorkerError::Dup(e),
        })?;
        let info = WorkloadInfo {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
        };
        self.zds
            .add_workload(&pod.uid, info, fd)
            .await
            .map_err(|source| AgentError::Ztunnel {
                pod: pod.label(),
                source,
            })
    }

    /// A re-created sandbox may have new addresses: the old ones leave the probe sets.
    async fn drop_old_addresses(&self, pod: &AmbientPodRef, old: Enrolled) {
        let stale: Vec<IpAddr> = old
            .pod
            .ips
            .into_iter()
            .filter(|ip| !pod.ips.contains(ip))
            .collect();
        if stale.is_empty() {
            return;
        }
        if let Err(e) = self.remove_probe_ips(&pod.uid, &stale).await {
            tracing::warn!(pod = %pod.label(), error = %e, "removing the old probe IPs failed");
        }
    }

    /// Rolls a failed enroll back: no rules, no probe IPs (ZDS withdrew the pod itself).
    async fn undo(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) {
        self.undo_rules(pod, netns).await;
        if let Err(e) = self.remove_probe_ips(&pod.uid, &pod.ips).await {
            tracing::error!(pod = %pod.label(), error = %e, "rolling back: removing the probe IPs failed");
        }
        let mut g = self.book.lock().await;
        self.drop_host_if_idle(&mut g).await;
    }

    /// Rolls back the in-pod rules of an enroll that failed before ztunnel was asked.
    async fn undo_rules(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) {
        if let Err(e) = self.unprogram(pod, netns).await {
            tracing::error!(pod = %pod.label(), error = %e, "rolling back: removing the ambient rules failed");
        }
    }

    /// Stops serving a pod: ztunnel told, the rules removed from its namespace (which our fd
    /// keeps alive until then), probe IPs removed. Returns whether the pod was enrolled.
    pub async fn release(&self, uid: &str, why: &str) -> bool {
        let guard = self.lock_pod(uid).await;
        let released = self.release_locked(uid, why).await;
        drop(guard);
        self.forget_pod_lock(uid);
        released
    }

    async fn release_locked(&self, uid: &str, why: &str) -> bool {
        let taken = self.book.lock().await.take(uid);
        let e = match taken {
            Taken::Served(e) => e,
            Taken::Kept(ips) => {
                // A pod kept in the snapshot (its namespace not found at startup) leaves it
                // too, and its addresses the probe sets.
                self.forget_unserved(uid).await;
                if let Err(err) = self.remove_probe_ips(uid, &ips).await {
                    tracing::warn!(uid, error = %err, "removing a kept pod's probe IPs failed");
                }
                self.drop_host_if_idle(&mut *self.book.lock().await).await;
                return false;
            }
            Taken::Unknown => {
                self.forget_unserved(uid).await;
                return false;
            }
        };
        let pod = e.pod.label();
        match self.zds.del_workload(uid).await {
            Ok(outcome) => tracing::debug!(%pod, ?outcome, "ztunnel told"),
            Err(err) => tracing::warn!(%pod, error = %err, "telling ztunnel failed"),
        }
        if let Err(err) = self.unprogram(&e.pod, &e.netns).await {
            tracing::warn!(%pod, error = %err, "removing the ambient rules failed");
        }
        if let Err(err) = self.remove_probe_ips(uid, &e.pod.ips).await {
            tracing::warn!(%pod, error = %err, "removing the probe IPs failed");
        }
        self.drop_host_if_idle(&mut *self.book.lock().await).await;
        tracing::info!(%pod, uid, reason = why, "ambient pod released");
        true
    }

    /// A pod ztunnel knows of only from the startup snapshot leaves it.
    async fn forget_unserved(&self, uid: &str) {
        if self.zds.known_workloads().iter().any(|k| k == uid) {
            let _ = self.zds.del_workload(uid).await;
        }
    }

    /// A CNI DEL: releases the pod only when `netns` is the namespace it is served in. A DEL
    /// of an older sandbox of the same pod (kubelet removing it after the pod's new sandbox was
    /// served, or a repeated DEL with no namespace left) must not take the live one out of the
    /// mesh; the pod's deletion from the API releases it in any case.
    pub async fn release_sandbox(&self, uid: &str, netns: &Path, why: &str) -> bool {
        let guard = self.lock_pod(uid).await;
        let served_in = {
            let g = self.book.lock().await;
            g.pods.get(uid).map(|e| e.netns.clone())
        };
        let released = match served_in {
            Some(fd) if !same_namespace(&fd, netns) => {
                tracing::info!(uid, netns = %netns.display(), "CNI DEL of another sandbox of the pod: it stays served in its own");
                false
            }
            _ => self.release_locked(uid, why).await,
        };
        drop(guard);
        self.forget_pod_lock(uid);
        released
    }

    /// Removes a pod's ambient rules and probe addresses from a namespace this agent does not
    /// serve (a former ambient pod's leftovers; Istio's `RemovePodFromMesh`).
    pub async fn clear(&self, pod: &AmbientPodRef, netns: OwnedFd) -> Result<(), AgentError> {
        let _guard = self.lock_pod(&pod.uid).await;
        if self.book.lock().await.pods.contains_key(&pod.uid) {
            return Ok(());
        }
        self.unprogram(pod, &Arc::new(netns))
            .await
            .map_err(|e| match e {
                AgentError::Rules { pod, source } => AgentError::Clear { pod, source },
                other => other,
            })?;
        self.remove_probe_ips(&pod.uid, &pod.ips).await?;
        self.drop_host_if_idle(&mut *self.book.lock().await).await;
        Ok(())
    }

    /// Checks an enrolled pod's rules against its plan; re-applies on drift. Returns the
    /// differences found (empty: in sync).
    pub async fn reconcile(&self, uid: &str) -> Result<Vec<String>, AgentError> {
        let _pod = self.lock_pod(uid).await;
        let Some((pod, netns)) = self
            .book
            .lock()
            .await
            .pods
            .get(uid)
            .map(|e| (e.pod.clone(), e.netns.clone()))
        else {
            return Ok(Vec::new());
        };
        let plan = self.plan_for(&pod)?;
        let check_plan = plan.clone();
        let drift = self
            .in_pod(&pod, &netns, move |kernel, path, deadline| {
                kernel.check(&check_plan, path, deadline)
            })
            .await?;
        if !drift.is_empty() {
            self.program_plan(&pod, &plan, &netns).await?;
        }
        Ok(drift)
    }

    /// Programs the pod's in-pod rules as its plan says (the startup reconcile of a pod the
    /// snapshot has).
    pub async fn program(
        &self,
        pod: &AmbientPodRef,
        netns: &Arc<OwnedFd>,
    ) -> Result<(), AgentError> {
        let plan = self.plan_for(pod)?;
        self.program_plan(pod, &plan, netns).await
    }

    /// The pod's in-pod rules, one batch under its namespace's lock.
    async fn program_plan(
        &self,
        pod: &AmbientPodRef,
        plan: &Plan,
        netns: &Arc<OwnedFd>,
    ) -> Result<(), AgentError> {
        let plan = plan.clone();
        self.in_pod(pod, netns, move |kernel, path, deadline| {
            kernel.program(&plan, path, deadline)
        })
        .await
    }

    /// Removes our ambient rules from the pod's namespace.
    async fn unprogram(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) -> Result<(), AgentError> {
        self.in_pod(pod, netns, |kernel, path, deadline| {
            kernel.unprogram(path, deadline)
        })
        .await
    }

    /// Kernel work in the pod's namespace (reached through our fd, its lock waited for until
    /// [`LOCK_WAIT`] from now), off the async thread; its errors name the pod.
    async fn in_pod<T: Send + 'static>(
        &self,
        pod: &AmbientPodRef,
        netns: &Arc<OwnedFd>,
        work: impl FnOnce(&K, &Path, Instant) -> Result<T, RedirectError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let (kernel, netns) = (self.kernel.clone(), netns.clone());
        blocking(move || work(&kernel, &fd_path(&netns), Instant::now() + LOCK_WAIT))
            .await
            .map_err(AgentError::worker(format!("pod {}", pod.label())))?
            .map_err(|source| AgentError::Rules {
                pod: pod.label(),
                source,
            })
    }
}

/// Kernel work (netlink, setns) runs off the async thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(f).await
}
