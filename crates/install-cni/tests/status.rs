//! `istio-nftables status` end to end: the real daemon (its pod watch on a local API server)
//! serves the node's enrollment report on status.sock, and the real CLI prints it. A node with
//! a captured sidecar pod, one whose chain was flushed (drifted: reconcile is off, so it stays
//! so), one never programmed (missing) and a pod outside the mesh: the text, the JSON, `--pod`,
//! the exit statuses, `istio_cni_pods{mode,state}`; the pods repaired, the report and the gauge
//! say so. Then the daemon is stopped: the report is the kernel's alone (exit 3: cannot tell),
//! and a namespace with our rules on both backends is provably wrong (exit 1). With reconcile
//! on, a repair shows as the pod's last programmed time.

mod common;

use capture::Plan;
use common::kube_api::FakeKube;
use common::running::{RunningPod, mesh_pod, nft, plain_pod, plan_for, proc_root};
use common::*;
use redirect::{Backend, BackendChoice};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const NODE: &str = "node-s";

/// The CLI next to the daemon binary cargo built (`cargo build -p istio-nftables`).
fn cli() -> PathBuf {
    let built = Path::new(BIN).with_file_name("istio-nftables");
    testbed::node::product_binary("istio-nftables", built.to_str().unwrap())
}

fn status(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(cli())
        .arg("status")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn apply(plan: &Plan, p: &RunningPod) {
    redirect::apply(
        plan,
        Some(p.world.pod.path()),
        BackendChoice::Fixed(Backend::Nft),
    )
    .unwrap();
}

fn start(env: &Env, kube: &FakeKube, reconcile: bool) -> Daemon {
    let kc = kube.kubeconfig(env.tmp.path());
    let proc = proc_root(env);
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_NODE_NAME", NODE),
        ("REPAIR_PROC_ROOT", proc.to_str().unwrap()),
        ("REDIRECT_BACKEND", "nft"),
        (
            "RECONCILE_ENABLED",
            if reconcile { "true" } else { "false" },
        ),
        ("RECONCILE_INTERVAL", "1s"),
    ]);
    assert!(
        wait_until(T, || kube.watchers() > 0),
        "no pod watch\n{}",
        d.log()
    );
    d
}

/// The daemon's report once its cache holds `pods` pods (before, the CLI falls back).
fn report(run: &Path, pods: usize) -> Value {
    let run = run.to_str().unwrap();
    let mut last = (0, String::new(), String::new());
    let ok = wait_until(T, || {
        last = status(&["--json", "--run-dir", run]);
        serde_json::from_str::<Value>(&last.1)
            .is_ok_and(|r| r["source"] == "daemon" && r["pods"].as_array().unwrap().len() == pods)
    });
    assert!(ok, "no daemon report with {pods} pods: {last:?}");
    serde_json::from_str(&last.1).unwrap()
}

fn pod<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {r:#}"))
}

fn pods_metric(d: &Daemon, mode: &str, state: &str) -> f64 {
    d.metric(&format!(
        "istio_cni_pods{{mode=\"{mode}\",state=\"{state}\"}}"
    ))
}

/// A proc root holding only the host reference (this process as `1`) and these pods' processes:
/// the kernel-only report sees our namespaces, not those of tests running beside us.
fn narrow_proc(dir: &Path, pods: &[&RunningPod]) -> PathBuf {
    let root = dir.join("narrow-proc");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(format!("/proc/{}", std::process::id()), root.join("1")).unwrap();
    for p in pods {
        std::os::unix::fs::symlink(format!("/proc/{}", p.pid()), root.join(p.pid().to_string()))
            .unwrap();
    }
    root
}

