//! The repair controller end to end: the real install-cni binary watches a local API server
//! (real LIST + WATCH JSON events) and repairs, deletes or labels broken pods. The repair case
//! uses a real pod network namespace with a process in it, found through /proc by the pod IP,
//! and checks where real connections land afterwards.

mod common;

use common::kube_api::{FakeKube, broken_pod};
use common::running::{RunningPod, proc_root};
use common::*;
use serde_json::{Value, json};
use std::time::Duration;
use testbed::Probe;

const T: Duration = Duration::from_secs(20);
const NODE: &str = "node-a";

fn metric(d: &Daemon, kind: &str, result: &str) -> f64 {
    d.metric(&format!(
        "istio_cni_repair_pods_repaired_total{{type=\"{kind}\",result=\"{result}\"}}"
    ))
}

fn start(env: &Env, kube: &FakeKube, extra: &[(&str, &str)]) -> Daemon {
    let kc = kube.kubeconfig(env.tmp.path());
    let kc = kc.to_str().unwrap().to_string();
    let proc = proc_root(env);
    let proc = proc.to_str().unwrap().to_string();
    // The repair controller alone (reconcile would program the mesh pods these tests leave
    // broken on purpose; tests/reconcile.rs covers both together).
    let mut envs: Vec<(&str, &str)> = vec![
        ("KUBECONFIG", &kc),
        ("REPAIR_NODE_NAME", NODE),
        ("REPAIR_PROC_ROOT", &proc),
        ("RECONCILE_ENABLED", "false"),
    ];
    envs.extend_from_slice(extra);
    let d = env.start(&envs);
    assert!(
        wait_until(T, || kube.watchers() > 0),
        "the daemon never opened a pod watch; requests {:?}\n{}",
        kube.requests(),
        d.log()
    );
    d
}

#[test]
fn repairs_a_broken_pod_in_place_and_traffic_is_captured() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let pod = RunningPod::new();
    let _sidecar = Probe::sidecar(pod.world.pod.path()).unwrap();
    let _server = Probe::world(pod.world.world.path()).unwrap();
    assert_eq!(
        pod.outbound(),
        Some(80),
        "nothing redirects before the repair"
    );

    let d = start(&env, &kube, &[("REDIRECT_BACKEND", "nft")]);
    let list = &kube.requests()[0];
    assert_eq!(
        (list.method.as_str(), list.path.as_str()),
        ("GET", "/api/v1/pods")
    );
    assert!(
        list.query.contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{list:?}"
    );
    let watch = kube
        .requests()
        .into_iter()
        .find(|r| r.query.contains("watch=true"))
        .unwrap();
    assert!(
        watch.query.contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{watch:?}"
    );

    let p = kube.add(broken_pod(
        "shop",
        "web",
        "uid-web-1",
        &pod.ip.to_string(),
        NODE,
        126,
    ));
    assert!(
        wait_until(T, || metric(&d, "repair", "success") == 1.0),
        "not repaired:\n{}",
        d.log()
    );
    assert_eq!(pod.outbound(), Some(15001), "outbound lands on Envoy");
    assert_eq!(pod.inbound(), Some(15006), "inbound lands on Envoy");

    assert!(wait_until(T, || !kube.events().is_empty()), "no event");
    let events = kube.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "RepairBrokenPod");
    assert_eq!(events[0]["type"], "Normal");
    assert_eq!(events[0]["involvedObject"]["uid"], "uid-web-1");
    assert_eq!(events[0]["involvedObject"]["name"], "web");
    assert_eq!(events[0]["source"]["host"], NODE);

    // Same UID again (the next crash-loop status update): repaired at most once.
    let mut again = p.clone();
    again["status"]["initContainerStatuses"][0]["restartCount"] = json!(3);
    kube.modify(again);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(metric(&d, "repair", "success"), 1.0, "{}", d.log());
    assert_eq!(metric(&d, "repair", "fail"), 0.0, "{}", d.log());
    assert_eq!(kube.events().len(), 1);
    assert!(
        kube.actions().iter().all(|r| r.method == "POST"),
        "a repair only writes events: {:?}",
        kube.actions()
    );
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
}

#[test]
fn pods_that_do_not_match_are_left_alone() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let untouched = RunningPod::new();
    let sentinel = RunningPod::new();
    let d = start(&env, &kube, &[]);
    let ip = untouched.ip.to_string();

    let mut no_annotation = broken_pod("shop", "a", "uid-a", &ip, NODE, 126);
    no_annotation["metadata"]["annotations"] = json!({});
    let mut succeeded_since = broken_pod("shop", "b", "uid-b", &ip, NODE, 126);
    succeeded_since["status"]["initContainerStatuses"][0]["state"] =
        json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    let other_code = broken_pod("shop", "c", "uid-c", &ip, NODE, 1);
    let mut other_container = broken_pod("shop", "d", "uid-d", &ip, NODE, 126);
    other_container["status"]["initContainerStatuses"][0]["name"] = json!("istio-init-other");
    for p in [no_annotation, succeeded_since, other_code, other_container] {
        kube.add(p);
    }
    // A matching pod after them: once it is repaired, the ones before were seen too.
    kube.add(broken_pod(
        "shop",
        "e",
        "uid-e",
        &sentinel.ip.to_string(),
        NODE,
        126,
    ));
    assert!(
        wait_until(T, || metric(&d, "repair", "success") == 1.0),
        "sentinel not repaired:\n{}",
        d.log()
    );
    assert!(wait_until(T, || !kube.events().is_empty()), "no event");
    std::thread::sleep(Duration::from_millis(300));
    let events = kube.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["involvedObject"]["uid"], "uid-e");
    assert_eq!(metric(&d, "repair", "fail"), 0.0);
    assert_eq!(metric(&d, "repair", "skip"), 0.0);
    // No rules in the namespace the non-matching pods point at.
    let _server = Probe::world(untouched.world.world.path()).unwrap();
    assert_eq!(untouched.outbound(), Some(80));
    let rules = untouched
        .world
        .pod
        .exec_ok("nft", &["list", "ruleset"])
        .unwrap();
    assert!(rules.trim().is_empty(), "{rules}");
    drop(d);
}

