//! `<run_dir>/pluginevent.sock`: the plugin's ADD and DEL of ambient pods (HTTP/1.1 POST of
//! JSON, Istio's `/cmdadd`, plus `/cmddel`). The socket is root-only (0600).
//!
//! An ADD is answered 200 only once the pod's rules are in and ztunnel acknowledged it; 503
//! when ztunnel is not connected (the plugin fails closed, the runtime retries); 400 for a bad
//! request (field and value named); 500 otherwise. The work runs in its own task: a plugin
//! that gives up mid-way cannot cut an enroll in half (the agent finishes or rolls back). At
//! most [`MAX_WORKERS`] such tasks run at once, and at most [`MAX_POD_GETS`] of them ask the
//! API server; an event waiting for a worker is dropped if its caller hangs up first.

use crate::agent::Agent;
use cni_config::ambient::{AddPodRequest, CMD_ADD_PATH, CMD_DEL_PATH, DelPodRequest, NetnsId};
use k8s_openapi::api::core::v1::Pod;
use node_status::jobs::{Jobs, Stage};
use node_status::metrics::Counters;
use node_view::cache::PodCache;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use uds_http::server::{Reply, reply};
use uds_http::{Method, StatusCode};

/// A plugin event is a few hundred bytes.
const MAX_BODY: usize = 64 * 1024;
/// A pod the cache has not seen yet is fetched from the API server, this long at most.
const POD_GET_TIMEOUT: Duration = Duration::from_secs(5);
/// Pod GETs in flight at once. The work on an event outlives its caller (see the module doc),
/// so without a bound every ADD of an unknown pod from a caller that hangs up at once left a
/// task and an API connection behind for up to `POD_GET_TIMEOUT` (5 s). Over the bound: 503 (the
/// plugin fails closed, the runtime retries); pods the cache holds never need a GET.
pub const MAX_POD_GETS: usize = 16;
/// Plugin events worked on at once. The work outlives its caller, so without a bound every
/// ADD from a caller that hangs up at once left a task (holding the pod's netns while it waits
/// its turn for the pod) behind. Events over it wait for a worker in their connection, whose
/// number the socket bounds.
pub const MAX_WORKERS: usize = 64;

/// Why the agent refused a plugin event: its text is the answer's body (the plugin reports it),
/// its kind the status ([`Refusal::status`]).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("invalid request at {path}: {source}")]
    Decode {
        path: String,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Name(#[from] cni_config::ambient::InvalidName),
    #[error(
        "pod {pod} is not in the node's cache and {MAX_POD_GETS} pod GETs are already in flight"
    )]
    TooManyGets { pod: String },
    #[error("getting pod {pod}: {source}")]
    Get { pod: String, source: kube::Error },
    #[error("getting pod {pod}: no answer within {POD_GET_TIMEOUT:?}")]
    NoAnswer { pod: String },
    #[error("Netns {path:?} must be an absolute path")]
    NetnsNotAbsolute { path: String },
    #[error("Netns {path:?}: {source}")]
    Netns {
        path: String,
        source: netns::ForeignError,
    },
    #[error(
        "Netns {path:?} is now {got}, not the namespace the plugin checked (NetnsID dev {} inode {}): it was re-pointed in between; refused",
        checked.dev,
        checked.ino
    )]
    Repointed {
        path: String,
        got: netns::NsId,
        checked: NetnsId,
    },
}

impl Refusal {
    /// A pod the agent cannot get now is "try again later"; the rest are the request's fault.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::TooManyGets { .. } | Refusal::Get { .. } | Refusal::NoAnswer { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Refusal::Decode { .. }
            | Refusal::Name(_)
            | Refusal::NetnsNotAbsolute { .. }
            | Refusal::Netns { .. }
            | Refusal::Repointed { .. } => StatusCode::BAD_REQUEST,
        }
    }
}

pub struct Handler {
    agent: Arc<Agent>,
    pods: PodCache,
    client: kube::Client,
    proc_root: PathBuf,
    pod_gets: Semaphore,
    workers: Arc<Semaphore>,
    /// Istio's `istio_cni_plugin_requests_total{response_code}`: the plugin's ADDs answered.
    requests: Arc<Counters>,
}

/// Istio's `istio_cni_plugin_requests_total` (`cni/pkg/nodeagent/cni-watcher.go`: every ADD
/// event the agent answered, by status code), over the codes this handler answers.
pub fn requests_metric() -> Counters {
    Counters::by(
        "istio_cni_plugin_requests_total",
        "The total number of CNI plugin requests handled by the node agent.",
        &["response_code"],
        &["200", "400", "413", "500", "503"],
    )
}