#[test]
fn the_report_says_what_each_pod_should_get_and_has() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let (web, db, api, plain) = (
        RunningPod::new(),
        RunningPod::new(),
        RunningPod::new(),
        RunningPod::new(),
    );
    let web_json = mesh_pod(NODE, "web", "uid-web", &web.ip.to_string());
    let db_json = mesh_pod(NODE, "db", "uid-db", &db.ip.to_string());
    let api_json = mesh_pod(NODE, "api", "uid-api", &api.ip.to_string());
    let (web_plan, db_plan, api_plan) = (
        plan_for(&web_json, &web),
        plan_for(&db_json, &db),
        plan_for(&api_json, &api),
    );
    apply(&web_plan, &web);
    apply(&db_plan, &db);
    nft(&db, "flush chain inet istio-proxy-nat istio-output");
    let mut d = start(&env, &kube, false);
    kube.add(web_json);
    kube.add(db_json);
    kube.add(api_json);
    kube.add(plain_pod(NODE, "plain", "uid-plain", &plain.ip.to_string()));
    let run = env.run.to_str().unwrap();

    let r = report(&env.run, 4);
    assert_eq!(r["node"], NODE);
    assert_eq!(r["node_backend"], "nft");
    let web_r = pod(&r, "web");
    assert_eq!(
        (&web_r["mode"], &web_r["rules"], &web_r["state"]),
        (&json!("sidecar"), &json!("ok"), &json!("captured")),
        "{web_r:#}"
    );
    assert_eq!(web_r["backend"], "nft");
    assert_eq!(
        web_r["netns"].as_str().unwrap(),
        format!(
            "{}/{}/ns/net",
            env.tmp.path().join("host-proc").display(),
            web.pid()
        )
    );
    let db_r = pod(&r, "db");
    assert_eq!(
        (&db_r["rules"], &db_r["state"]),
        (&json!("drifted"), &json!("not_captured")),
        "{db_r:#}"
    );
    assert!(!db_r["drift"].as_array().unwrap().is_empty(), "{db_r:#}");
    let api_r = pod(&r, "api");
    assert_eq!(
        (&api_r["rules"], &api_r["state"]),
        (&json!("missing"), &json!("not_captured")),
        "{api_r:#}"
    );
    let plain_r = pod(&r, "plain");
    assert_eq!(
        (&plain_r["mode"], &plain_r["rules"], &plain_r["state"]),
        (&json!("none"), &json!("none"), &json!("skipped")),
        "{plain_r:#}"
    );
    assert!(
        plain_r["reason"].as_str().unwrap().contains("istio-proxy"),
        "{plain_r:#}"
    );
    assert_eq!(
        (
            r["summary"]["captured"].as_u64(),
            r["summary"]["not_captured"].as_u64()
        ),
        (Some(1), Some(2))
    );

    let (code, text, err) = status(&["--run-dir", run]);
    eprintln!("{text}");
    assert_eq!(code, 1, "{text}{err}");
    assert!(
        text.starts_with(&format!(
            "node {NODE} (daemon report; backend nft; ambient off): 4 pod(s)\n"
        )),
        "{text}"
    );
    for want in [
        "shop/web",
        "captured      ok",
        "shop/db",
        "NOT-CAPTURED  drifted",
        "NOT-CAPTURED  missing",
        "shop/plain",
        "none",
        "skipped",
        "    drift: ",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    assert!(text.ends_with("summary: 4 pod(s): 1 captured, 2 not captured, 0 pending (sidecar: 1 captured, 2 not_captured; none: 1 skipped) — pods that should be captured are NOT\n"), "{text}");
    let (code, text, _) = status(&["--run-dir", run, "--pod", "shop/web"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("0 pod(s)") || text.contains(": 1 pod(s)"),
        "{text}"
    );
    assert!(!text.contains("shop/db"), "{text}");
    let (code, text, _) = status(&["--run-dir", run, "--pod", "shop/db", "--json"]);
    assert_eq!(code, 1, "{text}");
    let (code, _, err) = status(&["--run-dir", run, "--pod", "shop/nope"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("shop/nope is not on node"), "{err}");
    let (code, _, err) = status(&["--run-dir", run, "--pod", "Shop/x"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        wait_until(T, || pods_metric(&d, "sidecar", "not_captured") == 2.0),
        "{}",
        d.get("/metrics").1
    );
    assert_eq!(pods_metric(&d, "sidecar", "captured"), 1.0);
    assert_eq!(pods_metric(&d, "none", "skipped"), 1.0);

    // Repaired by hand: every pod that should be captured is.
    apply(&db_plan, &db);
    apply(&api_plan, &api);
    let (code, text, err) = status(&["--run-dir", run]);
    assert_eq!(code, 0, "{text}{err}");
    assert!(
        text.ends_with("— every pod that should be captured is\n"),
        "{text}"
    );
    assert!(wait_until(T, || pods_metric(&d, "sidecar", "not_captured") == 0.0));
    assert_eq!(pods_metric(&d, "sidecar", "captured"), 3.0);

    // The daemon is down: the kernel alone.
    d.kill().unwrap();
    let narrow = narrow_proc(env.tmp.path(), &[&web, &db, &plain]);
    let empty = env.tmp.path().join("no-netns");
    std::fs::create_dir_all(&empty).unwrap();
    let kernel_args = [
        "--run-dir",
        run,
        "--proc-root",
        narrow.to_str().unwrap(),
        "--netns-dir",
        empty.to_str().unwrap(),
    ];
    let (code, text, err) = status(&kernel_args);
    eprintln!("{text}");
    assert_eq!(code, 3, "{text}{err}");
    assert!(err.contains("the node daemon did not answer"), "{err}");
    assert!(text.contains("kernel-only report"), "{text}");
    let web_ns = format!("{}/{}/ns/net", narrow.display(), web.pid());
    assert!(
        text.lines().any(|l| l.starts_with(&web_ns)
            && l.contains("unknown")
            && l.contains("present")
            && l.contains("nft")),
        "{text}"
    );
    let plain_ns = format!("{}/{}/ns/net", narrow.display(), plain.pid());
    assert!(
        text.lines()
            .any(|l| l.starts_with(&plain_ns) && l.contains(" none ")),
        "{text}"
    );
    assert!(
        text.contains(&format!("addresses: {}", web.ip)) || text.contains(&web.ip.to_string()),
        "{text}"
    );
    let (code, _, err) = status(&["--run-dir", run, "--pod", "shop/web"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("--pod needs the node daemon"), "{err}");
    // Our rules on both backends in one namespace: wrong whatever the pod should get.
    db.world
        .pod
        .exec_ok("iptables-legacy", &["-t", "nat", "-N", "ISTIO_OUTPUT"])
        .unwrap();
    let mut json_args = kernel_args.to_vec();
    json_args.push("--json");
    let (code, out, err) = status(&json_args);
    assert_eq!(code, 1, "{out}{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["source"], "kernel");
    let both: Vec<&Value> = r["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["rules"] == "both_backends")
        .collect();
    assert_eq!(both.len(), 1, "{r:#}");
    assert_eq!(both[0]["state"], "not_captured");
    assert_eq!(both[0]["backend"], "both");
}

#[test]
fn a_repair_is_the_pods_last_programmed_time() {
    testbed::require_root();
    let env = Env::new();
    let kube = FakeKube::start();
    let web = RunningPod::new();
    let web_json = mesh_pod(NODE, "web", "uid-web", &web.ip.to_string());
    let plan = plan_for(&web_json, &web);
    apply(&plan, &web);
    let d = start(&env, &kube, true);
    kube.add(web_json);
    let r = report(&env.run, 1);
    assert_eq!(pod(&r, "web")["state"], "captured", "{r:#}");
    nft(&web, "flush chain inet istio-proxy-nat istio-output");
    let run = env.run.to_str().unwrap();
    let mut last = Value::Null;
    let repaired = wait_until(T, || {
        let (_, out, _) = status(&["--json", "--run-dir", run, "--pod", "shop/web"]);
        last = serde_json::from_str(&out).unwrap_or(Value::Null);
        last["pods"][0]["last_programmed"].is_u64()
    });
    assert!(repaired, "{last:#}\n{}", d.log());
    let p = &last["pods"][0];
    assert_eq!(p["state"], "captured", "{p:#}");
    assert!(p["last_checked"].is_u64(), "{p:#}");
    let (code, text, _) = status(&["--run-dir", run]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("s ago"), "{text}");
    assert!(text.contains("    last checked: "), "{text}");
}
