//! /healthz, /readyz and Prometheus /metrics over a minimal HTTP/1.1 responder on tokio (no web
//! framework: three fixed GET routes do not justify the binary size or the RSS).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Istio's `result` label values, in exposition order.
pub const RESULTS: [&str; 4] = [
    "SUCCESS",
    "COPY_BINARIES_FAILURE",
    "CREATE_KUBECONFIG_FAILURE",
    "CREATE_CNI_CONFIG_FAILURE",
];

/// `type` and `result` label values of `istio_cni_repair_pods_repaired_total`.
pub const REPAIR_TYPES: [&str; 3] = ["repair", "delete", "label"];
pub const REPAIR_RESULTS: [&str; 3] = ["success", "fail", "skip"];

/// `result` label values of `istio_cni_pod_rules_checks_total`: a check finds the rules `ok`
/// or in `drift` (or cannot be made: `failed`); a drift is then `repaired`, `migrated` (the
/// rules were on the other backend than the node's), or counts `failed`.
pub const CHECK_RESULTS: [&str; 5] = ["ok", "drift", "repaired", "migrated", "failed"];

/// Shared between the install loop and the HTTP servers.
#[derive(Debug, Default)]
pub struct State {
    ready: AtomicBool,
    /// Why we are not ready (shown on /readyz).
    reason: Mutex<String>,
    installs: [AtomicU64; 4],
    /// Indexed `type * 3 + result` (REPAIR_TYPES × REPAIR_RESULTS).
    repaired: [AtomicU64; 9],
    /// Reconcile outcomes, indexed like [`CHECK_RESULTS`].
    checks: [AtomicU64; CHECK_RESULTS.len()],
    /// Mesh pods the reconciler tracks.
    reconciled_pods: AtomicU64,
    /// The node pod cache, once started (its counters are exported).
    pod_cache: std::sync::OnceLock<crate::podcache::PodCache>,
    /// The plugin's view of readiness (marker in the run dir), once started.
    publisher: std::sync::OnceLock<crate::readiness::Publisher>,
    /// Readiness transitions, for tasks that act on them (node taint removal).
    ready_tx: tokio::sync::watch::Sender<bool>,
    /// Ambient mode: whether ztunnel is connected (`None`: not in ambient mode).
    ztunnel: Mutex<Option<bool>>,
}

impl State {
    pub fn new() -> State {
        let s = State::default();
        *s.reason.lock().unwrap_or_else(|e| e.into_inner()) = "starting".into();
        s
    }

