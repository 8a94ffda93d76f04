//! Controller mode (CONTROLLER_MODE, for clusters where the CNI chain cannot be used), as
//! Istio's pod network controller did: the reconciler programs running pods instead of the
//! plugin. Only opted-in pods (the annotation `istio-pod-network-controller/initialize: "true"`
//! on the pod or on its namespace) are programmed, on first sight; each is then annotated
//! `istio-pod-network-controller/initialized: "true"`.
//!
//! Inherent race: a container may send traffic before the rules exist (the pod runs before the
//! daemon sees it). The repair controller's `istio-validation` check remains the strict way.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const INITIALIZE: &str = "istio-pod-network-controller/initialize";
pub const INITIALIZED: &str = "istio-pod-network-controller/initialized";
/// How long a namespace's opt-in is trusted before it is read again.
const NAMESPACE_TTL: Duration = Duration::from_secs(30);

fn annotated(annotations: Option<&std::collections::BTreeMap<String, String>>, key: &str) -> bool {
    annotations
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true")
}

/// Whether the pod is marked as programmed.
pub fn initialized(pod: &Pod) -> bool {
    annotated(pod.metadata.annotations.as_ref(), INITIALIZED)
}

/// The namespaces' opt-in, read through the API and cached (the pod cache holds only pods).
#[derive(Debug, Default)]
pub struct Namespaces {
    opted_in: Mutex<HashMap<String, (bool, Instant)>>,
}

impl Namespaces {
    /// Whether the pod is opted in: by its own annotation or by its namespace's (as last
    /// read by [`Namespaces::refresh`]; unknown counts as not opted in).
    pub fn opted_in(&self, pod: &Pod) -> bool {
        if annotated(pod.metadata.annotations.as_ref(), INITIALIZE) {
            return true;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        self.opted_in
            .lock()
            .unwrap()
            .get(ns)
            .is_some_and(|(v, _)| *v)
    }

    /// Reads the pod's namespace annotation unless the cached value is fresh. A failed read
    /// keeps the old value (or none) and is retried at the pod's next event.
    pub async fn refresh(&self, client: &Client, pod: &Pod) {
        if annotated(pod.metadata.annotations.as_ref(), INITIALIZE) {
            return;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let fresh = self
            .opted_in
            .lock()
            .unwrap()
            .get(&ns)
            .is_some_and(|(_, at)| at.elapsed() < NAMESPACE_TTL);
        if fresh {
            return;
        }
        match Api::<Namespace>::all(client.clone()).get_opt(&ns).await {
            Ok(got) => {
                let v = got.is_some_and(|n| annotated(n.metadata.annotations.as_ref(), INITIALIZE));
                tracing::debug!(namespace = %ns, opted_in = v, "namespace controller-mode opt-in");
                self.opted_in
                    .lock()
                    .unwrap()
                    .insert(ns, (v, Instant::now()));
            }
            Err(e) => {
                tracing::warn!(namespace = %ns, error = %e, "could not read the namespace's controller-mode opt-in");
            }
        }
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
        let ns = Namespaces::default();
        assert!(ns.opted_in(&pod(json!({INITIALIZE: "true"}))));
        assert!(!ns.opted_in(&pod(json!({INITIALIZE: "false"}))));
        assert!(!ns.opted_in(&pod(json!({}))));
        ns.opted_in
            .lock()
            .unwrap()
            .insert("shop".into(), (true, Instant::now()));
        assert!(ns.opted_in(&pod(json!({}))));
        assert!(initialized(&pod(json!({INITIALIZED: "true"}))));
        assert!(!initialized(&pod(json!({}))));
    }
}
