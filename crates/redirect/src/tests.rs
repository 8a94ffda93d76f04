//! What `redirect` asks of its backends, and in which order, on recording null backends (no
//! kernel, no root): the registry, detection, apply's cleanup of every other backend, check,
//! migration and the host probe rule.

use crate::backend::null::{Call, Journal, NullBackend};
use crate::backend::{self, RuleBackend};
use crate::{Backend, BackendChoice, RedirectError, Scope};
use capture::{AmbientConfig, Config, Facts, Ipv6Mode, Plan};
use netns::NsLock;
use std::time::{Duration, Instant};

use Backend::{IptablesLegacy as Legacy, Nft};

/// A sidecar plan that needs no route (IPv4 REDIRECT): the routes' check reads nothing.
fn sidecar() -> Plan {
    let cfg = Config {
        ipv6: Ipv6Mode::Off,
        ..Config::default()
    };
    Plan::build(&cfg, &Facts::default()).unwrap()
}

fn ambient() -> Plan {
    Plan::ambient(&AmbientConfig::default()).unwrap()
}

/// A hold on the test's own namespace: the writes take one; null backends ignore it.
fn held() -> NsLock {
    NsLock::current(
        &"the test's namespace",
        Instant::now() + Duration::from_secs(30),
    )
    .unwrap()
}

/// An nft and a legacy null backend sharing one journal.
fn pair() -> (Journal, NullBackend, NullBackend) {
    let j = Journal::default();
    let nft = NullBackend::new(Nft, &j);
    let legacy = NullBackend::new(Legacy, &j);
    (j, nft, legacy)
}

#[test]
fn the_registry_has_each_kind_once_nft_first() {
    let kinds: Vec<Backend> = backend::all().iter().map(|b| b.kind()).collect();
    assert_eq!(kinds, [Nft, Legacy]);
    for kind in kinds {
        assert_eq!(backend::of(kind).kind(), kind);
    }
}

#[test]
fn detection_prefers_nft_unless_unsupported_or_another_backend_has_rules() {
    let (_, nft, legacy) = pair();
    let d = crate::detect_among(&[&nft, &legacy]);
    assert_eq!((d.backend, d.reason.as_str()), (Nft, "default"));

    let claimed = NullBackend {
        claims: Some("the namespace already holds iptables-legacy rules".into()),
        ..NullBackend::new(Legacy, &Journal::default())
    };
    let d = crate::detect_among(&[&nft, &claimed]);
    assert_eq!(d.backend, Legacy);
    assert!(d.reason.contains("already holds"), "{}", d.reason);

    let no_nft = NullBackend {
        unsupported: Some("the kernel has no nf_tables support".into()),
        ..NullBackend::new(Nft, &Journal::default())
    };
    let d = crate::detect_among(&[&no_nft, &legacy]);
    assert_eq!(d.backend, Legacy);
    assert!(d.reason.contains("no nf_tables"), "{}", d.reason);
    // A fixed choice is not detected.
    let d = crate::resolve_among(&[&nft, &claimed], BackendChoice::Fixed(Nft));
    assert_eq!((d.backend, d.reason.as_str()), (Nft, "configured"));
}

#[test]
fn apply_cleans_every_other_backend_before_programming() {
    let (j, nft, legacy) = pair();
    let legacy = legacy.holding_ours();
    let plan = sidecar();
    let d = crate::apply_among(&[&nft, &legacy], &plan, BackendChoice::Fixed(Nft), &held());
    assert_eq!(d.unwrap().backend, Nft);
    assert_eq!(
        j.take(),
        [
            Call::Cleanup(Legacy, Scope::SIDECAR),
            Call::Apply(Nft, plan.clone())
        ]
    );
    assert!(!legacy.has_ours().unwrap() && nft.has_ours().unwrap());

    // An ambient pod's other backend loses its ambient tables too.
    let plan = ambient();
    crate::apply_among(
        &[&nft, &legacy],
        &plan,
        BackendChoice::Fixed(Legacy),
        &held(),
    )
    .unwrap();
    assert_eq!(
        j.take(),
        [
            Call::Cleanup(Nft, Scope::ALL),
            Call::Apply(Legacy, plan.clone())
        ]
    );
}

#[test]
fn apply_auto_follows_the_backend_that_already_has_rules() {
    let (j, nft, _) = pair();
    let legacy = NullBackend {
        claims: Some("the namespace already holds iptables-legacy rules".into()),
        ..NullBackend::new(Legacy, &j)
    };
    let plan = sidecar();
    let d = crate::apply_among(&[&nft, &legacy], &plan, BackendChoice::Auto, &held()).unwrap();
    assert_eq!(d.backend, Legacy);
    assert_eq!(
        j.take(),
        [
            Call::Cleanup(Nft, Scope::SIDECAR),
            Call::Apply(Legacy, plan.clone())
        ]
    );
}

