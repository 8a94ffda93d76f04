//! The daemon: wires the node's jobs together. Decide the node backend, serve health/metrics,
//! start the Kubernetes-facing jobs (guardian, ambient agent) on the node's one pod watch, run
//! the installer's watch-and-repair loop until SIGTERM/SIGINT, then stop the jobs in order
//! (`node_status::jobs`: watches, consumers, servers) and clean up. Runs on a
//! current-thread runtime: the work is a few file operations per change, and one thread keeps
//! RSS and CPU small on every node.

use crate::config::Config;
use cni_installer::install::Installer;
use cni_installer::run::StopSignal;
use cni_installer::upgrade::{self, Shutdown};
use cni_installer::watch::{Filter, Watch};
use node_status::State;
use node_status::jobs::{Jobs, Stage};
use node_view::cache::{NamespaceCache, PodCache};
use std::sync::Arc;
use std::time::Duration;

/// How long the jobs have to stop at shutdown, all stages together: well inside the pod's
/// grace period, so the uninstall after them always runs.
pub const DRAIN_WITHIN: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Bind(#[from] node_status::http::BindError),
    #[error("starting the inotify watcher: {0}")]
    Watch(#[from] notify::Error),
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
    /// The uninstall left something behind (each error logged): the exit status says so.
    #[error("the uninstall is incomplete: {0} error(s), logged above")]
    Uninstall(usize),
}

fn shutdown_signal() -> Result<StopSignal, DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }))
}

pub async fn main(cfg: Config) -> Result<(), DaemonError> {
    let i = &cfg.installer;
    tracing::info!(
        chained = i.chained,
        net_dir = %i.net_dir.display(),
        run_dir = %i.run_dir.display(),
        bin_dirs = ?i.bin_target_dirs,
        cni_conf_name = i.cni_conf_name.as_deref().unwrap_or(""),
        "install-cni starting"
    );
    let shutdown = shutdown_signal()?;
    if let Some(host) = &cfg.host_netns {
        // Istio's chart: this pod is not in the host's network; node-level work goes there.
        match redirect::host_netns::switch_to(host) {
            Ok(()) => {
                tracing::info!(netns = %host.display(), "node-level work (host probe rule, backend probe) runs in the host's network namespace (ALLOW_SWITCH_TO_HOST_NS)")
            }
            Err(e) => tracing::warn!(error = %e, "ALLOW_SWITCH_TO_HOST_NS"),
        }
    }
    let backend = redirect::node::decide_here(cfg.backend_choice, cfg.native_nftables).backend;
    let state = Arc::new(State::new());
    // Before the first pass: the plugin's STATUS follows every readiness change from here on.
    state.set_publisher(node_status::readiness::Publisher::start(&i.run_dir));
    let jobs = Jobs::new();
    if let Err(e) = node_status::plugin_log::start(&i.run_dir, &jobs) {
        tracing::warn!(error = %e, "the plugin's lines stay in its own log file");
    }
    node_status::http::listen(
        cfg.listen_address,
        cfg.health_port,
        cfg.monitoring_port,
        state.clone(),
    )
    .await?;

    let entry = cfg.plugin_settings(backend).to_plugin_entry();
    let watch = Watch::new(Filter::new(i))?;
    let installer = Installer::new(i.clone(), entry);
    state.register(installer.metrics.clone());
    let guardian_metrics = guardian::metrics::Metrics::registered(&state);
    // After the listeners (metrics must be up to count repairs), before the install loop (Istio's
    // order); never blocks the install: the watches connect and retry on their own.
    let _pod_cache = start_kubernetes_jobs(&cfg, backend, &state, &guardian_metrics, &jobs).await;
    let (installer, signal) =
        cni_installer::run::run(installer, state.clone(), watch, shutdown).await;
    match stop(&cfg, installer, &state, &jobs, signal).await {
        0 => Ok(()),
        errors => Err(DaemonError::Uninstall(errors)),
    }
}

/// Shutdown: readiness goes first; then the jobs stop in order (no job acts on a pod while the
/// install goes); then, unless the safe upgrade keeps the install for the next daemon (its
/// DaemonSet lives on: a rollout), the install (and the host probe rule) is removed. Returns
/// how many errors the uninstall logged.
async fn stop(
    cfg: &Config,
    mut installer: Installer,
    state: &State,
    jobs: &Jobs,
    signal: &str,
) -> usize {
    state.set_not_ready("shutting down");
    state.release_readiness();
    let drained = jobs.drain(DRAIN_WITHIN).await;
    tracing::info!(
        signal,
        stopped = drained.stopped.len(),
        aborted = ?drained.aborted,
        panics = ?drained.panicked,
        "shutting down; jobs drained"
    );
    let client = node_view::client::client(&cfg.view.api);
    match upgrade::shutdown(&cfg.safe_upgrade, client).await {
        Shutdown::Upgrade(why) => {
            tracing::info!(signal, %why, "shutting down; safe upgrade: the plugin stays installed (and in ambient mode the host probe rule)");
            return 0;
        }
        Shutdown::Uninstall(why) => {
            tracing::info!(signal, %why, "shutting down; removing the install")
        }
    }
    let mut failed = 0;
    if cfg.ambient.enabled {
        // Istio's Stop: the branch ENI probe rules it added go with the host rule.
        ambient_agent::flush_branch_eni().await;
        // Both backends': the node's backend decision may have changed between runs.
        match redirect::host_probe::remove_all_backends() {
            Ok(_) => tracing::info!("cleanup: host probe rule removed"),
            Err(e) => {
                failed += 1;
                tracing::warn!("cleanup: removing the host probe rule: {e}")
            }
        }
    }
    let (done, errors) = installer.cleanup();
    for d in done {
        tracing::info!("cleanup: {d}");
    }
    for e in &errors {
        tracing::warn!("cleanup: {e}");
    }
    failed + errors.len()
}

