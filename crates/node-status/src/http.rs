//! /healthz, /readyz and Prometheus /metrics over a minimal HTTP/1.1 responder on tokio (no web
//! framework: three fixed GET routes do not justify the binary size or the RSS).

use crate::State;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, thiserror::Error)]
#[error("binding {what} on {addr}: {source}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { what, addr, source })
}

fn local(l: &TcpListener) -> String {
    l.local_addr().map(|a| a.to_string()).unwrap_or_default()
}

/// Binds the health and metrics listeners (one listener when both ports are the same) and
/// serves them in the background; port 0 takes any free port (logged). `metrics_port` `None`:
/// no metrics listener (Istio's `MONITORING_PORT` 0 or negative), logged as `metrics_addr=off`.
pub async fn listen(
    address: IpAddr,
    health_port: u16,
    metrics_port: Option<u16>,
    state: Arc<State>,
) -> Result<(), BindError> {
    let health_addr = SocketAddr::new(address, health_port);
    let routes = |health, metrics| Routes { health, metrics };
    match metrics_port {
        Some(port) if health_port != 0 && health_port == port => {
            let l = bind("health+metrics", health_addr).await?;
            tracing::info!(health_addr = %local(&l), metrics_addr = %local(&l), "listening");
            tokio::spawn(serve(l, state, routes(true, true)));
        }
        Some(port) => {
            let h = bind("health (HEALTH_PORT)", health_addr).await?;
            let metrics_addr = SocketAddr::new(address, port);
            let m = bind("metrics (MONITORING_PORT)", metrics_addr).await?;
            tracing::info!(health_addr = %local(&h), metrics_addr = %local(&m), "listening");
            tokio::spawn(serve(h, state.clone(), routes(true, false)));
            tokio::spawn(serve(m, state, routes(false, true)));
        }
        None => {
            let h = bind("health (HEALTH_PORT)", health_addr).await?;
            tracing::info!(health_addr = %local(&h), metrics_addr = %"off", "listening (MONITORING_PORT switches /metrics off)");
            tokio::spawn(serve(h, state, routes(true, false)));
        }
    }
    Ok(())
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
pub async fn serve(listener: TcpListener, state: Arc<State>, routes: Routes) {
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
    use crate::metrics::Counters;
    use std::sync::Arc;

    #[test]
    fn readiness_and_metrics() {
        let s = State::new();
        let both = Routes {
            health: true,
            metrics: true,
        };
        assert_eq!(respond(&s, both, "/readyz").0, 503);
        assert!(respond(&s, both, "/readyz").2.contains("starting"));
        let installs = Arc::new(Counters::by(
            "istio_cni_installs_total",
            "Installs",
            &["result"],
            &["SUCCESS", "CREATE_KUBECONFIG_FAILURE"],
        ));
        s.register(installs.clone());
        s.set_ready();
        installs.inc(&["SUCCESS"]);
        installs.inc(&["SUCCESS"]);
        installs.inc(&["CREATE_KUBECONFIG_FAILURE"]);
        assert_eq!(respond(&s, both, "/readyz").0, 200);
        let m = respond(&s, both, "/metrics").2;
        assert!(m.contains("istio_cni_installs_total{result=\"SUCCESS\"} 2\n"));
        assert!(m.contains("istio_cni_installs_total{result=\"CREATE_KUBECONFIG_FAILURE\"} 1\n"));
        assert!(m.contains("istio_cni_install_ready 1\n"));
        let health_only = Routes {
            health: true,
            metrics: false,
        };
        assert_eq!(respond(&s, health_only, "/metrics").0, 404);
        assert!(!m.contains("ztunnel_connected"), "not in ambient mode");
        assert!(m.contains("\nprocess_resident_memory_bytes "), "{m}");
        s.set_ztunnel_connected(Some(false));
        assert!(
            respond(&s, both, "/metrics")
                .2
                .contains("\nztunnel_connected 0\n")
        );
        s.set_ztunnel_connected(Some(true));
        assert!(
            respond(&s, both, "/metrics")
                .2
                .contains("\nztunnel_connected 1\n")
        );
        s.set_ztunnel_connected(Some(false));
        let (code, _, body) = respond(&s, both, "/readyz");
        assert_eq!(code, 503);
        assert!(body.contains("ztunnel"), "{body}");
    }
}
