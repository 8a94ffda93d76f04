//! End to end with the real CNI client: cnitool runs bridge + host-local, portmap, then
//! istio-cni in a node namespace; pods are namespaces; the Kubernetes API is a local server.
//! Needs root and the nft backend.

mod common;

use common::*;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use testbed::{ConnectSpec, Probe, TestNetns, connect, send_udp};

const APP_UID: u32 = 1000;

fn pod_ns() -> TestNetns {
    TestNetns::with_prefix("cnipod").unwrap()
}

#[track_caller]
fn assert_no_rules(pod: &TestNetns, why: &str) {
    let r = rules(pod);
    assert!(r.is_empty(), "{why}: expected no rules, found:\n{r}");
}

#[track_caller]
fn landed(out: &testbed::Outcome, port: u16, orig: Option<SocketAddr>) {
    assert_eq!(out.landed_port(), Some(port), "{out}");
    if orig.is_some() {
        assert_eq!(out.orig_dst(), orig, "{out}");
    }
}

#[test]
fn sidecar_pod_add_traffic_check_drift_del() {
    let node = Node::new(NodeOptions::default());
    node.api.put("default", "productpage", fixture("sidecar"));
    let pod = pod_ns();

    let add = node.add(&pod, "default", "productpage");
    add.assert_ok();
    let result = add.json();
    // The chain's result comes through istio-cni unchanged (bridge's interfaces and IPs).
    assert_eq!(result["cniVersion"], "1.0.0");
    assert!(
        result["interfaces"].as_array().unwrap().len() >= 2,
        "{result}"
    );
    assert!(
        result["ips"][0].get("version").is_none(),
        "1.0.0 has no ips[].version"
    );
    let ip = pod_ip(&result);
    let gw: IpAddr = GATEWAY.parse().unwrap();
    assert!(rules(&pod).contains("istio-proxy-nat"), "{}", rules(&pod));

    // Real connections land where Envoy listens.
    let _sidecar = Probe::sidecar(pod.path()).unwrap();
    let _world = Probe::world(node.ns.path()).unwrap();
    let p = pod.path();
    landed(
        &connect(p, &ConnectSpec::new(gw, 80).uid(APP_UID).gid(APP_UID)),
        15001,
        Some(SocketAddr::new(gw, 80)),
    );
    landed(
        &connect(node.ns.path(), &ConnectSpec::new(ip, 8080)),
        15006,
        Some(SocketAddr::new(ip, 8080)),
    );
    landed(
        &connect(p, &ConnectSpec::new(gw, 80).uid(1337).gid(1337)),
        80,
        None,
    );
    for port in [15020, 15021, 15090] {
        landed(
            &connect(node.ns.path(), &ConnectSpec::new(ip, port)),
            port,
            None,
        );
    }

    node.check(&pod, "default", "productpage").assert_ok();

    // The same ADD again (Multus, runtime retries): still one correct ruleset.
    let before = rules(&pod);
    let again = node.readd(&pod, "default", "productpage", &result);
    assert_eq!(again.assert_ok().json(), result);
    node.check(&pod, "default", "productpage").assert_ok();
    assert_eq!(rules(&pod), before);

    // Drift: a chain flushed by hand.
    pod.exec_ok(
        "nft",
        &["flush", "chain", "inet", "istio-proxy-nat", "istio-output"],
    )
    .unwrap();
    let drift = node.check(&pod, "default", "productpage");
    node.assert_failed(
        &drift,
        102,
        &[
            "default/productpage",
            "differ",
            "missing rule",
            "istio-output",
        ],
    );

    // Every log line carries the pod and the container id, in the file too.
    let log = node.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 3, "{log}");
    for l in &lines {
        let cni = &l["spans"][0];
        assert_eq!(cni["pod_name"], "productpage", "{l}");
        assert_eq!(cni["pod_namespace"], "default", "{l}");
        let cid = cni["container_id"].as_str().unwrap();
        assert!(cid.starts_with("cnitool-") || cid == "readd", "{l}");
    }
    assert!(!add.stdout.contains("\"level\""), "logs on stdout");

    node.del(&pod, "default", "productpage").assert_ok();
    assert_no_rules(&pod, "after DEL");
    node.del(&pod, "default", "productpage").assert_ok();
}

