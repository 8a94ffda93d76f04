//! Continuous reconcile (self-healing): the daemon keeps every mesh pod's redirect rules equal
//! to its plan. Mesh pods are the node pod cache's pods the plugin programs ([`podplan`]'s
//! verdict: never host-network, excluded or non-mesh pods). Each is checked on its pod events
//! and once per `RECONCILE_INTERVAL`, spread evenly ([`tracker`]); a drift is re-applied
//! atomically ([`check`]; rules on the other backend than the node's are migrated in place),
//! logged with the pod and the drift, counted in `istio_cni_pod_rules_checks_total{result}` and
//! written as an Event on the pod. In controller mode ([`controller`]) only opted-in pods are
//! reconciled, programmed on first sight and annotated `initialized`.
//!
//! Checks run one at a time on a blocking thread (namespace work is synchronous). Pods the
//! repair controller owns (its filter matches: the plugin never ran) are left to it.
//!
//! [`podplan`]: crate::podplan

pub mod check;
pub mod controller;
pub mod ledger;
pub mod tracker;

use crate::podplan;
use crate::settings::{Node, ReconcileSettings, RepairSettings};
use check::{Outcome, Target};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use node_status::jobs::{Jobs, Stage, Stop};
use node_status::metrics::{Counters, Gauge};
use node_view::background::BackgroundWrites;
use node_view::cache::{CacheEvent, NamespaceCache, PodCache, PodEvent, Subscription};
use pod_policy::Decision;
use redirect::BackendChoice;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracker::Tracker;

/// Event source / reporting component.
pub const COMPONENT: &str = "cni-reconcile";
pub const REASON_REPAIRED: &str = "RedirectRulesRepaired";
pub const REASON_REPAIR_FAILED: &str = "RedirectRulesRepairFailed";
pub const REASON_MIGRATED: &str = "RedirectRulesMigrated";
/// Longest wait for a pod namespace's lock (an ADD or DEL in flight); a busy namespace is
/// retried later rather than holding up the other pods.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Drift lines quoted in an Event (all of them go to the log).
const EVENT_DRIFT_LINES: usize = 5;

/// What the reconciler needs from the daemon's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub interval: Duration,
    /// The node (name, /proc, backend, the plugin's policy for sidecar pods).
    pub node: Node,
    /// The repair controller's settings when it runs (its broken pods are its own).
    pub repair: Option<RepairSettings>,
    /// Controller mode: only opted-in pods, programmed on first sight and annotated.
    pub controller: Option<controller::Namespaces>,
}

impl Settings {
    /// `repair`: the repair controller's settings when it runs; `namespaces`: the daemon's
    /// namespace cache (controller mode needs it).
    pub fn new(
        reconcile: &ReconcileSettings,
        node: Node,
        repair: Option<RepairSettings>,
        namespaces: Option<&NamespaceCache>,
    ) -> Settings {
        Settings {
            interval: reconcile.interval,
            node,
            repair,
            controller: namespaces
                .filter(|_| reconcile.controller_mode)
                .map(|n| controller::Namespaces::new(n.clone())),
        }
    }

    /// `Ok(target)` when the pod's rules are ours to keep, `Err(why)` otherwise.
    pub fn eligible(&self, pod: &Pod) -> Result<Target, Ineligible> {
        if let Some(why) = pod_policy::bypass::finished(pod) {
            return Err(Ineligible::Finished(why));
        }
        if let Some(r) = &self.repair
            && crate::repair::filter::matches(r, pod)
        {
            return Err(Ineligible::RepairControllers);
        }
        if let Some(c) = &self.controller
            && !c.opted_in(pod)
        {
            return Err(Ineligible::NotOptedIn);
        }
        let config = match podplan::verdict(pod, &self.node.policy)? {
            Decision::Skip(why) => return Err(Ineligible::Skipped(why)),
            Decision::Ambient(_) => return Err(Ineligible::Ambient),
            Decision::Sidecar(pc) => pc.config,
        };
        Ok(Target {
            key: node_view::cache::key(pod),
            ip: pod_policy::bypass::pod_ip(pod)?,
            uid: pod.metadata.uid.clone(),
            config: Box::new(config),
            netns: None,
            lost: false,
        })
    }
}

