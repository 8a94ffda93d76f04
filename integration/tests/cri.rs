//! The product under a real container runtime, end to end: Debian's containerd 1.6 (private
//! config, root, state and socket; see `integration::cri`) runs the install-cni image built by
//! `deploy/scripts/build-image.sh` with the DaemonSet's container spec from the rendered chart;
//! it becomes ready and installs the plugin into the node's layout; containerd then calls the
//! chain itself (bridge + host-local, portmap, istio-cni) for every RunPodSandbox, with its own
//! CNI_ARGS, netns paths and two DELs per sandbox (stop, remove).
//!
//! Each test: a sidecar pod captured (real connections land on 15001/15006, uid 1337 bypasses);
//! a plain pod and an excluded-namespace pod untouched; a bad annotation fails RunPodSandbox
//! naming the annotation and leaves no netns, lease or sandbox; 20 sandboxes at once all get
//! the same rules; containerd SIGKILLed and restarted keeps them and starts new ones; Stop +
//! Remove succeed and release every lease; StopContainer on install-cni uninstalls the plugin.
//! Once with the chart's backend (`auto`, nftables on this kernel), once with
//! `REDIRECT_BACKEND=iptables-legacy`. And on a legacy node with the full API: the daemon's
//! continuous reconcile repairs a pod's flushed rules from inside its container, with the
//! image's own iptables-legacy tools.
//!
//! Needs root, Debian's containerd, runc and buildah (`integration/scripts/install-deps.sh`).
//! The image: `$ISTIO_CNI_IMAGE` (an OCI archive; test.sh builds it) or built on the fly.

use integration::ambient::eventually;
use integration::cri::runtime_node::CRI_NODE_NAME;
use integration::cri::{RuntimeNode, Sandbox, has_our_rules, rules_at};
use integration::node::{CONFLIST, NodeOptions};
use integration::pods::{DemoPod, PodKind};
use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// Our own conflist (the chart's `istioOwnedCNIConfig`, on by default): `02-istio-cni.conflist`.
const OWNED_CONFLIST: &str = "02-istio-cni.conflist";

const CONCURRENT: usize = 20;

fn runtime_node(backend: Option<&str>) -> RuntimeNode {
    integration::require_root();
    let mut rn = RuntimeNode::new(&integration::cri::images::pause_binary()).unwrap();
    // info: the plugin logs every ADD and DEL (the chart's warn would not show the DELs).
    let mut env = vec![("PLUGIN_LOG_LEVEL", "info")];
    env.extend(backend.map(|b| ("REDIRECT_BACKEND", b)));
    rn.start_install_cni(&env).unwrap();
    rn
}

#[track_caller]
fn run_ok(rn: &RuntimeNode, pod: &DemoPod) -> Sandbox {
    let s = rn.run(pod).unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox {}/{}: {}\ncontainerd:\n{}",
            pod.namespace,
            pod.name,
            e.message(),
            rn.containerd.log_tail()
        )
    });
    assert!(s.net.ready, "{s:?}");
    s
}

#[track_caller]
fn assert_traffic(rn: &RuntimeNode, s: &Sandbox) {
    let bad = rn.traffic_mismatches(s);
    assert!(
        bad.is_empty(),
        "{:?} ({}):\n{}\nrules:\n{}",
        s.pod.kind,
        s.pod.name,
        bad.join("\n"),
        rules_at(s.netns())
    );
}

fn bad_annotation_pod() -> DemoPod {
    let mut pod = DemoPod::new(PodKind::Sidecar, "bad-annotation");
    pod.json["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeOutboundIPRanges"] =
        "10.96.0.0/12,not-a-cidr".into();
    pod
}

/// (command, message) of each plugin log line about `pod`; "programmed" lines name the backend.
fn plugin_events(log: &str, pod: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["spans"][0]["pod_name"] == pod)
        .map(|v| {
            let f = &v["fields"];
            let mut msg = f["message"].as_str().unwrap_or("").to_string();
            if let Some(b) = f["backend"].as_str() {
                msg = format!("{msg} ({b})");
            }
            let cmd = v["spans"][0]["command"].as_str().unwrap_or("");
            (cmd.to_string(), msg)
        })
        .collect()
}

