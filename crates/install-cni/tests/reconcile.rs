//! Continuous reconcile end to end: the real install-cni binary, a local API server (real LIST +
//! WATCH), a real pod network namespace programmed as the plugin would, then sabotaged in
//! three ways (chain flushed, table deleted, foreign rule inserted in our table). Each time
//! the daemon repairs it within a bound, counts it, writes an Event, and real connections land
//! on Envoy again. A pod outside the mesh, whose namespace holds a hand-made table with our
//! name, is never touched.

mod common;

use capture::Plan;
use common::kube_api::FakeKube;
use common::running::{RunningPod, mesh_pod, nft, plain_pod, plan_for, proc_root};
use common::*;
use guardian::podplan;
use k8s_openapi::api::core::v1::Pod;
use pod_policy::Decision;
use redirect::{Backend, BackendChoice};
use serde_json::json;
use std::time::{Duration, Instant};
use testbed::Probe;

/// Bound for each repair: a few reconcile intervals (1 s here), generous for a loaded machine.
const REPAIR_BOUND: Duration = Duration::from_secs(10);
const T: Duration = Duration::from_secs(20);
const NODE: &str = "node-r";

fn checks(d: &Daemon, result: &str) -> f64 {
    d.metric(&format!(
        "istio_cni_pod_rules_checks_total{{result=\"{result}\"}}"
    ))
}

/// Waits until `other` is programmed or the daemon failed two more checks than `failed`
/// (the pod it must not get retried), then 2 s more: `other`'s ruleset stayed empty (`what`
/// happened otherwise), the daemon repaired nothing after its first repair, and it retried.
#[track_caller]
fn never_programmed(d: &Daemon, other: &RunningPod, failed: f64, what: &str) {
    let programmed = || !nft(other, "list ruleset").trim().is_empty();
    wait_until(T, || programmed() || checks(d, "failed") >= failed + 2.0);
    std::thread::sleep(Duration::from_secs(2));
    let rules = nft(other, "list ruleset");
    assert!(rules.trim().is_empty(), "{what}:\n{rules}\n{}", d.log());
    assert_eq!(checks(d, "repaired"), 1.0, "{}", d.log());
    assert!(
        checks(d, "failed") >= failed + 2.0,
        "not retried\n{}",
        d.log()
    );
}

fn drift(plan: &Plan, p: &RunningPod, backend: Backend) -> Vec<String> {
    redirect::check(
        plan,
        Some(p.world.pod.path()),
        BackendChoice::Fixed(backend),
    )
    .unwrap()
}

fn start(env: &Env, kube: &FakeKube) -> Daemon {
    start_with(env, kube, Backend::Nft)
}

fn start_with(env: &Env, kube: &FakeKube, backend: Backend) -> Daemon {
    let kc = kube.kubeconfig(env.tmp.path());
    let proc = proc_root(env);
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_NODE_NAME", NODE),
        ("REPAIR_PROC_ROOT", proc.to_str().unwrap()),
        ("REDIRECT_BACKEND", &backend.to_string()),
        ("RECONCILE_INTERVAL", "1s"),
    ]);
    assert!(
        wait_until(T, || kube.watchers() > 0),
        "the daemon never opened a pod watch\n{}",
        d.log()
    );
    d
}

/// Runs `sabotage`, then waits for the daemon's repair; returns how long it took.
fn repaired_after(
    d: &Daemon,
    kube: &FakeKube,
    (plan, backend): (&Plan, Backend),
    pod: &RunningPod,
    what: &str,
    sabotage: impl FnOnce(),
) -> Duration {
    let before = checks(d, "repaired");
    let events = kube.events().len();
    let t0 = Instant::now();
    sabotage();
    assert!(
        wait_until(REPAIR_BOUND, || checks(d, "repaired") > before),
        "{what}: not repaired within {REPAIR_BOUND:?}; drift now {:?}\n{}",
        drift(plan, pod, backend),
        d.log()
    );
    let took = t0.elapsed();
    assert_eq!(drift(plan, pod, backend), Vec::<String>::new(), "{what}");
    assert_eq!(
        pod.outbound(),
        Some(15001),
        "{what}: outbound lands on Envoy"
    );
    assert_eq!(pod.inbound(), Some(15006), "{what}: inbound lands on Envoy");
    assert!(
        wait_until(T, || kube.events().len() > events),
        "{what}: no event"
    );
    let ev = kube.events().pop().unwrap();
    assert_eq!(ev["reason"], "RedirectRulesRepaired", "{what}: {ev}");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["involvedObject"]["uid"], "uid-mesh");
    assert_eq!(ev["source"]["component"], "cni-reconcile");
    assert!(
        ev["message"]
            .as_str()
            .unwrap()
            .contains("drifted from the plan"),
        "{ev}"
    );
    assert!(
        d.wait_log("redirect rules drifted from the plan; re-applied", T),
        "{}",
        d.log()
    );
    took
}

