//! The plugin's adversarial suite (issue 11): per class of hostile input, enough cases to
//! matter, through the real binary. Every case must end without a panic, with a CNI error JSON
//! on stdout that names what was wrong when it fails, and with the pod's namespace either
//! untouched or completely programmed; the node's own namespace is never programmed.
//! Each test prints a one-line summary (run with `-- --nocapture` to see the figures).

mod common;

use common::{ApiMode, Node, NodeOptions, Run, fixture, k8s_args, rules};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::TestNetns;

/// xorshift64*: reproducible cases without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What one class of cases found.
#[derive(Default)]
struct Tally {
    cases: usize,
    panics: Vec<String>,
    unnamed: Vec<String>,
}

impl Tally {
    /// One run: a panic is never fine; a failure must be a CNI error JSON whose message
    /// contains every one of `names` (nothing required when `names` is empty).
    fn judge(&mut self, case: &str, run: &Run, names: &[&str]) {
        self.cases += 1;
        let json: Option<Value> = serde_json::from_str(run.stdout.trim()).ok();
        if run.stderr.contains("panicked") || json.as_ref().is_some_and(|j| j["code"] == 110) {
            self.panics.push(format!("{case}: {run:?}"));
            return;
        }
        if run.ok {
            return;
        }
        let msg = json
            .as_ref()
            .and_then(|j| j["msg"].as_str())
            .map(str::to_string);
        match msg {
            Some(m) if names.iter().all(|n| m.contains(n)) => {}
            _ => self.unnamed.push(format!(
                "{case}: expected {names:?} in the error; stdout {:?}",
                truncate(&run.stdout)
            )),
        }
    }

