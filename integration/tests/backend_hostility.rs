//! The backends under hostility (issue 11, items 2 and 3), with the real `istio-nftables`
//! binary (each call a process, as each CNI ADD is): many calls on one namespace at once, and
//! SIGKILL at random points of ADD. The promise under test: every call succeeds, and a
//! namespace holds either nothing of ours or ONE backend's complete rules — never both kinds,
//! never a half state that CHECK calls "in place" or that the next ADD cannot repair.
//!
//! Each test prints a one-line summary (run with `--nocapture`) for docs/reliability.md's
//! section.

use integration::*;
use netns::NsLock;
use redirect::Backend;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The CNI default sidecar flags, dual stack (IPv6 rules whatever the namespace's addresses).
fn add_flags() -> Vec<&'static str> {
    cni_default_flags_with_ipv6("on")
}

/// Bound on waiting for a namespace's lock in the test itself (a hang, not a measurement).
const LOCK_FREE_WITHIN: Duration = Duration::from_secs(10);

fn cli() -> &'static Path {
    static CLI: OnceLock<PathBuf> = OnceLock::new();
    CLI.get_or_init(|| {
        node::product_bin_dir()
            .expect("the product's binaries")
            .join("istio-nftables")
    })
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Add(Backend),
    Check(Backend),
    Del,
}

/// The CLI aimed at `ns`, quiet, output captured.
fn cli_in(ns: &Path) -> Command {
    let mut c = Command::new(cli());
    c.arg("--network-namespace")
        .arg(ns)
        .env("LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn command(ns: &Path, op: Op) -> Command {
    let mut c = cli_in(ns);
    match op {
        Op::Add(b) => c.args(add_flags()).args(["--backend", &b.to_string()]),
        Op::Check(b) => c
            .args(add_flags())
            .args(["--backend", &b.to_string(), "--check"]),
        Op::Del => c.arg("--cleanup-only"),
    };
    c
}

/// Starts every call before waiting for any, so they run at once.
fn run_all(ns: &Path, ops: &[Op]) -> Vec<(Op, Output)> {
    let children: Vec<(Op, Child)> = ops
        .iter()
        .map(|&op| (op, command(ns, op).spawn().expect("spawn istio-nftables")))
        .collect();
    children
        .into_iter()
        .map(|(op, c)| (op, c.wait_with_output().expect("wait istio-nftables")))
        .collect()
}

fn run(ns: &Path, op: Op) -> Output {
    command(ns, op).output().expect("run istio-nftables")
}

/// What of ours a namespace holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Untouched,
    Complete(Backend),
    /// Our rules of one kind, but CHECK reports these differences.
    Partial(Backend, String),
    Mixed,
}

/// Reads the state once nobody holds the namespace's lock (a call still running, or a child
/// of a killed call still committing, would hold it).
fn state(ns: &Path) -> State {
    drop(
        NsLock::path(ns, Instant::now() + LOCK_FREE_WITHIN)
            .expect("the namespace's lock is not left held"),
    );
    let (legacy, nft) = netns::run_in(Some(ns), || {
        (
            iptables_legacy::has_our_chains(&iptables_legacy::Tools::default())
                .expect("legacy state"),
            nft_backend::has_our_tables().expect("nft state"),
        )
    })
    .unwrap();
    let backend = match (legacy, nft) {
        (false, false) => return State::Untouched,
        (true, true) => return State::Mixed,
        (true, false) => Backend::IptablesLegacy,
        (false, true) => Backend::Nft,
    };
    let out = run(ns, Op::Check(backend));
    match out.status.code() {
        Some(0) => State::Complete(backend),
        Some(1) if !out.stdout.is_empty() => {
            State::Partial(backend, String::from_utf8_lossy(&out.stdout).into_owned())
        }
        _ => panic!("CHECK failed: {}", describe(&out)),
    }
}

