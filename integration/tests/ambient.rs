//! Ambient mode end to end, on one node, with real traffic: the node agent (install-cni with
//! `AMBIENT_ENABLED=true`), the plugin in the real CNI chain (cnitool), a REAL ztunnel on the
//! agent's ZDS socket, the full fake Kubernetes API (the only thing not real), a fake kubelet
//! process for the host probe rule. See `integration::ambient` for the rig.
//!
//! Needs root, cnitool, the product's binaries (`cargo build --bins`) and the ztunnel binary
//! (`integration/scripts/build-ztunnel.sh`); under `CI=true` nothing skips.

use integration::ambient::prerequisites;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use capture::ambient_constants::HOST_PROBE_SNAT_V4;
use integration::ambient::DATAPLANE_MODE;
use integration::ambient::{
    AmbientNode, AmbientOptions, BOUND, KUBELET_UID, Mode, OTHER_UID, PodPlan, tables,
};
use integration::ambient::{lands, last_peer, opened};
use integration::dns::query_a;
use integration::node::{GATEWAY_V4, wait_until};
use integration::pods::APP_UID;
use integration::ztunnel::{LocalService, hbone_labels, metric_sum, passthrough_labels};
use integration::{ConnectSpec, Probe, send_udp};
use serde_json::json;

const APP: u16 = integration::ambient::APP_PORT;

fn a() -> PodPlan {
    PodPlan::new("a", [10, 88, 1, 10], Mode::Ambient)
}
fn b() -> PodPlan {
    PodPlan::new("b", [10, 88, 1, 11], Mode::Ambient)
}
fn plain() -> PodPlan {
    PodPlan::new("plain", [10, 88, 1, 12], Mode::Plain)
}
fn sidecar() -> PodPlan {
    PodPlan::new("side", [10, 88, 1, 13], Mode::Sidecar)
}

/// B behind a service VIP, whose name ztunnel's DNS proxy answers.
fn service_b() -> LocalService {
    LocalService::for_workload("b", "10.96.0.20".parse().unwrap(), 80, APP)
}

fn readyz(n: &AmbientNode) -> u16 {
    n.node.daemon_get("/readyz").0
}

