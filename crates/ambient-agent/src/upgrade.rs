//! Ambient's safe upgrade (Istio's `ShouldStopCleanup`): when the daemon stops because its
//! DaemonSet is being rolled (it still exists and is not being deleted), the plugin stays
//! installed, so ambient pods created before the next agent is up fail closed instead of
//! starting without ztunnel, and the host probe rule stays for the pods ztunnel keeps serving.
//! When the DaemonSet is gone or being deleted (uninstall), everything is cleaned up.

use k8s_openapi::api::apps::v1::DaemonSet;
use std::time::Duration;

/// The DaemonSet's name in the chart (`deploy/helm/istio-cni`); RBAC grants `get` on it alone.
pub const DAEMONSET_NAME: &str = "istio-cni-node";
const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// What shutdown should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Keep the plugin and the host rule: a new agent is coming (why).
    Upgrade(String),
    /// Remove everything (why).
    Uninstall(String),
}

/// Pure: the decision from the DaemonSet lookup.
pub fn decide(disabled: bool, lookup: Result<Option<DaemonSet>, String>) -> Shutdown {
    if disabled {
        return Shutdown::Uninstall("AMBIENT_DISABLE_SAFE_UPGRADE=true".into());
    }
    match lookup {
        Ok(Some(ds)) if ds.metadata.deletion_timestamp.is_none() => Shutdown::Upgrade(format!(
            "DaemonSet {DAEMONSET_NAME} still exists: a new agent follows"
        )),
        Ok(Some(_)) => Shutdown::Uninstall(format!("DaemonSet {DAEMONSET_NAME} is being deleted")),
        Ok(None) => Shutdown::Uninstall(format!("DaemonSet {DAEMONSET_NAME} is gone")),
        // Cannot tell: keeping the plugin fails ambient pods closed; removing it could let
        // them start unprotected. Fail closed.
        Err(e) => Shutdown::Upgrade(format!(
            "DaemonSet {DAEMONSET_NAME} could not be read ({e}); keeping the plugin (fail closed)"
        )),
    }
}

pub async fn lookup(client: kube::Client, namespace: &str) -> Result<Option<DaemonSet>, String> {
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(client, namespace);
    match tokio::time::timeout(GET_TIMEOUT, api.get_opt(DAEMONSET_NAME)).await {
        Ok(Ok(ds)) => Ok(ds),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {GET_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(matches!(
            decide(false, Ok(Some(ds(false)))),
            Shutdown::Upgrade(_)
        ));
        assert!(matches!(
            decide(false, Ok(Some(ds(true)))),
            Shutdown::Uninstall(_)
        ));
        assert!(matches!(decide(false, Ok(None)), Shutdown::Uninstall(_)));
        assert!(matches!(
            decide(false, Err("x".into())),
            Shutdown::Upgrade(_)
        ));
        assert!(matches!(
            decide(true, Ok(Some(ds(false)))),
            Shutdown::Uninstall(_)
        ));
    }
}