fn describe(out: &Output) -> String {
    format!(
        "{}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    )
}

/// Tally of one scenario: calls, failures (with the first message), rounds ending well.
#[derive(Default)]
struct Tally {
    calls: usize,
    failed: Vec<String>,
    rounds: usize,
    good_rounds: usize,
    bad_states: Vec<String>,
    /// Wall time of the longest round: the last call's wait for the lock, against
    /// `redirect::DEFAULT_LOCK_WAIT`.
    slowest: Duration,
}

impl Tally {
    /// Runs `ops` at once on `ns` and counts them.
    fn run_all(&mut self, ns: &Path, ops: &[Op]) {
        let t = Instant::now();
        let outs = run_all(ns, ops);
        self.slowest = self.slowest.max(t.elapsed());
        self.calls(&outs);
    }

    fn calls(&mut self, outs: &[(Op, Output)]) {
        self.calls += outs.len();
        for (op, out) in outs {
            if !out.status.success() {
                self.failed.push(format!("{op:?}: {}", describe(out)));
            }
        }
    }

    fn round(&mut self, ok: bool, st: &State) {
        self.rounds += 1;
        if ok {
            self.good_rounds += 1;
        } else {
            self.bad_states.push(format!("{st:?}"));
        }
    }

    fn report(&self, label: &str, end_state: &str) {
        println!(
            "{label}: {} calls, {} failed, end state {end_state} in {}/{} rounds \
             (slowest round {:.1?})",
            self.calls,
            self.failed.len(),
            self.good_rounds,
            self.rounds,
            self.slowest
        );
        assert!(
            self.failed.is_empty() && self.bad_states.is_empty(),
            "{label}: {} failed calls (first: {:?}); bad end states: {:?}",
            self.failed.len(),
            self.failed.first(),
            self.bad_states
        );
    }
}

/// `rounds` × all of `ops` at once on a fresh namespace; the end state must be one backend's
/// complete rules (the backend of the last ADD to run, whichever that was).
fn parallel_adds(label: &str, ops: &[Op], rounds: usize) {
    require_root();
    let mut t = Tally::default();
    for _ in 0..rounds {
        let ns = TestNetns::with_prefix("tpa").unwrap();
        t.run_all(ns.path(), ops);
        let st = state(ns.path());
        let backend_ok = |b: Backend| ops.iter().any(|o| matches!(o, Op::Add(x) if *x == b));
        t.round(matches!(st, State::Complete(b) if backend_ok(b)), &st);
    }
    t.report(label, "complete");
}

fn many(n: usize, op: Op) -> Vec<Op> {
    vec![op; n]
}

#[test]
fn parallel_add_legacy() {
    parallel_adds(
        "legacy parallel ADD",
        &many(50, Op::Add(Backend::IptablesLegacy)),
        5,
    );
}

#[test]
fn parallel_add_nft() {
    parallel_adds("nft parallel ADD", &many(50, Op::Add(Backend::Nft)), 5);
}

#[test]
fn parallel_add_nft_and_legacy_mixed() {
    let ops: Vec<Op> = (0..10)
        .map(|i| {
            Op::Add(if i % 2 == 0 {
                Backend::Nft
            } else {
                Backend::IptablesLegacy
            })
        })
        .collect();
    parallel_adds("5 nft + 5 legacy parallel ADD", &ops, 10);
}

#[test]
fn parallel_del() {
    require_root();
    let mut t = Tally::default();
    for backend in [Backend::IptablesLegacy, Backend::Nft] {
        let ns = TestNetns::with_prefix("tpd").unwrap();
        let add = run(ns.path(), Op::Add(backend));
        assert!(add.status.success(), "setup ADD: {}", describe(&add));
        t.run_all(ns.path(), &many(100, Op::Del));
        let st = state(ns.path());
        t.round(st == State::Untouched, &st);
    }
    t.report("parallel DEL (100 per backend)", "clean");
}

#[test]
fn parallel_add_and_del_interleaved() {
    require_root();
    let ops: Vec<Op> = (0..30)
        .map(|i| match i % 3 {
            0 => Op::Add(Backend::Nft),
            1 => Op::Del,
            _ => Op::Add(Backend::IptablesLegacy),
        })
        .collect();
    let mut t = Tally::default();
    for _ in 0..5 {
        let ns = TestNetns::with_prefix("tpi").unwrap();
        t.run_all(ns.path(), &ops);
        let st = state(ns.path());
        t.round(matches!(st, State::Untouched | State::Complete(_)), &st);
    }
    t.report(
        "interleaved ADD/DEL (10 nft + 10 legacy ADD + 10 DEL)",
        "clean or complete",
    );
}

/// A fresh namespace, holding `before`'s complete rules if given.
fn fresh(before: Option<Backend>) -> TestNetns {
    let ns = TestNetns::with_prefix("tk").unwrap();
    if let Some(b) = before {
        let out = run(ns.path(), Op::Add(b));
        assert!(out.status.success(), "setup ADD: {}", describe(&out));
    }
    ns
}

/// Median wall time of an uncontended ADD (spawn to exit).
fn typical_add(before: Option<Backend>, backend: Backend) -> Duration {
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let ns = fresh(before);
            let t = Instant::now();
            let out = run(ns.path(), Op::Add(backend));
            assert!(out.status.success(), "{}", describe(&out));
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// The one partial state an nft ADD may leave: its batch committed, the ::6 address for the
/// IPv6 inbound passthrough not yet added.
fn only_passthrough_address_missing(drift: &str) -> bool {
    drift.lines().all(|l| l.contains("::6"))
}

/// What a killed ADD of `backend` (over `before`'s rules) may leave, named for the summary;
/// `None` for anything else (both kinds, or a half state we do not document).
fn kill_outcome(st: &State, before: Option<Backend>, backend: Backend) -> Option<&'static str> {
    Some(match st {
        State::Untouched if before.is_none() => "untouched",
        State::Untouched => "empty (old removed, new not yet)",
        State::Complete(b) if *b == backend => "complete",
        State::Complete(b) if Some(*b) == before => "old rules kept",
        // The documented partial states (iptables-legacy's crate docs): rules complete but
        // `::6` not yet on lo (either backend), or IPv4 only (legacy, killed between the
        // families; the routes come last, so `::6` is missing too).
        State::Partial(b, drift) if *b == backend && only_passthrough_address_missing(drift) => {
            "half (rules complete, ::6 missing)"
        }
        State::Partial(Backend::IptablesLegacy, drift)
            if backend == Backend::IptablesLegacy
                && drift
                    .lines()
                    .all(|l| l.starts_with("IPv6 ") || l.contains("::6")) =>
        {
            "half (IPv4 only)"
        }
        // Removing the old legacy rules is one restore per family, too.
        State::Partial(Backend::IptablesLegacy, _) if before == Some(Backend::IptablesLegacy) => {
            "old rules half removed"
        }
        _ => return None,
    })
}

/// `kills` ADDs into fresh dual-stack namespaces (holding `before`'s rules if given), each
/// SIGKILLed after a random delay between 0 and the typical ADD duration (seeded, so a
/// failure can be replayed). Every state but "untouched", "old rules kept" and "complete"
/// must be drift for CHECK and repaired by the next ADD.
fn sigkill(label: &str, before: Option<Backend>, backend: Backend, kills: usize, seed: u64) {
    require_root();
    let typical = typical_add(before, backend);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for i in 0..kills {
        let ns = fresh(before);
        let delay = Duration::from_micros(rng.u64(0..=typical.as_micros() as u64));
        let mut child = command(ns.path(), Op::Add(backend)).spawn().unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let st = state(ns.path());
        let at = format!("{label}: kill {i} after {delay:?} (seed {seed})");
        let outcome =
            kill_outcome(&st, before, backend).unwrap_or_else(|| panic!("{at}: left {st:?}"));
        *counts.entry(outcome).or_default() += 1;
        if matches!(st, State::Partial(..)) || (before.is_some() && st == State::Untouched) {
            // CHECK said drift (state() ran it); the next ADD must repair.
            let add = run(ns.path(), Op::Add(backend));
            assert!(add.status.success(), "{at}: repair ADD: {}", describe(&add));
            assert_eq!(
                state(ns.path()),
                State::Complete(backend),
                "{at}: ADD did not repair {st:?}"
            );
        }
    }
    let tally: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "{label}: {kills} kills within {typical:.0?} of start: {} (every partial state \
         reported by CHECK and repaired by ADD)",
        tally.join(", ")
    );
}