#[test]
fn drifted_rules_are_repaired_and_traffic_lands_on_envoy_again() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let mesh = RunningPod::new();
    let plain = RunningPod::new();
    let _sidecar = Probe::sidecar(mesh.world.pod.path()).unwrap();
    let _server = Probe::world(mesh.world.world.path()).unwrap();
    let _plain_server = Probe::world(plain.world.world.path()).unwrap();

    // The mesh pod as ADD left it.
    let mesh_json = mesh_pod(NODE, "web", "uid-mesh", &mesh.ip.to_string());
    let plan = plan_for(&mesh_json, &mesh);
    redirect::apply(
        &plan,
        Some(mesh.world.pod.path()),
        BackendChoice::Fixed(Backend::Nft),
    )
    .unwrap();
    assert_eq!(mesh.outbound(), Some(15001));
    // The plain pod's namespace: a hand-made table that even bears our name.
    nft(&plain, "add table inet istio-proxy-nat");
    nft(
        &plain,
        "add chain inet istio-proxy-nat mine { type nat hook output priority -100 ; }",
    );
    nft(
        &plain,
        "add rule inet istio-proxy-nat mine tcp dport 9 accept",
    );
    let plain_rules = nft(&plain, "list ruleset");

    let d = start(&env, &kube);
    kube.add(mesh_json);
    kube.add(plain_pod(NODE, "db", "uid-plain", &plain.ip.to_string()));
    // Checked at once (a new pod) and then about once a second.
    assert!(
        wait_until(T, || checks(&d, "ok") >= 3.0),
        "no periodic checks\n{}",
        d.log()
    );
    assert_eq!(
        d.metric("istio_cni_reconcile_pods"),
        1.0,
        "only the mesh pod"
    );
    assert_eq!(checks(&d, "drift"), 0.0, "{}", d.log());

    let flush = repaired_after(
        &d,
        &kube,
        (&plan, Backend::Nft),
        &mesh,
        "flushed chain",
        || {
            nft(&mesh, "flush chain inet istio-proxy-nat istio-output");
        },
    );
    let delete = repaired_after(
        &d,
        &kube,
        (&plan, Backend::Nft),
        &mesh,
        "deleted table",
        || {
            nft(&mesh, "delete table inet istio-proxy-nat");
        },
    );
    let foreign = repaired_after(
        &d,
        &kube,
        (&plan, Backend::Nft),
        &mesh,
        "foreign rule",
        || {
            // Lets every outbound TCP connection escape capture.
            nft(
                &mesh,
                "insert rule inet istio-proxy-nat output meta l4proto tcp accept",
            );
        },
    );
    eprintln!(
        "repaired within: flushed chain {flush:?}, deleted table {delete:?}, foreign rule {foreign:?}"
    );

    assert_eq!(checks(&d, "drift"), 3.0, "{}", d.log());
    assert_eq!(checks(&d, "repaired"), 3.0);
    assert_eq!(checks(&d, "failed"), 0.0, "{}", d.log());
    // A few more intervals: the plain pod's namespace is exactly as it was.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(nft(&plain, "list ruleset"), plain_rules);
    assert_eq!(plain.outbound(), Some(80));
    assert!(
        kube.events()
            .iter()
            .all(|e| e["involvedObject"]["uid"] == "uid-mesh"),
        "{:?}",
        kube.events()
    );
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
}

