//! Node backend detection on a real kernel: fresh network namespaces seeded with kubelet's
//! legacy canary chain, with an nftables table, or both; detection runs inside each through
//! the `netns` crate exactly as the daemon runs it in the host namespace.

use redirect::node as backend;
use redirect::{Backend, BackendChoice};
use std::path::PathBuf;
use std::process::Command;

struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Option<Ns> {
        let name = format!("icni-{tag}-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then_some(Ns(name))
    }
    fn exec(&self, args: &[&str]) {
        let st = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "{args:?}");
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.0)
    }
    fn detect(&self) -> (backend::NodeFacts, backend::Decision) {
        netns::run_in(Some(&self.path()), || {
            let f = backend::probe();
            let d = backend::decide(BackendChoice::Auto, false, &f);
            (f, d)
        })
        .unwrap()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn namespaces_available() -> bool {
    let root = testbed::is_root();
    if !root {
        eprintln!("skipping: needs root for ip netns");
    }
    root
}

#[test]
fn legacy_canary_means_legacy() {
    if !namespaces_available() {
        return;
    }
    let ns = Ns::new("legacy").expect("ip netns add");
    ns.exec(&["iptables-legacy", "-t", "nat", "-N", "KUBE-KUBELET-CANARY"]);
    let (f, d) = ns.detect();
    assert_eq!(d.backend, Backend::IptablesLegacy, "{f:?} {d:?}");
    assert!(d.reason.contains("KUBE-KUBELET-CANARY"), "{}", d.reason);
    assert!(f.legacy_tables.contains(&"nat".to_string()), "{f:?}");
}

#[test]
fn nft_table_means_nft() {
    if !namespaces_available() {
        return;
    }
    let ns = Ns::new("nft").expect("ip netns add");
    ns.exec(&["nft", "add", "table", "ip", "foo"]);
    let (f, d) = ns.detect();
    assert_eq!(d.backend, Backend::Nft, "{f:?} {d:?}");
    assert!(f.legacy_tables.is_empty(), "{f:?}");
    // With the nft backend's table listing, the table is seen (a stub would report an error).
    if let Some(t) = &f.nft_tables {
        assert!(t.contains(&("ip".to_string(), "foo".to_string())), "{t:?}");
    }
}

#[test]
fn both_present_prefers_nft_only_when_tables_are_visible() {
    if !namespaces_available() {
        return;
    }
    let ns = Ns::new("both").expect("ip netns add");
    ns.exec(&[
        "iptables-legacy",
        "-t",
        "mangle",
        "-N",
        "KUBE-IPTABLES-HINT",
    ]);
    ns.exec(&["nft", "add", "table", "ip", "kube-proxy"]);
    let (f, d) = ns.detect();
    match &f.nft_tables {
        Some(_) => assert_eq!(d.backend, Backend::Nft, "{d:?}"),
        None => assert_eq!(d.backend, Backend::IptablesLegacy, "{d:?}"),
    }
    // And the caller's own namespace is untouched by the probes.
    let here = netns::run_in(None, backend::probe).unwrap();
    assert!(
        !here
            .nft_tables
            .unwrap_or_default()
            .contains(&("ip".into(), "kube-proxy".into()))
    );
}
