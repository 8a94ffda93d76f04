//! Shared scaffolding of the host probe rule's kernel tests (the nft backend's
//! `crates/nft/tests/ambient_host.rs`, the legacy backend's
//! `crates/iptables-legacy/tests/ambient_host.rs`, `crates/redirect/tests/host_probe.rs`, and
//! explain's host rule tests): a
//! "node" namespace (the world side of a [`crate::PodWorld`]) holding the host rule, a pod
//! with ambient's in-pod rules and a stand-in ztunnel, connections from the node as kubelet's
//! uid or another one.

use crate::{ConnectSpec, Listen, Probe, connect};
use capture::{HostProbeConfig, Plan, ProbeSource};
use std::net::IpAddr;
use std::path::Path;

/// The test kubelet's uid (what `ProbeSource::KubeletUid` matches).
pub const KUBELET_UID: u32 = 4242;
/// Another uid on the node: its connections are not kubelet's.
pub const OTHER_UID: u32 = 1000;

/// Istio's legacy host probe rule as `iptables-legacy-save` prints it (its `hostprobe.golden`
/// with the options in save's order): any local socket, the pod set, SNAT to 169.254.7.127.
pub const LEGACY_HOST_RULE: &str = "-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127";

/// A stand-in ztunnel in the pod (outbound, inbound TPROXY, HBONE) and the app on 8080.
pub const ZTUNNEL: [Listen; 4] = [
    Listen::tcp(15001),
    Listen::tproxy(15006),
    Listen::tcp(15008),
    Listen::tcp(8080),
];

/// The host rule's plan (`Plan::ambient_host`) for `source`.
pub fn host_plan(source: ProbeSource, ipv6: bool) -> Plan {
    Plan::ambient_host(&HostProbeConfig::new(source, ipv6)).expect("a valid host probe config")
}

/// Runs `f` inside the namespace `ns` (on a thread of its own).
pub fn in_ns<T: Send>(ns: &Path, f: impl FnOnce() -> T + Send) -> T {
    netns::run_in(Some(ns), f).expect("entering the namespace")
}

/// Connects from `node` with `spec`; returns the port the connection landed on in the pod and
/// the peer address the pod's listener saw.
pub fn seen_from(probe: &Probe, node: &Path, spec: &ConnectSpec) -> (u16, IpAddr) {
    let before = probe.accepted().len();
    let o = connect(node, spec);
    let port = o.landed_port().unwrap_or_else(|| panic!("no landing: {o}"));
    let acc = probe.accepted();
    assert_eq!(acc.len(), before + 1, "{acc:?}");
    (port, acc[before].peer.ip())
}

/// An IPv4 ambient pod and its node (the world side): the pod has the default in-pod rules
/// (nft), the node the nft host probe rule for the kubelet's uid `kubelet_uid` with the pod's
/// address in its set. Returns the two and the host rule's plan.
pub fn nft_pod_on_node(kubelet_uid: u32) -> (crate::PodWorld, Plan) {
    pod_on_node(redirect::Backend::Nft, ProbeSource::KubeletUid(kubelet_uid))
}

/// [`nft_pod_on_node`] on an iptables-legacy node: the pod's ambient rules and Istio's legacy
/// host rule (`nat ISTIO_POSTRT`, any local socket, the ipset `istio-inpod-probes-v4`).
pub fn legacy_pod_on_node() -> (crate::PodWorld, Plan) {
    pod_on_node(
        redirect::Backend::IptablesLegacy,
        ProbeSource::AnyLocalSocket,
    )
}

fn pod_on_node(backend: redirect::Backend, source: ProbeSource) -> (crate::PodWorld, Plan) {
    let w = crate::PodWorld::ipv4_only().expect("pod and world namespaces");
    let inpod = Plan::ambient(&capture::AmbientConfig::default()).expect("the in-pod plan");
    let fixed = redirect::BackendChoice::Fixed(backend);
    redirect::apply(&inpod, Some(w.pod.path()), fixed).expect("the in-pod rules");
    let host = host_plan(source, false);
    let pod = IpAddr::V4(w.pod_v4);
    let rule = redirect::host_probe::HostProbeRule::new(backend);
    in_ns(w.world.path(), || {
        rule.ensure(&host)?;
        rule.add_pod_ips(&host, &[pod], "uid-a")
    })
    .expect("the host rule");
    (w, host)
}
