//! The pass-through routing every consumer applies before deciding (Istio's plugin steps 3 and
//! 5): the istio-cni DaemonSet's own pods, ztunnel's, excluded namespaces and host-network pods
//! are never touched; and a pod with no running sandbox has nothing to keep rules in. Pure.

use k8s_openapi::api::core::v1::Pod;
use std::net::IpAddr;

/// The prefix of the istio-cni DaemonSet's pod names.
pub const SELF_POD_PREFIX: &str = "istio-cni-node-";

/// Which namespaces the plugin leaves alone (the conflist's `exclude_namespaces` and
/// `pod_namespace`; install-cni's `EXCLUDE_NAMESPACES` and `POD_NAMESPACE`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub exclude_namespaces: Vec<String>,
    /// The istio-cni DaemonSet's namespace: its own pods bypass the plugin.
    pub cni_namespace: String,
    /// Istio's `SYSTEM_NAMESPACE`, where ztunnel runs (its pods bypass); empty: the DaemonSet's
    /// namespace, where the charts put both unless told otherwise (GKE puts istio-cni in
    /// kube-system).
    pub system_namespace: String,
}

/// Istio's self-bypass: the istio-cni DaemonSet's own pods must start even while the
/// kubeconfig is missing or stale (istio#56972), so they are recognised by name alone.
pub fn is_self(pod_name: &str, pod_namespace: &str, cni_namespace: &str) -> bool {
    pod_name.starts_with(SELF_POD_PREFIX) && pod_namespace == cni_namespace
}

/// Istio's `IsZtunnelPod`: ztunnel itself (`app=ztunnel` in the system namespace, where the
/// chart puts it next to istio-cni) is never handed to ztunnel, nor given sidecar rules.
pub fn is_ztunnel(pod: &Pod, cni_namespace: &str) -> bool {
    pod.metadata.namespace.as_deref() == Some(cni_namespace)
        && pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .is_some_and(|app| app == "ztunnel")
}

impl Scope {
    /// The namespace whose `app=ztunnel` pods are ztunnel's.
    pub fn ztunnel_namespace(&self) -> &str {
        if self.system_namespace.is_empty() {
            &self.cni_namespace
        } else {
            &self.system_namespace
        }
    }

    /// What can be decided from the pod's name and namespace alone, before any lookup
    /// (the plugin's CNI_ARGS): `Some(why)` when the pod is passed through.
    pub fn by_name(&self, pod_name: &str, pod_namespace: &str) -> Option<String> {
        if is_self(pod_name, pod_namespace, &self.cni_namespace) {
            return Some("istio-cni's own pod (self-bypass)".into());
        }
        if self.exclude_namespaces.iter().any(|n| n == pod_namespace) {
            return Some(format!("namespace {pod_namespace} is excluded"));
        }
        None
    }

    /// The routing before any decision (host network, istio-cni's own pods, excluded
    /// namespaces): `Some(why)` when the plugin would pass the pod through.
    pub fn bypassed(&self, pod: &Pod) -> Option<String> {
        if host_network(pod) {
            return Some("host-network pod".into());
        }
        if is_ztunnel(pod, self.ztunnel_namespace()) {
            return Some("ztunnel's own pod".into());
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        self.by_name(name, ns)
    }
}

pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// `Some(why)` when the pod is on its way out (terminating, or its phase is Succeeded or
/// Failed): the sidecar reconciler leaves it alone, its rules go with its sandbox.
pub fn finished(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("terminating".into());
    }
    terminal(pod)
}

/// `Some(why)` when the pod's containers are done for good (phase Succeeded or Failed; Istio's
/// `CheckPodTerminal`). A terminating pod is not: its containers run through their grace
/// period, and an ambient pod stays served until then (draining connections still need
/// ztunnel).
pub fn terminal(pod: &Pod) -> Option<String> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if let Some(p @ ("Succeeded" | "Failed")) = phase {
        return Some(format!("phase {p}"));
    }
    None
}

/// The pod's primary IP as its status has it, unparsed: `status.podIP`, else the first of
/// `status.podIPs` (the API server sets both alike); `None` when neither is set. Every reader
/// of a pod's addresses (the node daemon's jobs, the CLI) goes through here.
pub fn status_ip(pod: &Pod) -> Option<&str> {
    let st = pod.status.as_ref()?;
    st.pod_ip.as_deref().filter(|s| !s.is_empty()).or_else(|| {
        let first = st.pod_ips.as_ref()?.first()?;
        Some(first.ip.as_str()).filter(|s| !s.is_empty())
    })
}

