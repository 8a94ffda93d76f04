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

pub mod agent;
pub mod branch_eni;
pub mod plugin_server;
pub mod view;

use agent::{Agent, AgentSettings, AmbientPodRef};
use capture::{HostProbeConfig, Plan, ProbeSnat};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use node_status::State;
use node_status::jobs::{Jobs, Stage};
use node_status::metrics::Counters;
use node_view::cache::{CacheEvent, NamespaceCache, PodCache};
use pod_policy::ambient::{AnnotationError, pod_settings};
use pod_policy::bypass::{pod_ips, terminal};
use pod_policy::{Decision, Policy, PolicyError};
use redirect::host_probe::HostProbeRule;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

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

/// Pods that should be served but are not (ztunnel was down, the netns not found yet) are
/// retried this often.
const RETRY: Duration = Duration::from_secs(5);

/// How many former ambient pods' clean-ups are remembered (see `Runner::remove_from_mesh`).
const MAX_UNMARKED: usize = 4096;

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

/// The host probe rule, as Istio has it per backend (`HostProbeRule::probe_source`): on nft
/// nodes kubelet's sockets (its uid found through the host's /proc), or any local socket when
/// no kubelet process is found; on iptables-legacy nodes any local socket (Istio's payload).
fn host_plan(
    proc_root: &Path,
    ipv6: bool,
    snat: ProbeSnat,
    host: HostProbeRule,
) -> Result<Plan, String> {
    let kubelet = match host.backend() {
        redirect::Backend::IptablesLegacy => None,
        redirect::Backend::Nft => match node_view::kubelet::kubelet_uid(proc_root) {
            Ok(uid) => {
                tracing::info!(uid, "kubelet found: probes are its sockets' traffic");
                Some(uid)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no kubelet uid: every local socket's traffic to ambient pods counts as a probe");
                None
            }
        },
    };
    let source = host.probe_source(kubelet);
    let config = HostProbeConfig {
        host_probe_snat_v4: snat.v4,
        host_probe_snat_v6: snat.v6,
        ..HostProbeConfig::new(source, ipv6)
    };
    Plan::ambient_host(&config).map_err(|e| e.to_string())
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
    tokio::spawn(async move {
        let params = kube::api::PatchParams::default();
        if let Err(e) = api
            .patch_status(&name, &params, &kube::api::Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "annotating the pod failed");
        }
    });
}

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
    tokio::spawn(async move { node_view::events::post_event(&client, &pod, &ev).await });
}

/// Subscribes now (so the first lists are seen whole) and starts the agent in the background.
/// The agent, its ztunnel follower and its plugin event socket are jobs in `ctx.jobs`.
pub fn start(settings: &Settings, node: NodeContext, ctx: JobContext) {
    let JobContext {
        client,
        pods,
        namespaces,
        state,
        checks,
        jobs,
    } = ctx;
    let pod_events = pods.subscribe();
    let ns_events = namespaces.subscribe();
    let events = Arc::new(Counters::by(
        "nodeagent_reconcile_events_total",
        "The total number of node agent reconcile events.",
        &["type"],
        &["add", "update", "delete"],
    ));
    state.register(events.clone());
    let requests = Arc::new(plugin_server::requests_metric());
    state.register(requests.clone());
    let run = Runner {
        policy: node.policy,
        proc_root: node.proc_root,
        run_dir: node.run_dir,
        ztunnel_socket: settings.ztunnel_socket.clone(),
        reconcile_on_startup: settings.reconcile_on_startup,
        reconcile_interval: node.reconcile_interval,
        backend: redirect::BackendChoice::Fixed(node.backend),
        host: HostProbeRule::new(node.backend),
        dns_capture: settings.dns_capture,
        probe_snat: settings.probe_snat,
        ipv6: settings.ipv6,
        aws_branch_eni_probe: settings.aws_branch_eni_probe,
        pods,
        namespaces,
        state,
        checks,
        client,
        unmarked: Default::default(),
        events,
        requests,
        seen: Default::default(),
        jobs: jobs.clone(),
    };
    jobs.spawn(
        "ambient agent",
        Stage::Consumer,
        run.run(pod_events, ns_events),
    );
}

