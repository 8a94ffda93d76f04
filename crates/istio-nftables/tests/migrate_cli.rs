//! `istio-nftables migrate` end to end against real namespaces: legacy → nft → legacy with the
//! rules checked after each step, the no-op, a refused new program that leaves the old rules,
//! and bad input (exit 2 naming the argument, namespace untouched).

mod common;

use common::{CLI, text};
use redirect::Backend;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use testbed::{TestNetns, require_root};

/// The CNI default sidecar flags, dual stack.
fn pod() -> Vec<&'static str> {
    testbed::cni_default_flags_with_ipv6("on")
}

fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(CLI.as_str());
    c.args(args).env("LOG_LEVEL", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// `istio-nftables migrate --to TO --network-namespace NS <pod flags> <extra>`.
fn migrate(ns: &TestNetns, to: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let path = ns.path().to_str().unwrap();
    let mut args = vec!["migrate", "--to", to, "--network-namespace", path];
    args.extend(pod());
    args.extend(extra);
    cli(&args, env)
}

/// The plain command: program or check the pod's rules with one backend.
fn plain(ns: &TestNetns, backend: &str, extra: &[&str]) -> Output {
    let path = ns.path().to_str().unwrap();
    let mut args = vec!["--network-namespace", path, "--backend", backend];
    args.extend(pod());
    args.extend(extra);
    cli(&args, &[])
}

/// The backends whose rules of ours are in `ns` (legacy first).
fn kinds(ns: &Path) -> Vec<Backend> {
    netns::run_in(Some(ns), || {
        let mut k = Vec::new();
        if iptables_legacy::has_our_chains(&iptables_legacy::Tools::default()).unwrap() {
            k.push(Backend::IptablesLegacy);
        }
        if nft_backend::has_our_tables().unwrap() {
            k.push(Backend::Nft);
        }
        k
    })
    .unwrap()
}

fn assert_only(ns: &TestNetns, backend: &str, b: Backend) {
    assert_eq!(kinds(ns.path()), [b]);
    let o = plain(ns, backend, &["--check"]);
    assert_eq!(o.status.code(), Some(0), "check on {backend}: {}", text(&o));
}

#[test]
fn migrates_back_and_forth_and_reports_what_it_did() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let o = plain(&ns, "iptables-legacy", &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_only(&ns, "iptables-legacy", Backend::IptablesLegacy);

    let o = migrate(&ns, "nft", &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("migrated from iptables-legacy to nft"),
        "{}",
        text(&o)
    );
    assert_only(&ns, "nft", Backend::Nft);

    let o = migrate(&ns, "nft", &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("already on nft: nothing to do"),
        "{}",
        text(&o)
    );

    let o = migrate(&ns, "iptables-legacy", &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("migrated from nft to iptables-legacy"),
        "{}",
        text(&o)
    );
    assert_only(&ns, "iptables-legacy", Backend::IptablesLegacy);
}

#[test]
fn a_refused_new_program_exits_1_and_leaves_the_old_rules() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let o = plain(&ns, "nft", &[]);
    assert!(o.status.success(), "{}", text(&o));
    // An iptables-legacy-restore first on PATH that refuses every input.
    let dir = tempfile::tempdir().unwrap();
    for name in ["iptables-legacy-restore", "ip6tables-legacy-restore"] {
        let p = dir.path().join(name);
        std::fs::write(&p, "#!/bin/sh\necho 'refused by the test' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = migrate(&ns, "iptables-legacy", &[], &[("PATH", &path)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("programming failed") && err.contains("nft, unchanged"),
        "{}",
        text(&o)
    );
    assert_only(&ns, "nft", Backend::Nft);
}

#[test]
fn bad_input_exits_2_naming_the_argument_and_touches_nothing() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let o = plain(&ns, "iptables-legacy", &[]);
    assert!(o.status.success(), "{}", text(&o));
    let path = ns.path().to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["migrate", "--to", "ipvs", "--network-namespace", path],
            "--to",
        ),
        (vec!["migrate", "--network-namespace", path], "--to"),
        (vec!["migrate", "--to", "nft"], "--network-namespace"),
        (
            vec![
                "migrate",
                "--to",
                "nft",
                "--network-namespace",
                "/nonexistent/ns",
            ],
            "--network-namespace",
        ),
        (
            vec![
                "migrate",
                "--to",
                "nft",
                "--network-namespace",
                path,
                "-p",
                "abc",
            ],
            "--envoy-port",
        ),
        (
            vec![
                "migrate",
                "--to",
                "nft",
                "--network-namespace",
                path,
                "--check",
            ],
            "--check",
        ),
        (
            vec![
                "migrate",
                "--to",
                "nft",
                "--network-namespace",
                path,
                "--cleanup-only",
            ],
            "--cleanup-only",
        ),
        (
            vec![
                "migrate",
                "--to",
                "nft",
                "--network-namespace",
                path,
                "--backend",
                "iptables-legacy",
            ],
            "--backend",
        ),
    ];
    for (args, names) in cases {
        let o = cli(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(names),
            "{args:?} should name {names}: {}",
            text(&o)
        );
    }
    assert_only(&ns, "iptables-legacy", Backend::IptablesLegacy);
}
