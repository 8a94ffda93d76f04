//! Backend detection and "never both kinds in one namespace" (issue 3), through the facade.

use capture::{Config, Facts, Ipv6Mode, Plan};
use integration::*;
use redirect::{Backend, BackendChoice};

fn plan() -> Plan {
    let cfg = Config {
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    };
    Plan::build(&cfg, &Facts::default()).unwrap()
}

/// (our legacy chains exist, our nft tables exist) in `ns`.
fn kinds(ns: &TestNetns) -> (bool, bool) {
    ns.run(|| {
        (
            iptables_legacy::has_our_chains(&iptables_legacy::Tools::default())
                .expect("legacy state"),
            nft_backend::has_our_tables().expect("nft state"),
        )
    })
    .unwrap()
}

#[test]
fn fresh_namespace_selects_nft() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let d = redirect::detect(Some(ns.path())).unwrap();
    assert_eq!(d.backend, Backend::Nft, "{}", d.reason);
}

#[test]
fn namespace_with_legacy_rules_selects_legacy() {
    require_root();
    let ns = TestNetns::new().unwrap();
    ns.exec_ok(
        "iptables-legacy",
        &[
            "-w", "-t", "nat", "-A", "OUTPUT", "-p", "udp", "-j", "RETURN",
        ],
    )
    .unwrap();
    let d = redirect::detect(Some(ns.path())).unwrap();
    assert_eq!(d.backend, Backend::IptablesLegacy, "{}", d.reason);
    // And auto then programs legacy there.
    let used = redirect::apply(&plan(), Some(ns.path()), BackendChoice::Auto).unwrap();
    assert_eq!(used.backend, Backend::IptablesLegacy);
    assert_eq!(kinds(&ns), (true, false));
}

#[test]
fn switching_backends_leaves_rules_of_one_kind() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let p = plan();
    let fixed = |b| BackendChoice::Fixed(b);
    redirect::apply(&p, Some(ns.path()), fixed(Backend::IptablesLegacy)).unwrap();
    assert_eq!(kinds(&ns), (true, false), "after legacy");
    let r = redirect::apply(&p, Some(ns.path()), fixed(Backend::Nft));
    // Either refusing or replacing is acceptable; both kinds at once is not.
    match r {
        Ok(_) => assert_eq!(kinds(&ns), (false, true), "after switching to nft"),
        Err(e) => assert_eq!(kinds(&ns), (true, false), "refused ({e}) but changed rules"),
    }
    let r = redirect::apply(&p, Some(ns.path()), fixed(Backend::IptablesLegacy));
    match r {
        Ok(_) => assert_eq!(kinds(&ns), (true, false), "after switching back to legacy"),
        Err(e) => {
            let (legacy, nft) = kinds(&ns);
            assert!(!(legacy && nft), "refused ({e}) but left both kinds");
        }
    }
    redirect::cleanup(Some(ns.path())).unwrap();
    assert_eq!(kinds(&ns), (false, false), "after cleanup");
}