struct Runner {
    policy: Policy,
    proc_root: PathBuf,
    run_dir: PathBuf,
    ztunnel_socket: PathBuf,
    reconcile_on_startup: bool,
    reconcile_interval: Option<Duration>,
    backend: redirect::BackendChoice,
    /// The host probe rule on the node's backend.
    host: HostProbeRule,
    /// Where the agent's own tasks are supervised.
    jobs: Jobs,
    dns_capture: bool,
    probe_snat: ProbeSnat,
    ipv6: bool,
    aws_branch_eni_probe: bool,
    pods: PodCache,
    namespaces: NamespaceCache,
    state: Arc<State>,
    /// `istio_cni_pod_rules_checks_total` (shared with the sidecar reconciler).
    checks: Arc<Counters>,
    client: kube::Client,
    /// Former ambient pods already cleaned up, by (UID, resourceVersion).
    unmarked: std::sync::Mutex<std::collections::HashSet<(Option<String>, Option<String>)>>,
    /// Istio's `nodeagent_reconcile_events_total{type}`: the pod and namespace events handled.
    events: Arc<Counters>,
    /// Istio's `istio_cni_plugin_requests_total{response_code}` (`plugin_server`).
    requests: Arc<Counters>,
    /// Pods and namespaces seen (`pod/<ns>/<name>`, `ns/<name>`): an event for one of them is
    /// an update, else an add.
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

type Events<K> = UnboundedReceiver<CacheEvent<K>>;

/// An ambient pod kept for ztunnel without its namespace: its UID and addresses.
type Kept = (String, Vec<IpAddr>);

async fn synced<K>(events: &mut Events<K>) {
    while let Some(ev) = events.recv().await {
        if matches!(ev, CacheEvent::Synced) {
            return;
        }
    }
}

impl Runner {
    async fn run(self, mut pod_events: Events<Pod>, mut ns_events: Events<Namespace>) {
        self.state.set_ztunnel_connected(Some(false));
        tracing::info!("ambient: waiting for the pod and namespace lists");
        synced(&mut pod_events).await;
        synced(&mut ns_events).await;
        let agent = match self.start_agent().await {
            Ok(a) => Arc::new(a),
            Err(e) => {
                tracing::error!(error = %e, "ambient node agent not started; ambient pods cannot start on this node");
                return;
            }
        };
        self.follow_ztunnel(&agent);
        let handler = plugin_server::Handler::new(
            agent.clone(),
            self.pods.clone(),
            self.client.clone(),
            self.proc_root.clone(),
            self.requests.clone(),
        );
        if let Err(e) = plugin_server::start(&self.run_dir, handler, &self.jobs) {
            tracing::error!(error = %e, "plugin event socket not started; ambient pods cannot start on this node");
            return;
        }
        self.follow(agent, pod_events, ns_events).await;
    }