    #[track_caller]
    fn finish(self, class: &str) {
        println!(
            "adversarial {class}: {} cases, {} panics, {} unnamed errors",
            self.cases,
            self.panics.len(),
            self.unnamed.len()
        );
        assert!(self.panics.is_empty(), "{:#?}", self.panics);
        assert!(self.unnamed.is_empty(), "{:#?}", self.unnamed);
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(300).collect()
}

/// A pod namespace with an address (so that a valid ADD really programs it).
fn pod_ns() -> TestNetns {
    let ns = TestNetns::with_prefix("adv").unwrap();
    ns.sh("ip link add eth0 type veth peer name peer0 && ip addr add 10.88.0.5/16 dev eth0 && ip link set eth0 up")
        .unwrap();
    ns
}

/// A node with a sidecar pod `default/web` and short lookup bounds.
fn node() -> Node {
    let node = Node::new(NodeOptions {
        attempts: 2,
        interval_ms: 100,
        timeout_ms: 1000,
        deadline_ms: 3000,
        ..Default::default()
    });
    node.api.put("default", "web", fixture("sidecar"));
    node
}

fn add_env(netns: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", "ADD".into()),
        ("CNI_CONTAINERID", "adv".into()),
        ("CNI_NETNS", netns.into()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_ARGS", k8s_args("default", "web")),
    ]
}

fn run(node: &Node, env: &[(&'static str, String)], stdin: &[u8]) -> Run {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    node.plugin(&env, stdin)
}

/// The pod namespace is untouched or exactly what the plan says (CHECK passes).
#[track_caller]
fn untouched_or_complete(node: &Node, pod: &TestNetns, why: &str) {
    if rules(pod).trim().is_empty() {
        return;
    }
    let mut env = add_env(pod.path().to_str().unwrap());
    env[0].1 = "CHECK".into();
    let r = run(node, &env, &node.plugin_stdin(None));
    assert!(
        r.ok,
        "{why}: half-programmed namespace: {r:#?}\n{}",
        rules(pod)
    );
}

/// The node's own namespace (where the plugin runs) keeps the rules it had.
#[track_caller]
fn node_untouched(node: &Node, before: &str, why: &str) {
    assert_eq!(
        rules(&node.ns),
        before,
        "{why}: the node namespace was programmed"
    );
}

#[test]
fn adversarial_stdin() {
    let node = node();
    let pod = pod_ns();
    let env = add_env(pod.path().to_str().unwrap());
    let valid = node.plugin_stdin(Some(json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": pod.path()}],
        "ips": [{"interface": 0, "address": "10.88.0.5/16", "gateway": "10.88.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {}
    })));
    let mut rng = Rng(0x1157_11ad_c0de);
    let mut tally = Tally::default();
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    // Every 3rd truncation point of the real configuration.
    for cut in (0..valid.len()).step_by(3) {
        inputs.push((format!("truncated at {cut}"), valid[..cut].to_vec()));
    }
    // Byte flips in the real configuration (some still parse: those must work or fail cleanly).
    for i in 0..150 {
        let mut v = valid.clone();
        for _ in 0..1 + i % 3 {
            let at = rng.below(v.len());
            v[at] = rng.next() as u8;
        }
        inputs.push((format!("flip #{i}"), v));
    }
    // Random bytes and random printable JSON-ish text.
    const ALPHABET: &[u8] = b"{}[]\":,0123456789.eE-+truefalsnl \\/u";
    for i in 0..60 {
        let len = rng.below(400);
        let v: Vec<u8> = if i % 2 == 0 {
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            (0..len)
                .map(|_| ALPHABET[rng.below(ALPHABET.len())])
                .collect()
        };
        inputs.push((format!("random #{i}"), v));
    }
    // Huge and deep.
    let mut huge: Value = serde_json::from_slice(&valid).unwrap();
    huge["padding"] = "x".repeat(8 << 20).into();
    inputs.push(("8 MiB string".into(), serde_json::to_vec(&huge).unwrap()));
    inputs.push(("deep arrays".into(), "[".repeat(100_000).into_bytes()));
    inputs.push(("deep objects".into(), "{\"a\":".repeat(50_000).into_bytes()));
    inputs.push(("empty".into(), Vec::new()));
    inputs.push(("NUL bytes".into(), vec![0; 1000]));
    let start = Instant::now();
    for (case, stdin) in &inputs {
        let r = run(&node, &env, stdin);
        // Whatever failed, the message must say it was the configuration on stdin or name the
        // field (parse errors of a mutated field name it; see adversarial_fields).
        let code = serde_json::from_str::<Value>(r.stdout.trim())
            .ok()
            .and_then(|j| j["code"].as_u64());
        // A flip that still parses may fail later for its own reason (e.g. a renamed key
        // falls back to the default run dir, which has no kubeconfig): any code but the
        // configuration ones is then a proper answer.
        let config_error = matches!(code, Some(1 | 6 | 7) | None);
        let named = r.ok
            || !config_error
            || r.stdout.contains("stdin")
            || r.stdout.contains("setting ")
            || r.stdout.contains("prevResult")
            || r.stdout.contains("cniVersion")
            || r.stdout.contains("cni_agent_run_dir")
            || r.stdout.contains("pod_lookup_")
            || r.stdout.contains("redirect_backend");
        tally.judge(case, &r, &[]);
        if !named {
            tally
                .unnamed
                .push(format!("{case}: {}", truncate(&r.stdout)));
        }
    }
    untouched_or_complete(&node, &pod, "stdin cases");
    println!(
        "adversarial stdin: {:?} for {} runs",
        start.elapsed(),
        inputs.len()
    );
    tally.finish("stdin");
}

/// Values of every JSON type but `keep`'s.
fn wrong_types(keep: &Value) -> Vec<Value> {
    let all = [
        json!(7),
        json!(-1.5),
        json!("text"),
        json!(["a", 1]),
        json!({"k": "v"}),
        Value::Null,
        json!(true),
    ];
    all.into_iter()
        .filter(|v| std::mem::discriminant(v) != std::mem::discriminant(keep))
        .collect()
}

#[test]
fn adversarial_fields() {
    let node = node();
    let pod = pod_ns();
    let env = add_env(pod.path().to_str().unwrap());
    let base: Value = serde_json::from_slice(&node.plugin_stdin(None)).unwrap();
    let mut tally = Tally::default();
    // Every field of our settings object (name and type are the runtime's: it found us by them).
    let entry = cni_config::PluginSettings::default().to_plugin_entry();
    let mut keys: Vec<String> = entry
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "name" && *k != "type")
        .cloned()
        .collect();
    keys.push("cniVersion".into());
    for key in &keys {
        for bad in wrong_types(&entry.get(key).cloned().unwrap_or(json!("1.0.0"))) {
            let mut conf = base.clone();
            conf[key.as_str()] = bad.clone();
            let r = run(&node, &env, &serde_json::to_vec(&conf).unwrap());
            if r.ok {
                tally.unnamed.push(format!("{key} = {bad}: accepted"));
            }
            tally.judge(&format!("{key} = {bad}"), &r, &[key]);
        }
    }
    // Elements of the list field.
    for bad in [json!([1]), json!([null]), json!([["a"]]), json!([{}])] {
        let mut conf = base.clone();
        conf["exclude_namespaces"] = bad.clone();
        let r = run(&node, &env, &serde_json::to_vec(&conf).unwrap());
        tally.judge(
            &format!("exclude_namespaces = {bad}"),
            &r,
            &["exclude_namespaces[0]"],
        );
    }
    // prevResult broken at each level.
    let prev_cases = [
        (json!("x"), "prevResult"),
        (json!([1]), "prevResult"),
        (json!({"cniVersion": 1}), "prevResult.cniVersion"),
        (json!({"interfaces": "eth0"}), "prevResult.interfaces"),
        (json!({"interfaces": [7]}), "prevResult.interfaces[0]"),
        (
            json!({"interfaces": [{"name": 1}]}),
            "prevResult.interfaces[0].name",
        ),
        (
            json!({"interfaces": [{"mtu": "1500"}]}),
            "prevResult.interfaces[0].mtu",
        ),
        (json!({"ips": {}}), "prevResult.ips"),
        (json!({"ips": [null]}), "prevResult.ips[0]"),
        (
            json!({"ips": [{"address": []}]}),
            "prevResult.ips[0].address",
        ),
        (
            json!({"ips": [{"address": "10.0.0.1/8", "interface": "0"}]}),
            "prevResult.ips[0].interface",
        ),
        (
            json!({"ips": [{"address": "10.0.0.1/8", "gateway": 1}]}),
            "prevResult.ips[0].gateway",
        ),
        (json!({"routes": [{}]}), "prevResult.routes[0]"),
        (
            json!({"routes": [{"dst": "0.0.0.0/0", "gw": true}]}),
            "prevResult.routes[0].gw",
        ),
        (json!({"dns": []}), "prevResult.dns"),
        (
            json!({"dns": {"nameservers": [1]}}),
            "prevResult.dns.nameservers[0]",
        ),
        (json!({"dns": {"search": "a"}}), "prevResult.dns.search"),
    ];
    for (prev, path) in prev_cases {
        let mut conf = base.clone();
        conf["prevResult"] = prev.clone();
        let r = run(&node, &env, &serde_json::to_vec(&conf).unwrap());
        if r.ok {
            tally.unnamed.push(format!("prevResult {prev}: accepted"));
        }
        tally.judge(&format!("prevResult {prev}"), &r, &[path]);
    }
    assert_eq!(rules(&pod).trim(), "", "no case may program the pod");
    // Pod JSON with wrong types where the plugin reads it (served by the API).
    let pod_cases: [(&str, Value); 10] = [
        ("metadata.labels", json!({"metadata": {"labels": ["a"]}})),
        (
            "metadata.annotations.x",
            json!({"metadata": {"annotations": {"x": 1}}}),
        ),
        (
            "spec.containers",
            json!({"metadata": {}, "spec": {"containers": "istio-proxy"}}),
        ),
        (
            "spec.initContainers",
            json!({"metadata": {}, "spec": {"containers": [], "initContainers": {}}}),
        ),
        (
            "spec.containers[0].name",
            json!({"metadata": {}, "spec": {"containers": [{"name": 5}]}}),
        ),
        (
            "spec.containers[0].env",
            json!({"metadata": {}, "spec": {"containers": [{"name": "istio-proxy", "env": "A=1"}]}}),
        ),
        (
            "spec.containers[0].env[0].value",
            json!({"metadata": {}, "spec": {"containers": [{"name": "istio-proxy", "env": [{"name": "A", "value": 1}]}]}}),
        ),
        (
            "spec.containers[0].args",
            json!({"metadata": {}, "spec": {"containers": [{"name": "istio-proxy", "args": "proxy"}]}}),
        ),
        (
            "spec.containers[0].securityContext.runAsUser",
            json!({"metadata": {}, "spec": {"containers": [{"name": "istio-proxy", "securityContext": {"runAsUser": "1337"}}]}}),
        ),
        (
            "spec.containers[0].securityContext.runAsGroup",
            json!({"metadata": {}, "spec": {"containers": [{"name": "istio-proxy", "securityContext": {"runAsGroup": 1.5}}]}}),
        ),
    ];
    for (i, (path, bad)) in pod_cases.iter().enumerate() {
        let name = format!("bad-{i}");
        node.api.put("default", &name, bad.clone());
        let mut env = env.clone();
        env[4].1 = k8s_args("default", &name);
        let r = run(&node, &env, &node.plugin_stdin(None));
        if r.ok {
            tally.unnamed.push(format!("pod {path}: accepted"));
        }
        tally.judge(&format!("pod {path}"), &r, &[path]);
    }
    assert_eq!(rules(&pod).trim(), "", "no case may program the pod");
    tally.finish("fields");
}

#[test]
fn adversarial_env() {
    let node = node();
    let pod = pod_ns();
    let netns = pod.path().to_str().unwrap().to_string();
    let stdin = node.plugin_stdin(None);
    let mut tally = Tally::default();
    // Just under MAX_ARG_STRLEN (128 KiB for one "NAME=value" string).
    let huge = "a".repeat(120 * 1024);
    let junk = "\u{1}\u{7f} ;;==\t\n\u{e9}../../x=y;K8S_POD_NAME=";
    for command in ["ADD", "CHECK", "DEL"] {
        for var in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_ARGS",
            "CNI_PATH",
        ] {
            for (what, value) in [
                ("missing", None),
                ("empty", Some("")),
                ("huge", Some(huge.as_str())),
                ("junk", Some(junk)),
            ] {
                let mut env = add_env(&netns);
                env[0].1 = command.into();
                env.push(("CNI_PATH", "/opt/cni/bin".into()));
                env.retain(|(k, _)| *k != var);
                if let Some(v) = value {
                    env.push((leak(var), v.to_string()));
                }
                let r = run(&node, &env, &stdin);
                tally.judge(&format!("{command} {var} {what}"), &r, &[var]);
            }
        }
    }
    untouched_or_complete(&node, &pod, "env cases");
    tally.finish("env");
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

#[test]
fn adversarial_netns_targets() {
    let node = node();
    let before = rules(&node.ns);
    let dir = node.dir.join("targets");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("regular");
    std::fs::write(&file, "not a namespace").unwrap();
    std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
    let node_bind = node.ns.path().to_str().unwrap().to_string();
    let targets: Vec<(&str, String)> = vec![
        ("host", "/proc/1/ns/net".into()),
        ("own /proc/self", "/proc/self/ns/net".into()),
        ("own /proc/thread-self", "/proc/thread-self/ns/net".into()),
        ("own bind mount", node_bind),
        ("regular file", file.display().to_string()),
        ("directory", dir.display().to_string()),
        (
            "dangling symlink",
            dir.join("dangling").display().to_string(),
        ),
        ("missing", dir.join("missing").display().to_string()),
        ("mount namespace", "/proc/self/ns/mnt".into()),
        ("char device", "/dev/null".into()),
    ];
    let mut tally = Tally::default();
    for (what, target) in &targets {
        for command in ["ADD", "CHECK", "DEL"] {
            let mut env = add_env(target);
            env[0].1 = command.into();
            let r = run(&node, &env, &node.plugin_stdin(None));
            let case = format!("{command} {what}");
            if command == "DEL" {
                // DEL may succeed (nothing of ours can be there) or name the variable.
                tally.judge(&case, &r, &["CNI_NETNS"]);
            } else {
                if r.ok {
                    tally.unnamed.push(format!("{case}: accepted"));
                }
                tally.judge(&case, &r, &["CNI_NETNS", target]);
            }
            node_untouched(&node, &before, &case);
        }
    }
    tally.finish("netns targets");
}

/// The API server's answer must be the pod asked for: another pod's JSON at its path, or the
/// pod re-created under its name since the runtime made this sandbox (K8S_POD_UID differs), is
/// refused and nothing is programmed; a static pod's mirror (another UID by design) is not. Before, either was programmed from (or, for a non-mesh
/// pod's JSON, passed through).
#[test]
fn an_answer_that_is_not_the_sandboxs_pod_is_refused() {
    let node = node();
    let stdin = node.plugin_stdin(None);
    let mut other = fixture("sidecar");
    other["metadata"]["name"] = "x".into();
    other["metadata"]["namespace"] = "default".into();
    node.api
        .answer("/api/v1/namespaces/default/pods/web", "200 OK", other);
    let pod = pod_ns();
    let env = add_env(pod.path().to_str().unwrap());
    run(&node, &env, &stdin).assert_err(6, &["default/web", "default/x"]);
    assert_eq!(rules(&pod).trim(), "", "programmed from another pod");

    node.api.put("default", "web", fixture("sidecar"));
    let uid = fixture("sidecar")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let with_uid = |u: &str| {
        let mut env = add_env(pod.path().to_str().unwrap());
        env[4].1 = format!("{};K8S_POD_UID={u}", env[4].1);
        env
    };
    run(&node, &with_uid("an-older-pods-uid"), &stdin)
        .assert_err(11, &["an-older-pods-uid", &uid, "re-created"]);
    assert_eq!(rules(&pod).trim(), "", "programmed from the re-created pod");
    run(&node, &with_uid(&uid), &stdin).assert_ok();
    assert!(rules(&pod).contains("istio-proxy-nat"));
    // A static pod: kubelet makes its sandbox with the static pod's own UID, the API server
    // serves its mirror with another; the mirror is the sandbox's pod.
    let mut mirror = fixture("sidecar");
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "0123abcd".into();
    node.api.put("default", "web", mirror);
    let static_pod = pod_ns();
    let mut env = add_env(static_pod.path().to_str().unwrap());
    env[4].1 = format!("{};K8S_POD_UID=0123abcd", env[4].1);
    run(&node, &env, &stdin).assert_ok();
    assert!(rules(&static_pod).contains("istio-proxy-nat"));
    // The mirror of the manifest before it changed is not the new sandbox's pod.
    let changed = pod_ns();
    let mut env = add_env(changed.path().to_str().unwrap());
    env[4].1 = format!("{};K8S_POD_UID=4567ef01", env[4].1);
    run(&node, &env, &stdin).assert_err(11, &["4567ef01"]);
    assert_eq!(rules(&changed).trim(), "");
}

/// Bytes that are not UTF-8 in the environment (Linux allows them; Istio's Go plugin reads them
/// as bytes): in a CNI_ARGS key nobody reads the pod is still found and programmed (it passed
/// through with no rules before); in CNI_CONTAINERID or CNI_IFNAME they are refused by name.
#[test]
fn bytes_that_are_not_utf8_in_the_environment() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let node = node();
    let pod = pod_ns();
    let mut args = k8s_args("default", "web").into_bytes();
    args.extend_from_slice(b";X_RUNTIME_NOTE=caf\xe9");
    let env = [
        ("CNI_COMMAND", OsString::from("ADD")),
        ("CNI_CONTAINERID", "adv".into()),
        ("CNI_NETNS", pod.path().into()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_ARGS", OsString::from_vec(args)),
    ];
    node.plugin(&env, &node.plugin_stdin(None)).assert_ok();
    assert!(
        rules(&pod).contains("istio-proxy-nat"),
        "a sidecar pod was left without rules:\n{}",
        rules(&pod)
    );
    for (at, var) in [(1, "CNI_CONTAINERID"), (3, "CNI_IFNAME")] {
        let mut bad = env.clone();
        bad[at].1 = OsString::from_vec(b"eth\xe9".to_vec());
        node.plugin(&bad, &node.plugin_stdin(None))
            .assert_err(4, &[var, "UTF-8"]);
    }
}

/// CNI_NETNS naming a FIFO: refused at once by ADD and CHECK, nothing to remove for DEL (an
/// open for reading would wait for a writer for ever, holding the pod's set-up or teardown);
/// DEL of a path that cannot name
/// a namespace at all (a file as a directory, a name longer than the kernel takes) succeeds,
/// as for a namespace already gone.
#[test]
fn a_fifo_or_an_impossible_path_as_cni_netns_holds_nothing() {
    let node = node();
    let fifo = node.dir.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for command in ["ADD", "CHECK", "DEL"] {
        let mut env = add_env(fifo.to_str().unwrap());
        env[0].1 = command.into();
        // Unblocks a plugin that opened the FIFO, so that a failure is reported, not a hang.
        let (done, waiting) = std::sync::mpsc::channel::<()>();
        let fifo_path = fifo.clone();
        let unblock = std::thread::spawn(move || {
            if waiting.recv_timeout(Duration::from_secs(10)).is_err() {
                let _ = std::fs::OpenOptions::new().write(true).open(&fifo_path);
            }
        });
        let r = run(&node, &env, &node.plugin_stdin(None));
        let _ = done.send(());
        unblock.join().unwrap();
        assert!(
            r.elapsed < Duration::from_secs(5),
            "{command} waited {:?} on a FIFO",
            r.elapsed
        );
        if command == "DEL" {
            // Nothing of ours can be there: the teardown goes on.
            assert!(r.ok, "{r:#?}");
        } else {
            r.assert_err(4, &["CNI_NETNS", "a FIFO"]);
        }
    }
    let file = node.dir.join("regular");
    std::fs::write(&file, "x").unwrap();
    for impossible in [file.join("ns"), node.dir.join("n".repeat(300))] {
        let mut env = add_env(impossible.to_str().unwrap());
        env[0].1 = "DEL".into();
        let r = run(&node, &env, &node.plugin_stdin(None));
        assert!(r.ok, "DEL of {impossible:?}: {r:#?}");
    }
}

/// CNI_NETNS re-pointed at the node's own namespace while the pod is looked up, after the
/// plugin checked it (a symlink swapped; a bind mount replaced, as at /var/run/netns): the
/// rules land in the namespace that was checked, never in the node's.
#[test]
fn a_netns_path_re_pointed_during_the_lookup_never_programs_the_node() {
    let node = Node::new(NodeOptions {
        timeout_ms: 4000,
        deadline_ms: 8000,
        ..Default::default()
    });
    node.api.put("default", "web", fixture("sidecar"));
    // Answers 1.5 s after the GET: the swap happens inside that window.
    node.api.set_mode(ApiMode::Slow);
    let before = rules(&node.ns);
    let sh = |cmd: String| {
        let st = Command::new("sh").arg("-c").arg(&cmd).status().unwrap();
        assert!(st.success(), "{cmd}");
    };
    let link = node.dir.join("link");
    let mounted = node.dir.join("mounted");
    let (pod_path, node_path) = (
        |p: &TestNetns| p.path().display().to_string(),
        node.ns.path().display().to_string(),
    );
    type Swap<'a> = (
        &'a str,
        Box<dyn Fn(&TestNetns) + Sync + 'a>,
        Box<dyn Fn() + Sync + 'a>,
    );
    let swaps: [Swap; 2] = [
        (
            "symlink",
            Box::new(|pod| sh(format!("ln -sfn {} {}", pod_path(pod), link.display()))),
            Box::new(|| {
                sh(format!(
                    "ln -sfn {node_path} {0}.new && mv -T {0}.new {0}",
                    link.display()
                ))
            }),
        ),
        (
            "bind mount",
            Box::new(|pod| {
                sh(format!(
                    "touch {0} && mount --bind {1} {0}",
                    mounted.display(),
                    pod_path(pod)
                ))
            }),
            Box::new(|| {
                sh(format!(
                    "umount --lazy {0} && mount --bind {node_path} {0}",
                    mounted.display()
                ))
            }),
        ),
    ];
    for (what, point_at_pod, point_at_node) in &swaps {
        let pod = pod_ns();
        point_at_pod(&pod);
        let target = if *what == "symlink" { &link } else { &mounted };
        let asked = node.api.requests().len();
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                let deadline = Instant::now() + Duration::from_secs(10);
                while node.api.requests().len() == asked && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                point_at_node();
            });
            run(
                &node,
                &add_env(target.to_str().unwrap()),
                &node.plugin_stdin(None),
            )
        });
        node_untouched(&node, &before, what);
        assert!(r.ok, "{what}: {r:#?}");
        assert!(
            rules(&pod).contains("istio-proxy-nat"),
            "{what}: the checked namespace has no rules:\n{}",
            rules(&pod)
        );
        if *what == "bind mount" {
            sh(format!("umount --lazy {}", mounted.display()));
        }
    }
}

