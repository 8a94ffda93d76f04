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
pub async fn mark_initialized(client: &Client, pod: &Pod, key: &str) -> bool {
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
