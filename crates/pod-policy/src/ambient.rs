//! Ambient mode: which pods ztunnel serves, and each pod's own settings. Pure; shared by the
//! plugin (ADD) and the node agent (its pod watch), so both decide the same way.

use crate::selector::{DATAPLANE_MODE_LABEL, DATAPLANE_MODE_NONE, EnablementSelector, selected};
use crate::sidecar::{go_parse_bool, keys};
use capture::{AmbientPod, PodDns, parse_interface_list};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// Pod annotations ambient reads (Istio's names).
pub mod annotations {
    /// `enabled` on pods the agent has handed to ztunnel (written by the agent).
    pub const REDIRECTION: &str = "ambient.istio.io/redirection";
    pub const REDIRECTION_ENABLED: &str = "enabled";
    pub const DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";
    pub const BYPASS_INBOUND_CAPTURE: &str = "ambient.istio.io/bypass-inbound-capture";
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AmbientDecision {
    /// ztunnel serves the pod.
    Ambient,
    /// Not an ambient pod (why).
    NotAmbient(String),
}

/// Istio's `PodRedirectionEnabled`: the selectors enroll the pod, and it is neither a sidecar
/// pod (it carries `sidecar.istio.io/status`), nor on the host network, nor labelled
/// `istio.io/dataplane-mode=none` (an explicit opt-out wins over any selector).
pub fn decide(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    selectors: &[EnablementSelector],
) -> AmbientDecision {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let not = |why: &str| AmbientDecision::NotAmbient(why.to_string());
    if labels.get(DATAPLANE_MODE_LABEL).map(String::as_str) == Some(DATAPLANE_MODE_NONE) {
        return not("the pod is labelled istio.io/dataplane-mode=none");
    }
    if !selected(selectors, labels, namespace_labels) {
        return not("no enablement selector matches the pod and its namespace");
    }
    if annotations.contains_key(keys::STATUS) {
        return not("the pod has a sidecar (sidecar.istio.io/status)");
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return not("host-network pod");
    }
    AmbientDecision::Ambient
}

/// An ambient pod annotation whose value cannot be used, named with its value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("annotation {key}: {source}")]
    Interfaces {
        key: &'static str,
        source: capture::ConfigError,
    },
}

/// The boolean annotations of [`pod_settings`]: a value that is not a boolean is ignored (the
/// annotation counts as absent), as Istio's `CheckBooleanAnnotation` does.
const BOOL_ANNOTATIONS: [&str; 2] = [
    annotations::DNS_CAPTURE,
    annotations::BYPASS_INBOUND_CAPTURE,
];

/// The pod's ambient annotations that are ignored, each with its value, in the words of
/// Istio's warning (the plugin and the agent log them).
pub fn ignored_annotations(pod: &Pod) -> Vec<String> {
    let empty = BTreeMap::new();
    let a = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    BOOL_ANNOTATIONS
        .iter()
        .filter_map(|key| {
            let v = a.get(*key)?;
            go_parse_bool(v).is_none().then(|| {
                format!(
                    "annotation {key}={v:?} found, but only boolean values are supported, ignoring"
                )
            })
        })
        .collect()
}

