//! Istio's own chart runs our image: the pinned copy of Istio's `istio-cni` chart
//! (`deploy/testdata/istio/istio-cni-chart`, istio/istio 86c9f01) rendered with Istio's values
//! files for the default, ambient and openshift installs and this project's image
//! (`deploy/testdata/istio/rendered/*.yaml`: `deploy/scripts/render.sh` writes them with the
//! pinned helm, `deploy/scripts/check.sh` fails when one is not a fresh rendering, so these tests
//! need no helm), under Debian's containerd 1.6 over the CRI, as in `cri.rs` and
//! `cri_ambient.rs`.
//!
//! The DaemonSet's install-cni container runs exactly as rendered: Istio's `command`
//! (`install-cni`), its args (`--log_output_level=...`), its ConfigMap and env (`GOMEMLIMIT`
//! from `limits.memory`, `REPAIR_RUN_AS_DAEMON`, ... which our daemon does not read), its
//! securityContext, its readiness probe (`/readyz` on 8000), and its host
//! mounts under `/host` (`/host/opt/cni/bin`, `/host/etc/cni/net.d`, `/host/proc`,
//! `/host/var/run/netns` for ambient) plus `/var/run/istio-cni` and `/var/run/ztunnel`, in a POD
//! network (Istio's chart sets no `hostNetwork`). What the test node changes
//! (`integration::cri::daemonset`): host paths live in the node's temporary layout (the run dir
//! and ztunnel's socket dir too, so the daemon's defaults for them follow), the API server is
//! reached at the node's bridge address as a Service would be
//! (`RuntimeNode::serve_api_on_gateway`), `ALLOW_SWITCH_TO_HOST_NS` is off (this rig's
//! `/host/proc` is the machine's: its PID 1 is not in the test node; `NO_HOST_SWITCH`), and for
//! ambient containerd mounts sandbox namespaces
//! in `/var/run/netns`, its default, which the chart mounts at `/host/var/run/netns`: the agent
//! finds each pod's namespace there.
//!
//! * default: ready; the plugin and the CLI in the bin dir; chained into the primary conflist,
//!   which containerd loads; a sidecar pod's RunPodSandbox gets our rules (real connections
//!   redirected, uid 1337 bypasses), a plain pod none; SIGTERM uninstalls.
//! * ambient: ready only once ztunnel is connected (Istio #61717, kept on purpose); chained; an
//!   ambient pod and a pod of an ambient namespace are enrolled (in-pod rules, ztunnel's
//!   listeners in their netns, found by the agent under `/host/var/run/netns`), A -> B over
//!   HBONE; a plain pod left alone.
//! * openshift (Istio's openshift profile, ambient): `chained: false` -> a standalone
//!   `istio-cni.conf` in the multus dir (`/etc/cni/multus/net.d`), binaries in
//!   `/var/lib/cni/bin`, the primary conflist untouched; the plugin called with that file as
//!   multus calls a delegate (no prevResult, `net1`) enrolls an ambient pod containerd started.
//!
//! Needs root, Debian's containerd, runc and buildah, the CNI plugins and the ztunnel binary
//! (`integration/scripts/install-deps.sh`); under `CI=true` nothing skips.

