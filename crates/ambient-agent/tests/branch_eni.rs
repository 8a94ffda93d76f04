//! `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE` on the real kernel: aws-vpc-cni's Security Groups
//! for Pods layout rebuilt in a "node" namespace, and the agent's part of Istio's fix
//! (`ambient_agent::branch_eni::BranchEniProbe`, which `Agent` calls with the probe addresses:
//! `add` on enroll and adoption, `remove` on release and undo) through
//! `redirect::branch_eni` and `pod_routes::branch_eni`.
//!
//! The layout (vlan mode, as aws-vpc-cni writes it for a branch ENI pod): the pod's veth
//! `vlan8c1f0a5e7b2` has no address; its host route lives only in table 101, with a default
//! route out the trunk's VLAN device (`vlan.eth.1`, a veth into the VPC's namespace here); `iif
//! vlan.eth.1 lookup 101` and `iif vlan8c1f0a5e7b2 lookup 101` at priority 10; the main table
//! has no route to the pod, so the node's own traffic to it follows the default route to the
//! VPC gateway (another namespace, which does not forward). The pod reaches the node through
//! 169.254.1.1 (a permanent neighbour entry on the veth's MAC). A regular pod beside it has
//! `to <ip> lookup main` at 512 and its route in main. The pod has ambient's in-pod rules and a
//! stand-in ztunnel, the node the host probe rule: kubelet's probe is SNATed to 169.254.7.127.

use ambient_agent::branch_eni::BranchEniProbe;
use capture::ambient_constants::HOST_PROBE_SNAT_V4;
use capture::{AmbientConfig, HostProbeConfig, Plan};
use redirect::branch_eni::BranchEni;
use redirect::host_probe::HostProbeRule;
use redirect::{Backend, BackendChoice};
use std::net::IpAddr;
use std::time::Duration;
use testbed::host_probe::{KUBELET_UID, ZTUNNEL, in_ns, seen_from};
use testbed::*;

const VETH: &str = "vlan8c1f0a5e7b2";
const VETH_MAC: &str = "02:00:00:00:0b:01";
const POD: &str = "10.78.0.50";
const REGULAR: &str = "10.78.0.60";

