//! `explain --host --trace` on an iptables-legacy node, against the real kernel: a node
//! namespace (the world side of a pod/world pair) holds Istio's legacy host probe rule (`nat
//! ISTIO_POSTRT`, any local socket, the ipsets `istio-inpod-probes-v4/v6`), the pod an app on
//! 8080 at two addresses per family, one in the sets and one not. Real connections from the
//! node are read back from the kernel's record (`trace::record_host`: conntrack + counters)
//! and compared with the static explanation: SNATed to the probe address for a pod in the set
//! (any uid: `--socket-exists`), not SNATed otherwise, IPv4 and IPv6; a tampered explanation
//! disagrees. The node's packet loggers (`nf_log`) and its rules (save output without
//! counters) must be exactly as before, and nftables never touched.

use capture::ambient_constants::{HOST_PROBE_SNAT_V4, HOST_PROBE_SNAT_V6};
use capture::{HostProbeConfig, ProbeSource};
use explain::compare::{RECORD_METHOD, compare_record};
use explain::trace::{Attempt, KernelRecord, record_host};
use explain::{self as ex, Connection, Direction, Outcome, Protocol};
use iptables_legacy::ambient_host;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use testbed::host_probe::{KUBELET_UID, OTHER_UID, in_ns};
use testbed::legacy_trace::loggers;
use testbed::*;

