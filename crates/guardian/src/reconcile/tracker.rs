//! Which mesh pods are reconciled and which one is checked next. Pure (no I/O): the driver
//! feeds it pod events and check outcomes, and asks what is due.
//!
//! Periodic checks are spread evenly: one pod every `interval / pods`, always the one checked
//! longest ago, so each pod is checked once per interval and a node with 250 pods does one
//! check at a time, never a burst. Pod events after the first full list (a new pod, a change)
//! are checked at once; the initial list is left to the spread. A failed check is retried
//! with backoff and never holds up other pods.

use super::Ineligible;
use super::check::Target;
use k8s_openapi::api::core::v1::Pod;
use node_view::cache::PodEvent;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Decides whether a pod is reconciled: `Ok(target)` for a mesh pod (a fresh target, no
/// namespace yet), `Err(why)` otherwise.
pub type Eligible = dyn Fn(&Pod) -> Result<Target, Ineligible> + Send + Sync;

struct Tracked {
    uid: String,
    pod: Arc<Pod>,
    target: Target,
    last: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
    /// Controller mode: the `initialized` annotation was patched (once per pod).
    marked: bool,
}

pub struct Tracker {
    interval: Duration,
    eligible: Box<Eligible>,
    pods: HashMap<String, Tracked>,
    /// Pods to check at once (events), in order, without duplicates.
    urgent: VecDeque<String>,
    next_tick: Instant,
    synced: bool,
    /// Check new pods at once even during the first list (controller mode).
    first_sight: bool,
}

/// The next check to run.
pub struct Due {
    pub key: String,
    pub pod: Arc<Pod>,
    pub target: Target,
}

impl Tracker {
    pub fn new(interval: Duration, eligible: Box<Eligible>, now: Instant) -> Tracker {
        Tracker {
            interval,
            eligible,
            pods: HashMap::new(),
            urgent: VecDeque::new(),
            next_tick: now,
            synced: false,
            first_sight: false,
        }
    }

    /// Checks every newly tracked pod at once, also those of the first list (controller
    /// mode: they may have no rules at all).
    pub fn check_on_first_sight(&mut self) {
        self.first_sight = true;
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub fn is_tracked(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    /// Time between two periodic checks with the current pod count.
    pub fn spacing(&self) -> Duration {
        self.interval / (self.pods.len().max(1) as u32)
    }

    pub fn on_event(&mut self, ev: PodEvent) {
        match ev {
            PodEvent::Applied(p) => self.applied(p),
            PodEvent::Deleted(p) => self.forget(&node_view::cache::key(p.as_ref())),
            PodEvent::Synced => self.synced = true,
        }
    }

    fn forget(&mut self, key: &str) {
        if self.pods.remove(key).is_some() {
            self.urgent.retain(|k| k != key);
            tracing::debug!(pod = %key, "no longer reconciled");
        }
    }

    fn applied(&mut self, pod: Arc<Pod>) {
        let key = node_view::cache::key(pod.as_ref());
        let target = match (self.eligible)(&pod) {
            Ok(t) => t,
            Err(why) => {
                if self.pods.contains_key(&key) {
                    tracing::debug!(pod = %key, why = %why, "leaves reconcile");
                }
                self.forget(&key);
                return;
            }
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut fresh = false;
        match self.pods.get_mut(&key) {
            Some(t)
                if t.uid == uid && t.target.ip == target.ip && t.target.config == target.config =>
            {
                // News from the API since a lost namespace (kubelet reports a recreated
                // sandbox): the pod IP may be searched for again. A relist's copy is no news.
                if t.pod.metadata.resource_version != pod.metadata.resource_version {
                    t.target.lost = false;
                }
                t.pod = pod;
            }
            _ => {
                // New, or its identity or plan inputs changed: start over.
                fresh = true;
                self.pods.insert(
                    key.clone(),
                    Tracked {
                        uid,
                        pod,
                        target,
                        last: None,
                        failures: 0,
                        retry_at: None,
                        marked: false,
                    },
                );
            }
        }
        // The initial list is left to the spread; later events are checked at once.
        if (self.synced || (fresh && self.first_sight)) && !self.urgent.contains(&key) {
            self.urgent.push_back(key);
        }
    }

    /// When something is next due (`None`: nothing tracked).
    pub fn next_wake(&self) -> Option<Instant> {
        if self.pods.is_empty() {
            return None;
        }
        if !self.urgent.is_empty() {
            return Some(Instant::now());
        }
        let retry = self.pods.values().filter_map(|t| t.retry_at).min();
        Some(retry.map_or(self.next_tick, |r| r.min(self.next_tick)))
    }

    /// The next check due at `now`: an event's pod, a due retry, else (on the periodic tick)
    /// the pod checked longest ago.
    pub fn next_due(&mut self, now: Instant) -> Option<Due> {
        while let Some(key) = self.urgent.pop_front() {
            // An event does not cut a failing pod's backoff short (a flapping pod would search
            // /proc on every update): its retry comes when due.
            let backing_off = self.pods.get(&key).and_then(|t| t.retry_at);
            if backing_off.is_some_and(|r| r > now) {
                continue;
            }
            if let Some(d) = self.due(&key) {
                return Some(d);
            }
        }
        let retry = self
            .pods
            .iter()
            .filter_map(|(k, t)| t.retry_at.filter(|r| *r <= now).map(|r| (r, k)))
            .min()
            .map(|(_, k)| k.clone());
        if let Some(key) = retry {
            return self.due(&key);
        }
        if now < self.next_tick || self.pods.is_empty() {
            return None;
        }
        self.next_tick = now + self.spacing();
        let oldest = self
            .pods
            .iter()
            .filter(|(_, t)| t.retry_at.is_none())
            .min_by_key(|(k, t)| (t.last, *k))
            .map(|(k, _)| k.clone())?;
        self.due(&oldest)
    }

    fn due(&self, key: &str) -> Option<Due> {
        let t = self.pods.get(key)?;
        Some(Due {
            key: key.to_string(),
            pod: t.pod.clone(),
            target: t.target.clone(),
        })
    }

    /// Whether `key` still needs its `initialized` annotation (controller mode): not yet
    /// patched by us, and not carried by the pod as last seen.
    pub fn needs_mark(&self, key: &str) -> bool {
        self.pods
            .get(key)
            .is_some_and(|t| !t.marked && !super::controller::initialized(&t.pod))
    }

    /// Records that `key` was annotated.
    pub fn set_marked(&mut self, key: &str) {
        if let Some(t) = self.pods.get_mut(key) {
            t.marked = true;
        }
    }

    /// Records a finished check of `key` (its target carries the namespace found). `ok`: the
    /// check was made (rules fine or repaired); else it is retried after a backoff.
    pub fn record(&mut self, key: &str, target: Target, ok: bool, now: Instant) -> u32 {
        let Some(t) = self.pods.get_mut(key) else {
            return 0;
        };
        // The pod may have changed while the check ran: keep its namespace only if the
        // check was for the same target.
        if t.target.ip == target.ip && t.target.config == target.config {
            t.target.netns = target.netns;
            t.target.lost = target.lost;
        }
        t.last = Some(now);
        if ok {
            t.failures = 0;
            t.retry_at = None;
        } else {
            t.failures += 1;
            t.retry_at = Some(now + crate::repair::retry_delay(t.failures));
        }
        t.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str, ip: &str, mesh: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "shop", "uid": uid,
                             "labels": {"mesh": mesh.to_string()}},
                "status": {"podIP": ip}
            }))
            .unwrap(),
        )
    }

    fn tracker(interval: Duration) -> Tracker {
        let eligible = |p: &Pod| -> Result<Target, Ineligible> {
            let mesh = p.metadata.labels.as_ref().unwrap()["mesh"] == "true";
            if !mesh {
                return Err(Ineligible::Skipped("not in the mesh".into()));
            }
            Ok(Target {
                key: node_view::cache::key(p),
                ip: pod_policy::bypass::pod_ip(p)?,
                uid: p.metadata.uid.clone(),
                config: Box::new(capture::Config::cni_default()),
                netns: None,
                lost: false,
            })
        };
        Tracker::new(interval, Box::new(eligible), Instant::now())
    }

    #[test]
    fn only_mesh_pods_are_tracked() {
        let mut t = tracker(Duration::from_secs(60));
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        t.on_event(PodEvent::Applied(pod("b", "u2", "10.0.0.2", false)));
        t.on_event(PodEvent::Applied(pod("c", "u3", "", true)));
        assert!(t.is_tracked("shop/a"));
        assert!(!t.is_tracked("shop/b"));
        assert!(!t.is_tracked("shop/c"), "no IP yet");
        // Leaving the mesh (or being deleted) untracks.
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", false)));
        assert!(t.is_empty());
    }

    #[test]
    fn periodic_checks_are_spread_and_round_robin() {
        let interval = Duration::from_secs(100);
        let mut t = tracker(interval);
        for i in 0..4 {
            let name = format!("p{i}");
            t.on_event(PodEvent::Applied(pod(
                &name,
                &name,
                &format!("10.0.0.{i}"),
                true,
            )));
        }
        t.on_event(PodEvent::Synced);
        assert_eq!(t.spacing(), Duration::from_secs(25));
        let mut now = Instant::now();
        let mut order = Vec::new();
        for _ in 0..8 {
            let d = t.next_due(now).expect("due on the tick");
            assert!(t.next_due(now).is_none(), "one check per tick");
            t.record(&d.key, d.target, true, now);
            order.push(d.key);
            now += t.spacing();
        }
        // Every pod once in the first four ticks, then the same order again.
        let mut first: Vec<_> = order[..4].to_vec();
        first.sort();
        assert_eq!(first, ["shop/p0", "shop/p1", "shop/p2", "shop/p3"]);
        assert_eq!(order[..4], order[4..]);
    }

    #[test]
    fn events_after_the_list_are_checked_at_once() {
        let mut t = tracker(Duration::from_secs(300));
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        t.on_event(PodEvent::Synced);
        let now = Instant::now();
        let d = t.next_due(now).unwrap();
        t.record(&d.key, d.target, true, now);
        assert!(t.next_due(now).is_none());
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        assert_eq!(t.next_due(now).unwrap().key, "shop/a");
    }

    #[test]
    fn failures_back_off_without_holding_up_others() {
        let mut t = tracker(Duration::from_millis(400));
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        t.on_event(PodEvent::Applied(pod("b", "u2", "10.0.0.2", true)));
        t.on_event(PodEvent::Synced);
        let now = Instant::now();
        let a = t.next_due(now).unwrap();
        assert_eq!(a.key, "shop/a");
        assert_eq!(t.record(&a.key, a.target, false, now), 1);
        // The next tick goes to b; a waits for its retry.
        let later = now + t.spacing();
        assert_eq!(t.next_due(later).unwrap().key, "shop/b");
        let retry = now + crate::repair::retry_delay(1);
        assert_eq!(t.next_due(retry).unwrap().key, "shop/a");
    }

    #[test]
    fn first_sight_checks_the_initial_list_at_once() {
        let mut t = tracker(Duration::from_secs(300));
        t.check_on_first_sight();
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        t.on_event(PodEvent::Applied(pod("b", "u2", "10.0.0.2", true)));
        let now = Instant::now();
        let a = t.next_due(now).unwrap();
        t.record(&a.key, a.target, true, now);
        let b = t.next_due(now).unwrap();
        t.record(&b.key, b.target, true, now);
        assert_eq!((a.key.as_str(), b.key.as_str()), ("shop/a", "shop/b"));
    }

    #[test]
    fn a_new_uid_starts_over() {
        let mut t = tracker(Duration::from_secs(60));
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        let now = Instant::now();
        let mut d = t.next_due(now).unwrap();
        d.target.netns = Some(super::super::check::Found {
            path: "/proc/1/ns/net".into(),
            id: netns::NsId { dev: 4, ino: 1 },
        });
        t.record(&d.key, d.target, true, now);
        t.on_event(PodEvent::Applied(pod("a", "u2", "10.0.0.9", true)));
        let d = t.next_due(now + Duration::from_secs(60)).unwrap();
        assert_eq!(d.target.netns, None);
        assert_eq!(d.target.ip.to_string(), "10.0.0.9");
    }

    #[test]
    fn a_lost_namespace_waits_for_news_from_the_api() {
        let mut t = tracker(Duration::from_secs(60));
        let mut p = (*pod("a", "u1", "10.0.0.1", true)).clone();
        p.metadata.resource_version = Some("1".into());
        t.on_event(PodEvent::Applied(Arc::new(p.clone())));
        let now = Instant::now();
        let mut d = t.next_due(now).unwrap();
        d.target.lost = true;
        t.record(&d.key, d.target, false, now);
        // A relist's copy (the same resourceVersion) is no news.
        t.on_event(PodEvent::Applied(Arc::new(p.clone())));
        let later = now + Duration::from_secs(600);
        let d = t.next_due(later).unwrap();
        assert!(d.target.lost);
        t.record(&d.key, d.target, false, later);
        // An update is: the pod IP may be searched for again.
        p.metadata.resource_version = Some("2".into());
        t.on_event(PodEvent::Applied(Arc::new(p)));
        let d = t.next_due(later + Duration::from_secs(600)).unwrap();
        assert!(!d.target.lost);
    }

    #[test]
    fn an_update_does_not_cut_a_failing_pods_backoff_short() {
        let mut t = tracker(Duration::from_secs(60));
        t.on_event(PodEvent::Synced);
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        let now = Instant::now();
        let d = t.next_due(now).unwrap();
        t.record(&d.key, d.target, false, now);
        // Updates while it backs off (0.5 s): not due before the retry.
        t.on_event(PodEvent::Applied(pod("a", "u1", "10.0.0.1", true)));
        assert!(t.next_due(now + Duration::from_millis(100)).is_none());
        assert!(t.next_due(now + Duration::from_millis(600)).is_some());
    }
}