    /// The ZDS server with every ambient pod already running in its first snapshot.
    async fn start_agent(&self) -> Result<Agent, String> {
        let backend = self.backend;
        let settings = AgentSettings {
            backend,
            dns_capture: self.dns_capture,
            ipv6: self.ipv6,
            probe_snat: self.probe_snat,
            host_plan: host_plan(&self.proc_root, self.ipv6, self.probe_snat, self.host)?,
            host: self.host,
            aws_branch_eni_probe: self.aws_branch_eni_probe,
        };
        if let Some(dir) = self.ztunnel_socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let (found, unlocated) = self.running_ambient_pods().await;
        let mut builder = zds::ZdsServer::builder(&self.ztunnel_socket);
        // Ambient pods whose namespace was not found: ztunnel keeps what it has for them
        // (KeepWorkload) rather than dropping pods it may be serving.
        for (uid, _) in &unlocated {
            builder = builder.keep(uid.clone());
        }
        let mut adopted: Vec<(AmbientPodRef, OwnedFd)> = Vec::new();
        for (pod, netns) in found {
            let info = zds::WorkloadInfo {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
            };
            let Ok(copy) = netns.try_clone() else {
                continue;
            };
            builder = builder.workload(pod.uid.clone(), info, copy);
            adopted.push((pod, netns));
        }
        let zds = builder.bind().map_err(|e| e.to_string())?;
        let agent = Agent::new(zds, settings);
        let n = adopted.len();
        for (pod, netns) in adopted {
            if self.reconcile_on_startup {
                let plan = agent.plan_for(&pod).map_err(|e| e.to_string())?;
                let fd = Arc::new(netns.try_clone().map_err(|e| e.to_string())?);
                match agent::program(&plan, &fd, backend, &pod).await {
                    Ok(()) => view::AGENT.stamp(&pod.uid),
                    Err(e) => {
                        tracing::warn!(error = %e, "startup: reconciling the pod's rules failed")
                    }
                }
            }
            if let Err(e) = agent.adopt(pod, netns).await {
                tracing::warn!(error = %e, "startup: adopting the pod failed");
            }
        }
        // Every pod is known now: reconcile passes may prune the probe sets.
        agent.discovered(unlocated).await;
        tracing::info!(pods = n, socket = %self.ztunnel_socket.display(), reconciled = self.reconcile_on_startup, "ambient node agent started");
        Ok(agent)
    }

    /// Running ambient pods of the node with their namespaces (found through /proc by IP),
    /// and the uids (with their IPs) of ambient pods with an IP whose namespace was not found.
    async fn running_ambient_pods(&self) -> (Vec<(AmbientPodRef, OwnedFd)>, Vec<Kept>) {
        let (mut found, mut unlocated) = (Vec::new(), Vec::new());
        for pod in self.pods.snapshot() {
            if !self.wants(&pod) {
                continue;
            }
            match self.locate(&pod).await {
                Ok(f) => found.push(f),
                Err(e) => {
                    tracing::warn!(pod = %node_view::cache::key(pod.as_ref()), error = %e, "startup: ambient pod's namespace not found; ztunnel keeps what it has for it");
                    let ips = pod_ips(&pod);
                    if let (false, Some(uid)) = (ips.is_empty(), pod.metadata.uid.clone()) {
                        unlocated.push((uid, ips));
                    }
                }
            }
        }
        (found, unlocated)
    }

    fn wants(&self, pod: &Pod) -> bool {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        let labels = self
            .namespaces
            .get("", ns)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        wants(&self.policy, pod, &labels)
    }