#[test]
fn iptables_legacy_rules_are_repaired_too() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let mesh = RunningPod::new();
    let _sidecar = Probe::sidecar(mesh.world.pod.path()).unwrap();
    let _server = Probe::world(mesh.world.world.path()).unwrap();
    let mesh_json = mesh_pod(NODE, "web", "uid-mesh", &mesh.ip.to_string());
    let plan = plan_for(&mesh_json, &mesh);
    let legacy = Backend::IptablesLegacy;
    redirect::apply(
        &plan,
        Some(mesh.world.pod.path()),
        BackendChoice::Fixed(legacy),
    )
    .unwrap();
    let d = start_with(&env, &kube, legacy);
    kube.add(mesh_json);
    assert!(wait_until(T, || checks(&d, "ok") >= 1.0), "{}", d.log());
    repaired_after(&d, &kube, (&plan, legacy), &mesh, "flushed chain", || {
        mesh.world
            .pod
            .exec_ok("iptables-legacy", &["-t", "nat", "-F", "ISTIO_OUTPUT"])
            .unwrap();
    });
    // The node's backend is legacy: no nftables table of ours appeared.
    let tables = mesh.world.pod.exec_ok("nft", &["list", "tables"]).unwrap();
    assert!(!tables.contains("istio-proxy"), "{tables}");
    assert_eq!(checks(&d, "failed"), 0.0, "{}", d.log());
}

#[test]
fn a_pod_on_the_other_backend_is_migrated_to_the_nodes() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let mesh = RunningPod::new();
    let _sidecar = Probe::sidecar(mesh.world.pod.path()).unwrap();
    let _server = Probe::world(mesh.world.world.path()).unwrap();
    let mesh_json = mesh_pod(NODE, "web", "uid-mesh", &mesh.ip.to_string());
    let plan = plan_for(&mesh_json, &mesh);
    // Programmed when the node was on iptables-legacy; the node's backend is now nft.
    redirect::apply(
        &plan,
        Some(mesh.world.pod.path()),
        BackendChoice::Fixed(Backend::IptablesLegacy),
    )
    .unwrap();
    assert_eq!(mesh.outbound(), Some(15001));
    let d = start_with(&env, &kube, Backend::Nft);
    kube.add(mesh_json);
    assert!(
        wait_until(REPAIR_BOUND, || checks(&d, "migrated") >= 1.0),
        "not migrated\n{}",
        d.log()
    );
    assert_eq!(drift(&plan, &mesh, Backend::Nft), Vec::<String>::new());
    let legacy = mesh
        .world
        .pod
        .exec_ok("iptables-legacy-save", &["-t", "nat"])
        .unwrap();
    assert!(!legacy.contains("ISTIO"), "legacy rules left:\n{legacy}");
    assert_eq!(mesh.outbound(), Some(15001), "outbound lands on Envoy");
    assert_eq!(mesh.inbound(), Some(15006), "inbound lands on Envoy");
    assert!(wait_until(T, || !kube.events().is_empty()), "no event");
    let ev = kube.events().pop().unwrap();
    assert_eq!(ev["reason"], "RedirectRulesMigrated", "{ev}");
    // Once migrated, the pod is fine: later checks are ok, nothing migrated twice.
    assert!(wait_until(T, || checks(&d, "ok") >= 1.0), "{}", d.log());
    assert_eq!(checks(&d, "migrated"), 1.0);
    assert_eq!(checks(&d, "failed"), 0.0, "{}", d.log());
}

