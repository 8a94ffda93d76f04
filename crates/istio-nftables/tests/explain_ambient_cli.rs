//! `istio-nftables explain` for ambient pods as a command, and `--pod NAMESPACE/NAME`: the
//! pod's IP from a (fake) API server, its namespace found through a node /proc holding a real
//! sandbox process in the pod's namespace (as the node daemon finds running pods), for a
//! sidecar and an ambient pod; `--mark`; bad pods and flags exit 2 naming the argument and
//! the pod. `--host` on a node is tested with the node set up through `redirect`:
//! `integration/tests/explain_host_cli.rs`.

mod common;

use capture::{AmbientConfig, Config, Facts, Ipv6Mode, Plan};
use common::{CLI, text};
use redirect::{Backend, BackendChoice};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use testbed::ambient::{link_process, sleep_binary, spawn_in};
use testbed::kube_api::FakeKube;
use testbed::*;

fn explain(args: &[&str]) -> Output {
    Command::new(CLI.as_str())
        .arg("explain")
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// A running pod: its namespace pair and the sandbox process living in the pod's namespace.
struct RunningPod {
    w: PodWorld,
    sandbox: Child,
    _probes: Vec<Probe>,
}

impl Drop for RunningPod {
    fn drop(&mut self) {
        let _ = self.sandbox.kill();
        let _ = self.sandbox.wait();
    }
}

fn sandbox(ns: &TestNetns, proc_root: &Path) -> Child {
    let mut cmd = Command::new(sleep_binary().unwrap());
    cmd.arg("infinity")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = spawn_in(ns, cmd, None).unwrap();
    link_process(proc_root, &child.id().to_string(), child.id()).unwrap();
    child
}

fn pod_json(ns: &str, name: &str, ip: Option<String>, host_network: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"nodeName": "node-a", "hostNetwork": host_network,
                 "containers": [{"name": "app", "image": "app"}]},
        "status": match ip {
            Some(ip) => json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
            None => json!({"phase": "Pending"}),
        },
    })
}

/// The node: a fake API server, its /proc (`1` is this process, in the node's namespace).
struct Node {
    kube: FakeKube,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("proc")).unwrap();
        link_process(&dir.path().join("proc"), "1", std::process::id()).unwrap();
        Node {
            kube: FakeKube::start(),
            dir,
        }
    }
    fn proc_root(&self) -> String {
        self.dir.path().join("proc").display().to_string()
    }
    fn kubeconfig(&self) -> String {
        self.kube.kubeconfig(self.dir.path()).display().to_string()
    }
    /// Programs `plan` in a fresh pod with `backend`, starts its sandbox and listeners, and
    /// serves the pod `default/<name>`.
    fn pod(&self, name: &str, plan: &Plan, backend: Backend, listen: &[Listen]) -> RunningPod {
        let w = PodWorld::ipv4_only().unwrap();
        redirect::apply(plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
        let probes = vec![
            Probe::start(w.pod.path(), "pod", listen).unwrap(),
            Probe::world(w.world.path()).unwrap(),
        ];
        let sandbox = sandbox(&w.pod, self.dir.path().join("proc").as_path());
        self.kube
            .add(pod_json("default", name, Some(w.pod_v4.to_string()), false));
        RunningPod {
            w,
            sandbox,
            _probes: probes,
        }
    }
    /// `explain --pod default/<name> --kubeconfig … --proc-root … ARGS`.
    fn explain_pod(&self, pod: &str, args: &[&str]) -> Output {
        let (kc, pr) = (self.kubeconfig(), self.proc_root());
        let mut all = vec!["--pod", pod, "--kubeconfig", &kc, "--proc-root", &pr];
        all.extend_from_slice(args);
        explain(&all)
    }
}

const ZTUNNEL: [Listen; 5] = [
    Listen::tcp(15001),
    Listen::tproxy(15006),
    Listen::tcp(15008),
    Listen::udp(15053),
    Listen::tcp(8080),
];

fn outcome(v: &Value) -> (&str, String) {
    let o = &v["outcome"];
    let to = o["to"]
        .as_str()
        .map(str::to_string)
        .or_else(|| o["port"].as_u64().map(|p| p.to_string()))
        .unwrap_or_default();
    (o["kind"].as_str().unwrap_or(""), to)
}

