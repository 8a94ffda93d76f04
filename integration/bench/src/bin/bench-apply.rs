//! Apply-latency benchmark (issue 2/3/7): the same default sidecar rules programmed into fresh
//! network namespaces by our CLI, by `nft -f` (Istio's nft rules), by iptables-legacy-restore
//! and iptables-nft-restore (Istio's payload), and in-process through the nft backend; plus
//! scaling with excluded CIDRs. Every sample uses a new namespace, created outside the timing.
//!
//! Usage: `bench-apply <istio-nftables> [samples]` — prints a Markdown table.

use capture::{Config, Facts, IpNet, Ipv6Mode, Plan};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::TestNetns;

fn pctl(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// Runs `program args` inside the namespace via nsenter with `input` on stdin; returns wall time.
fn timed(ns: &TestNetns, program: &str, args: &[&str], input: Option<&str>) -> Duration {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={}", ns.path().display()))
        .arg(program)
        .args(args);
    c.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = c.spawn().expect("spawn");
    if let Some(text) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let t = start.elapsed();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t
}

fn sample(n: usize, mut f: impl FnMut(&TestNetns) -> Duration) -> Vec<Duration> {
    (0..n)
        .map(|_| f(&TestNetns::with_prefix("bench").expect("netns")))
        .collect()
}

fn cidrs(n: u32) -> Vec<IpNet> {
    (0..n)
        .map(|i| IpNet::new(IpAddr::V4(Ipv4Addr::from(0x6400_0000 + (i << 8))), 24).unwrap())
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let cli = args
        .next()
        .expect("usage: bench-apply <istio-nftables> [samples]");
    let n: usize = args
        .next()
        .map(|s| s.parse().expect("samples"))
        .unwrap_or(50);
    testbed::require_root();

    let cfg = Config {
        ipv6: Ipv6Mode::Off,
        ..Config::cni_default()
    };
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    let nft_text = nft_backend::render_text(&plan);
    let payload = iptables_legacy::render_payload(&plan, false);
    // Istio's own nft rules for the CNI default (hand-derived from its run.go and validated by
    // loading; shipped with the reference data), if present.
    let istio_nft = std::fs::read_to_string(
        "../shared/golden/nftables/derived/cni-default-sidecar.DERIVED.nft",
    )
    .ok();
    let mut cli_args = testbed::cni_default_flags_with_ipv6("off");
    cli_args.extend(["--backend", "nft"]);

    let mut rows: Vec<(String, Vec<Duration>)> = Vec::new();
    rows.push((
        "nsenter + `true` (process start baseline)".into(),
        sample(n, |ns| timed(ns, "true", &[], None)),
    ));
    rows.push((
        "**istio-nftables** CLI (netlink batch)".into(),
        sample(n, |ns| timed(ns, &cli, &cli_args, None)),
    ));
    if let Some(text) = &istio_nft {
        rows.push((
            "`nft -f` of Istio's nft rules".into(),
            sample(n, |ns| timed(ns, "nft", &["-f", "-"], Some(text))),
        ));
    }
    rows.push((
        "`nft -f` of our rules (same ruleset as the CLI)".into(),
        sample(n, |ns| timed(ns, "nft", &["-f", "-"], Some(&nft_text))),
    ));
    rows.push((
        "`iptables-legacy-restore` of Istio's payload (= our legacy backend's payload)".into(),
        sample(n, |ns| {
            timed(
                ns,
                "iptables-legacy-restore",
                &["--noflush"],
                Some(&payload),
            )
        }),
    ));
    rows.push((
        "`iptables-nft-restore` of Istio's payload".into(),
        sample(n, |ns| {
            timed(ns, "iptables-nft-restore", &["--noflush"], Some(&payload))
        }),
    ));
    rows.push((
        "in-process nft backend (dump + build + send + ACKs)".into(),
        in_process(n, &plan),
    ));
    rows.push((
        "our iptables-legacy backend, in-process (`--test` pre-pass, then restore)".into(),
        sample(n, |ns| {
            netns::run_in(Some(ns.path()), || {
                let deadline = Instant::now() + Duration::from_secs(10);
                let held = netns::NsLock::current(&"bench namespace", deadline).expect("lock");
                let start = Instant::now();
                iptables_legacy::apply(&plan, &held, &iptables_legacy::Tools::default())
                    .expect("legacy apply");
                start.elapsed()
            })
            .unwrap()
        }),
    ));
    for count in [0u32, 100, 1_000, 10_000] {
        let cfg = Config {
            outbound_ranges_exclude: cidrs(count),
            ..cfg.clone()
        };
        let plan = Plan::build(&cfg, &Facts::default()).unwrap();
        let samples = if count >= 10_000 { n.min(15) } else { n };
        rows.push((
            format!("in-process apply, {count} excluded CIDRs (one interval set)"),
            in_process(samples, &plan),
        ));
    }

    println!("| what (fresh namespace per sample) | p50 ms | p90 ms | samples |");
    println!("|---|---:|---:|---:|");
    for (what, v) in &rows {
        println!(
            "| {what} | {} | {} | {} |",
            ms(pctl(v.clone(), 0.5)),
            ms(pctl(v.clone(), 0.9)),
            v.len()
        );
    }
    let p50 = |name: &str| {
        rows.iter()
            .find(|r| r.0.contains(name))
            .map(|r| pctl(r.1.clone(), 0.5).as_secs_f64())
    };
    if let (Some(ours), Some(theirs)) = (p50("istio-nftables"), p50("Istio's nft rules")) {
        println!(
            "\nCLI / `nft -f` (Istio's rules) = {:.2} (target ≤ 0.5)",
            ours / theirs
        );
    }
}

fn in_process(n: usize, plan: &Plan) -> Vec<Duration> {
    sample(n, |ns| {
        netns::run_in(Some(ns.path()), || {
            let start = Instant::now();
            nft_backend::apply(plan).expect("apply");
            start.elapsed()
        })
        .unwrap()
    })
}