struct SgpNode {
    node: TestNetns,
    _vpc: TestNetns,
    pod: TestNetns,
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn lines(l: &[&str]) -> Vec<String> {
    l.iter().map(|s| s.to_string()).collect()
}

/// The node, its VPC gateway and the branch ENI pod; `tcp_early_demux` as given.
fn sgp_node(early_demux: u8) -> SgpNode {
    require_root();
    let node = TestNetns::with_prefix("beni-node").unwrap();
    let vpc = TestNetns::with_prefix("beni-vpc").unwrap();
    let pod = TestNetns::with_prefix("beni-pod").unwrap();
    let (vpc_name, pod_name) = (vpc.name(), pod.name());
    // IPv6 link-local addresses (and their local routes) at once when a link comes up, not
    // after duplicate address detection: else one may appear between two snapshots of the
    // node's routing below (seen in CI: `local fe80::… dev vlan8c1f0a5e7b2` in the second).
    node.sh("sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0")
        .unwrap();
    node.ip_batch(&[
        format!("link add eth0 type veth peer name eth0 netns {vpc_name}"),
        format!("link add {VETH} address {VETH_MAC} type veth peer name eth0 netns {pod_name}"),
        format!("link add vlan.eth.1 type veth peer name trunk netns {vpc_name}"),
        "link add eni4d1e2f3a4b5 type veth peer name eni-peer".into(),
    ])
    .unwrap();
    node.ip_batch(&lines(&[
        "link set eth0 up",
        "addr add 10.77.0.1/24 dev eth0",
        "route add default via 10.77.0.2 dev eth0",
        "link set vlan.eth.1 up",
        "link set vlan8c1f0a5e7b2 up",
        "route add 10.78.0.50 dev vlan8c1f0a5e7b2 scope link table 101",
        "route add default via 10.77.0.2 dev vlan.eth.1 onlink table 101",
        "rule add iif vlan.eth.1 lookup 101 priority 10",
        "rule add iif vlan8c1f0a5e7b2 lookup 101 priority 10",
        "link set eni4d1e2f3a4b5 up",
        "route add 10.78.0.60 dev eni4d1e2f3a4b5 scope link",
        "rule add to 10.78.0.60 lookup main priority 512",
    ]))
    .unwrap();
    vpc.ip_batch(&lines(&[
        "link set eth0 up",
        "addr add 10.77.0.2/24 dev eth0",
        "link set trunk up",
    ]))
    .unwrap();
    pod.ip_batch(&[
        "link set eth0 up".into(),
        format!("addr add {POD}/32 dev eth0"),
        "route add 169.254.1.1 dev eth0 scope link".into(),
        "route add default via 169.254.1.1 dev eth0".into(),
        format!("neigh add 169.254.1.1 lladdr {VETH_MAC} dev eth0 nud permanent"),
    ])
    .unwrap();
    node.sh(&format!(
        "echo {early_demux} > /proc/sys/net/ipv4/tcp_early_demux; echo 1 > /proc/sys/net/ipv4/ip_forward"
    ))
    .unwrap();
    SgpNode {
        node,
        _vpc: vpc,
        pod,
    }
}

/// The node's policy rules and every table's routes, both families.
fn routing(node: &TestNetns) -> String {
    let mut s = String::new();
    for args in [
        &["-4", "rule", "show"][..],
        &["-6", "rule", "show"],
        &["-4", "route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
    ] {
        s += &node.exec_ok("ip", args).unwrap();
    }
    s
}

fn route_to_pod(node: &TestNetns) -> String {
    node.exec_ok("ip", &["route", "get", POD]).unwrap()
}

/// Ambient's in-pod rules, a stand-in ztunnel and the app, and the node's host probe rule.
fn ambient_pod(w: &SgpNode) -> Probe {
    let inpod = Plan::ambient(&AmbientConfig::default()).unwrap();
    let backend = BackendChoice::Fixed(Backend::Nft);
    redirect::apply(&inpod, Some(w.pod.path()), backend).unwrap();
    let ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let rule = HostProbeRule::new(Backend::Nft);
    let config = HostProbeConfig::new(rule.probe_source(Some(KUBELET_UID)), false);
    let plan = Plan::ambient_host(&config).unwrap();
    in_ns(w.node.path(), || {
        rule.ensure(&plan)?;
        rule.add_pod_ips(&plan, &[ip(POD)], "uid-branch")
    })
    .unwrap();
    ztunnel
}

fn kubelet() -> ConnectSpec {
    ConnectSpec::new(ip(POD), 8080)
        .uid(KUBELET_UID)
        .timeout(Duration::from_secs(1))
}

#[test]
fn kubelets_probe_reaches_a_branch_eni_pod_through_its_veth_only_with_istios_rules() {
    let w = sgp_node(0);
    let ztunnel = ambient_pod(&w);
    let node = w.node.path();
    let before = routing(&w.node);
    let rules_before = w.node.exec_ok("ip", &["-4", "rule", "show"]).unwrap();
    assert!(in_ns(node, redirect::branch_eni::early_demux_disabled).unwrap());

    // (a) aws-vpc-cni's layout alone: the node's traffic to the pod goes to the VPC gateway.
    let route = route_to_pod(&w.node);
    assert!(route.contains("via 10.77.0.2 dev eth0"), "{route}");
    let o = connect(node, &kubelet());
    assert_eq!(o.landed_port(), None, "probe landed without the rules: {o}");
    assert!(ztunnel.accepted().is_empty());

    // Detection: the branch ENI pod only.
    let eni = BranchEni {
        table: 101,
        veth: VETH.into(),
        iif_priority: 10,
    };
    in_ns(node, || {
        assert_eq!(
            redirect::branch_eni::detect(ip(POD)).unwrap(),
            Some(eni.clone())
        );
        assert_eq!(redirect::branch_eni::detect(ip(REGULAR)).unwrap(), None);
        assert_eq!(
            redirect::branch_eni::detect(ip("10.78.0.99")).unwrap(),
            None
        );
    });

    // (b) The agent adds the pod's addresses (twice: a re-ADD); Istio's two rules, once each.
    let probe = BranchEniProbe::new(true);
    in_ns(node, || {
        probe.add("default/branch", &[ip(POD), ip(REGULAR)]);
        probe.add("default/branch", &[ip(POD)]);
    });
    let rules = w.node.exec_ok("ip", &["-4", "rule", "show"]).unwrap();
    for want in [
        format!("9:\tfrom all iif {VETH} lookup local"),
        format!("512:\tfrom all to {POD} lookup 101"),
        "512:\tfrom all to 10.78.0.60 lookup main".into(),
    ] {
        assert_eq!(rules.matches(&want).count(), 1, "{want}:\n{rules}");
    }
    assert_eq!(rules.lines().count(), rules_before.lines().count() + 2);
    assert_eq!(probe.added(), [(ip(POD), eni.clone())]);
    let route = route_to_pod(&w.node);
    assert!(route.contains(&format!("dev {VETH} table 101")), "{route}");
    let snat = IpAddr::V4(HOST_PROBE_SNAT_V4);
    assert_eq!(seen_from(&ztunnel, node, &kubelet()), (8080, snat));

    // (c) Released: the node's routing is what aws-vpc-cni left, exactly; again: no-op.
    in_ns(node, || probe.remove(&[ip(POD), ip(REGULAR)]));
    assert_eq!(routing(&w.node), before);
    assert!(probe.added().is_empty());
    in_ns(node, || {
        assert!(
            redirect::branch_eni::remove(ip(POD), &eni)
                .unwrap()
                .is_empty()
        );
    });
    assert_eq!(routing(&w.node), before);
    assert_eq!(connect(node, &kubelet()).landed_port(), None);
}

/// A node without `tcp_early_demux=0` is not an SGP node: the same layout is left alone.
#[test]
fn a_node_with_tcp_early_demux_on_is_not_touched() {
    let w = sgp_node(1);
    let node = w.node.path();
    let before = routing(&w.node);
    assert!(!in_ns(node, redirect::branch_eni::early_demux_disabled).unwrap());
    let probe = BranchEniProbe::new(true);
    in_ns(node, || probe.add("default/branch", &[ip(POD)]));
    assert!(probe.added().is_empty());
    assert_eq!(routing(&w.node), before);
    // The sysctl is the node namespace's own: another namespace's 0 is not read here.
    let sgp = sgp_node(0);
    assert!(in_ns(sgp.node.path(), redirect::branch_eni::early_demux_disabled).unwrap());
    assert!(!in_ns(node, redirect::branch_eni::early_demux_disabled).unwrap());
}
