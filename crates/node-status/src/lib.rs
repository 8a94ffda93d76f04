//! What the node daemon tells the world, in one place every job reports into:
//!
//! - readiness: the [`readiness::Conditions`] (the install is valid; in ambient mode ztunnel is
//!   connected) behind `/readyz`, the node taint's removal, and the marker + liveness lock the
//!   plugin's CNI STATUS reads ([`readiness::Publisher`], the daemon's side of
//!   `cni_config::ready`);
//! - metrics: each job owns its counters ([`metrics`]) and registers them here; `/metrics`
//!   renders them in registration order, then the process' latency and failure histograms
//!   ([`figures`], [`histogram`]);
//! - the health and metrics listeners ([`http`]);
//! - the plugin's log lines, printed in the daemon's own log ([`plugin_log`]);
//! - every job's task, supervised, drained in order at shutdown ([`jobs`]).

pub mod figures;
pub mod histogram;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod plugin_log;
pub mod process;
pub mod readiness;

use metrics::Metrics;
use readiness::{Conditions, Publisher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Shared by every job of the daemon and the HTTP listeners.
#[derive(Default)]
pub struct State {
    /// The install pass is valid.
    installed: AtomicBool,
    /// Why we are not ready (shown on /readyz).
    reason: Mutex<String>,
    /// Ambient mode: whether ztunnel is connected (`None`: not in ambient mode).
    ztunnel: Mutex<Option<bool>>,
    /// The plugin's view of readiness (marker in the run dir), once started.
    publisher: OnceLock<Publisher>,
    /// Readiness transitions, for tasks that act on them (node taint removal).
    ready_tx: tokio::sync::watch::Sender<bool>,
    /// Every job's metrics, in exposition order.
    metrics: Mutex<Vec<Arc<dyn Metrics>>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("conditions", &self.conditions())
            .field("reason", &self.reason())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    pub fn new() -> State {
        let s = State::default();
        *lock(&s.reason) = "starting".into();
        s
    }

    /// The install pass is valid. Readiness for the plugin (and the node taint) is computed
    /// from all the [`Conditions`].
    pub fn set_ready(&self) {
        self.installed.store(true, Ordering::SeqCst);
        lock(&self.reason).clear();
        self.publish(&self.conditions());
    }

    pub fn set_not_ready(&self, reason: &str) {
        self.installed.store(false, Ordering::SeqCst);
        *lock(&self.reason) = reason.to_string();
        self.publish(&self.conditions());
    }

    /// Ambient mode: ztunnel's connection is a readiness condition (`None`: not ambient).
    pub fn set_ztunnel_connected(&self, connected: Option<bool>) {
        *lock(&self.ztunnel) = connected;
        self.publish(&self.conditions());
    }

    fn conditions(&self) -> Conditions {
        Conditions {
            installed: self.installed.load(Ordering::SeqCst),
            ztunnel_connected: *lock(&self.ztunnel),
        }
    }

    fn publish(&self, c: &Conditions) {
        if let Some(p) = self.publisher.get() {
            // The runtime's network readiness (CNI STATUS) must not wait for ztunnel: ztunnel
            // is itself a pod that needs the network. Ambient pods are safe without it: their
            // ADD fails closed while ztunnel is away.
            p.set(&Conditions {
                ztunnel_connected: None,
                ..c.clone()
            });
        }
        let ready = c.ready();
        self.ready_tx
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    /// From now on readiness is also published into the run dir for the plugin.
    pub fn set_publisher(&self, p: Publisher) {
        let _ = self.publisher.set(p);
    }

    /// Shutdown: the plugin's STATUS fails from now on (marker and lock file removed).
    pub fn release_readiness(&self) {
        if let Some(p) = self.publisher.get() {
            p.shutdown();
        }
    }

    /// Readiness transitions (`true`: ready).
    pub fn subscribe_ready(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready_tx.subscribe()
    }

    /// Installed, and (ambient mode) ztunnel connected.
    pub fn is_ready(&self) -> bool {
        self.conditions().ready()
    }

    /// Adds a job's metrics to `/metrics` (after those registered before).
    pub fn register(&self, m: Arc<dyn Metrics>) {
        lock(&self.metrics).push(m);
    }

    /// Prometheus text exposition (version 0.0.4): readiness, (ambient mode) Istio's
    /// `ztunnel_connected`, every registered job's, the latency and failure [`figures`], then
    /// the process' own (`process_*`).
    pub fn render_metrics(&self) -> String {
        let mut s = String::new();
        metrics::gauge(
            &mut s,
            "istio_cni_install_ready",
            "Whether the CNI plugin installation is ready or not",
            u64::from(self.is_ready()),
        );
        if let Some(connected) = *lock(&self.ztunnel) {
            metrics::gauge(
                &mut s,
                "ztunnel_connected",
                "number of connections to ztunnel",
                u64::from(connected),
            );
        }
        for m in lock(&self.metrics).iter() {
            m.render(&mut s);
        }
        figures::global().render(&mut s);
        process::render(&mut s);
        s
    }

    fn reason(&self) -> String {
        if self.installed.load(Ordering::SeqCst) && !self.conditions().ready() {
            return "ztunnel is not connected to the node agent".into();
        }
        lock(&self.reason).clone()
    }
}
