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
    }
}
