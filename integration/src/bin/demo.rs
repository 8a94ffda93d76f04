//! The README's main job: the whole product on one node, end to end.
//!
//! A node namespace with a host layout (bin dir, conf dir with Debian's bridge + host-local +
//! portmap conflist, service-account dir, run dir); the real `install-cni` daemon chains
//! istio-cni into the conflist; a local API server serves the demo pods; `cnitool` ADDs each
//! pod namespace through the whole chain as kubelet would. Then, for the sidecar pod, the
//! `nft list ruleset` a node admin sees, and a table of real connections and where they landed
//! for every pod; CHECK, a primary-CNI rewrite repaired, DEL and SIGTERM.
//!
//! Usage: `demo [bin dir]` (default: the directory of this binary, where cargo puts
//! istio-cni, install-cni and istio-nftables). Exit 0 when everything landed as expected.

use integration::cni::{Run, require_cni_tools, rules};
use integration::node::{Node, NodeOptions, product_bin_dir};
use integration::pods::{DemoPod, PodKind, expectations};
use integration::{Probe, TestNetns};
use std::path::PathBuf;
use std::process::ExitCode;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    if let Some(d) = std::env::args().nth(1) {
        // SAFETY: single-threaded at this point.
        unsafe { std::env::set_var("ISTIO_CNI_BIN_DIR", d) };
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::from(1)
        }
    }
}

fn ms(r: &Run) -> String {
    format!("{:.1} ms", r.elapsed.as_secs_f64() * 1000.0)
}

fn ok(r: &Run, what: &str) -> Res<()> {
    if r.ok {
        Ok(())
    } else {
        Err(format!("{what} failed:\n{}{}", r.stdout, r.stderr).into())
    }
}

/// Pods ADDed on a node: their spec, namespace and ADD result.
type Pods = Vec<(DemoPod, TestNetns, serde_json::Value)>;

fn run() -> Res<bool> {
    require_cni_tools();
    let bins: PathBuf = product_bin_dir()?;
    let mut node = Node::new(NodeOptions::new(bins.clone()))?;
    let mut all_ok = install(&mut node, &bins)?;
    let _world = Probe::world(node.ns.path())?;
    let (mut pods, added_ok) = add_pods(&node)?;
    all_ok &= added_ok;
    let table = connections(&node, &pods, &mut all_ok)?;
    print_ruleset_and_table(&node, &pods, &table)?;
    all_ok &= repair_then_add(&node, &mut pods)?;
    all_ok &= del_and_uninstall(&mut node, &pods)?;
    println!(
        "\n{}",
        if all_ok {
            "all pods got the rules Istio gives them, and every connection landed where Istio sends it"
        } else {
            "SOMETHING DID NOT GO AS EXPECTED (see MISMATCH / FAILED above)"
        }
    );
    Ok(all_ok)
}

/// The node, then install-cni started on it and ready.
fn install(node: &mut Node, bins: &std::path::Path) -> Res<bool> {
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
    println!("\n== cnitool add (bridge + host-local, portmap, istio-cni; CNI_ARGS K8S_POD_*)");
    println!(
        "{:<26} {:<33} {:>9}  {:<6} check",
        "pod", "kind", "ADD", "rules"
    );
    let mut all_ok = true;
    let mut pods = Vec::new();
    for (i, kind) in PodKind::ALL.into_iter().enumerate() {
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
        let captured = r.contains("istio-proxy-");
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
fn connections(node: &Node, pods: &Pods, all_ok: &mut bool) -> Res<Vec<Row>> {
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

fn print_ruleset_and_table(node: &Node, pods: &Pods, table: &[Row]) -> Res<()> {
    let (sidecar, sidecar_ns, result) = &pods[0];
    println!(
        "\n== nft list ruleset in {}/{} (nsenter --net={} nft list ruleset)\n",
        sidecar.namespace,
        sidecar.name,
        sidecar_ns.path().display()
    );
    print!("{}", sidecar_ns.exec_ok("nft", &["list", "ruleset"])?);
    let a = node.addrs(result);
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
    Ok(())
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
    let mut left = 0;
    for (spec, ns, _) in pods {
        ok(&node.del(ns, spec), "DEL")?;
        left += usize::from(rules(ns).contains("istio-proxy-"));
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
