//! Repair controller (Istio's `cni/pkg/repair`, istio-reference §6): pods that started before
//! the plugin was in place (node boot, a primary CNI rewriting its config) run without their
//! redirect, and their `istio-validation` init container crash-loops with exit code 126.
//!
//! The controller watches this node's pods, picks the broken ones with Istio's filter
//! ([`filter::matches`]) and, in Istio's precedence:
//! * repair: finds the pod's network namespace through the host's /proc by the pod IP
//!   (`node_view::running::locate`) and programs exactly what the plugin would (the plugin's
//!   own pod → config mapping, `pod_policy::decide`, and the node's backend);
//! * else delete the pod (UID + resourceVersion preconditions);
//! * else label it through the status subresource.
//!
//! Each outcome emits a Kubernetes Event on the pod and counts in
//! `istio_cni_repair_pods_repaired_total{type,result}`. A pod (UID) is acted on at most once;
//! failures are retried with backoff, at most [`MAX_ATTEMPTS`] times per episode.

pub mod filter;

use crate::settings::{Node, RepairAction, RepairSettings};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use node_status::jobs::{Jobs, Stage, Stop};
use node_status::metrics::Counters;
use node_view::cache::{PodEvent, Subscription};
use pod_policy::selector_text::Selector;
use redirect::BackendChoice;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Attempts per broken pod before giving up until its next change (Istio's queue: 5).
pub const MAX_ATTEMPTS: u32 = 5;
const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// Event source / reporting component (Istio's recorder name).
pub const COMPONENT: &str = "cni-repair";
pub const REASON_REPAIR: &str = "RepairBrokenPod";
pub const REASON_DELETE: &str = "DeleteBrokenPod";
pub const REASON_LABEL: &str = "LabelBrokenPod";

/// What the repair needs besides the pod: the same inputs the plugin gets from its config.
#[derive(Clone, Debug)]
pub struct Settings {
    pub repair: RepairSettings,
    /// The node (its name, /proc, backend, and the plugin's policy, whose bypass keeps this
    /// DaemonSet's own pods unrepaired).
    pub node: Node,
}

/// A finished action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    Success(String),
    Skip(String),
}

/// A failed attempt; `permanent` ones are not retried (retrying cannot change the outcome).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub permanent: bool,
}

impl Failure {
    fn retry(message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            permanent: false,
        }
    }
    fn permanent(message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            permanent: true,
        }
    }
}

/// The plugin's verdict and rules for `pod`, programmed into its namespace found under the
/// proc root ([`crate::podplan`]'s steps). Blocking (namespace threads, netlink).
pub fn repair_pod(s: &Settings, pod: &Pod) -> Result<Done, Failure> {
    use crate::podplan;
    use pod_policy::Decision;
    let pc = match podplan::verdict(pod, &s.node.policy) {
        Ok(Decision::Skip(why)) => return Ok(Done::Skip(why)),
        Ok(Decision::Ambient(_)) => return Ok(Done::Skip(podplan::AMBIENT_POD.into())),
        Ok(Decision::Sidecar(pc)) => pc,
        Err(e) => return Err(Failure::permanent(e)),
    };
    for w in &pc.warnings {
        tracing::warn!(pod = %filter::key(pod), warning = %w, "pod configuration");
    }
    let ip = pod_policy::bypass::pod_ip(pod).map_err(Failure::retry)?;
    let netns = node_view::running::locate(&s.node.proc_root, ip, pod.metadata.uid.as_deref())
        .map_err(Failure::retry)?;
    let (plan, _) = podplan::plan_in(&pc.config, &netns).map_err(Failure::retry)?;
    let d = redirect::apply(&plan, Some(&netns), BackendChoice::Fixed(s.node.backend))
        .map_err(|e| Failure::retry(format!("programming {}: {e}", netns.display())))?;
    Ok(Done::Success(format!(
        "redirect programmed in {} ({} backend)",
        netns.display(),
        d.backend
    )))
}

async fn delete_pod(client: &Client, pod: &Pod) -> Result<Done, Failure> {
    let (ns, name) = ns_name(pod);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(Done::Success("deleted".into())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Done::Skip("already gone".into())),
        Err(e) => Err(Failure::retry(format!("deleting: {e}"))),
    }
}

