//! `redirect::branch_eni` under Istio's `ALLOW_SWITCH_TO_HOST_NS` (`redirect::host_netns`): a
//! daemon in a pod network reads the node's `tcp_early_demux`, finds the node's branch ENI
//! layout and writes the probe rules in the node's namespace, never its own. The layout is
//! Istio's own test's (`brancheni_linux_test.go`: a host route in table 197 through `lo`, `iif
//! lo lookup 197` at 10). One test in its own binary: the switch is process-wide, set once.

use redirect::branch_eni::{self, BranchEni};
use testbed::host_probe::in_ns;
use testbed::*;

fn rules(ns: &TestNetns) -> String {
    ns.exec_ok("ip", &["-4", "rule", "show"]).unwrap()
}

#[test]
fn the_node_namespace_is_read_and_written_not_the_daemons() {
    require_root();
    let node = TestNetns::with_prefix("benisw-node").unwrap();
    let daemon = TestNetns::with_prefix("benisw-pod").unwrap();
    node.ip_batch(&[
        "route add 10.88.88.88/32 dev lo scope link table 197".into(),
        "rule add iif lo lookup 197 priority 10".into(),
    ])
    .unwrap();
    node.sh("echo 0 > /proc/sys/net/ipv4/tcp_early_demux")
        .unwrap();
    daemon
        .sh("echo 1 > /proc/sys/net/ipv4/tcp_early_demux")
        .unwrap();
    let (node_before, daemon_before) = (rules(&node), rules(&daemon));
    redirect::host_netns::switch_to(node.path()).unwrap();
    let pod = "10.88.88.88".parse().unwrap();
    let eni = BranchEni {
        table: 197,
        veth: "lo".into(),
        iif_priority: 10,
    };
    in_ns(daemon.path(), || {
        assert!(branch_eni::early_demux_disabled().unwrap());
        assert_eq!(branch_eni::detect(pod).unwrap(), Some(eni.clone()));
        branch_eni::add(pod, &eni).unwrap();
    });
    let on_node = rules(&node);
    assert!(
        on_node.contains("9:\tfrom all iif lo lookup local"),
        "{on_node}"
    );
    assert!(
        on_node.contains("512:\tfrom all to 10.88.88.88 lookup 197"),
        "{on_node}"
    );
    assert_eq!(
        rules(&daemon),
        daemon_before,
        "written where the daemon runs"
    );
    in_ns(daemon.path(), || {
        assert!(branch_eni::remove(pod, &eni).unwrap().is_empty());
    });
    assert_eq!(rules(&node), node_before);
}
