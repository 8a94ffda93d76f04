//! The Kubernetes calls the plugin makes: GET the pod (and, in ambient mode, its namespace, for
//! the enablement selectors), bounded by ONE deadline that covers everything (kubeconfig, name
//! resolution, connect, TLS, bodies, retries and the pauses between).

use crate::settings::LookupSettings;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::cell::RefCell;
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
    /// Retryable failures (connection, timeout, 404, 5xx) until the deadline or the attempts ran out.
    #[error(
        "getting pod {pod} from the Kubernetes API failed after {attempts} attempt(s) in {elapsed:.3?} (deadline {deadline:?}, pod_lookup_deadline_ms): {last}"
    )]
    Exhausted {
        pod: String,
        attempts: u32,
        elapsed: Duration,
        deadline: Duration,
        last: String,
    },
    /// An answer that retrying cannot change (400, 401, 403, …, or a Pod we cannot decode).
    #[error(
        "getting pod {pod} from the Kubernetes API failed permanently at attempt {attempts} after {elapsed:.3?}: {reason}"
    )]
    Permanent {
        pod: String,
        attempts: u32,
        elapsed: Duration,
        reason: String,
        /// The HTTP status, when the API answered with one.
        status: Option<u16>,
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

/// What the attempts so far saw; survives the deadline cancelling the lookup future.
#[derive(Default)]
struct Progress {
    attempts: u32,
    last: String,
}

/// GET /api/v1/namespaces/{namespace}/pods/{name}: up to `attempts` tries, each bounded by
/// `timeout`, `interval` apart, all of it (client setup included) within `deadline`. Blocks the
/// calling thread on a single-threaded runtime (the plugin is a short-lived process).
pub fn get_pod(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    lookup: LookupSettings,
) -> Result<Pod, LookupError> {
    get(kubeconfig, namespace, name, false, lookup).map(|(pod, _)| pod)
}

/// [`get_pod`] plus GET /api/v1/namespaces/{namespace} in each attempt (ambient detection
/// needs the namespace's labels); both within the same deadline.
pub fn get_pod_and_namespace(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    lookup: LookupSettings,
) -> Result<(Pod, Namespace), LookupError> {
    let (pod, ns) = get(kubeconfig, namespace, name, true, lookup)?;
    Ok((pod, ns.expect("asked for the namespace")))
}

fn get(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    with_namespace: bool,
    lookup: LookupSettings,
) -> Result<(Pod, Option<Namespace>), LookupError> {
    let start = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LookupError::Runtime)?;
    let progress = RefCell::new(Progress::default());
    // The timer must be created inside the runtime (it needs its time driver).
    let outcome = rt.block_on(async {
        tokio::time::timeout(
            lookup.deadline,
            get_async(
                kubeconfig,
                (namespace, name, with_namespace),
                lookup,
                start,
                &progress,
            ),
        )
        .await
    });
    // hyper resolves names with getaddrinfo on the blocking pool; dropping the runtime would
    // wait for a hanging lookup. Leave it behind: the process exits right after the command.
    rt.shutdown_background();
    let pod_ref = format!("{namespace}/{name}");
    match outcome {
        Ok(result) => result,
        Err(_elapsed) => {
            let p = progress.into_inner();
            let last = if p.last.is_empty() {
                "no answer yet".to_string()
            } else {
                p.last
            };
            Err(LookupError::Exhausted {
                pod: pod_ref,
                attempts: p.attempts,
                elapsed: start.elapsed(),
                deadline: lookup.deadline,
                last: format!("deadline reached (last: {last})"),
            })
        }
    }
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
    // The lookup's own attempts and deadline are the retries: kube's layer would send more
    // requests inside each attempt (15 on 429/503/504) and hide the status behind a timeout.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|source| LookupError::Client {
        path: kubeconfig.to_path_buf(),
        source,
    })
}

/// One attempt's failure: worth retrying or not.
enum AttemptError {
    Retry(String),
    Permanent { reason: String, status: Option<u16> },
}