async fn label_pod(client: &Client, cfg: &RepairSettings, pod: &Pod) -> Result<Done, Failure> {
    let (ns, name) = ns_name(pod);
    if pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(&cfg.label_key))
    {
        return Ok(Done::Skip(format!("already labeled {}", cfg.label_key)));
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({"metadata": {"labels": {&cfg.label_key: &cfg.label_value}}});
    // pods/status may change metadata too and needs less privilege than pods (as in Istio).
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Done::Success(format!(
            "labeled {}={}",
            cfg.label_key, cfg.label_value
        ))),
        Err(e) => Err(Failure::retry(format!("labeling: {e}"))),
    }
}

fn ns_name(pod: &Pod) -> (&str, &str) {
    (
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or(""),
    )
}

/// A core/v1 Event on the pod from the repair controller (what Istio's recorder writes).
pub fn event_for(pod: &Pod, node: &str, warning: bool, reason: &str, message: &str) -> Event {
    event_from(COMPONENT, pod, node, warning, reason, message)
}

pub use node_view::events::event_from;

/// Backoff before attempt `n + 1` (n ≥ 1 failures so far).
pub fn retry_delay(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    (RETRY_BASE * 2u32.pow(exp)).min(RETRY_MAX)
}

struct Retry {
    failures: u32,
    due: Instant,
}

/// The controller's state; driven by watch events, one action at a time.
pub struct Controller {
    client: Client,
    settings: Arc<Settings>,
    /// `istio_cni_repair_pods_repaired_total{type,result}`.
    metrics: Arc<Counters>,
    action: Option<RepairAction>,
    /// Latest object per `namespace/name`.
    cache: HashMap<String, Pod>,
    /// UIDs already acted on (success, skip or a permanent failure).
    done: HashSet<String>,
    retries: HashMap<String, Retry>,
    queue: VecDeque<String>,
    labels: Selector,
    fields: Selector,
}

impl Controller {
    pub fn new(client: Client, settings: Settings, metrics: Arc<Counters>) -> Controller {
        // Validated at startup (config::repair_config); an unparsable one selects nothing.
        Controller {
            client,
            action: settings.repair.action(),
            labels: Selector::labels(&settings.repair.label_selectors)
                .unwrap_or_else(|_| Selector::nothing()),
            fields: Selector::fields(&settings.repair.field_selectors)
                .unwrap_or_else(|_| Selector::nothing()),
            settings: Arc::new(settings),
            metrics,
            cache: HashMap::new(),
            done: HashSet::new(),
            retries: HashMap::new(),
            queue: VecDeque::new(),
        }
    }

    fn wanted(&self, pod: &Pod) -> bool {
        pod.metadata.deletion_timestamp.is_none()
            && !self.done.contains(filter::uid(pod))
            && filter::matches(&self.settings.repair, pod)
    }

    fn observe(&mut self, pod: Pod) {
        let key = filter::key(&pod);
        if let Some(old) = self.cache.get(&key)
            && filter::uid(old) != filter::uid(&pod)
        {
            // Same name, new pod: the old one's bookkeeping goes.
            self.done.remove(filter::uid(old));
            self.retries.remove(&key);
        }
        let wanted = self.wanted(&pod);
        self.cache.insert(key.clone(), pod);
        // A pending retry picks up the newest object when it is due.
        if wanted && !self.retries.contains_key(&key) && !self.queue.contains(&key) {
            self.queue.push_back(key);
        }
    }

    fn forget(&mut self, key: &str) {
        if let Some(old) = self.cache.remove(key) {
            self.done.remove(filter::uid(&old));
        }
        self.retries.remove(key);
        self.queue.retain(|k| k != key);
    }

    pub fn on_event(&mut self, ev: PodEvent) {
        match ev {
            PodEvent::Applied(p) => {
                if self.selected(&p) {
                    self.observe(Pod::clone(&p));
                } else {
                    // Relabeled out of the selection: as good as gone for us.
                    self.forget(&filter::key(&p));
                }
            }
            PodEvent::Deleted(p) => self.forget(&filter::key(&p)),
            PodEvent::Synced => {}
        }
    }

