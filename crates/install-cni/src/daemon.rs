//! The daemon: decide the node backend, serve health/metrics, install, then watch and repair
//! until SIGTERM/SIGINT, then clean up. Runs on a current-thread runtime: the work is a few
//! file operations per change, and one thread keeps RSS and CPU small on every node.

use crate::config::Config;
use cni_config::PluginSettings;
use cni_installer::install::Installer;
use cni_installer::run::Shutdown;
use cni_installer::watch::{Filter, Watch};
use node_status::State;
use node_status::http::{self, Routes};
use node_view::cache::{NamespaceCache, PodCache};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting the inotify watcher: {0}")]
    Watch(#[from] notify::Error),
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
}

/// The plugin entry for this node: settings plus the backend decision.
pub fn plugin_settings(cfg: &Config, decision: &redirect::node::Decision) -> PluginSettings {
    PluginSettings {
        plugin_log_level: cfg.plugin_log_level.clone(),
        cni_agent_run_dir: cfg.run_dir.display().to_string(),
        exclude_namespaces: cfg.exclude_namespaces.clone(),
        pod_namespace: cfg.pod_namespace.clone(),
        native_nftables: decision.backend == redirect::Backend::Nft,
        redirect_backend: decision.backend.to_string(),
        ambient_enabled: cfg.ambient.enabled,
        enablement_selectors: if cfg.ambient.enabled {
            cfg.ambient.effective_selectors()
        } else {
            Vec::new()
        },
        enable_ambient_detection_retry: cfg.ambient.detection_retry,
        ..PluginSettings::default()
    }
}

pub fn decide_backend(cfg: &Config) -> redirect::node::Decision {
    redirect::node::decide_here(cfg.backend_choice, cfg.native_nftables)
}

fn shutdown_signal() -> Result<Shutdown, StartError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(StartError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(StartError::Signal)?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }))
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

pub async fn main(cfg: Config) -> Result<(), StartError> {
    tracing::info!(
        chained = cfg.chained,
        net_dir = %cfg.net_dir.display(),
        run_dir = %cfg.run_dir.display(),
        bin_dirs = ?cfg.bin_target_dirs,
        cni_conf_name = cfg.cni_conf_name.as_deref().unwrap_or(""),
        "install-cni starting"
    );
    let shutdown = shutdown_signal()?;
    let decision = decide_backend(&cfg);
    let entry = plugin_settings(&cfg, &decision).to_plugin_entry();
    let state = Arc::new(State::new());
    // Before the first pass: the plugin's STATUS follows every readiness change from here on.
    state.set_publisher(node_status::readiness::Publisher::start(&cfg.run_dir));

    let health_addr = SocketAddr::new(cfg.listen_address, cfg.health_port);
    let metrics_addr = SocketAddr::new(cfg.listen_address, cfg.monitoring_port);
    if cfg.health_port != 0 && cfg.health_port == cfg.monitoring_port {
        let l = bind("health+metrics", health_addr).await?;
        tracing::info!(health_addr = %local(&l), metrics_addr = %local(&l), "listening");
        tokio::spawn(http::serve(
            l,
            state.clone(),
            Routes {
                health: true,
                metrics: true,
            },
        ));
    } else {
        let h = bind("health (HEALTH_PORT)", health_addr).await?;
        let m = bind("metrics (MONITORING_PORT)", metrics_addr).await?;
        tracing::info!(health_addr = %local(&h), metrics_addr = %local(&m), "listening");
        tokio::spawn(http::serve(
            h,
            state.clone(),
            Routes {
                health: true,
                metrics: false,
            },
        ));
        tokio::spawn(http::serve(
            m,
            state.clone(),
            Routes {
                health: false,
                metrics: true,
            },
        ));
    }

    // After the listeners (metrics must be up to count repairs), before the install loop (Istio's
    // order); never blocks the install: the watch connects and retries on its own.
    let _pod_cache = start_pod_consumers(&cfg, decision.backend, state.clone()).await;
    crate::taint::start(&cfg, &state).await;

    let settings = cfg.installer();
    let watch = Watch::new(Filter::new(&settings))?;
    let installer = Installer::new(settings, entry);
    state.register(installer.metrics.clone());
    let (mut installer, signal) =
        cni_installer::run::run(installer, state.clone(), watch, shutdown).await;

    state.set_not_ready("shutting down");
    state.release_readiness();
    if let Some(crate::ambient::upgrade::Shutdown::Upgrade(why)) = ambient_shutdown(&cfg).await {
        tracing::info!(signal, %why, "shutting down; ambient safe upgrade: the plugin and the host probe rule stay");
        return Ok(());
    }
    tracing::info!(signal, "shutting down; removing the install");
    if cfg.ambient.enabled {
        match nft_backend::ambient_host::remove_all() {
            Ok(_) => tracing::info!("cleanup: host probe rule removed"),
            Err(e) => tracing::warn!("cleanup: removing the host probe rule: {e}"),
        }
    }
    let (done, errors) = installer.cleanup();
    for d in done {
        tracing::info!("cleanup: {d}");
    }
    for e in errors {
        tracing::warn!("cleanup: {e}");
    }
    Ok(())
}