#[test]
fn sigkill_during_add_legacy() {
    sigkill(
        "SIGKILL legacy",
        None,
        Backend::IptablesLegacy,
        100,
        0x11_0002,
    );
}

#[test]
fn sigkill_during_add_nft() {
    sigkill("SIGKILL nft", None, Backend::Nft, 100, 0x11_0003);
}

/// Kills while an ADD switches backends: the old kind goes before the new one comes, so
/// both kinds never coexist, whenever the kill lands.
#[test]
fn sigkill_during_backend_switch() {
    sigkill(
        "SIGKILL nft ADD over legacy rules",
        Some(Backend::IptablesLegacy),
        Backend::Nft,
        50,
        0x11_0004,
    );
    sigkill(
        "SIGKILL legacy ADD over nft rules",
        Some(Backend::Nft),
        Backend::IptablesLegacy,
        50,
        0x11_0005,
    );
}

/// A wrapper `iptables-legacy-restore` (first on PATH) that, for a committing call, leaves a
/// mark and waits before running the real one: time to SIGKILL the CLI while its IPv4
/// restore is under way.
fn slow_restore_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let real = iptables_legacy::Tools::default()
        .find("iptables-legacy-restore")
        .unwrap();
    // 1 s: ample time for the test to see the mark and kill the CLI before the real restore
    // even starts, also on a loaded machine.
    let script = format!(
        "#!/bin/sh\n\
         case \" $* \" in *' --test '*) ;; *) touch \"$RESTORE_MARK\"; sleep 1;; esac\n\
         exec {} \"$@\"\n",
        real.display()
    );
    let path = dir.path().join("iptables-legacy-restore");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Killing our process must not let anyone read (or change) the namespace while a restore it
