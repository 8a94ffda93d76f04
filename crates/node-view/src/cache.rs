//! The node's pod cache: ONE list + watch of the pods on this node (field selector
//! `spec.nodeName=<node>`), shared by every consumer (the repair controller today; the ambient
//! node agent and the continuous reconciler next), so the node never opens a second watch.
//!
//! Fault handling follows client-go's reflector, not kube-runtime's per-error backoff on the
//! same stream: an `ERROR` event, an undecodable line or a transport error ENDS the watch; after
//! one short jittered backoff ([`Backoff`]: 100-200 ms first, doubling, capped at [`BACKOFF_MAX`]) the cache
//! re-lists and watches again from the list's resourceVersion; `410 Gone` too (a server
//! answering every watch with it is not listed in a hot loop). A watch that the server closes
//! normally resumes from the last resourceVersion without a list. A watch still open past its
//! own `timeoutSeconds` (a hung server or a dead peer) is abandoned. From a watch's failure to
//! the next list the cache is not [`ObjectCache::is_current`], and the plugin's lookup does not
//! answer from it. A re-list emits `Deleted` for pods that vanished while the watch was down and
//! `Applied` only for pods that are new or changed (by resourceVersion).
//!
//! The mechanism is generic ([`ObjectCache`]): the ambient node agent also keeps the cluster's
//! namespaces (their labels enroll pods) in one, with the same fault handling.
//!
//! Consumers call [`PodCache::subscribe`] and receive [`PodEvent`]s on an unbounded channel of
//! their own: first the current pods (`Applied` each) and, if the cache has listed, `Synced`;
//! then every change. Nothing is dropped for a slow consumer (a node holds at most a few
//! hundred pods), and a consumer never sees a half-applied list.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Notification to a consumer.
#[derive(Clone, Debug)]
pub enum CacheEvent<K> {
    /// An object is new or changed (or is part of the replay at subscription).
    Applied(Arc<K>),
    /// An object is gone (a DELETED event, or absent from a re-list).
    Deleted(Arc<K>),
    /// The cache holds a complete list (after the first list and after every re-list).
    Synced,
}

pub type PodEvent = CacheEvent<Pod>;
pub type Subscription = mpsc::UnboundedReceiver<PodEvent>;
/// The node's pods (`spec.nodeName=<node>`).
pub type PodCache = ObjectCache<Pod>;
/// The cluster's namespaces.
pub type NamespaceCache = ObjectCache<Namespace>;

/// What the cache can hold: a Kubernetes object kube can list and watch.
pub trait Cached:
    kube::Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}
impl<K> Cached for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

pub const BACKOFF_FIRST: Duration = Duration::from_millis(200);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Server-side watch timeout (client-go picks 5-10 min; the API server closes the watch then).
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(290);
/// The longest a namespace watch runs. A namespace's labels decide whether a NEW pod is
/// ambient (from this cache, over the plugin's lookup), and a watch the API server stops
/// feeding while keeping it open is only found when it outlives its timeout: namespaces are
/// few and a resumed watch costs no list, so this bounds such a stale view to about a minute.
/// A pod decided from it is enrolled by the agent once the cache lists again (as for any pod
/// of a namespace labelled after it started).
pub const NAMESPACE_WATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// A list taking longer than this (or than the watch timeout, if shorter) is abandoned and
/// retried.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// Slack after `timeoutSeconds` before a silent watch counts as hung.
const HANG_GRACE: Duration = Duration::from_secs(2);
/// A watch that stayed up this long (or delivered an event) was healthy: the next failure
/// starts the backoff from the beginning again. Watches failing faster than this (a brownout)
/// back off exponentially up to [`BACKOFF_MAX`].
const HEALTHY: Duration = Duration::from_secs(1);

/// `namespace/name`: the cache key (`/name` for cluster-scoped objects).
pub fn key<K: kube::Resource>(obj: &K) -> String {
    let m = obj.meta();
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or("")
    )
}

fn rv<K: kube::Resource>(obj: &K) -> Option<&str> {
    obj.meta().resource_version.as_deref()
}

/// Counters for logs, tests and the README's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub lists: u64,
    pub watches: u64,
    /// Watches ended by an ERROR event, an undecodable line or a transport error.
    pub watch_errors: u64,
    /// 410 Gone (resourceVersion too old): re-listed at once.
    pub gone: u64,
    /// Watches abandoned because they stayed silent past their timeout.
    pub hangs: u64,
}