    /// REPAIR_LABEL_SELECTORS / REPAIR_FIELD_SELECTORS, applied to the node's shared cache.
    fn selected(&self, pod: &Pod) -> bool {
        self.labels.matches_labels(pod.metadata.labels.as_ref())
            && self.fields.matches_pod_fields(pod)
    }

    fn next_due(&self) -> Option<Instant> {
        self.retries.values().map(|r| r.due).min()
    }

    fn promote_due(&mut self, now: Instant) {
        let mut due: Vec<(Instant, String)> = self
            .retries
            .iter()
            .filter(|(_, r)| r.due <= now)
            .map(|(k, r)| (r.due, k.clone()))
            .collect();
        due.sort();
        for (_, k) in due {
            if !self.queue.contains(&k) {
                self.queue.push_back(k);
            }
        }
    }

    /// Works the queue until it is empty.
    pub async fn drain(&mut self) {
        while let Some(key) = self.queue.pop_front() {
            self.process(&key).await;
        }
    }

    async fn process(&mut self, key: &str) {
        let Some(pod) = self.cache.get(key).cloned() else {
            self.retries.remove(key);
            return;
        };
        if !self.wanted(&pod) {
            // Recovered (or handled) since it was queued.
            self.retries.remove(key);
            return;
        }
        let Some(action) = self.action else {
            tracing::info!(pod = %key, "pod detected as broken; no repair action is enabled");
            self.done.insert(filter::uid(&pod).to_string());
            return;
        };
        let attempt = self.retries.get(key).map_or(0, |r| r.failures) + 1;
        tracing::info!(pod = %key, action = action.as_str(), attempt, "pod detected as broken");
        let result = match action {
            RepairAction::Repair => {
                let s = self.settings.clone();
                let p = pod.clone();
                tokio::task::spawn_blocking(move || repair_pod(&s, &p))
                    .await
                    .unwrap_or_else(|e| Err(Failure::retry(format!("repair task failed: {e}"))))
            }
            RepairAction::Delete => delete_pod(&self.client, &pod).await,
            RepairAction::Label => label_pod(&self.client, &self.settings.repair, &pod).await,
        };
        let reason = match action {
            RepairAction::Repair => REASON_REPAIR,
            RepairAction::Delete => REASON_DELETE,
            RepairAction::Label => REASON_LABEL,
        };
        match result {
            Ok(Done::Success(what)) => {
                self.metrics.inc(&[action.as_str(), "success"]);
                tracing::info!(pod = %key, action = action.as_str(), "{what}");
                self.retries.remove(key);
                self.done.insert(filter::uid(&pod).to_string());
                // Delete and label are Warnings in Istio; a repair in place is good news.
                let warning = action != RepairAction::Repair;
                let msg = format!("pod detected as broken, {what}");
                self.emit(&pod, warning, reason, &msg).await;
            }
            Ok(Done::Skip(why)) => {
                self.metrics.inc(&[action.as_str(), "skip"]);
                tracing::info!(pod = %key, action = action.as_str(), "pod detected as broken; skipped: {why}");
                self.retries.remove(key);
                self.done.insert(filter::uid(&pod).to_string());
            }
            Err(f) => {
                self.metrics.inc(&[action.as_str(), "fail"]);
                let give_up = f.permanent || attempt >= MAX_ATTEMPTS;
                if give_up {
                    tracing::error!(pod = %key, action = action.as_str(), attempt, error = %f.message, "pod detected as broken; giving up");
                    self.retries.remove(key);
                    if f.permanent {
                        self.done.insert(filter::uid(&pod).to_string());
                    }
                    let msg = format!(
                        "pod detected as broken, but {} failed: {}",
                        action.as_str(),
                        f.message
                    );
                    self.emit(&pod, true, reason, &msg).await;
                } else {
                    let delay = retry_delay(attempt);
                    tracing::warn!(pod = %key, action = action.as_str(), attempt, retry_in_ms = delay.as_millis() as u64, error = %f.message, "pod detected as broken; attempt failed");
                    self.retries.insert(
                        key.to_string(),
                        Retry {
                            failures: attempt,
                            due: Instant::now() + delay,
                        },
                    );
                }
            }
        }
    }

