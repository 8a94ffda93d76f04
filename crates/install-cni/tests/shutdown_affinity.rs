//! Istio release note 58768: on SIGTERM the real daemon reads its DaemonSet and, when the
//! DaemonSet's pods are placed by a nodeSelector or a required node affinity, this node (from
//! the fake API server, real API paths). A DaemonSet that still selects the node is a rollout
//! (the install stays); one that no longer does, or a node that is gone, evicted the daemon for
//! good: the install is removed. A DaemonSet without such rules never costs a node read.

mod common;

use common::kube_api::FakeKube;
use common::*;
use serde_json::{Value, json};
use std::fs;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(15);
const NODE: &str = "worker-1";

fn daemonset(pod_spec: Value) -> Value {
    json!({"kind": "DaemonSet", "apiVersion": "apps/v1",
        "metadata": {"name": "istio-cni-node", "namespace": "istio-system", "uid": "ds-uid"},
        "spec": {"selector": {"matchLabels": {"k8s-app": "istio-cni-node"}},
                 "template": {"metadata": {"labels": {"k8s-app": "istio-cni-node"}},
                              "spec": pod_spec}}})
}

fn node(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "uid": "uid-node", "resourceVersion": "1", "labels": labels},
        "spec": {}, "status": {}})
}

fn chained(conflist: &Path) -> bool {
    fs::read_to_string(conflist).is_ok_and(|s| s.contains("\"istio-cni\""))
}

/// One daemon's life on the node: started against `kube`, ready, SIGTERM; its log.
fn run_once(env: &Env, kube: &FakeKube) -> String {
    let kc = kube.kubeconfig(env.tmp.path());
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("POD_NAMESPACE", "istio-system"),
        ("KUBERNETES_NODE_NAME", NODE),
        ("REPAIR_ENABLED", "false"),
        ("RECONCILE_ENABLED", "false"),
    ]);
    d.wait_ready(T);
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    log
}

fn node_reads(kube: &FakeKube) -> usize {
    kube.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == format!("/api/v1/nodes/{NODE}"))
        .count()
}

#[test]
fn a_daemonset_that_no_longer_selects_this_node_is_an_uninstall() {
    let env = Env::new();
    let conflist = env.net.join("10-calico.conflist");
    fs::write(&conflist, calico()).unwrap();
    let kube = FakeKube::start();
    let linux = json!({"kubernetes.io/os": "linux"});

    // No node rules: a rollout, and the node is never read.
    kube.put_daemonset_json(daemonset(json!({"containers": []})));
    kube.put_node_json(node(linux.clone()));
    let log = run_once(&env, &kube);
    assert!(log.contains("safe upgrade") && chained(&conflist), "{log}");
    assert_eq!(node_reads(&kube), 0);

    // The chart's nodeSelector, still matching: a rollout (the node was read).
    kube.put_daemonset_json(daemonset(
        json!({"containers": [], "nodeSelector": {"kubernetes.io/os": "linux", "mesh": "on"}}),
    ));
    kube.put_node_json(node(json!({"kubernetes.io/os": "linux", "mesh": "on"})));
    let log = run_once(&env, &kube);
    assert!(log.contains("safe upgrade") && chained(&conflist), "{log}");
    assert!(log.contains("still selects node worker-1"), "{log}");
    assert_eq!(node_reads(&kube), 1);

    // The node's label changed: the DaemonSet evicts the daemon for good.
    kube.put_node_json(node(json!({"kubernetes.io/os": "linux", "mesh": "off"})));
    let log = run_once(&env, &kube);
    assert!(log.contains("no longer selects node worker-1"), "{log}");
    assert!(log.contains("removing the install"), "{log}");
    assert_eq!(fs::read(&conflist).unwrap(), calico(), "{log}");
    assert!(!env.bin.join("istio-cni").exists());

    // Required node affinity (Istio's check): this node excluded by name.
    kube.put_node_json(node(linux.clone()));
    kube.put_daemonset_json(daemonset(json!({"containers": [], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [NODE]}]}]}}}})));
    let log = run_once(&env, &kube);
    assert!(log.contains("no longer selects node worker-1"), "{log}");
    assert_eq!(fs::read(&conflist).unwrap(), calico(), "{log}");

    // The same affinity selecting the node by label: a rollout.
    kube.put_daemonset_json(daemonset(json!({"containers": [], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}})));
    let log = run_once(&env, &kube);
    assert!(log.contains("safe upgrade") && chained(&conflist), "{log}");

    // The node object is gone (the node is leaving the cluster): no daemon follows.
    kube.remove_node(NODE);
    let log = run_once(&env, &kube);
    assert!(log.contains("node worker-1 is gone"), "{log}");
    assert_eq!(fs::read(&conflist).unwrap(), calico(), "{log}");
    println!(
        "shutdown affinity: kept while selected ({} node reads), removed when the nodeSelector, the required affinity or the node itself no longer admit this node",
        node_reads(&kube)
    );
}

/// The line of `log` that says the job `name` stopped (`None`: no such line).
fn stopped_at(log: &str, name: &str) -> Option<usize> {
    let field = format!("job={name} stage=");
    log.lines()
        .position(|l| l.contains("shutdown: job stopped") && l.contains(&field))
}

/// SIGTERM with the Kubernetes jobs running: each job is drained (one line each), the watch
/// before its consumers before the sockets, all within the drain's bound, and then the
/// install is still removed.
#[test]
fn sigterm_drains_every_job_in_order_then_uninstalls() {
    let env = Env::new();
    let conflist = env.net.join("10-calico.conflist");
    fs::write(&conflist, calico()).unwrap();
    let kube = FakeKube::start();
    // A DaemonSet that no longer selects this node: the shutdown is an uninstall.
    kube.put_daemonset_json(daemonset(
        json!({"containers": [], "nodeSelector": {"mesh": "on"}}),
    ));
    kube.put_node_json(node(json!({"mesh": "off"})));
    let kc = kube.kubeconfig(env.tmp.path());
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("POD_NAMESPACE", "istio-system"),
        ("KUBERNETES_NODE_NAME", NODE),
    ]);
    d.wait_ready(T);
    let sent = std::time::Instant::now();
    let (st, log) = d.stop().unwrap();
    let took = sent.elapsed();
    assert!(st.success(), "{log}");
    // The drain's 3 s plus the uninstall, with room for a loaded machine.
    assert!(took < Duration::from_secs(8), "{took:?}\n{log}");
    let jobs = [
        "pod watch",
        "repair",
        "reconcile",
        "status pass",
        "pods.sock",
        "status.sock",
        "plugin log relay",
    ];
    let at: Vec<usize> = jobs
        .iter()
        .map(|j| stopped_at(&log, j).unwrap_or_else(|| panic!("no drain line for {j}:\n{log}")))
        .collect();
    let (watch, consumers, servers) = (at[0], &at[1..4], &at[4..]);
    assert!(consumers.iter().all(|c| *c > watch), "{log}");
    let last_consumer = consumers.iter().max().unwrap();
    assert!(servers.iter().all(|s| s > last_consumer), "{log}");
    assert!(!log.contains("overran"), "{log}");
    let drained = log.find("jobs drained").expect("the drain's summary");
    let removing = log.find("removing the install").expect("an uninstall");
    assert!(drained < removing, "{log}");
    assert_eq!(fs::read(&conflist).unwrap(), calico(), "{log}");
    assert!(!env.bin.join("istio-cni").exists());
    println!(
        "summary: sigterm-drain: {} jobs drained in order in {took:?}, then uninstalled",
        jobs.len()
    );
}
