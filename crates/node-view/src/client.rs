//! The daemon's API client: `KUBECONFIG` when given (tests, running outside a pod), else
//! in-cluster from KUBERNETES_SERVICE_* with the service account's CA and token file.

use kube::Client;
use kube::config::{AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig};
use kube::config::{NamedAuthInfo, NamedCluster, NamedContext};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How this node reaches the API server (Istio's `KUBERNETES_SERVICE_*`, the service account,
/// `KUBE_CA_FILE`, `SKIP_TLS_VERIFY`; `KUBECONFIG` overrides them all). The plugin's kubeconfig
/// is written from the same facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiServer {
    pub host: String,
    pub port: u16,
    pub protocol: String,
    pub ca_file: PathBuf,
    pub skip_tls_verify: bool,
    /// The projected service-account directory (`token`, `ca.crt`).
    pub service_account_dir: PathBuf,
    /// A kubeconfig to use instead of the in-cluster facts.
    pub kubeconfig: Option<PathBuf>,
}

impl ApiServer {
    /// The service account's token (re-read by kube on every request: rotation is free).
    pub fn token_file(&self) -> PathBuf {
        self.service_account_dir.join("token")
    }

    /// `protocol://host:port`, IPv6 hosts bracketed.
    pub fn server_url(&self) -> String {
        format!(
            "{}://{}",
            self.protocol,
            join_host_port(&self.host, self.port)
        )
    }
}

/// `host:port` with brackets for IPv6 literals (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("building the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("service-account token {0} is missing (not running in a pod?)")]
    NoToken(PathBuf),
    #[error(
        "service-account token {0} starts or ends with whitespace (a newline?): the client sends the file as it is, and the API server would refuse every request"
    )]
    TokenWhitespace(PathBuf),
}

/// The API client: `KUBECONFIG` when given (tests, running outside a pod), else in-cluster from
/// KUBERNETES_SERVICE_* with the service account's CA and token FILE (re-read by kube, so
/// projected-token rotation needs nothing from us).
pub async fn client(api: &ApiServer) -> Result<Client, ClientError> {
    let (kc, path) = match &api.kubeconfig {
        Some(p) => (
            Kubeconfig::read_from(p).map_err(|source| ClientError::Kubeconfig {
                path: p.clone(),
                source,
            })?,
            p.clone(),
        ),
        None => {
            let token = api.token_file();
            match std::fs::read_to_string(&token) {
                Err(_) => return Err(ClientError::NoToken(token)),
                Ok(t) if t.trim() != t => return Err(ClientError::TokenWhitespace(token)),
                Ok(_) => {}
            }
            (in_cluster(api), api.service_account_dir.clone())
        }
    };
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClientError::Kubeconfig { path, source })?;
    config.connect_timeout = Some(Duration::from_secs(10));
    // Longer than the watch's server-side timeout (290 s), so a quiet watch is not cut.
    config.read_timeout = Some(Duration::from_secs(300));
    config.write_timeout = Some(Duration::from_secs(10));
    // A watch line that never ends fails the watch instead of growing memory.
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&crate::line_cap::WatchLineCapLayer)
        .build())
}

fn in_cluster(api: &ApiServer) -> Kubeconfig {
    let mut cluster = Cluster {
        server: Some(api.server_url()),
        ..Default::default()
    };
    if api.skip_tls_verify {
        cluster.insecure_skip_tls_verify = Some(true);
    } else {
        cluster.certificate_authority = Some(api.ca_file.display().to_string());
    }
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: "in-cluster".into(),
            cluster: Some(cluster),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "install-cni".into(),
            auth_info: Some(AuthInfo {
                token_file: Some(api.token_file().display().to_string()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "in-cluster".into(),
            context: Some(Context {
                cluster: "in-cluster".into(),
                user: Some("install-cni".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("in-cluster".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// client-go trims the token file; kube sends it whole, so a newline is refused up front,
    /// naming the file, instead of every request failing with "invalid bearer token".
    #[test]
    fn a_token_with_a_trailing_newline_is_refused_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("token"), "tok\n").unwrap();
        let api = ApiServer {
            host: "10.96.0.1".into(),
            port: 443,
            protocol: "https".into(),
            ca_file: d.path().join("ca.crt"),
            skip_tls_verify: true,
            service_account_dir: d.path().to_path_buf(),
            kubeconfig: None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt.block_on(client(&api)).err().expect("refused");
        assert!(matches!(e, ClientError::TokenWhitespace(_)), "{e}");
        assert!(
            e.to_string()
                .contains(&api.token_file().display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn ipv6_hosts_get_brackets() {
        assert_eq!(join_host_port("10.96.0.1", 443), "10.96.0.1:443");
        assert_eq!(join_host_port("fd00::1", 6443), "[fd00::1]:6443");
        assert_eq!(
            join_host_port("kubernetes.default.svc", 443),
            "kubernetes.default.svc:443"
        );
    }
}
