//! Live migration iptables-legacy ⇄ nftables (issue 13, item 2), against the real kernel:
//! a pod keeps making outbound connections, and receiving inbound ones, while its rules move
//! between backends, and every one of them must land on Envoy. Failures of the new program must leave the old rules.
//!
//! `migration_under_continuous_traffic_never_lets_a_connection_escape` prints the migration
//! time per pod (p50/p99 per direction) for docs/how-it-works.md (live migration); run with
//! `--nocapture`.

use capture::{Config, Ipv6Mode, Plan};
use integration::cni::percentile;
use integration::*;
use redirect::backend::{LegacyRules, NftRules};
use redirect::{Backend, BackendChoice, MigrateOptions, RedirectError};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The application's uid (anything but Envoy's 1337 is captured).
const APP_UID: u32 = 1000;
/// Envoy's outbound listener.
const ENVOY_OUTBOUND: u16 = 15001;
/// Migrations in the traffic test: odd, so it ends on nft having started on legacy.
const MIGRATIONS: usize = 21;
/// A hang, not a measurement.
const DEADLINE: Duration = Duration::from_secs(30);

/// The CNI default sidecar plan for this pod, dual stack.
fn plan(w: &PodWorld) -> Plan {
    let cfg = Config {
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    };
    let facts = redirect::read_facts(Some(w.pod.path()), None).expect("facts");
    Plan::build(&cfg, &facts).expect("plan")
}

/// The backends whose rules of ours are in `ns` (legacy first).
fn kinds(ns: &Path) -> Vec<Backend> {
    netns::run_in(Some(ns), kinds_here).expect("enter namespace")
}

/// [`kinds`] for the calling thread's namespace.
fn kinds_here() -> Vec<Backend> {
    let mut k = Vec::new();
    if iptables_legacy::has_our_chains(&iptables_legacy::Tools::default()).expect("legacy state") {
        k.push(Backend::IptablesLegacy);
    }
    if nft_backend::has_our_tables().expect("nft state") {
        k.push(Backend::Nft);
    }
    k
}

fn assert_only(w: &PodWorld, p: &Plan, b: Backend) {
    assert_eq!(kinds(w.pod.path()), [b], "exactly one backend's rules");
    let drift = redirect::check(p, Some(w.pod.path()), BackendChoice::Fixed(b)).expect("check");
    assert!(drift.is_empty(), "{b}: drift {drift:?}");
}

/// Envoy's inbound listener.
const ENVOY_INBOUND: u16 = 15006;

/// One kind of connection of the probe stream: made from `from`, must land on the pod's Envoy
/// listener `envoy`.
#[derive(Clone)]
struct Flow {
    from: std::path::PathBuf,
    spec: ConnectSpec,
    envoy: u16,
}

/// The stream's connections, in turn: the app's outbound connections to the world's port 80
/// (IPv4 and IPv6; output hook) and the world's inbound connections to the app's port 8080
/// (IPv4 and IPv6; prerouting hook).
fn flows(w: &PodWorld) -> Vec<Flow> {
    let mut f = Vec::new();
    let mut add = |from: &TestNetns, dst: IpAddr, port, uid: Option<u32>, envoy| {
        let spec = ConnectSpec::new(dst, port);
        f.push(Flow {
            from: from.path().to_path_buf(),
            spec: match uid {
                Some(u) => spec.uid(u),
                None => spec,
            },
            envoy,
        });
    };
    add(&w.pod, w.world_v4.into(), 80, Some(APP_UID), ENVOY_OUTBOUND);
    add(&w.world, w.pod_v4.into(), 8080, None, ENVOY_INBOUND);
    if let (Some(world6), Some(pod6)) = (w.world_v6, w.pod_v6) {
        add(&w.pod, world6.into(), 80, Some(APP_UID), ENVOY_OUTBOUND);
        add(&w.world, pod6.into(), 8080, None, ENVOY_INBOUND);
    }
    f
}