/// The pod's status has no primary IP that parses (`text`: what it has, empty when none).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod has no usable status.podIP ({text:?})")]
pub struct PodIpError {
    pub text: String,
}

/// The pod's primary IP ([`status_ip`]), parsed.
pub fn pod_ip(pod: &Pod) -> Result<IpAddr, PodIpError> {
    let text = status_ip(pod).unwrap_or("");
    text.parse().map_err(|_| PodIpError { text: text.into() })
}

/// Every IP in the pod's status: `status.podIPs` (those that parse), else the primary one
/// ([`pod_ip`]); empty when the pod has none yet.
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(pod_ip(pod).ok());
    }
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_bypass() {
        assert!(is_self(
            "istio-cni-node-abcde",
            "istio-system",
            "istio-system"
        ));
        assert!(!is_self("istio-cni-node-abcde", "default", "istio-system"));
        assert!(!is_self("web", "istio-system", "istio-system"));
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn ztunnel_is_passed_through_in_the_system_namespace_only() {
        let scope = Scope {
            cni_namespace: "istio-system".into(),
            ..Scope::default()
        };
        let zt = |ns: &str, app: &str| {
            pod(
                serde_json::json!({"metadata": {"name": "ztunnel-x", "namespace": ns,
                "labels": {"app": app}}}),
            )
        };
        assert_eq!(
            scope.bypassed(&zt("istio-system", "ztunnel")).as_deref(),
            Some("ztunnel's own pod")
        );
        assert_eq!(scope.bypassed(&zt("default", "ztunnel")), None);
        assert_eq!(scope.bypassed(&zt("istio-system", "web")), None);
        // istio-cni in kube-system (GKE), ztunnel in SYSTEM_NAMESPACE.
        let gke = Scope {
            cni_namespace: "kube-system".into(),
            system_namespace: "istio-system".into(),
            ..Scope::default()
        };
        assert!(gke.bypassed(&zt("istio-system", "ztunnel")).is_some());
        assert_eq!(gke.bypassed(&zt("kube-system", "ztunnel")), None);
    }

    #[test]
    fn a_terminating_pod_is_finished_but_not_terminal() {
        let terminating = pod(serde_json::json!({"metadata": {"name": "p",
            "deletionTimestamp": "2026-11-27T03:30:00Z"}, "status": {"phase": "Running"}}));
        assert_eq!(finished(&terminating).as_deref(), Some("terminating"));
        assert_eq!(terminal(&terminating), None);
        let done =
            pod(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Failed"}}));
        assert_eq!(terminal(&done).as_deref(), Some("phase Failed"));
        assert_eq!(finished(&done).as_deref(), Some("phase Failed"));
    }

    fn with_status(pod_ip: Option<&str>, pod_ips: &[&str]) -> Pod {
        use k8s_openapi::api::core::v1::{PodIP, PodStatus};
        Pod {
            status: Some(PodStatus {
                pod_ip: pod_ip.map(Into::into),
                pod_ips: Some(
                    pod_ips
                        .iter()
                        .map(|ip| PodIP { ip: ip.to_string() })
                        .collect(),
                )
                .filter(|v: &Vec<PodIP>| !v.is_empty()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ips_from_the_status() {
        let dual = with_status(Some("10.0.0.5"), &["10.0.0.5", "fd00::5"]);
        assert_eq!(pod_ip(&dual).unwrap().to_string(), "10.0.0.5");
        assert_eq!(pod_ips(&dual).len(), 2);
        let only_primary = with_status(Some("10.0.0.6"), &[]);
        assert_eq!(pod_ips(&only_primary), [pod_ip(&only_primary).unwrap()]);
        let none = with_status(None, &[]);
        assert_eq!(status_ip(&none), None);
        assert!(pod_ips(&none).is_empty());
        assert_eq!(
            pod_ip(&none).unwrap_err().to_string(),
            r#"pod has no usable status.podIP ("")"#
        );
        let bad = with_status(Some("x"), &[]);
        assert_eq!(
            pod_ip(&bad).unwrap_err().to_string(),
            r#"pod has no usable status.podIP ("x")"#
        );
    }
}
