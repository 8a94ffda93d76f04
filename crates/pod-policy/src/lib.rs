//! Which pods are in the mesh, and how: a Pod (and its namespace's labels) → [`Decision`]: skip
//! (with the reason), a sidecar pod's `capture::Config`, or an ambient pod's settings. Istio's
//! annotations, proxy-container reading and enablement selectors live here and nowhere else; the
//! plugin (ADD/CHECK), the node daemon (repair, reconcile, controller mode, the ambient agent) and
//! the CLI all decide through this crate, so they can never disagree on a pod. Pure: no I/O.
//!
//! - [`bypass`]: the routing before any decision (own pods, excluded namespaces, host network)
//!   and whether a pod still has a running sandbox;
//! - [`sidecar`]: Istio's sidecar checks and the annotations → istio-iptables flags mapping;
//! - [`ambient`]: Istio's `PodRedirectionEnabled` and the ambient pod annotations;
//! - [`selector`] / [`selector_text`]: Kubernetes label selectors, structured (enablement
//!   selectors) and in the API server's text grammar (repair's selectors), one matcher;
//! - [`json`]: the Pod and Namespace an API answered with, decoded strictly.

pub mod ambient;
pub mod bypass;
pub mod json;
pub mod names;
pub mod selector;
pub mod selector_text;
pub mod sidecar;

pub use bypass::Scope;
pub use selector::EnablementSelector;
pub use sidecar::PodConfig;

use capture::AmbientPod;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// Labels of a namespace (or a pod).
pub type Labels = BTreeMap<String, String>;

/// The node's mesh settings a decision depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub scope: Scope,
    /// Ambient mode's enablement selectors in force; `None`: ambient mode is off.
    pub ambient: Option<Vec<EnablementSelector>>,
}

/// What happens to a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Left alone (why).
    Skip(String),
    /// A sidecar pod: the plugin programs this config (warnings: what it tolerated).
    Sidecar(Box<PodConfig>),
    /// An ambient pod: the node agent programs it and ztunnel serves it.
    Ambient(AmbientPod),
}

/// A pod whose annotations cannot be used; the message names the annotation and its value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error(transparent)]
    Sidecar(#[from] capture::ConfigError),
    #[error("{0}")]
    Ambient(#[from] ambient::AnnotationError),
}

/// The annotation kubelet puts on a static pod's mirror in the API server.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether `pod`, as the API server serves it, is the pod a sandbox with `sandbox_uid` (CNI's
/// `K8S_POD_UID`; empty: the runtime did not say) was made for: the same UID, not a pod deleted
/// and re-created under its name since. A static pod's sandbox carries the static pod's own UID
/// (kubelet's hash of its manifest), which its mirror in the API server keeps in
/// [`MIRROR_POD_ANNOTATION`] under a UID of its own.
pub fn is_sandboxs_pod(pod: &Pod, sandbox_uid: &str) -> bool {
    let mirror_of = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_POD_ANNOTATION));
    sandbox_uid.is_empty()
        || pod.metadata.uid.as_deref() == Some(sandbox_uid)
        || mirror_of.is_some_and(|hash| hash == sandbox_uid)
}

/// The decision, in Istio's order: the pass-through routing, then (ambient mode) the
/// enablement selectors, then the sidecar checks.
pub fn decide(
    pod: &Pod,
    namespace_labels: &Labels,
    policy: &Policy,
) -> Result<Decision, PolicyError> {
    if let Some(why) = policy.scope.bypassed(pod) {
        return Ok(Decision::Skip(why));
    }
    if let Some(selectors) = &policy.ambient {
        match ambient::decide(pod, namespace_labels, selectors) {
            ambient::AmbientDecision::Ambient => {
                let settings = ambient::pod_settings(pod).map_err(PolicyError::Ambient)?;
                return Ok(Decision::Ambient(settings));
            }
            ambient::AmbientDecision::NotAmbient(_) => {}
        }
    }
    sidecar_decision(pod)
}

/// The sidecar checks alone (no routing, no ambient): what the plugin does with a pod it looked
/// up outside ambient mode.
pub fn sidecar_decision(pod: &Pod) -> Result<Decision, PolicyError> {
    Ok(sidecar::decide(pod)?)
}