fn scenario(backend: Option<&str>) {
    let mut rn = runtime_node(backend);
    let primary = rn.node.primary_conflist();

    // The containerized install-cni chained us in and installed binaries + kubeconfig, at the
    // paths the plugin (run by containerd on the host) reads. The chart's default
    // (istioOwnedCNIConfig): the primary's chain with istio-cni in a file of our own that sorts
    // first, which containerd loads (every RunPodSandbox below goes through it); the primary's
    // own file untouched.
    let owned = rn.node.net_dir.join(OWNED_CONFLIST);
    let ours: serde_json::Value = serde_json::from_slice(&fs::read(&owned).unwrap()).unwrap();
    assert_eq!(
        integration::install_fixtures::types(&ours),
        ["bridge", "portmap", "istio-cni"]
    );
    assert_eq!(rn.node.conflist_json().unwrap(), primary);
    for b in ["istio-cni", "istio-nftables"] {
        assert!(rn.node.bin_dir.join(b).is_file(), "{b} not installed");
    }
    let kubeconfig = fs::read_to_string(rn.node.run_dir.join("istio-cni-kubeconfig")).unwrap();
    assert!(
        kubeconfig.contains(&format!("127.0.0.1:{}", rn.node.api.port)),
        "{kubeconfig}"
    );

    // A sidecar pod: our rules, real connections redirected, uid 1337 bypasses.
    let sidecar = run_ok(&rn, &DemoPod::new(PodKind::Sidecar, "sidecar"));
    let sidecar_rules = rules_at(sidecar.netns());
    assert!(has_our_rules(&sidecar_rules), "{sidecar_rules}");
    if backend == Some("iptables-legacy") {
        assert!(sidecar_rules.contains("-A ISTIO_OUTPUT"), "{sidecar_rules}");
    }
    assert_traffic(&rn, &sidecar);
    assert!(
        rn.containerd
            .netns_mounts()
            .contains(&sidecar.netns().to_path_buf()),
        "the sandbox's netns is not one containerd mounted: {:?}",
        sidecar.net
    );

    // A plain pod and a sidecar pod in an excluded namespace: started, untouched.
    for kind in [PodKind::NoSidecar, PodKind::ExcludedNamespace] {
        let s = run_ok(
            &rn,
            &DemoPod::new(kind, &format!("untouched-{}", kind as u8)),
        );
        let r = rules_at(s.netns());
        assert!(!has_our_rules(&r), "{kind:?}:\n{r}");
        assert_traffic(&rn, &s);
        rn.stop_and_remove(&s).unwrap();
    }

    // A bad annotation: RunPodSandbox fails naming it; no netns, lease or sandbox is left.
    let leases_before = rn.leases();
    let netns_before = rn.containerd.netns_mounts().len();
    let err = rn.run(&bad_annotation_pod()).unwrap_err();
    for m in [
        "traffic.sidecar.istio.io/excludeOutboundIPRanges",
        "not-a-cidr",
    ] {
        assert!(
            err.message().contains(m),
            "{m:?} not in {:?}",
            err.message()
        );
    }
    assert_eq!(rn.leases(), leases_before, "a lease was left behind");
    assert_eq!(rn.containerd.netns_mounts().len(), netns_before);
    let pods = rn.cri.list_pods().unwrap();
    assert!(
        !pods.iter().any(|p| p
            .metadata
            .as_ref()
            .is_some_and(|m| m.name == "bad-annotation")),
        "{pods:?}"
    );

    // Stop + Remove: both DELs succeed, rules and lease gone.
    rn.stop_and_remove(&sidecar).unwrap();
    assert_eq!(rn.leases(), 0);
    // containerd called the plugin: ADD with the backend asked for, DEL on stop (with the
    // netns: rules removed) and DEL on remove (no netns), each one succeeded; no CHECK. This
    // node's API server answers pod GETs only, so install-cni's pod cache is empty and the
    // plugin's ADD falls back to its own GET (the fallback, through containerd).
    let log = rn.node.plugin_log();
    let backend_name = backend.unwrap_or("nft");
    assert_eq!(
        plugin_events(&log, "sidecar"),
        [
            (
                "ADD",
                "pod not from the node daemon; asking the API server".into()
            ),
            ("ADD", format!("redirect rules programmed ({backend_name})")),
            ("ADD", "command succeeded".into()),
            ("DEL", "redirect rules removed".into()),
            ("DEL", "command succeeded".into()),
            ("DEL", "no network namespace, nothing to remove".into()),
            ("DEL", "command succeeded".into()),
        ]
        .map(|(c, m)| (c.to_string(), m)),
        "{log}"
    );

    // 20 sandboxes at once: all ready, all with exactly the rules the first sidecar had.
    let pods: Vec<DemoPod> = (0..CONCURRENT)
        .map(|i| DemoPod::new(PodKind::Sidecar, &format!("many-{i}")))
        .collect();
    for p in &pods {
        rn.serve(p);
    }
    let configs: Vec<_> = pods
        .iter()
        .map(|p| integration::cri::pod_config(&p.namespace, &p.name))
        .collect();
    let mut many = Vec::new();
    for ((r, _), pod) in rn
        .cri
        .run_pods_concurrently(&configs)
        .into_iter()
        .zip(&pods)
    {
        let id = r.unwrap_or_else(|e| panic!("{}: {}", pod.name, e.message()));
        many.push(rn.sandbox(id, pod).unwrap());
    }
    let before: BTreeMap<String, String> = many
        .iter()
        .map(|s| (s.id.clone(), rules_at(s.netns())))
        .collect();
    for s in &many {
        assert_eq!(before[&s.id], sidecar_rules, "{}", s.pod.name);
    }
    assert_traffic(&rn, &many[CONCURRENT - 1]);

    // containerd killed (as a crash) and restarted: the sandboxes are still there with their
    // rules untouched, and a new pod is captured.
    rn.containerd.restart().unwrap();
    rn.cri = integration::cri::Cri::connect(&rn.containerd.socket).unwrap();
    for s in &many {
        let net = rn.cri.pod_net(&s.id).unwrap();
        assert!(net.ready, "{} not ready after the restart", s.pod.name);
        assert_eq!(rules_at(s.netns()), before[&s.id], "{}", s.pod.name);
    }
    let late = run_ok(&rn, &DemoPod::new(PodKind::Sidecar, "after-restart"));
    assert_eq!(rules_at(late.netns()), sidecar_rules);
    assert_traffic(&rn, &late);
    many.push(late);

    for s in &many {
        rn.stop_and_remove(s)
            .unwrap_or_else(|e| panic!("{}: {}", s.pod.name, e.message()));
    }
    assert_eq!(rn.leases(), 0, "leases left after Stop + Remove");

    // StopContainer: install-cni removes the plugin; the primary's config is as it was.
    rn.stop_install_cni().unwrap();
    let conflist: serde_json::Value =
        serde_json::from_slice(&fs::read(rn.node.net_dir.join(CONFLIST)).unwrap()).unwrap();
    assert_eq!(conflist, primary);
    assert!(!owned.exists(), "our own conflist left behind");
    for b in ["istio-cni", "istio-nftables"] {
        assert!(!rn.node.bin_dir.join(b).exists(), "{b} left behind");
    }
    assert!(!rn.node.run_dir.join("istio-cni-kubeconfig").exists());
}

