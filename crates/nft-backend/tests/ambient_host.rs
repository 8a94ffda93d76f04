//! Ambient's host rule on the real kernel: a "node" namespace (the world side of a pod/world
//! pair) gets the probe SNAT rule and the sets of ambient pod IPs; the pod gets ambient's
//! in-pod rules and a stand-in ztunnel. Probes from the kubelet's uid reach the app from
//! 169.254.7.127 un-proxied; other uids, and pods not in the set, are left alone.

use capture::*;
use nft_backend::ambient_host;
use std::net::IpAddr;
use testbed::host_probe::{KUBELET_UID, OTHER_UID, ZTUNNEL, in_ns, seen_from};
use testbed::*;

/// The host rule for the kubelet's uid.
fn kubelet_plan(ipv6: bool) -> Plan {
    HostProbeConfig::default_plan(ProbeSource::KubeletUid(KUBELET_UID), ipv6)
}

fn set_elements(node: &TestNetns, set: &str) -> String {
    node.exec_ok("nft", &["list", "set", "inet", "istio-ambient-nat", set])
        .unwrap()
}

#[test]
fn kubelet_probes_are_snatted_and_reach_the_app_unproxied() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let inpod = Plan::ambient(&AmbientConfig::default()).unwrap();
    in_ns(w.pod.path(), || nft_backend::apply(&inpod)).unwrap();
    let ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let host = kubelet_plan(false);
    in_ns(node, || ambient_host::ensure(&host)).unwrap();

    let kubelet = ConnectSpec::new(pod, 8080).uid(KUBELET_UID);
    let other = ConnectSpec::new(pod, 8080).uid(OTHER_UID);
    let node_ip = IpAddr::V4(w.world_v4);
    let snat = IpAddr::V4(ambient_constants::HOST_PROBE_SNAT_V4);

    // Pod not (yet) in the set: nothing is SNATed, inbound goes to ztunnel.
    assert_eq!(seen_from(&ztunnel, node, &kubelet), (15006, node_ip));

    in_ns(node, || {
        ambient_host::add_pod_ips(&host, &[pod], "pod-uid-a")
    })
    .unwrap();
    // Adding again is harmless.
    in_ns(node, || {
        ambient_host::add_pod_ips(&host, &[pod], "pod-uid-a")
    })
    .unwrap();
    assert!(set_elements(&w.world, "istio-inpod-probes-v4").contains(&w.pod_v4.to_string()));
    // Kubelet's probe: SNATed on the node, so the in-pod rules let it reach the app.
    assert_eq!(seen_from(&ztunnel, node, &kubelet), (8080, snat));
    // Another uid on the node: not a probe, goes through ztunnel with its own address.
    assert_eq!(seen_from(&ztunnel, node, &other), (15006, node_ip));

    // Re-ensuring the rule (agent restart) keeps the set's elements.
    in_ns(node, || ambient_host::ensure(&host)).unwrap();
    assert_eq!(seen_from(&ztunnel, node, &kubelet), (8080, snat));

    in_ns(node, || ambient_host::remove_pod_ips(&host, &[pod])).unwrap();
    // Removing what is not there (a repeated DEL) is harmless.
    in_ns(node, || ambient_host::remove_pod_ips(&host, &[pod])).unwrap();
    assert_eq!(seen_from(&ztunnel, node, &kubelet), (15006, node_ip));

    assert!(in_ns(node, ambient_host::remove_all).unwrap());
    assert!(!in_ns(node, ambient_host::remove_all).unwrap());
    let tables = w.world.exec_ok("nft", &["list", "tables"]).unwrap();
    assert!(tables.trim().is_empty(), "{tables}");
}