fn find(kube: &FakeKube, method: &str) -> Vec<common::kube_api::Req> {
    kube.actions()
        .into_iter()
        .filter(|r| r.method == method)
        .collect()
}

#[test]
fn delete_mode_deletes_with_uid_and_resource_version_preconditions() {
    let env = Env::new();
    let kube = FakeKube::start();
    let d = start(
        &env,
        &kube,
        &[
            ("REPAIR_REPAIR_PODS", "false"),
            ("REPAIR_DELETE_PODS", "true"),
            ("REPAIR_LABEL_PODS", "true"),
        ],
    );
    let p = kube.add(broken_pod(
        "shop",
        "web",
        "uid-del",
        "10.255.0.9",
        NODE,
        126,
    ));
    assert!(
        wait_until(T, || metric(&d, "delete", "success") == 1.0),
        "{:?}\n{}",
        kube.requests(),
        d.log()
    );
    let del = find(&kube, "DELETE");
    assert_eq!(del.len(), 1, "{del:?}");
    assert_eq!(del[0].path, "/api/v1/namespaces/shop/pods/web");
    let body = del[0].json();
    assert_eq!(body["preconditions"]["uid"], "uid-del", "{body}");
    assert_eq!(
        body["preconditions"]["resourceVersion"], p["metadata"]["resourceVersion"],
        "{body}"
    );
    assert!(find(&kube, "PATCH").is_empty(), "delete wins over label");
    assert!(wait_until(T, || !kube.events().is_empty()));
    let ev = &kube.events()[0];
    assert_eq!(ev["reason"], "DeleteBrokenPod");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["involvedObject"]["uid"], "uid-del");
    let post = &find(&kube, "POST")[0];
    assert_eq!(post.path, "/api/v1/namespaces/shop/events");
}

#[test]
fn label_mode_patches_the_status_subresource_and_retries() {
    let env = Env::new();
    let kube = FakeKube::start();
    let d = start(
        &env,
        &kube,
        &[
            ("REPAIR_REPAIR_PODS", "false"),
            ("REPAIR_LABEL_PODS", "true"),
            ("REPAIR_BROKEN_POD_LABEL_KEY", "example.com/broken"),
            ("REPAIR_BROKEN_POD_LABEL_VALUE", "yes"),
        ],
    );
    // The first PATCH fails: retried with backoff, then succeeds.
    kube.fail_next("PATCH", 1);
    kube.add(broken_pod(
        "shop",
        "web",
        "uid-lab",
        "10.255.0.10",
        NODE,
        126,
    ));
    assert!(
        wait_until(T, || metric(&d, "label", "success") == 1.0),
        "{:?}\n{}",
        kube.requests(),
        d.log()
    );
    assert_eq!(metric(&d, "label", "fail"), 1.0);
    let patches = find(&kube, "PATCH");
    assert_eq!(patches.len(), 2, "{patches:?}");
    for p in &patches {
        assert_eq!(p.path, "/api/v1/namespaces/shop/pods/web/status");
        assert_eq!(p.content_type, "application/merge-patch+json");
        assert_eq!(
            p.json(),
            json!({"metadata": {"labels": {"example.com/broken": "yes"}}})
        );
    }
    assert!(wait_until(T, || !kube.events().is_empty()));
    assert_eq!(kube.events()[0]["reason"], "LabelBrokenPod");

    // Already labeled: counted as skipped, nothing sent.
    let mut labeled = broken_pod("shop", "api", "uid-lab2", "10.255.0.11", NODE, 126);
    labeled["metadata"]["labels"] = json!({"example.com/broken": "yes"});
    kube.add(labeled);
    assert!(
        wait_until(T, || metric(&d, "label", "skip") == 1.0),
        "{}",
        d.log()
    );
    assert_eq!(find(&kube, "PATCH").len(), 2);
    assert_eq!(kube.events().len(), 1);
    let _: Vec<Value> = kube.events();
}

#[test]
fn repair_can_be_disabled() {
    let env = Env::new();
    let kube = FakeKube::start();
    let kc = kube.kubeconfig(env.tmp.path());
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_ENABLED", "false"),
        ("RECONCILE_ENABLED", "false"),
    ]);
    assert!(d.wait_log("repair controller disabled", T), "{}", d.log());
    assert!(
        d.wait_log("continuous reconcile disabled", T),
        "{}",
        d.log()
    );
    assert!(kube.requests().is_empty());
    assert_eq!(metric(&d, "repair", "success"), 0.0);
}
