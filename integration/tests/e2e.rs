//! The whole product on one node, end to end: install-cni installs and guards the plugin in a
//! node namespace with a host layout; cnitool ADDs the demo pods through Debian's bridge +
//! host-local, portmap and istio-cni with kubelet's CNI_ARGS; real connections prove each
//! pod's redirect; CHECK passes; the primary CNI dropping our entry is repaired before the
//! next ADD; DEL cleans up; SIGTERM removes the install.
//!
//! Needs root, cnitool and Debian's CNI plugins (`integration/scripts/install-deps.sh`), and the
//! product's binaries next to this test's profile dir (`cargo test --workspace` builds them;
//! or set ISTIO_CNI_BIN_DIR).

use integration::cni::{require_cni_tools, rules};
use integration::node::{CONFLIST, Node, NodeOptions, product_bin_dir};
use integration::pods::{DemoPod, PodKind, expectations};
use integration::{Probe, TestNetns};
use serde_json::Value;
use std::fs;

fn node(backend: &str) -> Node {
    require_cni_tools();
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.backend = backend.into();
    opts.plugin_log_level = "debug".into();
    Node::new(opts).unwrap()
}

/// A pod namespace ADDed through the chain, its result, and its sidecar/app listeners.
struct Pod {
    spec: DemoPod,
    ns: TestNetns,
    result: Value,
}

fn add(node: &Node, kind: PodKind, name: &str) -> Pod {
    let spec = DemoPod::new(kind, name);
    node.serve(&spec);
    let ns = TestNetns::with_prefix("e2epod").unwrap();
    let add = node.add(&ns, &spec);
    add.assert_ok();
    Pod {
        result: add.json(),
        spec,
        ns,
    }
}

#[track_caller]
fn assert_traffic(node: &Node, pod: &Pod) {
    let _sidecar = Probe::sidecar(pod.ns.path()).unwrap();
    let addrs = node.addrs(&pod.result);
    let mut bad = Vec::new();
    for e in expectations(pod.spec.kind, &addrs) {
        let out = node.probe(&pod.ns, &e);
        if !e.matches(&out) {
            bad.push(format!("{}: expected {}, got {out}", e.what, e.expected()));
        }
    }
    assert!(
        bad.is_empty(),
        "{:?} ({}):\n{}\nrules:\n{}",
        pod.spec.kind,
        pod.spec.name,
        bad.join("\n"),
        rules(&pod.ns)
    );
}

fn our_tables(ns: &TestNetns) -> bool {
    let r = rules(ns);
    r.contains("istio-proxy-") || r.contains("ISTIO_")
}

#[test]
fn whole_node_install_add_traffic_check_repair_del_uninstall() {
    let mut node = node("auto");
    let primary = fs::read(node.conflist()).unwrap();
    node.start_daemon().unwrap();

    // install-cni chained us in last and installed the binaries and the kubeconfig.
    assert_eq!(node.chain(), ["bridge", "portmap", "istio-cni"]);
    for b in ["istio-cni", "istio-nftables"] {
        assert!(node.bin_dir.join(b).is_file(), "{b} not installed");
    }
    let kubeconfig = fs::read_to_string(node.run_dir.join("istio-cni-kubeconfig")).unwrap();
    assert!(
        kubeconfig.contains(&format!("http://127.0.0.1:{}", node.api.port)),
        "{kubeconfig}"
    );
    let (code, metrics) = node.daemon_get("/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("istio_cni_install_ready 1"), "{metrics}");

    let _world = Probe::world(node.ns.path()).unwrap();
    let mut pods = Vec::new();
    for (i, kind) in PodKind::ALL.into_iter().enumerate() {
        let pod = add(&node, kind, &format!("demo-{i}"));
        assert_eq!(
            our_tables(&pod.ns),
            kind.captured(),
            "{kind:?}:\n{}",
            rules(&pod.ns)
        );
        assert_traffic(&node, &pod);
        node.check(&pod.ns, &pod.spec).assert_ok();
        pods.push(pod);
    }
    // The dual-stack pod's rules cover IPv6 (its namespace has an IPv6 address).
    let dual = pods
        .iter()
        .find(|p| p.spec.kind == PodKind::DualStack)
        .unwrap();
    assert!(dual.result["ips"].as_array().unwrap().len() == 2);

    // The primary CNI rewrites its conflist without us; the daemon puts us back before the
    // next pod arrives, and that pod is captured.
    let took = node.primary_rewrites_conflist().unwrap();
    assert_eq!(node.chain(), ["bridge", "portmap", "istio-cni"], "{took:?}");
    let late = add(&node, PodKind::Sidecar, "after-repair");
    assert!(our_tables(&late.ns), "not captured after the repair");
    assert_traffic(&node, &late);
    pods.push(late);

    // Every ADD logged its pod on every line of the plugin's JSON log.
    let log = node.plugin_log();
    for l in log.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["spans"][0]["pod_name"].is_string(), "{l}");
    }

    // DEL: rules gone, the address released, a second DEL is fine.
    for pod in &pods {
        node.del(&pod.ns, &pod.spec).assert_ok();
        assert!(
            !our_tables(&pod.ns),
            "{}:\n{}",
            pod.spec.name,
            rules(&pod.ns)
        );
        node.del(&pod.ns, &pod.spec).assert_ok();
    }
    let leases = fs::read_dir(node.ipam_dir.join("k8s-pod-network"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .parse::<std::net::IpAddr>()
                .is_ok()
        })
        .count();
    assert_eq!(leases, 0, "host-local leases left after DEL");

    // SIGTERM: the install is removed, the primary's file is as it was.
    let (status, log) = node.stop_daemon().unwrap();
    assert!(status.success(), "{status}\n{log}");
    assert_eq!(
        String::from_utf8_lossy(&fs::read(node.net_dir.join(CONFLIST)).unwrap()),
        String::from_utf8_lossy(&primary)
    );
    for b in ["istio-cni", "istio-nftables"] {
        assert!(!node.bin_dir.join(b).exists(), "{b} left behind");
    }
    assert!(!node.run_dir.join("istio-cni-kubeconfig").exists());
}
