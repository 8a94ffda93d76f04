//! What the CLI's tests share: the binary under test and its output as a failure shows it.
#![allow(dead_code)]

use capture::{HostProbeConfig, Plan, ProbeSource};
use std::net::IpAddr;
use std::process::Output;
use std::sync::LazyLock;
use testbed::PodWorld;
use testbed::host_probe::in_ns;

/// The CLI under test: the shipped build when `ISTIO_CNI_BIN_DIR` is set, else this crate's.
pub static CLI: LazyLock<String> = LazyLock::new(|| {
    testbed::node::product_binary("istio-nftables", env!("CARGO_BIN_EXE_istio-nftables"))
        .display()
        .to_string()
});

/// Exit status, stdout and stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The host rule's plan (`Plan::ambient_host`) for `source`.
fn host_plan(source: ProbeSource, ipv6: bool) -> Plan {
    Plan::ambient_host(&HostProbeConfig::new(source, ipv6)).expect("a valid host probe config")
}

/// An IPv4 ambient pod and its node (the world side): the pod has the default in-pod rules
/// (nft), the node the nft host probe rule for the kubelet's uid `kubelet_uid` with the pod's
/// address in its set. Returns the two and the host rule's plan.
pub fn nft_pod_on_node(kubelet_uid: u32) -> (PodWorld, Plan) {
    pod_on_node(redirect::Backend::Nft, ProbeSource::KubeletUid(kubelet_uid))
}

/// [`nft_pod_on_node`] on an iptables-legacy node: the pod's ambient rules and Istio's legacy
/// host rule (`nat ISTIO_POSTRT`, any local socket, the ipset `istio-inpod-probes-v4`).
pub fn legacy_pod_on_node() -> (PodWorld, Plan) {
    pod_on_node(
        redirect::Backend::IptablesLegacy,
        ProbeSource::AnyLocalSocket,
    )
}

fn pod_on_node(backend: redirect::Backend, source: ProbeSource) -> (PodWorld, Plan) {
    let w = PodWorld::ipv4_only().expect("pod and world namespaces");
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
