//! `<run_dir>/pods.sock`: the plugin's pod lookup answered from the node's caches (contract in
//! [`cni_config::lookup`]). A pod the watch has not delivered yet is waited for, up to the
//! plugin's `wait_ms` (capped); a miss is 404 and the plugin asks the API server itself. Each
//! answer's time goes into `istio_cni_pod_lookup_wait_seconds{result}` (`node_status::figures`).

use crate::cache::{NamespaceCache, PodCache};
use cni_config::lookup::{POD_LOOKUP_SOCKET, POD_PATH, PodAnswer, PodQuery};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use node_status::jobs::{Jobs, Stage};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::time::Instant;
use uds_http::server::{Reply, Request, json, reply};
use uds_http::{Method, StatusCode};

/// A query is a few hundred bytes and comes in the URL.
const MAX_BODY: usize = 4096;

#[derive(Debug, thiserror::Error)]
#[error("pod lookup socket {path}: {source}")]
pub struct LookupServerError {
    path: PathBuf,
    source: std::io::Error,
}

/// What the server reads: the node's pods and, when the daemon watches them, the namespaces.
#[derive(Clone)]
pub struct Caches {
    pub pods: PodCache,
    pub namespaces: Option<NamespaceCache>,
}

/// Binds the socket (root only; a planted file is refused) and serves, a server in `jobs`.
pub fn start(run_dir: &Path, caches: Caches, jobs: &Jobs) -> Result<(), LookupServerError> {
    let path = run_dir.join(POD_LOOKUP_SOCKET);
    let listener = uds_http::server::bind(&path).map_err(|source| LookupServerError {
        path: path.clone(),
        source,
    })?;
    tracing::info!(socket = %path.display(), namespaces = caches.namespaces.is_some(), "pod lookup socket listening");
    let serve = uds_http::server::serve(listener, "pod lookup", MAX_BODY, move |req| {
        answer(caches.clone(), req)
    });
    jobs.spawn("pods.sock", Stage::Server, serve);
    Ok(())
}

async fn answer(caches: Caches, req: Request) -> Reply {
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "GET only");
    }
    if req.uri().path() != POD_PATH {
        return reply(
            StatusCode::NOT_FOUND,
            format!("no such path {}", req.uri().path()),
        );
    }
    let query = match PodQuery::from_query(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return reply(StatusCode::BAD_REQUEST, format!("invalid query: {e}")),
    };
    let asked = Instant::now();
    let found = find(&caches, &query).await;
    let result = if found.is_ok() { "found" } else { "missed" };
    let figures = node_status::figures::global();
    figures.lookup_wait.observe(&[result], asked.elapsed());
    match found {
        Ok(found) => {
            let body = PodAnswer {
                pod: found.pod.as_ref(),
                namespace: found.namespace.as_deref(),
            };
            json(serde_json::to_vec(&body).expect("API objects serialize"))
        }
        Err(miss) => {
            tracing::debug!(pod = %format!("{}/{}", query.namespace, query.name), %miss, "pod lookup: not in the caches");
            reply(StatusCode::NOT_FOUND, miss.to_string())
        }
    }
}

type Found = PodAnswer<Arc<Pod>, Arc<Namespace>>;

