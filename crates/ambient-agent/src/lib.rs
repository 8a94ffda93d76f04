//! The ambient node agent (`AMBIENT_ENABLED=true`): finds the node's ambient pods (the plugin's
//! decision, `pod_policy::decide` in ambient mode), programs their in-pod rules and the host
//! probe rule through `redirect`, and hands their network namespaces to ztunnel over ZDS.
//!
//! Inputs: the node's pod cache (one list + watch, shared with repair and reconcile), a
//! namespace cache (their labels enroll pods), and the plugin's events on
//! `<run_dir>/pluginevent.sock` (ADD waits for the agent; DEL tells it). Startup: once both
//! caches have listed, every ambient pod already running is found through the host's /proc
//! (`node_view::running`, the running-pod discovery every job shares), its rules reconciled,
//! and it is put into the ZDS snapshot BEFORE the socket opens, so the first ztunnel to connect
//! never drops a pod; then the host probe sets are pruned to the pods found
//! (`Agent::discovered`).
//!
//! Shape: `runner` is the loop (what happens comes in as one message at a time; the step a
//! pod's change calls for is decided without I/O); [`agent`] holds the node's book and the
//! named operations on it (enroll, release, reconcile), with the kernel and ztunnel behind
//! the traits of [`agent::io`], so its orderings and failure paths are unit-tested without
//! root.

pub mod agent;
pub mod branch_eni;
pub mod plugin_server;
mod runner;
pub mod view;

pub use runner::{LocateError, StartError, start};

