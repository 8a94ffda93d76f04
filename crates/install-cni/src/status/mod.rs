//! The node's enrollment report (`istio-nftables status`), served on `<run_dir>/status.sock`
//! (`cni_config::status`: `GET /status[?pod=NS/NAME]`), and its summary as the gauge
//! `istio_cni_pods{mode,state}` ([`metric`]), refreshed by a status pass every reconcile
//! interval (and by each whole-node report).
//!
//! Each report reads the daemon's pod cache (what each pod should get: `pod_policy::decide`,
//! with the namespace cache's labels in ambient mode), the reconciler's last check of each
//! sidecar pod (`guardian::reconcile::ledger`), the ambient agent's enrolled set and host
//! probe set (`ambient_agent::view`), then the kernel: the node's running network namespaces
//! once, each pod's found by its IP and UID, its live rules compared with its plan
//! ([`gather`]). Reads only: it never programs or repairs anything.

pub mod gather;
pub mod metric;

use cni_config::status::{Report, STATUS_SOCKET, Source, Summary};
use gather::{Judged, Known};
use guardian::reconcile::ledger::Ledger;
use node_status::State;
use node_status::jobs::{Jobs, Stage};
use node_view::cache::{NamespaceCache, PodCache};
use pod_policy::Policy;
use redirect::Backend;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use uds_http::server::{Reply, Request, json, reply};
use uds_http::{Method, StatusCode};

/// What the report is built from.
pub struct Sources {
    pub node: String,
    pub backend: Backend,
    pub proc_root: PathBuf,
    /// The plugin's policy (ambient mode: with the enablement selectors).
    pub policy: Policy,
    pub ambient: bool,
    pub pods: PodCache,
    pub namespaces: Option<NamespaceCache>,
    pub ledger: Ledger,
    /// How often the status pass refreshes the gauge.
    pub interval: Duration,
}

/// Registers the gauge, serves `status.sock` (a server in `jobs`) and starts the status pass
/// (a consumer).
pub fn start(run_dir: &Path, sources: Sources, state: &State, jobs: &Jobs) -> std::io::Result<()> {
    let gauge = Arc::new(metric::PodsGauge::default());
    state.register(gauge.clone());
    let listener = uds_http::server::bind(&run_dir.join(STATUS_SOCKET))?;
    let sources = Arc::new(sources);
    let (s, g) = (sources.clone(), gauge.clone());
    let handler = move |req: Request| {
        let (s, g) = (s.clone(), g.clone());
        async move { handle(&s, &g, req).await }
    };
    let serve = uds_http::server::serve(listener, "status", 1024, handler);
    jobs.spawn("status.sock", Stage::Server, serve);
    jobs.spawn("status pass", Stage::Consumer, pass(sources, gauge));
    Ok(())
}

/// Every interval, once the pod cache has listed: the whole node's report into the gauge.
async fn pass(s: Arc<Sources>, gauge: Arc<metric::PodsGauge>) {
    loop {
        if !s.pods.is_synced() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        match build(&s, None).await {
            Ok(r) => gauge.set(r.summary),
            Err((_, why)) => tracing::debug!(error = %why, "status pass"),
        }
        tokio::time::sleep(s.interval).await;
    }
}

async fn handle(s: &Sources, gauge: &metric::PodsGauge, req: Request) -> Reply {
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "GET only");
    }
    if req.uri().path() != cni_config::status::STATUS_PATH {
        return reply(StatusCode::NOT_FOUND, "no such path");
    }
    let pod = match cni_config::status::parse_query(req.uri().query().unwrap_or("")) {
        Ok(p) => p,
        Err(e) => return reply(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let whole = pod.is_none();
    match build(s, pod).await {
        Ok(r) => {
            if whole {
                gauge.set(r.summary.clone());
            }
            json(serde_json::to_vec(&r).expect("plain types serialize"))
        }
        Err((code, why)) => reply(code, why),
    }
}

/// The report for the node, or for one pod (404 when the cache does not hold it).
async fn build(s: &Sources, pod: Option<(String, String)>) -> Result<Report, (StatusCode, String)> {
    if !s.pods.is_synced() {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "the pod cache has not listed the node's pods yet".into(),
        ));
    }
    let mut pods = s.pods.snapshot();
    if let Some((ns, name)) = &pod {
        pods.retain(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        });
        if pods.is_empty() {
            return Err((
                StatusCode::NOT_FOUND,
                format!("pod {ns}/{name} is not on node {}", s.node),
            ));
        }
    }
    pods.sort_by_key(|p| node_view::cache::key(p.as_ref()));
    let view = &ambient_agent::view::AGENT;
    let agent = s.ambient.then(|| view.agent()).flatten();
    let enrolled: Option<HashSet<String>> = match &agent {
        Some(_) => view
            .enrolled()
            .await
            .map(|e| e.into_iter().map(|(uid, _)| uid).collect()),
        None => None,
    };
    let probe_ips = match agent.is_some() {
        true => view.probe_ips().await.and_then(Result::ok),
        false => None,
    };
    let plan = |r: &ambient_agent::agent::AmbientPodRef| agent.as_ref()?.plan_for(r).ok();
    let known = Known {
        policy: &s.policy,
        ledger: &s.ledger,
        enrolled: enrolled.as_ref(),
        probe_ips: probe_ips.as_deref(),
        ambient_plan: &plan,
    };
    let judged: Vec<Judged> = pods
        .iter()
        .map(|p| gather::judge(p, &labels(s, p), &known))
        .collect();
    let (proc_root, backend) = (s.proc_root.clone(), s.backend);
    let entries = tokio::task::spawn_blocking(move || {
        let all = gather::namespaces(&proc_root)?;
        Ok::<_, String>(gather::read_kernel(judged, &all, backend))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
    let mut notes = Vec::new();
    if s.ambient && agent.is_none() {
        notes.push("the ambient agent has not started: ambient pods are not served yet".into());
    }
    Ok(Report {
        source: Source::Daemon,
        node: s.node.clone(),
        node_backend: Some(s.backend.to_string()),
        ambient_enabled: Some(s.ambient),
        generated: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        summary: Summary::of(&entries),
        pods: entries,
        notes,
    })
}

/// The pod's namespace's labels (they enroll ambient pods), from the namespace cache.
fn labels(s: &Sources, pod: &k8s_openapi::api::core::v1::Pod) -> pod_policy::Labels {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    s.namespaces
        .as_ref()
        .and_then(|c| c.get("", ns))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default()
}

/// [`start`] with the daemon's settings; a socket that cannot be bound is logged (the report
/// then falls back to the kernel alone), never fatal.
pub fn start_for(
    cfg: &crate::config::Config,
    backend: Backend,
    state: &State,
    ledger: Ledger,
    pods: &PodCache,
    namespaces: Option<&NamespaceCache>,
    jobs: &Jobs,
) {
    let sources = Sources {
        node: cfg.view.node_name.clone(),
        backend,
        proc_root: cfg.view.proc_root.clone(),
        policy: match cfg.ambient.enabled {
            true => cfg.ambient_policy(),
            false => cfg.sidecar_policy(),
        },
        ambient: cfg.ambient.enabled,
        pods: pods.clone(),
        namespaces: namespaces.cloned(),
        ledger,
        interval: cfg.reconcile.interval,
    };
    if let Err(e) = start(&cfg.installer.run_dir, sources, state, jobs) {
        tracing::warn!(error = %e, socket = STATUS_SOCKET, "the enrollment report is not served: `istio-nftables status` reads the kernel alone");
    }
}
