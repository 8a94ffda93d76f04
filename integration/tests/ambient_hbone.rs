//! Our ambient in-pod rules plus our ZDS server carry real HBONE between two pods through a
//! REAL ztunnel, with no node agent: the test itself plays the agent (programs each pod's
//! rules with `nft_backend::apply(&Plan::ambient(..))` inside its namespace and hands the
//! namespace to ztunnel over `zds::ZdsServer`). The pods are wired by the primary CNI chain
//! (bridge + host-local, via cnitool) in a node namespace, as in the node harness.
//!
//! What proves it: the connection A -> B:8080 lands on B's app with A's address as its peer
//! (ztunnel's inbound spoofs the source), and ztunnel's own metrics count it on both sides,
//! the destination side as mutual TLS (HBONE on 15008); A's traffic to a non-mesh address
//! goes through ztunnel's outbound listener (counted with an unknown destination); DNS is
//! answered by ztunnel's DNS proxy (a service name only ztunnel knows resolves).
//! Needs root, cnitool and the ztunnel binary (`scripts/build-ztunnel.sh`); under `CI=true`
//! nothing skips.

use integration::ambient::prerequisites;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use capture::{AmbientConfig, Plan};
use integration::cni::pod_ip;
use integration::dns::query_a;
use integration::node::{GATEWAY_V4, Node, NodeOptions};
use integration::pods::{APP_UID, DemoPod, PodKind};
use integration::ztunnel::{LocalService, LocalWorkload, Ztunnel, passthrough_labels, serves_pod};
use integration::{ConnectSpec, Listen, Outcome, Probe, TestNetns, connect};
use zds::{WorkloadInfo, ZdsServer};

/// ztunnel starts, takes pods and sets up its first HBONE connection well within this.
const BOUND: Duration = Duration::from_secs(30);
const APP_PORT: u16 = 8080;
/// A service VIP only ztunnel knows (its local config), fronting pod B.
const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const SERVICE_PORT: u16 = 80;

struct Pod {
    name: &'static str,
    ns: TestNetns,
    ip: IpAddr,
    app: Probe,
}

/// A pod namespace wired by the primary CNI (no istio-cni in this node's chain), with the
/// app (a landing probe on 8080) running in it.
fn pod(node: &Node, name: &'static str) -> Pod {
    let ns = TestNetns::with_prefix(&format!("amb-{name}")).unwrap();
    let add = node.add(&ns, &DemoPod::new(PodKind::NoSidecar, name));
    add.assert_ok();
    let ip = pod_ip(&add.json());
    let app = Probe::start(ns.path(), name, &[Listen::tcp(APP_PORT)]).unwrap();
    Pod { name, ns, ip, app }
}

/// What the node agent does for an ambient pod: the in-pod rules, in one batch.
fn program(pod: &Pod, cfg: &AmbientConfig) {
    let plan = Plan::ambient(cfg).expect("ambient plan");
    netns::run_in(Some(pod.ns.path()), || nft_backend::apply(&plan))
        .unwrap()
        .expect("apply the ambient plan");
}

fn workload(pod: &Pod) -> LocalWorkload {
    LocalWorkload {
        name: pod.name.into(),
        namespace: "default".into(),
        service_account: pod.name.into(),
        ips: vec![pod.ip],
    }
}

fn info(pod: &Pod) -> WorkloadInfo {
    WorkloadInfo {
        name: pod.name.into(),
        namespace: "default".into(),
        service_account: pod.name.into(),
    }
}