/// The node's rules in every legacy table, both families, without counters and comments.
fn rules(node: &TestNetns) -> String {
    ["iptables-legacy-save", "ip6tables-legacy-save"]
        .iter()
        .flat_map(|bin| {
            node.exec_ok(bin, &[])
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| l.split(" [").next().unwrap_or(l).to_string() + "\n")
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A node with Istio's legacy host rule for both families, the pod's first addresses in the
/// sets, a second address per family that is not, and an app on 8080.
struct Node {
    w: PodWorld,
    _app: Probe,
    in_set: [IpAddr; 2],
    not_in_set: [IpAddr; 2],
}

impl Node {
    fn new() -> Node {
        let w = PodWorld::new().unwrap();
        let v4 = w.pod_v4.octets();
        let other4 = Ipv4Addr::new(v4[0], v4[1], v4[2], 3);
        let mut v6 = w.pod_v6.unwrap().segments();
        v6[7] = 3;
        let other6 = Ipv6Addr::from(v6);
        w.pod
            .sh(&format!(
                "ip addr add {other4}/24 dev eth0 && ip addr add {other6}/64 dev eth0 nodad"
            ))
            .unwrap();
        let app = Probe::start(w.pod.path(), "pod", &[Listen::tcp(8080)]).unwrap();
        let host = HostProbeConfig::default_plan(ProbeSource::AnyLocalSocket, true);
        let in_set = [IpAddr::V4(w.pod_v4), IpAddr::V6(w.pod_v6.unwrap())];
        // The node has talked to its pods before they are probed, as a real node has (observed
        // in this rig: when the node's first packet to a pod's IPv6 address is SNATed, the
        // neighbour resolution it starts loses it and the connection times out).
        for ip in in_set {
            let o = connect(w.world.path(), &ConnectSpec::new(ip, 8080));
            assert_eq!(o.landed_port(), Some(8080), "{ip}: {o}");
        }
        in_ns(w.world.path(), || {
            ambient_host::ensure(&host, &iptables_legacy::Tools::default())?;
            ambient_host::add_pod_ips(&host, &in_set, "uid-a", &iptables_legacy::Tools::default())
        })
        .unwrap();
        Node {
            w,
            _app: app,
            in_set,
            not_in_set: [other4.into(), other6.into()],
        }
    }

    fn path(&self) -> &Path {
        self.w.world.path()
    }

    /// The static explanation of `conn` from the node, and the kernel's record of it; the
    /// node's loggers and rules must not change, nor nftables appear.
    fn explained_and_recorded(&self, conn: &Connection) -> (ex::Explanation, KernelRecord) {
        let node = self.path();
        let rs = ex::live_legacy_host_ruleset(Some(node)).unwrap();
        let facts = ex::namespace_facts(Some(node), conn).unwrap();
        let e = ex::explain_with(&rs, conn, &facts).unwrap();
        let (logs, before) = (loggers(node), rules(&self.w.world));
        let rec = record_host(Some(node), conn).unwrap_or_else(|err| panic!("{conn:?}: {err}"));
        assert_eq!(loggers(node), logs, "the node's packet loggers changed");
        assert_eq!(rules(&self.w.world), before, "the node's rules changed");
        let nft = self.w.world.exec_ok("nft", &["list", "ruleset"]).unwrap();
        assert!(nft.trim().is_empty(), "nftables on the node: {nft}");
        (e, rec)
    }
}

fn to_app(dst: IpAddr, uid: u32) -> Connection {
    Connection::new(
        Direction::Outbound,
        Protocol::Tcp,
        SocketAddr::new(dst, 8080),
    )
    .uid(uid)
}

fn snat_of(dst: IpAddr) -> IpAddr {
    match dst {
        IpAddr::V4(_) => IpAddr::V4(HOST_PROBE_SNAT_V4),
        IpAddr::V6(_) => IpAddr::V6(HOST_PROBE_SNAT_V6),
    }
}

/// A pod in the set is SNATed to the probe address whatever the uid, an address not in the
/// set is not; in both families the kernel's record agrees with the static explanation, and
/// the SNAT rule's counter moved exactly when conntrack says SNAT.
#[test]
fn the_kernels_record_confirms_the_legacy_host_rule_in_both_families() {
    require_root();
    let n = Node::new();
    let mut cases: Vec<(IpAddr, u32, Option<IpAddr>)> = Vec::new();
    for (in_set, not_in_set) in n.in_set.into_iter().zip(n.not_in_set) {
        for uid in [KUBELET_UID, OTHER_UID] {
            cases.push((in_set, uid, Some(snat_of(in_set))));
        }
        cases.push((not_in_set, KUBELET_UID, None));
    }
    for (dst, uid, snat) in cases {
        let conn = to_app(dst, uid);
        let (e, rec) = n.explained_and_recorded(&conn);
        let what = format!("{dst} as {uid}: {rec:?}\n{}", ex::render_text(&e));
        assert!(matches!(rec.attempt, Attempt::Connected { .. }), "{what}");
        let entry = rec.conntrack.as_ref().expect("a conntrack entry");
        assert_eq!(entry.snat(), snat, "{what}");
        assert_eq!(entry.original.dst, conn.dst, "{what}");
        let ag = compare_record(&e, &rec);
        assert!(ag.agree && ag.not_traced.is_empty(), "{ag:?}\n{what}");
        assert!(ag.kernel_steps.is_empty(), "a record is not a path");
        let shown = ag.record.expect("the record");
        assert_eq!(shown.method, RECORD_METHOD);
        let snat_rule = rec.counters.iter().find(|c| c.is_snat()).expect("{what}");
        assert_eq!(snat_rule.chain, "ISTIO_POSTRT");
        if snat.is_some() {
            // Only ours run here: the counter moved by exactly our connection's first packet.
            assert_eq!(snat_rule.moved(), 1, "{what}");
            assert!(matches!(e.outcome, Outcome::Snatted { .. }), "{what}");
        } else {
            assert_eq!(snat_rule.moved(), 0, "{what}");
        }
        assert_eq!(shown.corroborated, Some(true), "{what}");
    }
}

/// A static explanation that says the opposite of what the kernel did is reported as a
/// disagreement naming both, in either direction.
#[test]
fn a_wrong_static_outcome_is_reported_as_disagreement() {
    require_root();
    let n = Node::new();
    let snatted = to_app(n.in_set[0], KUBELET_UID);
    let (mut e, rec) = n.explained_and_recorded(&snatted);
    e.outcome = Outcome::Untouched {
        reason: "tampered".into(),
        to: snatted.dst,
        local: false,
    };
    let ag = compare_record(&e, &rec);
    assert!(!ag.agree, "{ag:?}");
    let d = ag.differences.join("\n");
    assert!(
        d.contains("static path says not captured")
            && d.contains("conntrack entry says source NATed to 169.254.7.127"),
        "{d}"
    );

    // Not SNATed by the kernel, but "explained" as the v6 pod's SNAT.
    let plain = to_app(n.not_in_set[1], OTHER_UID);
    let (mut e, rec) = n.explained_and_recorded(&plain);
    let v6_pod = to_app(n.in_set[1], OTHER_UID);
    let (snatted_e, _) = n.explained_and_recorded(&v6_pod);
    assert!(matches!(snatted_e.outcome, Outcome::Snatted { .. }));
    e.outcome = snatted_e.outcome;
    let ag = compare_record(&e, &rec);
    assert!(!ag.agree, "{ag:?}");
    let d = ag.differences.join("\n");
    assert!(
        d.contains(
            "static path says source NATed to fd16:9254:7127:1337:ffff:ffff:ffff:ffff, \
             the kernel's conntrack entry says not captured"
        ),
        "{d}"
    );
}

/// A probe nothing answers but with a reset (no listener on the port): the RST ends the
/// unassured conntrack entry before it could be read, so the record comes from conntrack's
/// events, subscribed before the connection. Both families, in the set (SNATed) and not.
#[test]
fn a_refused_connection_is_recorded_from_conntrack_events() {
    require_root();
    let n = Node::new();
    for (dst, snat) in n
        .in_set
        .into_iter()
        .map(|d| (d, Some(snat_of(d))))
        .chain(n.not_in_set.into_iter().map(|d| (d, None)))
    {
        // Nothing listens on 8081.
        let conn = to_app(dst, KUBELET_UID);
        let conn = Connection {
            dst: SocketAddr::new(dst, 8081),
            ..conn
        };
        let (e, rec) = n.explained_and_recorded(&conn);
        let what = format!("{dst}: {rec:?}\n{}", ex::render_text(&e));
        assert_eq!(rec.attempt, Attempt::Refused, "{what}");
        let entry = rec.conntrack.as_ref().expect("a conntrack entry");
        assert_eq!(entry.snat(), snat, "{what}");
        let ag = compare_record(&e, &rec);
        assert!(ag.agree && ag.not_traced.is_empty(), "{ag:?}\n{what}");
    }
}
