//! The node daemon's per-event costs, for docs/benchmarks.md's scale table (issue 22 item 4):
//! CPU and RSS of install-cni holding a node's pods in its one pod watch, CPU per watch event handled,
//! and CPU per pod lookup answered (what each pod start costs the daemon instead of the API
//! server). CPU is the daemon's own utime + stime from /proc (10 ms ticks; enough events per
//! sample that the tick does not matter).
//!
//! Usage: `bench-scale [pods on the node] [watch events] [lookups]` — prints a Markdown table.

use cni_config::lookup::{POD_LOOKUP_SOCKET, PodQuery};
use serde_json::Value;
use std::time::{Duration, Instant};
use testbed::node::{Node, NodeOptions, product_bin_dir, wait_until};
use testbed::pods::{DemoPod, PodKind};
use testbed::proc_stats;

fn cpu_ms(pid: u32) -> f64 {
    proc_stats::cpu_s(pid) * 1000.0
}

fn rss_mb(pid: u32) -> f64 {
    proc_stats::status_kb(pid, "VmRSS:") as f64 / 1024.0
}

/// A plain pod (no sidecar: nothing for reconcile to do) on the node, unique name and uid.
fn pod(i: usize) -> Value {
    let mut p = DemoPod::new(PodKind::NoSidecar, &format!("scale-{i}")).json;
    p["metadata"]["uid"] = format!("00000000-0000-4000-8000-{i:012}").into();
    p
}

/// The daemon's answer for pod `i` (its labels), from inside the node.
fn lookup(node: &Node, i: usize) -> Option<Value> {
    let q = PodQuery {
        namespace: "default".into(),
        name: format!("scale-{i}"),
        uid: None,
        with_namespace: false,
        wait: Duration::ZERO,
    };
    let socket = node.run_dir.join(POD_LOOKUP_SOCKET);
    let a = uds_http::client::request(
        &socket,
        uds_http::Method::GET,
        &q.to_path(),
        vec![],
        Duration::from_secs(5),
    )
    .ok()?;
    (a.status == 200)
        .then(|| serde_json::from_slice(&a.body).ok())
        .flatten()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |d: usize| {
        args.next()
            .map(|s| s.parse().expect("a number"))
            .unwrap_or(d)
    };
    let (pods, events, lookups) = (arg(250), arg(5000), arg(2000));
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.full_api = true;
    let mut node = Node::new(opts).unwrap();
    let kube = node.kube.as_ref().expect("full API");
    let specs: Vec<Value> = (0..pods).map(pod).collect();
    for p in &specs {
        kube.add(p.clone());
    }
    node.start_daemon().unwrap();
    let pid = node.daemon().pid();
    assert!(
        wait_until(Duration::from_secs(20), || lookup(&node, pods - 1)
            .is_some()),
        "cache never listed"
    );
    std::thread::sleep(Duration::from_secs(2));
    let (idle_cpu, idle_rss) = (cpu_ms(pid), rss_mb(pid));

    // Watch events: MODIFIED for every pod in turn, as fast as the fake API sends them.
    let kube = node.kube.as_ref().expect("full API");
    let t = Instant::now();
    for e in 0..events {
        let mut p = specs[e % pods].clone();
        p["metadata"]["labels"]["round"] = (e / pods).to_string().into();
        kube.modify(p);
    }
    let last = (events - 1) % pods;
    let want = ((events - 1) / pods).to_string();
    let seen = wait_until(Duration::from_secs(60), || {
        lookup(&node, last)
            .is_some_and(|a| a["pod"]["metadata"]["labels"]["round"] == want.as_str())
    });
    assert!(seen, "the last event never reached the cache");
    let event_wall = t.elapsed();
    let after_events = cpu_ms(pid);

    let t = Instant::now();
    for l in 0..lookups {
        assert!(lookup(&node, l % pods).is_some());
    }
    let lookup_wall = t.elapsed();
    let after_lookups = cpu_ms(pid);
    let rss = rss_mb(pid);
    let _ = node.stop_daemon();

    let per_event_us = (after_events - idle_cpu) * 1000.0 / events as f64;
    let per_lookup_us = (after_lookups - after_events) * 1000.0 / lookups as f64;
    println!("| install-cni, one node ({pods} pods in its pod watch) | measured |");
    println!("|---|---|");
    println!("| RSS after the first list | {idle_rss:.1} MB |");
    println!("| RSS after {events} watch events and {lookups} lookups | {rss:.1} MB |");
    println!(
        "| CPU per pod watch event handled (decode, cache, fan-out to the jobs) | {per_event_us:.0} µs ({events} events in {:.2} s) |",
        event_wall.as_secs_f64()
    );
    println!(
        "| CPU per pod lookup answered over `pods.sock` | {per_lookup_us:.0} µs ({lookups} lookups in {:.2} s, one connection each) |",
        lookup_wall.as_secs_f64()
    );
}
