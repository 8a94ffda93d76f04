//! Safe upgrade (Istio's `ShouldStopCleanup`, for ambient mode; here for both modes): when the
//! daemon stops because its DaemonSet is being rolled (it still exists and is not being
//! deleted), the plugin stays installed. A sidecar pod created before the next daemon is up is
//! then programmed by the plugin itself (it needs no daemon) and captured from its first packet;
//! an ambient pod fails closed instead of starting without ztunnel, and the host probe rule
//! stays for the pods ztunnel keeps serving. When the DaemonSet is gone or being deleted
//! (uninstall), or the daemon does not run as one, everything is cleaned up.
//!
//! A lookup that fails (no answer, 403 because `helm uninstall` already deleted the
//! ServiceAccount or its binding, any other error) is NOT an upgrade, as in Istio's
//! `ShouldStopForUpgrade`: the plugin is removed and the error logged. Keeping it instead would
//! leave a plugin behind on every node after an uninstall, failing every pod's ADD.
//!
//! A DaemonSet that lives on but no longer selects this node (its pods' required node affinity
//! or nodeSelector changed, or the node's labels did: Istio release note 58768) evicts the
//! daemon for good: no next daemon comes, so that is an uninstall too ([`crate::affinity`]).
//! The node is read only when the DaemonSet has such rules (as in Istio). A node that is gone
//! (404) is an uninstall; one that cannot be read otherwise (403 without RBAC `get` on nodes, no
//! answer) keeps the install as before this check, with a warning: the DaemonSet was read, so
//! this is no `helm uninstall`, and a rollout must not lose the plugin for a missing grant.

use crate::affinity::Rules;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use node_view::client::ClientError;
use std::time::Duration;

/// The DaemonSet's name in the chart (`deploy/helm/istio-cni`); RBAC grants `get` on it alone,
/// in both modes.
pub const DAEMONSET_NAME: &str = "istio-cni-node";
const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// What shutdown should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Keep the plugin (and in ambient mode the host rule): a new daemon is coming (why).
    Upgrade(String),
    /// Remove everything (why).
    Uninstall(String),
}

/// Why the DaemonSet or this node could not be read; the shutdown decision quotes it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No API client (the error names the kubeconfig or the token).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The API server's refusal, or the connection's error, with its whole chain of causes.
    #[error("{}", node_view::describe(.0))]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    #[error("the node's name is unknown")]
    NoNodeName,
}

/// What the decision needs to know besides the DaemonSet itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    /// `AMBIENT_DISABLE_SAFE_UPGRADE` (Istio's name; here it turns safe upgrade off in both
    /// modes).
    pub disabled: bool,
    /// `POD_NAMESPACE`: the DaemonSet's namespace; empty when the daemon does not run as the
    /// chart's DaemonSet (nothing will replace it).
    pub namespace: String,
    /// This node's name: whether the DaemonSet still selects it.
    pub node_name: String,
}

/// Whether the DaemonSet has to be looked up at all.
pub fn needs_lookup(ctx: &Context) -> Option<Shutdown> {
    if ctx.disabled {
        return Some(Shutdown::Uninstall(
            "AMBIENT_DISABLE_SAFE_UPGRADE=true".into(),
        ));
    }
    if ctx.namespace.is_empty() {
        return Some(Shutdown::Uninstall(
            "not running as the istio-cni DaemonSet (POD_NAMESPACE is empty)".into(),
        ));
    }
    None
}