async fn find(caches: &Caches, q: &PodQuery) -> Result<Found, Miss> {
    // A cache that has not listed since its watch failed (or ever: the daemon just started,
    // or cannot reach the API server) may miss changes: the plugin asks the API server at once.
    if !caches.pods.is_current() {
        return Err(Miss::PodCacheBehind);
    }
    let deadline = Instant::now() + q.wait;
    let same_uid = |p: &Pod| pod_policy::is_sandboxs_pod(p, q.uid.as_deref().unwrap_or(""));
    let pod = caches
        .pods
        .wait_for(&q.namespace, &q.name, same_uid, q.wait)
        .await
        .ok_or_else(|| miss(caches, q))?;
    if !q.with_namespace {
        return Ok(PodAnswer {
            pod,
            namespace: None,
        });
    }
    let Some(namespaces) = &caches.namespaces else {
        return Err(Miss::NamespacesUnwatched);
    };
    // Its labels decide whether the pod is ambient: never from a view that lost track.
    if !namespaces.is_current() {
        return Err(Miss::NamespaceCacheBehind);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let namespace = namespaces
        .wait_for("", &q.namespace, |_| true, left)
        .await
        .ok_or_else(|| Miss::Namespace(q.namespace.clone()))?;
    Ok(PodAnswer {
        pod,
        namespace: Some(namespace),
    })
}

/// Why a lookup is answered 404 (the plugin then asks the API server); each names the pod or
/// namespace it is about.
#[derive(Debug, thiserror::Error)]
enum Miss {
    #[error("the pod cache has not listed yet, or not since its watch last failed")]
    PodCacheBehind,
    #[error("pod {pod} is not in this node's pod cache")]
    Pod { pod: String },
    /// Re-created under its name: the cache holds another pod than the sandbox's.
    #[error("pod {pod} in this node's pod cache has uid {cached:?}, not the sandbox's {sandbox:?}")]
    OtherUid {
        pod: String,
        cached: String,
        sandbox: String,
    },
    #[error("this daemon does not watch namespaces")]
    NamespacesUnwatched,
    #[error("the namespace cache has not listed yet, or not since its watch last failed")]
    NamespaceCacheBehind,
    #[error("namespace {0} is not in the namespace cache")]
    Namespace(String),
}

/// Why the pod was not answered: not there, or there as another pod (re-created under its name).
fn miss(caches: &Caches, q: &PodQuery) -> Miss {
    let pod = format!("{}/{}", q.namespace, q.name);
    match caches.pods.get(&q.namespace, &q.name) {
        Some(p) => Miss::OtherUid {
            pod,
            cached: p.metadata.uid.clone().unwrap_or_default(),
            sandbox: q.uid.clone().unwrap_or_default(),
        },
        None => Miss::Pod { pod },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "shop", "uid": uid}}),
        )
        .unwrap()
    }

    fn namespace() -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap()
    }

    fn query(uid: Option<&str>) -> PodQuery {
        PodQuery {
            namespace: "shop".into(),
            name: "web".into(),
            uid: uid.map(str::to_string),
            with_namespace: true,
            wait: std::time::Duration::ZERO,
        }
    }

    /// Answers come only from caches that have listed since their watch last failed: a
    /// namespace's labels from a view that lost track could decide an ambient pod is not one.
    #[tokio::test]
    async fn a_cache_that_lost_its_watch_answers_nothing_until_it_lists_again() {
        let caches = Caches {
            pods: PodCache::new(),
            namespaces: Some(NamespaceCache::new()),
        };
        caches.pods.replace(vec![pod("uid-1")]);
        caches
            .namespaces
            .as_ref()
            .unwrap()
            .replace(vec![namespace()]);
        assert!(find(&caches, &query(Some("uid-1"))).await.is_ok());
        caches.namespaces.as_ref().unwrap().lost_track();
        let e = find(&caches, &query(None)).await.err().unwrap();
        assert!(matches!(e, Miss::NamespaceCacheBehind), "{e}");
        caches
            .namespaces
            .as_ref()
            .unwrap()
            .replace(vec![namespace()]);
        caches.pods.lost_track();
        let e = find(&caches, &query(None)).await.err().unwrap();
        assert!(matches!(e, Miss::PodCacheBehind), "{e}");
        caches.pods.replace(vec![pod("uid-1")]);
        assert!(find(&caches, &query(None)).await.is_ok());
    }

    /// A static pod's mirror is the sandbox's pod whatever its UID (kubelet makes the sandbox
    /// with the static pod's own).
    #[tokio::test]
    async fn a_mirror_pod_is_answered_for_its_static_pods_sandbox() {
        let caches = Caches {
            pods: PodCache::new(),
            namespaces: None,
        };
        let mut mirror = pod("uid-of-the-mirror");
        mirror.metadata.annotations = Some(
            [(
                pod_policy::MIRROR_POD_ANNOTATION.to_string(),
                "static-pods-uid".to_string(),
            )]
            .into(),
        );
        caches.pods.replace(vec![mirror]);
        let mut q = query(Some("static-pods-uid"));
        q.with_namespace = false;
        assert!(find(&caches, &q).await.is_ok());
        // The mirror of the manifest before it changed is not the new sandbox's pod.
        q.uid = Some("the-changed-manifests-uid".into());
        assert!(find(&caches, &q).await.is_err());
    }

    /// A pod re-created under its name is named as such, not as missing.
    #[tokio::test]
    async fn a_uid_mismatch_is_named() {
        let caches = Caches {
            pods: PodCache::new(),
            namespaces: None,
        };
        caches.pods.replace(vec![pod("uid-new")]);
        let mut q = query(Some("uid-old"));
        q.with_namespace = false;
        let e = find(&caches, &q).await.err().unwrap().to_string();
        assert!(
            e.contains("\"uid-new\"") && e.contains("\"uid-old\""),
            "{e}"
        );
    }
}