/// The pod's own ambient settings (Istio's `PodOverrides`) from its annotations. A boolean
/// annotation that is not a boolean is ignored, as in Istio ([`ignored_annotations`] says
/// which); an invalid interface list is an error naming the annotation and the value.
pub fn pod_settings(pod: &Pod) -> Result<AmbientPod, AnnotationError> {
    let empty = BTreeMap::new();
    let a = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let bool_of = |key: &'static str| a.get(key).and_then(|v| go_parse_bool(v));
    let dns = match bool_of(annotations::DNS_CAPTURE) {
        None => PodDns::Unset,
        Some(true) => PodDns::Enabled,
        Some(false) => PodDns::Disabled,
    };
    let ingress_mode = bool_of(annotations::BYPASS_INBOUND_CAPTURE).unwrap_or(false);
    let virtual_interfaces = match a.get(keys::REROUTE_VIRTUAL_INTERFACES) {
        Some(v) => parse_interface_list(keys::REROUTE_VIRTUAL_INTERFACES, v).map_err(|source| {
            AnnotationError::Interfaces {
                key: keys::REROUTE_VIRTUAL_INTERFACES,
                source,
            }
        })?,
        None => Vec::new(),
    };
    Ok(AmbientPod {
        dns,
        ingress_mode,
        virtual_interfaces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::default_selectors;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn ns(mode: Option<&str>) -> BTreeMap<String, String> {
        mode.map(|m| BTreeMap::from([(DATAPLANE_MODE_LABEL.to_string(), m.to_string())]))
            .unwrap_or_default()
    }

    #[test]
    fn istio_decisions() {
        let sel = default_selectors();
        let labelled = pod(json!({"metadata": {"labels": {DATAPLANE_MODE_LABEL: "ambient"}}}));
        let plain = pod(json!({"metadata": {"name": "p"}}));
        let opted_out = pod(json!({"metadata": {"labels": {DATAPLANE_MODE_LABEL: "none"}}}));
        let sidecar = pod(json!({"metadata": {"annotations": {keys::STATUS: "{}"}}}));
        let host = pod(json!({"metadata": {}, "spec": {"containers": [], "hostNetwork": true}}));
        assert_eq!(decide(&labelled, &ns(None), &sel), AmbientDecision::Ambient);
        assert_eq!(
            decide(&plain, &ns(Some("ambient")), &sel),
            AmbientDecision::Ambient
        );
        for (p, why) in [
            (&plain, "no enablement selector"),
            (&opted_out, "dataplane-mode=none"),
        ] {
            match decide(p, &ns(None), &sel) {
                AmbientDecision::NotAmbient(r) => assert!(r.contains(why), "{r}"),
                d => panic!("{d:?}"),
            }
        }
        for p in [&opted_out, &sidecar, &host] {
            assert!(matches!(
                decide(p, &ns(Some("ambient")), &sel),
                AmbientDecision::NotAmbient(_)
            ));
        }
    }

    #[test]
    fn pod_settings_from_annotations() {
        let p = pod(json!({"metadata": {"annotations": {
            annotations::DNS_CAPTURE: "false",
            annotations::BYPASS_INBOUND_CAPTURE: "true",
            keys::REROUTE_VIRTUAL_INTERFACES: "tap0,tap1",
        }}}));
        let s = pod_settings(&p).unwrap();
        assert_eq!(s.dns, PodDns::Disabled);
        assert!(s.ingress_mode);
        assert_eq!(s.virtual_interfaces, ["tap0", "tap1"]);
        assert!(ignored_annotations(&p).is_empty());
    }

    #[test]
    fn non_boolean_annotations_are_ignored_with_a_warning() {
        // Istio's CheckBooleanAnnotation: warns and treats the annotation as absent.
        let bad = pod(json!({"metadata": {"annotations": {
            annotations::DNS_CAPTURE: "maybe",
            annotations::BYPASS_INBOUND_CAPTURE: "yes",
        }}}));
        let s = pod_settings(&bad).unwrap();
        assert_eq!(s.dns, PodDns::Unset);
        assert!(!s.ingress_mode);
        let w = ignored_annotations(&bad);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains(annotations::DNS_CAPTURE) && w[0].contains("maybe"),
            "{w:?}"
        );
        assert!(w[1].contains(annotations::BYPASS_INBOUND_CAPTURE) && w[1].contains("yes"));
        let sel = default_selectors();
        let mut labelled = bad.clone();
        labelled.metadata.labels = Some(BTreeMap::from([(
            DATAPLANE_MODE_LABEL.to_string(),
            "ambient".to_string(),
        )]));
        let policy = crate::Policy {
            scope: Default::default(),
            ambient: Some(sel),
        };
        assert!(matches!(
            crate::decide(&labelled, &BTreeMap::new(), &policy),
            Ok(crate::Decision::Ambient(_))
        ));
    }
}
