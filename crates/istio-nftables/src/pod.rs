//! `explain --pod NAMESPACE/NAME`: the pod's network namespace, found as the node daemon finds
//! it: the pod's IP from the Kubernetes API (`--kubeconfig`, else `KUBECONFIG`, else in-cluster
//! through `node_view::client`), then the namespace holding that IP through the host's /proc
//! (`node_view::running::locate`). Works for sidecar and ambient pods alike.

use explain::ExplainError;
use k8s_openapi::api::core::v1::Pod;
use node_view::client::ApiServer;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the one GET may take.
const GET_TIMEOUT: Duration = Duration::from_secs(15);

fn bad(pod: &str, why: impl Into<String>) -> ExplainError {
    ExplainError::BadInput {
        arg: "--pod",
        value: pod.to_string(),
        why: why.into(),
    }
}

/// `NAMESPACE/NAME`: a namespace name (an RFC 1123 label) and a pod name (an RFC 1123
/// subdomain), as the API server accepts them; anything else is refused before it could
/// reach a URL.
pub fn parse(spec: &str) -> Result<(String, String), ExplainError> {
    let Some((ns, name)) = spec.split_once('/') else {
        return Err(bad(spec, "expected NAMESPACE/NAME"));
    };
    if !is_label(ns) {
        return Err(bad(
            spec,
            format!(
                "namespace {ns:?} is not a valid namespace name (at most 63 lower-case \
                 letters, digits and '-', starting and ending with a letter or digit)"
            ),
        ));
    }
    if name.len() > 253 || !name.split('.').all(is_label) {
        return Err(bad(
            spec,
            format!(
                "{name:?} is not a valid pod name (at most 253 characters: lower-case \
                 letters, digits, '-' and '.', each dot-separated part starting and ending \
                 with a letter or digit)"
            ),
        ));
    }
    Ok((ns.to_string(), name.to_string()))
}

/// An RFC 1123 label: 1-63 of `[a-z0-9-]`, starting and ending alphanumeric.
fn is_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// How to reach the API server: the kubeconfig given, else `KUBECONFIG`, else in-cluster.
fn api_server(kubeconfig: Option<&Path>) -> Result<ApiServer, ExplainError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let kubeconfig = kubeconfig
        .map(Path::to_path_buf)
        .or_else(|| env("KUBECONFIG").map(PathBuf::from));
    let host = env("KUBERNETES_SERVICE_HOST");
    if kubeconfig.is_none() && host.is_none() {
        return Err(ExplainError::BadInput {
            arg: "--kubeconfig",
            value: String::new(),
            why: "--pod needs the Kubernetes API: give --kubeconfig or KUBECONFIG, or run in a \
                  pod (KUBERNETES_SERVICE_HOST)"
                .into(),
        });
    }
    let port = match env("KUBERNETES_SERVICE_PORT") {
        Some(p) => p.trim().parse().map_err(|_| ExplainError::BadInput {
            arg: "KUBERNETES_SERVICE_PORT",
            value: p.clone(),
            why: "not a port".into(),
        })?,
        None => 443,
    };
    let sa = PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount");
    Ok(ApiServer {
        host: host.unwrap_or_default(),
        port,
        protocol: "https".into(),
        ca_file: sa.join("ca.crt"),
        skip_tls_verify: false,
        service_account_dir: sa,
        kubeconfig,
    })
}

/// The pod's network namespace under `proc_root` (`<proc_root>/<pid>/ns/net`).
pub fn netns_of(
    spec: &str,
    kubeconfig: Option<&Path>,
    proc_root: &Path,
) -> Result<PathBuf, ExplainError> {
    let (ns, name) = parse(spec)?;
    let api = api_server(kubeconfig)?;
    let pod = get(&api, &ns, &name, spec)?;
    let ip = pod_ip(&pod, spec)?;
    tracing::debug!(pod = spec, %ip, "looking for the pod's network namespace");
    node_view::running::locate(proc_root, ip, pod.metadata.uid.as_deref()).map_err(|e| {
        bad(
            spec,
            format!("pod IP {ip}: {e} (is the pod running on this node?)"),
        )
    })
}

fn io(spec: &str, what: impl std::fmt::Display) -> ExplainError {
    ExplainError::Io {
        context: format!("looking up pod {spec}"),
        source: std::io::Error::other(what.to_string()),
    }
}

fn get(api: &ApiServer, ns: &str, name: &str, spec: &str) -> Result<Pod, ExplainError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| io(spec, e))?;
    let found = rt.block_on(async {
        let client = node_view::client::client(api).await.map_err(|e| match e {
            node_view::client::ClientError::Kubeconfig { path, source } => ExplainError::BadInput {
                arg: "--kubeconfig",
                value: path.display().to_string(),
                why: source.to_string(),
            },
            other => io(spec, other),
        })?;
        let pods: kube::Api<Pod> = kube::Api::namespaced(client, ns);
        match tokio::time::timeout(GET_TIMEOUT, pods.get_opt(name)).await {
            Ok(r) => r.map_err(|e| io(spec, e)),
            Err(_) => Err(io(
                spec,
                format!("no answer from the API server within {GET_TIMEOUT:?}"),
            )),
        }
    })?;
    found.ok_or_else(|| bad(spec, "no such pod"))
}

/// The pod's first IP; host-network, finished (phase Succeeded or Failed: the node daemon
/// treats them as gone, their namespace may hold another pod's IP) and IP-less pods are
/// refused by name.
fn pod_ip(pod: &Pod, spec: &str) -> Result<IpAddr, ExplainError> {
    if let Some(phase) = pod_policy::bypass::terminal(pod) {
        return Err(bad(
            spec,
            format!("has finished ({phase}): its containers are not running"),
        ));
    }
    if pod_policy::bypass::host_network(pod) {
        return Err(bad(
            spec,
            "runs on the host network: its connections are the node's (see --host)",
        ));
    }
    let Some(ip) = pod_policy::bypass::status_ip(pod) else {
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "unknown".into());
        return Err(bad(spec, format!("has no IP yet (phase {phase})")));
    };
    ip.parse()
        .map_err(|_| bad(spec, format!("its status has an invalid IP {ip:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_are_namespace_slash_name() {
        assert_eq!(
            parse("default/web-1").unwrap(),
            ("default".into(), "web-1".into())
        );
        assert_eq!(
            parse("kube-system/web.v1-0").unwrap(),
            ("kube-system".into(), "web.v1-0".into())
        );
        let long_ns = format!("{}/web", "a".repeat(64));
        let long_name = format!("default/{}", vec!["a".repeat(63); 4].join("."));
        for bad in [
            "web",
            "/web",
            "default/",
            "a/b/c",
            "",
            "default/web?x=1",
            "default/web%2Fx",
            "default/web#x",
            "Default/web",
            "default/Web",
            "default/-web",
            "default/web.",
            "default/web..x",
            "de fault/web",
            "../web",
            &long_ns,
            &long_name,
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.is_bad_input());
            assert!(e.to_string().contains("--pod"), "{e}");
        }
    }
}