#[test]
fn pods_the_plugin_skips_are_never_checked() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let running = RunningPod::new();
    let sentinel = RunningPod::new();
    let ip = running.ip.to_string();
    let mut host_network = mesh_pod(NODE, "h", "uid-h", &ip);
    host_network["spec"]["hostNetwork"] = json!(true);
    let mut excluded_init = mesh_pod(NODE, "i", "uid-i", &ip);
    excluded_init["spec"]["initContainers"] = json!([{"name": "istio-init"}]);
    let mut terminating = mesh_pod(NODE, "t", "uid-t", &ip);
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let mut finished = mesh_pod(NODE, "f", "uid-f", &ip);
    finished["status"]["phase"] = json!("Succeeded");
    let d = start(&env, &kube);
    for p in [
        plain_pod(NODE, "p", "uid-p", &ip),
        host_network,
        excluded_init,
        terminating,
        finished,
    ] {
        kube.add(p);
    }
    // A mesh pod after them: once it is repaired (it has no rules), the others were seen.
    kube.add(mesh_pod(NODE, "s", "uid-s", &sentinel.ip.to_string()));
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0),
        "sentinel not programmed\n{}",
        d.log()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.metric("istio_cni_reconcile_pods"), 1.0);
    assert_eq!(checks(&d, "failed"), 0.0, "{}", d.log());
    let rules = running
        .world
        .pod
        .exec_ok("nft", &["list", "ruleset"])
        .unwrap();
    assert!(rules.trim().is_empty(), "{rules}");
}

#[test]
fn a_pod_whose_namespace_is_not_found_is_retried_and_holds_up_no_one() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let sentinel = RunningPod::new();
    let d = start(&env, &kube);
    // No namespace holds this address (TEST-NET-3).
    kube.add(mesh_pod(NODE, "ghost", "uid-ghost", "203.0.113.77"));
    kube.add(mesh_pod(NODE, "s", "uid-s", &sentinel.ip.to_string()));
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0),
        "the sentinel waited for the ghost\n{}",
        d.log()
    );
    assert!(checks(&d, "failed") >= 1.0, "{}", d.log());
    let failed = checks(&d, "failed");
    // Retried with backoff (0.5 s, 1 s, ...), logged once.
    assert!(
        wait_until(T, || checks(&d, "failed") > failed),
        "{}",
        d.log()
    );
    assert_eq!(
        d.log()
            .matches("could not check the redirect rules; retrying with backoff")
            .count(),
        1,
        "{}",
        d.log()
    );
    assert_eq!(d.metric("istio_cni_reconcile_pods"), 2.0);
}

#[test]
fn reconcile_alone_opens_the_one_pod_watch() {
    let env = Env::new();
    let kube = FakeKube::start();
    let kc = kube.kubeconfig(env.tmp.path());
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_NODE_NAME", NODE),
        ("REPAIR_ENABLED", "false"),
    ]);
    assert!(d.wait_log("repair controller disabled", T), "{}", d.log());
    assert!(wait_until(T, || kube.watchers() > 0), "{}", d.log());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(kube.watch_requests(), 1, "{:?}", kube.requests());
    assert_eq!(kube.list_requests(), 1);
    assert!(d.wait_log("continuous reconcile", T));
}

#[test]
fn a_bad_interval_is_a_startup_error_naming_the_variable() {
    let env = Env::new();
    let out = env
        .command()
        .env("RECONCILE_INTERVAL", "5 minutes")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RECONCILE_INTERVAL") && err.contains("5 minutes"),
        "{err}"
    );
}

