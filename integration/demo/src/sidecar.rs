//! Sidecar pods on an nftables node: install, ADD through the chain, rules, connections,
//! explain, repair, DEL and uninstall.

use crate::{Res, explain, ms, ok};
use std::path::PathBuf;
use testbed::cni::{require_cni_tools, rules};
use testbed::node::{GATEWAY_V4, Node, NodeOptions, product_bin_dir};
use testbed::pods::{APP_UID, DemoPod, PodKind, expectations};
use testbed::{Probe, TestNetns};

/// Pods ADDed on a node: their spec, namespace and ADD result.
pub type Pods = Vec<(DemoPod, TestNetns, serde_json::Value)>;

pub fn run() -> Res<bool> {
    require_cni_tools();
    let bins: PathBuf = product_bin_dir()?;
    let mut node = Node::new(NodeOptions::new(bins.clone()))?;
    let mut all_ok = install(&mut node, &bins)?;
    let _world = Probe::world(node.ns.path())?;
    let (mut pods, added_ok) = add_pods(&node)?;
    all_ok &= added_ok;
    let table = connections(&node, &pods, &mut all_ok)?;
    print_ruleset(&pods[0])?;
    print_table(&node, &pods, &table);
    all_ok &= explain_outbound(&bins, &pods[0].1, "nft")?;
    all_ok &= repair_then_add(&node, &mut pods)?;
    all_ok &= del_and_uninstall(&mut node, &pods)?;
    Ok(all_ok)
}

/// The app's connection to a world server, explained and traced by the kernel.
pub fn explain_outbound(bins: &std::path::Path, pod: &TestNetns, backend: &str) -> Res<bool> {
    let ns = pod.path().display().to_string();
    let dst = format!("{GATEWAY_V4}:80");
    let uid = APP_UID.to_string();
    let mut args = vec![
        "--network-namespace",
        &ns,
        "--dst",
        &dst,
        "--uid",
        &uid,
        "--gid",
        &uid,
    ];
    args.extend(["--backend", backend, "--trace"]);
    explain(bins, &args)
}

/// The node, then install-cni started on it and ready.
pub fn install(node: &mut Node, bins: &std::path::Path) -> Res<bool> {
    println!("== node");
    println!(
        "namespace {} (the host), layout under {}",
        node.ns.name(),
        node.root.display()
    );
    println!("primary CNI conflist: {}", node.chain().join(" -> "));
    node.start_daemon()?;
    println!(
        "\n== install-cni (pid {}, from {}) is ready",
        node.daemon().pid(),
        bins.display()
    );
    println!("conflist now:          {}", node.chain().join(" -> "));
    println!(
        "installed:             {} (+ istio-cni-kubeconfig in {})",
        ["istio-cni", "istio-nftables"]
            .map(|b| node.bin_dir.join(b).display().to_string())
            .join(", "),
        node.run_dir.display()
    );
    Ok(node.chain().iter().any(|t| t == "istio-cni"))
}

/// ADDs every demo pod through the full chain, as kubelet would, and CHECKs it.
fn add_pods(node: &Node) -> Res<(Pods, bool)> {
    add_kinds(node, &PodKind::ALL, "istio-proxy-")
}

/// ADDs a pod of each kind; `ours` is what marks our rules in `rules()` output.
pub fn add_kinds(node: &Node, kinds: &[PodKind], ours: &str) -> Res<(Pods, bool)> {
    println!("\n== cnitool add (bridge + host-local, portmap, istio-cni; CNI_ARGS K8S_POD_*)");
    println!(
        "{:<26} {:<33} {:>9}  {:<6} check",
        "pod", "kind", "ADD", "rules"
    );
    let mut all_ok = true;
    let mut pods = Vec::new();
    for (i, kind) in kinds.iter().copied().enumerate() {
        let name = match kind {
            PodKind::Sidecar => "productpage-v1".to_string(),
            _ => format!("demo-{i}"),
        };
        let spec = DemoPod::new(kind, &name);
        node.serve(&spec);
        let ns = TestNetns::with_prefix("pod")?;
        let add = node.add(&ns, &spec);
        ok(&add, &format!("ADD {}/{}", spec.namespace, spec.name))?;
        let r = rules(&ns);
        let captured = r.contains(ours);
        all_ok &= captured == kind.captured();
        let check = node.check(&ns, &spec);
        all_ok &= check.ok;
        println!(
            "{:<26} {:<33} {:>9}  {:<6} {}",
            format!("{}/{}", spec.namespace, spec.name),
            kind.describe(),
            ms(&add),
            if captured { "yes" } else { "none" },
            if check.ok { "ok" } else { "FAILED" }
        );
        pods.push((spec, ns, add.json()));
    }
    Ok((pods, all_ok))
}