#[test]
fn set_elements_follow_pods_in_both_families() {
    require_root();
    let node = TestNetns::with_prefix("amb-node").unwrap();
    let host = kubelet_plan(true);
    in_ns(node.path(), || ambient_host::ensure(&host)).unwrap();
    let a: Vec<IpAddr> = vec!["10.1.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
    let b: Vec<IpAddr> = vec!["10.1.0.6".parse().unwrap()];
    // An IPv4-mapped IPv6 address is the IPv4 address (as Istio's `Unmap`).
    let mapped: Vec<IpAddr> = vec!["::ffff:10.1.0.7".parse().unwrap()];
    in_ns(node.path(), || {
        ambient_host::add_pod_ips(&host, &a, "uid-a")?;
        ambient_host::add_pod_ips(&host, &b, "uid-b")?;
        ambient_host::add_pod_ips(&host, &mapped, "uid-c")
    })
    .unwrap();
    let v4 = set_elements(&node, "istio-inpod-probes-v4");
    let v6 = set_elements(&node, "istio-inpod-probes-v6");
    for ip in ["10.1.0.5", "10.1.0.6", "10.1.0.7"] {
        assert!(v4.contains(ip), "{v4}");
    }
    assert!(v4.contains("comment \"uid-a\""), "{v4}");
    assert!(
        v6.contains("fd00::5") && v6.contains("comment \"uid-a\""),
        "{v6}"
    );
    // Removing pod a (a mix of present and absent IPs) leaves b.
    let gone: Vec<IpAddr> = vec![a[0], a[1], "10.9.9.9".parse().unwrap()];
    in_ns(node.path(), || ambient_host::remove_pod_ips(&host, &gone)).unwrap();
    let v4 = set_elements(&node, "istio-inpod-probes-v4");
    assert!(!v4.contains("10.1.0.5") && v4.contains("10.1.0.6"), "{v4}");
    assert!(!set_elements(&node, "istio-inpod-probes-v6").contains("fd00::5"));

    // With IPv6 off there is no v6 set, and IPv6 pod IPs are skipped (as Istio does).
    let v4_only = kubelet_plan(false);
    let other = TestNetns::with_prefix("amb-node4").unwrap();
    in_ns(other.path(), || {
        ambient_host::ensure(&v4_only)?;
        ambient_host::add_pod_ips(&v4_only, &a, "uid-a")
    })
    .unwrap();
    let listing = other.exec_ok("nft", &["list", "ruleset"]).unwrap();
    assert!(
        listing.contains("10.1.0.5") && !listing.contains("fd00::5"),
        "{listing}"
    );
    assert!(!listing.contains("istio-inpod-probes-v6"), "{listing}");
}

/// `--check` reads named sets' declarations back (key type, comment) and compares them, not
/// their elements, which follow the pods.
#[test]
fn check_compares_named_set_declarations_not_elements() {
    require_root();
    let node = TestNetns::with_prefix("amb-check").unwrap();
    let host = kubelet_plan(false);
    let check = || in_ns(node.path(), || nft_backend::check(&host)).unwrap();
    in_ns(node.path(), || ambient_host::ensure(&host)).unwrap();
    let ip: Vec<IpAddr> = vec!["10.1.0.5".parse().unwrap()];
    in_ns(node.path(), || {
        ambient_host::add_pod_ips(&host, &ip, "uid-a")
    })
    .unwrap();
    assert_eq!(check(), Vec::<String>::new());

    // A set of the same name declared otherwise before the rule: `add set` keeps it.
    let other = TestNetns::with_prefix("amb-check2").unwrap();
    let set = "istio-inpod-probes-v4";
    let decl = format!(
        "add table inet istio-ambient-nat; \
         add set inet istio-ambient-nat {set} {{ type ipv4_addr; comment \"someone else's\"; }}"
    );
    other.exec_ok("nft", &[decl.as_str()]).unwrap();
    in_ns(other.path(), || ambient_host::ensure(&host)).unwrap();
    let drift = in_ns(other.path(), || nft_backend::check(&host)).unwrap();
    assert!(
        drift.iter().any(|d| d.contains(set)
            && d.contains("expected type ipv4_addr; comment \"IPs of the ambient pods")
            && d.contains("found type ipv4_addr; comment \"someone else's\"")),
        "{drift:?}"
    );
}

/// Istio's iptables flavour of the host rule (`--socket-exists`), rendered by nft as
/// `meta skuid >= 0`: the probes of every local process are SNATed, whatever its uid.
#[test]
fn any_local_socket_source_snats_every_local_process() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let app = Probe::start(w.pod.path(), "pod", &[Listen::tcp(8080)]).unwrap();
    let host = HostProbeConfig::default_plan(ProbeSource::AnyLocalSocket, false);
    in_ns(node, || {
        ambient_host::ensure(&host)?;
        ambient_host::add_pod_ips(&host, &[pod], "pod-uid")
    })
    .unwrap();
    let snat = IpAddr::V4(ambient_constants::HOST_PROBE_SNAT_V4);
    for uid in [0, OTHER_UID, KUBELET_UID] {
        let spec = ConnectSpec::new(pod, 8080).uid(uid);
        assert_eq!(seen_from(&app, node, &spec), (8080, snat), "uid {uid}");
    }
    let listing = w
        .world
        .exec_ok(
            "nft",
            &[
                "list",
                "chain",
                "inet",
                "istio-ambient-nat",
                "istio-postrouting",
            ],
        )
        .unwrap();
    assert!(listing.contains("meta skuid >= 0"), "{listing}");
}