#[test]
fn ambient_pods_through_the_chain_talk_hbone_and_others_are_left_alone() {
    let Some(bin) = prerequisites() else { return };
    let opts = AmbientOptions {
        services: vec![service_b()],
        ..AmbientOptions::default()
    };
    let n = AmbientNode::start(&bin, &opts, &[a(), b()]).unwrap();
    let (pa, pb) = (n.start_pod(&a()), n.start_pod(&b()));
    let (pp, ps) = (n.start_pod(&plain()), n.start_pod(&sidecar()));
    let outside = Probe::world(n.node.ns.path()).unwrap();
    let gateway: IpAddr = GATEWAY_V4.parse().unwrap();

    // The ADD returned after ztunnel acknowledged the pods: its listeners are there.
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());
    assert!(n.not_served(&pp) && n.not_served(&ps));
    // Istio's metric names beside ours: ztunnel's ZDS connection, the agent's events.
    let (_, metrics) = n.node.daemon_get("/metrics");
    assert!(metrics.contains("\nztunnel_connected 1\n"), "{metrics}");
    let adds = metric_sum(
        &metrics,
        "nodeagent_reconcile_events_total",
        &[("type", "add")],
    );
    assert!(adds >= 2.0, "pods a and b at least: {metrics}");
    // Istio's count of the plugin's ADD events the agent answered, by status code.
    let served = metric_sum(
        &metrics,
        "istio_cni_plugin_requests_total",
        &[("response_code", "200")],
    );
    assert_eq!(served, 2.0, "the ADDs of a and b: {metrics}");
    // In-pod rules: ambient's three tables in ambient pods, none in the plain pod, the
    // sidecar tables (and nothing of ambient) in the sidecar pod.
    for p in [&pa, &pb] {
        let t = n.ambient_tables(p);
        assert_eq!(t.len(), 3, "{}: {t:?}", p.name());
    }
    assert!(n.tables(&pp).is_empty(), "{:?}", n.tables(&pp));
    let sidecar_tables = n.tables(&ps);
    assert!(!sidecar_tables.is_empty());
    assert!(n.ambient_tables(&ps).is_empty(), "{sidecar_tables:?}");
    // Enrolled pods are annotated for istiod, the others not.
    n.eventually("ambient pods annotated redirection=enabled", || {
        [&pa, &pb]
            .iter()
            .all(|p| n.redirection_annotation(p).as_deref() == Some("enabled"))
    });
    assert_eq!(n.redirection_annotation(&pp), None);
    assert_eq!(n.redirection_annotation(&ps), None);
    // The node's probe set holds exactly the ambient pods.
    let mut set = n.probe_set();
    set.sort();
    assert_eq!(set, [pa.ip(), pb.ip()], "{}", n.host_table());

    // A -> B:8080: carried by ztunnel over HBONE (mutual TLS on B's side) to B's app, which
    // sees A's own address: the original destination survived both hops.
    let o = n.from_pod(&pa, pb.ip(), APP);
    lands(&n, &o, "b", APP);
    assert_eq!(last_peer(&pb), pa.ip());
    let hop = [("source_workload", "a"), ("destination_workload", "b")];
    n.eventually(
        "A -> B counted by ztunnel's outbound and (mTLS) inbound",
        || {
            opened(&n, &[&hop[..], &[("reporter", "source")]].concat()) >= 1.0
                && opened(
                    &n,
                    &[
                        &hop[..],
                        &[
                            ("reporter", "destination"),
                            ("connection_security_policy", "mutual_tls"),
                        ],
                    ]
                    .concat(),
                ) >= 1.0
        },
    );

    // The plain pod is untouched: its own traffic goes straight out (ztunnel never sees it
    // as a source), and it reaches B's app through B's inbound capture.
    let o = n.from_pod(&pp, gateway, 80);
    lands(&n, &o, "world", 80);
    let o = n.from_pod(&pp, pb.ip(), APP);
    lands(&n, &o, "b", APP);
    assert_eq!(last_peer(&pb), pp.ip());
    assert_eq!(
        opened(&n, &[("reporter", "source"), ("source_workload", "plain")]),
        0.0
    );

    // A -> a non-mesh address: through ztunnel's outbound (15001), passed through to the
    // original destination, counted with an unknown destination.
    let unknown = passthrough_labels("a");
    let before = opened(&n, &unknown);
    let o = n.from_pod(&pa, gateway, 80);
    lands(&n, &o, "world", 80);
    assert_eq!(outside.accepted().last().unwrap().peer.ip(), pa.ip());
    n.eventually("A -> outside counted by ztunnel", || {
        opened(&n, &unknown) > before
    });

    // DNS capture (AMBIENT_DNS_CAPTURE=true): ztunnel's DNS proxy (15053) answers a query
    // sent to a server that does not exist with the VIP only ztunnel knows.
    let reply = query_a(
        pa.ns.path(),
        SocketAddr::new(gateway, 53),
        "b.default.svc.cluster.local",
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("DNS from A: {e}\n{}", n.logs()));
    assert_eq!(reply.addresses, [service_b().vip], "{reply:?}");
    // The plain pod's DNS is not captured: nobody answers.
    assert!(
        query_a(
            pp.ns.path(),
            SocketAddr::new(gateway, 53),
            "b.default.svc.cluster.local",
            Duration::from_millis(500),
        )
        .is_err()
    );

    // kubelet's probe (its uid, from the node) reaches A's app directly, SNATed to the
    // probe address; another uid's connection is captured by ztunnel's inbound.
    let o = n.from_node(KUBELET_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));
    let inbound = [("reporter", "destination"), ("destination_workload", "a")];
    let before = opened(&n, &inbound);
    let o = n.from_node(OTHER_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), gateway, "ztunnel keeps the node's address");
    n.eventually(
        "the node's non-probe connection counted by A's ztunnel inbound",
        || opened(&n, &inbound) > before,
    );

    // DEL B: ztunnel stops serving it (DelWorkload), its rules and its probe-set entry go.
    n.del(&pb).assert_ok();
    n.eventually("ztunnel gone from B after DEL", || n.not_served(&pb));
    assert!(n.ambient_tables(&pb).is_empty(), "{:?}", n.tables(&pb));
    assert_eq!(n.probe_set(), [pa.ip()]);
    assert!(n.served(&pa), "A still served\n{}", n.logs());
    // The sidecar pod was never touched.
    assert_eq!(n.tables(&ps), sidecar_tables);
    assert!(n.not_served(&ps));
}

