//! The same pods on a node that still runs iptables-legacy (`REDIRECT_BACKEND=iptables-legacy`,
//! as `auto` decides on a node whose pods already have legacy rules): the plugin programs the
//! same plans through `iptables-legacy-restore`, and no nftables table appears in any pod.

use crate::sidecar::{
    add_kinds, connections, del_and_uninstall_marked, explain_outbound, install, print_table,
};
use crate::{Res, verdict};
use testbed::cni::require_cni_tools;
use testbed::node::{Node, NodeOptions, product_bin_dir};
use testbed::pods::PodKind;
use testbed::{Probe, TestNetns};

/// Our chains in iptables-save output.
const OURS: &str = "ISTIO_";

pub fn run() -> Res<bool> {
    require_cni_tools();
    let bins = product_bin_dir()?;
    let mut opts = NodeOptions::new(bins.clone());
    opts.backend = "iptables-legacy".into();
    let mut node = Node::new(opts)?;
    let mut all_ok = install(&mut node, &bins)?;
    let _world = Probe::world(node.ns.path())?;
    let (pods, added_ok) = add_kinds(&node, &PodKind::ALL, OURS)?;
    all_ok &= added_ok;
    let (spec, pod, _) = &pods[0];
    all_ok &= print_legacy_rules(&format!("{}/{}", spec.namespace, spec.name), pod)?;
    let table = connections(&node, &pods, &mut all_ok)?;
    print_table(&node, &pods, &table);
    all_ok &= explain_outbound(&bins, pod, "iptables-legacy")?;
    all_ok &= del_and_uninstall_marked(&mut node, &pods, OURS)?;
    Ok(all_ok)
}

/// An excerpt of the pod's `iptables-legacy-save` (the nat table: where capture happens) and
/// the proof that nftables holds nothing in it.
fn print_legacy_rules(name: &str, pod: &TestNetns) -> Res<bool> {
    println!(
        "\n== iptables-legacy-save -t nat in {name} (nsenter --net={} iptables-legacy-save -t nat), excerpt\n",
        pod.path().display()
    );
    let save = pod.exec_ok("iptables-legacy-save", &["-t", "nat"])?;
    let lines: Vec<&str> = save.lines().filter(|l| !l.starts_with('#')).collect();
    for l in lines.iter().take(24) {
        println!("{l}");
    }
    if lines.len() > 24 {
        println!("... ({} more lines)", lines.len() - 24);
    }
    let nft = pod.exec_ok("nft", &["list", "ruleset"])?;
    let no_nft = nft.trim().is_empty();
    println!(
        "\nnft list ruleset in {name}: {} ({})",
        if no_nft { "empty" } else { "NOT EMPTY" },
        verdict(no_nft)
    );
    Ok(no_nft && save.contains("-A ISTIO_OUTPUT"))
}