/// The plugin inside the node with /etc/resolv.conf pointing at a server that never answers
/// (a private mount namespace, so nothing else sees it).
fn run_with_hanging_dns(node: &Node, env: &[(&'static str, String)], stdin: &[u8]) -> Run {
    let resolv = node.dir.join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:5 attempts:3\n",
    )
    .unwrap();
    let start = Instant::now();
    let out = node
        .ns
        .run(|| {
            // Bound and silent: queries are neither answered nor refused.
            let _dns = std::net::UdpSocket::bind("127.0.0.1:53")?;
            let mut child = Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg("mount --bind \"$0\" /etc/resolv.conf && exec \"$1\"")
                .arg(&resolv)
                .arg(&node.opts.plugin)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            child.stdin.take().unwrap().write_all(stdin)?;
            child.wait_with_output()
        })
        .unwrap()
        .unwrap();
    Run::from_output(out, start.elapsed())
}

#[test]
fn adversarial_api_faults_fail_within_the_deadline() {
    const DEADLINE: Duration = Duration::from_millis(2500);
    let opts = NodeOptions {
        attempts: 3,
        interval_ms: 200,
        timeout_ms: 1000,
        deadline_ms: DEADLINE.as_millis() as u64,
        ..Default::default()
    };
    let node = Node::new(opts.clone());
    node.api.put("default", "web", fixture("sidecar"));
    let down = Node::new(NodeOptions {
        api_down: true,
        ..opts.clone()
    });
    let mut tally = Tally::default();
    let mut figures = Vec::new();
    // (mode, what the message must contain, CNI error code, retried?)
    let cases: [(ApiMode, &str, u64, bool); 11] = [
        (ApiMode::Status500, "500", 11, true),
        (ApiMode::Status404, "404", 11, true),
        (ApiMode::Status401, "401", 103, false),
        (ApiMode::Status403, "403", 103, false),
        (ApiMode::Status400, "400", 5, false),
        (ApiMode::Garbage, "top level", 6, false),
        (ApiMode::BadPod, "spec.containers", 6, false),
        (ApiMode::TrailingGarbage, "trailing characters", 6, false),
        (ApiMode::DuplicateKey, "twice in one object", 6, false),
        (ApiMode::Slow, "pod_lookup_timeout_ms", 11, true),
        (ApiMode::Hang, "pod_lookup_timeout_ms", 11, true),
    ];
    let mut measure = |tally: &mut Tally, what: String, r: Run, names: &[&str], code: u64| {
        figures.push(format!("{what} {:.2}s", r.elapsed.as_secs_f64()));
        if r.ok {
            tally.unnamed.push(format!("{what}: succeeded"));
        } else if serde_json::from_str::<Value>(r.stdout.trim())
            .ok()
            .map(|j| j["code"].clone())
            != Some(json!(code))
        {
            tally.unnamed.push(format!(
                "{what}: expected code {code}: {}",
                truncate(&r.stdout)
            ));
        }
        tally.judge(&what, &r, names);
        // A generous bound, only to catch a hang: the deadline plus process overhead.
        assert!(
            r.elapsed < DEADLINE + Duration::from_secs(3),
            "{what}: {:?} against a deadline of {DEADLINE:?}",
            r.elapsed
        );
    };
    for (mode, needle, code, retried) in cases {
        let pod = pod_ns();
        node.api.set_mode(mode);
        let before = node.api.requests().len();
        let r = run(
            &node,
            &add_env(pod.path().to_str().unwrap()),
            &node.plugin_stdin(None),
        );
        let requests = node.api.requests().len() - before;
        if !retried && requests != 1 {
            tally.unnamed.push(format!(
                "{mode:?}: a permanent error took {requests} requests"
            ));
        }
        measure(
            &mut tally,
            format!("{mode:?}"),
            r,
            &["default/web", needle],
            code,
        );
        assert_eq!(rules(&pod).trim(), "", "{mode:?}: no rules");
    }
    node.api.set_mode(ApiMode::Up);
    let pod = pod_ns();
    let r = run(
        &down,
        &add_env(pod.path().to_str().unwrap()),
        &down.plugin_stdin(None),
    );
    measure(
        &mut tally,
        "refused".into(),
        r,
        &["default/web", "refused"],
        11,
    );
    // DNS that never answers: the deadline covers name resolution too.
    node.write_kubeconfig_for(&format!(
        "http://kube-api.adversarial.test:{}",
        node.api.port
    ));
    let r = run_with_hanging_dns(
        &node,
        &add_env(pod.path().to_str().unwrap()),
        &node.plugin_stdin(None),
    );
    println!("hanging DNS error: {}", r.stdout.trim());
    measure(
        &mut tally,
        "hanging DNS".into(),
        r,
        &["default/web", "deadline"],
        11,
    );
    assert_eq!(rules(&pod).trim(), "");
    println!(
        "adversarial API time-to-fail (deadline {DEADLINE:?}): {}",
        figures.join(", ")
    );
    tally.finish("API faults");
}

/// The log is never appended through a symlink planted in the run dir (issue 11, item 8); the
/// refusal is reported on stderr and the command still works.
#[test]
fn symlinked_log_is_refused_and_the_command_still_works() {
    let node = node();
    let pod = pod_ns();
    let outside = node.dir.join("outside.txt");
    std::fs::write(&outside, "untouched").unwrap();
    let log = node.run_dir().join("istio-cni.log");
    let _ = std::fs::remove_file(&log);
    std::os::unix::fs::symlink(&outside, &log).unwrap();
    let r = run(
        &node,
        &add_env(pod.path().to_str().unwrap()),
        &node.plugin_stdin(None),
    );
    assert!(r.ok, "{r:#?}");
    assert!(
        r.stderr.contains("symlink"),
        "the refusal is reported: {r:#?}"
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
    assert!(std::fs::symlink_metadata(&log).unwrap().is_symlink());
    untouched_or_complete(&node, &pod, "symlinked log");
    assert!(!rules(&pod).trim().is_empty(), "the ADD programmed the pod");
}

/// An empty or relative `cni_agent_run_dir` is a configuration error naming the field, and
/// nothing is written into the runtime's working directory (issue 11, item 10).
#[test]
fn relative_run_dir_is_refused_and_nothing_lands_in_the_working_directory() {
    let node = node();
    let pod = pod_ns();
    let cwd = node.dir.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let mut tally = Tally::default();
    for dir in ["", ".", "run", "./var/run/istio-cni"] {
        let mut conf: Value = serde_json::from_slice(&node.plugin_stdin(None)).unwrap();
        conf["cni_agent_run_dir"] = dir.into();
        let env = add_env(pod.path().to_str().unwrap());
        let out = node
            .ns
            .run(|| {
                let mut child = Command::new(&node.opts.plugin)
                    .current_dir(&cwd)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()?;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(&serde_json::to_vec(&conf).unwrap())?;
                child.wait_with_output()
            })
            .unwrap()
            .unwrap();
        let r = Run::from_output(out, Duration::ZERO);
        assert!(!r.ok, "{dir:?} accepted: {r:#?}");
        tally.judge(
            &format!("cni_agent_run_dir {dir:?}"),
            &r,
            &["cni_agent_run_dir"],
        );
        assert_eq!(
            std::fs::read_dir(&cwd).unwrap().count(),
            0,
            "{dir:?}: something was written into the working directory"
        );
    }
    assert_eq!(rules(&pod).trim(), "");
    tally.finish("run dir");
}

/// What a hostile daemon does with one connection.
type Behaviour = fn(UnixStream);

/// A hostile "daemon" on `pods.sock`: each connection gets `behave` on its own thread.
fn hostile_lookup_socket(path: &std::path::Path, behave: Behaviour) {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || behave(s));
        }
    });
}