/// Polls until `check` holds; panics with ztunnel's log and metrics if it does not.
fn eventually(zt: &Ztunnel, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !check() {
        if Instant::now() > deadline {
            panic!(
                "{what}: not within {BOUND:?}\nztunnel log:\n{}\nmetrics:\n{}",
                zt.log_tail(40),
                relevant_metrics(zt)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn relevant_metrics(zt: &Ztunnel) -> String {
    zt.metrics()
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened") || l.starts_with("istio_dns"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The app's connection; the first HBONE connection waits for a certificate from the fake
/// CA, so it gets a long timeout.
fn app_connect(from: &Pod, dst: IpAddr, port: u16) -> Outcome {
    let spec = ConnectSpec::new(dst, port)
        .uid(APP_UID)
        .gid(APP_UID)
        .timeout(Duration::from_secs(10));
    connect(from.ns.path(), &spec)
}

#[track_caller]
fn landed_on(o: &Outcome, zt: &Ztunnel, probe: &str, port: u16) {
    match o.landed() {
        Some(l) if l.probe == probe && l.port == port => {}
        _ => panic!(
            "expected to land on {probe}:{port}, got {o}\nztunnel log:\n{}\nmetrics:\n{}",
            zt.log_tail(40),
            relevant_metrics(zt)
        ),
    }
}

#[test]
fn two_ambient_pods_talk_hbone_through_a_real_ztunnel_on_our_rules() {
    let Some(bin) = prerequisites() else { return };
    let mut opts = NodeOptions::new(PathBuf::from("/nonexistent"));
    opts.dual_stack = false;
    let node = Node::new(opts).unwrap();
    let (a, b) = (pod(&node, "a"), pod(&node, "b"));
    let cfg = AmbientConfig {
        redirect_dns: true,
        ..AmbientConfig::default()
    };
    program(&a, &cfg);
    program(&b, &cfg);
    // Something outside the mesh: a server in the node namespace (the pods' gateway).
    let outside = Probe::world(node.ns.path()).unwrap();
    let gateway: IpAddr = GATEWAY_V4.parse().unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _rt = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ztunnel.sock");
    let server = ZdsServer::bind(&socket, Default::default()).unwrap();
    let service = LocalService::for_workload("b", SERVICE_VIP.into(), SERVICE_PORT, APP_PORT);
    let zt = Ztunnel::start_with_services(&bin, &socket, &[workload(&a), workload(&b)], &[service])
        .unwrap();
    assert!(
        rt.block_on(server.wait_ready(BOUND)),
        "ztunnel did not connect:\n{}",
        zt.log_tail(40)
    );
    for p in [&a, &b] {
        let fd = std::fs::File::open(p.ns.path()).unwrap().into();
        if let Err(e) = rt.block_on(server.add_workload(&format!("uid-{}", p.name), info(p), fd)) {
            panic!("add {}: {e}\nztunnel log:\n{}", p.name, zt.log_tail(40));
        }
    }
    eventually(&zt, "ztunnel listening in both pods", || {
        serves_pod(a.ns.path()).unwrap() && serves_pod(b.ns.path()).unwrap()
    });

    // A -> B:8080 lands on B's app, from A's own address (ztunnel's inbound in B connects
    // to the app spoofing the HBONE client's source): the original destination survived
    // A's outbound capture, the HBONE hop, and B's inbound.
    let o = app_connect(&a, b.ip, APP_PORT);
    landed_on(&o, &zt, "b", APP_PORT);
    let seen = b.app.accepted();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].peer.ip(),
        a.ip,
        "B's app sees A's address: {seen:?}"
    );
    assert!(a.app.accepted().is_empty());
    // ztunnel carried it: counted by its outbound (in A) and its inbound (in B), the
    // inbound over mutual TLS, which only HBONE (15008) gives.
    let opened = "istio_tcp_connections_opened_total";
    let hop = [("source_workload", "a"), ("destination_workload", "b")];
    eventually(&zt, "A -> B counted by ztunnel on both sides", || {
        let m = zt.metrics();
        let src = [&hop[..], &[("reporter", "source")]].concat();
        let dst = [
            &hop[..],
            &[
                ("reporter", "destination"),
                ("connection_security_policy", "mutual_tls"),
                ("source_principal", "spiffe://cluster.local/ns/default/sa/a"),
            ],
        ]
        .concat();
        integration::ztunnel::metric_sum(&m, opened, &src) >= 1.0
            && integration::ztunnel::metric_sum(&m, opened, &dst) >= 1.0
    });

    // The service VIP exists only in ztunnel's config: reaching B's app through it proves
    // ztunnel resolved the original destination (VIP:80 -> B:8080).
    let o = app_connect(&a, SERVICE_VIP.into(), SERVICE_PORT);
    landed_on(&o, &zt, "b", APP_PORT);

    // A -> a non-mesh address: through ztunnel's outbound (15001), passed through to the
    // original destination, and counted by ztunnel with an unknown destination.
    let unknown_dst = passthrough_labels("a");
    let before = zt.metric(opened, &unknown_dst);
    let o = app_connect(&a, gateway, 80);
    landed_on(&o, &zt, "world", 80);
    let accepted = outside.accepted();
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    assert_eq!(accepted[0].peer.ip(), a.ip);
    eventually(&zt, "A -> outside counted by ztunnel's outbound", || {
        zt.metric(opened, &unknown_dst) > before
    });

    // DNS capture: a query to any server (here the gateway, which runs no DNS server) is
    // answered by ztunnel's DNS proxy on 15053 with the service's VIP.
    let reply = query_a(
        a.ns.path(),
        SocketAddr::new(gateway, 53),
        "b.default.svc.cluster.local",
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("DNS query: {e}\nztunnel log:\n{}", zt.log_tail(40)));
    assert_eq!(reply.rcode, 0, "{reply:?}");
    assert_eq!(reply.addresses, [SERVICE_VIP], "{reply:?}");
    assert_eq!(reply.from, SocketAddr::new(gateway, 53), "{reply:?}");
    assert!(zt.metric("istio_dns_requests_total", &[]) >= 1.0);
    // The UDP probe on the outside never saw the query.
    assert!(
        outside.accepted().iter().all(|a| a.port != 53),
        "{:?}",
        outside.accepted()
    );
    drop(zt);
}
