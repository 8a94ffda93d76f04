//! Istio's `ALLOW_SWITCH_TO_HOST_NS` (`redirect::host_netns`): a daemon running in a pod
//! network (Istio's chart) does its node-level work in the node's namespace: the host probe
//! rule and its sets on either backend, and the node backend's probe. Here the "daemon" is a
//! namespace of its own and the "node" another; nothing lands where the daemon runs. One test
//! in its own binary: the switch is process-wide, set once.

use capture::HostProbeConfig;
use redirect::host_probe::HostProbeRule;
use redirect::{Backend, BackendChoice};
use testbed::host_probe::in_ns;
use testbed::*;

/// Ours of each backend in `ns`: nftables' host table, legacy `ISTIO_POSTRT` and the ipsets.
fn ours(ns: &TestNetns) -> String {
    let nft = ns.exec_ok("nft", &["list", "tables"]).unwrap();
    let legacy = ns
        .exec_ok("iptables-legacy-save", &["-t", "nat"])
        .unwrap_or_default();
    let sets = ns.exec_ok("ipset", &["list", "-n"]).unwrap();
    let mut found = String::new();
    if nft.contains("istio-ambient-nat") {
        found += "nft host table; ";
    }
    if legacy.contains("ISTIO_POSTRT") {
        found += "legacy ISTIO_POSTRT; ";
    }
    found + sets.trim()
}

#[test]
fn node_level_work_runs_in_the_node_namespace_not_the_daemons() {
    require_root();
    let node = TestNetns::with_prefix("hostsw-node").unwrap();
    let daemon = TestNetns::with_prefix("hostsw-pod").unwrap();
    redirect::host_netns::switch_to(node.path()).unwrap();
    let refused = redirect::host_netns::switch_to(daemon.path()).unwrap_err();
    assert_eq!(
        (refused.current.as_path(), refused.requested.as_path()),
        (node.path(), daemon.path())
    );
    let pod_ip = "10.1.2.3".parse().unwrap();
    for backend in [Backend::Nft, Backend::IptablesLegacy] {
        let rule = HostProbeRule::new(backend);
        let plan = HostProbeConfig::default_plan(rule.probe_source(None), false);
        in_ns(daemon.path(), || {
            rule.ensure(&plan).unwrap();
            rule.add_pod_ips(&plan, &[pod_ip], "uid-1").unwrap();
            assert_eq!(rule.pod_ips(&plan).unwrap(), [pod_ip]);
            assert!(rule.check(&plan).unwrap().is_empty());
        });
        let on_node = ours(&node);
        assert!(
            on_node.contains("host table") || on_node.contains("ISTIO_POSTRT"),
            "{backend}: {on_node}"
        );
        assert_eq!(
            ours(&daemon),
            "",
            "{backend}: written where the daemon runs"
        );
        in_ns(daemon.path(), || assert!(rule.remove_all().unwrap()));
        assert_eq!(ours(&node), "", "{backend}: left on the node");
    }
    // The node backend's probe reads the node: kubelet's legacy hint chain there (and none
    // where the daemon runs) makes it iptables-legacy.
    node.exec_ok(
        "iptables-legacy",
        &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
    )
    .unwrap();
    let decided = in_ns(daemon.path(), || {
        redirect::node::decide_here(BackendChoice::Auto, false)
    });
    assert_eq!(
        decided.backend,
        Backend::IptablesLegacy,
        "{}",
        decided.reason
    );
}