    /// The pod's namespace through the host's /proc (the repair controller's discovery).
    async fn locate(&self, pod: &Pod) -> Result<(AmbientPodRef, OwnedFd), String> {
        let r = pod_ref(pod, Vec::new()).map_err(|e| e.to_string())?;
        let Some(ip) = r.ips.first().copied() else {
            return Err("no pod IP yet".into());
        };
        let (proc_root, uid) = (self.proc_root.clone(), r.uid.clone());
        let fd = tokio::task::spawn_blocking(move || -> Result<OwnedFd, String> {
            let uid = Some(uid.as_str()).filter(|u| !u.is_empty());
            let path =
                node_view::running::locate(&proc_root, ip, uid).map_err(|e| e.to_string())?;
            std::fs::File::open(&path)
                .map(OwnedFd::from)
                .map_err(|e| format!("opening {}: {e}", path.display()))
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok((r, fd))
    }

    /// `/readyz` and the plugin's STATUS follow ztunnel's connection.
    fn follow_ztunnel(&self, agent: &Arc<Agent>) {
        let mut ready = agent.zds().ready();
        let state = self.state.clone();
        let follow = async move {
            loop {
                let connected = *ready.borrow_and_update();
                state.set_ztunnel_connected(Some(connected));
                tracing::info!(connected, "ztunnel connection");
                if ready.changed().await.is_err() {
                    return;
                }
            }
        };
        self.jobs
            .spawn("ztunnel connection", Stage::Consumer, follow);
    }

    async fn follow(self, agent: Arc<Agent>, mut pods: Events<Pod>, mut nss: Events<Namespace>) {
        view::AGENT.publish(agent.clone());
        let mut retry = tokio::time::interval(RETRY);
        // Without reconcile the tick never comes (a year; `Duration::MAX` would overflow).
        let never = Duration::from_secs(365 * 24 * 3600);
        let mut check = tokio::time::interval(self.reconcile_interval.unwrap_or(never));
        check.tick().await;
        loop {
            tokio::select! {
                Some(ev) = pods.recv() => match self.count(ev, |p| format!("pod/{}", node_view::cache::key(p))) {
                    CacheEvent::Applied(p) => self.on_pod(&agent, &p).await,
                    CacheEvent::Deleted(p) => {
                        let uid = p.metadata.uid.clone().unwrap_or_default();
                        agent.release(&uid, "pod deleted").await;
                    }
                    CacheEvent::Synced => self.resync(&agent).await,
                },
                Some(ev) = nss.recv() => match self.count(ev, |n| format!("ns/{}", n.metadata.name.as_deref().unwrap_or(""))) {
                    CacheEvent::Applied(ns) => self.on_namespace(&agent, ns.metadata.name.as_deref().unwrap_or("")).await,
                    CacheEvent::Deleted(_) => {}
                    CacheEvent::Synced => self.resync(&agent).await,
                },
                _ = retry.tick() => self.retry_pending(&agent).await,
                _ = check.tick() => self.reconcile(&agent).await,
            }
        }
    }

    /// Counts the event as Istio's informers do (add, update, delete), and passes it on.
    fn count<K>(&self, ev: CacheEvent<K>, key: impl Fn(&K) -> String) -> CacheEvent<K> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let kind = match &ev {
            CacheEvent::Applied(o) if seen.insert(key(o)) => "add",
            CacheEvent::Applied(_) => "update",
            CacheEvent::Deleted(o) => {
                seen.remove(&key(o));
                "delete"
            }
            CacheEvent::Synced => return ev,
        };
        self.events.inc(&[kind]);
        ev
    }

    /// Enrolls or releases the pod as its labels (and its namespace's) now say.
    async fn on_pod(&self, agent: &Agent, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = node_view::cache::key(pod);
        match (self.wants(pod), agent.is_enrolled(&uid).await) {
            (true, false) => match self.locate(pod).await {
                Ok((r, fd)) => match agent.enroll(r, fd).await {
                    Ok(()) => annotate(&self.client, pod, true),
                    Err(e) => {
                        tracing::warn!(pod = %key, error = %e, "enrolling the running pod failed; will retry")
                    }
                },
                Err(e) => tracing::debug!(pod = %key, error = %e, "ambient pod not running yet"),
            },
            (false, true) => {
                agent.release(&uid, "no longer ambient").await;
                if pod.metadata.deletion_timestamp.is_none() {
                    annotate(&self.client, pod, false);
                }
            }
            (false, false) if marked_enabled(pod) => self.remove_from_mesh(agent, pod).await,
            _ => {}
        }
    }

    /// Istio's `RemovePodFromMesh` for a pod this agent does not serve but that is still marked
    /// as redirected (it left ambient while no agent ran: its rules and probe addresses stayed,
    /// and ztunnel's new snapshot no longer has it, so its traffic goes nowhere): the rules and
    /// addresses removed, the mark taken off. Once per pod version: a mark that cannot be
    /// removed (RBAC) is not retried every pass.
    async fn remove_from_mesh(&self, agent: &Agent, pod: &Pod) {
        if terminal(pod).is_some() {
            return;
        }
        let version = (
            pod.metadata.uid.clone(),
            pod.metadata.resource_version.clone(),
        );
        {
            let mut seen = self.unmarked.lock().unwrap_or_else(|e| e.into_inner());
            // Bounded: forgetting only means one more (idempotent) clean-up of a pod.
            if seen.len() >= MAX_UNMARKED {
                seen.clear();
            }
            if !seen.insert(version) {
                return;
            }
        }
        let key = node_view::cache::key(pod);
        match self.locate(pod).await {
            Ok((r, fd)) => match agent.clear(&r, fd).await {
                Ok(()) => {
                    tracing::info!(pod = %key, "pod no longer ambient: its leftover rules and probe addresses removed")
                }
                Err(e) => {
                    tracing::warn!(pod = %key, error = %e, "removing a former ambient pod's rules failed")
                }
            },
            Err(e) => {
                tracing::debug!(pod = %key, error = %e, "former ambient pod not running: nothing to remove")
            }
        }
        annotate(&self.client, pod, false);
    }

    async fn on_namespace(&self, agent: &Agent, name: &str) {
        for pod in self.pods.snapshot() {
            if pod.metadata.namespace.as_deref() == Some(name) {
                self.on_pod(agent, &pod).await;
            }
        }
    }

    /// After a re-list: enrolled pods that vanished are released; the rest re-evaluated.
    async fn resync(&self, agent: &Agent) {
        let live: std::collections::HashSet<String> = self
            .pods
            .snapshot()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        for (pod, _) in agent.enrolled().await {
            if !live.contains(&pod.uid) {
                agent.release(&pod.uid, "pod gone").await;
            }
        }
        self.retry_pending(agent).await;
    }

    /// Pods that should be served but are not, and pods still marked as served that should not
    /// be (after a restart: their labels changed while no agent ran).
    async fn retry_pending(&self, agent: &Agent) {
        for pod in self.pods.snapshot() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let has_ip = !pod_ips(&pod).is_empty();
            let pending = self.wants(&pod) || marked_enabled(&pod);
            if has_ip && pending && !agent.is_enrolled(&uid).await {
                self.on_pod(agent, &pod).await;
            }
        }
    }