/// Benchmark (ignored by default; `cargo test -p install-cni --test reconcile -- --ignored
/// --nocapture`, add `--release` for the README's figures): the cost of one pod check
/// (namespace entry + read-back + compare, the daemon's own `reconcile::check::run`), with the
/// namespace known (the steady state) and found again through /proc, and of a repair.
#[test]
#[ignore]
fn bench_check_cost() {
    use guardian::reconcile::check::{self, Outcome, Target};
    testbed::require_root();
    let env = Env::new();
    let mesh = RunningPod::new();
    let proc = proc_root(&env);
    let pod = mesh_pod(NODE, "web", "uid-bench", &mesh.ip.to_string());
    let plan = plan_for(&pod, &mesh);
    let nft_backend = BackendChoice::Fixed(Backend::Nft);
    redirect::apply(&plan, Some(mesh.world.pod.path()), nft_backend).unwrap();
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let Decision::Sidecar(pc) = podplan::verdict(&pod, &sidecar_policy()).unwrap() else {
        panic!()
    };
    let fresh = Target {
        key: "shop/web".into(),
        ip: mesh.ip,
        uid: pod.metadata.uid.clone(),
        config: Box::new(pc.config),
        netns: None,
        lost: false,
    };
    let wait = guardian::reconcile::LOCK_WAIT;
    let measure = |n: usize, cached: bool, mut before: Box<dyn FnMut()>| -> Vec<Duration> {
        let mut t = fresh.clone();
        assert_eq!(check::run(&mut t, &proc, nft_backend, wait), Outcome::Ok);
        let mut lat: Vec<Duration> = (0..n)
            .map(|_| {
                before();
                let mut target = if cached { t.clone() } else { fresh.clone() };
                let t0 = Instant::now();
                let out = check::run(&mut target, &proc, nft_backend, wait);
                let took = t0.elapsed();
                assert!(
                    matches!(out, Outcome::Ok | Outcome::Repaired { .. }),
                    "{out:?}"
                );
                took
            })
            .collect();
        lat.sort();
        lat
    };
    let show = |what: &str, lat: &[Duration]| {
        println!(
            "{what}: n={} p50={:?} p99={:?} max={:?}",
            lat.len(),
            percentile(lat, 0.5),
            percentile(lat, 0.99),
            lat.last().unwrap()
        )
    };
    // Its two parts: the plan (enter the namespace, read its addresses, build) and CHECK
    // (lock, enter, dump our tables and routes, compare).
    let ns = mesh.world.pod.path();
    let timed = |n: usize, f: &dyn Fn()| -> Vec<Duration> {
        let mut lat: Vec<Duration> = (0..n)
            .map(|_| {
                let t0 = Instant::now();
                f();
                t0.elapsed()
            })
            .collect();
        lat.sort();
        lat
    };
    show(
        "  part: plan (addresses + Plan::build)",
        &timed(200, &|| {
            podplan::plan_in(&fresh.config, ns).unwrap();
        }),
    );
    show(
        "  part: CHECK (redirect::check_until)",
        &timed(200, &|| {
            let d = redirect::check_until(&plan, Some(ns), nft_backend, Instant::now() + wait);
            assert!(d.unwrap().is_empty());
        }),
    );
    let procs = std::fs::read_dir(&proc).unwrap().count();
    show(
        "check, namespace known (steady state)",
        &measure(200, true, Box::new(|| {})),
    );
    show(
        &format!("check, namespace found through /proc ({procs} processes)"),
        &measure(50, false, Box::new(|| {})),
    );
    show(
        "drift repaired (flushed chain: check + apply + read-back)",
        &measure(
            50,
            true,
            Box::new(|| {
                nft(&mesh, "flush chain inet istio-proxy-nat istio-output");
            }),
        ),
    );
}

/// Benchmark (ignored; see [`bench_check_cost`]): the daemon with 250 mesh pods (one namespace
/// holding 250 pod addresses, so each pod's check does the real work: find, enter, read back,
/// compare). RECONCILE_INTERVAL=25s (ten checks a second, 12x the default's rate) to measure
/// CPU per check; the figure at the default 5 min interval is extrapolated from it. RSS too.
#[test]
#[ignore]
fn bench_daemon_250_pods() {
    testbed::require_root();
    const PODS: usize = 250;
    let env = Env::new();
    let kube = FakeKube::start();
    let host = RunningPod::new();
    let net = std::process::id() % 250;
    let ips: Vec<String> = (1..=PODS).map(|i| format!("172.30.{net}.{i}")).collect();
    let lines: Vec<String> = ips
        .iter()
        .map(|ip| format!("addr add {ip}/32 dev eth0"))
        .collect();
    host.world.pod.ip_batch(&lines).unwrap();
    let kc = kube.kubeconfig(env.tmp.path());
    let proc = proc_root(&env);
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_NODE_NAME", NODE),
        ("REPAIR_PROC_ROOT", proc.to_str().unwrap()),
        ("REDIRECT_BACKEND", "nft"),
        ("RECONCILE_INTERVAL", "25s"),
    ]);
    assert!(wait_until(T, || kube.watchers() > 0), "{}", d.log());
    for (i, ip) in ips.iter().enumerate() {
        kube.add(mesh_pod(NODE, &format!("p{i}"), &format!("uid-{i}"), ip));
    }
    // The first check of each (new pods are checked at once): one repairs, the rest are ok.
    assert!(
        wait_until(Duration::from_secs(120), || checks(&d, "ok")
            + checks(&d, "repaired")
            >= PODS as f64),
        "{}",
        d.log()
    );
    let pid = d.pid();
    std::thread::sleep(Duration::from_secs(2));
    let (c0, n0, t0) = (cpu_s(pid), checks(&d, "ok"), Instant::now());
    std::thread::sleep(Duration::from_secs(30));
    let (cpu, n, wall) = (
        cpu_s(pid) - c0,
        checks(&d, "ok") - n0,
        t0.elapsed().as_secs_f64(),
    );
    let per_check_ms = cpu * 1000.0 / n;
    let default_rate = PODS as f64 / 300.0;
    println!(
        "250 pods, interval 25s: {n} checks in {wall:.1} s ({:.1}/s), daemon CPU {:.2}% of a core, {per_check_ms:.2} ms CPU per check",
        n / wall,
        cpu / wall * 100.0
    );
    println!(
        "extrapolated to the default 5m interval ({default_rate:.2} checks/s): {:.3}% of a core",
        per_check_ms * default_rate / 10.0
    );
    println!(
        "daemon RSS {} kB (peak {} kB); failed checks {}",
        status_kb(pid, "VmRSS:"),
        status_kb(pid, "VmHWM:"),
        checks(&d, "failed")
    );
    assert_eq!(checks(&d, "failed"), 0.0, "{}", d.log());
}

