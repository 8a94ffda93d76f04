//! The plugin's kubeconfig, built with kube's own `Kubeconfig` types (so it is exactly what
//! `kube`/client-go parse) from the service account the daemon runs as.

use base64::Engine;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use secrecy::SecretString;

pub const CLUSTER_NAME: &str = "local";
pub const USER_NAME: &str = "istio-cni";
pub const CONTEXT_NAME: &str = "istio-cni-context";

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("the service-account token is empty")]
    EmptyToken,
    #[error("serializing the kubeconfig: {0}")]
    Serialize(String),
}

/// How the plugin verifies the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// PEM bundle, embedded as certificate-authority-data.
    Ca(Vec<u8>),
    /// `SKIP_TLS_VERIFY=true`.
    SkipVerify,
}

pub fn build(
    protocol: &str,
    host: &str,
    port: u16,
    token: &str,
    trust: &Trust,
) -> Result<Kubeconfig, KubeconfigError> {
    // A hand-edited secret with a trailing newline would otherwise end up in every
    // Authorization header the plugin sends.
    let token = token.trim();
    if token.is_empty() {
        return Err(KubeconfigError::EmptyToken);
    }
    let mut cluster = Cluster {
        server: Some(format!(
            "{protocol}://{}",
            node_view::client::join_host_port(host, port)
        )),
        ..Default::default()
    };
    match trust {
        Trust::Ca(pem) => {
            cluster.certificate_authority_data =
                Some(base64::engine::general_purpose::STANDARD.encode(pem))
        }
        Trust::SkipVerify => cluster.insecure_skip_tls_verify = Some(true),
    }
    Ok(Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: CLUSTER_NAME.into(),
            cluster: Some(cluster),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: USER_NAME.into(),
            auth_info: Some(AuthInfo {
                token: Some(SecretString::new(token.into())),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: CONTEXT_NAME.into(),
            context: Some(Context {
                cluster: CLUSTER_NAME.into(),
                user: Some(USER_NAME.into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(CONTEXT_NAME.into()),
        ..Default::default()
    })
}

/// YAML text of `kc` (serde-saphyr, the serializer kube itself uses).
pub fn to_yaml(kc: &Kubeconfig) -> Result<String, KubeconfigError> {
    serde_saphyr::to_string(kc).map_err(|e| KubeconfigError::Serialize(e.to_string()))
}

/// For logs: the server and trust mode, never the token.
pub fn describe(kc: &Kubeconfig) -> String {
    let c = kc.clusters.first().and_then(|c| c.cluster.as_ref());
    let server = c.and_then(|c| c.server.clone()).unwrap_or_default();
    let trust = match c {
        Some(c) if c.insecure_skip_tls_verify == Some(true) => "insecure-skip-tls-verify",
        Some(c) if c.certificate_authority_data.is_some() => "ca-data",
        _ => "none",
    };
    format!("server={server} trust={trust} token=<redacted>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn round_trips_through_kube() {
        let kc = build("https", "fd00::1", 443, "tok\n", &Trust::SkipVerify).unwrap();
        let text = to_yaml(&kc).unwrap();
        let back = Kubeconfig::from_yaml(&text).unwrap();
        let cluster = back.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://[fd00::1]:443"));
        assert_eq!(cluster.insecure_skip_tls_verify, Some(true));
        let user = back.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.token.as_ref().unwrap().expose_secret(), "tok");
        assert_eq!(back.current_context.as_deref(), Some(CONTEXT_NAME));
        assert!(!describe(&kc).contains("tok\n") && describe(&kc).contains("redacted"));
        assert!(matches!(
            build("https", "h", 1, " \n", &Trust::SkipVerify),
            Err(KubeconfigError::EmptyToken)
        ));
    }
}
