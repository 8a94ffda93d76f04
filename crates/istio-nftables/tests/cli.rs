//! The `istio-nftables` binary end to end, against real namespaces.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use testbed::{TestNetns, require_root};

use common::CLI;
/// The CNI default sidecar flags.
use testbed::CNI_DEFAULT_FLAGS as DEFAULT;

fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(CLI.as_str());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ruleset(ns: &TestNetns) -> String {
    ns.exec_ok("nft", &["list", "ruleset"]).unwrap()
}

/// Flags, env vars, the name the error must mention, and the bad value.
type BadInput<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str, &'a str);

#[test]
fn bad_values_exit_2_naming_the_flag_and_the_namespace_stays_untouched() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let path = ns.path().to_str().unwrap().to_string();
    let cases: Vec<BadInput> = vec![
        (vec!["-p", "abc"], vec![], "--envoy-port", "abc"),
        (
            vec!["-z", "70000"],
            vec![],
            "--inbound-capture-port",
            "70000",
        ),
        (
            vec![],
            vec![("INBOUND_TUNNEL_PORT", "x1")],
            "--inbound-tunnel-port",
            "x1",
        ),
        (vec!["-e", "0"], vec![], "--inbound-tunnel-port", "0"),
        (
            vec!["-b", "80,http"],
            vec![],
            "--istio-inbound-ports",
            "http",
        ),
        (
            vec!["-d", "8o"],
            vec![],
            "--istio-local-exclude-ports",
            "8o",
        ),
        (
            vec!["-i", "10.0.0.0/33"],
            vec![],
            "--istio-service-cidr",
            "10.0.0.0/33",
        ),
        (vec!["-x", "*"], vec![], "--istio-service-exclude-cidr", "*"),
        (
            vec!["-q", "99999"],
            vec![],
            "--istio-outbound-ports",
            "99999",
        ),
        (
            vec!["-o", "a"],
            vec![],
            "--istio-local-outbound-ports-exclude",
            "a",
        ),
        (
            vec!["-c", "bad/name"],
            vec![],
            "--istio-exclude-interfaces",
            "bad/name",
        ),
        (
            vec!["-k", "waytoolonginterfacename"],
            vec![],
            "--kube-virt-interfaces",
            "waytoolonginterfacename",
        ),
        (
            vec!["-u", "no-such-user"],
            vec![],
            "--proxy-uid",
            "no-such-user",
        ),
        (
            vec!["-g", "no-such-group"],
            vec![],
            "--proxy-gid",
            "no-such-group",
        ),
        // (gid_t)-1: accepted by nft, refused by iptables' owner match (outside audit).
        (
            vec!["-g", "1337,4294967295"],
            vec![],
            "--proxy-gid",
            "4294967295",
        ),
        (
            vec!["-t", "mark"],
            vec![],
            "--istio-inbound-tproxy-mark",
            "mark",
        ),
        (
            vec!["-r", "t5"],
            vec![],
            "--istio-inbound-tproxy-route-table",
            "t5",
        ),
        (
            vec!["--redirect-dns=maybe"],
            vec![],
            "--redirect-dns",
            "maybe",
        ),
        (
            vec![],
            vec![("INVALID_DROP", "yes please")],
            "--drop-invalid",
            "yes please",
        ),
        (
            vec!["--probe-timeout", "soon"],
            vec![],
            "--probe-timeout",
            "soon",
        ),
        (
            vec!["--iptables-probe-port", "0"],
            vec![],
            "--iptables-probe-port",
            "0",
        ),
        (vec!["--ipv6", "maybe"], vec![], "--ipv6", "maybe"),
        (
            vec!["--dns-servers", "10.0.0.300"],
            vec![],
            "--dns-servers",
            "10.0.0.300",
        ),
        (vec!["--backend", "pf"], vec![], "--backend", "pf"),
        (
            vec!["--force-iptables-binary", "bpf"],
            vec![],
            "--force-iptables-binary",
            "bpf",
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/8")],
            "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
            "10.0.0.1/8",
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS", "no-such-group")],
            "ISTIO_OUTBOUND_OWNER_GROUPS",
            "no-such-group",
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "1,x y")],
            "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
            "x y",
        ),
    ];
    for (args, env, flag, value) in cases {
        let mut all = vec!["--network-namespace", path.as_str(), "--ipv6", "off"];
        all.extend(DEFAULT);
        all.extend(&args);
        let out = cli(&all, &env);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(
            err.contains(flag) && err.contains(value),
            "{args:?} {env:?}: message must name {flag} and {value:?}: {err}"
        );
        assert_eq!(
            ruleset(&ns).trim(),
            "",
            "{args:?}: nothing may be programmed"
        );
    }
    // A namespace that does not exist is a usage error too.
    let out = cli(
        &["--network-namespace", "/var/run/netns/does-not-exist"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--network-namespace"));
}

#[test]
fn dry_run_prints_rules_that_nft_accepts_and_touches_nothing() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let path = ns.path().to_str().unwrap();
    let mut args = vec![
        "--dry-run",
        "--network-namespace",
        path,
        "--ipv6",
        "on",
        "--redirect-dns",
        "--capture-all-dns",
        "-x",
        "10.0.0.0/8,192.168.0.0/16",
    ];
    args.extend(DEFAULT);
    let out = cli(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("table inet istio-proxy-nat") && text.contains("redirect to :15001"),
        "{text}"
    );
    assert_eq!(ruleset(&ns).trim(), "");
    // `nft -c -f -` parses and validates the text without applying it.
    let mut nft = Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "-c", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    nft.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let res = nft.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "nft rejected the dry-run output: {}\n{text}",
        String::from_utf8_lossy(&res.stderr)
    );

    let legacy = cli(
        &[
            &["--dry-run", "--ipv6", "off", "--backend", "iptables-legacy"][..],
            &DEFAULT,
        ]
        .concat(),
        &[],
    );
    let payload = String::from_utf8(legacy.stdout).unwrap();
    assert!(
        payload.starts_with("* nat\n")
            && payload.contains("-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001"),
        "{payload}"
    );
}