/// already started is still committing: the child keeps the lock until it is done.
#[test]
fn a_killed_add_keeps_the_lock_until_its_restore_has_committed() {
    require_root();
    let bin = slow_restore_dir();
    let ns = TestNetns::with_prefix("tko").unwrap();
    let mark = bin.path().join("mark");
    let path = format!("{}:/usr/sbin:/sbin:/usr/bin:/bin", bin.path().display());
    let mut child = command(ns.path(), Op::Add(Backend::IptablesLegacy))
        .env("PATH", path)
        .env("RESTORE_MARK", &mark)
        .spawn()
        .unwrap();
    assert!(
        node::wait_until(LOCK_FREE_WITHIN, || mark.exists()),
        "the IPv4 restore never started"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The first look, as soon as the lock is free, must already be the final state: IPv4
    // committed by the orphaned restore, IPv6 never started.
    let first = state(ns.path());
    // Longer than the wrapper's delay: an orphaned restore would have committed by now.
    std::thread::sleep(Duration::from_millis(1500));
    let later = state(ns.path());
    assert_eq!(
        first, later,
        "the namespace changed after its lock was free"
    );
    let State::Partial(Backend::IptablesLegacy, drift) = &first else {
        panic!("expected IPv4 rules only, found {first:?}");
    };
    assert!(drift.contains("IPv6"), "{drift}");
    assert!(!drift.contains("IPv4"), "{drift}");
    let add = run(ns.path(), Op::Add(Backend::IptablesLegacy));
    assert!(add.status.success(), "repair: {}", describe(&add));
    assert_eq!(state(ns.path()), State::Complete(Backend::IptablesLegacy));
}

/// The state a kill between the nft batch and the routes leaves (tables in place, `::6` not
/// yet on lo) is drift for CHECK, and ADD repairs it.
#[test]
fn missing_passthrough_address_is_drift_for_both_backends() {
    require_root();
    for backend in [Backend::Nft, Backend::IptablesLegacy] {
        let ns = TestNetns::with_prefix("t6").unwrap();
        let add = run(ns.path(), Op::Add(backend));
        assert!(add.status.success(), "{}", describe(&add));
        assert_eq!(state(ns.path()), State::Complete(backend));
        ns.exec_ok("ip", &["addr", "del", "::6/128", "dev", "lo"])
            .unwrap();
        let st = state(ns.path());
        assert!(
            matches!(&st, State::Partial(b, d) if *b == backend && only_passthrough_address_missing(d)),
            "{backend}: {st:?}"
        );
        let add = run(ns.path(), Op::Add(backend));
        assert!(add.status.success(), "{}", describe(&add));
        assert_eq!(state(ns.path()), State::Complete(backend));
    }
}

/// A call that cannot get the lock gives up at its deadline, naming the namespace and the
/// process holding it, and changes nothing.
#[test]
fn lock_wait_is_bounded_and_names_the_namespace() {
    require_root();
    let ns = TestNetns::with_prefix("tlw").unwrap();
    let plan = capture::Plan::build(
        &capture::Config {
            ipv6: capture::Ipv6Mode::On,
            ..capture::Config::cni_default()
        },
        &capture::Facts::default(),
    )
    .unwrap();
    let held = NsLock::path(ns.path(), Instant::now() + LOCK_FREE_WITHIN).unwrap();
    let t = Instant::now();
    let deadline = t + Duration::from_millis(300);
    let err = redirect::apply_until(
        &plan,
        Some(ns.path()),
        redirect::BackendChoice::Fixed(Backend::Nft),
        deadline,
    )
    .unwrap_err()
    .to_string();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert!(err.contains(&ns.path().display().to_string()), "{err}");
    assert!(
        err.contains(&format!("held by pid {}", std::process::id())),
        "{err}"
    );
    for r in [
        redirect::check_until(
            &plan,
            Some(ns.path()),
            redirect::BackendChoice::Auto,
            deadline,
        )
        .map(drop),
        redirect::cleanup_until(Some(ns.path()), deadline),
    ] {
        assert!(r.is_err(), "{r:?}");
    }
    // Without a path (the CLI in its own namespace) the caller's namespace is the one locked.
    let err = ns
        .run(|| redirect::cleanup_until(None, Instant::now() + Duration::from_millis(100)))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(err.contains("current namespace"), "{err}");
    drop(held);
    assert_eq!(state(ns.path()), State::Untouched);
}

/// ADD (or with `check`, CHECK) in TPROXY mode.
fn tproxy(ns: &Path, backend: Backend, check: bool) -> Output {
    let flags: Vec<&str> = add_flags()
        .into_iter()
        .map(|f| if f == "REDIRECT" { "TPROXY" } else { f })
        .collect();
    let mut c = cli_in(ns);
    c.args(flags).args(["--backend", &backend.to_string()]);
    if check {
        c.arg("--check");
    }
    c.output().unwrap()
}

/// TPROXY's policy rule and local route come after the rules, so a kill can land between:
/// CHECK reads them back, ADD repairs them, and re-applying never piles up duplicate rules.
#[test]
fn tproxy_routes_are_checked_repaired_and_not_duplicated() {
    require_root();
    for backend in [Backend::Nft, Backend::IptablesLegacy] {
        let ns = TestNetns::with_prefix("ttp").unwrap();
        let p = ns.path();
        for _ in 0..3 {
            let add = tproxy(p, backend, false);
            assert!(add.status.success(), "{backend}: {}", describe(&add));
        }
        for fam in ["-4", "-6"] {
            let rules = ns.exec_ok("ip", &[fam, "rule"]).unwrap();
            assert_eq!(
                rules.matches("fwmark 0x539 lookup 133").count(),
                1,
                "{backend} {fam}: {rules}"
            );
        }
        assert!(tproxy(p, backend, true).status.success());
        ns.exec_ok(
            "ip",
            &["-4", "rule", "del", "fwmark", "0x539", "lookup", "133"],
        )
        .unwrap();
        ns.exec_ok(
            "ip",
            &[
                "-6", "route", "del", "local", "default", "dev", "lo", "table", "133",
            ],
        )
        .unwrap();
        let check = tproxy(p, backend, true);
        let drift = String::from_utf8_lossy(&check.stdout);
        assert_eq!(
            check.status.code(),
            Some(1),
            "{backend}: {}",
            describe(&check)
        );
        assert!(drift.contains("IPv4: missing policy rule"), "{drift}");
        assert!(drift.contains("IPv6: missing route"), "{drift}");
        let add = tproxy(p, backend, false);
        assert!(add.status.success(), "{backend}: {}", describe(&add));
        let check = tproxy(p, backend, true);
        assert!(check.status.success(), "{backend}: {}", describe(&check));
    }
}