/// Ambient mode: upgrade or uninstall (`None` outside ambient mode).
async fn ambient_shutdown(cfg: &Config) -> Option<crate::ambient::upgrade::Shutdown> {
    use crate::ambient::upgrade;
    if !cfg.ambient.enabled {
        return None;
    }
    let lookup = match node_view::client::client(&cfg.api_server()).await {
        Ok(c) => upgrade::lookup(c, &cfg.pod_namespace).await,
        Err(e) => Err(e.to_string()),
    };
    Some(upgrade::decide(cfg.ambient.disable_safe_upgrade, lookup))
}

/// The node pod cache (ONE list + watch) and its consumers, the repair controller, the
/// continuous reconciler and the ambient node agent, each when enabled; no watch when none
/// is. Returns the cache.
async fn start_pod_consumers(
    cfg: &Config,
    backend: redirect::Backend,
    state: Arc<State>,
) -> Option<PodCache> {
    if !cfg.repair.enabled {
        tracing::info!("repair controller disabled (REPAIR_ENABLED=false)");
    }
    if !cfg.reconcile.enabled {
        tracing::info!("continuous reconcile disabled (RECONCILE_ENABLED=false)");
    }
    if !cfg.repair.enabled && !cfg.reconcile.enabled && !cfg.ambient.enabled {
        return None;
    }
    let client = match node_view::client::client(&cfg.api_server()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "repair controller, reconcile and the ambient agent not started: no Kubernetes client");
            return None;
        }
    };
    let cache = PodCache::new();
    state.register(Arc::new(cache.clone()));
    // Subscribe before the cache runs: every consumer sees the first list whole.
    // One family, two reporters: the reconciler and the ambient agent.
    let checks = Arc::new(node_status::metrics::pod_rules_checks());
    if cfg.reconcile.enabled || cfg.ambient.enabled {
        state.register(checks.clone());
    }
    if cfg.repair.enabled {
        crate::repair::start(cfg, backend, &state, client.clone(), cache.subscribe());
    }
    // ONE namespace list + watch, for whoever reads namespaces' labels or annotations.
    let controller_mode = cfg.reconcile.enabled && cfg.reconcile.controller_mode;
    let namespaces = (cfg.ambient.enabled || controller_mode).then(NamespaceCache::new);
    if cfg.reconcile.enabled {
        crate::reconcile::start(
            cfg,
            backend,
            &state,
            checks.clone(),
            client.clone(),
            &cache,
            namespaces.as_ref(),
        );
    }
    if let (true, Some(ns)) = (cfg.ambient.enabled, &namespaces) {
        crate::ambient::start(cfg, backend, state, checks, client.clone(), &cache, ns);
    }
    if let Some(ns) = namespaces {
        tokio::spawn(ns.run(kube::Api::all(client.clone()), cfg.pod_watch_timeout));
    }
    tokio::spawn(cache.clone().run(
        kube::Api::all(client),
        cfg.repair.node_name.clone(),
        cfg.pod_watch_timeout,
    ));
    Some(cache)
}

fn local(l: &TcpListener) -> String {
    l.local_addr().map(|a| a.to_string()).unwrap_or_default()
}
