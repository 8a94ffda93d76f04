//! `explain --trace` runs in different PID namespaces (the chart runs without hostPID: a run
//! from `kubectl exec` and one on the host see different pids): the second run's cleanup of
//! killed runs leaves the first run's live chain or TRACE rules alone, and the first run then
//! traces the app's connection it waits for as it would have alone.

mod common;

use capture::{Config, Facts, InterceptionMode, Ipv6Mode, Plan};
use common::{CLI, text};
use redirect::{Backend, BackendChoice};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testbed::*;

fn pod(backend: Backend) -> PodWorld {
    let w = PodWorld::ipv4_only().unwrap();
    let cfg = Config {
        ipv6: Ipv6Mode::Off,
        inbound_mode: InterceptionMode::Redirect,
        ..Config::cni_default()
    };
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
    w
}

fn args<'a>(ns: &'a str, dst: &'a str) -> [&'a str; 10] {
    [
        "explain",
        "--network-namespace",
        ns,
        "--dst",
        dst,
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--trace",
    ]
}

/// Run 1: on the host, waiting `wait` seconds; returns once its trace is in place.
fn waiting_run(ns: &str, dst: &str, wait: &str, placed: impl Fn() -> bool) -> Child {
    let child = Command::new(CLI.as_str())
        .args(args(ns, dst))
        .args(["--wait", wait])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !placed() {
        assert!(Instant::now() < deadline, "run 1 placed no trace");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Run 2: in a new PID namespace with its own /proc (run 1's pid does not exist there).
fn run_in_new_pid_namespace(ns: &str, dst: &str) -> Output {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", CLI.as_str()])
        .args(args(ns, dst))
        .output()
        .unwrap()
}

/// The app (uid 1000) connects to the world's port 80: what run 1 waits for.
fn app_connects(w: &PodWorld) {
    let app = ConnectSpec::new(w.world_v4.into(), 80).uid(1000).gid(1000);
    let _ = connect(w.pod.path(), &app);
}

#[test]
fn a_run_in_another_pid_namespace_leaves_a_live_nft_trace_alone() {
    require_root();
    let w = pod(Backend::Nft);
    let ns = w.pod.path().to_str().unwrap();
    let dst = format!("{}:80", w.world_v4);
    let chains = || explain::trace::list_trace_chains(Some(w.pod.path())).unwrap();
    let run1 = waiting_run(ns, &dst, "10", || !chains().is_empty());
    let before = chains();

    // Another port: run 1 does not wait for run 2's connection.
    let o = run_in_new_pid_namespace(ns, &format!("{}:81", w.world_v4));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("agree: yes"), "{}", text(&o));
    assert_eq!(chains(), before, "run 2 changed run 1's chains");

    app_connects(&w);
    let o1 = run1.wait_with_output().unwrap();
    assert_eq!(o1.status.code(), Some(0), "{}", text(&o1));
    assert!(text(&o1).contains("agree: yes"), "{}", text(&o1));
    assert!(chains().is_empty(), "{:?}", chains());
}

#[test]
fn a_run_in_another_pid_namespace_refused_on_a_legacy_pod_changes_nothing() {
    require_root();
    let w = pod(Backend::IptablesLegacy);
    let ns = w.pod.path().to_str().unwrap();
    let dst = format!("{}:80", w.world_v4);
    let rules = || legacy_trace::trace_rules(w.pod.path());
    let run1 = waiting_run(ns, &dst, "10", || !rules().is_empty());
    let before = rules();
    assert_eq!(before.len(), 2, "{before:?}");

    let o = run_in_new_pid_namespace(ns, &dst);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("another trace"), "{}", text(&o));
    assert_eq!(rules(), before, "run 2 changed run 1's TRACE rules");

    app_connects(&w);
    let o1 = run1.wait_with_output().unwrap();
    assert_eq!(o1.status.code(), Some(0), "{}", text(&o1));
    assert!(text(&o1).contains("agree: yes"), "{}", text(&o1));
    assert_eq!(
        legacy_trace::left_in_legacy_pod(w.pod.path()),
        Vec::<String>::new()
    );
}