/// An outbound connection from the app to the world's port 80 (IPv6 when `n` is odd).
fn app_connection(w: &PodWorld, n: usize) -> ConnectSpec {
    let dst: IpAddr = match (n % 2, w.world_v6) {
        (1, Some(v6)) => v6.into(),
        _ => w.world_v4.into(),
    };
    ConnectSpec::new(dst, 80).uid(APP_UID)
}

fn lands_on_envoy(o: &Outcome) -> bool {
    lands_on(o, ENVOY_OUTBOUND)
}

/// Landed on the pod's listener `port`, diverted from where it was sent.
fn lands_on(o: &Outcome, port: u16) -> bool {
    o.landed()
        .is_some_and(|l| l.probe == "pod" && l.port == port && l.redirected())
}

fn summary(label: &str, mut d: Vec<Duration>) -> String {
    d.sort();
    format!(
        "{label}: n={} p50={:.1?} p99={:.1?} max={:.1?}",
        d.len(),
        percentile(&d, 0.5),
        percentile(&d, 0.99),
        d[d.len() - 1]
    )
}

#[test]
fn migration_under_continuous_traffic_never_lets_a_connection_escape() {
    require_root();
    let w = PodWorld::new().expect("pod/world");
    let _probes = (
        Probe::sidecar(w.pod.path()).expect("pod probe"),
        Probe::world(w.world.path()).expect("world probe"),
    );
    let p = plan(&w);
    let legacy = BackendChoice::Fixed(Backend::IptablesLegacy);
    redirect::apply(&p, Some(w.pod.path()), legacy).expect("legacy rules");
    assert_only(&w, &p, Backend::IptablesLegacy);
    assert!(lands_on_envoy(&connect(
        w.pod.path(),
        &app_connection(&w, 0)
    )));

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<(usize, Outcome, bool)>::new()));
    let stream = {
        let (stop, outcomes, flows) = (stop.clone(), outcomes.clone(), flows(&w));
        thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let flow = &flows[n % flows.len()];
                let o = connect(&flow.from, &flow.spec);
                let ok = lands_on(&o, flow.envoy);
                outcomes.lock().unwrap().push((n, o, ok));
                n += 1;
            }
        })
    };
    // Another caller, as ADD/CHECK/DEL are: takes the namespace's lock and looks. It must
    // never see both kinds (the overlap exists only inside the migration's lock hold).
    let observer = {
        let (stop, ns) = (stop.clone(), w.pod.path().to_path_buf());
        thread::spawn(move || {
            let (mut looks, mut both) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                let seen = netns::run_in(Some(&ns), || {
                    let _held = netns::NsLock::path(&ns, Instant::now() + DEADLINE).expect("lock");
                    kinds_here()
                })
                .expect("enter");
                looks += 1;
                both += usize::from(seen.len() > 1);
            }
            (looks, both)
        })
    };
    // Let the stream get going, then move the pod back and forth under it.
    thread::sleep(Duration::from_millis(100));
    let (mut to_nft, mut to_legacy) = (Vec::new(), Vec::new());
    let mut during = 0;
    for i in 0..MIGRATIONS {
        let to = if i % 2 == 0 {
            Backend::Nft
        } else {
            Backend::IptablesLegacy
        };
        let seen_before = outcomes.lock().unwrap().len();
        let t = Instant::now();
        let m = redirect::migrate(&p, Some(w.pod.path()), to, Instant::now() + DEADLINE)
            .unwrap_or_else(|e| panic!("migration {i} to {to}: {e}"));
        let took = t.elapsed();
        during += outcomes.lock().unwrap().len() - seen_before;
        assert!(m.changed, "migration {i}: {m}");
        assert_eq!(m.found, [redirect_other(to)], "migration {i}");
        match to {
            Backend::Nft => to_nft.push(took),
            Backend::IptablesLegacy => to_legacy.push(took),
        }
        // Some connections between migrations too (they must land as well).
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    stream.join().expect("probe stream");
    let (looks, both) = observer.join().expect("observer");
    assert!(looks > 0, "the observer never got the lock");
    assert_eq!(both, 0, "{both} of {looks} locked looks saw both kinds");

    let outcomes = outcomes.lock().unwrap();
    let escaped: Vec<_> = outcomes.iter().filter(|(_, _, ok)| !ok).collect();
    assert!(
        escaped.is_empty(),
        "{} of {} connections did not land on Envoy: {:?}",
        escaped.len(),
        outcomes.len(),
        &escaped[..escaped.len().min(10)]
    );
    assert!(
        during >= MIGRATIONS,
        "too few connections overlapped the migrations ({during}) to prove anything"
    );
    assert_only(&w, &p, Backend::Nft);
    println!(
        "migrate: {} connections ({} finished during a migration), all on Envoy; {looks} locked looks, none saw both kinds; {}; {}",
        outcomes.len(),
        during,
        summary("legacy→nft", to_nft),
        summary("nft→legacy", to_legacy),
    );
}

