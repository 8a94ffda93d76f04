//! Ambient mode on a dual-stack node, end to end with the REAL ztunnel (see
//! `integration::ambient` for the rig): pods get an IPv4 and an IPv6 address from the chain
//! (bridge + host-local with both ranges, fixed addresses through the `ips` capability), ztunnel knows
//! both addresses of each workload, and the agent enrolls both (the plugin's `IPs`).
//!
//! With `AMBIENT_IPV6=true`: A -> B over IPv6 is HBONE (mutual TLS on B's side, B's app sees
//! A's IPv6 address), kubelet's IPv6 probe is SNATed to `HOST_PROBE_SNAT_IPV6` and reaches the
//! app directly while another uid's goes through ztunnel's inbound, DNS over IPv6 to the pod's
//! nameserver is answered by ztunnel's DNS proxy (15053 on `::1`). With `AMBIENT_IPV6=false`
//! IPv6 is left alone: no IPv6 rule in the pod, no IPv6 probe set or policy route, IPv6
//! connections and DNS go where they were sent, while IPv4 still goes through ztunnel.
//!
//! Needs root, cnitool, the product's binaries (`cargo build --bins`) and the ztunnel binary
//! (`integration/scripts/build-ztunnel.sh`); under `CI=true` nothing skips.

use integration::ambient::prerequisites;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use capture::ambient_constants::{HOST_PROBE_SNAT_V4, HOST_PROBE_SNAT_V6};
use integration::ambient::{
    AmbientNode, AmbientOptions, KUBELET_UID, Mode, OTHER_UID, Pod, PodPlan,
};
use integration::ambient::{lands, last_peer, opened};
use integration::dns::query_a;
use integration::node::{GATEWAY_V4, GATEWAY_V6};
use integration::pods::APP_UID;
use integration::ztunnel::{LocalService, hbone_labels, passthrough_labels};
use integration::{ConnectSpec, Probe, send_udp};

const APP: u16 = integration::ambient::APP_PORT;
const SERVICE: &str = "b.default.svc.cluster.local";

/// Dual-stack ambient pods a and b: `10.88.<net>.10/11`, `fd00:88::<net>:10/11`.
fn pods(net: u8) -> (PodPlan, PodPlan) {
    let v6 = |host: u16| format!("fd00:88::{net}:{host}").parse().unwrap();
    (
        PodPlan::new("a", [10, 88, net, 10], Mode::Ambient).with_ip6(v6(0x10)),
        PodPlan::new("b", [10, 88, net, 11], Mode::Ambient).with_ip6(v6(0x11)),
    )
}

/// B behind a service VIP, whose name only ztunnel's DNS proxy knows.
fn service_b() -> LocalService {
    LocalService::for_workload("b", "10.96.0.20".parse().unwrap(), 80, APP)
}

fn options(ipv6: bool) -> AmbientOptions {
    AmbientOptions {
        services: vec![service_b()],
        ipv6,
        dual_stack: true,
        ..AmbientOptions::default()
    }
}

/// `nft -s list table inet <name>` inside the pod (no counters; empty when there is none).
fn pod_table(pod: &Pod, name: &str) -> String {
    pod.ns
        .exec_ok("nft", &["-s", "list", "table", "inet", name])
        .unwrap_or_default()
}

fn ip6_rules(pod: &Pod) -> String {
    pod.ns.exec_ok("ip", &["-6", "rule", "show"]).unwrap()
}

/// A DNS query over IPv6 to the pod's IPv6 nameserver (the node's bridge address, where
/// nothing answers DNS): only ztunnel's DNS proxy knows the service's name.
fn dns_over_v6(pod: &Pod, timeout: Duration) -> std::io::Result<integration::dns::DnsReply> {
    let server = SocketAddr::new(GATEWAY_V6.parse().unwrap(), 53);
    query_a(pod.ns.path(), server, SERVICE, timeout)
}