    /// Keeps every ambient pod's rules true (the continuous reconcile, for ambient pods).
    async fn reconcile(&self, agent: &Agent) {
        let started = std::time::Instant::now();
        let enrolled = agent.enrolled().await;
        view::AGENT.retain(|uid| enrolled.iter().any(|(p, _)| p.uid == uid));
        for (pod, _) in enrolled {
            match agent.reconcile(&pod.uid).await {
                Ok(drift) if drift.is_empty() => self.checks.inc(&["ok"]),
                Ok(drift) => {
                    self.checks.inc(&["drift"]);
                    self.checks.inc(&["repaired"]);
                    view::AGENT.stamp(&pod.uid);
                    tracing::warn!(pod = %pod.label(), differences = ?drift, "ambient rules drifted; re-applied");
                }
                Err(e) => {
                    self.checks.inc(&["failed"]);
                    tracing::warn!(error = %e, "checking the ambient rules failed");
                }
            }
        }
        match agent.reconcile_host().await {
            Ok(drift) if drift.is_empty() => {}
            Ok(drift) => {
                self.checks.inc(&["drift"]);
                self.checks.inc(&["repaired"]);
                tracing::warn!(rule = self.host.describe(), differences = ?drift, "host probe rule drifted; written again");
            }
            Err(e) => {
                self.checks.inc(&["failed"]);
                tracing::warn!(error = %e, "checking the host probe rule failed");
            }
        }
        let figures = node_status::figures::global();
        figures
            .reconcile_pass
            .observe(&["ambient"], started.elapsed());
    }
}
