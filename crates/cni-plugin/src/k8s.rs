//! The one Kubernetes call the plugin makes: GET the pod, bounded in time.

use crate::settings::LookupSettings;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("building the Kubernetes client from {path}: {source}")]
    Client { path: PathBuf, source: kube::Error },
    #[error(
        "getting pod {namespace}/{name} from the Kubernetes API failed after {attempts} attempt(s) in {elapsed:?}: {last}"
    )]
    Exhausted {
        namespace: String,
        name: String,
        attempts: u32,
        elapsed: Duration,
        last: String,
    },
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Reads and parses the kubeconfig (also STATUS's readiness test).
pub fn load_kubeconfig(path: &Path) -> Result<Kubeconfig, LookupError> {
    Kubeconfig::read_from(path).map_err(|source| LookupError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })
}

/// GET /api/v1/namespaces/{namespace}/pods/{name}: `attempts` tries, each bounded by `timeout`,
/// `interval` apart. Blocks the calling thread on a single-threaded runtime (the plugin is a
/// short-lived process; a pool would only cost startup time).
pub fn get_pod(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    lookup: LookupSettings,
) -> Result<Pod, LookupError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LookupError::Runtime)?;
    rt.block_on(get_pod_async(kubeconfig, namespace, name, lookup))
}

async fn client(kubeconfig: &Path, timeout: Duration) -> Result<kube::Client, LookupError> {
    let kc = load_kubeconfig(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| LookupError::Kubeconfig {
            path: kubeconfig.to_path_buf(),
            source,
        })?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    kube::Client::try_from(config).map_err(|source| LookupError::Client {
        path: kubeconfig.to_path_buf(),
        source,
    })
}

async fn get_pod_async(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    lookup: LookupSettings,
) -> Result<Pod, LookupError> {
    let start = Instant::now();
    let client = client(kubeconfig, lookup.timeout).await?;
    tracing::debug!(
        elapsed_us = start.elapsed().as_micros() as u64,
        "client ready"
    );
    let api: kube::Api<Pod> = kube::Api::namespaced(client, namespace);
    let mut last = String::new();
    for attempt in 1..=lookup.attempts {
        match tokio::time::timeout(lookup.timeout, api.get(name)).await {
            Ok(Ok(pod)) => {
                tracing::debug!(attempt, elapsed_ms = ms(start), "pod retrieved");
                return Ok(pod);
            }
            Ok(Err(e)) => last = describe(&e),
            Err(_) => last = format!("no answer within {:?}", lookup.timeout),
        }
        tracing::warn!(attempt, attempts = lookup.attempts, error = %last, "pod lookup failed");
        if attempt < lookup.attempts {
            tokio::time::sleep(lookup.interval).await;
        }
    }
    Err(LookupError::Exhausted {
        namespace: namespace.to_string(),
        name: name.to_string(),
        attempts: lookup.attempts,
        elapsed: Duration::from_millis(ms(start) as u64),
        last,
    })
}

fn ms(start: Instant) -> u128 {
    start.elapsed().as_millis()
}

/// kube's errors, with the API status message when there is one.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("API error {}: {}", s.code, s.message),
        other => {
            // The chain carries the useful part ("connection refused").
            let mut msg = other.to_string();
            let mut src = std::error::Error::source(other);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            msg
        }
    }
}