#[test]
fn containerd_runs_install_cni_and_pods_with_the_charts_backend() {
    scenario(None);
}

#[test]
fn containerd_runs_install_cni_and_pods_with_iptables_legacy() {
    scenario(Some("iptables-legacy"));
}

/// The containerized daemon keeps an iptables-legacy node's pods right with the image's own
/// iptables-legacy tools (Debian's, `deploy/scripts/stage-legacy-tools.sh`; the chart's
/// NET_RAW): a sidecar pod's rules flushed by hand come back from its continuous reconcile
/// (full API: the daemon's pod cache sees the pod; a 1 s interval instead of the chart's 5m).
#[test]
fn containerd_runs_install_cni_whose_reconcile_repairs_a_legacy_pod_with_the_images_tools() {
    integration::require_root();
    let mut opts = NodeOptions::new(PathBuf::new());
    opts.full_api = true;
    let mut rn = RuntimeNode::with_node(&integration::cri::images::pause_binary(), opts).unwrap();
    let env = [
        ("REDIRECT_BACKEND", "iptables-legacy"),
        ("RECONCILE_INTERVAL", "1s"),
        ("LOG_LEVEL", "info"),
    ];
    rn.start_install_cni(&env).unwrap();
    // Scheduled on this node: the daemon's pod cache watches spec.nodeName.
    let uid = &integration::cri::pod_uid("default", "drifting");
    let pod = DemoPod::scheduled(
        PodKind::Sidecar,
        "drifting",
        "default",
        uid,
        CRI_NODE_NAME,
        false,
    );
    let s = run_ok(&rn, &pod);
    let want = rules_at(s.netns());
    assert!(want.contains("-A ISTIO_OUTPUT"), "{want}");
    // Running with its address, as kubelet reports it: the daemon can find its namespace.
    let kube = &rn.node.api;
    let ip = s.net.ip.expect("an IPv4 address");
    assert!(kube.set_status(&s.pod.namespace, &s.pod.name, "Running", &[ip]));

    let flushed = Command::new("nsenter")
        .arg(format!("--net={}", s.netns().display()))
        .args(["iptables-legacy", "-w", "-t", "nat", "-F"])
        .status()
        .unwrap();
    assert!(flushed.success());
    assert!(!rules_at(s.netns()).contains("-A ISTIO_"));
    let logs = || rn.install_cni_log();
    eventually("the daemon re-applied the flushed rules", logs, || {
        rules_at(s.netns()) == want
    });
    // The repair is logged after its read-back, which can finish after the rules are back.
    eventually("the daemon logged the repair", logs, || {
        let log = rn.install_cni_log();
        log.contains("redirect rules drifted from the plan; re-applied")
            && log.contains("pod=default/drifting")
    });
    assert_traffic(&rn, &s);
    rn.stop_and_remove(&s).unwrap();
}
