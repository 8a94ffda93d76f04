//! The plugin → node agent messages of ambient mode (Istio's `/cmdadd`, plus our `/cmddel`) on
//! the agent's socket in the run dir. Pure.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The unix socket in `cni_agent_run_dir` on which the node agent takes the plugin's events.
pub const PLUGIN_EVENT_SOCKET: &str = "pluginevent.sock";
/// HTTP paths on that socket (Istio's `/cmdadd`; `/cmddel` is ours: DEL tells the agent).
pub const CMD_ADD_PATH: &str = "/cmdadd";
pub const CMD_DEL_PATH: &str = "/cmddel";

/// `POST /cmdadd`: the plugin hands a new ambient pod to the agent (Istio's `CNIPluginArgs`
/// field names, plus the pod's UID). The agent answers 200 once the pod's rules are in and
/// ztunnel acknowledged it, otherwise an error status with the reason as text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddPodRequest {
    /// The pod's network namespace, as the runtime gave it (`CNI_NETNS`).
    #[serde(rename = "Netns")]
    pub netns: String,
    #[serde(rename = "PodName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// `K8S_POD_UID` or the pod's `metadata.uid`.
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
    /// The pod's addresses from the chain's `prevResult`.
    #[serde(rename = "IPs", default)]
    pub ips: Vec<IpAddr>,
    /// The identity of the namespace the plugin opened and checked at `Netns` (ours; Istio's
    /// plugin sends none). The agent opens the path itself and serves the pod only if it
    /// names this same namespace: a path re-pointed in between is refused.
    #[serde(rename = "NetnsID", default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<NetnsId>,
}

/// A network namespace's identity: device and inode of its nsfs file, the same seen from any
/// mount namespace (`netns::NsId` on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl AddPodRequest {
    /// The names are Kubernetes names (they become API paths and log fields).
    pub fn validate(&self) -> Result<(), InvalidName> {
        validate_names(&self.pod_namespace, &self.pod_name)
    }
}

impl DelPodRequest {
    /// As [`AddPodRequest::validate`].
    pub fn validate(&self) -> Result<(), InvalidName> {
        validate_names(&self.pod_namespace, &self.pod_name)
    }
}

/// A plugin event naming its pod with something that is not a Kubernetes name: the field (as
/// the message spells it) and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    #[error("PodNamespace {0:?} is not a valid namespace name")]
    PodNamespace(String),
    #[error("PodName {0:?} is not a valid pod name")]
    PodName(String),
}

fn validate_names(namespace: &str, name: &str) -> Result<(), InvalidName> {
    if !pod_policy::names::is_namespace_name(namespace) {
        return Err(InvalidName::PodNamespace(namespace.into()));
    }
    if !pod_policy::names::is_pod_name(name) {
        return Err(InvalidName::PodName(name.into()));
    }
    Ok(())
}

/// `POST /cmddel`: the pod's sandbox is going away.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelPodRequest {
    #[serde(rename = "Netns", default)]
    pub netns: String,
    #[serde(rename = "PodName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_event_uses_istio_field_names() {
        let req = AddPodRequest {
            netns: "/var/run/netns/cni-1".into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            ips: vec!["10.0.0.5".parse().unwrap()],
            netns_id: None,
        };
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(v["Netns"], "/var/run/netns/cni-1");
        assert_eq!(v["IPs"][0], "10.0.0.5");
        // Istio's plugin sends no UID: still accepted.
        let istio: AddPodRequest = serde_json::from_str(
            r#"{"Netns":"/n","PodName":"p","PodNamespace":"ns","IPs":["fd00::5"]}"#,
        )
        .unwrap();
        assert_eq!(istio.pod_uid, "");
        assert_eq!(istio.netns_id, None);
        assert!(v.get("NetnsID").is_none(), "{v}");
    }

    #[test]
    fn names_that_would_be_paths_are_refused_naming_the_field() {
        let ok =
            r#"{"Netns":"/n","PodName":"p","PodNamespace":"ns","NetnsID":{"dev":4,"ino":4026532}}"#;
        let req: AddPodRequest = serde_json::from_str(ok).unwrap();
        assert_eq!(req.validate(), Ok(()));
        assert_eq!(
            req.netns_id,
            Some(NetnsId {
                dev: 4,
                ino: 4026532
            })
        );
        for (field, ns, name) in [
            ("PodName", "default", "../../p1"),
            ("PodName", "default", ""),
            ("PodNamespace", "a/b", "p"),
            ("PodNamespace", "", "p"),
        ] {
            let add = AddPodRequest {
                pod_namespace: ns.into(),
                pod_name: name.into(),
                ..req.clone()
            };
            let e = add.validate().unwrap_err().to_string();
            assert!(e.starts_with(field), "{e}");
            let del = DelPodRequest {
                netns: String::new(),
                pod_name: name.into(),
                pod_namespace: ns.into(),
                pod_uid: String::new(),
            };
            assert_eq!(del.validate(), add.validate());
        }
    }
}