/// Claim 1 (never the wrong namespace), the stale-cache case: a mesh pod's sandbox dies, the
/// API has not said so yet (a slow watch, a relist pending), and its IP is already another
/// pod's. Searching /proc by that IP again would find the other pod and program the dead pod's
/// plan into it (for a pod outside the mesh: every connection sent to a port nobody serves).
/// A lost namespace is searched for again only after the pod's next update (kubelet reports a
/// recreated sandbox); until then the pod is a failed check, retried with backoff.
#[test]
fn a_dead_pods_ip_taken_by_another_pod_is_never_programmed() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let dead = RunningPod::new();
    let other = RunningPod::new();
    let ip = dead.ip;
    let d = start(&env, &kube);
    let web = kube.add(mesh_pod(NODE, "web", "uid-mesh", &ip.to_string()));
    // No rules yet: the first check programs them (and remembers the namespace).
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0),
        "{}",
        d.log()
    );
    let empty = nft(&other, "list ruleset");
    assert!(empty.trim().is_empty(), "{empty}");
    // The sandbox dies (its process and namespace gone); the API still lists the pod as
    // Running; the IP is handed to the other pod.
    drop(dead);
    other.add_ip(ip);
    let failed = checks(&d, "failed");
    never_programmed(
        &d,
        &other,
        failed,
        "the dead pod's plan was programmed into the pod that took its IP",
    );
    // Kubelet reports a recreated sandbox (a pod update): the namespace holding the IP is
    // searched for again and programmed.
    let mut update = web.clone();
    update["status"]["startTime"] = json!("2026-11-26T00:00:00Z");
    kube.modify(update);
    assert!(
        wait_until(T, || checks(&d, "repaired") == 2.0),
        "not found again after the pod's update\n{}",
        d.log()
    );
    assert!(nft(&other, "list ruleset").contains("istio"));
}

/// Claim 1, PID reuse: the dead pod's cached `<proc>/<pid>/ns/net` names another process now
/// (its PID reused), in another pod's namespace that also holds the dead pod's IP. The path
/// proves nothing: the namespace it reaches must be the one found first ((dev, inode)).
#[test]
fn a_reused_pid_in_another_pods_namespace_is_not_the_pod() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let dead = RunningPod::new();
    let other = RunningPod::new();
    let ip = dead.ip;
    let d = start(&env, &kube);
    kube.add(mesh_pod(NODE, "web", "uid-mesh", &ip.to_string()));
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0),
        "{}",
        d.log()
    );
    // The other pod takes the IP, the dead pod's PID comes back as a process of the other
    // pod (its /proc entry swapped in one rename), and the dead pod's process exits.
    other.add_ip(ip);
    let proc = env.tmp.path().join("host-proc");
    let swap = proc.join("swap");
    std::os::unix::fs::symlink(format!("/proc/{}", other.pid()), &swap).unwrap();
    std::fs::rename(&swap, proc.join(dead.pid().to_string())).unwrap();
    drop(dead);
    let failed = checks(&d, "failed");
    never_programmed(
        &d,
        &other,
        failed,
        "the dead pod's plan was programmed through its reused PID",
    );
}