    /// The install pass is valid. Readiness for the plugin (and the node taint) is computed
    /// from the conditions in `readiness::Conditions`: the ambient work adds ztunnel there.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.publish(&self.conditions());
    }

    pub fn set_not_ready(&self, reason: &str) {
        self.ready.store(false, Ordering::SeqCst);
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason.to_string();
        self.publish(&self.conditions());
    }

    /// Ambient mode: ztunnel's connection is a readiness condition (`None`: not ambient).
    pub fn set_ztunnel_connected(&self, connected: Option<bool>) {
        *self.ztunnel.lock().unwrap_or_else(|e| e.into_inner()) = connected;
        self.publish(&self.conditions());
    }

    fn conditions(&self) -> crate::readiness::Conditions {
        crate::readiness::Conditions {
            installed: self.ready.load(Ordering::SeqCst),
            ztunnel_connected: *self.ztunnel.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    fn publish(&self, c: &crate::readiness::Conditions) {
        if let Some(p) = self.publisher.get() {
            // The runtime's network readiness (CNI STATUS) must not wait for ztunnel: ztunnel
            // is itself a pod that needs the network. Ambient pods are safe without it: their
            // ADD fails closed while ztunnel is away.
            p.set(&crate::readiness::Conditions {
                ztunnel_connected: None,
                ..c.clone()
            });
        }
        let ready = c.ready();
        self.ready_tx
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    /// From now on readiness is also published into the run dir for the plugin.
    pub fn set_publisher(&self, p: crate::readiness::Publisher) {
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

    pub fn count(&self, result: &str) {
        if let Some(i) = RESULTS.iter().position(|r| *r == result) {
            self.installs[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn installs(&self, result: &str) -> u64 {
        RESULTS
            .iter()
            .position(|r| *r == result)
            .map_or(0, |i| self.installs[i].load(Ordering::Relaxed))
    }

    fn repair_index(kind: &str, result: &str) -> Option<usize> {
        let t = REPAIR_TYPES.iter().position(|x| *x == kind)?;
        let r = REPAIR_RESULTS.iter().position(|x| *x == result)?;
        Some(t * REPAIR_RESULTS.len() + r)
    }

    /// One repair-controller outcome (`kind`: repair|delete|label, `result`: success|fail|skip).
    pub fn count_repair(&self, kind: &str, result: &str) {
        if let Some(i) = Self::repair_index(kind, result) {
            self.repaired[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn repaired(&self, kind: &str, result: &str) -> u64 {
        Self::repair_index(kind, result).map_or(0, |i| self.repaired[i].load(Ordering::Relaxed))
    }

    /// One reconcile outcome (`result`: one of [`CHECK_RESULTS`]).
    pub fn count_check(&self, result: &str) {
        if let Some(i) = CHECK_RESULTS.iter().position(|r| *r == result) {
            self.checks[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn checks(&self, result: &str) -> u64 {
        CHECK_RESULTS
            .iter()
            .position(|r| *r == result)
            .map_or(0, |i| self.checks[i].load(Ordering::Relaxed))
    }

    pub fn set_reconciled_pods(&self, n: usize) {
        self.reconciled_pods.store(n as u64, Ordering::Relaxed);
    }

    fn render_checks(&self, s: &mut String) {
        s.push_str("# HELP istio_cni_pod_rules_checks_total Checks of mesh pods' live redirect rules against their plan, by result\n");
        s.push_str("# TYPE istio_cni_pod_rules_checks_total counter\n");
        for r in CHECK_RESULTS {
            s.push_str(&format!(
                "istio_cni_pod_rules_checks_total{{result=\"{r}\"}} {}\n",
                self.checks(r)
            ));
        }
        s.push_str(&format!(
            "# HELP istio_cni_reconcile_pods Mesh pods of this node whose rules are reconciled\n# TYPE istio_cni_reconcile_pods gauge\nistio_cni_reconcile_pods {}\n",
            self.reconciled_pods.load(Ordering::Relaxed)
        ));
    }

    /// Prometheus text exposition (version 0.0.4).
    pub fn render_metrics(&self) -> String {
        let mut s = String::new();
        s.push_str("# HELP istio_cni_installs_total Total number of CNI plugins installed by the Istio CNI installer\n");
        s.push_str("# TYPE istio_cni_installs_total counter\n");
        for (i, r) in RESULTS.iter().enumerate() {
            s.push_str(&format!(
                "istio_cni_installs_total{{result=\"{r}\"}} {}\n",
                self.installs[i].load(Ordering::Relaxed)
            ));
        }
        s.push_str(
            "# HELP istio_cni_install_ready Whether the CNI plugin installation is ready or not\n",
        );
        s.push_str("# TYPE istio_cni_install_ready gauge\n");
        s.push_str(&format!(
            "istio_cni_install_ready {}\n",
            u8::from(self.is_ready())
        ));
        s.push_str("# HELP istio_cni_repair_pods_repaired_total Total number of pods repaired by repair controller\n");
        s.push_str("# TYPE istio_cni_repair_pods_repaired_total counter\n");
        for t in REPAIR_TYPES {
            for r in REPAIR_RESULTS {
                s.push_str(&format!(
                    "istio_cni_repair_pods_repaired_total{{type=\"{t}\",result=\"{r}\"}} {}\n",
                    self.repaired(t, r)
                ));
            }
        }
        self.render_checks(&mut s);
        self.render_pod_cache(&mut s);
        s
    }

    pub fn set_pod_cache(&self, cache: crate::podcache::PodCache) {
        let _ = self.pod_cache.set(cache);
    }

    fn render_pod_cache(&self, s: &mut String) {
        let Some(c) = self.pod_cache.get() else {
            return;
        };
        let st = c.stats();
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
            s.push_str(&format!(
                "# HELP istio_cni_pod_cache_{name} {help}\n# TYPE istio_cni_pod_cache_{name} counter\nistio_cni_pod_cache_{name} {v}\n"
            ));
        }
        s.push_str(&format!(
            "# HELP istio_cni_pod_cache_pods Pods of this node in the cache\n# TYPE istio_cni_pod_cache_pods gauge\nistio_cni_pod_cache_pods {}\n",
            c.len()
        ));
    }

    fn reason(&self) -> String {
        if self.ready.load(Ordering::SeqCst) && !self.conditions().ready() {
            return "ztunnel is not connected to the node agent".into();
        }
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Which routes a listener serves.
#[derive(Clone, Copy, Debug)]
pub struct Routes {
    pub health: bool,
    pub metrics: bool,
}

fn respond(state: &State, routes: Routes, path: &str) -> (u16, &'static str, String) {
    let text = "text/plain; charset=utf-8";
    match path {
        "/healthz" if routes.health => (200, text, "ok\n".into()),
        "/readyz" if routes.health => {
            if state.is_ready() {
                (200, text, "ready\n".into())
            } else {
                (503, text, format!("not ready: {}\n", state.reason()))
            }
        }
        "/metrics" if routes.metrics => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            state.render_metrics(),
        ),
        _ => (404, text, "not found\n".into()),
    }
}

async fn handle(mut conn: TcpStream, state: &State, routes: Routes) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Only the request line matters; stop at the end of the headers or at 8 KiB.
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (code, ctype, body) = if method == "GET" || method == "HEAD" {
        respond(state, routes, path)
    } else {
        (405, "text/plain", "method not allowed\n".to_string())
    };
    let status = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {code} {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        conn.write_all(body.as_bytes()).await?;
    }
    conn.shutdown().await
}

/// Serves until the task is dropped. Each connection gets 5 s (a stuck scraper cannot pile up).
pub async fn serve(listener: TcpListener, state: std::sync::Arc<State>, routes: Routes) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let st = state.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), handle(conn, &st, routes)).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_and_metrics() {
        let s = State::new();
        let both = Routes {
            health: true,
            metrics: true,
        };
        assert_eq!(respond(&s, both, "/readyz").0, 503);
        assert!(respond(&s, both, "/readyz").2.contains("starting"));
        s.set_ready();
        s.count("SUCCESS");
        s.count("SUCCESS");
        s.count("CREATE_KUBECONFIG_FAILURE");
        assert_eq!(respond(&s, both, "/readyz").0, 200);
        let m = s.render_metrics();
        assert!(m.contains("istio_cni_installs_total{result=\"SUCCESS\"} 2\n"));
        assert!(m.contains("istio_cni_installs_total{result=\"CREATE_KUBECONFIG_FAILURE\"} 1\n"));
        assert!(m.contains("istio_cni_install_ready 1\n"));
        s.count_repair("repair", "success");
        s.count_repair("label", "skip");
        s.count_repair("bogus", "success");
        let m = s.render_metrics();
        assert!(m.contains(
            "istio_cni_repair_pods_repaired_total{type=\"repair\",result=\"success\"} 1\n"
        ));
        assert!(
            m.contains("istio_cni_repair_pods_repaired_total{type=\"label\",result=\"skip\"} 1\n")
        );
        assert!(
            m.contains("istio_cni_repair_pods_repaired_total{type=\"delete\",result=\"fail\"} 0\n")
        );
        s.count_check("drift");
        s.count_check("repaired");
        s.count_check("bogus");
        let m = s.render_metrics();
        assert!(m.contains("istio_cni_pod_rules_checks_total{result=\"drift\"} 1\n"));
        assert!(m.contains("istio_cni_pod_rules_checks_total{result=\"repaired\"} 1\n"));
        assert!(m.contains("istio_cni_pod_rules_checks_total{result=\"ok\"} 0\n"));
        let health_only = Routes {
            health: true,
            metrics: false,
        };
        assert_eq!(respond(&s, health_only, "/metrics").0, 404);
    }
}
