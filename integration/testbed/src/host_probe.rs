//! Shared scaffolding of the host probe rule's kernel tests (the nft backend's
//! `crates/nft-backend/tests/ambient_host.rs`, the legacy backend's
//! `crates/iptables-legacy/tests/ambient_host.rs`, `crates/redirect/tests/host_probe.rs`, and
//! explain's host rule tests): a
//! "node" namespace (the world side of a [`crate::PodWorld`]) holding the host rule, a pod
//! with ambient's in-pod rules and a stand-in ztunnel, connections from the node as kubelet's
//! uid or another one. The rule's plan (`capture::Plan::ambient_host`) and the rule itself
//! come from each test (testbed depends on no crate of the workspace); `integration::host_probe`
//! adds a pod on a node with both, through `redirect`.

use crate::{ConnectSpec, Listen, Probe, connect};
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

/// Runs `f` inside the namespace `ns` (on a thread of its own).
pub fn in_ns<T: Send>(ns: &Path, f: impl FnOnce() -> T + Send) -> T {
    crate::run_in(Some(ns), f).expect("entering the namespace")
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
