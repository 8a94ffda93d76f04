//! Readiness gating (issue 13, item 3) with the real binaries: the plugin's CNI STATUS follows
//! the daemon (not ready before its install is valid, ready after, not ready again after
//! SIGTERM and after SIGKILL), and the optional node taint removal against the local API server.

mod common;

use common::kube_api::FakeKube;
use common::*;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(15);
const KEY: &str = "cni.istio.io/not-ready";
const NODE: &str = "node-a";

/// The plugin binary next to the daemon's (`cargo build -p istio-cni` before the test).
fn plugin_bin() -> PathBuf {
    let p = bin().parent().unwrap().join("istio-cni");
    assert!(
        p.is_file(),
        "{} missing: run `cargo build -p istio-cni --bin istio-cni` first",
        p.display()
    );
    p
}

/// CNI STATUS of the plugin configured with `run` as its run dir: exit code and stdout.
fn status(run: &Path) -> (i32, String) {
    let conf = serde_json::json!({
        "cniVersion": "1.1.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": run, "plugin_log_level": "debug",
    });
    let mut child = Command::new(plugin_bin())
        .env_clear()
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// STATUS fails with CNI error 50 and a message containing `needle`.
fn assert_not_ready(run: &Path, needle: &str) {
    let (code, out) = status(run);
    assert_ne!(code, 0, "STATUS succeeded: {out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    assert_eq!(v["code"], 50, "{out}");
    assert!(v["msg"].as_str().unwrap().contains(needle), "{out}");
}

fn ready(run: &Path) -> bool {
    status(run).0 == 0
}

fn primary(env: &Env) -> PathBuf {
    let conflist = env.net.join("10-calico.conflist");
    fs::write(&conflist, golden("test-testdata/pre/calico.conflist")).unwrap();
    conflist
}

#[test]
fn plugin_status_follows_the_daemon_through_sigterm_and_sigkill() {
    let env = Env::new();
    let run = env.run.clone();
    let no_api = [("REPAIR_ENABLED", "false"), ("RECONCILE_ENABLED", "false")];
    assert_not_ready(&run, "istio-cni-kubeconfig");

    // Running, kubeconfig written, but no primary CNI config to chain into: not ready.
    let d = env.start(&no_api);
    assert!(wait_until(T, || env.kubeconfig().exists()));
    assert!(wait_until(T, || d.get("/readyz").0 == 503));
    assert_not_ready(&run, "istio-cni-ready");

    let conflist = primary(&env);
    d.wait_ready(T);
    assert!(wait_until(T, || ready(&run)), "{}", d.log());
    let marker: serde_json::Value =
        serde_json::from_slice(&fs::read(run.join("istio-cni-ready")).unwrap()).unwrap();
    assert_eq!(marker["pid"], d.pid());
    assert_eq!(
        marker["ready"],
        serde_json::json!(["binaries", "kubeconfig", "cni_config"])
    );

    // The install stops being valid: STATUS follows.
    fs::remove_file(&conflist).unwrap();
    assert!(wait_until(T, || !ready(&run)), "{}", d.log());
    assert_not_ready(&run, "istio-cni-ready");
    primary(&env);
    assert!(wait_until(T, || ready(&run)), "{}", d.log());

    // SIGTERM: the marker goes before the cleanup.
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert!(!run.join("istio-cni-ready").exists());
    assert!(!run.join("istio-cni-ready.lock").exists());
    assert_not_ready(&run, "istio-cni");

    // SIGKILL: nothing is cleaned up and the marker stays, but the lock died with the daemon.
    primary(&env);
    let mut d = env.start(&no_api);
    assert!(wait_until(T, || ready(&run)), "{}", d.log());
    d.kill().unwrap();
    assert!(run.join("istio-cni-ready").exists());
    assert_not_ready(&run, "no longer running");

    // A new daemon takes over the lock and rewrites the marker.
    let d = env.start(&no_api);
    assert!(wait_until(T, || ready(&run)), "{}", d.log());
    let marker: serde_json::Value =
        serde_json::from_slice(&fs::read(run.join("istio-cni-ready")).unwrap()).unwrap();
    assert_eq!(marker["pid"], d.pid());
}

fn start_with_taint(env: &Env, kube: &FakeKube, key: &str) -> Daemon {
    let kc = kube.kubeconfig(env.tmp.path());
    env.start(&[
        ("REPAIR_ENABLED", "false"),
        // Only the taint's node requests are asserted: no pod watch.
        ("RECONCILE_ENABLED", "false"),
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("KUBERNETES_NODE_NAME", NODE),
        ("NODE_TAINT_KEY", key),
    ])
}

fn patches(kube: &FakeKube) -> Vec<common::kube_api::Req> {
    kube.node_requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect()
}

#[test]
fn taint_is_removed_once_ready_and_other_taints_stay() {
    let kube = FakeKube::start();
    kube.put_node(
        NODE,
        &[
            ("node.kubernetes.io/not-ready", "NoSchedule"),
            (KEY, "NoSchedule"),
            ("dedicated", "NoExecute"),
        ],
    );
    kube.put_node("node-b", &[(KEY, "NoSchedule")]);
    let env = Env::new();
    let d = start_with_taint(&env, &kube, KEY);
    // Not ready yet (no primary CNI config): the taint stays.
    assert!(wait_until(T, || d.get("/readyz").0 == 503));
    assert!(
        kube.node_requests().is_empty(),
        "{:?}",
        kube.node_requests()
    );

    let conflist = primary(&env);
    d.wait_ready(T);
    let want = [
        "node.kubernetes.io/not-ready:NoSchedule",
        "dedicated:NoExecute",
    ];
    assert!(
        wait_until(T, || kube.node_taints(NODE) == want),
        "{:?}\n{}",
        kube.node_taints(NODE),
        d.log()
    );
    // Only our node, one PATCH, a merge patch guarded by the version read.
    assert_eq!(kube.node_taints("node-b"), [format!("{KEY}:NoSchedule")]);
    let p = patches(&kube);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, format!("/api/v1/nodes/{NODE}"));
    assert!(
        p[0].content_type.contains("merge-patch+json"),
        "{}",
        p[0].content_type
    );
    assert!(p[0].json()["metadata"]["resourceVersion"].is_string());
    assert!(d.wait_log("taint removed", T), "{}", d.log());

    // Once per transition: not ready, taint back (say, a node reboot), ready again.
    fs::remove_file(&conflist).unwrap();
    assert!(wait_until(T, || d.get("/readyz").0 == 503));
    kube.put_node(NODE, &[(KEY, "NoSchedule"), ("dedicated", "NoExecute")]);
    primary(&env);
    d.wait_ready(T);
    assert!(
        wait_until(T, || kube.node_taints(NODE) == ["dedicated:NoExecute"]),
        "{:?}\n{}",
        kube.node_taints(NODE),
        d.log()
    );
    assert_eq!(patches(&kube).len(), 2);
}

#[test]
fn taint_removal_retries_api_errors_and_conflicts() {
    let kube = FakeKube::start();
    kube.put_node(NODE, &[(KEY, "NoSchedule"), ("dedicated", "NoExecute")]);
    // Two GETs fail, one PATCH fails, then another writer races a GET (409 on the PATCH).
    kube.fail_next("GET", 2);
    kube.fail_next("PATCH", 1);
    let env = Env::new();
    primary(&env);
    let d = start_with_taint(&env, &kube, KEY);
    d.wait_ready(T);
    // Installed and ready while the API fails: the install loop does not wait for it.
    assert!(ready(&env.run));
    assert!(wait_until(T, || patches(&kube).len() == 1), "{}", d.log());
    kube.race_next_node_gets(1);
    assert!(
        wait_until(Duration::from_secs(30), || kube.node_taints(NODE)
            == ["dedicated:NoExecute"]),
        "{:?}\n{}",
        kube.node_taints(NODE),
        d.log()
    );
    // GET 500, GET 500, GET ok + PATCH 500, GET (raced) + PATCH 409, GET + PATCH ok.
    let methods: Vec<String> = kube
        .node_requests()
        .iter()
        .map(|r| r.method.clone())
        .collect();
    assert_eq!(
        methods,
        ["GET", "GET", "GET", "PATCH", "GET", "PATCH", "GET", "PATCH"],
        "{}",
        d.log()
    );
    assert!(d.wait_log("409", T), "{}", d.log());
}

#[test]
fn no_taint_key_means_no_node_requests() {
    let kube = FakeKube::start();
    kube.put_node(NODE, &[(KEY, "NoSchedule")]);
    let env = Env::new();
    primary(&env);
    let d = start_with_taint(&env, &kube, "");
    d.wait_ready(T);
    assert!(wait_until(T, || ready(&env.run)));
    // Readiness is published; give a (wrongly) started removal time to show up.
    std::thread::sleep(Duration::from_millis(500));
    assert!(kube.requests().is_empty(), "{:?}", kube.requests());
    assert_eq!(kube.node_taints(NODE), [format!("{KEY}:NoSchedule")]);
    assert!(!d.log().contains("taint"), "{}", d.log());
}

#[test]
fn bad_taint_key_is_a_startup_error() {
    let env = Env::new();
    let out = env
        .command()
        .env("NODE_TAINT_KEY", "not a key")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NODE_TAINT_KEY"), "{err}");
}