/// The CLI reads the namespace's addresses and resolv.conf only when the flags leave them
/// open (`--ipv6 auto`; DNS capture without `--capture-all-dns` or `--dns-servers`): then the
/// plan still follows them.
#[test]
fn facts_left_open_by_the_flags_are_read_from_the_namespace() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let path = ns.path().to_str().unwrap();
    ns.exec_ok("ip", &["addr", "add", "fd00:7::5/64", "dev", "lo"])
        .unwrap();
    let dry = |args: &[&str]| {
        let out = cli(
            &[
                &["--dry-run", "--network-namespace", path][..],
                args,
                &DEFAULT,
            ]
            .concat(),
            &[],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    // Its only global address is IPv6: auto turns IPv6 on, as the address says.
    assert!(dry(&["--ipv6", "auto"]).contains("ip6 daddr"));
    assert!(!dry(&["--ipv6", "off"]).contains("ip6 daddr"));
    // DNS capture of resolv.conf's servers: each nameserver of the host's /etc/resolv.conf.
    let servers = capture::parse_resolv_conf(&std::fs::read_to_string("/etc/resolv.conf").unwrap());
    let v4: Vec<_> = servers.iter().filter(|a| a.is_ipv4()).collect();
    assert!(
        !v4.is_empty(),
        "this test needs an IPv4 nameserver in /etc/resolv.conf"
    );
    let dns = dry(&["--ipv6", "off", "--redirect-dns"]);
    for a in v4 {
        assert!(dns.contains(&a.to_string()), "{a} missing:\n{dns}");
    }
    assert!(dns.contains("redirect to :15053"), "{dns}");
}

#[test]
fn flags_win_over_env_which_wins_over_defaults() {
    let dry = |args: &[&str], env: &[(&str, &str)]| {
        let out = cli(
            &[&["--dry-run", "--ipv6", "off", "-b", "*"][..], args].concat(),
            env,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(dry(&[], &[]).contains("redirect to :15006"));
    assert!(dry(&[], &[("INBOUND_CAPTURE_PORT", "16000")]).contains("redirect to :16000"));
    assert!(
        dry(&["-z", "17000"], &[("INBOUND_CAPTURE_PORT", "16000")]).contains("redirect to :17000")
    );
    // Env aliases istio-iptables honours.
    assert!(
        dry(
            &[],
            &[
                ("ISTIO_META_DNS_CAPTURE", "true"),
                ("CAPTURE_ALL_DNS", "true")
            ]
        )
        .contains("redirect to :15053")
    );
}

#[test]
fn apply_check_and_cleanup_a_namespace() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let path = ns.path().to_str().unwrap();
    let base = [
        &["--network-namespace", path, "--ipv6", "off"][..],
        &DEFAULT,
    ]
    .concat();
    let out = cli(&base, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(ruleset(&ns).contains("redirect to :15001"));
    let check = cli(&[&base[..], &["--check"]].concat(), &[]);
    assert!(check.status.success(), "{}", stderr(&check));

    ns.exec_ok(
        "nft",
        &["flush chain inet istio-proxy-nat istio-in-redirect"],
    )
    .unwrap();
    let drift = cli(&[&base[..], &["--check"]].concat(), &[]);
    assert_eq!(drift.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&drift.stdout).contains("redirect to :15006"),
        "{drift:?}"
    );

    // Re-running repairs it (atomic replace), then cleanup removes only our tables.
    assert!(cli(&base, &[]).status.success());
    assert!(
        cli(&[&base[..], &["--check"]].concat(), &[])
            .status
            .success()
    );
    ns.exec_ok("nft", &["add table ip keep-me"]).unwrap();
    let clean = cli(&["--network-namespace", path, "--cleanup-only"], &[]);
    assert!(clean.status.success(), "{}", stderr(&clean));
    let left = ruleset(&ns);
    assert!(
        !left.contains("istio") && left.contains("keep-me"),
        "{left}"
    );
}

#[test]
fn the_binary_is_fully_static() {
    // Runs on any node OS: no dynamic loader, no libc/libnftnl/libmnl of ours expected there.
    let out = Command::new("readelf")
        .args(["-d", CLI.as_str()])
        .output()
        .expect("readelf (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("(NEEDED)"),
        "istio-nftables has dynamic dependencies:\n{text}"
    );
    let interp = Command::new("readelf")
        .args(["-l", CLI.as_str()])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&interp.stdout).contains("Requesting program interpreter"),
        "istio-nftables needs a dynamic loader"
    );
}