#[test]
fn older_conflist_versions_get_their_result_shape() {
    let node = Node::new(NodeOptions {
        cni_version: "0.4.0",
        ..Default::default()
    });
    node.api.put("default", "web", fixture("sidecar"));
    let pod = pod_ns();
    let r = node.add(&pod, "default", "web");
    let result = r.assert_ok().json();
    assert_eq!(result["cniVersion"], "0.4.0");
    assert_eq!(result["ips"][0]["version"], "4", "{result}");
    node.check(&pod, "default", "web").assert_ok();
    node.del(&pod, "default", "web").assert_ok();
    assert_no_rules(&pod, "after DEL");
}

/// A primary conflist still at 0.1.0/0.2.0 (bridge and host-local speak both): the chain's
/// 0.2.0 result (`ip4`, no `ips`) is read and passed on in the configuration's version, as
/// Istio does through libcni's converters; CHECK is refused by the client, as for Istio.
#[test]
fn pre_0_3_conflists_are_chained_with_their_result_shape() {
    for version in ["0.2.0", "0.1.0"] {
        let node = Node::new(NodeOptions {
            cni_version: version,
            ..Default::default()
        });
        node.api.put("default", "web", fixture("sidecar"));
        let pod = pod_ns();
        let result = node.add(&pod, "default", "web").assert_ok().json();
        assert_eq!(result["cniVersion"], version, "{result}");
        assert!(result.get("ips").is_none(), "{version}: {result}");
        let ip: IpAddr = result["ip4"]["ip"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(result["ip4"]["gateway"], GATEWAY, "{result}");
        assert!(
            rules(&pod).contains("istio-proxy-nat"),
            "{version}: {}",
            rules(&pod)
        );
        let _sidecar = Probe::sidecar(pod.path()).unwrap();
        landed(
            &connect(node.ns.path(), &ConnectSpec::new(ip, 8080)),
            15006,
            Some(SocketAddr::new(ip, 8080)),
        );
        assert!(
            !node.check(&pod, "default", "web").ok,
            "{version}: CHECK came in 0.4.0"
        );
        node.del(&pod, "default", "web").assert_ok();
        assert_no_rules(&pod, &format!("{version}: after DEL"));
        // No prevResult: a 0.1.0/0.2.0 result needs an address, so nothing can be printed
        // (libcni: "cannot convert"); refused before any rule is programmed.
        let netns = pod.path().to_str().unwrap();
        let env = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c0ffee"),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"),
        ];
        let r = node.plugin(&env, &node.plugin_stdin(None));
        r.assert_err(1, &["ip4 or ip6"]);
        assert_eq!(r.json()["cniVersion"], version);
        assert_no_rules(&pod, &format!("{version}: no prevResult"));
    }
}

#[test]
fn native_sidecar_with_dns_capture() {
    let node = Node::new(NodeOptions::default());
    node.api
        .put("default", "dns", fixture("native-sidecar-dns"));
    let pod = pod_ns();
    node.add(&pod, "default", "dns").assert_ok();
    let _sidecar = Probe::sidecar(pod.path()).unwrap();
    let _world = Probe::world(node.ns.path()).unwrap();
    let gw: IpAddr = GATEWAY.parse().unwrap();
    let out = send_udp(
        pod.path(),
        &ConnectSpec::new(gw, 53).uid(APP_UID).gid(APP_UID),
    );
    assert_eq!(out.landed_port(), Some(15053), "{out}");
    node.check(&pod, "default", "dns").assert_ok();
    node.del(&pod, "default", "dns").assert_ok();
}

#[test]
fn pass_through_pods_get_no_rules() {
    let node = Node::new(NodeOptions::default());
    for (name, f) in [
        ("plain", "no-sidecar"),
        ("optout", "inject-false"),
        ("legacy-init", "istio-init"),
        ("gateway", "gateway"),
    ] {
        node.api.put("default", name, fixture(f));
    }
    node.api.put("kube-system", "coredns", fixture("sidecar"));
    let cases = [
        ("default", "plain", "no sidecar"),
        ("default", "optout", "sidecar.istio.io/inject=false"),
        ("default", "legacy-init", "istio-init"),
        ("default", "gateway", "proxy router"),
        ("kube-system", "coredns", "excluded namespace"),
        ("", "", "no K8S_POD_* args"),
    ];
    for (ns, name, why) in cases {
        let pod = pod_ns();
        let add = node.add(&pod, ns, name);
        add.assert_ok();
        assert!(add.json()["ips"].is_array(), "{why}: prevResult passed on");
        assert_no_rules(&pod, why);
        node.check(&pod, ns, name).assert_ok();
        node.del(&pod, ns, name).assert_ok();
    }
    let requests = node.api.requests().len();
    // 4 lookups for ADD + 4 for CHECK; excluded and non-pod never reach the API.
    assert_eq!(requests, 8);
}