/// Reads the plugin's request head.
fn read_head(s: &mut UnixStream) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Claim: the plugin never waits on `pods.sock` past its share of the deadline, whatever the
/// daemon does (or whatever sits at the name); it asks the API server with the time left and
/// the ADD succeeds.
#[test]
fn a_hostile_pod_lookup_socket_never_holds_an_add_past_its_deadline() {
    const DEADLINE: Duration = Duration::from_millis(3000);
    let node = node();
    let socket = node.run_dir().join("pods.sock");
    let hang = |_: UnixStream| std::thread::sleep(Duration::from_secs(60));
    let cases: [(&str, Behaviour); 7] = [
        ("accepts, never reads", hang),
        ("reads, never answers", |mut s| {
            read_head(&mut s);
            std::thread::sleep(Duration::from_secs(60));
        }),
        ("answers a byte every 10 ms", |mut s| {
            read_head(&mut s);
            let a = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{{{}",
                " ".repeat(99_999)
            );
            for b in a.bytes() {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }),
        ("declares a 1 TB body", |mut s| {
            read_head(&mut s);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n{");
            std::thread::sleep(Duration::from_secs(60));
        }),
        ("an endless body", |mut s| {
            read_head(&mut s);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            while s.write_all(&[b' '; 65536]).is_ok() {}
        }),
        ("an endless chunked body", |mut s| {
            read_head(&mut s);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            while s.write_all(b"10000\r\n").is_ok() && s.write_all(&[b' '; 65536]).is_ok() {}
        }),
        ("garbage", |mut s| {
            read_head(&mut s);
            let _ = s.write_all(&[0xff; 100_000]);
        }),
    ];
    let mut figures = Vec::new();
    let mut add_with = |what: &str| {
        let pod = pod_ns();
        let before = node.api.requests().len();
        let r = run(
            &node,
            &add_env(pod.path().to_str().unwrap()),
            &node.plugin_stdin(None),
        );
        assert!(r.ok, "{what}: the ADD failed: {r:#?}");
        let asked = node.api.requests().len() - before;
        assert!(asked >= 1, "{what}: the API server was not asked");
        // A lookup held past the deadline fails the ADD (caught above); the slack is the
        // process's own start and apply on a loaded machine.
        assert!(
            r.elapsed < DEADLINE + Duration::from_secs(2),
            "{what}: the ADD took {:?}, the lookup deadline is {DEADLINE:?}",
            r.elapsed
        );
        assert!(!rules(&pod).trim().is_empty(), "{what}: no rules");
        figures.push(format!("{what} {:.2}s", r.elapsed.as_secs_f64()));
    };
    for (what, behave) in cases {
        hostile_lookup_socket(&socket, behave);
        add_with(what);
    }
    // A daemon that stopped accepting, its listen queue full.
    let _ = std::fs::remove_file(&socket);
    let _listener = UnixListener::bind(&socket).unwrap();
    let mut queued = Vec::new();
    let addr = socket2::SockAddr::unix(&socket).unwrap();
    loop {
        let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        if s.connect(&addr).is_err() {
            break;
        }
        queued.push(s);
    }
    add_with("full listen queue");
    drop(queued);
    // Not a listening stream socket at all: refused at connect, asked of the API at once.
    for what in [
        "a regular file",
        "a datagram socket",
        "a FIFO",
        "a directory",
    ] {
        let _ = std::fs::remove_file(&socket);
        let _kept = match what {
            "a regular file" => {
                std::fs::write(&socket, "not a socket").unwrap();
                None
            }
            "a datagram socket" => Some(std::os::unix::net::UnixDatagram::bind(&socket).unwrap()),
            "a FIFO" => {
                let c = std::ffi::CString::new(socket.to_str().unwrap()).unwrap();
                // SAFETY: a plain syscall on a valid C string.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                None
            }
            _ => {
                std::fs::create_dir(&socket).unwrap();
                None
            }
        };
        add_with(what);
        let _ = std::fs::remove_dir(&socket);
    }
    println!(
        "hostile pods.sock, ADD time (lookup deadline {DEADLINE:?}): {}",
        figures.join(", ")
    );
}

/// Claim: an ambient pod is decided by its own namespace's labels whichever source answers.
/// A node daemon whose answer carries another namespace fails the ADD, as the API server's
/// would (before, only the API path was checked, and the pod passed through without rules).
#[test]
fn a_lookup_answer_with_another_namespace_fails_the_add_on_the_daemon_path_too() {
    let node = node();
    hostile_lookup_socket(&node.run_dir().join("pods.sock"), |mut s| {
        read_head(&mut s);
        let mut pod = fixture("no-sidecar");
        pod["metadata"]["name"] = "web".into();
        let elsewhere =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}});
        let body = json!({"pod": pod, "namespace": elsewhere}).to_string();
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        let _ = s
            .write_all(head.as_bytes())
            .and_then(|()| s.write_all(body.as_bytes()));
    });
    let pod = pod_ns();
    let mut conf = node.plugin_conf();
    conf["cniVersion"] = node.opts.cni_version.into();
    conf["ambient_enabled"] = true.into();
    let before = node.api.requests().len();
    let r = run(
        &node,
        &add_env(pod.path().to_str().unwrap()),
        &serde_json::to_vec(&conf).unwrap(),
    );
    assert!(!r.ok, "a wrong namespace was taken: {r:#?}");
    assert!(
        r.stdout.contains("namespace is") && r.stdout.contains("elsewhere"),
        "{r:#?}"
    );
    let asked = node.api.requests().len() - before;
    assert_eq!(asked, 0, "the daemon answered: the API server is not asked");
    assert_eq!(rules(&pod).trim(), "");
}