/// A path naming the CLI's own namespace (a /proc link or a bind mount of it) is refused unless
/// `--allow-current-namespace` asks for it; run inside a test namespace so that "own" is safe.
#[test]
fn own_namespace_needs_an_explicit_opt_in() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let bind = ns.path().to_str().unwrap().to_string();
    let in_ns = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        ns.run(move || Command::new(CLI.as_str()).args(&args).output().unwrap())
            .unwrap()
    };
    for target in [
        "/proc/self/ns/net",
        "/proc/thread-self/ns/net",
        bind.as_str(),
    ] {
        let mut args = vec!["--network-namespace", target, "--ipv6", "off"];
        args.extend(DEFAULT);
        let out = in_ns(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{target}: {err}");
        assert!(
            err.contains("--network-namespace") && err.contains(target) && err.contains("own"),
            "{target}: {err}"
        );
        assert_eq!(
            ruleset(&ns).trim(),
            "",
            "{target}: nothing may be programmed"
        );
    }
    for (target, why) in [
        ("/proc/self/ns/mnt", "not a network namespace"),
        ("/etc/hostname", "not a network namespace"),
    ] {
        let out = in_ns(&["--network-namespace", target]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{target}: {err}");
        assert!(err.contains(why), "{target}: {err}");
    }
    let mut args = vec![
        "--network-namespace",
        bind.as_str(),
        "--allow-current-namespace",
        "--ipv6",
        "off",
    ];
    args.extend(DEFAULT);
    let out = in_ns(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !ruleset(&ns).trim().is_empty(),
        "the opt-in programs the namespace"
    );
}

/// `--help` lists the commands as commands (clap's `Commands:` section), beside istio-iptables'
/// flags; a command after a flag is refused, so it never runs the plain command instead.
#[test]
fn help_lists_the_commands_and_a_command_comes_first() {
    let out = cli(&["--help"], &[]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", common::text(&out));
    let commands = help
        .split("\nCommands:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap_or_else(|| panic!("no Commands: section in\n{help}"));
    let names: Vec<&str> = commands
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for name in ["explain", "migrate"] {
        assert!(names.contains(&name), "{name} not in {names:?}\n{help}");
    }
    for flag in [
        "--envoy-port",
        "--istio-service-cidr",
        "--check",
        "--dry-run",
    ] {
        assert!(help.contains(flag), "{flag} missing from\n{help}");
    }
    for name in ["explain", "migrate"] {
        let out = cli(&[name, "--help"], &[]);
        let usage = format!("Usage: istio-nftables {name}");
        assert!(out.status.success(), "{}", common::text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&usage),
            "{}",
            common::text(&out)
        );
        let out = cli(&["-p", "15001", name], &[]);
        assert_eq!(out.status.code(), Some(2), "{}", common::text(&out));
    }
}