impl Handler {
    pub fn new(
        agent: Arc<Agent>,
        pods: PodCache,
        client: kube::Client,
        proc_root: PathBuf,
        requests: Arc<Counters>,
    ) -> Arc<Handler> {
        Arc::new(Handler {
            agent,
            pods,
            client,
            proc_root,
            pod_gets: Semaphore::new(MAX_POD_GETS),
            workers: Arc::new(Semaphore::new(MAX_WORKERS)),
            requests,
        })
    }

    async fn handle(self: Arc<Self>, req: uds_http::server::Request) -> Reply {
        let path = req.uri().path().to_string();
        if req.method() != Method::POST {
            return reply(StatusCode::METHOD_NOT_ALLOWED, "POST only");
        }
        let body = req.into_body();
        let worker = self
            .workers
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // Own task: finishes (or rolls back) even if the plugin hangs up.
        let task = tokio::spawn(async move {
            let _worker = worker;
            match path.as_str() {
                CMD_ADD_PATH => {
                    let answer = self.add(&body).await;
                    self.requests.inc(&[answer.status().as_str()]);
                    answer
                }
                CMD_DEL_PATH => self.del(&body).await,
                other => reply(StatusCode::NOT_FOUND, format!("no such path {other}")),
            }
        });
        task.await.unwrap_or_else(|e| {
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the agent's worker failed: {e}"),
            )
        })
    }

    async fn add(&self, body: &[u8]) -> Reply {
        let req: AddPodRequest = match decode(body).and_then(|r: AddPodRequest| {
            r.validate()?;
            Ok(r)
        }) {
            Ok(r) => r,
            Err(e) => return refuse(e),
        };
        let pod_label = format!("{}/{}", req.pod_namespace, req.pod_name);
        let pod = match self
            .pod(&req.pod_namespace, &req.pod_name, &req.pod_uid)
            .await
        {
            Ok(p) => p,
            Err(e) => return refuse(e),
        };
        let mut r = match crate::pod_ref(&pod, req.ips.clone()) {
            Ok(r) => r,
            Err(e) => return reply(StatusCode::BAD_REQUEST, format!("pod {pod_label}: {e}")),
        };
        if !req.pod_uid.is_empty() {
            r.uid = req.pod_uid.clone();
        }
        if r.ips.is_empty() {
            return reply(
                StatusCode::BAD_REQUEST,
                format!("pod {pod_label}: IPs is empty (no address in the chain's prevResult)"),
            );
        }
        let netns = match open_netns(&req.netns, &self.proc_root, req.netns_id) {
            Ok(fd) => fd,
            Err(e) => return reply(e.status(), format!("pod {pod_label}: {e}")),
        };
        match self.agent.enroll(r, netns).await {
            Ok(()) => {
                crate::annotate(&self.client, &pod, true);
                reply(StatusCode::OK, "")
            }
            Err(e) if e.is_unavailable() => reply(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }

    async fn del(&self, body: &[u8]) -> Reply {
        let req: DelPodRequest = match decode(body).and_then(|r: DelPodRequest| {
            r.validate()?;
            Ok(r)
        }) {
            Ok(r) => r,
            Err(e) => return refuse(e),
        };
        let uid = if req.pod_uid.is_empty() {
            self.agent.uid_of(&req.pod_namespace, &req.pod_name).await
        } else {
            Some(req.pod_uid.clone())
        };
        if let Some(uid) = uid {
            // Read as the ADD's was: a DEL names the sandbox it tears down. One with no
            // namespace left (a repeated DEL, e.g. kubelet removing an old sandbox) names none.
            let netns = resolve_netns(&req.netns, &self.proc_root);
            self.agent.release_sandbox(&uid, &netns, "CNI DEL").await;
        }
        reply(StatusCode::OK, "")
    }

    /// The pod from the node's cache, or from the API server when the cache has not seen it
    /// (or holds an older pod of the same name).
    async fn pod(&self, namespace: &str, name: &str, uid: &str) -> Result<Pod, Refusal> {
        if let Some(p) = self.pods.get(namespace, name)
            && (uid.is_empty() || p.metadata.uid.as_deref() == Some(uid))
        {
            return Ok((*p).clone());
        }
        let Ok(_in_flight) = self.pod_gets.try_acquire() else {
            tracing::warn!(pod = %format!("{namespace}/{name}"), max = MAX_POD_GETS, "pod not in the cache and too many pod GETs in flight");
            return Err(Refusal::TooManyGets {
                pod: format!("{namespace}/{name}"),
            });
        };
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let pod = || format!("{namespace}/{name}");
        match tokio::time::timeout(POD_GET_TIMEOUT, api.get(name)).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(source)) => Err(Refusal::Get { pod: pod(), source }),
            Err(_) => Err(Refusal::NoAnswer { pod: pod() }),
        }
    }
}