/// Claim: the log relay never blocks or fails an ADD, whatever `log.sock` is; the plugin's
/// file keeps the lines.
#[test]
fn a_hostile_log_socket_never_holds_or_fails_an_add() {
    use std::os::unix::net::UnixDatagram;
    let node = node();
    let log_sock = node.run_dir().join("log.sock");
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    let mut figures = Vec::new();
    let cases = [
        "a full datagram queue",
        "a regular file",
        "a directory",
        "a dangling symlink",
        "a stream socket",
        "a seqpacket socket",
        "a FIFO",
    ];
    for (i, what) in cases.into_iter().enumerate() {
        let _ = std::fs::remove_file(&log_sock);
        let _ = std::fs::remove_dir(&log_sock);
        match i {
            0 => {
                let daemon = UnixDatagram::bind(&log_sock).unwrap();
                let filler = UnixDatagram::unbound().unwrap();
                filler.connect(&log_sock).unwrap();
                filler.set_nonblocking(true).unwrap();
                while filler.send(&[b'x'; 1024]).is_ok() {}
                keep.push(Box::new(daemon));
            }
            1 => std::fs::write(&log_sock, "not a socket").unwrap(),
            2 => std::fs::create_dir(&log_sock).unwrap(),
            3 => std::os::unix::fs::symlink(node.dir.join("nowhere"), &log_sock).unwrap(),
            4 => keep.push(Box::new(UnixListener::bind(&log_sock).unwrap())),
            5 => {
                let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None)
                    .unwrap();
                s.bind(&socket2::SockAddr::unix(&log_sock).unwrap())
                    .unwrap();
                s.listen(1).unwrap();
                keep.push(Box::new(s));
            }
            _ => {
                let c = std::ffi::CString::new(log_sock.to_str().unwrap()).unwrap();
                // SAFETY: a plain syscall on a valid C string.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
        }
        let pod = pod_ns();
        let mut env = add_env(pod.path().to_str().unwrap());
        env[1].1 = format!("log-{i}");
        let r = run(&node, &env, &node.plugin_stdin(None));
        assert!(r.ok, "{what}: the ADD failed: {r:#?}");
        assert!(
            r.elapsed < Duration::from_secs(2),
            "{what}: the ADD took {:?}",
            r.elapsed
        );
        assert!(!rules(&pod).trim().is_empty(), "{what}: no rules");
        assert!(
            node.log().contains(&format!("log-{i}")),
            "{what}: the file lost the ADD's lines"
        );
        if i == 1 {
            assert_eq!(std::fs::read_to_string(&log_sock).unwrap(), "not a socket");
        }
        figures.push(format!("{what} {:.3}s", r.elapsed.as_secs_f64()));
    }
    println!("hostile log.sock, ADD time: {}", figures.join(", "));
}