#[test]
fn check_reports_rules_of_ours_on_another_backend() {
    let (j, nft, legacy) = pair();
    let (nft, legacy) = (nft.holding_ours(), legacy.holding_ours());
    let plan = sidecar();
    let drift = crate::check_among(&[&nft, &legacy], &plan, BackendChoice::Fixed(Nft)).unwrap();
    assert_eq!(
        drift,
        ["rules of ours on the other backend (iptables-legacy) too"]
    );
    assert_eq!(j.take(), [Call::Check(Nft, plan)]);
}

fn migrate(
    backends: &[&dyn RuleBackend],
    plan: &Plan,
    to: Backend,
) -> Result<crate::Migration, RedirectError> {
    crate::migrate::migrate_among(backends, plan, to, &held())
}

#[test]
fn migration_programs_and_verifies_the_new_backend_before_removing_the_old() {
    let (j, nft, legacy) = pair();
    let legacy = legacy.holding_ours();
    let plan = sidecar();
    let m = migrate(&[&nft, &legacy], &plan, Nft).unwrap();
    assert_eq!((m.found, m.changed), (vec![Legacy], true));
    assert_eq!(
        j.take(),
        [
            Call::Apply(Nft, plan.clone()),
            Call::Check(Nft, plan.clone()),
            Call::RemovePlan(Legacy, plan.clone()),
            Call::Check(Nft, plan.clone()),
        ]
    );
    // Back again; then already there: nothing is touched.
    let m = migrate(&[&nft, &legacy], &plan, Legacy).unwrap();
    assert_eq!((m.found, m.changed), (vec![Nft], true));
    j.take();
    let m = migrate(&[&nft, &legacy], &plan, Legacy).unwrap();
    assert_eq!((m.found, m.changed), (vec![Legacy], false));
    assert_eq!(j.take(), []);
}

#[test]
fn migration_lists_what_it_found_fallbacks_first() {
    let (_, nft, legacy) = pair();
    let (nft, legacy) = (nft.holding_ours(), legacy.holding_ours());
    let m = migrate(&[&nft, &legacy], &sidecar(), Nft).unwrap();
    assert_eq!(m.found, [Legacy, Nft]);
    assert!(!legacy.has_ours().unwrap());
}

#[test]
fn a_failed_migration_leaves_the_old_rules() {
    let (j, _, legacy) = pair();
    let legacy = legacy.holding_ours();
    let plan = sidecar();
    let refusing = NullBackend {
        refuse_apply: true,
        ..NullBackend::new(Nft, &j)
    };
    let err = migrate(&[&refusing, &legacy], &plan, Nft).unwrap_err();
    assert!(err.to_string().contains("programming failed"), "{err}");
    assert_eq!(j.take(), [Call::Apply(Nft, plan.clone())]);

    // Programmed but not in sync: what was programmed goes, the old rules stay.
    let drifting = NullBackend {
        drift: vec!["a rule missing".into()],
        ..NullBackend::new(Nft, &j)
    };
    let err = migrate(&[&drifting, &legacy], &plan, Nft).unwrap_err();
    assert!(err.to_string().contains("verifying failed"), "{err}");
    assert_eq!(
        j.take(),
        [
            Call::Apply(Nft, plan.clone()),
            Call::Check(Nft, plan.clone()),
            Call::RemovePlan(Nft, plan.clone()),
        ]
    );
    assert!(legacy.has_ours().unwrap());
}

#[test]
fn the_host_rule_of_every_other_backend_goes_first() {
    let (j, nft, legacy) = pair();
    let plan = ambient();
    crate::host_probe::ensure_among(&[&nft, &legacy], Nft, &plan).unwrap();
    assert_eq!(
        j.take(),
        [Call::HostRemoveAll(Legacy), Call::HostEnsure(Nft, plan)]
    );
    assert!(!crate::host_probe::remove_all_among(&[&nft, &legacy]).unwrap());
    assert_eq!(
        j.take(),
        [Call::HostRemoveAll(Nft), Call::HostRemoveAll(Legacy)]
    );
}

#[test]
fn migrate_with_uses_the_backends_it_is_given_in_the_registrys_place() {
    let (j, nft, legacy) = pair();
    let opts = crate::MigrateOptions {
        replace: vec![Box::new(nft), Box::new(legacy.holding_ours())],
    };
    let plan = sidecar();
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = crate::migrate_with(&plan, None, Nft, deadline, &opts).unwrap();
    assert_eq!((m.found, m.changed), (vec![Legacy], true));
    assert_eq!(j.take().first(), Some(&Call::Apply(Nft, plan)));
}
