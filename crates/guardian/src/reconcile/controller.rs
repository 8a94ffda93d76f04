//! Controller mode (CONTROLLER_MODE, for clusters where the CNI chain cannot be used), as
//! Istio's pod network controller did: the reconciler programs running pods instead of the
//! plugin. Only opted-in pods (the annotation `istio-pod-network-controller/initialize: "true"`
//! on the pod or on its namespace) are programmed, on first sight; each is then annotated
//! `istio-pod-network-controller/initialized: "true"`.
//!
//! A namespace's opt-in comes from the daemon's namespace cache (one list + watch, shared with
//! the ambient agent): annotating a namespace reaches its running pods at once, without waiting
//! for a pod event.
//!
//! Inherent race: a container may send traffic before the rules exist (the pod runs before the
//! daemon sees it). The repair controller's `istio-validation` check remains the strict way.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use node_view::cache::NamespaceCache;
use std::collections::HashSet;
use std::time::Duration;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

pub const INITIALIZE: &str = "istio-pod-network-controller/initialize";
pub const INITIALIZED: &str = "istio-pod-network-controller/initialized";

fn annotated(annotations: Option<&std::collections::BTreeMap<String, String>>, key: &str) -> bool {
    annotations
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true")
}

/// Whether the pod is marked as programmed.
pub fn initialized(pod: &Pod) -> bool {
    annotated(pod.metadata.annotations.as_ref(), INITIALIZED)
}

/// The namespaces' opt-in, as the namespace cache holds them.
#[derive(Clone, Debug)]
pub struct Namespaces {
    cache: NamespaceCache,
}

impl Namespaces {
    pub fn new(cache: NamespaceCache) -> Namespaces {
        Namespaces { cache }
    }

    pub fn cache(&self) -> &NamespaceCache {
        &self.cache
    }

    /// Whether the pod is opted in: by its own annotation or by its namespace's (an unknown
    /// namespace counts as not opted in; its arrival in the cache re-evaluates its pods).
    pub fn opted_in(&self, pod: &Pod) -> bool {
        if annotated(pod.metadata.annotations.as_ref(), INITIALIZE) {
            return true;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        self.cache
            .get("", ns)
            .is_some_and(|n| annotated(n.metadata.annotations.as_ref(), INITIALIZE))
    }
}

/// Adds `initialized: "true"` to the pod (a merge patch: other annotations untouched).
/// `true` when patched.
async fn mark_initialized(client: &Client, pod: &Pod, key: &str) -> bool {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let patch = serde_json::json!({"metadata": {"annotations": {INITIALIZED: "true"}}});
    match Api::<Pod>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %key, "redirect rules in place; pod annotated {INITIALIZED}");
            true
        }
        Err(e) => {
            tracing::warn!(pod = %key, error = %e, "could not annotate the pod {INITIALIZED}; retrying at its next check");
            false
        }
    }
}

/// Annotation PATCHes waiting for the API server at most; a pod over it is marked at a later
/// check.
pub const MARKS_IN_FLIGHT: usize = 16;
/// Longest wait for one PATCH (the client's read timeout is the watch's, minutes).
pub const MARK_TIMEOUT: Duration = Duration::from_secs(10);

/// The `initialized` PATCHes in flight, written in the background so a slow or hung API server
/// never holds up the checks: at most [`MARKS_IN_FLIGHT`], one per pod, each at most
/// [`MARK_TIMEOUT`]. The reconcile loop takes their outcomes from [`Marks::finished`].
pub struct Marks {
    in_flight: HashSet<String>,
    done_tx: UnboundedSender<(String, bool)>,
    done_rx: UnboundedReceiver<(String, bool)>,
}

impl Default for Marks {
    fn default() -> Self {
        let (done_tx, done_rx) = unbounded_channel();
        Marks {
            in_flight: HashSet::new(),
            done_tx,
            done_rx,
        }
    }
}

impl Marks {
    /// Starts annotating `pod` unless its PATCH is already in flight or too many are.
    pub fn start(&mut self, client: &Client, pod: &Pod, key: &str) {
        if self.in_flight.contains(key) {
            return;
        }
        if self.in_flight.len() >= MARKS_IN_FLIGHT {
            tracing::warn!(pod = %key, pending = MARKS_IN_FLIGHT, "not annotating {INITIALIZED} yet: the API server has not answered the earlier ones; retrying at its next check");
            return;
        }
        self.in_flight.insert(key.to_string());
        let (client, pod, key, done) = (
            client.clone(),
            pod.clone(),
            key.to_string(),
            self.done_tx.clone(),
        );
        tokio::spawn(async move {
            let marked = tokio::time::timeout(MARK_TIMEOUT, mark_initialized(&client, &pod, &key))
                .await
                .unwrap_or_else(|_| {
                    tracing::warn!(pod = %key, timeout_s = MARK_TIMEOUT.as_secs(), "could not annotate the pod {INITIALIZED}: no answer from the API server; retrying at its next check");
                    false
                });
            let _ = done.send((key, marked));
        });
    }

    /// The next PATCH that finished: the pod's key and whether it was annotated.
    pub async fn finished(&mut self) -> (String, bool) {
        let (key, marked) = self
            .done_rx
            .recv()
            .await
            .expect("Marks holds a sender itself");
        self.in_flight.remove(&key);
        (key, marked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "a", "namespace": "shop",
            "annotations": annotations}}))
        .unwrap()
    }

    #[test]
    fn opt_in_by_pod_or_namespace() {
        let ns = Namespaces::new(NamespaceCache::new());
        assert!(ns.opted_in(&pod(json!({INITIALIZE: "true"}))));
        assert!(!ns.opted_in(&pod(json!({INITIALIZE: "false"}))));
        assert!(!ns.opted_in(&pod(json!({}))));
        ns.cache().apply(
            serde_json::from_value(
                json!({"metadata": {"name": "shop", "annotations": {INITIALIZE: "true"}}}),
            )
            .unwrap(),
        );
        assert!(ns.opted_in(&pod(json!({}))));
        assert!(initialized(&pod(json!({INITIALIZED: "true"}))));
        assert!(!initialized(&pod(json!({}))));
    }
}
