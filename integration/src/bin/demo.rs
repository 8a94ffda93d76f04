//! The README's main job: a demo pod namespace programmed by `istio-nftables` (the CNI
//! default sidecar rules), the `nft list ruleset` a node admin sees in it, and real
//! connections showing where traffic lands.
//!
//! Usage: `demo <path to istio-nftables>` (the quick-start script builds it first).

use integration::*;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let Some(cli) = std::env::args().nth(1) else {
        eprintln!("usage: demo <path to istio-nftables>");
        return ExitCode::from(2);
    };
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: &str) -> Result<bool, Box<dyn std::error::Error>> {
    require_root();
    let w = PodWorld::ipv4_only()?;
    // The CNI plugin's default for a sidecar pod (istio-reference §1.6b).
    let args = [
        "--network-namespace",
        w.pod.path().to_str().unwrap(),
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-g",
        "1337",
        "-m",
        "REDIRECT",
        "-i",
        "*",
        "-b",
        "*",
        "-d",
        "15090,15021,15020",
        "-o",
        "15020",
        "--ipv6",
        "off",
        "--backend",
        "nft",
    ];
    println!(
        "== pod namespace {} (eth0 {}), world namespace {} ({})",
        w.pod.name(),
        w.pod_v4,
        w.world.name(),
        w.world_v4
    );
    println!("== istio-nftables {}", args.join(" "));
    let out = Command::new(cli).args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "istio-nftables failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    println!("\n== nft list ruleset (inside the pod namespace)\n");
    print!("{}", w.pod.exec_ok("nft", &["list", "ruleset"])?);

    let _sidecar = Probe::sidecar(w.pod.path())?;
    let _world = Probe::world(w.world.path())?;
    let (pod, world) = (IpAddr::V4(w.pod_v4), IpAddr::V4(w.world_v4));
    let cases: Vec<(&str, &std::path::Path, ConnectSpec, Option<u16>)> = vec![
        (
            "app (uid 1000) -> world:80",
            w.pod.path(),
            ConnectSpec::new(world, 80).uid(1000).gid(1000),
            Some(15001),
        ),
        (
            "world -> pod:8080",
            w.world.path(),
            ConnectSpec::new(pod, 8080),
            Some(15006),
        ),
        (
            "world -> pod:15021 (health)",
            w.world.path(),
            ConnectSpec::new(pod, 15021),
            Some(15021),
        ),
        (
            "envoy (uid 1337) -> world:80",
            w.pod.path(),
            ConnectSpec::new(world, 80).uid(1337).gid(1337),
            Some(80),
        ),
        (
            "app -> 127.0.0.1:8080",
            w.pod.path(),
            ConnectSpec::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080)
                .uid(1000)
                .gid(1000),
            Some(8080),
        ),
        (
            "validation probe (uid 1337) -> 127.0.0.6:15002",
            w.pod.path(),
            ConnectSpec::new("127.0.0.6".parse()?, 15002)
                .uid(1337)
                .gid(1337)
                .src(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            Some(15006),
        ),
    ];
    println!("\n== connections\n");
    println!("{:<48} {:<42} expected", "connection", "landed on");
    let mut ok = true;
    for (what, ns, spec, expect) in cases {
        let outcome = connect(ns, &spec);
        let good = outcome.landed_port() == expect;
        ok &= good;
        println!(
            "{what:<48} {:<42} {} {}",
            outcome.to_string(),
            expect.map(|p| p.to_string()).unwrap_or_default(),
            if good { "ok" } else { "MISMATCH" }
        );
    }
    println!(
        "\n{}",
        if ok {
            "all connections landed where Istio sends them"
        } else {
            "SOME CONNECTIONS LANDED ELSEWHERE"
        }
    );
    Ok(ok)
}