struct Inner<K> {
    pods: HashMap<String, Arc<K>>,
    synced: bool,
    /// Listed, and the watch since has not failed: what the cache holds is what the API server
    /// has told it. False from a failed, hung or expired watch until the next list.
    current: bool,
    subscribers: Vec<mpsc::UnboundedSender<CacheEvent<K>>>,
    stats: Stats,
}

impl<K> Default for Inner<K> {
    fn default() -> Self {
        Inner {
            pods: HashMap::new(),
            synced: false,
            current: false,
            subscribers: Vec::new(),
            stats: Stats::default(),
        }
    }
}

impl<K: Cached> Inner<K> {
    fn emit(&mut self, ev: CacheEvent<K>) {
        self.subscribers.retain(|s| s.send(ev.clone()).is_ok());
    }
}

/// The cache; cheap to clone (all clones share one state).
pub struct ObjectCache<K> {
    inner: Arc<Mutex<Inner<K>>>,
}

impl<K> Clone for ObjectCache<K> {
    fn clone(&self) -> Self {
        ObjectCache {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Default for ObjectCache<K> {
    fn default() -> Self {
        ObjectCache {
            inner: Arc::new(Mutex::new(Inner::default())),
        }
    }
}

impl<K: Cached> std::fmt::Debug for ObjectCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodCache")
            .field("pods", &self.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl PodCache {
    /// Lists and watches `spec.nodeName=<node>` until the task is dropped.
    pub async fn run(self, api: Api<Pod>, node: String, watch_timeout: Duration) {
        let selector = format!("spec.nodeName={node}");
        tracing::info!(field_selector = %selector, "pod cache: watching this node's pods");
        self.run_selected(api, Some(selector), watch_timeout, "pod cache")
            .await
    }
}

impl NamespaceCache {
    /// Lists and watches every namespace until the task is dropped, each watch for at most
    /// [`NAMESPACE_WATCH_TIMEOUT`].
    pub async fn run(self, api: Api<Namespace>, watch_timeout: Duration) {
        tracing::info!("namespace cache: watching namespaces");
        let timeout = watch_timeout.min(NAMESPACE_WATCH_TIMEOUT);
        self.run_selected(api, None, timeout, "namespace cache")
            .await
    }
}

impl<K: Cached> ObjectCache<K> {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new consumer: the current pods are replayed as `Applied` (then `Synced` once listed),
    /// and every later change follows, in order.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<CacheEvent<K>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut g = self.lock();
        for p in g.pods.values() {
            let _ = tx.send(CacheEvent::Applied(p.clone()));
        }
        if g.synced {
            let _ = tx.send(CacheEvent::Synced);
        }
        g.subscribers.push(tx);
        rx
    }

    /// Every pod currently known.
    pub fn snapshot(&self) -> Vec<Arc<K>> {
        self.lock().pods.values().cloned().collect()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.lock()
            .pods
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// The object at `namespace/name` that `accept`s, as soon as the cache holds one: at once
    /// when it does, else when the watch delivers it, or `None` after `wait`.
    pub async fn wait_for(
        &self,
        namespace: &str,
        name: &str,
        accept: impl Fn(&K) -> bool,
        wait: Duration,
    ) -> Option<Arc<K>> {
        if let Some(found) = self.get(namespace, name).filter(|o| accept(o)) {
            return Some(found);
        }
        let wanted = format!("{namespace}/{name}");
        let deadline = Instant::now() + wait;
        // The subscription replays what is held now: nothing applied between the get above
        // and this point is missed.
        let mut events = self.subscribe();
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(CacheEvent::Applied(o))) if key(o.as_ref()) == wanted && accept(&o) => {
                    return Some(o);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Number of pods known.
    pub fn len(&self) -> usize {
        self.lock().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_synced(&self) -> bool {
        self.lock().synced
    }

    /// Whether the cache holds what the API server last said: listed, and no watch failure
    /// since (see `Inner::current`). An answer from a cache that is not current may be stale.
    pub fn is_current(&self) -> bool {
        self.lock().current
    }

    /// A watch failed (or hung, or expired): what is held may miss changes until the next list.
    pub(crate) fn lost_track(&self) {
        self.lock().current = false;
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    /// An ADDED/MODIFIED event.
    pub fn apply(&self, pod: K) {
        let mut g = self.lock();
        let p = Arc::new(pod);
        g.pods.insert(key(p.as_ref()), p.clone());
        g.emit(CacheEvent::Applied(p));
    }

    /// A DELETED event.
    pub fn delete(&self, pod: K) {
        let mut g = self.lock();
        let k = key(&pod);
        let p = g.pods.remove(&k).unwrap_or_else(|| Arc::new(pod));
        g.emit(CacheEvent::Deleted(p));
    }

    /// A complete list: vanished pods are `Deleted`, new or changed ones `Applied`, then
    /// `Synced`; all under one lock, so a subscriber sees the list whole.
    pub fn replace(&self, pods: Vec<K>) {
        let mut g = self.lock();
        let mut fresh: HashMap<String, Arc<K>> = HashMap::with_capacity(pods.len());
        for p in pods {
            fresh.insert(key(&p), Arc::new(p));
        }
        let gone: Vec<Arc<K>> = g
            .pods
            .iter()
            .filter(|(k, old)| fresh.get(*k).is_none_or(|n| n.meta().uid != old.meta().uid))
            .map(|(_, p)| p.clone())
            .collect();
        for p in gone {
            g.emit(CacheEvent::Deleted(p));
        }
        let old = std::mem::take(&mut g.pods);
        for (k, p) in &fresh {
            let unchanged = old.get(k).is_some_and(|o| {
                o.meta().uid == p.meta().uid
                    && rv(o.as_ref()) == rv(p.as_ref())
                    && rv(p.as_ref()).is_some()
            });
            if !unchanged {
                g.emit(CacheEvent::Applied(p.clone()));
            }
        }
        g.pods = fresh;
        g.synced = true;
        g.current = true;
        g.stats.lists += 1;
        g.emit(CacheEvent::Synced);
    }

    fn count(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.lock().stats)
    }

    /// Lists and watches (with the field selector, if any) until the task is dropped; `what`
    /// names the cache in its log lines.
    async fn run_selected(
        self,
        api: Api<K>,
        selector: Option<String>,
        watch_timeout: Duration,
        what: &'static str,
    ) {
        let selector = selector.unwrap_or_default();
        let mut backoff = Backoff::default();
        let mut recovering: Option<String> = None;
        loop {
            let mut version = match self.list(&api, &selector, watch_timeout).await {
                Ok((version, n)) => {
                    match recovering.take() {
                        Some(why) => tracing::info!(objects = n, after = %why, "{what}: re-listed"),
                        None => tracing::info!(objects = n, "{what}: listed"),
                    }
                    version
                }
                Err(e) => {
                    let d = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "{what}: list failed");
                    tokio::time::sleep(d).await;
                    continue;
                }
            };
            let why = self
                .watch_until_failure(&api, &selector, &mut version, watch_timeout, &mut backoff)
                .await;
            self.lost_track();
            // Even 410 Gone waits: a server answering every watch with it would otherwise be
            // listed in a hot loop (the backoff starts at 200 ms after a healthy watch).
            let d = backoff.next_delay();
            tracing::warn!(error = %why, retry_in_ms = d.as_millis() as u64, "{what}: watch ended; re-listing");
            tokio::time::sleep(d).await;
            recovering = Some(why);
        }
    }

    /// One complete list, applied with [`PodCache::replace`]: (resourceVersion, pod count).
    async fn list(
        &self,
        api: &Api<K>,
        selector: &str,
        watch_timeout: Duration,
    ) -> Result<(String, usize), ListError> {
        let timeout = LIST_TIMEOUT.min(watch_timeout + HANG_GRACE);
        let mut lp = ListParams::default();
        if !selector.is_empty() {
            lp = lp.fields(selector);
        }
        let listed = match tokio::time::timeout(timeout, api.list(&lp)).await {
            Ok(Ok(list)) => list,
            Ok(Err(source)) => return Err(ListError::Api { source }),
            Err(_) => return Err(ListError::NoAnswer { within: timeout }),
        };
        let version = listed.metadata.resource_version.clone().unwrap_or_default();
        let n = listed.items.len();
        self.replace(listed.items);
        Ok((version, n))
    }

    /// Watches from `version`, resuming after normal closes, until a watch fails; why it did.
    async fn watch_until_failure(
        &self,
        api: &Api<K>,
        selector: &str,
        version: &mut String,
        timeout: Duration,
        backoff: &mut Backoff,
    ) -> String {
        loop {
            let started = Instant::now();
            let end = self.watch_once(api, selector, version, timeout).await;
            let healthy = |events: u64| events > 0 || started.elapsed() >= HEALTHY;
            match end {
                WatchEnd::Closed { events } if healthy(events) => backoff.reset(),
                // Closed at once with nothing: a failure, not a hot loop.
                WatchEnd::Closed { .. } => return "the watch closed at once".into(),
                WatchEnd::Gone { events } => {
                    self.count(|s| s.gone += 1);
                    if healthy(events) {
                        backoff.reset();
                    }
                    return "resourceVersion expired (410 Gone)".into();
                }
                WatchEnd::Hung => {
                    self.count(|s| s.hangs += 1);
                    backoff.reset();
                    return format!(
                        "the watch was not closed at its {} s timeout",
                        timeout.as_secs()
                    );
                }
                WatchEnd::Failed { error, events } => {
                    self.count(|s| s.watch_errors += 1);
                    if healthy(events) {
                        backoff.reset();
                    }
                    return error;
                }
            }
        }
    }

    /// One watch from `version`; returns why it ended.
    async fn watch_once(
        &self,
        api: &Api<K>,
        selector: &str,
        version: &mut String,
        timeout: Duration,
    ) -> WatchEnd {
        use futures::StreamExt;
        self.count(|s| s.watches += 1);
        let mut wp = WatchParams::default();
        if !selector.is_empty() {
            wp = wp.fields(selector);
        }
        let wp = wp.timeout(timeout.as_secs().clamp(1, 3600) as u32);
        let deadline = Instant::now() + timeout + HANG_GRACE;
        let stream = match tokio::time::timeout_at(deadline, api.watch(&wp, version)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return failure(e, 0),
            Err(_) => return WatchEnd::Hung,
        };
        futures::pin_mut!(stream);
        let mut events = 0u64;
        loop {
            let item = match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => return WatchEnd::Hung,
                Ok(None) => return WatchEnd::Closed { events },
                Ok(Some(item)) => item,
            };
            match item {
                Ok(WatchEvent::Added(p)) | Ok(WatchEvent::Modified(p)) => {
                    if let Some(v) = rv(&p) {
                        *version = v.to_string();
                    }
                    let lag = write_lag(p.meta(), std::time::SystemTime::now());
                    self.apply(p);
                    if let Some(lag) = lag {
                        let resource = K::plural(&());
                        let figures = node_status::figures::global();
                        figures.watch_lag.observe(&[resource.as_ref()], lag);
                    }
                }
                Ok(WatchEvent::Deleted(p)) => {
                    if let Some(v) = rv(&p) {
                        *version = v.to_string();
                    }
                    self.delete(p);
                }
                Ok(WatchEvent::Bookmark(b)) => *version = b.metadata.resource_version,
                Ok(WatchEvent::Error(s)) if s.code == 410 => return WatchEnd::Gone { events },
                Ok(WatchEvent::Error(s)) => {
                    return WatchEnd::Failed {
                        error: format!("ERROR event: {} ({})", s.message, s.code),
                        events,
                    };
                }
                Err(e) => return failure(e, events),
            }
            events += 1;
        }
    }
}

/// From the object's last write to `now`: its newest managedFields entry (each manager's last
/// change), else its creation. The API server's times are whole seconds, so this is rounded up
/// to within a second; a clock behind the writer's counts zero. (A deletion's timestamp is when
/// it is due, not when it was asked: never a write time.)
pub fn write_lag(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let written = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.time.as_ref())
        .chain(meta.creation_timestamp.as_ref())
        .map(|t| t.0.as_nanosecond())
        .max()?;
    let now = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128;
    let lag = u64::try_from((now - written).max(0)).unwrap_or(u64::MAX);
    Some(Duration::from_nanos(lag))
}

/// Why a list failed; retried with backoff.
#[derive(Debug, thiserror::Error)]
enum ListError {
    /// The API server's error with its whole chain of causes ([`crate::describe`]).
    #[error("{}", crate::describe(source))]
    Api { source: kube::Error },
    #[error("no answer within {} s", within.as_secs())]
    NoAnswer { within: Duration },
}

enum WatchEnd {
    Closed { events: u64 },
    Gone { events: u64 },
    Hung,
    Failed { error: String, events: u64 },
}

fn failure(e: kube::Error, events: u64) -> WatchEnd {
    match &e {
        kube::Error::Api(s) if s.code == 410 => WatchEnd::Gone { events },
        _ => WatchEnd::Failed {
            error: crate::describe(&e),
            events,
        },
    }
}

/// Exponential backoff with jitter in [d/2, d]: 100-200 ms, 200-400 ms, … capped at
/// [`BACKOFF_MAX`]; reset once a watch was healthy again.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let half = d / 2;
        half + Duration::from_nanos(r % (half.as_nanos() as u64).max(1))
    }

    pub fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

/// `istio_cni_pod_cache_*`: the node pod cache's list/watch counters and its size.
impl node_status::metrics::Metrics for PodCache {
    fn render(&self, out: &mut String) {
        let st = self.stats();
        for (name, help, v) in [
            (
                "lists_total",
                "Pod lists made by the node pod cache",
                st.lists,
            ),
            (
                "watches_total",
                "Pod watches opened by the node pod cache",
                st.watches,
            ),
            (
                "watch_errors_total",
                "Pod watches ended by an ERROR event, an undecodable line or a transport error",
                st.watch_errors,
            ),
            (
                "watch_expired_total",
                "Pod watches ended by 410 Gone",
                st.gone,
            ),
            (
                "watch_hangs_total",
                "Pod watches abandoned after staying silent past their timeout",
                st.hangs,
            ),
        ] {
            node_status::metrics::counter(out, &format!("istio_cni_pod_cache_{name}"), help, v);
        }
        node_status::metrics::gauge(
            out,
            "istio_cni_pod_cache_pods",
            "Pods of this node in the cache",
            self.len() as u64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, rv: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv}
        }))
        .unwrap()
    }

    fn drain(s: &mut Subscription) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(ev) = s.try_recv() {
            out.push(match ev {
                CacheEvent::Applied(p) => format!("+{}", key(p.as_ref())),
                CacheEvent::Deleted(p) => format!("-{}", key(p.as_ref())),
                CacheEvent::Synced => "synced".into(),
            });
        }
        out
    }

    #[test]
    fn relist_emits_deletions_and_only_changes() {
        let c = PodCache::new();
        let mut s = c.subscribe();
        c.replace(vec![pod("a", "1", "10"), pod("b", "2", "11")]);
        let mut first = drain(&mut s);
        first.sort();
        assert_eq!(first, ["+ns/a", "+ns/b", "synced"]);
        // b vanished, a unchanged, c new, then a re-created under the same name.
        c.replace(vec![pod("a", "1", "10"), pod("c", "3", "12")]);
        assert_eq!(drain(&mut s), ["-ns/b", "+ns/c", "synced"]);
        c.replace(vec![pod("a", "9", "13"), pod("c", "3", "12")]);
        assert_eq!(drain(&mut s), ["-ns/a", "+ns/a", "synced"]);
        // A late subscriber gets the current pods, then Synced.
        let mut late = c.subscribe();
        let mut got = drain(&mut late);
        got.sort();
        assert_eq!(got, ["+ns/a", "+ns/c", "synced"]);
        c.delete(pod("c", "3", "14"));
        assert_eq!(drain(&mut late), ["-ns/c"]);
        assert_eq!(c.snapshot().len(), 1);
        assert!(c.get("ns", "a").is_some() && c.is_synced());
    }

    #[test]
    fn the_lag_runs_from_the_newest_write() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "creationTimestamp": "2026-01-01T00:00:00Z",
                "managedFields": [
                    {"manager": "kubelet", "time": "2026-01-01T00:00:10Z"},
                    {"manager": "kube-scheduler", "time": "2026-01-01T00:00:02Z"},
                    {"manager": "no-time"}
                ]}
        }))
        .unwrap();
        let at = |s: u64| std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600 + s);
        assert_eq!(write_lag(&p.metadata, at(12)), Some(Duration::from_secs(2)));
        assert_eq!(
            write_lag(&p.metadata, at(5)),
            Some(Duration::ZERO),
            "clock behind"
        );
        let created: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:00:00Z"}
        }))
        .unwrap();
        assert_eq!(
            write_lag(&created.metadata, at(1)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(write_lag(&pod("c", "1", "1").metadata, at(1)), None);
        assert_eq!(<Pod as kube::Resource>::plural(&()), "pods");
        assert_eq!(<Namespace as kube::Resource>::plural(&()), "namespaces");
    }

    #[test]
    fn backoff_starts_short_and_stays_small() {
        let mut b = Backoff::default();
        let first = b.next_delay();
        assert!(
            first >= BACKOFF_FIRST / 2 && first <= BACKOFF_FIRST,
            "{first:?}"
        );
        let all: Vec<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(all.iter().all(|d| *d <= BACKOFF_MAX), "{all:?}");
        b.reset();
        assert!(b.next_delay() <= BACKOFF_FIRST);
    }
}
