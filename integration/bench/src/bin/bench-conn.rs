//! Per-connection setup cost with many excluded CIDRs (issue 7): our interval set against
//! Istio-style linear rules (one rule per CIDR: `nft -f`, iptables-legacy-restore and
//! iptables-nft-restore of Istio's payload), each against the same method with no exclusions.
//!
//! Every connection's first packet walks the nat OUTPUT hook: past the owner checks and the
//! exclusions (none matches the destination) to the redirect to 15001. The client connects
//! from inside a pod namespace to 10.200.0.1:80; a listener on 15001 in the same namespace
//! accepts it (so success proves the redirect). `connect()` on this local path completes the
//! handshake inside the syscall, so its duration is the setup cost. Linger 0 (RST on close)
//! keeps TIME_WAIT and conntrack from piling up.
//!
//! Usage: bench-conn [connections per case] [excluded CIDRs] — prints a Markdown table of 0
//! against that many CIDRs. Each method is also measured along a sweep (0, 10, 100, 1000 and
//! that many CIDRs); with BENCH_SAMPLES_DIR set the sweep goes to `conn-cidrs.csv` for
//! bench-plot.

use bench::samples;
use capture::{Config, Facts, IpNet, Ipv6Mode, Plan};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::TestNetns;

const WARMUP: usize = 300;

fn cidrs(n: u32) -> Vec<IpNet> {
    (0..n)
        .map(|i| IpNet::new(IpAddr::V4(Ipv4Addr::from(0x6400_0000 + (i << 8))), 24).unwrap())
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    None,
    OursSets,
    NftLinear,
    LegacyLinear,
    IptablesNftLinear,
}

impl Method {
    fn label(self) -> &'static str {
        match self {
            Method::None => "no rules at all (reference)",
            Method::OursSets => "**ours**: nft, one interval set",
            Method::NftLinear => "Istio-style nft, one rule per CIDR (`nft -f`)",
            Method::LegacyLinear => "Istio iptables-legacy, one rule per CIDR",
            Method::IptablesNftLinear => "Istio iptables-nft, one rule per CIDR",
        }
    }

    /// The label in bench-plot's chart (no Markdown, no comma).
    fn chart_label(self) -> &'static str {
        match self {
            Method::None => "no rules at all (reference)",
            Method::OursSets => "ours: nft; one interval set",
            Method::NftLinear => "Istio-style nft; one rule per CIDR",
            Method::LegacyLinear => "Istio iptables-legacy; one rule per CIDR",
            Method::IptablesNftLinear => "Istio iptables-nft; one rule per CIDR",
        }
    }
}

fn plan(n: u32) -> Plan {
    let cfg = Config {
        ipv6: Ipv6Mode::Off,
        outbound_ranges_exclude: cidrs(n),
        ..Config::cni_default()
    };
    Plan::build(&cfg, &Facts::default()).unwrap()
}