/// Why a pod's rules are not the reconciler's to keep (logged when a tracked pod leaves).
#[derive(Debug, thiserror::Error)]
pub enum Ineligible {
    /// Terminating, or its phase is Succeeded or Failed (`pod_policy::bypass::finished`).
    #[error("{0}")]
    Finished(String),
    /// The repair controller's filter matches it: the plugin never ran.
    #[error("broken pod: the repair controller's")]
    RepairControllers,
    /// Controller mode, and neither the pod nor its namespace opted in.
    #[error("not opted in ({})", controller::INITIALIZE)]
    NotOptedIn,
    /// The plugin leaves it alone (`Decision::Skip`'s reason).
    #[error("{0}")]
    Skipped(String),
    #[error("{}", podplan::AMBIENT_POD)]
    Ambient,
    /// Its annotations cannot be used (naming the annotation and its value).
    #[error(transparent)]
    InvalidPod(#[from] podplan::InvalidPod),
    /// No IP yet (or one that does not parse).
    #[error(transparent)]
    NoPodIp(#[from] pod_policy::bypass::PodIpError),
}

/// Starts the reconciler on the node pod cache (subscribed now, so the first list is seen
/// whole); in controller mode also on the namespace cache. A consumer in `jobs`.
pub fn start(settings: Settings, metrics: Metrics, client: Client, pods: &PodCache, jobs: &Jobs) {
    let settings = Arc::new(settings);
    let metrics = Arc::new(metrics);
    let sources = Sources {
        events: pods.subscribe(),
        pods: pods.clone(),
        namespaces: settings.controller.as_ref().map(|c| c.cache().subscribe()),
    };
    let task = |stop| run(settings, metrics, client, sources, stop);
    jobs.spawn_graceful("reconcile", Stage::Consumer, task);
}

/// What the reconciler counts: every check's result (a family shared with the ambient agent)
/// and the pods it tracks.
pub struct Metrics {
    pub checks: Arc<Counters>,
    pub pods: Arc<Gauge>,
    /// Each pod's last check, for the node's enrollment report.
    pub ledger: ledger::Ledger,
}

/// What the reconciler follows.
pub struct Sources {
    pub events: Subscription,
    /// To re-evaluate a namespace's pods when its opt-in changes.
    pub pods: PodCache,
    /// Controller mode: namespace changes.
    pub namespaces: Option<
        tokio::sync::mpsc::UnboundedReceiver<CacheEvent<k8s_openapi::api::core::v1::Namespace>>,
    >,
}

/// Checks pods as they come due until the pod cache is gone or `stop` (between two rounds: the
/// checks due are finished, never cut short).
pub async fn run(
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    client: Client,
    sources: Sources,
    stop: Stop,
) {
    let Sources {
        events: mut pods,
        pods: cache,
        namespaces,
    } = sources;
    let mut namespaces = namespaces;
    tracing::info!(
        interval_ms = settings.interval.as_millis() as u64,
        proc_root = %settings.node.proc_root.display(),
        controller_mode = settings.controller.is_some(),
        "continuous reconcile of mesh pods' redirect rules"
    );
    let s = settings.clone();
    let mut tracker = Tracker::new(
        settings.interval,
        Box::new(move |p: &Pod| s.eligible(p)),
        Instant::now(),
    );
    if settings.controller.is_some() {
        // Controller mode programs pods the plugin never saw: at once, even from the first list.
        tracker.check_on_first_sight();
    }
    let mut marks = controller::Marks::default();
    loop {
        let wake = tracker.next_wake();
        tokio::select! {
            (key, marked) = marks.finished() => {
                if marked {
                    tracker.set_marked(&key);
                }
            }
            ev = pods.recv() => match ev {
                Some(ev) => {
                    tracker.on_event(ev);
                    while let Ok(ev) = pods.try_recv() {
                        tracker.on_event(ev);
                    }
                    metrics.pods.set(tracker.len() as u64);
                    metrics.ledger.retain(|k| tracker.is_tracked(k));
                }
                None => return,
            },
            Some(ev) = next_namespace(&mut namespaces) => {
                if let CacheEvent::Applied(ns) = ev {
                    reevaluate(&mut tracker, &cache, ns.metadata.name.as_deref().unwrap_or(""));
                    metrics.pods.set(tracker.len() as u64);
                }
            }
            _ = sleep_until(wake) => {}
            _ = stop.cancelled() => return,
        }
        // Whatever is due now, then back to the events (a due pod never waits for a batch).
        while let Some(due) = tracker.next_due(Instant::now()) {
            let checking = Instant::now();
            let (target, outcome) = check_blocking(&settings, due.target).await;
            let figures = node_status::figures::global();
            figures
                .reconcile_pass
                .observe(&["sidecar"], checking.elapsed());
            let made = !matches!(outcome, Outcome::Failed(_));
            let netns = target.netns.as_ref().map(|f| f.path.clone());
            let uid = due.pod.metadata.uid.clone();
            let now = std::time::SystemTime::now();
            metrics.ledger.record(&due.key, uid, &outcome, netns, now);
            let failures = tracker.record(&due.key, target, made, Instant::now());
            if made && settings.controller.is_some() && tracker.needs_mark(&due.key) {
                marks.start(&client, &due.pod, &due.key);
            }
            report(
                &settings,
                &metrics.checks,
                &client,
                &due.pod,
                &due.key,
                outcome,
                failures,
            )
            .await;
            if !pods.is_empty() {
                break;
            }
        }
    }
}

/// Controller mode: a namespace's opt-in changed; its pods are looked at again.
fn reevaluate(tracker: &mut Tracker, pods: &PodCache, namespace: &str) {
    for pod in pods.snapshot() {
        if pod.metadata.namespace.as_deref() == Some(namespace) {
            tracker.on_event(PodEvent::Applied(pod));
        }
    }
}

/// The next namespace event, or never (outside controller mode).
async fn next_namespace<K>(
    events: &mut Option<tokio::sync::mpsc::UnboundedReceiver<CacheEvent<K>>>,
) -> Option<CacheEvent<K>> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

async fn check_blocking(settings: &Arc<Settings>, mut target: Target) -> (Target, Outcome) {
    let s = settings.clone();
    let fallback = target.clone();
    tokio::task::spawn_blocking(move || {
        let outcome = check::run(
            &mut target,
            &s.node.proc_root,
            BackendChoice::Fixed(s.node.backend),
            LOCK_WAIT,
        );
        (target, outcome)
    })
    .await
    .unwrap_or_else(|e| (fallback, Outcome::Failed(format!("check task failed: {e}"))))
}

/// Metrics, log and Event for one outcome.
async fn report(
    settings: &Settings,
    checks: &Counters,
    client: &Client,
    pod: &Pod,
    key: &str,
    outcome: Outcome,
    failures: u32,
) {
    match outcome {
        Outcome::Ok => {
            checks.inc(&["ok"]);
            tracing::debug!(pod = %key, "redirect rules match the plan");
        }
        Outcome::Repaired { drift, backend } => {
            checks.inc(&["drift"]);
            checks.inc(&["repaired"]);
            tracing::warn!(pod = %key, drift = ?drift, backend = %backend, "redirect rules drifted from the plan; re-applied");
            let msg = format!(
                "redirect rules drifted from the plan ({}); re-applied atomically ({backend} backend)",
                summary(&drift)
            );
            emit(settings, client, pod, REASON_REPAIRED, &msg);
        }
        Outcome::Migrated { drift, from, to } => {
            checks.inc(&["drift"]);
            checks.inc(&["migrated"]);
            let from = from
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("+");
            tracing::warn!(pod = %key, drift = ?drift, from = %from, to = %to, "redirect rules on another backend than the node's; migrated in place");
            let msg = format!(
                "redirect rules were on the {from} backend, the node's is {to} ({}); migrated in place",
                summary(&drift)
            );
            emit(settings, client, pod, REASON_MIGRATED, &msg);
        }
        Outcome::RepairFailed { drift, error } => {
            checks.inc(&["drift"]);
            checks.inc(&["failed"]);
            tracing::error!(pod = %key, drift = ?drift, error = %error, "redirect rules drifted from the plan; re-applying failed");
            let msg = format!(
                "redirect rules drifted from the plan ({}); re-applying failed: {error}",
                summary(&drift)
            );
            emit(settings, client, pod, REASON_REPAIR_FAILED, &msg);
        }
        Outcome::Failed(error) => {
            checks.inc(&["failed"]);
            // The first failure of an episode is news; the retries of a pod still starting
            // (or gone from the node) are not.
            if failures <= 1 {
                tracing::warn!(pod = %key, error = %error, "could not check the redirect rules; retrying with backoff");
            } else {
                tracing::debug!(pod = %key, error = %error, failures, "could not check the redirect rules");
            }
        }
    }
}

/// `N difference(s): first; second; …` for an Event message.
pub fn summary(drift: &[String]) -> String {
    let mut s = format!(
        "{} difference{}: ",
        drift.len(),
        if drift.len() == 1 { "" } else { "s" }
    );
    s.push_str(
        &drift
            .iter()
            .take(EVENT_DRIFT_LINES)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("; "),
    );
    if drift.len() > EVENT_DRIFT_LINES {
        s.push_str("; …");
    }
    s
}

/// Events waiting for the API server: at most 16, each at most 10 s (a slow or hung API
/// server never holds up the checks; `node_view::background`).
static EVENTS: BackgroundWrites = BackgroundWrites::new("event", 16, Duration::from_secs(10));

/// Writes the Event in the background, bounded ([`EVENTS`]).
fn emit(settings: &Settings, client: &Client, pod: &Pod, reason: &str, message: &str) {
    let ev = crate::repair::event_from(COMPONENT, pod, &settings.node.name, true, reason, message);
    let (client, pod) = (client.clone(), pod.clone());
    let key = node_view::cache::key(&pod);
    EVENTS.spawn(&key, async move {
        crate::repair::post_event(&client, &pod, &ev).await
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_quotes_the_first_lines() {
        let d: Vec<String> = (1..=7).map(|i| format!("line {i}")).collect();
        let s = summary(&d);
        assert!(s.starts_with("7 differences: line 1; line 2"), "{s}");
        assert!(s.ends_with("line 5; …"), "{s}");
        assert_eq!(summary(&d[..1]), "1 difference: line 1");
    }
}