#[test]
fn dual_stack_ambient_pods_talk_hbone_over_ipv6_and_probes_and_dns_work_on_ipv6() {
    let Some(bin) = prerequisites() else { return };
    let (a, b) = pods(6);
    let mut n = AmbientNode::start(&bin, &options(true), &[a.clone(), b.clone()]).unwrap();
    let (pa, pb) = (n.start_pod(&a), n.start_pod(&b));
    let gateway6: IpAddr = GATEWAY_V6.parse().unwrap();
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());

    // Both families programmed: IPv6 rules in the pod, IPv6 TPROXY policy route, both
    // addresses in the node's probe sets.
    let nat = pod_table(&pa, "istio-ambient-nat");
    assert!(
        nat.contains(&format!("ip6 saddr {HOST_PROBE_SNAT_V6}"))
            && nat.contains("ip6 daddr != ::1"),
        "{nat}"
    );
    assert!(ip6_rules(&pa).contains("fwmark 0x111/0xfff lookup 100"));
    let mut set = n.probe_set_v6();
    set.sort();
    assert_eq!(set, [pa.ip6(), pb.ip6()], "{}", n.host_table());
    assert_eq!(n.probe_set().len(), 2, "{}", n.host_table());

    // A -> B:8080 over IPv6: through A's ztunnel (15001) over HBONE to B's ztunnel (15008,
    // mutual TLS) to B's app, which sees A's IPv6 address.
    let mtls = hbone_labels("a", "b");
    let before = opened(&n, &mtls);
    let o = n.from_pod(&pa, pb.ip6(), APP);
    lands(&n, &o, "b", APP);
    assert_eq!(last_peer(&pb), pa.ip6());
    n.eventually("A -> B over IPv6 counted by B's ztunnel as mTLS", || {
        opened(&n, &mtls) > before
    });
    // ztunnel's access log: the tunnel itself went to B's IPv6 address on 15008.
    let tunnel = format!("dst.addr=[{}]:15008", pb.ip6());
    let target = format!("dst.hbone_addr=[{}]:{APP}", pb.ip6());
    n.eventually("ztunnel logs the HBONE tunnel over IPv6", || {
        n.zt.log()
            .lines()
            .any(|l| l.contains(&tunnel) && l.contains(&target))
    });

    // kubelet's IPv6 probe reaches A's app directly, SNATed to HOST_PROBE_SNAT_IPV6;
    // another uid's connection over IPv6 is captured by A's ztunnel inbound (15006).
    let inbound = [("reporter", "destination"), ("destination_workload", "a")];
    let before = opened(&n, &inbound);
    let o = n.from_node(KUBELET_UID, pa.ip6(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V6(HOST_PROBE_SNAT_V6));
    let o = n.from_node(OTHER_UID, pa.ip6(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), gateway6, "ztunnel keeps the node's address");
    n.eventually(
        "the node's IPv6 non-probe connection counted by A's inbound",
        || opened(&n, &inbound) > before,
    );

    // DNS over UDP/IPv6 to the pod's nameserver: answered by ztunnel's DNS proxy.
    let reply = dns_over_v6(&pa, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("DNS over IPv6 from A: {e}\n{}", n.logs()));
    assert_eq!(reply.addresses, [service_b().vip], "{reply:?}");
    assert_eq!(
        reply.from.ip(),
        gateway6,
        "the reply comes from where it was sent"
    );

    // A -> a non-mesh IPv6 address: through A's ztunnel outbound (15001), passed through.
    let outside = Probe::world(n.node.ns.path()).unwrap();
    let unknown = passthrough_labels("a");
    let before = opened(&n, &unknown);
    let o = n.from_pod(&pa, gateway6, 80);
    lands(&n, &o, "world", 80);
    assert_eq!(outside.accepted().last().unwrap().peer.ip(), pa.ip6());
    n.eventually("A -> outside over IPv6 counted by ztunnel", || {
        opened(&n, &unknown) > before
    });

    // Agent restart: the dual-stack pods are found again (their status lists both addresses),
    // both probe sets refilled, the IPv6 rules and policy route unchanged, IPv6 HBONE works.
    let tables_before: Vec<String> = ["istio-ambient-nat", "istio-ambient-mangle"]
        .iter()
        .map(|t| pod_table(&pa, t))
        .collect();
    let (status, _log) = n.node.stop_daemon().unwrap();
    assert!(status.success(), "{status:?}");
    n.node.start_daemon().unwrap();
    n.eventually("both IPv6 addresses back in the probe set", || {
        let mut set = n.probe_set_v6();
        set.sort();
        set == [pa.ip6(), pb.ip6()]
    });
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());
    for (t, before) in ["istio-ambient-nat", "istio-ambient-mangle"]
        .iter()
        .zip(&tables_before)
    {
        assert_eq!(&pod_table(&pa, t), before, "{t}");
    }
    assert!(ip6_rules(&pa).contains("fwmark 0x111/0xfff lookup 100"));
    let before = opened(&n, &mtls);
    let o = n.from_pod(&pa, pb.ip6(), APP);
    lands(&n, &o, "b", APP);
    n.eventually("A -> B over IPv6 after the agent's restart", || {
        opened(&n, &mtls) > before
    });
    let o = n.from_node(KUBELET_UID, pa.ip6(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V6(HOST_PROBE_SNAT_V6));

    // DEL B: both of its addresses leave the probe sets, its IPv6 rules go with the tables.
    n.del(&pb).assert_ok();
    n.eventually("ztunnel gone from B after DEL", || n.not_served(&pb));
    assert!(n.ambient_tables(&pb).is_empty(), "{:?}", n.tables(&pb));
    assert_eq!(n.probe_set_v6(), [pa.ip6()], "{}", n.host_table());
    assert_eq!(n.probe_set(), [pa.ip()], "{}", n.host_table());
}