/// The jobs that talk to the API server, each when enabled: the node pod cache (ONE list +
/// watch) and its consumers (the repair controller, the continuous reconciler, the ambient
/// node agent), and the node taint's removal. Returns the cache (`None`: no pod watch).
async fn start_kubernetes_jobs(
    cfg: &Config,
    backend: redirect::Backend,
    state: &Arc<State>,
    metrics: &guardian::metrics::Metrics,
    jobs: &Jobs,
) -> Option<PodCache> {
    if !cfg.repair.enabled {
        tracing::info!("repair controller disabled (REPAIR_ENABLED=false)");
    }
    if !cfg.reconcile.enabled {
        tracing::info!("continuous reconcile disabled (RECONCILE_ENABLED=false)");
    }
    let watches_pods = cfg.repair.enabled || cfg.reconcile.enabled || cfg.ambient.enabled;
    if !watches_pods && cfg.node_taint_key.is_none() {
        return None;
    }
    let client = match node_view::client::client(&cfg.view.api).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "repair controller, reconcile, the ambient agent and the node taint's removal not started: no Kubernetes client");
            return None;
        }
    };
    if let Some(key) = &cfg.node_taint_key {
        guardian::taint::start(
            key.clone(),
            cfg.view.node_name.clone(),
            client.clone(),
            state,
            jobs,
        );
    }
    watches_pods.then(|| start_pod_consumers(cfg, backend, state, metrics, client, jobs))
}

/// The node pod cache and namespace cache, their consumers subscribed before either runs (so
/// every consumer sees the first list whole).
fn start_pod_consumers(
    cfg: &Config,
    backend: redirect::Backend,
    state: &Arc<State>,
    metrics: &guardian::metrics::Metrics,
    client: kube::Client,
    jobs: &Jobs,
) -> PodCache {
    let cache = PodCache::new();
    state.register(Arc::new(cache.clone()));
    let node = cfg.guarded_node(backend);
    if cfg.repair.enabled {
        let settings = guardian::repair::Settings {
            repair: cfg.repair.clone(),
            node: node.clone(),
        };
        let repaired = metrics.repaired.clone();
        guardian::repair::start(settings, repaired, client.clone(), cache.subscribe(), jobs);
    }
    // ONE namespace list + watch, for whoever reads namespaces' labels or annotations.
    let controller_mode = cfg.reconcile.enabled && cfg.reconcile.controller_mode;
    let namespaces = (cfg.ambient.enabled || controller_mode).then(NamespaceCache::new);
    if cfg.reconcile.enabled {
        let repair = cfg.repair.enabled.then(|| cfg.repair.clone());
        let settings =
            guardian::reconcile::Settings::new(&cfg.reconcile, node, repair, namespaces.as_ref());
        guardian::reconcile::start(settings, metrics.reconcile(), client.clone(), &cache, jobs);
    }
    let caches = node_view::lookup::Caches {
        pods: cache.clone(),
        namespaces: namespaces.clone(),
    };
    if let Err(e) = node_view::lookup::start(&cfg.installer.run_dir, caches, jobs) {
        tracing::warn!(error = %e, "the plugin looks pods up in the API server itself");
    }
    if let (true, Some(ns)) = (cfg.ambient.enabled, &namespaces) {
        let agent_node = ambient_agent::NodeContext {
            policy: cfg.ambient_policy(),
            proc_root: cfg.view.proc_root.clone(),
            run_dir: cfg.installer.run_dir.clone(),
            backend,
            reconcile_interval: cfg.reconcile.enabled.then_some(cfg.reconcile.interval),
        };
        let ctx = ambient_agent::JobContext {
            client: client.clone(),
            pods: cache.clone(),
            namespaces: ns.clone(),
            state: state.clone(),
            checks: metrics.checks.clone(),
            jobs: jobs.clone(),
        };
        ambient_agent::start(&cfg.ambient, agent_node, ctx);
    }
    let ledger = metrics.ledger.clone();
    crate::status::start_for(
        cfg,
        backend,
        state,
        ledger,
        &cache,
        namespaces.as_ref(),
        jobs,
    );
    let timeout = cfg.view.watch_timeout;
    if let Some(ns) = namespaces {
        let watch = ns.run(kube::Api::all(client.clone()), timeout);
        jobs.spawn("namespace watch", Stage::Watch, watch);
    }
    let node_name = cfg.view.node_name.clone();
    let watch = cache
        .clone()
        .run(kube::Api::all(client), node_name, timeout);
    jobs.spawn("pod watch", Stage::Watch, watch);
    cache
}