use agent::AmbientPodRef;
use capture::ProbeSnat;
use k8s_openapi::api::core::v1::Pod;
use node_status::State;
use node_status::jobs::Jobs;
use node_status::metrics::Counters;
use node_view::background::BackgroundWrites;
use node_view::cache::{NamespaceCache, PodCache};
use pod_policy::ambient::{AnnotationError, pod_settings};
use pod_policy::bypass::{pod_ips, terminal};
use pod_policy::{Decision, Policy, PolicyError};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Ambient mode (Istio's `AMBIENT_*` settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    /// `HOST_PROBE_SNAT_IP` / `HOST_PROBE_SNAT_IPV6`.
    pub probe_snat: ProbeSnat,
    /// The configured selectors; empty: Istio's defaults (see `effective_selectors`).
    pub selectors: Vec<pod_policy::EnablementSelector>,
    pub dns_capture: bool,
    pub ipv6: bool,
    pub reconcile_on_startup: bool,
    pub detection_retry: bool,
    pub ztunnel_socket: PathBuf,
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE` (Istio's default: on).
    pub aws_branch_eni_probe: bool,
}

impl Settings {
    pub fn disabled() -> Settings {
        Settings {
            enabled: false,
            probe_snat: ProbeSnat::default(),
            selectors: Vec::new(),
            dns_capture: true,
            ipv6: true,
            reconcile_on_startup: true,
            detection_retry: false,
            ztunnel_socket: PathBuf::from("/var/run/ztunnel/ztunnel.sock"),
            aws_branch_eni_probe: true,
        }
    }

    pub fn effective_selectors(&self) -> Vec<pod_policy::EnablementSelector> {
        if self.selectors.is_empty() {
            pod_policy::selector::default_selectors()
        } else {
            self.selectors.clone()
        }
    }
}

/// What the agent shares with the daemon's other jobs: the API client, the node's caches (the
/// caller runs them), the daemon's state, the check counters (a family shared with the
/// reconciler) and the set the agent's tasks are supervised in.
#[derive(Clone)]
pub struct JobContext {
    pub client: kube::Client,
    pub pods: PodCache,
    pub namespaces: NamespaceCache,
    pub state: Arc<State>,
    pub checks: Arc<Counters>,
    pub jobs: Jobs,
}

/// What the agent knows about the node besides its own settings.
#[derive(Clone, Debug)]
pub struct NodeContext {
    /// The plugin's policy in ambient mode (the same decision the plugin makes on ADD).
    pub policy: Policy,
    /// The host's /proc as mounted (running pods' namespaces; kubelet's uid).
    pub proc_root: PathBuf,
    /// The plugin's run dir (where `pluginevent.sock` is served).
    pub run_dir: PathBuf,
    /// The node's backend for in-pod rules and the host probe rule.
    pub backend: redirect::Backend,
    /// Each ambient pod's rules are checked this often (`None`: reconcile is off).
    pub reconcile_interval: Option<Duration>,
}

/// Whether ztunnel should serve the pod now: the plugin's decision (`pod_policy::decide`, in
/// ambient mode), and a pod whose containers are done is not. A terminating pod still is, as in
/// Istio: its containers drain their connections through the grace period. A pod the selectors
/// enroll whose ambient annotations are invalid is wanted too: enrolling it reports the
/// annotation.
pub fn wants(policy: &Policy, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
    terminal(pod).is_none()
        && matches!(
            pod_policy::decide(pod, namespace_labels, policy),
            Ok(Decision::Ambient(_)) | Err(PolicyError::Ambient(_))
        )
}

/// The pod as the agent needs it (`ips`: given by the plugin, else the pod's status). Ambient
/// annotations ignored (not booleans, as Istio ignores them) are logged as warnings.
pub fn pod_ref(pod: &Pod, ips: Vec<IpAddr>) -> Result<AmbientPodRef, AnnotationError> {
    let ips = if ips.is_empty() { pod_ips(pod) } else { ips };
    for w in pod_policy::ambient::ignored_annotations(pod) {
        tracing::warn!(
            pod = %format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            ),
            "{w}"
        );
    }
    Ok(AmbientPodRef {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        service_account: pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        ips,
        settings: pod_settings(pod)?,
    })
}

/// Removes every branch ENI probe rule the running agent added (Istio's shutdown clean-up,
/// with the host probe rule's; a rollout keeps both). Nothing when no agent runs.
pub async fn flush_branch_eni() {
    if let Some(agent) = view::AGENT.agent() {
        let probe = agent.branch_eni().clone();
        if let Err(e) = tokio::task::spawn_blocking(move || probe.flush()).await {
            tracing::warn!(error = %e, "removing the branch ENI probe rules failed");
        }
    }
}

/// Whether the pod carries the agent's mark `ambient.istio.io/redirection: enabled`.
fn marked_enabled(pod: &Pod) -> bool {
    use pod_policy::ambient::annotations::{REDIRECTION, REDIRECTION_ENABLED};
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REDIRECTION))
        .is_some_and(|v| v == REDIRECTION_ENABLED)
}

/// Marks (or unmarks) the pod `ambient.istio.io/redirection: enabled`, as Istio's agent does:
/// istiod reads it to know the pod's traffic is captured (it then sends it HBONE). Through
/// `pods/status` (what the chart's RBAC grants); in the background, best effort: the pod is
/// served either way, and its next enroll writes it again.
pub fn annotate(client: &kube::Client, pod: &Pod, enabled: bool) {
    use pod_policy::ambient::annotations::{REDIRECTION, REDIRECTION_ENABLED};
    if enabled {
        // Every enroll (the plugin's ADD, the agent's own) ends here: the pod was programmed.
        view::AGENT.stamp(pod.metadata.uid.as_deref().unwrap_or(""));
        report_ignored_annotations(client, pod);
    }
    let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
        return;
    };
    let current = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REDIRECTION))
        .map(String::as_str);
    if (current == Some(REDIRECTION_ENABLED)) == enabled {
        return;
    }
    let value = if enabled {
        serde_json::Value::from(REDIRECTION_ENABLED)
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"metadata": {"annotations": {REDIRECTION: value}}});
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
    let key = format!("{ns}/{name}");
    ANNOTATIONS.spawn(&key.clone(), async move {
        let params = kube::api::PatchParams::default();
        if let Err(e) = api
            .patch_status(&name, &params, &kube::api::Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pod = %key, error = %e, "annotating the pod failed");
        }
    });
}

/// The agent's annotation PATCHes and Events waiting for the API server: at most 64, each at
/// most 10 s (a hung API server costs a bounded number of tasks; the next enroll or release
/// writes the mark again).
static ANNOTATIONS: BackgroundWrites =
    BackgroundWrites::new("pod annotation", 64, Duration::from_secs(10));
static EVENTS: BackgroundWrites = BackgroundWrites::new("event", 16, Duration::from_secs(10));

/// The component the agent's Events name.
pub const EVENT_COMPONENT: &str = "cni-ambient-agent";

/// Istio ignores an ambient annotation that is not a boolean, with a warning: said on the pod
/// as a Warning Event too (the daemon's log has it from [`pod_ref`]). Best effort, in the
/// background.
fn report_ignored_annotations(client: &kube::Client, pod: &Pod) {
    let ignored = pod_policy::ambient::ignored_annotations(pod);
    if ignored.is_empty() {
        return;
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let message = ignored.join("; ");
    let ev = node_view::events::event_from(
        EVENT_COMPONENT,
        pod,
        &node,
        true,
        "IgnoredAnnotation",
        &message,
    );
    let (client, pod) = (client.clone(), pod.clone());
    let key = node_view::cache::key(&pod);
    EVENTS.spawn(&key, async move {
        node_view::events::post_event(&client, &pod, &ev).await
    });
}