fn redirect_other(b: Backend) -> Backend {
    match b {
        Backend::Nft => Backend::IptablesLegacy,
        Backend::IptablesLegacy => Backend::Nft,
    }
}

#[test]
fn failed_nft_program_leaves_the_legacy_rules() {
    require_root();
    let w = PodWorld::new().expect("pod/world");
    let _probes = (
        Probe::sidecar(w.pod.path()).expect("pod probe"),
        Probe::world(w.world.path()).expect("world probe"),
    );
    let p = plan(&w);
    redirect::apply(
        &p,
        Some(w.pod.path()),
        BackendChoice::Fixed(Backend::IptablesLegacy),
    )
    .expect("legacy rules");
    let poisoned = MigrateOptions {
        replace: vec![Box::new(NftRules::poisoned())],
    };
    let err = redirect::migrate_with(
        &p,
        Some(w.pod.path()),
        Backend::Nft,
        Instant::now() + DEADLINE,
        &poisoned,
    )
    .expect_err("the kernel refuses the batch");
    assert!(
        matches!(
            err,
            RedirectError::Migrate {
                step: "programming",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("unchanged"), "{err}");
    assert_only(&w, &p, Backend::IptablesLegacy);
    let o = connect(w.pod.path(), &app_connection(&w, 0));
    assert!(lands_on_envoy(&o), "after the failed migration: {o}");
}

#[test]
fn missing_legacy_binaries_leave_the_nft_rules() {
    require_root();
    let w = PodWorld::new().expect("pod/world");
    let _probes = (
        Probe::sidecar(w.pod.path()).expect("pod probe"),
        Probe::world(w.world.path()).expect("world probe"),
    );
    let p = plan(&w);
    redirect::apply(&p, Some(w.pod.path()), BackendChoice::Fixed(Backend::Nft)).expect("nft");
    let empty = tempfile::tempdir().expect("empty dir");
    let no_binaries = MigrateOptions {
        replace: vec![Box::new(LegacyRules::with_tools(
            iptables_legacy::Tools::in_dirs([empty.path()]),
        ))],
    };
    let err = redirect::migrate_with(
        &p,
        Some(w.pod.path()),
        Backend::IptablesLegacy,
        Instant::now() + DEADLINE,
        &no_binaries,
    )
    .expect_err("no iptables-legacy-restore");
    assert!(err.to_string().contains("not found"), "{err}");
    assert_only(&w, &p, Backend::Nft);
    let o = connect(w.pod.path(), &app_connection(&w, 1));
    assert!(lands_on_envoy(&o), "after the failed migration: {o}");
}

#[test]
fn already_on_the_target_is_a_no_op() {
    require_root();
    let w = PodWorld::ipv4_only().expect("pod/world");
    let p = plan(&w);
    redirect::apply(&p, Some(w.pod.path()), BackendChoice::Fixed(Backend::Nft)).expect("nft");
    let m = redirect::migrate(
        &p,
        Some(w.pod.path()),
        Backend::Nft,
        Instant::now() + DEADLINE,
    )
    .expect("no-op");
    assert!(!m.changed, "{m}");
    assert_eq!(m.found, [Backend::Nft]);
    assert_only(&w, &p, Backend::Nft);
}

#[test]
fn an_interrupted_migration_with_both_kinds_is_finished() {
    require_root();
    let w = PodWorld::new().expect("pod/world");
    let p = plan(&w);
    redirect::apply(
        &p,
        Some(w.pod.path()),
        BackendChoice::Fixed(Backend::IptablesLegacy),
    )
    .expect("legacy");
    // As if a migration to nft was killed between its program and the removal.
    netns::run_in(Some(w.pod.path()), || nft_backend::apply(&p))
        .expect("enter")
        .expect("nft too");
    assert_eq!(kinds(w.pod.path()), [Backend::IptablesLegacy, Backend::Nft]);
    // CHECK (the plugin's, the reconciler's) sees the left-over kind though nft's match.
    let nft = BackendChoice::Fixed(Backend::Nft);
    assert_eq!(
        redirect::check(&p, Some(w.pod.path()), nft).expect("check"),
        ["rules of ours on the other backend (iptables-legacy) too"]
    );
    let m = redirect::migrate(
        &p,
        Some(w.pod.path()),
        Backend::Nft,
        Instant::now() + DEADLINE,
    )
    .expect("finish");
    assert!(m.changed);
    assert_eq!(m.found, [Backend::IptablesLegacy, Backend::Nft]);
    assert_only(&w, &p, Backend::Nft);
}

#[test]
fn a_pod_without_rules_gets_the_target_backend() {
    require_root();
    let w = PodWorld::ipv4_only().expect("pod/world");
    let p = plan(&w);
    let m = redirect::migrate(
        &p,
        Some(w.pod.path()),
        Backend::IptablesLegacy,
        Instant::now() + DEADLINE,
    )
    .expect("program");
    assert!(m.changed && m.found.is_empty(), "{m}");
    assert_only(&w, &p, Backend::IptablesLegacy);
}

/// Plans that put rules directly into legacy's built-in chains (interface RETURNs, TPROXY's
/// marks): after moving to nft, not one legacy rule of the plan may stay, or `--backend auto`
/// would keep choosing iptables-legacy for the pod (and its CHECK would report drift).
#[test]
fn moving_to_nft_leaves_no_legacy_rule_behind() {
    require_root();
    let plans = [
        (
            "exclude-interfaces",
            Config {
                ipv6: Ipv6Mode::On,
                exclude_interfaces: vec!["eth9".into()],
                ..Config::cni_default()
            },
        ),
        (
            "tproxy",
            Config {
                ipv6: Ipv6Mode::On,
                inbound_mode: capture::InterceptionMode::Tproxy,
                ..Config::cni_default()
            },
        ),
    ];
    for (name, cfg) in plans {
        let w = PodWorld::new().expect("pod/world");
        let facts = redirect::read_facts(Some(w.pod.path()), None).expect("facts");
        let p = Plan::build(&cfg, &facts).expect("plan");
        let legacy = BackendChoice::Fixed(Backend::IptablesLegacy);
        redirect::apply(&p, Some(w.pod.path()), legacy).expect("legacy rules");
        let deadline = Instant::now() + DEADLINE;
        redirect::migrate(&p, Some(w.pod.path()), Backend::Nft, deadline)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_only(&w, &p, Backend::Nft);
        let any_legacy = netns::run_in(Some(w.pod.path()), || {
            iptables_legacy::has_legacy_rules(&iptables_legacy::Tools::default())
        })
        .expect("enter")
        .expect("legacy rules");
        assert!(!any_legacy, "{name}: legacy rules left behind");
        let auto = redirect::check(&p, Some(w.pod.path()), BackendChoice::Auto).expect("check");
        assert!(auto.is_empty(), "{name}: auto check: {auto:?}");
        // And back: legacy exactly as planned, nothing of nft.
        redirect::migrate(&p, Some(w.pod.path()), Backend::IptablesLegacy, deadline)
            .unwrap_or_else(|e| panic!("{name} back: {e}"));
        assert_only(&w, &p, Backend::IptablesLegacy);
    }
}
