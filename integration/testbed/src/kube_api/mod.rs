//! A local Kubernetes API server, the one fake API of the tests (the CNI plugin's own tests,
//! install-cni's daemon tests and the node harness, where the CNI plugin and the node agent
//! share it): the pod LIST and WATCH (real watch JSON events over a chunked response; a watch
//! from a resourceVersion replays the history after it, one older than the compaction point
//! gets `410 Gone`; the `spec.nodeName=<node>` field selector is honoured), GET/DELETE pod,
//! PATCH pod and pods/status, the namespace GET, LIST and WATCH, GET/PATCH node (merge patch; a
//! resourceVersion in the patch that is not the node's current one gets `409 Conflict`, as on a
//! real API server), GET daemonset and POST events, every request recorded (method, path,
//! query, content type, body). Faults for the adversarial tests: the whole server in an
//! [`ApiMode`] (hanging, slow, a forced status, garbage, a malformed pod, trailing bytes, a
//! duplicate key), a canned answer at one path ([`FakeKube::answer`]), single objects only
//! ([`FakeKube::objects_only`]), 500s for the next requests of a method, ERROR events,
//! undecodable lines, 410, hung watches, lists, GETs, PATCHes and POSTs (open, silent), reset
//! connections.

mod faults;
mod server;

pub use faults::ApiMode;

use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: String,
}