/// Pure: the decision from the DaemonSet lookup. Only a DaemonSet that was read and is not
/// being deleted is an upgrade; an error is an uninstall (Istio's `ShouldStopForUpgrade`).
pub fn decide(lookup: Result<Option<DaemonSet>, ReadError>) -> Shutdown {
    match lookup {
        Ok(Some(ds)) if ds.metadata.deletion_timestamp.is_none() => Shutdown::Upgrade(format!(
            "DaemonSet {DAEMONSET_NAME} still exists: a new agent follows"
        )),
        Ok(Some(_)) => Shutdown::Uninstall(format!("DaemonSet {DAEMONSET_NAME} is being deleted")),
        Ok(None) => Shutdown::Uninstall(format!("DaemonSet {DAEMONSET_NAME} is gone")),
        // Cannot tell. After `helm uninstall` the ServiceAccount is gone (403), and a plugin
        // kept then fails every pod's ADD on the node for good; a rollout's next daemon
        // installs the plugin again. Istio: an error is not an upgrade.
        Err(e) => Shutdown::Uninstall(format!(
            "DaemonSet {DAEMONSET_NAME} could not be read ({e}): not an upgrade, as in Istio"
        )),
    }
}

/// Pure: the decision for a living DaemonSet with node-dependent `rules`, from the lookup of
/// node `node_name` (`Ok(None)`: it does not exist).
pub fn decide_node(
    rules: &Rules,
    node_name: &str,
    node: Result<Option<Node>, ReadError>,
) -> Shutdown {
    let rules_text = rules.describe();
    match node.map(|n| n.map(|n| rules.matches(&n))) {
        Ok(Some(Ok(true))) => Shutdown::Upgrade(format!(
            "DaemonSet {DAEMONSET_NAME} still exists and its {rules_text} still selects node {node_name}: a new agent follows"
        )),
        Ok(Some(Ok(false))) => Shutdown::Uninstall(format!(
            "DaemonSet {DAEMONSET_NAME} no longer selects node {node_name} ({rules_text}): no agent follows here, not an upgrade (Istio 58768)"
        )),
        Ok(None) => Shutdown::Uninstall(format!("node {node_name} is gone: no agent follows here")),
        // Cannot tell: as before the check (the DaemonSet was read, so no helm uninstall).
        Ok(Some(Err(e))) => Shutdown::Upgrade(format!(
            "DaemonSet {DAEMONSET_NAME} still exists; its {rules_text} could not be evaluated ({e}): kept as a rollout"
        )),
        Err(e) => Shutdown::Upgrade(format!(
            "DaemonSet {DAEMONSET_NAME} still exists; node {node_name} could not be read ({e}; RBAC needs get on nodes) to check its {rules_text}: kept as a rollout"
        )),
    }
}

/// The shutdown decision: the DaemonSet looked up (within 5 s) when it matters, and this node
/// when the DaemonSet's pods are scheduled by node rules.
pub async fn shutdown(
    ctx: &Context,
    client: impl std::future::Future<Output = Result<kube::Client, ClientError>>,
) -> Shutdown {
    if let Some(d) = needs_lookup(ctx) {
        return d;
    }
    // Without a client the DaemonSet cannot be read: that is the lookup's error.
    let (client, lookup) = match client.await {
        Ok(c) => (Some(c.clone()), lookup(c, &ctx.namespace).await),
        Err(e) => (None, Err(ReadError::Client(e))),
    };
    if let Err(e) = &lookup {
        tracing::warn!(error = %e, daemonset = DAEMONSET_NAME, "reading the DaemonSet failed: not an upgrade, removing the install");
    }
    let rules = match (client, &lookup) {
        (Some(c), Ok(Some(ds))) if ds.metadata.deletion_timestamp.is_none() => {
            Rules::of(ds).map(|r| (c, r))
        }
        _ => None,
    };
    let Some((client, rules)) = rules else {
        return decide(lookup);
    };
    let node = get_node(client, &ctx.node_name).await;
    if let Err(e) = &node {
        tracing::warn!(error = %e, node = %ctx.node_name, "reading this node failed: cannot tell whether the DaemonSet still selects it; keeping the install as for a rollout");
    }
    decide_node(&rules, &ctx.node_name, node)
}

async fn get_node(client: kube::Client, name: &str) -> Result<Option<Node>, ReadError> {
    if name.is_empty() {
        return Err(ReadError::NoNodeName);
    }
    let api: kube::Api<Node> = kube::Api::all(client);
    match tokio::time::timeout(GET_TIMEOUT, api.get_opt(name)).await {
        Ok(got) => Ok(got?),
        Err(_) => Err(ReadError::NoAnswer(GET_TIMEOUT)),
    }
}

