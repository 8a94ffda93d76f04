//! Controller mode end to end (CONTROLLER_MODE=true): the real install-cni binary, a local API
//! server, real pod network namespaces with no rules (no CNI entry ran). Pods opted in with
//! `istio-pod-network-controller/initialize: "true"` (on the pod, or on its namespace) get
//! their rules at first sight, long before the 5-minute reconcile interval, real connections
//! land on Envoy, and the pod is annotated `initialized`; a pod without the opt-in gets nothing.

mod common;

use capture::Plan;
use common::kube_api::{FakeKube, broken_pod};
use common::running::{RunningPod, plan_for, proc_root};
use common::*;
use redirect::{Backend, BackendChoice};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use testbed::Probe;

/// Hang guard for "programmed within 1 s" (the target; timings are printed), generous for a
/// loaded machine.
const BOUND: Duration = Duration::from_secs(10);
const T: Duration = Duration::from_secs(20);
const NODE: &str = "node-c";
const INITIALIZE: &str = "istio-pod-network-controller/initialize";
const INITIALIZED: &str = "istio-pod-network-controller/initialized";

/// A running sidecar pod in `ns` whose istio-validation init container succeeded.
fn mesh_pod(ns: &str, name: &str, ip: &str, annotations: Value) -> Value {
    let uid = format!("uid-{name}");
    let mut p = broken_pod(ns, name, &uid, ip, NODE, 126);
    p["status"]["phase"] = json!("Running");
    p["status"]["initContainerStatuses"][0]["state"] =
        json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    p["status"]["initContainerStatuses"][0]["lastState"] = json!({});
    for (k, v) in annotations.as_object().unwrap() {
        p["metadata"]["annotations"][k] = v.clone();
    }
    p
}

fn drift(plan: &Plan, p: &RunningPod) -> Vec<String> {
    redirect::check(
        plan,
        Some(p.world.pod.path()),
        BackendChoice::Fixed(Backend::Nft),
    )
    .unwrap()
}

fn annotated(kube: &FakeKube, ns: &str, name: &str) -> bool {
    kube.pod(ns, name)
        .is_some_and(|p| p["metadata"]["annotations"][INITIALIZED] == "true")
}

/// Waits until `pod` (in `running`) has exactly its plan and the `initialized` annotation;
/// returns how long the rules took.
fn programmed(
    d: &Daemon,
    kube: &FakeKube,
    pod: &Value,
    running: &RunningPod,
    t0: Instant,
) -> Duration {
    let plan = plan_for(pod, running);
    let (ns, name) = (
        pod["metadata"]["namespace"].as_str().unwrap(),
        pod["metadata"]["name"].as_str().unwrap(),
    );
    assert!(
        wait_until(BOUND, || drift(&plan, running).is_empty()),
        "{ns}/{name}: not programmed within {BOUND:?}: {:?}\n{}",
        drift(&plan, running),
        d.log()
    );
    let took = t0.elapsed();
    assert_eq!(
        running.outbound(),
        Some(15001),
        "{name}: outbound lands on Envoy"
    );
    assert_eq!(
        running.inbound(),
        Some(15006),
        "{name}: inbound lands on Envoy"
    );
    assert!(
        wait_until(BOUND, || annotated(kube, ns, name)),
        "{ns}/{name}: never annotated\n{}",
        d.log()
    );
    took
}

/// Envoy's listeners in each pod, a server in each world.
fn envoy_and_server(pods: &[&RunningPod]) -> Vec<Probe> {
    pods.iter()
        .flat_map(|r| {
            [
                Probe::sidecar(r.world.pod.path()).unwrap(),
                Probe::world(r.world.world.path()).unwrap(),
            ]
        })
        .collect()
}