/// Claim 2, SIGKILL mid-migration: a migration to the node's backend killed between its
/// program and the removal of the old rules leaves both kinds, each complete. The nft rules
/// alone match the plan, so the check has to see the legacy ones too: the next pass finishes
/// the migration (never both kinds in one pod beyond one pass).
#[test]
fn an_interrupted_migration_left_with_both_kinds_is_finished_by_the_next_pass() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let mesh = RunningPod::new();
    let _sidecar = Probe::sidecar(mesh.world.pod.path()).unwrap();
    let _server = Probe::world(mesh.world.world.path()).unwrap();
    let mesh_json = mesh_pod(NODE, "web", "uid-mesh", &mesh.ip.to_string());
    let plan = plan_for(&mesh_json, &mesh);
    let legacy = || {
        mesh.world
            .pod
            .exec_ok("iptables-legacy-save", &["-t", "nat"])
            .unwrap()
    };
    redirect::apply(
        &plan,
        Some(mesh.world.pod.path()),
        BackendChoice::Fixed(Backend::IptablesLegacy),
    )
    .unwrap();
    mesh.world
        .pod
        .run(|| nft_backend::apply(&plan))
        .unwrap()
        .unwrap();
    assert!(legacy().contains("ISTIO"));
    let d = start_with(&env, &kube, Backend::Nft);
    kube.add(mesh_json);
    assert!(
        wait_until(REPAIR_BOUND, || !legacy().contains("ISTIO")),
        "both kinds left in the pod:\n{}\n{}\n{}",
        legacy(),
        nft(&mesh, "list ruleset"),
        d.log()
    );
    assert_eq!(drift(&plan, &mesh, Backend::Nft), Vec::<String>::new());
    assert!(
        wait_until(T, || checks(&d, "migrated") == 1.0),
        "{}",
        d.log()
    );
    assert_eq!(mesh.outbound(), Some(15001), "outbound lands on Envoy");
    assert_eq!(mesh.inbound(), Some(15006), "inbound lands on Envoy");
}

/// Claim 3 (bounded work): a pod the watch flaps (an update every 10 ms) while its checks fail
/// (no namespace holds its IP). Each failed check searches all of /proc and enters every
/// namespace there, so an update must not cut the pod's backoff short.
#[test]
fn a_flapping_pod_whose_checks_fail_stays_on_its_backoff() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let sentinel = RunningPod::new();
    let d = start(&env, &kube);
    let ghost = kube.add(mesh_pod(NODE, "ghost", "uid-ghost", "203.0.113.78"));
    kube.add(mesh_pod(NODE, "s", "uid-s", &sentinel.ip.to_string()));
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0
            && checks(&d, "failed") >= 1.0),
        "{}",
        d.log()
    );
    let before = checks(&d, "failed");
    let t0 = Instant::now();
    let mut updates = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        let mut p = ghost.clone();
        p["status"]["startTime"] = json!(format!("2026-11-26T00:{:02}:00Z", updates % 60));
        kube.modify(p);
        updates += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let searches = checks(&d, "failed") - before;
    eprintln!("{updates} updates in 3 s: {searches} failed checks");
    // Backoff from the first failure: 0.5 s, 1 s, 2 s, ... at most 4 retries in 3 s.
    assert!(
        searches <= 5.0,
        "{searches} failed checks (each a /proc search) for {updates} updates in 3 s"
    );
    assert_eq!(checks(&d, "repaired"), 1.0, "{}", d.log());
}