/// The DaemonSet (`None`: it does not exist), within 5 s.
pub async fn lookup(client: kube::Client, namespace: &str) -> Result<Option<DaemonSet>, ReadError> {
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(client, namespace);
    match tokio::time::timeout(GET_TIMEOUT, api.get_opt(DAEMONSET_NAME)).await {
        Ok(got) => Ok(got?),
        Err(_) => Err(ReadError::NoAnswer(GET_TIMEOUT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API server's 403 for `what`, as kube reports it.
    fn forbidden(what: &str) -> ReadError {
        ReadError::Api(kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            message: format!("{what} is forbidden"),
            reason: "Forbidden".into(),
            ..Default::default()
        })))
    }

    fn ds(deleting: bool) -> DaemonSet {
        let mut d = DaemonSet::default();
        if deleting {
            d.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            );
        }
        d
    }

    #[test]
    fn upgrade_only_while_the_daemonset_lives() {
        assert!(matches!(decide(Ok(Some(ds(false)))), Shutdown::Upgrade(_)));
        assert!(matches!(decide(Ok(Some(ds(true)))), Shutdown::Uninstall(_)));
        assert!(matches!(decide(Ok(None)), Shutdown::Uninstall(_)));
        let ctx = |disabled, namespace: &str| Context {
            disabled,
            namespace: namespace.into(),
            node_name: "worker-1".into(),
        };
        assert!(matches!(
            needs_lookup(&ctx(true, "istio-system")),
            Some(Shutdown::Uninstall(_))
        ));
        assert!(matches!(
            needs_lookup(&ctx(false, "")),
            Some(Shutdown::Uninstall(_))
        ));
        assert_eq!(needs_lookup(&ctx(false, "istio-system")), None);
    }

    /// Istio 58768: a DaemonSet that no longer selects the node is no rollout; a node that
    /// cannot be read keeps the install as before the check; a node that is gone does not.
    #[test]
    fn a_node_the_daemonset_no_longer_selects_is_an_uninstall() {
        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "spec": {"selector": {}, "template": {"spec": {"containers": [],
                "nodeSelector": {"mesh": "on"}}}}}))
        .unwrap();
        let rules = Rules::of(&ds).unwrap();
        let node = |mesh: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "worker-1", "labels": {"mesh": mesh}}}))
            .unwrap()
        };
        assert!(matches!(
            decide_node(&rules, "worker-1", Ok(Some(node("on")))),
            Shutdown::Upgrade(_)
        ));
        match decide_node(&rules, "worker-1", Ok(Some(node("off")))) {
            Shutdown::Uninstall(why) => assert!(why.contains("no longer selects"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide_node(&rules, "worker-1", Ok(None)),
            Shutdown::Uninstall(_)
        ));
        match decide_node(&rules, "worker-1", Err(forbidden("nodes \"worker-1\""))) {
            Shutdown::Upgrade(why) => assert!(why.contains("forbidden"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// After `helm uninstall` the ServiceAccount is gone and the GET is refused: keeping the
    /// plugin then would fail every pod's ADD on the node. As Istio: an error is an uninstall,
    /// and the reason names it.
    #[test]
    fn an_unreadable_daemonset_is_an_uninstall_naming_the_error() {
        for (err, text) in [
            (
                forbidden("daemonsets.apps \"istio-cni-node\""),
                "daemonsets.apps \"istio-cni-node\" is forbidden",
            ),
            (ReadError::NoAnswer(GET_TIMEOUT), "no answer within 5s"),
            (
                ReadError::Client(ClientError::NoToken("/var/run/token".into())),
                "service-account token /var/run/token is missing",
            ),
        ] {
            match decide(Err(err)) {
                Shutdown::Uninstall(why) => assert!(why.contains(text), "{why}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