/// install-cni in controller mode against `kube` (nft, the pods of this process's /proc as
/// they are now), reconciling every `interval`; returns once its pod watch is open.
fn start_controller(env: &Env, kube: &FakeKube, interval: &str) -> Daemon {
    let kc = kube.kubeconfig(env.tmp.path());
    let proc = proc_root(env);
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_NODE_NAME", NODE),
        ("REPAIR_PROC_ROOT", proc.to_str().unwrap()),
        ("REDIRECT_BACKEND", "nft"),
        ("RECONCILE_INTERVAL", interval),
        ("CONTROLLER_MODE", "true"),
    ]);
    assert!(
        wait_until(T, || kube.watchers() > 0),
        "no pod watch\n{}",
        d.log()
    );
    d
}

#[test]
fn opted_in_pods_are_programmed_at_first_sight_and_annotated_others_are_not() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    kube.put_namespace("opted", json!({INITIALIZE: "true"}));
    kube.put_namespace("shop", json!({}));
    let (early, by_pod, by_ns, plain) = (
        RunningPod::new(),
        RunningPod::new(),
        RunningPod::new(),
        RunningPod::new(),
    );
    // Its namespace is opted in only later (created now: the daemon's proc root lists the
    // processes that exist when it starts).
    let late = RunningPod::new();
    let ip = |r: &RunningPod| r.ip.to_string();
    let _probes = envoy_and_server(&[&early, &by_pod, &by_ns, &plain]);
    assert_eq!(
        early.outbound(),
        Some(80),
        "no rules yet: straight to the server"
    );
    // Already running when the daemon starts (in its first list).
    let early_pod = kube.add(mesh_pod(
        "shop",
        "early",
        &ip(&early),
        json!({INITIALIZE: "true"}),
    ));
    let t_start = Instant::now();
    // Far longer than the test: programming must not wait for the periodic check.
    let d = start_controller(&env, &kube, "5m");
    let early_took = programmed(&d, &kube, &early_pod, &early, t_start);

    // Pods started later, without the opt-in first (the others are added after it).
    let plain_pod = kube.add(mesh_pod("shop", "plain", &ip(&plain), json!({})));
    let t0 = Instant::now();
    let pod_pod = kube.add(mesh_pod(
        "shop",
        "by-pod",
        &ip(&by_pod),
        json!({INITIALIZE: "true"}),
    ));
    let pod_took = programmed(&d, &kube, &pod_pod, &by_pod, t0);
    let t0 = Instant::now();
    let ns_pod = kube.add(mesh_pod("opted", "by-ns", &ip(&by_ns), json!({})));
    let ns_took = programmed(&d, &kube, &ns_pod, &by_ns, t0);
    eprintln!(
        "controller mode: rules in place after: first list {early_took:?} (from daemon start), \
         pod opt-in {pod_took:?}, namespace opt-in {ns_took:?}"
    );

    // The pod without opt-in: no rules, no annotation, never patched.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(plain.outbound(), Some(80));
    let rules = plain
        .world
        .pod
        .exec_ok("nft", &["list", "ruleset"])
        .unwrap();
    assert!(rules.trim().is_empty(), "{rules}");
    assert!(!annotated(&kube, "shop", "plain"));
    let patches: Vec<String> = kube
        .actions()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.path)
        .collect();
    assert_eq!(patches.len(), 3, "{patches:?}");
    assert!(
        !patches.iter().any(|p| p.ends_with("/plain")),
        "{patches:?}"
    );
    let _ = plain_pod;
    // Each patch is a merge patch of the annotation alone.
    let r = kube
        .actions()
        .into_iter()
        .find(|r| r.method == "PATCH")
        .unwrap();
    assert!(r.content_type.contains("merge-patch"), "{}", r.content_type);
    assert_eq!(
        r.json(),
        json!({"metadata": {"annotations": {INITIALIZED: "true"}}})
    );
    // Namespaces come from the daemon's one namespace watch, never a GET per pod.
    let gets = kube
        .actions()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/api/v1/namespaces/opted"))
        .count();
    assert_eq!(gets, 0);
    assert!(kube.namespace_watch_requests() >= 1);

    // A namespace opted in while its pod already runs: the pod is programmed at once, with no
    // event of its own (the namespace watch re-evaluates the namespace's pods).
    let _late_probes = envoy_and_server(&[&late]);
    kube.put_namespace("later", json!({}));
    let late_pod = kube.add(mesh_pod("later", "late", &ip(&late), json!({})));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(late.outbound(), Some(80), "not opted in yet: no rules");
    let t0 = Instant::now();
    kube.put_namespace("later", json!({INITIALIZE: "true"}));
    let late_took = programmed(&d, &kube, &late_pod, &late, t0);
    eprintln!("controller mode: namespace opted in later: rules in place after {late_took:?}");
    assert_eq!(
        d.metric("istio_cni_pod_rules_checks_total{result=\"failed\"}"),
        0.0,
        "{}",
        d.log()
    );
}

