//! Rollouts without a gap (issue 21 item 7): SIGTERM to install-cni while its DaemonSet still
//! exists (a rolling update) keeps the plugin installed, so a sidecar pod ADDed before the next
//! daemon is up is programmed by the plugin itself and captured from its first packet; once the
//! DaemonSet is being deleted (an uninstall), SIGTERM removes everything, as before; so does
//! a DaemonSet the daemon may not read (403 once `helm uninstall` deleted its ServiceAccount):
//! an error is not an upgrade, as in Istio.
//!
//! Real chain (cnitool, Debian's bridge + host-local, istio-cni), real traffic; the API server
//! is the harness's, serving the pod and the `istio-cni-node` DaemonSet.

use integration::cni::{require_cni_tools, rules};
use integration::node::{CONFLIST, Node, NodeOptions, product_bin_dir};
use integration::pods::{DemoPod, PodKind, expectations};
use integration::{Probe, TestNetns};

const DS: (&str, &str) = ("istio-system", "istio-cni-node");

fn node() -> Node {
    require_cni_tools();
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.backend = "nft".into();
    Node::new(opts).unwrap()
}

/// ADDs a sidecar pod and checks every connection lands where the sidecar's rules send it,
/// the app's first connection included.
fn add_and_probe(node: &Node, name: &str) -> (TestNetns, usize) {
    let spec = DemoPod::new(PodKind::Sidecar, name);
    node.serve(&spec);
    let ns = TestNetns::with_prefix("rollout").unwrap();
    let add = node.add(&ns, &spec);
    add.assert_ok();
    let _sidecar = Probe::sidecar(ns.path()).unwrap();
    let addrs = node.addrs(&add.json());
    let checks = expectations(spec.kind, &addrs);
    for e in &checks {
        let out = node.probe(&ns, e);
        assert!(
            e.matches(&out),
            "{}: expected {}, got {out}\nrules:\n{}\nplugin log:\n{}",
            e.what,
            e.expected(),
            rules(&ns),
            node.plugin_log()
        );
    }
    (ns, checks.len())
}

#[test]
fn a_rollout_keeps_the_plugin_and_an_uninstall_removes_it() {
    let mut node = node();
    let _world = Probe::world(node.ns.path()).unwrap();
    node.api.put_daemonset(DS.0, DS.1);
    node.start_daemon().unwrap();
    let installed = node.chain();
    assert!(
        installed.contains(&"istio-cni".to_string()),
        "{installed:?}"
    );

    // Rolling update: the old daemon goes, the DaemonSet stays.
    let (st, log) = node.stop_daemon().unwrap();
    assert!(st.success(), "{log}");
    assert!(log.contains("safe upgrade"), "{log}");
    assert_eq!(node.chain(), installed, "the plugin left the chain:\n{log}");
    assert!(node.bin_dir.join("istio-cni").is_file());
    assert!(node.run_dir.join("istio-cni-kubeconfig").is_file());
    // A pod started in the gap, before the next daemon: captured from its first packet.
    let (_gap_pod, probed) = add_and_probe(&node, "started-in-the-gap");

    // The next daemon takes over; then the uninstall: the DaemonSet is being deleted.
    node.start_daemon().unwrap();
    node.api.daemonset_deleting(DS.0, DS.1);
    let (st, log) = node.stop_daemon().unwrap();
    assert!(st.success(), "{log}");
    assert!(log.contains("removing the install"), "{log}");
    assert_eq!(node.chain(), ["bridge", "portmap"], "{log}");
    assert!(!node.bin_dir.join("istio-cni").exists());
    assert!(!node.run_dir.join("istio-cni-kubeconfig").exists());
    assert_eq!(
        node.conflist_json().unwrap(),
        node.primary_conflist(),
        "{CONFLIST} is the primary's again"
    );

    // The DaemonSet already gone (background deletion) uninstalls too.
    node.api.remove_daemonset(DS.0, DS.1);
    node.start_daemon().unwrap();
    let (_, log) = node.stop_daemon().unwrap();
    assert!(log.contains("is gone"), "{log}");
    assert_eq!(node.chain(), ["bridge", "portmap"]);
    println!(
        "rollout: plugin kept across SIGTERM while the DaemonSet lives; a pod ADDed in the gap: {probed}/{probed} connections where its rules send them; uninstall (deleting, gone) removed everything"
    );
}

/// `helm uninstall` deletes the ServiceAccount with the DaemonSet, so the daemon's GET of its
/// DaemonSet is refused (403) while the DaemonSet may still be there. That is no upgrade (Istio's
/// `ShouldStopForUpgrade`: an error cleans up): SIGTERM removes the plugin, its files and
/// kubeconfig, and the log names the refusal. Before the fix the plugin was kept ("fail
/// closed"), and every later pod's ADD on the node failed for good.
#[test]
fn a_daemonset_the_daemon_may_not_read_is_an_uninstall() {
    let mut node = node();
    node.api.put_daemonset(DS.0, DS.1);
    node.start_daemon().unwrap();
    assert!(node.chain().contains(&"istio-cni".to_string()));
    node.api.forbid_daemonset(DS.0, DS.1);
    let (st, log) = node.stop_daemon().unwrap();
    assert!(st.success(), "{log}");
    assert!(log.contains("removing the install"), "{log}");
    assert!(
        log.contains("forbidden"),
        "the log names the refusal:\n{log}"
    );
    assert_eq!(node.chain(), ["bridge", "portmap"], "{log}");
    assert!(!node.bin_dir.join("istio-cni").exists());
    assert!(!node.run_dir.join("istio-cni-kubeconfig").exists());
    assert_eq!(
        node.conflist_json().unwrap(),
        node.primary_conflist(),
        "{CONFLIST} is the primary's again"
    );
    println!("rollout: a DaemonSet GET refused with 403 uninstalled everything on SIGTERM");
}