#[test]
fn with_ambient_ipv6_off_ipv6_is_left_alone_and_ipv4_still_goes_through_ztunnel() {
    let Some(bin) = prerequisites() else { return };
    let (a, b) = pods(7);
    let n = AmbientNode::start(&bin, &options(false), &[a.clone(), b.clone()]).unwrap();
    let (pa, pb) = (n.start_pod(&a), n.start_pod(&b));
    let outside = Probe::world(n.node.ns.path()).unwrap();
    let gateway6: IpAddr = GATEWAY_V6.parse().unwrap();
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());

    // No IPv6 rule in the pod: nothing mentions IPv6, every base-chain jump is IPv4-only.
    for t in n.ambient_tables(&pa) {
        let name = t.trim_start_matches("inet ");
        let text = pod_table(&pa, name);
        assert!(!text.contains("ip6") && !text.contains("ipv6"), "{text}");
        for l in text.lines().filter(|l| l.contains(" jump ")) {
            assert!(l.contains("meta nfproto ipv4"), "{t}: {l}");
        }
    }
    assert!(!ip6_rules(&pa).contains("0x111"), "{}", ip6_rules(&pa));
    assert!(!n.host_table().contains("probes-v6"), "{}", n.host_table());

    // A -> B over IPv6 goes straight to B's app; A -> B over IPv4 through ztunnel. Only the
    // IPv4 one is counted (the IPv6 one went first).
    let mtls = hbone_labels("a", "b");
    let before = opened(&n, &mtls);
    let o = n.from_pod(&pa, pb.ip6(), APP);
    lands(&n, &o, "b", APP);
    assert_eq!(last_peer(&pb), pa.ip6());
    let o = n.from_pod(&pa, pb.ip(), APP);
    lands(&n, &o, "b", APP);
    n.eventually("A -> B over IPv4 counted as mTLS", || {
        opened(&n, &mtls) > before
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        opened(&n, &mtls),
        before + 1.0,
        "the IPv6 connection was counted"
    );

    // From the node over IPv6, any uid: direct, no SNAT, not seen by ztunnel.
    let inbound = [("reporter", "destination"), ("destination_workload", "a")];
    let before = opened(&n, &inbound);
    for uid in [KUBELET_UID, OTHER_UID] {
        let o = n.from_node(uid, pa.ip6(), APP);
        lands(&n, &o, "a", APP);
        assert_eq!(last_peer(&pa), gateway6);
    }
    // ...while kubelet's IPv4 probe is still SNATed.
    let o = n.from_node(KUBELET_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(opened(&n, &inbound), before, "ztunnel saw an IPv6 inbound");

    // DNS over IPv6 is not captured (it reaches the node's port 53); over IPv4 it is.
    let dns6 = ConnectSpec::new(gateway6, 53).uid(APP_UID).gid(APP_UID);
    let o = send_udp(pa.ns.path(), &dns6);
    lands(&n, &o, "world", 53);
    assert_eq!(outside.accepted().last().unwrap().peer.ip(), pa.ip6());
    let gateway4 = SocketAddr::new(GATEWAY_V4.parse().unwrap(), 53);
    let reply = query_a(pa.ns.path(), gateway4, SERVICE, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("DNS over IPv4 from A: {e}\n{}", n.logs()));
    assert_eq!(reply.addresses, [service_b().vip], "{reply:?}");
}