#[test]
fn restarts_keep_pods_served_and_labels_enroll_and_unenroll_running_pods() {
    let Some(bin) = prerequisites() else { return };
    let late = PodPlan::new("late", [10, 88, 2, 14], Mode::Plain);
    let a = PodPlan::new("a", [10, 88, 2, 10], Mode::Ambient);
    let side = PodPlan::new("side", [10, 88, 2, 13], Mode::Sidecar);
    let opts = AmbientOptions {
        dns_capture: false,
        ..AmbientOptions::default()
    };
    let mut n = AmbientNode::start(&bin, &opts, &[a.clone(), late.clone()]).unwrap();
    let pa = n.start_pod(&a);
    let pl = n.start_pod(&late);
    let ps = n.start_pod(&side);
    let sidecar_tables = n.tables(&ps);
    // Without DNS capture, ambient needs no raw table (Istio's layout).
    let ambient_tables = n.ambient_tables(&pa);
    assert_eq!(
        ambient_tables,
        ["inet istio-ambient-nat", "inet istio-ambient-mangle"],
        "{:?}",
        n.tables(&pa)
    );
    assert!(n.served(&pa), "{}", n.logs());
    assert!(n.not_served(&pl) && n.not_served(&ps));
    // AMBIENT_DNS_CAPTURE=false: A's DNS goes where it was sent; its TCP is still captured.
    let _outside = Probe::world(n.node.ns.path()).unwrap();
    let gateway: IpAddr = GATEWAY_V4.parse().unwrap();
    let dns = ConnectSpec::new(gateway, 53).uid(APP_UID).gid(APP_UID);
    let o = send_udp(pa.ns.path(), &dns);
    lands(&n, &o, "world", 53);
    let o = n.from_pod(&pa, gateway, 80);
    lands(&n, &o, "world", 80);
    n.eventually("A -> outside counted by ztunnel", || {
        opened(&n, &[("reporter", "source"), ("source_workload", "a")]) >= 1.0
    });
    let snapshots = |n: &AmbientNode| n.zt.log().matches("received snapshot sent").count();

    // Agent restart: ztunnel keeps serving A meanwhile; the new agent finds A (its netns
    // through /proc), sends it in the snapshot, so ztunnel does not drop it.
    let (status, _log) = n.node.stop_daemon().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(n.served(&pa));
    let o = n.from_node(OTHER_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
    let before = snapshots(&n);
    n.node.start_daemon().unwrap();
    n.eventually("ztunnel took the new agent's snapshot", || {
        snapshots(&n) > before
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        n.served(&pa),
        "A dropped after the agent restart\n{}",
        n.logs()
    );
    assert_eq!(n.ambient_tables(&pa), ambient_tables);
    assert_eq!(n.probe_set(), [pa.ip()]);

    // ztunnel restart: its listeners die with it; the agent sends the snapshot again.
    n.zt.restart().unwrap();
    n.eventually("A served again after ztunnel's restart", || n.served(&pa));
    assert!(wait_until(BOUND, || readyz(&n) == 200), "{}", n.logs());

    // A label on the running plain pod enrolls it (watch MODIFIED): rules, probe set,
    // ztunnel; A reaches it over HBONE.
    n.label(&pl, Some("ambient"));
    n.eventually("the labelled pod enrolled", || {
        n.served(&pl) && n.ambient_tables(&pl) == ambient_tables
    });
    n.eventually("the labelled pod in the probe set and annotated", || {
        n.probe_set().contains(&pl.ip())
            && n.redirection_annotation(&pl).as_deref() == Some("enabled")
    });
    let o = n.from_pod(&pa, pl.ip(), APP);
    lands(&n, &o, "late", APP);
    n.eventually("A -> late over mTLS", || {
        opened(&n, &hbone_labels("a", "late")) >= 1.0
    });
    // Removing the label unenrolls it: ztunnel gone, rules and probe-set entry removed.
    n.label(&pl, None);
    n.eventually("the unlabelled pod unenrolled", || {
        n.not_served(&pl) && n.ambient_tables(&pl).is_empty()
    });
    n.eventually("the unenrolled pod's annotation removed", || {
        n.redirection_annotation(&pl).is_none()
    });
    assert_eq!(n.probe_set(), [pa.ip()]);

    // The namespace label enrolls it too (namespace watch), but never the sidecar pod; the
    // pod's own `dataplane-mode=none` opts it out again.
    n.kube()
        .put_namespace_meta("default", json!({DATAPLANE_MODE: "ambient"}), json!({}));
    n.eventually("the pod enrolled by its namespace", || {
        n.served(&pl) && n.probe_set().contains(&pl.ip())
    });
    n.label(&pl, Some("none"));
    n.eventually("the pod opted out with dataplane-mode=none", || {
        n.not_served(&pl) && n.ambient_tables(&pl).is_empty()
    });
    assert!(n.not_served(&ps));
    assert_eq!(n.tables(&ps), sidecar_tables);
    assert_eq!(n.probe_set(), [pa.ip()]);
    assert!(n.served(&pa));
}

#[test]
fn with_ztunnel_down_ambient_pods_fail_closed_and_sidecar_pods_still_work() {
    let Some(bin) = prerequisites() else { return };
    let a = PodPlan::new("a", [10, 88, 3, 10], Mode::Ambient);
    let b = PodPlan::new("b", [10, 88, 3, 11], Mode::Ambient);
    let p = PodPlan::new("p", [10, 88, 3, 12], Mode::Plain);
    let side = PodPlan::new("side", [10, 88, 3, 13], Mode::Sidecar);
    let ws = [a.clone(), b.clone(), p.clone()];
    let mut n = AmbientNode::start(&bin, &AmbientOptions::default(), &ws).unwrap();
    let pb = n.start_pod(&b);
    let pp = n.start_pod(&p);
    assert!(n.served(&pb), "{}", n.logs());
    n.zt.kill();
    assert!(
        wait_until(BOUND, || readyz(&n) != 200),
        "the agent stays ready without ztunnel\n{}",
        n.logs()
    );

    // The ambient ADD fails with a CNI error naming the socket, and leaves nothing behind.
    let pa = n.create_pod(&a).unwrap();
    let run = n.add(&pa);
    assert!(!run.ok, "ADD succeeded without ztunnel\n{}", n.logs());
    let err = format!("{}{}", run.stdout, run.stderr);
    assert!(
        err.contains(&n.zds_socket.display().to_string()),
        "the error names ztunnel's socket {}: {err}",
        n.zds_socket.display()
    );
    assert!(tables(&pa.ns).is_empty(), "{:?}", tables(&pa.ns));
    let rules = pa.ns.exec_ok("ip", &["rule", "show"]).unwrap();
    assert!(!rules.contains("0x111/0xfff"), "{rules}");
    assert_eq!(n.probe_set(), [pb.ip()]);

    // DEL needs no ztunnel: B's rules and probe-set entry go at once.
    n.del(&pb).assert_ok();
    assert!(n.ambient_tables(&pb).is_empty(), "{:?}", n.tables(&pb));
    assert!(n.probe_set().is_empty(), "{:?}", n.probe_set());

    // A label cannot enroll a running pod without ztunnel: nothing half-programmed (rules
    // without ztunnel behind them would black-hole the pod's traffic).
    n.label(&pp, Some("ambient"));
    std::thread::sleep(Duration::from_millis(500));
    assert!(n.ambient_tables(&pp).is_empty(), "{:?}", n.tables(&pp));
    assert!(n.probe_set().is_empty(), "{:?}", n.probe_set());

    // Sidecar pods are unaffected by ztunnel's absence.
    let ps = n.start_pod(&side);
    assert!(!n.tables(&ps).is_empty());
    assert!(n.ambient_tables(&ps).is_empty());

    // ztunnel back: the labelled pod is enrolled (retried), the deleted one stays gone, and
    // the runtime's retry of the refused ADD (DEL, then ADD) succeeds.
    n.zt.restart().unwrap();
    assert!(wait_until(BOUND, || readyz(&n) == 200), "{}", n.logs());
    n.eventually("the labelled pod enrolled once ztunnel is back", || {
        n.served(&pp) && !n.ambient_tables(&pp).is_empty()
    });
    assert!(n.not_served(&pb));
    n.del(&pa).assert_ok();
    let run = n.add(&pa);
    assert!(run.ok, "{}{}\n{}", run.stdout, run.stderr, n.logs());
    assert!(n.served(&pa), "{}", n.logs());
    let mut set = n.probe_set();
    set.sort();
    assert_eq!(set, [pa.ip(), pp.ip()]);

    // The last ambient pod gone, the host probe rule goes with it.
    n.del(&pa).assert_ok();
    n.label(&pp, None);
    n.eventually("the last pod unenrolled", || n.not_served(&pp));
    n.eventually("the host probe table removed with the last pod", || {
        !tables(&n.node.ns)
            .iter()
            .any(|t| t.contains("istio-ambient"))
    });
    assert!(n.ambient_tables(&ps).is_empty());
}

/// While the agent is down: a pod is deleted (CNI DEL, then gone from the API) and another
/// pod's in-pod rules are damaged. The returning agent drops the deleted pod from ztunnel
/// (its snapshot leaves it out) and from the probe set, and repairs the damaged rules
/// (`AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=true`).
#[test]
fn the_returning_agent_drops_pods_deleted_meanwhile_and_repairs_damaged_rules() {
    let Some(bin) = prerequisites() else { return };
    let a = PodPlan::new("a", [10, 88, 5, 10], Mode::Ambient);
    let b = PodPlan::new("b", [10, 88, 5, 11], Mode::Ambient);
    let mut n =
        AmbientNode::start(&bin, &AmbientOptions::default(), &[a.clone(), b.clone()]).unwrap();
    let (pa, pb) = (n.start_pod(&a), n.start_pod(&b));
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());
    let a_tables = n.ambient_tables(&pa);

    n.node.stop_daemon().unwrap();
    // The runtime tears B down while the agent is away: DEL must not need the agent.
    let run = n.del(&pb);
    assert!(
        run.ok,
        "DEL without the agent: {}{}",
        run.stdout, run.stderr
    );
    n.kube().delete(&pb.uid());
    // Someone flushes A's ambient rules.
    pa.ns
        .exec_ok("nft", &["delete", "table", "inet", "istio-ambient-nat"])
        .unwrap();
    assert_ne!(n.ambient_tables(&pa), a_tables);

    n.node.start_daemon().unwrap();
    n.eventually("B dropped by ztunnel after the agent's return", || {
        n.not_served(&pb)
    });
    n.eventually("A's rules repaired on startup", || {
        n.ambient_tables(&pa) == a_tables
    });
    assert!(n.served(&pa), "{}", n.logs());
    n.eventually("B out of the probe set", || n.probe_set() == [pa.ip()]);
    // A works end to end again: a non-probe connection from the node is captured by
    // ztunnel's inbound and reaches the app.
    let o = n.from_node(OTHER_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
}

/// Istio's agent names every ambient pod it knows in the snapshot; one whose network
/// namespace it cannot find (yet) goes as `KeepWorkload`, so ztunnel keeps serving it
/// (Istio's `currentPodSnapshot.Ensure(uid)` before the netns scan; our `zds` store's
/// `Entry::Kept`). Leaving it out makes ztunnel drop a running pod's proxy.
#[test]
fn an_agent_restart_keeps_a_pod_whose_netns_it_cannot_find() {
    let Some(bin) = prerequisites() else { return };
    let a = PodPlan::new("a", [10, 88, 4, 10], Mode::Ambient);
    let mut n =
        AmbientNode::start(&bin, &AmbientOptions::default(), std::slice::from_ref(&a)).unwrap();
    let pa = n.start_pod(&a);
    assert!(n.served(&pa), "{}", n.logs());
    let snapshots = |n: &AmbientNode| n.zt.log().matches("received snapshot sent").count();
    n.node.stop_daemon().unwrap();
    n.hide_from_proc(&pa).unwrap();
    let before = snapshots(&n);
    n.node.start_daemon().unwrap();
    n.eventually("ztunnel took the new agent's snapshot", || {
        snapshots(&n) > before
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        n.served(&pa),
        "ztunnel dropped a running ambient pod the restarted agent could not locate\n{}",
        n.logs()
    );
    let o = n.from_node(OTHER_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
    // The kept pod goes away (DEL, then gone from the API): ztunnel stops serving it, and
    // a restarted ztunnel does not get it back.
    n.del(&pa).assert_ok();
    n.kube().delete(&pa.uid());
    n.eventually("the kept pod released after its deletion", || {
        n.not_served(&pa)
    });
    n.zt.restart().unwrap();
    assert!(wait_until(BOUND, || readyz(&n) == 200), "{}", n.logs());
    std::thread::sleep(Duration::from_millis(500));
    assert!(n.not_served(&pa), "{}", n.logs());
}

/// The host probe rule is kept true like the pods' rules: someone deletes the node's
/// `inet istio-ambient-nat` (a firewall reload, `nft flush ruleset`) or takes a pod's address
/// out of the probe set, and the agent's next reconcile pass writes the rule again and puts
/// the address back; kubelet's probe arrives SNATed again.
#[test]
fn a_host_probe_rule_deleted_on_the_node_is_written_again() {
    let Some(bin) = prerequisites() else { return };
    let a = PodPlan::new("a", [10, 88, 6, 10], Mode::Ambient);
    let opts = AmbientOptions {
        env: vec![("RECONCILE_INTERVAL".into(), "1s".into())],
        ..AmbientOptions::default()
    };
    let n = AmbientNode::start(&bin, &opts, std::slice::from_ref(&a)).unwrap();
    let pa = n.start_pod(&a);
    assert!(n.served(&pa), "{}", n.logs());
    let snat = IpAddr::V4(HOST_PROBE_SNAT_V4);
    let node = &n.node.ns;
    // Without counters: the rule is the same, its packets are not.
    let stateless = || {
        node.exec_ok("nft", &["-s", "list", "table", "inet", "istio-ambient-nat"])
            .unwrap_or_default()
    };
    let table = stateless();

    node.exec_ok("nft", &["delete", "table", "inet", "istio-ambient-nat"])
        .unwrap();
    n.eventually("the host table written again", || {
        n.probe_set() == [pa.ip()]
    });
    assert_eq!(stateless(), table);
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), snat);

    let element = format!("{{ {} }}", pa.ip());
    let set = [
        "delete",
        "element",
        "inet",
        "istio-ambient-nat",
        "istio-inpod-probes-v4",
    ];
    node.exec_ok("nft", &[&set[..], &[element.as_str()]].concat())
        .unwrap();
    assert!(n.probe_set().is_empty());
    n.eventually("the address back in the probe set", || {
        n.probe_set() == [pa.ip()]
    });
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), snat);
    assert!(
        n.logs().contains("host probe rule drifted; written again"),
        "{}",
        n.logs()
    );
}

