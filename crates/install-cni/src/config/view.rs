//! The node's identity and its way to the API server (`KUBERNETES_SERVICE_*`, the service
//! account, `KUBECONFIG`, the node name, the host's /proc, the watch timeout).

use super::{ConfigError, absolute, bad, parse_bool};
use clap::{ArgAction, Args};
use node_view::client::ApiServer;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct ViewArgs {
    /// CA bundle for the API server (empty: <SERVICE_ACCOUNT_DIR>/ca.crt).
    #[arg(long, env = "KUBE_CA_FILE", default_value = "")]
    pub kube_ca_file: String,

    /// Write insecure-skip-tls-verify instead of the CA into the kubeconfig.
    #[arg(long, env = "SKIP_TLS_VERIFY", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub skip_tls_verify: bool,

    /// API server host for the plugin's kubeconfig (set by Kubernetes in every pod).
    #[arg(long, env = "KUBERNETES_SERVICE_HOST", default_value = "")]
    pub kubernetes_service_host: String,

    /// API server port for the plugin's kubeconfig.
    #[arg(long, env = "KUBERNETES_SERVICE_PORT", default_value = "443")]
    pub kubernetes_service_port: u16,

    /// http | https.
    #[arg(long, env = "KUBERNETES_SERVICE_PROTOCOL", default_value = "https", value_parser = ["http", "https"])]
    pub kubernetes_service_protocol: String,

    /// Projected service-account directory (token, ca.crt), watched for token rotation.
    #[arg(
        long,
        env = "SERVICE_ACCOUNT_DIR",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount"
    )]
    pub service_account_dir: PathBuf,

    /// This node's name (the chart sets it from spec.nodeName; empty: KUBERNETES_NODE_NAME,
    /// NODE_NAME, then the hostname).
    #[arg(long, env = "REPAIR_NODE_NAME", default_value = "")]
    pub repair_node_name: String,

    /// Fallback for REPAIR_NODE_NAME (Istio's K8sNodeName).
    #[arg(long, env = "KUBERNETES_NODE_NAME", default_value = "")]
    pub kubernetes_node_name: String,

    /// The next fallback: Istio's agent's own name for this node (its pod watch's
    /// spec.nodeName and its shutdown's Node).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    pub node_name: String,

    /// The host's /proc as mounted in the container (pod network namespaces are found there;
    /// `<dir>/1/ns/net` is the host's).
    #[arg(long, env = "REPAIR_PROC_ROOT", default_value = "/host/proc")]
    pub repair_proc_root: PathBuf,

    /// timeoutSeconds of the node pod cache's watch: the API server ends a quiet watch then
    /// and the cache resumes; a watch still silent 2 s later counts as hung and is re-listed.
    #[arg(long, env = "POD_WATCH_TIMEOUT_SECONDS", default_value = "290", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub pod_watch_timeout_seconds: u64,

    /// Kubeconfig for the daemon's own API client (empty: in-cluster, from
    /// KUBERNETES_SERVICE_* and the service-account directory).
    #[arg(long, env = "KUBECONFIG", default_value = "")]
    pub kubeconfig: String,
}

/// `needs_node`: some job watches this node's pods, so its name must be known.
pub fn settings(a: &ViewArgs, needs_node: bool) -> Result<node_view::Settings, ConfigError> {
    Ok(node_view::Settings {
        api: api_server(a)?,
        node_name: node_name(a, needs_node)?,
        proc_root: absolute("REPAIR_PROC_ROOT", &a.repair_proc_root)?.to_path_buf(),
        watch_timeout: Duration::from_secs(a.pod_watch_timeout_seconds),
    })
}

fn api_server(a: &ViewArgs) -> Result<ApiServer, ConfigError> {
    let host = a.kubernetes_service_host.trim().to_string();
    if host.is_empty() {
        return Err(bad(
            "KUBERNETES_SERVICE_HOST",
            "",
            "not set (Kubernetes sets it in every pod; set it explicitly outside a pod)",
        ));
    }
    if host.contains('/') || host.contains(' ') || host.starts_with('[') {
        return Err(bad(
            "KUBERNETES_SERVICE_HOST",
            host,
            "expected a bare hostname or IP address (no scheme, port or brackets)",
        ));
    }
    // A ':' only as part of an IPv6 address (bracketed in the URL): `host:1` would make
    // `https://host:1:443`, a zoned `fe80::1%lo` a URL the plugin's client cannot parse.
    if host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(bad(
            "KUBERNETES_SERVICE_HOST",
            host,
            "a ':' outside an IPv6 address (the port belongs in KUBERNETES_SERVICE_PORT; zoned link-local addresses are not supported)",
        ));
    }
    if a.kubernetes_service_port == 0 {
        return Err(bad(
            "KUBERNETES_SERVICE_PORT",
            "0",
            "expected a port in 1..65535",
        ));
    }
    absolute("SERVICE_ACCOUNT_DIR", &a.service_account_dir)?;
    let ca_file = if a.kube_ca_file.trim().is_empty() {
        a.service_account_dir.join("ca.crt")
    } else {
        PathBuf::from(a.kube_ca_file.trim())
    };
    let kubeconfig = a.kubeconfig.trim();
    Ok(ApiServer {
        host,
        port: a.kubernetes_service_port,
        protocol: a.kubernetes_service_protocol.clone(),
        ca_file,
        skip_tls_verify: a.skip_tls_verify,
        service_account_dir: a.service_account_dir.clone(),
        kubeconfig: (!kubeconfig.is_empty()).then(|| PathBuf::from(kubeconfig)),
    })
}

fn node_name(a: &ViewArgs, needs_node: bool) -> Result<String, ConfigError> {
    let node_name = [&a.repair_node_name, &a.kubernetes_node_name, &a.node_name]
        .into_iter()
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(hostname);
    if needs_node && node_name.is_empty() {
        return Err(bad(
            "REPAIR_NODE_NAME",
            "",
            "not set and neither KUBERNETES_NODE_NAME, NODE_NAME nor the hostname gives the node name",
        ));
    }
    if node_name.contains(',') || node_name.contains('=') {
        return Err(bad("REPAIR_NODE_NAME", node_name, "not a node name"));
    }
    Ok(node_name)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}