#[test]
fn pods_are_found_by_name_and_explained_sidecar_and_ambient_alike() {
    require_root();
    let node = Node::new();
    let sidecar_plan = Plan::build(
        &Config {
            ipv6: Ipv6Mode::Off,
            ..Config::cni_default()
        },
        &Facts::default(),
    )
    .unwrap();
    let side = node.pod(
        "web",
        &sidecar_plan,
        Backend::Nft,
        &[Listen::tcp(15001), Listen::tcp(15006)],
    );
    let ambient_plan = Plan::ambient(&AmbientConfig {
        redirect_dns: true,
        ..AmbientConfig::default()
    })
    .unwrap();
    let amb = node.pod("amb", &ambient_plan, Backend::Nft, &ZTUNNEL);
    let amb_legacy = node.pod(
        "amb-legacy",
        &ambient_plan,
        Backend::IptablesLegacy,
        &ZTUNNEL,
    );

    let world = |p: &RunningPod, port: u16| format!("{}:{port}", p.w.world_v4);
    let app = ["--uid", "1000", "--gid", "1000"];
    // Sidecar: outbound to Envoy's 15001, confirmed by the kernel.
    let d = world(&side, 80);
    let mut args = vec!["--dst", d.as_str(), "--trace", "--json"];
    args.extend_from_slice(&app);
    let o = node.explain_pod("default/web", &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_of(&o);
    assert_eq!(outcome(&v), ("redirected", "127.0.0.1:15001".into()), "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert!(
        v["steps"][0]["table"]
            .as_str()
            .unwrap()
            .starts_with("istio-proxy-"),
        "{v}"
    );

    // Ambient (nft): outbound to ztunnel's 15001 (kernel agrees), ztunnel's mark bypasses,
    // DNS to 15053, inbound to 15006, HBONE untouched.
    let d = world(&amb, 80);
    let mut args = vec!["--dst", d.as_str(), "--trace", "--json"];
    args.extend_from_slice(&app);
    let o = node.explain_pod("default/amb", &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_of(&o);
    assert_eq!(outcome(&v), ("redirected", "127.0.0.1:15001".into()), "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert_eq!(v["outcome"]["by"]["table"], "istio-ambient-nat", "{v}");

    let o = node.explain_pod("default/amb", &["--dst", &d, "--mark", "0x539", "--trace"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("mark 0x539"), "{t}");
    assert!(t.contains("leaves the pod for"), "{t}");
    assert!(t.contains("agree: yes"), "{t}");

    for pod in ["default/amb", "default/amb-legacy"] {
        let p = if pod.ends_with("legacy") {
            &amb_legacy
        } else {
            &amb
        };
        let dns = world(p, 53);
        let o = node.explain_pod(pod, &["--dst", &dns, "--protocol", "udp", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{pod}: {}", text(&o));
        assert_eq!(outcome(&json_of(&o)).1, "127.0.0.1:15053", "{pod}");
        let (pod_ip, src) = (p.w.pod_v4.to_string(), p.w.world_v4.to_string());
        for (port, want) in [("8080", "15006"), ("15008", "15008")] {
            let dst = format!("{pod_ip}:{port}");
            let o = node.explain_pod(
                pod,
                &[
                    "--direction",
                    "inbound",
                    "--dst",
                    &dst,
                    "--src",
                    &src,
                    "--json",
                ],
            );
            assert_eq!(o.status.code(), Some(0), "{pod}: {}", text(&o));
            let v = json_of(&o);
            let to = v["outcome"]["to"].as_str().unwrap_or_default().to_string();
            assert!(to.ends_with(&format!(":{want}")), "{pod} {port}: {v}");
        }
        let legacy = pod.ends_with("legacy");
        assert_eq!(
            json_of(&node.explain_pod(pod, &["--dst", &dns, "--protocol", "udp", "--json"]))["backend"],
            if legacy { "iptables-legacy" } else { "nft" }
        );
    }
}

#[test]
fn bad_pods_exit_2_naming_the_pod() {
    require_root();
    let node = Node::new();
    node.kube.add(pod_json("default", "pending", None, false));
    node.kube.add(pod_json(
        "default",
        "hostnet",
        Some("10.9.9.9".into()),
        true,
    ));
    node.kube.add(pod_json(
        "default",
        "elsewhere",
        Some("10.254.254.7".into()),
        false,
    ));
    let mut done = pod_json("default", "done", Some("10.254.254.8".into()), false);
    done["status"]["phase"] = "Succeeded".into();
    node.kube.add(done);
    node.kube.add(pod_json(
        "default",
        "web",
        Some("10.254.254.9".into()),
        false,
    ));
    let cases: [(&str, &[&str]); 8] = [
        ("default/nope", &["default/nope", "no such pod"]),
        ("default/done", &["default/done", "phase Succeeded"]),
        // Not a pod name: refused before any request (it would GET pods/web).
        (
            "default/web?x=1",
            &["--pod", "web?x=1", "not a valid pod name"],
        ),
        ("Default/web", &["--pod", "not a valid namespace name"]),
        ("nope", &["--pod", "NAMESPACE/NAME"]),
        ("default/pending", &["default/pending", "no IP", "Pending"]),
        ("default/hostnet", &["default/hostnet", "host network"]),
        (
            "default/elsewhere",
            &["default/elsewhere", "10.254.254.7", "running on this node"],
        ),
    ];
    for (pod, needles) in cases {
        let o = node.explain_pod(pod, &["--dst", "10.0.0.1:80"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{pod}: {t}");
        for n in needles {
            assert!(t.contains(n), "{pod}: expected {n:?} in {t}");
        }
        assert!(!t.contains("panicked"), "{t}");
    }
    // No way to the API server at all; no namespace at all; --pod with a namespace.
    let o = explain(&["--pod", "default/x", "--dst", "10.0.0.1:80"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--kubeconfig"), "{}", text(&o));
    let o = explain(&["--dst", "10.0.0.1:80"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--network-namespace"), "{}", text(&o));
    let o = explain(&[
        "--pod",
        "a/b",
        "--network-namespace",
        "/x",
        "--dst",
        "10.0.0.1:80",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
