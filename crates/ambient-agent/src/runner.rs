//! The agent's loop: what happens on the node comes in as one [`Message`] at a time (a pod or
//! namespace changed, the caches re-listed, a retry or reconcile tick), and each is handled by
//! the [`Agent`]'s named operations. Which operation a pod's change calls for is decided with no
//! I/O ([`pod_step`], unit-tested below). Startup comes first: once both caches have listed,
//! every ambient pod already running is found through the host's /proc, its rules reconciled,
//! and it is put into the ZDS snapshot BEFORE the socket opens.

use crate::agent::{Agent, AgentSettings, AmbientPodRef};
use crate::{
    JobContext, NodeContext, Settings, annotate, marked_enabled, plugin_server, pod_ref, view,
    wants,
};
use capture::{HostProbeConfig, Plan, ProbeSnat};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use node_status::State;
use node_status::jobs::{Jobs, Stage};
use node_status::metrics::Counters;
use node_view::cache::{CacheEvent, NamespaceCache, PodCache};
use pod_policy::Policy;
use pod_policy::ambient::AnnotationError;
use pod_policy::bypass::{pod_ips, terminal};
use redirect::host_probe::HostProbeRule;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Pods that should be served but are not (ztunnel was down, the netns not found yet) are
/// retried this often.
const RETRY: Duration = Duration::from_secs(5);

/// How many former ambient pods' clean-ups are remembered (see `Runner::remove_from_mesh`).
const MAX_UNMARKED: usize = 4096;

