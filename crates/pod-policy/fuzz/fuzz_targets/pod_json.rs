//! Whatever an API answers (the API server, or the node daemon's cache): the text through the
//! decoder every consumer uses (`pod_policy::json::decode`), then the decision, sidecar and
//! ambient, with the namespace's labels taken from the same input. Errors are fine, panics are
//! not.
#![no_main]

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use pod_policy::{Labels, Policy, Scope, selector::default_selectors};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(pod) = pod_policy::json::decode::<Pod>(text, "Pod") else {
        return;
    };
    // The pod's own labels stand in for its namespace's: the selectors see both.
    let labels: Labels = pod.metadata.labels.clone().unwrap_or_default();
    let scope = Scope {
        exclude_namespaces: vec!["kube-system".into()],
        cni_namespace: "istio-system".into(),
        ..Default::default()
    };
    for ambient in [None, Some(default_selectors())] {
        let policy = Policy {
            scope: scope.clone(),
            ambient,
        };
        let _ = pod_policy::decide(&pod, &labels, &policy);
    }
});