/// The `initialized` PATCH is written in the background: an API server that never answers it
/// holds up no other pod's programming (before: the reconcile loop awaited the PATCH, bounded
/// only by the client's read timeout, minutes), and once it answers again the pod is
/// annotated at a later check.
#[test]
fn a_hung_initialized_patch_holds_up_no_other_pod() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    kube.put_namespace("shop", json!({}));
    let (first, second) = (RunningPod::new(), RunningPod::new());
    let _probes = envoy_and_server(&[&first, &second]);
    // The retry of a PATCH that timed out comes with the pod's next check.
    let d = start_controller(&env, &kube, "1s");
    kube.hang_next_pod_patches(1);
    let opt_in = || json!({INITIALIZE: "true"});
    let first_pod = kube.add(mesh_pod("shop", "first", &first.ip.to_string(), opt_in()));
    let first_plan = plan_for(&first_pod, &first);
    assert!(
        wait_until(BOUND, || drift(&first_plan, &first).is_empty()),
        "{}",
        d.log()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(!annotated(&kube, "shop", "first"), "its PATCH hangs");
    let t0 = Instant::now();
    let second_pod = kube.add(mesh_pod("shop", "second", &second.ip.to_string(), opt_in()));
    let took = programmed(&d, &kube, &second_pod, &second, t0);
    assert!(
        !annotated(&kube, "shop", "first"),
        "the first PATCH still hangs"
    );
    eprintln!("second pod programmed {took:?} after its ADDED, the first pod's PATCH hanging");
    // The hung PATCH gives up after its bound; the next check annotates the first pod.
    assert!(
        wait_until(T, || annotated(&kube, "shop", "first")),
        "{}",
        d.log()
    );
    assert!(
        d.log().contains("no answer from the API server"),
        "{}",
        d.log()
    );
}

/// The background PATCHes are bounded: with the API server answering none, 20 programmed
/// pods leave at most 16 PATCHes waiting (`MARKS_IN_FLIGHT`); the others are logged and left
/// for their next check, and every pod is still programmed.
#[test]
fn hung_initialized_patches_are_capped() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    kube.put_namespace("shop", json!({INITIALIZE: "true"}));
    let pods: Vec<RunningPod> = (0..20).map(|_| RunningPod::new()).collect();
    let d = start_controller(&env, &kube, "5m");
    kube.hang_next_pod_patches(1000);
    let jsons: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            kube.add(mesh_pod(
                "shop",
                &format!("p{i}"),
                &p.ip.to_string(),
                json!({}),
            ))
        })
        .collect();
    for (json, p) in jsons.iter().zip(&pods) {
        let plan = plan_for(json, p);
        assert!(
            wait_until(BOUND, || drift(&plan, p).is_empty()),
            "{}",
            d.log()
        );
    }
    assert!(d.wait_log("not annotating", T), "{}", d.log());
    let patches = || {
        kube.requests()
            .iter()
            .filter(|r| r.method == "PATCH")
            .count()
    };
    // The 16 in flight are counted when spawned; their PATCHes reach the server a little later.
    assert!(wait_until(T, || patches() >= 16), "{}", d.log());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(patches(), 16, "{}", d.log());
}