    async fn emit(&self, pod: &Pod, warning: bool, reason: &str, message: &str) {
        let ev = event_for(pod, &self.settings.node.name, warning, reason, message);
        post_event(&self.client, pod, &ev).await;
    }

    /// Acts on the node pod cache's notifications until the cache is gone or `stop` (between
    /// two rounds: a repair under way is finished, never cut short).
    pub async fn run(mut self, mut pods: Subscription, stop: Stop) {
        let r = &self.settings.repair;
        let node = &self.settings.node.name;
        tracing::info!(
            node = %node,
            field_selector = %r.field_selector(node),
            label_selector = %r.label_selectors,
            action = self.action.map_or("none", |a| a.as_str()),
            "repair controller watching pods"
        );
        loop {
            let due = self.next_due();
            tokio::select! {
                ev = pods.recv() => match ev {
                    Some(ev) => {
                        self.on_event(ev);
                        // Take everything already queued before acting (a re-list arrives whole).
                        while let Ok(ev) = pods.try_recv() {
                            self.on_event(ev);
                        }
                    }
                    None => return,
                },
                _ = sleep_until(due) => {}
                _ = stop.cancelled() => return,
            }
            self.promote_due(Instant::now());
            self.drain().await;
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Starts the controller on the node pod cache's subscription `pods`.
/// `metrics`: `istio_cni_repair_pods_repaired_total` ([`crate::metrics`]). A consumer in
/// `jobs`: stops after the watches.
pub fn start(
    settings: Settings,
    metrics: Arc<Counters>,
    client: Client,
    pods: Subscription,
    jobs: &Jobs,
) {
    let controller = Controller::new(client, settings, metrics);
    jobs.spawn_graceful("repair", Stage::Consumer, |stop| controller.run(pods, stop));
}

pub use node_view::events::post_event;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(retry_delay(1), Duration::from_millis(500));
        assert_eq!(retry_delay(2), Duration::from_secs(1));
        assert_eq!(retry_delay(4), Duration::from_secs(4));
        assert_eq!(retry_delay(100), RETRY_MAX);
    }

    #[test]
    fn event_names_the_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "7"}
        }))
        .unwrap();
        let e = event_for(&pod, "node-a", true, REASON_DELETE, "deleted");
        assert!(e.metadata.name.unwrap().starts_with("web."));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("DeleteBrokenPod"));
        assert_eq!(e.source.unwrap().host.as_deref(), Some("node-a"));
    }

    #[test]
    fn plugin_rules_decide_what_a_repair_programs() {
        let s = Settings {
            repair: RepairSettings::disabled(),
            node: Node {
                name: "node-a".into(),
                proc_root: "/host/proc".into(),
                backend: redirect::Backend::Nft,
                policy: pod_policy::Policy {
                    scope: pod_policy::Scope {
                        exclude_namespaces: vec!["kube-system".into()],
                        cni_namespace: "istio-system".into(),
                        ..Default::default()
                    },
                    ambient: None,
                },
            },
        };
        let pod = |ns: &str, name: &str, extra: serde_json::Value| -> Pod {
            let mut v = serde_json::json!({
                "metadata": {"name": name, "namespace": ns, "annotations": {"sidecar.istio.io/status": "{}"}},
                "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]},
                "status": {"podIP": "not-an-ip"}
            });
            if let Some(o) = extra.as_object() {
                for (k, val) in o {
                    v["spec"][k] = val.clone();
                }
            }
            serde_json::from_value(v).unwrap()
        };
        let skip = |p: &Pod| matches!(repair_pod(&s, p), Ok(Done::Skip(_)));
        assert!(skip(&pod(
            "default",
            "w",
            serde_json::json!({"hostNetwork": true})
        )));
        assert!(skip(&pod("kube-system", "w", serde_json::json!({}))));
        assert!(skip(&pod(
            "istio-system",
            "istio-cni-node-x",
            serde_json::json!({})
        )));
        assert!(skip(&pod(
            "default",
            "w",
            serde_json::json!({"initContainers": [{"name": "istio-init"}]})
        )));
        // A sidecar pod gets as far as its IP.
        let e = repair_pod(&s, &pod("default", "w", serde_json::json!({}))).unwrap_err();
        assert!(!e.permanent && e.message.contains("podIP"), "{e:?}");
    }
}