/// One row per connection: pod, what, where it landed, where it should have, whether it did.
type Row = (String, String, String, String, bool);

/// Real connections: every pod runs a stand-in sidecar (Envoy's ports) and app (8080); the
/// node runs the "world" servers.
pub fn connections(node: &Node, pods: &Pods, all_ok: &mut bool) -> Res<Vec<Row>> {
    let mut table = Vec::new();
    for (spec, ns, result) in pods {
        let _sidecar = Probe::sidecar(ns.path())?;
        for e in expectations(spec.kind, &node.addrs(result)) {
            let out = node.probe(ns, &e);
            let good = e.matches(&out);
            *all_ok &= good;
            let landed = match out.landed() {
                Some(l) => format!("{}:{}", l.probe, l.port),
                None => out.to_string(),
            };
            let expected = e.expected();
            table.push((spec.name.clone(), e.what, landed, expected, good));
        }
    }
    Ok(table)
}

fn print_ruleset((sidecar, sidecar_ns, _): &(DemoPod, TestNetns, serde_json::Value)) -> Res<()> {
    println!(
        "\n== nft list ruleset in {}/{} (nsenter --net={} nft list ruleset)\n",
        sidecar.namespace,
        sidecar.name,
        sidecar_ns.path().display()
    );
    print!("{}", sidecar_ns.exec_ok("nft", &["list", "ruleset"])?);
    Ok(())
}

pub fn print_table(node: &Node, pods: &Pods, table: &[Row]) {
    let a = node.addrs(&pods[0].2);
    println!(
        "\n== connections (pod {} / {}; node {} / {}; \"pod:\" = the pod's sidecar/app listeners, \"world:\" = servers on the node)\n",
        a.pod_v4,
        a.pod_v6.map(|v| v.to_string()).unwrap_or_default(),
        a.gw_v4,
        a.gw_v6
    );
    println!(
        "{:<16} {:<36} {:<12} {:<12}",
        "pod", "connection", "landed on", "expected"
    );
    for (pod, what, landed, expected, good) in table {
        println!(
            "{pod:<16} {what:<36} {landed:<12} {expected:<12}{}",
            if *good { "" } else { " MISMATCH" }
        );
    }
}

/// The primary CNI rewrites its conflist; the daemon repairs it before the next ADD.
fn repair_then_add(node: &Node, pods: &mut Pods) -> Res<bool> {
    let took = node.primary_rewrites_conflist()?;
    let spec = DemoPod::new(PodKind::Sidecar, "reviews-v1");
    node.serve(&spec);
    let late = TestNetns::with_prefix("pod")?;
    let add = node.add(&late, &spec);
    ok(&add, "ADD after the repair")?;
    let captured = rules(&late).contains("istio-proxy-");
    println!(
        "\n== the primary CNI rewrote {} without istio-cni: repaired in {:.2} ms; next pod ADDed in {}, {}",
        node.conflist().display(),
        took.as_secs_f64() * 1000.0,
        ms(&add),
        if captured { "captured" } else { "NOT CAPTURED" }
    );
    pods.push((spec, late, add.json()));
    Ok(captured)
}

/// DEL of every pod, then SIGTERM: the install goes (no DaemonSet: an uninstall).
fn del_and_uninstall(node: &mut Node, pods: &Pods) -> Res<bool> {
    del_and_uninstall_marked(node, pods, "istio-proxy-")
}

/// DEL of every pod (none keeps a rule marked `ours`), then SIGTERM: the install goes.
pub fn del_and_uninstall_marked(node: &mut Node, pods: &Pods, ours: &str) -> Res<bool> {
    let mut left = 0;
    for (spec, ns, _) in pods {
        ok(&node.del(ns, spec), "DEL")?;
        left += usize::from(rules(ns).contains(ours));
    }
    println!(
        "== cnitool del of {} pods: {} with rules left",
        pods.len(),
        left
    );
    let (status, _) = node.stop_daemon()?;
    let removed = !node.chain().iter().any(|t| t == "istio-cni")
        && !node.bin_dir.join("istio-cni").exists()
        && !node.run_dir.join("istio-cni-kubeconfig").exists();
    println!(
        "== SIGTERM to install-cni: exit {}, conflist back to {}, binaries and kubeconfig {}",
        status.code().unwrap_or(-1),
        node.chain().join(" -> "),
        if removed { "removed" } else { "LEFT BEHIND" }
    );
    Ok(left == 0 && status.success() && removed)
}