impl Req {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// An open pod watch and the node its field selector names (`None`: all pods).
struct Watcher {
    stream: TcpStream,
    node: Option<String>,
    /// When the server ends it, as an API server does at the request's `timeoutSeconds`.
    ends: Option<Instant>,
}

impl Watcher {
    fn wants(&self, node: Option<&str>) -> bool {
        node_selected(self.node.as_deref(), node)
    }
}

/// Whether a pod on `node` matches a selector for node `want` (`None`: no selector). A pod
/// without `spec.nodeName` matches every selector (the daemon tests' pods predate the
/// selector); one on another node does not.
fn node_selected(want: Option<&str>, node: Option<&str>) -> bool {
    match (want, node) {
        (Some(want), Some(node)) => want == node,
        _ => true,
    }
}

/// One recorded change: resourceVersion, the watch line, the pod's node (pods only).
type Change = (u64, String, Option<String>);

#[derive(Default)]
struct Inner {
    pods: Mutex<Vec<Value>>,
    requests: Mutex<Vec<Req>>,
    watchers: Mutex<Vec<Watcher>>,
    /// Connections that were hung (watches, lists, pod GETs): kept open, never written to.
    hung: Mutex<Vec<TcpStream>>,
    /// Every change, for watches resuming from a version.
    history: Mutex<Vec<Change>>,
    /// The namespace watches (each with when it ends) and changes; `hang_namespace_watches`
    /// is their one fault.
    ns_watchers: Mutex<Vec<(TcpStream, Option<Instant>)>>,
    ns_history: Mutex<Vec<Change>>,
    /// History before this version is compacted: a watch from an older one gets 410.
    compacted: AtomicU64,
    rv: AtomicU64,
    /// How many more pod WATCH requests get an ERROR event at once (an API brownout).
    failing_watches: AtomicU64,
    /// How many more pod WATCH requests get `410 Gone` at once (a server whose window has
    /// moved past every version it lists).
    expiring_watches: AtomicU64,
    /// How many more pod LIST requests are accepted and never answered.
    hang_lists: AtomicU64,
    /// How many more single-pod GETs are accepted and never answered.
    hang_pod_gets: AtomicU64,
    /// How many more Event POSTs are read and never answered.
    hang_event_posts: AtomicU64,
    /// How many more pod annotation PATCHes are read and never answered.
    hang_pod_patches: AtomicU64,
    /// Method → how many more requests of it get a 500.
    fail: Mutex<HashMap<String, u32>>,
    /// Nodes by name.
    nodes: Mutex<HashMap<String, Value>>,
    /// How many more node GETs are followed by a concurrent change of the node (another
    /// writer), so the PATCH that follows carries a stale resourceVersion.
    race_node_gets: AtomicU64,
    /// Namespaces by name.
    namespaces: Mutex<std::collections::BTreeMap<String, Value>>,
    /// DaemonSets by `namespace/name` (install-cni's safe upgrade GETs its own).
    daemonsets: Mutex<HashMap<String, Value>>,
    /// How every request is answered (`FakeKube::set_mode`).
    mode: Mutex<ApiMode>,
    /// Only GETs of one object are served (`FakeKube::objects_only`).
    objects_only: AtomicBool,
    /// Path → the status line and body its GET is answered with, whatever is stored there.
    canned: Mutex<HashMap<String, (String, Value)>>,
}

/// A handle on the server; clones share it, and the last one dropped closes its listener.
#[derive(Clone)]
pub struct FakeKube {
    pub port: u16,
    inner: Arc<Inner>,
    _listening: Arc<Listening>,
}

/// A clone of the server's listener: dropping it shuts the listener down, so the blocked
/// accept() fails (EINVAL) and the accept loop ends, and the socket no longer holds the
/// namespace it was bound in.
struct Listening(TcpListener);

impl Drop for Listening {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: shutdown(2) on a socket fd this value owns.
        unsafe { libc::shutdown(self.0.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl FakeKube {
    /// Serves on 127.0.0.1 in the calling thread's network namespace.
    pub fn start() -> FakeKube {
        Self::serve_on(TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// Serves on 127.0.0.1 inside `ns` (a socket belongs to the namespace it was created in,
    /// so it is reachable where the daemon and the plugin run).
    pub fn start_in(ns: &crate::TestNetns) -> std::io::Result<FakeKube> {
        let listener = ns.run(|| TcpListener::bind("127.0.0.1:0"))??;
        Ok(Self::serve_on(listener))
    }

    fn serve_on(listener: TcpListener) -> FakeKube {
        let port = listener.local_addr().unwrap().port();
        let listening = Arc::new(Listening(listener.try_clone().unwrap()));
        let inner = Arc::new(Inner {
            rv: AtomicU64::new(100),
            ..Default::default()
        });
        let i2 = inner.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { break };
                let i = i2.clone();
                std::thread::spawn(move || server::serve(conn, &i));
            }
        });
        let weak = Arc::downgrade(&inner);
        std::thread::spawn(move || {
            while let Some(inner) = weak.upgrade() {
                end_timed_out_watches(&inner);
                drop(inner);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        FakeKube {
            port,
            inner,
            _listening: listening,
        }
    }

    /// A kubeconfig pointing at this server (plain HTTP, a dummy token).
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let p = dir.join("repair-kubeconfig");
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\nusers:\n- name: u\n  user:\n    token: test-token\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\ncurrent-context: c\n",
                self.port
            ),
        )
        .unwrap();
        p
    }

    fn next_rv(&self) -> String {
        self.inner.rv.fetch_add(1, Ordering::SeqCst).to_string()
    }

    /// Records the change and sends it to every open watch (under the watchers lock, so a
    /// watch being opened sees it either in its replay or live, never twice or not at all).
    fn push(&self, kind: &str, pod: &Value) {
        push(&self.inner, kind, pod)
    }

    /// Stores namespace `name` with these annotations (ADDED, or MODIFIED when it exists).
    pub fn put_namespace(&self, name: &str, annotations: Value) {
        self.put_namespace_meta(name, json!({}), annotations);
    }

    /// Stores namespace `name` with these labels and annotations (ADDED, or MODIFIED when it
    /// exists), and sends the change to the namespace watches.
    pub fn put_namespace_meta(&self, name: &str, labels: Value, annotations: Value) {
        let rv = self.next_rv();
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": name, "uid": format!("uid-ns-{name}"),
                                     "resourceVersion": rv,
                                     "labels": labels, "annotations": annotations},
                        "status": {"phase": "Active"}});
        let old = self
            .inner
            .namespaces
            .lock()
            .unwrap()
            .insert(name.to_string(), ns.clone());
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        let line = format!("{}\n", json!({"type": kind, "object": ns}));
        let mut ws = self.inner.ns_watchers.lock().unwrap();
        self.inner
            .ns_history
            .lock()
            .unwrap()
            .push((rv.parse().unwrap_or(0), line.clone(), None));
        ws.retain_mut(|(s, _)| s.write_all(chunked(&line).as_bytes()).is_ok());
    }