/// The plugin's log file is never a trap either: a FIFO planted at its name (no reader: an
/// open for writing would wait for one forever; a reader that never reads: writes would wait
/// once the pipe is full) is refused as not a regular file, and the ADD goes on at once.
#[test]
fn a_fifo_at_the_log_path_never_holds_an_add() {
    let node = node();
    let log = node.run_dir().join("istio-cni.log");
    let c_log = std::ffi::CString::new(log.to_str().unwrap()).unwrap();
    for reader in [false, true] {
        let what = if reader {
            "a FIFO with a reader that never reads"
        } else {
            "a FIFO without a reader"
        };
        let _ = std::fs::remove_file(&log);
        // SAFETY: plain syscalls on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c_log.as_ptr(), 0o600) }, 0);
        let _held = reader.then(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&log)
                .unwrap()
        });
        let pod = pod_ns();
        let env = add_env(pod.path().to_str().unwrap());
        let stdin = node.plugin_stdin(None);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| tx.send(run(&node, &env, &stdin)).unwrap());
            let r = rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| {
                    // Unblock the plugin before failing: drain the FIFO from here on.
                    let mut f = std::fs::File::open(&log).unwrap();
                    std::thread::spawn(move || std::io::copy(&mut f, &mut std::io::sink()));
                    panic!("{what}: the ADD was held for 10 s by the log file");
                });
            assert!(r.ok, "{what}: {r:#?}");
            assert!(
                r.elapsed < Duration::from_secs(2),
                "{what}: {:?}",
                r.elapsed
            );
            assert!(r.stderr.contains("not a regular file"), "{what}: {r:#?}");
            assert!(
                !rules(&pod).trim().is_empty(),
                "{what}: the ADD programmed the pod"
            );
        });
    }
}
