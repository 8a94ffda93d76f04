//! CNI ADD through the whole chain on a node set up by install-cni (issue 7): cnitool runs
//! bridge + host-local, portmap and istio-cni for the sidecar demo pod, p50/p99 over N pods
//! one after another, then M pods at once; every pod must end up with our rules.
//!
//! Usage: bench-cni [sequential pods] [parallel pods] — prints a Markdown table. Uses the
//! binaries next to itself (or ISTIO_CNI_BIN_DIR); run the release build. With
//! BENCH_SAMPLES_DIR set, also writes each ADD's latency (`cni-add.csv`) and the burst's
//! timeline (`cni-burst.csv`) for bench-plot.

use bench::samples::{self, Span};
use std::time::{Duration, Instant};
use testbed::TestNetns;
use testbed::cni::{Run, percentile, plugin_adds, require_cni_tools, rules};
use testbed::node::{Node, NodeOptions, product_bin_dir};
use testbed::pods::{DemoPod, PodKind};

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// The raw samples behind the table's ADD rows, for bench-plot's charts.
fn write_samples(
    adds: &[Duration],
    par_t: &[Duration],
    own_seq: &[Duration],
    own_par: &[Duration],
    spans: &[Span],
) {
    let par = spans.len();
    let rows = [
        samples::latency_rows("sequential: whole chain", adds),
        samples::latency_rows(&format!("{par} at once: whole chain"), par_t),
        samples::latency_rows("sequential: istio-cni itself", own_seq),
        samples::latency_rows(&format!("{par} at once: istio-cni itself"), own_par),
    ];
    samples::write("cni-add.csv", "series,ms", rows.into_iter().flatten());
    let burst = format!("{par} at once: whole chain");
    samples::write(
        "cni-burst.csv",
        "burst,start_ms,end_ms",
        samples::timeline_rows(&burst, spans),
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seq: usize = args.next().map(|s| s.parse().expect("pods")).unwrap_or(200);
    let par: usize = args.next().map(|s| s.parse().expect("pods")).unwrap_or(100);
    require_cni_tools();
    // The full API (list + watch): the daemon's pod cache answers the plugin, as on a cluster.
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.full_api = true;
    let mut node = Node::new(opts).unwrap();
    node.start_daemon().unwrap();
    node.wait_pod_cache_listed();

    let pod = |i: usize| {
        let spec = DemoPod::new(PodKind::Sidecar, &format!("bench-{i}"));
        node.serve(&spec);
        (spec, TestNetns::with_prefix("bcni").unwrap())
    };
    let captured = |ns: &TestNetns| rules(ns).contains("istio-proxy-nat");

    // Sequential.
    let mut adds = Vec::new();
    let mut dels = Vec::new();
    for i in 0..seq {
        let (spec, ns) = pod(i);
        let r = node.add(&ns, &spec);
        r.assert_ok();
        assert!(captured(&ns), "pod {i} has no rules");
        adds.push(r.elapsed);
        let d = node.del(&ns, &spec);
        d.assert_ok();
        dels.push(d.elapsed);
    }
    adds.sort();
    dels.sort();
    let mut own_seq = plugin_adds(&node.plugin_log());
    own_seq.sort();

    // Parallel: all ADDs released at once.
    let pods: Vec<_> = (0..par).map(|i| pod(seq + i)).collect();
    let barrier = std::sync::Barrier::new(par);
    let t0 = Instant::now();
    let (runs, spans): (Vec<Run>, Vec<Span>) = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .map(|(spec, ns)| {
                let (node, barrier) = (&node, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    Span::time(|| node.add(ns, spec))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).unzip()
    });
    let wall = t0.elapsed();
    let own_all = plugin_adds(&node.plugin_log());
    let mut own_par: Vec<Duration> = own_all[own_seq.len().min(own_all.len())..].to_vec();
    own_par.sort();
    let failed = runs.iter().filter(|r| !r.ok).count();
    let uncaptured = pods.iter().filter(|(_, ns)| !captured(ns)).count();
    let mut par_t: Vec<Duration> = runs.iter().map(|r| r.elapsed).collect();
    par_t.sort();
    for (spec, ns) in &pods {
        node.del(ns, spec);
    }
    node.stop_daemon().unwrap();
    write_samples(&adds, &par_t, &own_seq, &own_par, &spans);

    println!(
        "| CNI ADD through cnitool (bridge + host-local, portmap, istio-cni) | p50 ms | p99 ms | pods |"
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| ADD, one pod after another | {} | {} | {seq} |",
        ms(percentile(&adds, 0.5)),
        ms(percentile(&adds, 0.99))
    );
    println!(
        "| DEL, one pod after another | {} | {} | {seq} |",
        ms(percentile(&dels, 0.5)),
        ms(percentile(&dels, 0.99))
    );
    println!(
        "| ADD, {par} pods at once (each ADD's latency; all {par} done in {} ms; {failed} failed, {uncaptured} without rules) | {} | {} | {par} |",
        ms(wall),
        ms(percentile(&par_t, 0.5)),
        ms(percentile(&par_t, 0.99))
    );
    if !own_seq.is_empty() {
        println!(
            "| of which istio-cni itself (its log: start to result), one after another | {} | {} | {} |",
            ms(percentile(&own_seq, 0.5)),
            ms(percentile(&own_seq, 0.99)),
            own_seq.len()
        );
    }
    if !own_par.is_empty() {
        println!(
            "| of which istio-cni itself, {par} at once | {} | {} | {} |",
            ms(percentile(&own_par, 0.5)),
            ms(percentile(&own_par, 0.99)),
            own_par.len()
        );
    }
    assert_eq!((failed, uncaptured), (0, 0));
}
