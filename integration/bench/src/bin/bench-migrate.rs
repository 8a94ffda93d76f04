//! Live-migration benchmark (issue 13, item 2): the time `redirect::migrate` takes to move one
//! pod's default sidecar rules (dual stack) from iptables-legacy to nft and back, lock hold,
//! program, read-back, removal and final verification included. Every sample uses a new pod
//! namespace, set up outside the timing.
//!
//! Usage: `bench-migrate [samples]` — prints a Markdown table.

use capture::{Config, Ipv6Mode, Plan};
use redirect::{Backend, BackendChoice};
use std::time::{Duration, Instant};
use testbed::PodWorld;
use testbed::cni::percentile;

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn timed_migration(w: &PodWorld, plan: &Plan, to: Backend) -> Duration {
    let start = Instant::now();
    let m = redirect::migrate(
        plan,
        Some(w.pod.path()),
        to,
        start + Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("migrating to {to}: {e}"));
    let took = start.elapsed();
    assert!(m.changed, "{m}");
    took
}

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("samples: a number"))
        .unwrap_or(50);
    let cfg = Config {
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    };
    let (mut to_nft, mut to_legacy) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let w = PodWorld::new().expect("pod namespace");
        let facts = redirect::read_facts(Some(w.pod.path()), None).expect("facts");
        let plan = Plan::build(&cfg, &facts).expect("plan");
        let legacy = BackendChoice::Fixed(Backend::IptablesLegacy);
        redirect::apply(&plan, Some(w.pod.path()), legacy).expect("legacy rules");
        to_nft.push(timed_migration(&w, &plan, Backend::Nft));
        to_legacy.push(timed_migration(&w, &plan, Backend::IptablesLegacy));
    }
    println!("| migration of one pod ({samples} pods) | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|");
    for (label, mut v) in [
        ("iptables-legacy → nft", to_nft),
        ("nft → iptables-legacy", to_legacy),
    ] {
        v.sort();
        println!(
            "| {label} | {} | {} | {} |",
            ms(percentile(&v, 0.5)),
            ms(percentile(&v, 0.99)),
            ms(v[v.len() - 1])
        );
    }
}