async fn get_async(
    kubeconfig: &Path,
    (namespace, name, with_namespace): (&str, &str, bool),
    lookup: LookupSettings,
    start: Instant,
    progress: &RefCell<Progress>,
) -> Result<(Pod, Option<Namespace>), LookupError> {
    let client = client(kubeconfig, lookup.timeout).await?;
    tracing::debug!(elapsed_ms = ms(start), "client ready");
    let pod_ref = format!("{namespace}/{name}");
    for attempt in 1..=lookup.attempts {
        progress.borrow_mut().attempts = attempt;
        let last = match tokio::time::timeout(
            lookup.timeout,
            attempt_once(&client, namespace, name, with_namespace),
        )
        .await
        {
            Ok(Ok(found)) => {
                tracing::debug!(attempt, elapsed_ms = ms(start), "pod retrieved");
                return Ok(found);
            }
            Ok(Err(AttemptError::Permanent { reason, status })) => {
                return Err(LookupError::Permanent {
                    pod: pod_ref,
                    attempts: attempt,
                    elapsed: start.elapsed(),
                    reason,
                    status,
                });
            }
            Ok(Err(AttemptError::Retry(msg))) => msg,
            Err(_) => format!(
                "no answer within pod_lookup_timeout_ms ({:?})",
                lookup.timeout
            ),
        };
        tracing::warn!(attempt, attempts = lookup.attempts, elapsed_ms = ms(start), error = %last, "pod lookup failed");
        progress.borrow_mut().last = last;
        if attempt < lookup.attempts {
            tokio::time::sleep(lookup.interval).await;
        }
    }
    let p = progress.borrow();
    Err(LookupError::Exhausted {
        pod: pod_ref,
        attempts: p.attempts,
        elapsed: start.elapsed(),
        deadline: lookup.deadline,
        last: p.last.clone(),
    })
}

/// One attempt: the pod, then (when asked) its namespace.
async fn attempt_once(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    with_namespace: bool,
) -> Result<(Pod, Option<Namespace>), AttemptError> {
    let pod_text = get_text(
        client,
        &format!("/api/v1/namespaces/{namespace}/pods"),
        name,
    )
    .await?;
    let pod = decode_pod(&pod_text).map_err(|e| permanent(e.to_string()))?;
    if !with_namespace {
        return Ok((pod, None));
    }
    let ns_text = get_text(client, "/api/v1/namespaces", namespace)
        .await
        .map_err(|e| e.context(&format!("namespace {namespace}")))?;
    // Whether it is the pod's namespace is checked by the caller, for both lookup paths.
    let ns: Namespace =
        pod_policy::json::decode(&ns_text, "Namespace").map_err(|e| permanent(e.to_string()))?;
    Ok((pod, Some(ns)))
}

fn permanent(reason: String) -> AttemptError {
    AttemptError::Permanent {
        reason,
        status: None,
    }
}

impl AttemptError {
    fn context(self, what: &str) -> AttemptError {
        match self {
            AttemptError::Retry(m) => AttemptError::Retry(format!("{what}: {m}")),
            AttemptError::Permanent { reason, status } => AttemptError::Permanent {
                reason: format!("{what}: {reason}"),
                status,
            },
        }
    }
}

/// One GET. The body is decoded by the caller (not by kube) so that a bad object names the
/// JSON path.
async fn get_text(
    client: &kube::Client,
    collection: &str,
    name: &str,
) -> Result<String, AttemptError> {
    let request = kube::core::Request::new(collection)
        .get(name, &Default::default())
        .map_err(|e| permanent(format!("building the request: {e}")))?;
    client.request_text(request).await.map_err(classify)
}

/// The Pod JSON the API returned, or an error naming the JSON path that did not decode.
pub fn decode_pod(text: &str) -> Result<Pod, pod_policy::json::DecodeError> {
    pod_policy::json::decode(text, "Pod")
}

/// 404 (the pod may not be visible yet), 408, 429, 5xx and transport errors may go away; any
/// other answer (400, 401, 403, …) will not.
fn classify(e: kube::Error) -> AttemptError {
    match &e {
        kube::Error::Api(s) => {
            let msg = format!("API error {}: {}", s.code, s.message);
            match s.code {
                404 | 408 | 429 | 500..=599 => AttemptError::Retry(msg),
                code => AttemptError::Permanent {
                    reason: msg,
                    status: Some(code),
                },
            }
        }
        kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => AttemptError::Permanent {
            reason: describe(&e),
            status: None,
        },
        _ => AttemptError::Retry(describe(&e)),
    }
}

fn ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// kube's errors with their chain (the useful part, e.g. "connection refused", is deep).
fn describe(e: &kube::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        // Some layers repeat their source in their own text.
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undecodable_pods_name_the_json_path() {
        let e = decode_pod(
            r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"a","env":"x"}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("spec.containers[0].env"), "{e}");
        let e = decode_pod(r#"{"metadata":{"annotations":{"a":1}}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("metadata.annotations.a"), "{e}");
        assert!(
            decode_pod("[]")
                .unwrap_err()
                .to_string()
                .contains("top level")
        );
    }
}