/// The restarted agent prunes the probe set (Istio's startup `pruneHostIPset`): a rollout keeps
/// the host table (SIGTERM while the DaemonSet exists), pod B is DELeted while the agent is away
/// (its address stays) and leaves the API, an address is added by hand; once the agent has
/// found A (at startup, and on every reconcile pass) the set holds exactly A's address, whose
/// kubelet probe is still SNATed.
#[test]
fn a_restarted_agent_prunes_probe_addresses_of_pods_deleted_while_it_was_down() {
    let Some(bin) = prerequisites() else { return };
    let a = PodPlan::new("a", [10, 88, 7, 10], Mode::Ambient);
    let b = PodPlan::new("b", [10, 88, 7, 11], Mode::Ambient);
    let opts = AmbientOptions {
        env: vec![("RECONCILE_INTERVAL".into(), "1s".into())],
        ..AmbientOptions::default()
    };
    let mut n = AmbientNode::start(&bin, &opts, &[a.clone(), b.clone()]).unwrap();
    n.kube().put_daemonset("istio-system", "istio-cni-node");
    let (pa, pb) = (n.start_pod(&a), n.start_pod(&b));
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());

    let (_, log) = n.node.stop_daemon().unwrap();
    assert!(log.contains("safe upgrade"), "{log}");
    n.del(&pb).assert_ok();
    n.kube().delete(&pb.uid());
    let by_hand: IpAddr = "10.88.7.99".parse().unwrap();
    let element = format!("{{ {by_hand} }}");
    let add = ["add", "element", "inet", "istio-ambient-nat"];
    let add = [&add[..], &["istio-inpod-probes-v4", element.as_str()]].concat();
    n.node.ns.exec_ok("nft", &add).unwrap();
    let mut stale = n.probe_set();
    stale.sort();
    assert_eq!(stale, [pa.ip(), pb.ip(), by_hand]);

    n.node.start_daemon().unwrap();
    let pruned = "removed from the host probe sets";
    n.eventually("the restarted agent prunes", || {
        n.node.daemon().log().contains(pruned)
    });
    assert_eq!(n.probe_set(), [pa.ip()], "{}", n.host_table());
    let log = n.node.daemon().log();
    let line = log.lines().find(|l| l.contains(pruned)).unwrap();
    let (b_ip, hand) = (pb.ip().to_string(), by_hand.to_string());
    assert!(line.contains(&b_ip) && line.contains(&hand), "{line}");
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));
    // Each reconcile pass prunes too: an address added now goes within the 1 s interval.
    let element = "{ 10.88.7.98 }";
    let add = ["add", "element", "inet", "istio-ambient-nat"];
    let add = [&add[..], &["istio-inpod-probes-v4", element]].concat();
    n.node.ns.exec_ok("nft", &add).unwrap();
    n.eventually("a reconcile pass prunes the new stray", || {
        n.probe_set() == [pa.ip()]
    });
}

