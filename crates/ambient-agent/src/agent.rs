//! The one place that enrolls an ambient pod and releases it, in named steps: in-pod rules
//! (one atomic batch under the namespace's lock) → the pod's IPs in the host probe sets →
//! ztunnel's Ack over ZDS. A failed step undoes the ones before it, so a pod is either fully
//! served or left as it was. Calls on ONE pod are serialized (the plugin's ADD/DEL, the pod
//! watch and the reconciler never interleave on it); different pods proceed at once: their
//! rules live in different namespaces (each under its own lock), a probe-set update is one
//! small atomic write, and ZDS keeps what ztunnel needs in order (one message at a time).

use crate::branch_eni::BranchEniProbe;
use capture::{AmbientConfig, AmbientPod, Plan, ProbeSnat};
use redirect::BackendChoice;
use redirect::host_probe::HostProbeRule;
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use zds::{WorkloadInfo, ZdsServer};

// The step an enroll failed at, for the failure counter.
mod figures;

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
    #[error("pod {pod}: its ambient rules: {reason}")]
    Plan { pod: String, reason: String },
    #[error("pod {pod}: programming its ambient rules: {source}")]
    Rules {
        pod: String,
        source: redirect::RedirectError,
    },
    #[error("pod {pod}: the host probe rule: {source}")]
    Host {
        pod: String,
        source: redirect::RedirectError,
    },
    #[error("checking the host probe rule: {0}")]
    HostCheck(String),
    #[error("pod {pod}: {source}")]
    Ztunnel { pod: String, source: zds::ZdsError },
    #[error("pod {pod}: the agent's worker failed: {reason}")]
    Worker { pod: String, reason: String },
    #[error("pod {pod}: removing its leftover ambient rules and probe addresses: {reason}")]
    Clear { pod: String, reason: String },
}

impl AgentError {
    /// ztunnel is not there, gone mid-way or busy past the queue bound (a slow snapshot): the
    /// plugin may retry later (CNI code 11).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            AgentError::Ztunnel {
                source: zds::ZdsError::NotConnected { .. }
                    | zds::ZdsError::Link { .. }
                    | zds::ZdsError::Busy { .. },
                ..
            }
        ) || matches!(
            self,
            AgentError::Rules {
                source: redirect::RedirectError::Lock(_),
                ..
            }
        )
    }
}

struct Enrolled {
    pod: AmbientPodRef,
    /// Our own handle on the pod's namespace (ZDS holds another for snapshots).
    netns: Arc<OwnedFd>,
}

#[derive(Default)]
struct Inner {
    pods: HashMap<String, Enrolled>,
    host_installed: bool,
    /// The last pod went but the host rule's removal failed (e.g. a foreign iptables rule
    /// still uses a probe set, which the kernel then refuses to destroy): each reconcile pass
    /// tries again while no pod needs the rule.
    host_removal_pending: bool,
    /// Enrolls between their host-rule check and their end, by UID, with the addresses they
    /// put in the probe sets: the host rule and those addresses stay for them.
    in_flight: HashMap<String, Vec<IpAddr>>,
    /// Ambient pods the startup snapshot kept for ztunnel without finding their namespace, by
    /// UID, with their addresses: these stay in the probe sets until the pod is enrolled or
    /// released.
    kept: HashMap<String, Vec<IpAddr>>,
    /// Startup discovery is over ([`Agent::discovered`]): the probe sets may be pruned to the
    /// pods above. Before it, a valid pod not yet adopted would lose its address.
    discovered: bool,
}

impl Inner {
    /// Every address a served, enrolling or kept pod holds, with its pod's UID.
    fn held(&self) -> Vec<(String, Vec<IpAddr>)> {
        let served = self.pods.iter().map(|(uid, e)| (uid, &e.pod.ips));
        served
            .chain(self.in_flight.iter())
            .chain(self.kept.iter())
            .map(|(uid, ips)| (uid.clone(), ips.clone()))
            .collect()
    }
}