/// Claim 3 (an API server that hangs): the Event written for a repair is never answered. The
/// checks of the other pods must not wait for it (the client's read timeout is the watch's,
/// 300 s).
#[test]
fn a_hung_event_write_holds_up_no_repair() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let a = RunningPod::new();
    let b = RunningPod::new();
    let d = start(&env, &kube);
    kube.hang_next_event_posts(1000);
    // Neither pod has rules: each is repaired, each repair writes an Event that hangs.
    kube.add(mesh_pod(NODE, "a", "uid-a", &a.ip.to_string()));
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0
            && !kube.events().is_empty()),
        "{}",
        d.log()
    );
    let t0 = Instant::now();
    kube.add(mesh_pod(NODE, "b", "uid-b", &b.ip.to_string()));
    assert!(
        wait_until(REPAIR_BOUND, || checks(&d, "repaired") == 2.0),
        "the second pod waited for the first one's hung Event\n{}",
        d.log()
    );
    eprintln!("second pod repaired {:?} after its ADDED", t0.elapsed());
    assert!(wait_until(T, || kube.events().len() == 2), "{}", d.log());
}

/// Claim 3 (bounded memory under a hung API server): Event writes waiting for an answer are
/// capped (16); the repairs beyond drop their Event (logged) instead of piling up tasks and
/// connections.
#[test]
fn hung_event_writes_are_capped() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let pods: Vec<RunningPod> = (0..20).map(|_| RunningPod::new()).collect();
    let d = start(&env, &kube);
    kube.hang_next_event_posts(1000);
    for (i, p) in pods.iter().enumerate() {
        kube.add(mesh_pod(
            NODE,
            &format!("p{i}"),
            &format!("uid-{i}"),
            &p.ip.to_string(),
        ));
    }
    assert!(
        wait_until(T, || checks(&d, "repaired") == 20.0),
        "{}",
        d.log()
    );
    assert!(d.wait_log("event not written", T), "{}", d.log());
    // The 16 in flight are counted when spawned; their POSTs reach the server a little later.
    assert!(wait_until(T, || kube.events().len() >= 16), "{}", d.log());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(kube.events().len(), 16, "{}", d.log());
}

/// The reconciler's FIRST search for a pod's namespace (after a daemon restart, or a pod never
/// found before) tells pods apart by their processes' cgroups, as Istio's agent does: a
/// namespace holding the pod IP whose processes kubelet put in ANOTHER pod's cgroup is never
/// the pod's, and of two namespaces holding the IP the one in the pod's own cgroup is. Real
/// cgroups (`testbed::cgroup`), real `/proc/PID/cgroup`.
#[test]
fn a_namespace_in_another_pods_cgroup_is_never_programmed() {
    testbed::require_root();
    const WEB: &str = "0b7d9a4e-5f3c-4d21-9e8a-1c2b3d4e5f60";
    const OTHER: &str = "7f6e5d4c-3b2a-4190-8877-665544332211";
    const GHOST: &str = "a1b2c3d4-e5f6-4711-8899-aabbccddeeff";
    let env = Env::new();
    let kube = FakeKube::start();
    let (web, other) = (RunningPod::new(), RunningPod::new());
    let web_cg = testbed::cgroup::PodCgroup::new(WEB, "pause-web").unwrap();
    let other_cg = testbed::cgroup::PodCgroup::new(OTHER, "pause-other").unwrap();
    web_cg.add(web.pid()).unwrap();
    other_cg.add(other.pid()).unwrap();
    // The other pod's namespace holds web's IP too (a stale address, a misbehaving IPAM).
    other.add_ip(web.ip);
    let d = start(&env, &kube);
    kube.add(mesh_pod(NODE, "web", WEB, &web.ip.to_string()));
    assert!(
        wait_until(T, || checks(&d, "repaired") == 1.0),
        "the namespace in web's own cgroup was not picked\n{}",
        d.log()
    );
    assert!(!nft(&web, "list ruleset").trim().is_empty());
    // A pod the API lists Running with the other pod's IP, whose own sandbox is gone: the
    // namespace holding the IP belongs to the other pod and is never programmed.
    let failed = checks(&d, "failed");
    kube.add(mesh_pod(NODE, "ghost", GHOST, &other.ip.to_string()));
    assert!(
        d.wait_log(&format!("belong to pod {OTHER}"), T),
        "{}",
        d.log()
    );
    never_programmed(
        &d,
        &other,
        failed,
        "a pod's plan was programmed into another pod's namespace",
    );
    drop((web_cg, other_cg));
}