#[test]
fn self_bypass_needs_no_api_server() {
    let node = Node::new(NodeOptions {
        write_kubeconfig: false,
        ..Default::default()
    });
    let pod = pod_ns();
    node.add(&pod, "istio-system", "istio-cni-node-x7k2p")
        .assert_ok();
    assert_no_rules(&pod, "self-bypass");
    // Any other pod fails closed while the kubeconfig is missing.
    let other = pod_ns();
    let r = node.add(&other, "default", "web");
    node.assert_failed(&r, 103, &["default/web", "kubeconfig"]);
    assert_no_rules(&other, "kubeconfig missing");
}

#[test]
fn api_down_fails_within_the_budget_with_no_rules() {
    // attempts 3 × (timeout 300 ms + interval 100 ms) = 1.2 s at most.
    let opts = NodeOptions {
        attempts: 3,
        interval_ms: 100,
        timeout_ms: 300,
        ..Default::default()
    };
    let budget = Duration::from_millis(1200);
    // Nobody listening: connection refused on every attempt.
    let down = Node::new(NodeOptions {
        api_down: true,
        ..opts.clone()
    });
    let pod = pod_ns();
    let r = down.add(&pod, "default", "web");
    down.assert_failed(&r, 11, &["default/web", "3 attempt", "refused"]);
    assert!(
        r.elapsed < budget + Duration::from_secs(1),
        "{:?}",
        r.elapsed
    );
    assert_no_rules(&pod, "API down");

    // A server that accepts and never answers: each attempt ends at the per-request timeout.
    let hang = Node::new(opts.clone());
    hang.api.set_mode(ApiMode::Hang);
    hang.api.put("default", "web", fixture("sidecar"));
    let pod = pod_ns();
    let r = hang.add(&pod, "default", "web");
    hang.assert_failed(&r, 11, &["default/web", "no answer within"]);
    assert!(
        r.elapsed >= Duration::from_millis(900) && r.elapsed < budget + Duration::from_secs(1),
        "{:?}",
        r.elapsed
    );
    assert_eq!(hang.api.requests().len(), 3);
    assert_no_rules(&pod, "API hanging");

    // A pod the API does not know: same bounded failure, naming the pod. Its own node with a
    // roomier per-request timeout: under a loaded machine 300 ms can pass before the 404 comes,
    // and the failure would name the timeout instead (seen once at load 20).
    let up = Node::new(NodeOptions {
        timeout_ms: 2000,
        ..opts
    });
    let pod = pod_ns();
    let r = up.add(&pod, "default", "ghost");
    up.assert_failed(&r, 11, &["default/ghost", "404"]);
    assert_no_rules(&pod, "unknown pod");
}

#[test]
fn bad_inputs_give_cni_errors_and_no_rules() {
    let node = Node::new(NodeOptions::default());
    node.api.put("default", "bad", fixture("bad-annotation"));
    node.api.put("default", "web", fixture("sidecar"));

    // A bad annotation fails the ADD through the real client, naming annotation and value.
    let pod = pod_ns();
    let r = node.add(&pod, "default", "bad");
    node.assert_failed(
        &r,
        100,
        &[
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "not-a-cidr",
            "default/bad",
        ],
    );
    assert_no_rules(&pod, "bad annotation");

    // CNI_ARGS libcni accepts but Kubernetes cannot have sent (it would end up in the URL).
    let pod = pod_ns();
    let r = node.cnitool_args(
        "add",
        pod.path(),
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=../../nodes/x",
    );
    node.assert_failed(&r, 4, &["CNI_ARGS", "K8S_POD_NAME", "../../nodes/x"]);
    assert_no_rules(&pod, "bad CNI_ARGS");

    // The plugin alone: malformed stdin, unsupported version, missing env.
    let pod = pod_ns();
    let netns = pod.path().to_str().unwrap();
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"),
    ];
    let r = node.plugin(&env, b"{\"cniVersion\": \"1.0.0\", ");
    r.assert_err(6, &["not valid JSON"]);
    assert_eq!(r.json()["cniVersion"], "1.1.0");
    assert!(r.json()["msg"].is_string() && r.json()["details"].is_string());
    node.plugin(&env, br#"{"cniVersion":"0.5.0","type":"istio-cni"}"#)
        .assert_err(1, &["0.5.0"]);
    let stdin = node.plugin_stdin(None);
    node.plugin(&env[..3], &stdin)
        .assert_err(4, &["CNI_IFNAME"]);
    let mut bad_conf: Value = serde_json::from_slice(&stdin).unwrap();
    bad_conf["redirect_backend"] = "bpf".into();
    node.plugin(&env, &serde_json::to_vec(&bad_conf).unwrap())
        .assert_err(7, &["redirect_backend"]);
    node.plugin(&[("CNI_COMMAND", "FROB")], &stdin)
        .assert_err(4, &["FROB"]);
    // CNI_ARGS that is not KEY=VALUE (libcni itself refuses to send it; a runtime might).
    let mut garbage = env;
    garbage[4] = ("CNI_ARGS", "K8S_POD_NAMESPACE=default;garbage");
    node.plugin(&garbage, &stdin)
        .assert_err(4, &["CNI_ARGS", "garbage"]);
    assert_no_rules(&pod, "bad plugin input");

    // Without prevResult the plugin answers an empty result of the configuration's version.
    let r = node.plugin(&env[..4], &stdin);
    assert_eq!(
        r.assert_ok().json(),
        serde_json::json!({"cniVersion": "1.0.0", "dns": {}})
    );
    node.plugin(
        &[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c0ffee"),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
        ],
        &stdin,
    )
    .assert_ok();
    assert_no_rules(&pod, "after DEL");
}