    /// Serves the DaemonSet `namespace/name` (a rollout: on SIGTERM the daemon keeps the
    /// plugin and the host probe rule for the next one); without it the GET is a 404.
    pub fn put_daemonset(&self, namespace: &str, name: &str) {
        let ds = json!({"kind": "DaemonSet", "apiVersion": "apps/v1",
            "metadata": {"name": name, "namespace": namespace, "uid": "ds-uid"},
            "spec": {"selector": {}, "template": {}}});
        let key = format!("{namespace}/{name}");
        self.inner.daemonsets.lock().unwrap().insert(key, ds);
        self.uncan(format!(
            "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        ));
    }

    /// Serves `ds` (a DaemonSet's JSON: its pod template's nodeSelector and affinity are what
    /// install-cni's shutdown checks) at its `metadata.namespace/name`.
    pub fn put_daemonset_json(&self, ds: Value) {
        let m = &ds["metadata"];
        let key = format!(
            "{}/{}",
            m["namespace"].as_str().unwrap_or(""),
            m["name"].as_str().unwrap_or("")
        );
        self.inner.daemonsets.lock().unwrap().insert(key, ds);
    }

    /// Marks the DaemonSet `namespace/name` as being deleted (a `deletionTimestamp`, as while
    /// `helm uninstall` deletes it).
    pub fn daemonset_deleting(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        if let Some(ds) = self.inner.daemonsets.lock().unwrap().get_mut(&key) {
            ds["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
    }

    /// Removes the DaemonSet `namespace/name` (its GET is a 404 from then on).
    pub fn remove_daemonset(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.inner.daemonsets.lock().unwrap().remove(&key);
        self.uncan(format!(
            "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        ));
    }

    /// The DaemonSet `namespace/name` answers 403 Forbidden, as the API server does once `helm
    /// uninstall` deleted the ServiceAccount (or RBAC grants no `get` on it).
    pub fn forbid_daemonset(&self, namespace: &str, name: &str) {
        let message = format!(
            "daemonsets.apps \"{name}\" is forbidden: User \"system:serviceaccount:{namespace}:istio-cni\" cannot get resource \"daemonsets\" in API group \"apps\" in the namespace \"{namespace}\""
        );
        self.answer(
            &format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"),
            "403 Forbidden",
            status(403, "Forbidden", &message),
        );
    }

    /// GETs of `path` are answered with `status_line` (e.g. `200 OK`) and `body` as they are,
    /// whatever is stored there (a pod naming another pod, a refusal), until a pod or a
    /// DaemonSet is put at that path.
    pub fn answer(&self, path: &str, status_line: &str, body: Value) {
        let answer = (status_line.to_string(), body);
        self.inner
            .canned
            .lock()
            .unwrap()
            .insert(path.into(), answer);
    }

    /// Ends the canned answer at `path`, if any.
    fn uncan(&self, path: String) {
        self.inner.canned.lock().unwrap().remove(&path);
    }

    /// Every request from now on is answered as `mode` says ([`ApiMode::Up`]: as usual).
    pub fn set_mode(&self, mode: ApiMode) {
        *self.inner.mode.lock().unwrap() = mode;
    }

    /// From now on only GETs of one object (a pod, a DaemonSet, a canned answer) are served;
    /// lists, watches, namespaces, nodes and events get a 404. A node's install-cni then
    /// never lists its pods, so the plugin asks the API server itself.
    pub fn objects_only(&self) {
        self.inner.objects_only.store(true, Ordering::SeqCst);
    }

    /// Serves `node` (a Node's JSON) at its `metadata.name`, replacing the one there.
    pub fn put_node_json(&self, node: Value) {
        let name = node["metadata"]["name"].as_str().unwrap_or("").to_string();
        self.inner.nodes.lock().unwrap().insert(name, node);
    }

    /// Removes node `name` (its GET is a 404 from then on).
    pub fn remove_node(&self, name: &str) {
        self.inner.nodes.lock().unwrap().remove(name);
    }

    /// Namespace watch requests seen so far.
    pub fn namespace_watch_requests(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/namespaces" && r.query.contains("watch=true"))
            .count()
    }

    /// The stored pod `namespace/name` (with the patches applied to it).
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        server::find(&self.inner, ns, name)
    }

    /// Sends a raw line (not recorded) to every open watch.
    pub fn send_raw(&self, line: &str) {
        let line = format!("{line}\n");
        let mut ws = self.inner.watchers.lock().unwrap();
        ws.retain_mut(|w| w.stream.write_all(chunked(&line).as_bytes()).is_ok());
    }

    /// `bytes` of `x` without a newline to every open pod watch, a MiB per chunk (a server that
    /// never ends a line); stops at a watch that is closed. How many bytes were taken.
    pub fn send_unterminated(&self, bytes: usize) -> usize {
        let chunk = chunked(&"x".repeat(1 << 20));
        let mut ws = self.inner.watchers.lock().unwrap();
        let mut sent = 0;
        while sent < bytes {
            ws.retain_mut(|w| w.stream.write_all(chunk.as_bytes()).is_ok());
            if ws.is_empty() {
                break;
            }
            sent += 1 << 20;
        }
        sent
    }

    /// An ERROR watch event with a Status (e.g. 500 "etcdserver: request timed out").
    pub fn send_error(&self, code: u16, reason: &str, message: &str) {
        self.send_raw(
            &json!({"type": "ERROR", "object": status(code, reason, message)}).to_string(),
        );
    }

    /// Compacts the history (watches from any current version now get 410) and sends the
    /// 410 ERROR event to every open watch, as an API server does when its window moves on.
    pub fn expire(&self) {
        self.inner
            .compacted
            .store(self.inner.rv.load(Ordering::SeqCst) - 1, Ordering::SeqCst);
        self.send_error(410, "Expired", "too old resource version");
    }

    /// Every open watch stops receiving anything (connection kept open, as a hung server).
    pub fn hang_watches(&self) {
        let mut ws = self.inner.watchers.lock().unwrap();
        let mut hung = self.inner.hung.lock().unwrap();
        hung.extend(ws.drain(..).map(|w| w.stream));
    }

    /// Every open namespace watch stops receiving anything and is not ended at its timeout
    /// (connection kept open, as a server that stopped feeding it).
    pub fn hang_namespace_watches(&self) {
        let mut ws = self.inner.ns_watchers.lock().unwrap();
        let mut hung = self.inner.hung.lock().unwrap();
        hung.extend(ws.drain(..).map(|(s, _)| s));
    }

    /// The next `n` pod WATCHes get `500 etcdserver: request timed out` as their first event.
    pub fn fail_next_watches(&self, n: u64) {
        self.inner.failing_watches.store(n, Ordering::SeqCst);
    }

    /// The next `n` pod WATCHes get `410 Gone` as their first event, whatever their version.
    pub fn expire_next_watches(&self, n: u64) {
        self.inner.expiring_watches.store(n, Ordering::SeqCst);
    }

    /// The next `n` pod LISTs are read and never answered (connection kept open).
    pub fn hang_next_lists(&self, n: u64) {
        self.inner.hang_lists.store(n, Ordering::SeqCst);
    }

    /// The next `n` GETs of one pod are read and never answered (connection kept open).
    pub fn hang_next_pod_gets(&self, n: u64) {
        self.inner.hang_pod_gets.store(n, Ordering::SeqCst);
    }

    /// The next `n` Event POSTs are read (and recorded) and never answered.
    pub fn hang_next_event_posts(&self, n: u64) {
        self.inner.hang_event_posts.store(n, Ordering::SeqCst);
    }

    /// The next `n` PATCHes of a pod's annotations are read (not applied) and never answered.
    pub fn hang_next_pod_patches(&self, n: u64) {
        self.inner.hang_pod_patches.store(n, Ordering::SeqCst);
    }

    /// Every open watch connection is cut mid-stream (no terminating chunk).
    pub fn reset_watches(&self) {
        let mut ws = self.inner.watchers.lock().unwrap();
        for w in ws.drain(..) {
            let _ = w.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Watch requests seen so far.
    pub fn watch_requests(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && r.query.contains("watch=true"))
            .count()
    }

    /// List requests seen so far.
    pub fn list_requests(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
            .count()
    }

    /// Removes the pod with `uid` (not listed any more) and sends DELETED.
    pub fn delete(&self, uid: &str) {
        let mut pods = self.inner.pods.lock().unwrap();
        let Some(i) = pods.iter().position(|p| p["metadata"]["uid"] == uid) else {
            return;
        };
        let mut pod = pods.remove(i);
        drop(pods);
        pod["metadata"]["resourceVersion"] = self.next_rv().into();
        self.push("DELETED", &pod);
    }

    /// Stores `pod` as `namespace/name` (its metadata's name and namespace set so): ADDED, or
    /// MODIFIED in place of the pod stored under that name.
    pub fn put(&self, namespace: &str, name: &str, mut pod: Value) -> Value {
        pod["metadata"]["name"] = name.into();
        pod["metadata"]["namespace"] = namespace.into();
        pod["metadata"]["resourceVersion"] = self.next_rv().into();
        self.uncan(format!("/api/v1/namespaces/{namespace}/pods/{name}"));
        let mut pods = self.inner.pods.lock().unwrap();
        let named =
            |p: &Value| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name;
        let kind = match pods.iter_mut().find(|p| named(p)) {
            Some(stored) => {
                *stored = pod.clone();
                "MODIFIED"
            }
            None => {
                pods.push(pod.clone());
                "ADDED"
            }
        };
        drop(pods);
        self.push(kind, &pod);
        pod
    }

    /// Stores `pod` (listed from now on) and sends ADDED to every open watch.
    pub fn add(&self, mut pod: Value) -> Value {
        pod["metadata"]["resourceVersion"] = self.next_rv().into();
        self.inner.pods.lock().unwrap().push(pod.clone());
        self.push("ADDED", &pod);
        pod
    }

    /// Sends MODIFIED for `pod` (new resourceVersion).
    pub fn modify(&self, mut pod: Value) -> Value {
        pod["metadata"]["resourceVersion"] = self.next_rv().into();
        let mut pods = self.inner.pods.lock().unwrap();
        pods.retain(|p| p["metadata"]["uid"] != pod["metadata"]["uid"]);
        pods.push(pod.clone());
        drop(pods);
        self.push("MODIFIED", &pod);
        pod
    }

    /// As kubelet reports a pod's progress: `phase` and, when `ips` is not empty, `podIP` and
    /// `podIPs` on the stored pod `ns/name` (a MODIFIED event). Returns false if there is no
    /// such pod.
    /// In one step under the store's lock, as a real API server applies a status update: a
    /// write in between (the agent's annotation PATCH) is kept, not overwritten by a stale copy.
    pub fn set_status(&self, ns: &str, name: &str, phase: &str, ips: &[std::net::IpAddr]) -> bool {
        let pod = {
            let mut pods = self.inner.pods.lock().unwrap();
            let Some(p) = pods
                .iter_mut()
                .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
            else {
                return false;
            };
            with_status(p, phase, ips);
            p["metadata"]["resourceVersion"] = self.next_rv().into();
            p.clone()
        };
        self.push("MODIFIED", &pod);
        true
    }

    pub fn watchers(&self) -> usize {
        self.inner.watchers.lock().unwrap().len()
    }

    pub fn requests(&self) -> Vec<Req> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Requests other than the pod list/watch.
    pub fn actions(&self) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| !(r.method == "GET" && r.path == "/api/v1/pods"))
            .collect()
    }

    pub fn events(&self) -> Vec<Value> {
        self.actions()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .map(Req::json)
            .collect()
    }

    /// Stores node `name` with these taints (`[(key, effect)]`).
    pub fn put_node(&self, name: &str, taints: &[(&str, &str)]) {
        let taints: Vec<Value> = taints
            .iter()
            .map(|(k, e)| json!({"key": k, "effect": e}))
            .collect();
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                         "resourceVersion": self.next_rv(), "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": "10.244.1.0/24", "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        self.inner.nodes.lock().unwrap().insert(name.into(), node);
    }

    /// The taints of node `name` as `key:effect`.
    pub fn node_taints(&self, name: &str) -> Vec<String> {
        let nodes = self.inner.nodes.lock().unwrap();
        nodes[name]["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                format!(
                    "{}:{}",
                    t["key"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    /// The next `n` node GETs are each followed by another writer changing the node.
    pub fn race_next_node_gets(&self, n: u64) {
        self.inner.race_node_gets.store(n, Ordering::SeqCst);
    }

    /// Node requests seen so far.
    pub fn node_requests(&self) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/api/v1/nodes"))
            .collect()
    }

    /// The next `n` requests with `method` get a 500.
    pub fn fail_next(&self, method: &str, n: u32) {
        self.inner.fail.lock().unwrap().insert(method.into(), n);
    }
}

/// Records the change and sends it to every open watch that selects the pod (under the
/// watchers lock, so a watch being opened sees it either in its replay or live, never twice
/// or not at all).
fn push(inner: &Inner, kind: &str, pod: &Value) {
    let rv: u64 = pod["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let node = pod["spec"]["nodeName"].as_str().map(str::to_string);
    let line = format!("{}\n", json!({"type": kind, "object": pod}));
    let mut ws = inner.watchers.lock().unwrap();
    inner
        .history
        .lock()
        .unwrap()
        .push((rv, line.clone(), node.clone()));
    ws.retain_mut(|w| {
        !w.wants(node.as_deref()) || w.stream.write_all(chunked(&line).as_bytes()).is_ok()
    });
}

/// The node named by a `spec.nodeName=<node>` term of the query's field selector.
fn selected_node(query: &str) -> Option<String> {
    let selector = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldSelector="))?;
    let selector = selector
        .replace("%3D", "=")
        .replace("%3d", "=")
        .replace("%2C", ",")
        .replace("%2c", ",");
    selector
        .split(',')
        .find_map(|t| t.strip_prefix("spec.nodeName="))
        .map(str::to_string)
}

fn resource_version_param(query: &str) -> u64 {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// When a watch asked for with `query` ends (`timeoutSeconds`; none: never).
fn watch_end(query: &str) -> Option<Instant> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
        .and_then(|v| v.parse().ok())
        .map(|secs| Instant::now() + Duration::from_secs(secs))
}

/// Ends (final chunk) every watch past its `timeoutSeconds`, as an API server does.
fn end_timed_out_watches(inner: &Inner) {
    let now = Instant::now();
    let due = |ends: Option<Instant>| ends.is_some_and(|e| e <= now);
    inner.watchers.lock().unwrap().retain_mut(|w| {
        !due(w.ends) || {
            let _ = w.stream.write_all(b"0\r\n\r\n");
            false
        }
    });
    inner.ns_watchers.lock().unwrap().retain_mut(|(s, ends)| {
        !due(*ends) || {
            let _ = s.write_all(b"0\r\n\r\n");
            false
        }
    });
}

fn is_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

const WATCH_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

/// JSON merge patch of `metadata.labels` and `metadata.annotations` (null removes a key).
fn merge_metadata(obj: &mut Value, patch: &Value) {
    for field in ["labels", "annotations"] {
        let Some(changes) = patch["metadata"][field].as_object() else {
            continue;
        };
        if !obj["metadata"][field].is_object() {
            obj["metadata"][field] = json!({});
        }
        let map = obj["metadata"][field].as_object_mut().expect("an object");
        for (k, v) in changes {
            if v.is_null() {
                map.remove(k);
            } else {
                map.insert(k.clone(), v.clone());
            }
        }
    }
}

fn chunked(line: &str) -> String {
    format!("{:x}\r\n{line}\r\n", line.len())
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// A pod on `node` whose istio-validation init container last exited with `code` and is now
/// waiting in CrashLoopBackOff; a sidecar pod in every other respect.
pub fn broken_pod(ns: &str, name: &str, uid: &str, ip: &str, node: &str, code: i32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid,
                     "annotations": {"sidecar.istio.io/status": "{\"initContainers\":[\"istio-validation\"]}"}},
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": "istio-validation", "image": "proxyv2"}],
            "containers": [
                {"name": "app", "image": "app"},
                {"name": "istio-proxy", "image": "proxyv2", "args": ["proxy", "sidecar"],
                 "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}
            ]
        },
        "status": {
            "phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}],
            "initContainerStatuses": [{
                "name": "istio-validation", "ready": false, "restartCount": 2,
                "image": "proxyv2", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": code, "reason": "Error"}}
            }]
        }
    })
}

/// Sets `pod`'s `status.phase` and, when `ips` is not empty, `podIP` and `podIPs`.
pub fn with_status(pod: &mut Value, phase: &str, ips: &[std::net::IpAddr]) {
    pod["status"]["phase"] = phase.into();
    if let Some(ip) = ips.first() {
        pod["status"]["podIP"] = ip.to_string().into();
        pod["status"]["podIPs"] = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read};
    use std::time::Duration;

    fn get(port: u16, target: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let code = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
        (code, resp.split_once("\r\n\r\n").unwrap().1.to_string())
    }

    fn pod(name: &str, node: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
               "spec": {"nodeName": node}})
    }

    #[test]
    fn pods_are_got_by_name_and_listed_by_node() {
        let kube = FakeKube::start();
        kube.add(pod("mine", "node-a"));
        kube.add(pod("theirs", "node-b"));
        let (code, body) = get(kube.port, "/api/v1/namespaces/default/pods/mine");
        assert_eq!(code, 200);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["metadata"]["name"],
            "mine"
        );
        assert_eq!(
            get(kube.port, "/api/v1/namespaces/default/pods/none").0,
            404
        );
        let (_, body) = get(
            kube.port,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a",
        );
        let list: Value = serde_json::from_str(&body).unwrap();
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["mine"]);
    }

    #[test]
    fn a_pod_put_under_its_name_replaces_the_one_there() {
        let kube = FakeKube::start();
        kube.put("default", "web", json!({"metadata": {"uid": "1"}}));
        kube.put("default", "web", json!({"metadata": {"uid": "2"}}));
        let (code, body) = get(kube.port, "/api/v1/namespaces/default/pods/web");
        let pod: Value = serde_json::from_str(&body).unwrap();
        assert_eq!((code, &pod["metadata"]["uid"]), (200, &json!("2")));
        assert_eq!(pod["metadata"]["name"], "web");
    }

    /// Every mode answers as its doc says, and each request is recorded first.
    #[test]
    fn the_server_answers_as_its_mode_says() {
        let kube = FakeKube::start();
        kube.put("default", "web", json!({"metadata": {}}));
        let web = "/api/v1/namespaces/default/pods/web";
        for (mode, code) in [
            (ApiMode::Status500, 500),
            (ApiMode::Status404, 404),
            (ApiMode::Status401, 401),
            (ApiMode::Status403, 403),
            (ApiMode::Status400, 400),
        ] {
            kube.set_mode(mode);
            let (got, body) = get(kube.port, web);
            assert_eq!(got, code, "{mode:?}");
            assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["code"], code);
        }
        kube.set_mode(ApiMode::Garbage);
        assert!(serde_json::from_str::<Value>(&get(kube.port, web).1).is_err());
        kube.set_mode(ApiMode::BadPod);
        let bad: Value = serde_json::from_str(&get(kube.port, web).1).unwrap();
        assert!(bad["spec"]["containers"].is_string());
        kube.set_mode(ApiMode::TrailingGarbage);
        assert!(get(kube.port, web).1.ends_with("}}}}"));
        kube.set_mode(ApiMode::DuplicateKey);
        assert!(get(kube.port, web).1.ends_with(r#","metadata":{}}"#));
        kube.set_mode(ApiMode::Slow);
        let t0 = std::time::Instant::now();
        assert_eq!(get(kube.port, web).0, 200);
        assert!(t0.elapsed() >= Duration::from_millis(1500));
        kube.set_mode(ApiMode::Hang);
        let mut s = TcpStream::connect(("127.0.0.1", kube.port)).unwrap();
        write!(s, "GET {web} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(s.read(&mut [0u8; 16]).is_err(), "a hung server answered");
        kube.set_mode(ApiMode::Up);
        assert_eq!(get(kube.port, web).0, 200);
        assert_eq!(kube.requests().len(), 12);
    }

    #[test]
    fn canned_answers_and_objects_only() {
        let kube = FakeKube::start();
        kube.put_daemonset("istio-system", "cni");
        kube.forbid_daemonset("istio-system", "cni");
        let ds = "/apis/apps/v1/namespaces/istio-system/daemonsets/cni";
        let (code, body) = get(kube.port, ds);
        assert_eq!(code, 403);
        assert!(body.contains("forbidden"), "{body}");
        kube.answer(
            "/api/v1/namespaces/default/pods/web",
            "200 OK",
            json!({"metadata": {"name": "x"}}),
        );
        let (code, body) = get(kube.port, "/api/v1/namespaces/default/pods/web");
        assert_eq!((code, body.contains(r#""name":"x""#)), (200, true));
        kube.put("default", "web", json!({"metadata": {}}));
        let (_, body) = get(kube.port, "/api/v1/namespaces/default/pods/web");
        assert!(body.contains(r#""name":"web""#), "{body}");
        assert_eq!(get(kube.port, "/api/v1/pods").0, 200);
        kube.objects_only();
        assert_eq!(get(kube.port, "/api/v1/pods").0, 404);
        assert_eq!(get(kube.port, "/api/v1/namespaces").0, 404);
        assert_eq!(get(kube.port, "/api/v1/namespaces/default/pods/web").0, 200);
    }

    #[test]
    fn a_dropped_server_stops_accepting() {
        let kube = FakeKube::start();
        let (port, copy) = (kube.port, kube.clone());
        drop(kube);
        assert_eq!(get(port, "/api/v1/pods").0, 200, "a clone keeps it");
        drop(copy);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(std::time::Instant::now() < deadline, "still accepting");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn namespaces_are_listed_and_watched() {
        let kube = FakeKube::start();
        kube.put_namespace_meta(
            "shop",
            json!({"istio.io/dataplane-mode": "ambient"}),
            json!({}),
        );
        let (_, body) = get(kube.port, "/api/v1/namespaces");
        let list: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(list["kind"], "NamespaceList");
        assert_eq!(
            list["items"][0]["metadata"]["labels"]["istio.io/dataplane-mode"],
            "ambient"
        );
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let mut s = TcpStream::connect(("127.0.0.1", kube.port)).unwrap();
        write!(
            s,
            "GET /api/v1/namespaces?watch=true&resourceVersion={rv} HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = std::io::BufReader::new(s);
        // Wait for the watch to be registered, then change the namespace.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while kube.inner.ns_watchers.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        kube.put_namespace_meta("shop", json!({}), json!({}));
        let event = r
            .by_ref()
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with('{'))
            .unwrap();
        let event: Value = serde_json::from_str(&event).unwrap();
        assert_eq!(event["type"], "MODIFIED");
        assert_eq!(event["object"]["metadata"]["labels"], json!({}));
    }
}