/// `nft -f` text with the exclusion set unrolled into one rule per CIDR (Istio's nft mode).
fn nft_linear(plan: &Plan) -> String {
    let text = nft_backend::render_text(plan);
    let mut out = String::new();
    for line in text.lines() {
        if let (Some(a), Some(b)) = (line.find("ip daddr { "), line.find(" } counter return"))
            && line.contains("excluded outbound CIDR")
        {
            let (head, tail) = (&line[..a], &line[b + 3..]);
            for c in line[a + 11..b].split(", ") {
                out.push_str(&format!("{head}ip daddr {c} {tail}\n"));
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn feed(ns: &TestNetns, program: &str, args: &[&str], input: &str) {
    let out = ns
        .run(|| {
            let mut c = Command::new(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?;
            c.stdin.take().unwrap().write_all(input.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn program(ns: &TestNetns, m: Method, plan: &Plan) {
    match m {
        Method::None => {}
        Method::OursSets => {
            netns::run_in(Some(ns.path()), || nft_backend::apply(plan).map(drop))
                .unwrap()
                .unwrap();
        }
        Method::NftLinear => feed(ns, "nft", &["-f", "-"], &nft_linear(plan)),
        Method::LegacyLinear => feed(
            ns,
            "iptables-legacy-restore",
            &["--noflush"],
            &iptables_legacy::render_payload(plan, false),
        ),
        Method::IptablesNftLinear => feed(
            ns,
            "iptables-nft-restore",
            &["--noflush"],
            &iptables_legacy::render_payload(plan, false),
        ),
    }
}

fn set_linger0(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger struct for a valid socket.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// Connect times (µs) of `n` redirected connections in a fresh pod namespace.
fn measure(m: Method, plan: &Plan, n: usize) -> Vec<f64> {
    let ns = TestNetns::with_prefix("bconn").unwrap();
    ns.sh(
        "ip link add d0 type veth peer name d1 && ip addr add 10.200.0.2/24 dev d0 && ip link set d1 up && ip link set d0 up && \
         ip route add default via 10.200.0.1",
    )
    .unwrap();
    program(&ns, m, plan);
    // With no rules nothing redirects: connect to the listener directly (the reference).
    let dst: SocketAddr = if m == Method::None {
        "10.200.0.2:15001".parse().unwrap()
    } else {
        "10.200.0.1:80".parse().unwrap()
    };
    netns::run_in(Some(ns.path()), || {
        let l = TcpListener::bind("0.0.0.0:15001").unwrap();
        let mut v = Vec::with_capacity(n);
        for i in 0..WARMUP + n {
            let t0 = Instant::now();
            let c = TcpStream::connect_timeout(&dst, Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("{m:?}: connect {dst}: {e} (not redirected?)"));
            let dt = t0.elapsed();
            let (s, _) = l.accept().unwrap();
            set_linger0(&c);
            drop(c);
            drop(s);
            if i >= WARMUP {
                v.push(dt.as_secs_f64() * 1e6);
            }
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v
    })
    .unwrap()
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The CIDR counts of the sweep: powers of ten up to `k`, and `k`.
fn sweep(k: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [0, 10, 100, 1000].into_iter().filter(|&c| c < k).collect();
    v.push(k);
    v
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|s| s.parse().expect("count"))
        .unwrap_or(3000);
    let k: u32 = args
        .next()
        .map(|s| s.parse().expect("cidrs"))
        .unwrap_or(10_000);
    testbed::require_root();
    let counts = sweep(k);
    let plans: Vec<Plan> = counts.iter().map(|&c| plan(c)).collect();
    let reference = measure(Method::None, &plans[0], n);
    println!(
        "| connection setup, {n} connections each (connect() in a pod namespace, redirected to 15001) | 0 CIDRs p50 µs | {k} CIDRs p50 µs | {k} CIDRs p90 µs | ratio {k} / 0 |"
    );
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| {} | {:.1} | | | |",
        Method::None.label(),
        pct(&reference, 0.5)
    );
    let mut rows = vec![format!(
        "{},0,{:.2},{:.2}",
        Method::None.chart_label(),
        pct(&reference, 0.5),
        pct(&reference, 0.9)
    )];
    for m in [
        Method::OursSets,
        Method::NftLinear,
        Method::LegacyLinear,
        Method::IptablesNftLinear,
    ] {
        let each: Vec<Vec<f64>> = plans.iter().map(|p| measure(m, p, n)).collect();
        for (c, v) in counts.iter().zip(&each) {
            rows.push(format!(
                "{},{c},{:.2},{:.2}",
                m.chart_label(),
                pct(v, 0.5),
                pct(v, 0.9)
            ));
        }
        let (zero, many) = (&each[0], &each[each.len() - 1]);
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | **{:.2}×** |",
            m.label(),
            pct(zero, 0.5),
            pct(many, 0.5),
            pct(many, 0.9),
            pct(many, 0.5) / pct(zero, 0.5)
        );
    }
    samples::write("conn-cidrs.csv", "method,cidrs,p50_us,p90_us", rows);
}
