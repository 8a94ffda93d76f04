//! Optional node taint removal (NODE_TAINT_KEY, Istio's `cni.istio.io/not-ready`): nodes join
//! the cluster with the taint, so no pod is scheduled before the plugin is in place; once this
//! daemon is ready it removes every taint with that key from its own node, and only those.
//!
//! At most one removal per readiness transition (not-ready → ready), retried with backoff on
//! API errors, on a task of its own: the install loop never waits for the API server.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};
use node_status::State;
use node_status::jobs::{Jobs, Stage};
use std::time::Duration;
use tokio::sync::watch;

const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// Field manager named in the node's managedFields.
const MANAGER: &str = "istio-cni";

/// The taints to keep when every taint with `key` goes; `None` when there is none to remove.
pub fn without_key(taints: &[Taint], key: &str) -> Option<Vec<Taint>> {
    let kept: Vec<Taint> = taints.iter().filter(|t| t.key != key).cloned().collect();
    (kept.len() != taints.len()).then_some(kept)
}

/// The merge patch replacing the node's taints, guarded by the version we read: the API
/// server answers 409 when the node changed in between (we then read it again), so a taint
/// another controller added meanwhile is never dropped.
pub fn patch_body(resource_version: &str, kept: &[Taint]) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"taints": kept},
    })
}

#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    /// The taint was there and is gone (how many taints had the key).
    Removed(usize),
    /// Nothing to do: the node has no taint with the key.
    Absent,
}

#[derive(Debug, thiserror::Error)]
pub enum TaintError {
    #[error("reading node {node}: {source}")]
    Get { node: String, source: kube::Error },
    #[error("patching node {node}: {source}")]
    Patch { node: String, source: kube::Error },
    #[error("node {node} has no resourceVersion")]
    NoVersion { node: String },
}

/// One attempt: GET the node, PATCH its taints without `key`. A version conflict is reported
/// as an error like any other and retried (after a fresh GET).
pub async fn remove_once(api: &Api<Node>, node: &str, key: &str) -> Result<Removed, TaintError> {
    let n = api.get(node).await.map_err(|source| TaintError::Get {
        node: node.into(),
        source,
    })?;
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    let Some(kept) = without_key(&taints, key) else {
        return Ok(Removed::Absent);
    };
    let rv = n
        .metadata
        .resource_version
        .ok_or_else(|| TaintError::NoVersion { node: node.into() })?;
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    api.patch(node, &params, &Patch::Merge(patch_body(&rv, &kept)))
        .await
        .map_err(|source| TaintError::Patch {
            node: node.into(),
            source,
        })?;
    Ok(Removed::Removed(taints.len() - kept.len()))
}

pub fn retry_delay(attempt: u32) -> Duration {
    RETRY_BASE
        .saturating_mul(1u32 << attempt.min(16))
        .min(RETRY_MAX)
}

/// Removes the taint once per readiness transition until `ready` closes.
pub async fn run(api: Api<Node>, node: String, key: String, mut ready: watch::Receiver<bool>) {
    loop {
        if ready.wait_for(|r| *r).await.is_err() {
            return;
        }
        remove_while_ready(&api, &node, &key, &mut ready).await;
        if ready.wait_for(|r| !*r).await.is_err() {
            return;
        }
    }
}

/// Retries until one attempt succeeds or the node stops being ready.
async fn remove_while_ready(
    api: &Api<Node>,
    node: &str,
    key: &str,
    ready: &mut watch::Receiver<bool>,
) {
    for attempt in 0u32.. {
        match remove_once(api, node, key).await {
            Ok(Removed::Removed(n)) => {
                tracing::info!(node, key, removed = n, "node ready: taint removed");
                return;
            }
            Ok(Removed::Absent) => {
                tracing::info!(node, key, "node ready: no taint to remove");
                return;
            }
            Err(e) => {
                let delay = retry_delay(attempt);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "removing the node taint failed");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    r = ready.wait_for(|r| !*r) => {
                        if r.is_ok() {
                            tracing::info!(node, key, "not ready any more; taint removal abandoned");
                        }
                        return;
                    }
                }
            }
        }
    }
}

/// Starts the removal task (NODE_TAINT_KEY is set), a consumer of readiness in `jobs`.
pub fn start(key: String, node: String, client: kube::Client, state: &State, jobs: &Jobs) {
    tracing::info!(node, key, "will remove the node taint once ready");
    let task = run(Api::all(client), node, key, state.subscribe_ready());
    jobs.spawn("node taint removal", Stage::Consumer, task);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_taints_with_the_key_go() {
        let k = "cni.istio.io/not-ready";
        let ts = vec![
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
            taint(k, "NoSchedule"),
            taint(k, "NoExecute"),
            taint("dedicated", "NoSchedule"),
        ];
        let kept = without_key(&ts, k).unwrap();
        assert_eq!(kept, vec![ts[0].clone(), ts[3].clone()]);
        assert_eq!(without_key(&kept, k), None);
        assert_eq!(without_key(&[], k), None);
        let body = patch_body("42", &kept);
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(body["spec"]["taints"].as_array().unwrap().len(), 2);
        // Removing the last taint writes an empty list (not null, which would be a no-op).
        assert_eq!(
            patch_body("1", &[])["spec"]["taints"],
            serde_json::json!([])
        );
    }

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(retry_delay(0), RETRY_BASE);
        assert_eq!(retry_delay(1), RETRY_BASE * 2);
        assert_eq!(retry_delay(40), RETRY_MAX);
    }
}