use integration::cri::ambient::{AmbientRuntime, AmbientSandbox, Enroll, Plans, istio_tables};
use integration::cri::ambient::{not_served, served};
use integration::cri::images::{pause_binary, repo_root};
use integration::cri::{RuntimeNode, Sandbox, has_our_rules, rules_at};
use integration::node::NodeOptions;
use integration::pods::{DemoPod, PodKind};
use integration::ztunnel::ztunnel_binary;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Istio's chart rendered with `values/<set>.yaml` and our image.
fn rendered(set: &str) -> String {
    let path = repo_root().join(format!("deploy/testdata/istio/rendered/{set}.yaml"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What the rendering says, checked before running it: the image is ours, the command, args and
/// probe are Istio's, the pod is not on the host network.
#[track_caller]
fn assert_rendered_as_istio(rn: &RuntimeNode, log_level: &str) {
    let spec = &rn.install.as_ref().expect("install-cni started").spec;
    let c = &spec.container;
    assert_eq!(
        c.image.as_ref().map(|i| i.image.as_str()),
        Some("docker.io/istio-cni-rs/install-cni:0.1.0")
    );
    assert_eq!(c.command, ["install-cni"]);
    assert_eq!(c.args, [format!("--log_output_level={log_level}")]);
    assert_eq!(spec.readiness, ("/readyz".to_string(), 8000));
    assert!(
        !spec.host_network,
        "Istio's chart runs install-cni in a pod network"
    );
    let memlimit: u64 = spec.env["GOMEMLIMIT"].parse().expect("GOMEMLIMIT bytes");
    assert!(memlimit > 0);
    // The daemon's defaults for these are the test node's (the mounts moved).
    let root = rn.node.root.display().to_string();
    assert_eq!(
        spec.env["CNI_AGENT_RUN_DIR"],
        format!("{root}/var/run/istio-cni")
    );
    for k in [
        "MOUNTED_CNI_NET_DIR",
        "CNI_BIN_TARGET_DIRS",
        "REPAIR_PROC_ROOT",
    ] {
        assert!(
            !spec.env.contains_key(k),
            "{k} is Istio's default, not rendered"
        );
    }
    let mounts: Vec<&str> = c.mounts.iter().map(|m| m.container_path.as_str()).collect();
    for m in ["/host/opt/cni/bin", "/host/etc/cni/net.d"] {
        assert!(mounts.contains(&m), "{m} not mounted: {mounts:?}");
    }
}

#[track_caller]
fn run_ok(rn: &RuntimeNode, pod: &DemoPod) -> Sandbox {
    let s = rn.run(pod).unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox {}: {}\ninstall-cni:\n{}\ncontainerd:\n{}",
            pod.name,
            e.message(),
            rn.install_cni_log(),
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
        "{}:\n{}\nrules:\n{}",
        s.pod.name,
        bad.join("\n"),
        rules_at(s.netns())
    );
}

/// The plugin types the CRI plugin has loaded, once it has reloaded the conflist.
#[track_caller]
fn assert_cri_chain(rn: &RuntimeNode, want: &[&str]) {
    integration::ambient::eventually(
        "containerd loaded the conflist",
        || rn.cri.cni_config().unwrap_or_default(),
        || rn.cri.cni_chain().is_ok_and(|c| c == want),
    );
}

#[test]
fn istios_chart_default_values_run_our_image_which_chains_and_captures_sidecar_pods() {
    integration::require_root();
    let t0 = Instant::now();
    let opts = NodeOptions::new(PathBuf::new());
    let mut rn = RuntimeNode::with_runtime(&pause_binary(), opts, false).unwrap();
    rn.serve_api_on_gateway().unwrap();
    let primary = rn.node.primary_conflist();
    rn.start_install_cni_yaml(
        &rendered("default"),
        &integration::cri::ambient::NO_HOST_SWITCH,
        BTreeMap::new(),
    )
    .unwrap();
    assert_rendered_as_istio(&rn, "info");

    // Installed through /host/opt/cni/bin and /host/etc/cni/net.d; the kubeconfig in the run dir
    // names the API as the pod reached it.
    assert_eq!(rn.node.chain(), ["bridge", "portmap", "istio-cni"]);
    assert_cri_chain(&rn, &["bridge", "portmap", "istio-cni"]);
    for b in ["istio-cni", "istio-nftables"] {
        assert!(rn.node.bin_dir.join(b).is_file(), "{b} not installed");
    }
    let kubeconfig = std::fs::read_to_string(rn.node.run_dir.join("istio-cni-kubeconfig")).unwrap();
    let api = format!("{}:{}", rn.api_endpoint.0, rn.api_endpoint.1);
    assert!(kubeconfig.contains(&api), "{kubeconfig}");

    // A sidecar pod through containerd: our rules, real connections redirected; a plain pod
    // untouched.
    let sidecar = run_ok(&rn, &DemoPod::new(PodKind::Sidecar, "sidecar"));
    assert!(has_our_rules(&rules_at(sidecar.netns())));
    assert_traffic(&rn, &sidecar);
    let plain = run_ok(&rn, &DemoPod::new(PodKind::NoSidecar, "plain"));
    assert!(!has_our_rules(&rules_at(plain.netns())));
    assert_traffic(&rn, &plain);
    for s in [&sidecar, &plain] {
        rn.stop_and_remove(s).unwrap();
    }

    // SIGTERM (the pod deleted; no DaemonSet left): the plugin removed, the primary as it was.
    rn.stop_install_cni().unwrap();
    let conflist: Value =
        serde_json::from_slice(&std::fs::read(rn.node.conflist()).unwrap()).unwrap();
    assert_eq!(conflist, primary);
    assert!(!rn.node.bin_dir.join("istio-cni").exists());
    eprintln!(
        "cri_istio_chart default: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// Served by ztunnel with ambient's three tables in its netns.
#[track_caller]
fn assert_enrolled(n: &AmbientRuntime, s: &AmbientSandbox) {
    assert!(
        served(s.netns()),
        "{} not served\n{}",
        s.plan.name,
        n.logs()
    );
    let mut tables = istio_tables(s.netns());
    tables.sort();
    assert_eq!(
        tables,
        [
            "inet istio-ambient-mangle",
            "inet istio-ambient-nat",
            "inet istio-ambient-raw"
        ],
        "{}",
        s.plan.name
    );
}

/// Where the agent, in its pod network, put the host probe rule: the node's namespace or the
/// agent pod's own (the rig turns Istio's `ALLOW_SWITCH_TO_HOST_NS` off: `NO_HOST_SWITCH`).
fn host_rule_place(n: &AmbientRuntime) -> &'static str {
    let has = |ns: &Path| {
        integration::exec_at(ns, "nft", &["list", "tables"])
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("istio-ambient-nat"))
            .unwrap_or(false)
    };
    let i = n.rn.install.as_ref().expect("the agent runs");
    let agent_ns = n.rn.cri.pod_net(&i.sandbox_id).ok().and_then(|s| s.netns);
    if has(n.rn.node.ns.path()) {
        "the node's namespace"
    } else if agent_ns.as_deref().is_some_and(has) {
        "the agent pod's own namespace"
    } else {
        "nowhere"
    }
}

#[test]
fn istios_chart_ambient_values_run_our_image_which_enrolls_ambient_pods_through_host_mounts() {
    integration::require_root();
    let Some(zt_bin) = ztunnel_binary() else {
        return;
    };
    let t0 = Instant::now();
    let mut plans = Plans::new();
    // The agent's own pod is the first on the pod network (Istio's chart: no hostNetwork).
    plans.pod("istio-cni-node-test", Enroll::None);
    let a = plans.pod("a", Enroll::PodLabel);
    let b = plans.pod("b", Enroll::NamespaceLabel);
    let plain = plans.pod("plain", Enroll::None);
    let workloads = [a.clone(), b.clone()];
    let pause = pause_binary();
    // Ready only with ztunnel connected: start_rendered starts ztunnel first and waits for
    // /readyz (a 503 until then, Istio #61717).
    let n = AmbientRuntime::start_rendered(
        &pause,
        &zt_bin,
        plans.range(),
        &workloads,
        rendered("ambient"),
    )
    .unwrap();
    assert_rendered_as_istio(&n.rn, "default:info,cni-plugin:debug");
    let env = &n.rn.install.as_ref().unwrap().spec.env;
    let zds = n.rn.node.root.join("var/run/ztunnel/ztunnel.sock");
    assert_eq!(env["ZTUNNEL_UDS_ADDRESS"], zds.display().to_string());
    assert_eq!(env["AMBIENT_ENABLED"], "true");
    assert_eq!(n.rn.node.chain(), ["bridge", "portmap", "istio-cni"]);
    assert_cri_chain(&n.rn, &["bridge", "portmap", "istio-cni"]);

    let (sa, sb, sp) = (n.run_ok(&a), n.run_ok(&b), n.run_ok(&plain));
    for s in [&sa, &sb] {
        assert!(s.netns().starts_with("/var/run/netns"), "{:?}", s.netns());
        assert_enrolled(&n, s);
    }
    assert!(not_served(sp.netns()) && istio_tables(sp.netns()).is_empty());
    let before = n.hbone_count("a", "b");
    let o = n.connect(&sa, sb.ip(), integration::cri::ambient::APP_PORT);
    assert!(
        o.landed().is_some_and(|l| l.probe == "b"),
        "a -> b: {o}\n{}",
        n.logs()
    );
    n.eventually("a -> b counted by ztunnel as HBONE", || {
        n.hbone_count("a", "b") > before
    });
    let host_rule = host_rule_place(&n);
    for s in [&sa, &sb, &sp] {
        n.rn.stop_and_remove(&s.sandbox).unwrap();
    }
    eprintln!(
        "cri_istio_chart ambient: host probe rule in {host_rule}; {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// The plugin at `bin` called as multus calls a delegate: the network's own config file
/// (no prevResult), interface `net1`, in the node's namespace. Returns (success, output).
fn multus_add(n: &AmbientRuntime, bin: &Path, conf: &Path, s: &AmbientSandbox) -> (bool, String) {
    let pod = &s.sandbox.pod;
    let uid = integration::cri::pod_uid(&pod.namespace, &pod.name);
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={uid}",
        pod.namespace, pod.name, s.sandbox.id
    );
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", n.rn.node.ns.path().display()))
        .arg(bin.join("istio-cni"))
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", &s.sandbox.id)
        .env("CNI_NETNS", s.netns())
        .env("CNI_IFNAME", "net1")
        .env("CNI_PATH", bin)
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let conf = std::fs::read(conf).unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &conf).unwrap();
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn istios_chart_openshift_values_run_our_image_which_writes_a_standalone_config_for_multus() {
    integration::require_root();
    let Some(zt_bin) = ztunnel_binary() else {
        return;
    };
    let t0 = Instant::now();
    let mut plans = Plans::new();
    // The agent's own pod is the first on the pod network (Istio's chart: no hostNetwork).
    plans.pod("istio-cni-node-test", Enroll::None);
    let a = plans.pod("a", Enroll::PodLabel);
    let pause = pause_binary();
    let n = AmbientRuntime::start_rendered(
        &pause,
        &zt_bin,
        plans.range(),
        std::slice::from_ref(&a),
        rendered("openshift"),
    )
    .unwrap();
    assert_rendered_as_istio(&n.rn, "info");
    let root = &n.rn.node.root;
    let bin = root.join("var/lib/cni/bin");
    let multus = root.join("etc/cni/multus/net.d");
    for b in ["istio-cni", "istio-nftables"] {
        assert!(bin.join(b).is_file(), "{b} not in /var/lib/cni/bin");
    }
    // Not chained: the primary conflist and containerd's chain are untouched; the standalone
    // file is where the chart's CNI_CONF_NAME and multus dir say.
    assert_eq!(n.rn.node.chain(), ["bridge", "portmap"]);
    let conf = multus.join("istio-cni.conf");
    let entry: Value = serde_json::from_slice(&std::fs::read(&conf).unwrap_or_else(|e| {
        let files: Vec<_> = std::fs::read_dir(&multus)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        panic!("{}: {e}; {files:?}\n{}", conf.display(), n.logs())
    }))
    .unwrap();
    assert_eq!(entry["type"], "istio-cni", "{entry}");
    assert_eq!(entry["ambient_enabled"], true, "{entry}");

    // An ambient pod containerd starts on the primary network; multus would then add the
    // istio-cni network from that file: the agent enrolls it.
    let sa = n.run_ok(&a);
    assert!(
        not_served(sa.netns()),
        "served before the istio-cni network"
    );
    let (ok, out) = multus_add(&n, &bin, &conf, &sa);
    assert!(ok, "istio-cni ADD as multus calls it: {out}\n{}", n.logs());
    assert_enrolled(&n, &sa);
    n.rn.stop_and_remove(&sa.sandbox).unwrap();
    eprintln!(
        "cri_istio_chart openshift: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