/// Why the agent could not start (ambient pods cannot start on the node then).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the host probe rule's plan: {0}")]
    HostPlan(#[source] capture::ConfigError),
    #[error("creating {}: {source}", dir.display())]
    SocketDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Zds(#[from] zds::ZdsError),
}

/// Why a pod's network namespace was not found on the node.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    #[error("no pod IP yet")]
    NoIp,
    #[error(transparent)]
    NotFound(#[from] node_view::running::LocateError),
    #[error("opening {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the lookup's blocking task failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

/// What the loop reacts to, one at a time.
#[derive(Debug)]
enum Message {
    PodApplied(Arc<Pod>),
    PodDeleted(Arc<Pod>),
    NamespaceApplied(String),
    /// A cache holds a complete list again (after a re-list).
    Relisted,
    /// Time to retry pods that should be served but are not.
    RetryTick,
    /// Time to check every served pod's rules and the host rule.
    ReconcileTick,
}

/// What a pod's change calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodStep {
    /// Wanted and not served: find its namespace and enroll it.
    Enroll,
    /// Served and no longer wanted: release it and take its mark off.
    Release,
    /// Neither wanted nor served but still marked as redirected: its leftovers go (Istio's
    /// `RemovePodFromMesh`).
    RemoveFromMesh,
    Nothing,
}

/// The step for a pod the agent does (not) want, does (not) serve, and that is (not) marked
/// `ambient.istio.io/redirection: enabled`.
fn pod_step(wanted: bool, served: bool, marked: bool) -> PodStep {
    match (wanted, served) {
        (true, false) => PodStep::Enroll,
        (false, true) => PodStep::Release,
        (false, false) if marked => PodStep::RemoveFromMesh,
        _ => PodStep::Nothing,
    }
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

/// The host probe rule, as Istio has it per backend (`HostProbeRule::probe_source`): on nft
/// nodes kubelet's sockets (its uid found through the host's /proc), or any local socket when
/// no kubelet process is found; on iptables-legacy nodes any local socket (Istio's payload).
fn host_plan(
    proc_root: &Path,
    ipv6: bool,
    snat: ProbeSnat,
    host: HostProbeRule,
) -> Result<Plan, capture::ConfigError> {
    let kubelet = match host.wants_kubelet_uid() {
        false => None,
        true => match node_view::kubelet::kubelet_uid(proc_root) {
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
    Plan::ambient_host(&config)
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
    async fn start_agent(&self) -> Result<Agent, StartError> {
        let host_plan = host_plan(&self.proc_root, self.ipv6, self.probe_snat, self.host)
            .map_err(StartError::HostPlan)?;
        let settings = AgentSettings {
            backend: self.backend,
            dns_capture: self.dns_capture,
            ipv6: self.ipv6,
            probe_snat: self.probe_snat,
            host_plan,
            host: self.host,
            aws_branch_eni_probe: self.aws_branch_eni_probe,
        };
        if let Some(dir) = self.ztunnel_socket.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StartError::SocketDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let (found, unlocated) = self.running_ambient_pods().await;
        let (zds, adopted) = self.first_snapshot(found, &unlocated)?;
        let agent = Agent::new(zds, settings);
        let n = adopted.len();
        self.adopt_all(&agent, adopted).await;
        // Every pod is known now: reconcile passes may prune the probe sets.
        agent.discovered(unlocated).await;
        tracing::info!(pods = n, socket = %self.ztunnel_socket.display(), reconciled = self.reconcile_on_startup, "ambient node agent started");
        Ok(agent)
    }

    /// The ZDS server bound with the running pods found in its first snapshot, and those whose
    /// namespace was not found kept (KeepWorkload: ztunnel keeps what it has for them rather
    /// than dropping pods it may be serving). Returns the pods to adopt.
    fn first_snapshot(
        &self,
        found: Vec<(AmbientPodRef, OwnedFd)>,
        unlocated: &[Kept],
    ) -> Result<(zds::ZdsServer, Vec<(AmbientPodRef, OwnedFd)>), StartError> {
        let mut builder = zds::ZdsServer::builder(&self.ztunnel_socket);
        for (uid, _) in unlocated {
            builder = builder.keep(uid.clone());
        }
        let mut adopted = Vec::new();
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
        Ok((builder.bind()?, adopted))
    }

    /// The snapshot's pods enter the agent's book, their rules reconciled first when asked.
    async fn adopt_all(&self, agent: &Agent, adopted: Vec<(AmbientPodRef, OwnedFd)>) {
        for (pod, netns) in adopted {
            if self.reconcile_on_startup {
                let programmed = match netns.try_clone() {
                    Ok(fd) => agent
                        .program(&pod, &Arc::new(fd))
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(format!("duplicating the netns fd: {e}")),
                };
                match programmed {
                    Ok(()) => view::AGENT.stamp(&pod.uid),
                    Err(e) => {
                        tracing::warn!(pod = %pod.label(), error = %e, "startup: reconciling the pod's rules failed")
                    }
                }
            }
            if let Err(e) = agent.adopt(pod, netns).await {
                tracing::warn!(error = %e, "startup: adopting the pod failed");
            }
        }
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
    async fn locate(&self, pod: &Pod) -> Result<(AmbientPodRef, OwnedFd), LocateError> {
        let r = pod_ref(pod, Vec::new())?;
        let ip = *r.ips.first().ok_or(LocateError::NoIp)?;
        let (proc_root, uid) = (self.proc_root.clone(), r.uid.clone());
        let fd = tokio::task::spawn_blocking(move || {
            let uid = Some(uid.as_str()).filter(|u| !u.is_empty());
            let path = node_view::running::locate(&proc_root, ip, uid)?;
            std::fs::File::open(&path)
                .map(OwnedFd::from)
                .map_err(|source| LocateError::Open { path, source })
        })
        .await??;
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
            let message = tokio::select! {
                Some(ev) = pods.recv() => match self.count(ev, |p| format!("pod/{}", node_view::cache::key(p))) {
                    CacheEvent::Applied(p) => Message::PodApplied(p),
                    CacheEvent::Deleted(p) => Message::PodDeleted(p),
                    CacheEvent::Synced => Message::Relisted,
                },
                Some(ev) = nss.recv() => match self.count(ev, |n| format!("ns/{}", n.metadata.name.as_deref().unwrap_or(""))) {
                    CacheEvent::Applied(ns) => Message::NamespaceApplied(ns.metadata.name.clone().unwrap_or_default()),
                    CacheEvent::Deleted(_) => continue,
                    CacheEvent::Synced => Message::Relisted,
                },
                _ = retry.tick() => Message::RetryTick,
                _ = check.tick() => Message::ReconcileTick,
            };
            self.handle(&agent, message).await;
        }
    }

    /// One message, handled to its end before the next.
    async fn handle(&self, agent: &Agent, message: Message) {
        match message {
            Message::PodApplied(pod) => self.on_pod(agent, &pod).await,
            Message::PodDeleted(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                agent.release(&uid, "pod deleted").await;
            }
            Message::NamespaceApplied(name) => self.on_namespace(agent, &name).await,
            Message::Relisted => self.resync(agent).await,
            Message::RetryTick => self.retry_pending(agent).await,
            Message::ReconcileTick => self.reconcile(agent).await,
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
        let step = pod_step(
            self.wants(pod),
            agent.is_enrolled(&uid).await,
            marked_enabled(pod),
        );
        match step {
            PodStep::Enroll => match self.locate(pod).await {
                Ok((r, fd)) => match agent.enroll(r, fd).await {
                    Ok(()) => annotate(&self.client, pod, true),
                    Err(e) => {
                        tracing::warn!(pod = %key, error = %e, "enrolling the running pod failed; will retry")
                    }
                },
                Err(e) => tracing::debug!(pod = %key, error = %e, "ambient pod not running yet"),
            },
            PodStep::Release => {
                agent.release(&uid, "no longer ambient").await;
                if pod.metadata.deletion_timestamp.is_none() {
                    annotate(&self.client, pod, false);
                }
            }
            PodStep::RemoveFromMesh => self.remove_from_mesh(agent, pod).await,
            PodStep::Nothing => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_change_calls_for_one_step_from_what_is_wanted_served_and_marked() {
        use PodStep::*;
        let cases = [
            ((true, false, false), Enroll),
            ((true, false, true), Enroll),
            ((true, true, false), Nothing),
            ((true, true, true), Nothing),
            ((false, true, false), Release),
            ((false, true, true), Release),
            ((false, false, true), RemoveFromMesh),
            ((false, false, false), Nothing),
        ];
        for ((wanted, served, marked), step) in cases {
            assert_eq!(
                pod_step(wanted, served, marked),
                step,
                "wanted {wanted}, served {served}, marked {marked}"
            );
        }
    }
}