/// The answer to a refused event.
fn refuse(e: Refusal) -> Reply {
    reply(e.status(), e.to_string())
}

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| Refusal::Decode {
        path: e.path().to_string(),
        source: e.into_inner(),
    })
}

/// The pod's namespace as the runtime named it, found from inside the agent's container
/// ([`resolve_netns`]); never the host's or our own namespace. When the plugin says which
/// namespace it checked there (`NetnsID`), the one opened must be it: a path re-pointed (a
/// bind mount replaced, a link swapped) between the plugin's check and this open is refused.
fn open_netns(path: &str, proc_root: &Path, checked: Option<NetnsId>) -> Result<OwnedFd, Refusal> {
    if path.is_empty() || !path.starts_with('/') {
        return Err(Refusal::NetnsNotAbsolute { path: path.into() });
    }
    let resolved = resolve_netns(path, proc_root);
    // Checked and kept as one open: the descriptor served is the namespace that was checked.
    // The node by the host's /proc too: without the host's PID namespace (Istio's chart) this
    // process's /proc/1 is its container's own init.
    let ns = netns::ForeignNetns::open_on_node(&resolved, proc_root).map_err(|source| {
        Refusal::Netns {
            path: path.into(),
            source,
        }
    })?;
    if let Some(checked) = checked {
        let got = ns.id();
        if (got.dev, got.ino) != (checked.dev, checked.ino) {
            return Err(Refusal::Repointed {
                path: path.into(),
                got,
                checked,
            });
        }
    }
    Ok(ns.into_fd())
}

/// Where the agent finds a namespace path the runtime gave (a path on the node):
/// `/proc/...` under the host's /proc; any other path under the host mounts' root (the
/// parent of the host's /proc, `/host` as Istio's chart mounts the node's netns directory at
/// `/host/var/run/netns`) when it is there, else as given (our chart mounts that directory at
/// the node's own path).
fn resolve_netns(path: &str, proc_root: &Path) -> PathBuf {
    if let Some(rest) = path.strip_prefix("/proc/") {
        return proc_root.join(rest);
    }
    let host_root = proc_root
        .parent()
        .filter(|root| *root != Path::new("/") && proc_root.ends_with("proc"));
    match host_root.map(|root| root.join(path.trim_start_matches('/'))) {
        Some(under_host) if under_host.symlink_metadata().is_ok() => under_host,
        _ => PathBuf::from(path),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("plugin event socket {path}: {source}")]
pub struct ServerError {
    path: PathBuf,
    source: std::io::Error,
}

/// Binds the socket (replacing a stale one; never following a planted symlink) and serves.
pub fn start(run_dir: &Path, handler: Arc<Handler>, jobs: &Jobs) -> Result<(), ServerError> {
    let path = run_dir.join(cni_config::ambient::PLUGIN_EVENT_SOCKET);
    let listener = uds_http::server::bind(&path).map_err(|source| ServerError {
        path: path.clone(),
        source,
    })?;
    tracing::info!(socket = %path.display(), "plugin event socket listening");
    let serve = uds_http::server::serve(listener, "plugin events", MAX_BODY, move |req| {
        handler.clone().handle(req)
    });
    jobs.spawn("plugin event socket", Stage::Server, serve);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::resolve_netns;
    use std::path::{Path, PathBuf};

    /// Istio's chart mounts the node's netns directory at `/host/var/run/netns` (its agent
    /// joins `/host` to every path); ours mounts it at the node's own path. Both layouts work.
    #[test]
    fn a_runtime_path_is_found_under_the_host_mounts_root_or_as_given() {
        let root = std::env::temp_dir().join(format!("resolve-netns-{}", std::process::id()));
        let under_host = root.join("var/run/netns/cni-1");
        std::fs::create_dir_all(under_host.parent().unwrap()).unwrap();
        std::fs::write(&under_host, "").unwrap();
        let proc_root = root.join("proc");
        assert_eq!(
            resolve_netns("/var/run/netns/cni-1", &proc_root),
            under_host
        );
        assert_eq!(
            resolve_netns("/var/run/netns/cni-2", &proc_root),
            PathBuf::from("/var/run/netns/cni-2"),
            "not under the host root: as given"
        );
        assert_eq!(
            resolve_netns("/proc/42/ns/net", &proc_root),
            proc_root.join("42/ns/net")
        );
        let own = Path::new("/proc");
        assert_eq!(
            resolve_netns("/var/run/netns/cni-1", own),
            PathBuf::from("/var/run/netns/cni-1"),
            "the agent's own /proc: no host root"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
