//! The agent's work on the host probe rule: installed with the first pod, removed with the
//! last, its sets holding exactly the addresses of the pods the agent serves, enrolls or keeps
//! (the book decides which), and kept true by each reconcile pass.

use super::book::Book;
use super::{Agent, AgentError, AmbientPodRef, Kernel, Ztunnel, blocking};
use capture::Plan;
use std::net::IpAddr;
use std::sync::Arc;

/// What the host rule's errors name when no pod is involved.
const HOST: &str = "the host probe rule";

impl<Z: Ztunnel, K: Kernel> Agent<Z, K> {
    /// Startup discovery is done: every running ambient pod found was adopted; `kept` are those
    /// whose namespace was not found (`(UID, its addresses)`), which ztunnel keeps serving.
    /// The probe sets are pruned now to the pods the agent serves or keeps (Istio's startup
    /// `pruneHostIPset`: a previous agent kept the host rule across its SIGTERM for a rollout,
    /// and pods DELeted meanwhile left their addresses), and again by each
    /// [`Agent::reconcile_host`] pass. With no such pod, the leftover host rule goes now, as it
    /// goes with the last pod.
    pub async fn discovered(&self, kept: Vec<(String, Vec<IpAddr>)>) {
        let mut g = self.book.lock().await;
        g.discovered(kept);
        if g.host_installed() {
            let (held, kernel, plan) = (g.held(), self.kernel.clone(), self.host_plan());
            let prune = move || kernel.host_sync_pods_ips(&plan, &pod_ips(&held));
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
        let removed = self
            .remove_host_rule(
                "no ambient pod on the node: the host probe rule a previous agent left removed",
            )
            .await;
        g.host_out(removed);
    }

    fn host_plan(&self) -> Plan {
        self.settings.host_plan.clone()
    }

    pub(super) async fn ensure_host(
        &self,
        g: &mut Book,
        pod: &AmbientPodRef,
    ) -> Result<(), AgentError> {
        if g.host_installed() {
            return Ok(());
        }
        self.on_host(pod, |kernel, plan| kernel.host_ensure(&plan))
            .await?;
        g.host_in();
        tracing::info!(
            rule = self.settings.host.describe(),
            "host probe rule installed"
        );
        Ok(())
    }

    /// The host rule goes with the last ambient pod.
    pub(super) async fn drop_host_if_idle(&self, g: &mut Book) {
        if !g.host_idle() {
            return;
        }
        let removed = self
            .remove_host_rule("last ambient pod gone: host probe rule removed")
            .await;
        g.host_out(removed);
    }

    /// Removes the host rule and its sets (`removed` is logged if there were any); whether
    /// that finished. What could not go is said in the log, and the caller retries.
    async fn remove_host_rule(&self, removed: &'static str) -> bool {
        let kernel = self.kernel.clone();
        let rule = self.settings.host.describe();
        let failed = match blocking(move || kernel.host_remove_all()).await {
            Ok(Ok(any)) => {
                if any {
                    tracing::info!(rule, "{removed}");
                }
                return true;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(error = %failed, rule, "removing the host probe rule failed (its sets are emptied first, so no address is SNATed); retried on each reconcile pass");
        false
    }

    /// The pod's IPs into the host probe sets, commented with its UID; then, as Istio, the
    /// branch ENI probe rules of those routed through one (never failing the enroll).
    pub(super) async fn add_probe_ips(&self, pod: &AmbientPodRef) -> Result<(), AgentError> {
        let (ips, uid, label) = (pod.ips.clone(), pod.uid.clone(), pod.label());
        let branch_eni = self.branch_eni.clone();
        self.on_host(pod, move |kernel, plan| {
            kernel.host_add_pods_ips(&plan, &[(uid.as_str(), ips.as_slice())])?;
            branch_eni.add(&label, &ips);
            Ok(())
        })
        .await
    }

    /// Host-rule work for a pod, off the async thread; its errors name the pod.
    async fn on_host<T: Send + 'static>(
        &self,
        pod: &AmbientPodRef,
        work: impl FnOnce(Arc<K>, Plan) -> Result<T, redirect::RedirectError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let (kernel, plan) = (self.kernel.clone(), self.host_plan());
        blocking(move || work(kernel, plan))
            .await
            .map_err(AgentError::worker(format!("pod {}", pod.label())))?
            .map_err(|source| AgentError::Host {
                pod: pod.label(),
                source,
            })
    }

    /// Takes `uid`'s addresses out of the probe sets, but not one another pod holds (see
    /// `Book::removable`). Under the book's lock, so an enroll that begins meanwhile puts its
    /// addresses in after.
    pub(super) async fn remove_probe_ips(
        &self,
        uid: &str,
        ips: &[IpAddr],
    ) -> Result<(), AgentError> {
        let g = self.book.lock().await;
        let (kept, ips) = g.removable(uid, ips);
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
        let (kernel, plan) = (self.kernel.clone(), self.host_plan());
        let branch_eni = self.branch_eni.clone();
        // The branch ENI rules go with the addresses, also when the sets' update failed.
        let remove = move || {
            let removed = kernel.host_remove_pod_ips(&plan, &ips);
            branch_eni.remove(&ips);
            removed
        };
        let pod = || format!("uid {uid}");
        blocking(remove)
            .await
            .map_err(AgentError::worker(pod()))?
            .map_err(|source| AgentError::Host { pod: pod(), source })
    }

    /// Keeps the host probe rule true while it should be there (someone may flush the node's
    /// nat table or delete our table): checks it, writes it again on drift, then makes the
    /// probe sets hold exactly the served, enrolling and kept pods' addresses: one taken out
    /// comes back, and (once startup discovery is over) one no such pod holds goes, e.g. a pod
    /// DELeted while the agent was down, whose address may go to a pod that is not ambient
    /// (Istio prunes its sets at startup). Under the book's lock, as probe-set removals are, so
    /// a released pod is never put back. Returns the differences found (empty: in sync, or no
    /// host rule is due).
    pub async fn reconcile_host(&self) -> Result<Vec<String>, AgentError> {
        let mut g = self.book.lock().await;
        if !g.host_installed() {
            if g.host_removal_due() {
                let removed = self
                    .remove_host_rule("host probe rule removed: the last ambient pod went earlier")
                    .await;
                g.host_out(removed);
            }
            return Ok(Vec::new());
        }
        let (held, prune) = (g.held(), g.may_prune());
        let (kernel, plan) = (self.kernel.clone(), self.host_plan());
        let repair = move || {
            let drift = kernel.host_check(&plan)?;
            if !drift.is_empty() {
                kernel.host_ensure(&plan)?;
            }
            let pods = pod_ips(&held);
            let pruned = if prune {
                kernel.host_sync_pods_ips(&plan, &pods)?
            } else {
                kernel.host_add_pods_ips(&plan, &pods)?;
                Vec::new()
            };
            Ok::<_, redirect::RedirectError>((drift, pruned))
        };
        let (drift, pruned) = blocking(repair)
            .await
            .map_err(AgentError::worker(HOST))?
            .map_err(AgentError::HostCheck)?;
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
}

/// `(UID, IPs)` pairs as the host rule takes them.
fn pod_ips(held: &[(String, Vec<IpAddr>)]) -> Vec<(&str, &[IpAddr])> {
    held.iter()
        .map(|(uid, ips)| (uid.as_str(), ips.as_slice()))
        .collect()
}