pub struct Agent {
    zds: ZdsServer,
    settings: AgentSettings,
    /// Held briefly (map and host-rule state), never across a pod's kernel work or ZDS.
    inner: Mutex<Inner>,
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
    /// An agent serving no pod yet; pods of the startup snapshot come through [`Agent::adopt`].
    pub fn new(zds: ZdsServer, settings: AgentSettings) -> Agent {
        Agent {
            zds,
            branch_eni: Arc::new(BranchEniProbe::new(settings.aws_branch_eni_probe)),
            settings,
            inner: Mutex::new(Inner::default()),
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

    pub fn zds(&self) -> &ZdsServer {
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
        .map_err(|e| AgentError::Plan {
            pod: pod.label(),
            reason: e.to_string(),
        })
    }

    pub async fn is_enrolled(&self, uid: &str) -> bool {
        self.inner.lock().await.pods.contains_key(uid)
    }

    pub async fn enrolled(&self) -> Vec<(AmbientPodRef, Arc<OwnedFd>)> {
        let g = self.inner.lock().await;
        g.pods
            .values()
            .map(|e| (e.pod.clone(), e.netns.clone()))
            .collect()
    }

    /// Records a pod the startup snapshot handed to ztunnel (rules already reconciled).
    pub async fn adopt(&self, pod: AmbientPodRef, netns: OwnedFd) -> Result<(), AgentError> {
        let mut g = self.inner.lock().await;
        self.ensure_host(&mut g, &pod).await?;
        self.add_probe_ips(&pod).await?;
        g.pods.insert(
            pod.uid.clone(),
            Enrolled {
                pod,
                netns: Arc::new(netns),
            },
        );
        Ok(())
    }

    /// Startup discovery is done: every running ambient pod found was adopted; `kept` are those
    /// whose namespace was not found (`(UID, its addresses)`), which ztunnel keeps serving.
    /// The probe sets are pruned now to the pods the agent serves or keeps (Istio's startup
    /// `pruneHostIPset`: a previous agent kept the host rule across its SIGTERM for a rollout,
    /// and pods DELeted meanwhile left their addresses), and again by each
    /// [`Agent::reconcile_host`] pass. With no such pod, the leftover host rule goes now, as it
    /// goes with the last pod.
    pub async fn discovered(&self, kept: Vec<(String, Vec<IpAddr>)>) {
        let mut g = self.inner.lock().await;
        g.kept.extend(kept);
        g.discovered = true;
        let (plan, host) = (self.settings.host_plan.clone(), self.settings.host);
        if g.host_installed {
            let held = g.held();
            let prune = move || host.sync_pods_ips(&plan, &pod_ips(&held));
            match blocking(prune).await {
                Ok(Ok(pruned)) => self.log_pruned(&pruned),
                Ok(Err(e)) => tracing::warn!(error = %e, "startup: pruning the probe sets failed"),
                Err(e) => tracing::warn!(error = %e, "startup: pruning the probe sets failed"),
            }
            return;
        }
        if !g.held().is_empty() {
            return;
        }
        g.host_removal_pending = !self
            .remove_host_rule(
                "no ambient pod on the node: the host probe rule a previous agent left removed",
            )
            .await;
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
                source: zds::ZdsError::NotConnected {
                    socket: self.zds.socket_path().to_path_buf(),
                    pod: pod.label(),
                },
            });
        }
        let _pod = self.lock_pod(&pod.uid).await;
        let queued = started.elapsed();
        let plan = self.plan_for(&pod)?;
        let netns = Arc::new(netns);
        program(&plan, &netns, self.settings.backend, &pod).await?;
        if let Err(e) = self.begin(&pod).await {
            // No host probe rule: the rules just written would send the pod's traffic to a
            // ztunnel that never gets it, and a pod the agent enrolled itself gets no DEL.
            self.undo_rules(&pod, &netns).await;
            return Err(e);
        }
        let served = self.serve(&pod, &netns).await;
        let previous = self.finish(&pod, &netns, served.is_ok()).await;
        if let Err(e) = served {
            self.undo(&pod, &netns).await;
            return Err(e);
        }
        // A re-created sandbox may have new addresses: the old ones leave the probe sets.
        if let Some(old) = previous.filter(|old| old.pod.ips != pod.ips) {
            let stale: Vec<IpAddr> = old
                .pod
                .ips
                .into_iter()
                .filter(|ip| !pod.ips.contains(ip))
                .collect();
            if let Err(e) = self.remove_probe_ips(&pod.uid, &stale).await {
                tracing::warn!(pod = %pod.label(), error = %e, "removing the old probe IPs failed");
            }
        }
        tracing::info!(pod = %pod.label(), uid = %pod.uid, ips = ?pod.ips, queued_us = queued.as_micros() as u64, took_us = (started.elapsed() - queued).as_micros() as u64, "ambient pod enrolled: ztunnel serves it");
        Ok(())
    }

    /// The host rule is in (installed with the first pod) and stays while this enroll runs.
    async fn begin(&self, pod: &AmbientPodRef) -> Result<(), AgentError> {
        let mut g = self.inner.lock().await;
        self.ensure_host(&mut g, pod).await?;
        g.in_flight.insert(pod.uid.clone(), pod.ips.clone());
        Ok(())
    }

    /// Records the outcome: a served pod enters the map (returning the entry it replaced); a
    /// failed one leaves it.
    async fn finish(
        &self,
        pod: &AmbientPodRef,
        netns: &Arc<OwnedFd>,
        served: bool,
    ) -> Option<Enrolled> {
        let mut g = self.inner.lock().await;
        g.in_flight.remove(&pod.uid);
        if served {
            g.kept.remove(&pod.uid);
        }
        if !served {
            return g.pods.remove(&pod.uid);
        }
        let entry = Enrolled {
            pod: pod.clone(),
            netns: netns.clone(),
        };
        g.pods.insert(pod.uid.clone(), entry)
    }

    /// The probe IPs, then ztunnel's Ack.
    async fn serve(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) -> Result<(), AgentError> {
        self.add_probe_ips(pod).await?;
        let fd = netns.try_clone().map_err(|e| AgentError::Worker {
            pod: pod.label(),
            reason: format!("duplicating the netns fd: {e}"),
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

    /// Rolls a failed enroll back: no rules, no probe IPs (ZDS withdrew the pod itself).
    async fn undo(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) {
        self.undo_rules(pod, netns).await;
        if let Err(e) = self.remove_probe_ips(&pod.uid, &pod.ips).await {
            tracing::error!(pod = %pod.label(), error = %e, "rolling back: removing the probe IPs failed");
        }
        let mut g = self.inner.lock().await;
        self.drop_host_if_idle(&mut g).await;
    }

    /// Rolls back the in-pod rules of an enroll that failed before ztunnel was asked.
    async fn undo_rules(&self, pod: &AmbientPodRef, netns: &Arc<OwnedFd>) {
        if let Err(e) = unprogram(netns).await {
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
        let (removed, kept) = {
            let mut g = self.inner.lock().await;
            let removed = g.pods.remove(uid);
            let kept = removed.is_none().then(|| g.kept.remove(uid)).flatten();
            (removed, kept)
        };
        let Some(e) = removed else {
            // A pod kept in the snapshot (its namespace not found at startup) leaves it too,
            // and its addresses the probe sets.
            if self.zds.known_workloads().iter().any(|k| k == uid) {
                let _ = self.zds.del_workload(uid).await;
            }
            if let Some(ips) = kept {
                if let Err(err) = self.remove_probe_ips(uid, &ips).await {
                    tracing::warn!(uid, error = %err, "removing a kept pod's probe IPs failed");
                }
                self.drop_host_if_idle(&mut *self.inner.lock().await).await;
            }
            return false;
        };
        let pod = e.pod.label();
        match self.zds.del_workload(uid).await {
            Ok(outcome) => tracing::debug!(%pod, ?outcome, "ztunnel told"),
            Err(err) => tracing::warn!(%pod, error = %err, "telling ztunnel failed"),
        }
        if let Err(err) = unprogram(&e.netns).await {
            tracing::warn!(%pod, error = %err, "removing the ambient rules failed");
        }
        if let Err(err) = self.remove_probe_ips(uid, &e.pod.ips).await {
            tracing::warn!(%pod, error = %err, "removing the probe IPs failed");
        }
        self.drop_host_if_idle(&mut *self.inner.lock().await).await;
        tracing::info!(%pod, uid, reason = why, "ambient pod released");
        true
    }

    /// A CNI DEL: releases the pod only when `netns` is the namespace it is served in. A DEL
    /// of an older sandbox of the same pod (kubelet removing it after the pod's new sandbox was
    /// served, or a repeated DEL with no namespace left) must not take the live one out of the
    /// mesh; the pod's deletion from the API releases it in any case.
    pub async fn release_sandbox(&self, uid: &str, netns: &Path, why: &str) -> bool {
        let guard = self.lock_pod(uid).await;
        let served_in = {
            let g = self.inner.lock().await;
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
        if self.inner.lock().await.pods.contains_key(&pod.uid) {
            return Ok(());
        }
        let clear = |reason| AgentError::Clear {
            pod: pod.label(),
            reason,
        };
        let netns = Arc::new(netns);
        unprogram(&netns).await.map_err(clear)?;
        self.remove_probe_ips(&pod.uid, &pod.ips)
            .await
            .map_err(clear)?;
        self.drop_host_if_idle(&mut *self.inner.lock().await).await;
        Ok(())
    }

    pub async fn uid_of(&self, namespace: &str, name: &str) -> Option<String> {
        let g = self.inner.lock().await;
        g.pods
            .values()
            .find(|e| e.pod.namespace == namespace && e.pod.name == name)
            .map(|e| e.pod.uid.clone())
    }

    async fn ensure_host(&self, g: &mut Inner, pod: &AmbientPodRef) -> Result<(), AgentError> {
        if g.host_installed {
            return Ok(());
        }
        self.on_host(pod, |host, plan| host.ensure(&plan)).await?;
        g.host_installed = true;
        g.host_removal_pending = false;
        tracing::info!(
            rule = self.settings.host.describe(),
            "host probe rule installed"
        );
        Ok(())
    }

    /// The host rule goes with the last ambient pod.
    async fn drop_host_if_idle(&self, g: &mut Inner) {
        if !g.held().is_empty() || !g.host_installed {
            return;
        }
        // Either way the rule is no longer ours to keep: a reconcile pass must not write it
        // back for no pod, only finish its removal.
        g.host_installed = false;
        g.host_removal_pending = !self
            .remove_host_rule("last ambient pod gone: host probe rule removed")
            .await;
    }

    /// Removes the host rule and its sets (`removed` is logged if there were any); whether
    /// that finished. What could not go is said in the log, and the caller retries.
    async fn remove_host_rule(&self, removed: &'static str) -> bool {
        let host = self.settings.host;
        let failed = match blocking(move || host.remove_all()).await {
            Ok(Ok(any)) => {
                if any {
                    tracing::info!(rule = host.describe(), "{removed}");
                }
                return true;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e,
        };
        tracing::warn!(error = %failed, rule = host.describe(), "removing the host probe rule failed (its sets are emptied first, so no address is SNATed); retried on each reconcile pass");
        false
    }

    /// The pod's IPs into the host probe sets, commented with its UID; then, as Istio, the
    /// branch ENI probe rules of those routed through one (never failing the enroll).
    async fn add_probe_ips(&self, pod: &AmbientPodRef) -> Result<(), AgentError> {
        let (ips, uid, label) = (pod.ips.clone(), pod.uid.clone(), pod.label());
        let branch_eni = self.branch_eni.clone();
        self.on_host(pod, move |host, plan| {
            host.add_pod_ips(&plan, &ips, &uid)?;
            branch_eni.add(&label, &ips);
            Ok(())
        })
        .await
    }

    /// Host-rule work, off the async thread; its errors name the pod.
    async fn on_host<T: Send + 'static>(
        &self,
        pod: &AmbientPodRef,
        work: impl FnOnce(HostProbeRule, Plan) -> Result<T, redirect::RedirectError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let (plan, host) = (self.settings.host_plan.clone(), self.settings.host);
        blocking(move || work(host, plan))
            .await
            .map_err(|reason| AgentError::Worker {
                pod: pod.label(),
                reason,
            })?
            .map_err(|source| AgentError::Host {
                pod: pod.label(),
                source,
            })
    }

    /// Takes `uid`'s addresses out of the probe sets, but not one another pod holds (an address
    /// reused while the pod it came from was still enrolled: that pod's DEL was missed). Under
    /// the map's lock, so an enroll that begins meanwhile puts its addresses in after.
    async fn remove_probe_ips(&self, uid: &str, ips: &[IpAddr]) -> Result<(), String> {
        let g = self.inner.lock().await;
        let held: Vec<IpAddr> = g
            .held()
            .into_iter()
            .filter(|(u, _)| u.as_str() != uid)
            .flat_map(|(_, ips)| ips)
            .collect();
        let (kept, ips): (Vec<IpAddr>, Vec<IpAddr>) =
            ips.iter().copied().partition(|ip| held.contains(ip));
        if !kept.is_empty() {
            tracing::info!(
                uid,
                ?kept,
                "probe addresses another pod holds stay in the probe sets"
            );
        }
        if ips.is_empty() {
            return Ok(());
        }
        let (plan, host) = (self.settings.host_plan.clone(), self.settings.host);
        let branch_eni = self.branch_eni.clone();
        // The branch ENI rules go with the addresses, also when the sets' update failed.
        let remove = move || {
            let removed = host.remove_pod_ips(&plan, &ips);
            branch_eni.remove(&ips);
            removed
        };
        blocking(remove).await?.map_err(|e| e.to_string())
    }

    /// Keeps the host probe rule true while it should be there (someone may flush the node's
    /// nat table or delete our table): checks it, writes it again on drift, then makes the
    /// probe sets hold exactly the served, enrolling and kept pods' addresses: one taken out
    /// comes back, and (once startup discovery is over) one no such pod holds goes, e.g. a pod
    /// DELeted while the agent was down, whose address may go to a pod that is not ambient
    /// (Istio prunes its sets at startup). Under the map's lock, as probe-set removals are, so
    /// a released pod is never put back. Returns the differences found (empty: in sync, or no
    /// host rule is due).
    pub async fn reconcile_host(&self) -> Result<Vec<String>, AgentError> {
        let mut g = self.inner.lock().await;
        if !g.host_installed {
            if g.host_removal_pending && g.held().is_empty() {
                g.host_removal_pending = !self
                    .remove_host_rule("host probe rule removed: the last ambient pod went earlier")
                    .await;
            }
            return Ok(Vec::new());
        }
        let (held, prune) = (g.held(), g.discovered);
        let (plan, host) = (self.settings.host_plan.clone(), self.settings.host);
        let repair = move || {
            let drift = host.check(&plan)?;
            if !drift.is_empty() {
                host.ensure(&plan)?;
            }
            let pods = pod_ips(&held);
            let pruned = if prune {
                host.sync_pods_ips(&plan, &pods)?
            } else {
                host.add_pods_ips(&plan, &pods)?;
                Vec::new()
            };
            Ok::<_, redirect::RedirectError>((drift, pruned))
        };
        let (drift, pruned) = blocking(repair)
            .await
            .map_err(AgentError::HostCheck)?
            .map_err(|e| AgentError::HostCheck(e.to_string()))?;
        drop(g);
        self.log_pruned(&pruned);
        Ok(drift)
    }

    fn log_pruned(&self, pruned: &[IpAddr]) {
        if !pruned.is_empty() {
            tracing::info!(
                ?pruned,
                rule = self.settings.host.describe(),
                "addresses no served pod holds removed from the host probe sets"
            );
        }
    }

    /// Checks an enrolled pod's rules against its plan; re-applies on drift. Returns the
    /// differences found (empty: in sync).
    pub async fn reconcile(&self, uid: &str) -> Result<Vec<String>, AgentError> {
        let _pod = self.lock_pod(uid).await;
        let Some((pod, netns)) = self
            .inner
            .lock()
            .await
            .pods
            .get(uid)
            .map(|e| (e.pod.clone(), e.netns.clone()))
        else {
            return Ok(Vec::new());
        };
        let plan = self.plan_for(&pod)?;
        let backend = self.settings.backend;
        let path = fd_path(&netns);
        let check_plan = plan.clone();
        let drift = blocking(move || {
            redirect::check_until(
                &check_plan,
                Some(&path),
                backend,
                Instant::now() + LOCK_WAIT,
            )
        })
        .await
        .map_err(|reason| AgentError::Worker {
            pod: pod.label(),
            reason,
        })?
        .map_err(|source| AgentError::Rules {
            pod: pod.label(),
            source,
        })?;
        if !drift.is_empty() {
            program(&plan, &netns, backend, &pod).await?;
        }
        Ok(drift)
    }
}

/// `(UID, IPs)` pairs as the host rule takes them.
fn pod_ips(held: &[(String, Vec<IpAddr>)]) -> Vec<(&str, &[IpAddr])> {
    held.iter()
        .map(|(uid, ips)| (uid.as_str(), ips.as_slice()))
        .collect()
}

/// The pod's in-pod rules, one batch under its namespace's lock.
pub async fn program(
    plan: &Plan,
    netns: &Arc<OwnedFd>,
    backend: BackendChoice,
    pod: &AmbientPodRef,
) -> Result<(), AgentError> {
    let (plan, netns) = (plan.clone(), netns.clone());
    blocking(move || {
        let path = fd_path(&netns);
        redirect::apply_until(&plan, Some(&path), backend, Instant::now() + LOCK_WAIT)
    })
    .await
    .map_err(|reason| AgentError::Worker {
        pod: pod.label(),
        reason,
    })?
    .map(|_| ())
    .map_err(|source| AgentError::Rules {
        pod: pod.label(),
        source,
    })
}

async fn unprogram(netns: &Arc<OwnedFd>) -> Result<(), String> {
    let netns = netns.clone();
    blocking(move || {
        let path = fd_path(&netns);
        let deadline = Instant::now() + LOCK_WAIT;
        redirect::cleanup_scope_until(Some(&path), redirect::Scope::AMBIENT, deadline)
    })
    .await?
    .map_err(|e| e.to_string())
}

/// Kernel work (netlink, setns) runs off the async thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("worker task failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ZDS connection busy past the queue bound (a slow snapshot) is as temporary as no
    /// ztunnel at all: the plugin reports "try again later", not a hard failure.
    #[test]
    fn a_busy_zds_connection_is_unavailable_like_a_missing_one() {
        let ztunnel = |source| AgentError::Ztunnel {
            pod: "default/app".into(),
            source,
        };
        let socket = PathBuf::from("/var/run/ztunnel/ztunnel.sock");
        let busy = ztunnel(zds::ZdsError::Busy {
            socket: socket.clone(),
            pod: "default/app".into(),
            waited: Duration::from_secs(3),
        });
        assert!(busy.is_unavailable(), "{busy}");
        let missing = ztunnel(zds::ZdsError::NotConnected {
            socket,
            pod: "default/app".into(),
        });
        assert!(missing.is_unavailable(), "{missing}");
    }
}