#[test]
fn version_status_gc_and_del_of_a_vanished_pod() {
    let node = Node::new(NodeOptions {
        write_kubeconfig: false,
        // STATUS and GC came in 1.1.0.
        cni_version: "1.1.0",
        ..Default::default()
    });
    let stdin = node.plugin_stdin(None);
    let mut older: serde_json::Value = serde_json::from_slice(&stdin).unwrap();
    older["cniVersion"] = "1.0.0".into();
    let older = serde_json::to_vec(&older).unwrap();
    for command in ["STATUS", "GC"] {
        node.plugin(&[("CNI_COMMAND", command)], &older)
            .assert_err(1, &[command, "1.0.0"]);
    }
    let v = node.plugin(&[("CNI_COMMAND", "VERSION")], br#"{"cniVersion":"1.1.0"}"#);
    assert_eq!(
        v.assert_ok().json()["supportedVersions"],
        serde_json::json!([
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
        ])
    );
    node.plugin(&[("CNI_COMMAND", "STATUS")], &stdin)
        .assert_err(50, &["not ready", "istio-cni-kubeconfig"]);
    node.write_kubeconfig();
    // The kubeconfig alone is not enough: install-cni has not said the node is ready.
    node.plugin(&[("CNI_COMMAND", "STATUS")], &stdin)
        .assert_err(50, &["not ready", "istio-cni-ready"]);
    // What install-cni does when its install pass is valid (marker + liveness lock held).
    let run = node.run_dir();
    let lock = std::fs::File::create(cni_config::ready::lock_path(&run)).unwrap();
    cni_config::ready::lock_exclusive(&lock).unwrap();
    let marker = cni_config::ready::ReadyMarker::for_this_process(vec!["binaries".into()]);
    std::fs::write(
        cni_config::ready::marker_path(&run),
        serde_json::to_vec(&marker).unwrap(),
    )
    .unwrap();
    let s = node.plugin(&[("CNI_COMMAND", "STATUS")], &stdin);
    assert!(s.assert_ok().stdout.is_empty());
    drop(lock);
    node.plugin(&[("CNI_COMMAND", "STATUS")], &stdin)
        .assert_err(50, &["not ready", "no longer running"]);
    node.plugin(&[("CNI_COMMAND", "GC")], &stdin).assert_ok();
    // DEL for a namespace that no longer exists, and for no namespace at all.
    let del = [
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "gone"),
        ("CNI_NETNS", "/var/run/netns/does-not-exist"),
        ("CNI_IFNAME", "eth0"),
    ];
    node.plugin(&del, &stdin).assert_ok();
    node.plugin(&del[..2], &stdin)
        .assert_err(4, &["CNI_IFNAME"]);
    node.plugin(&[del[0], del[1], del[3]], &stdin).assert_ok();
}