/// Istio's `HOST_PROBE_SNAT_IP`: kubelet's probes reach an ambient pod from the configured
/// address, the host rule SNATing to it and the in-pod rules letting it past ztunnel alike.
#[test]
fn kubelets_probes_come_from_the_configured_probe_snat_address() {
    let Some(bin) = prerequisites() else { return };
    let snat: IpAddr = "169.254.7.200".parse().unwrap();
    let opts = AmbientOptions {
        env: vec![("HOST_PROBE_SNAT_IP".into(), snat.to_string())],
        ..AmbientOptions::default()
    };
    let n = AmbientNode::start(&bin, &opts, &[a()]).unwrap();
    let pa = n.start_pod(&a());
    assert!(n.served(&pa), "{}", n.logs());
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), snat, "{}", n.host_table());
}

/// Istio ignores an ambient annotation that is not a boolean (with a warning) and serves the
/// pod: so do the plugin and the agent, and the agent says so in a Warning Event on the pod.
#[test]
fn a_non_boolean_ambient_annotation_is_ignored_and_said_in_an_event() {
    let Some(bin) = prerequisites() else { return };
    let n = AmbientNode::start(&bin, &AmbientOptions::default(), &[a()]).unwrap();
    let pa = n.create_pod(&a()).unwrap();
    let kube = n.kube();
    let mut json = kube
        .pod(integration::ambient::POD_NAMESPACE, pa.name())
        .unwrap();
    json["metadata"]["annotations"]["ambient.istio.io/dns-capture"] = "maybe".into();
    kube.modify(json);
    // The agent has seen the change (its pod events come from the cache the ADD reads).
    n.eventually("the agent saw the annotated pod", || {
        let (_, metrics) = n.node.daemon_get("/metrics");
        metric_sum(
            &metrics,
            "nodeagent_reconcile_events_total",
            &[("type", "update")],
        ) >= 1.0
    });
    n.add(&pa).assert_ok();
    assert!(n.served(&pa), "{}", n.logs());
    n.eventually("a Warning Event naming the annotation", || {
        kube.events().iter().any(|e| {
            e["reason"] == "IgnoredAnnotation"
                && e["type"] == "Warning"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("ambient.istio.io/dns-capture"))
        })
    });
}