#[test]
fn fifty_pods_added_in_parallel_all_get_correct_rules() {
    let node = Node::new(NodeOptions::default());
    let pods: Vec<(TestNetns, String)> = (0..50)
        .map(|i| {
            let name = format!("web-{i}");
            node.api.put("default", &name, fixture("sidecar"));
            (pod_ns(), name)
        })
        .collect();
    // Create the bridge once so the parallel ADDs only race on what a node really races on.
    let first = pod_ns();
    node.api.put("default", "first", fixture("sidecar"));
    node.add(&first, "default", "first").assert_ok();

    std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|(pod, name)| s.spawn(|| (name.clone(), node.add(pod, "default", name))))
            .collect();
        for h in handles {
            let (name, r) = h.join().unwrap();
            assert!(r.ok, "{name}: {r:#?}");
        }
    });
    let node = &node;
    std::thread::scope(|s| {
        for (pod, name) in &pods {
            s.spawn(move || {
                node.check(pod, "default", name).assert_ok();
                assert!(rules(pod).contains("istio-proxy-nat"), "{name}");
            });
        }
    });
    // Spot-check traffic on a few of them.
    let gw: IpAddr = GATEWAY.parse().unwrap();
    for (pod, name) in pods.iter().step_by(17) {
        let _sidecar = Probe::sidecar(pod.path()).unwrap();
        let out = connect(
            pod.path(),
            &ConnectSpec::new(gw, 80).uid(APP_UID).gid(APP_UID),
        );
        assert_eq!(out.landed_port(), Some(15001), "{name}: {out}");
    }
    for (pod, name) in &pods {
        node.del(pod, "default", name).assert_ok();
        assert_no_rules(pod, "after DEL");
    }
    node.del(&first, "default", "first").assert_ok();
}

#[test]
fn iptables_legacy_backend_end_to_end() {
    let node = Node::new(NodeOptions {
        backend: "iptables-legacy",
        ..Default::default()
    });
    node.api.put("default", "web", fixture("sidecar"));
    let pod = pod_ns();
    let result = node.add(&pod, "default", "web").assert_ok().json();
    let ip = pod_ip(&result);
    let r = rules(&pod);
    assert!(
        r.contains("-A ISTIO_OUTPUT") && !r.contains("istio-proxy-nat"),
        "{r}"
    );
    let _sidecar = Probe::sidecar(pod.path()).unwrap();
    let gw: IpAddr = GATEWAY.parse().unwrap();
    landed(
        &connect(
            pod.path(),
            &ConnectSpec::new(gw, 80).uid(APP_UID).gid(APP_UID),
        ),
        15001,
        Some(SocketAddr::new(gw, 80)),
    );
    landed(
        &connect(node.ns.path(), &ConnectSpec::new(ip, 8080)),
        15006,
        Some(SocketAddr::new(ip, 8080)),
    );
    node.check(&pod, "default", "web").assert_ok();
    // The same pod ADDed twice keeps one ruleset.
    node.readd(&pod, "default", "web", &result).assert_ok();
    assert_eq!(rules(&pod), r);
    pod.exec_ok("iptables-legacy", &["-t", "nat", "-F", "ISTIO_OUTPUT"])
        .unwrap();
    let drift = node.check(&pod, "default", "web");
    node.assert_failed(&drift, 102, &["default/web", "differ"]);
    node.del(&pod, "default", "web").assert_ok();
    assert_no_rules(&pod, "after DEL");
}

/// A pod with `hostUsers: false` (Istio release note 58750): its network namespace is owned by
/// a user namespace of its own. The plugin (root on the node) programs it on both backends,
/// real connections land on Envoy's ports, CHECK passes and DEL leaves nothing.
#[test]
fn a_pod_in_a_user_namespace_is_programmed_on_both_backends() {
    for backend in ["nft", "iptables-legacy"] {
        let node = Node::new(NodeOptions {
            backend,
            ..Default::default()
        });
        node.api.put("default", "web", fixture("sidecar"));
        let pod = TestNetns::in_user_namespace("cniuserns").unwrap();
        let result = node.add(&pod, "default", "web").assert_ok().json();
        let ip = pod_ip(&result);
        let r = rules(&pod);
        assert!(
            r.contains("istio-proxy-nat") || r.contains("-A ISTIO_OUTPUT"),
            "{backend}: {r}"
        );
        let _sidecar = Probe::sidecar(pod.path()).unwrap();
        let gw: IpAddr = GATEWAY.parse().unwrap();
        let out = connect(
            pod.path(),
            &ConnectSpec::new(gw, 80).uid(APP_UID).gid(APP_UID),
        );
        landed(&out, 15001, Some(SocketAddr::new(gw, 80)));
        landed(
            &connect(node.ns.path(), &ConnectSpec::new(ip, 8080)),
            15006,
            Some(SocketAddr::new(ip, 8080)),
        );
        node.check(&pod, "default", "web").assert_ok();
        node.del(&pod, "default", "web").assert_ok();
        assert_no_rules(&pod, backend);
    }
}
