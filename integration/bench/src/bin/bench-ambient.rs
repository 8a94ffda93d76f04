//! Ambient ADD through the real chain (issue 12): cnitool runs bridge + host-local, portmap
//! and istio-cni; the plugin hands each ambient pod to the node agent, which programs its
//! rules and waits for the REAL ztunnel's Ack. p50/p99 one pod after another, then N pods at
//! once; the agent's RSS with 0 ambient pods and with every pod enrolled.
//!
//! Usage: bench-ambient [sequential pods] [parallel pods] [total pods for RSS] — prints a
//! Markdown table. Uses the binaries next to itself (or ISTIO_CNI_BIN_DIR) and the ztunnel of
//! `integration/scripts/build-ztunnel.sh`; run the release build. With BENCH_SAMPLES_DIR set,
//! also writes each ADD's latency (`ambient-add.csv`) and the bursts' timelines
//! (`ambient-burst.csv`) for bench-plot.

use bench::samples::{self, Span};
use std::time::{Duration, Instant};
use testbed::ambient::{AmbientNode, AmbientOptions, Mode, Pod, PodPlan};
use testbed::cni::{percentile, plugin_adds, require_cni_tools};
use testbed::ztunnel::ztunnel_binary;

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// Pod `i`'s plan: addresses 10.88.10.0 onwards in the node's /16.
fn plan(i: usize) -> PodPlan {
    let ip = [10, 88, 10 + (i / 250) as u8, 1 + (i % 250) as u8];
    PodPlan::new(&format!("bench-{i}"), ip, Mode::Ambient)
}

/// The agent's enroll durations from its log: `took_us` (rules + probe set + ztunnel's Ack)
/// or `queued_us` (waiting for the pod's own lock: another operation on the same pod).
fn agent_enrolls(log: &str, field: &str) -> Vec<Duration> {
    let key = format!("{field}=");
    log.lines()
        .filter(|l| l.contains("ambient pod enrolled"))
        .filter_map(|l| {
            let rest = &l[l.find(&key)? + key.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .map(Duration::from_micros)
        .collect()
}

fn rss_kb(pid: u32) -> u64 {
    testbed::proc_stats::status_kb(pid, "VmRSS:")
}

fn row(what: &str, mut d: Vec<Duration>) {
    d.sort();
    println!(
        "| {what} | {} | {} | {} |",
        d.len(),
        ms(percentile(&d, 0.5)),
        ms(percentile(&d, 0.99))
    );
}

fn add_all(node: &AmbientNode, pods: &[Pod]) -> Vec<Duration> {
    pods.iter()
        .map(|p| {
            let t = Instant::now();
            let r = node.add(p);
            assert!(r.ok, "ADD of {} failed: {}", p.name(), r.stdout);
            t.elapsed()
        })
        .collect()
}

/// Runs `op` on every pod at once (all released together); each one's span and the wall time
/// until the last one finished.
fn burst(pods: &[Pod], op: impl Fn(&Pod) + Sync) -> (Vec<Span>, Duration) {
    let barrier = std::sync::Barrier::new(pods.len());
    let mut t0 = None;
    let each = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| {
                let (op, barrier) = (&op, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    Span::time(|| op(p)).1
                })
            })
            .collect();
        t0 = Some(Instant::now());
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (each, t0.expect("started").elapsed())
}

/// The burst of istio-cni alone: each pod first gets its address from the rest of the chain
/// (one after another, untimed), then the 100 istio-cni processes start at once with that
/// result, as the runtime calls the chain's last plugin. Measures what the product adds to a
/// burst without the CPU the other plugins' 300 processes take on this 2-vCPU machine.
fn plugin_alone_burst(node: &AmbientNode, pods: Vec<Pod>) -> (Vec<Pod>, Vec<Span>, Duration) {
    let prev: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| {
            let r = node.add_primary_only(p);
            assert!(r.ok, "primary ADD of {} failed: {}", p.name(), r.stdout);
            r.json()
        })
        .collect();
    let index = |p: &Pod| {
        pods.iter()
            .position(|q| q.name() == p.name())
            .expect("ours")
    };
    let (each, wall) = burst(&pods, |p| {
        let r = node.add_plugin_alone(p, &prev[index(p)]);
        assert!(r.ok, "istio-cni ADD of {} failed: {}", p.name(), r.stdout);
    });
    (pods, each, wall)
}

fn durations(spans: &[Span]) -> Vec<Duration> {
    spans.iter().map(Span::elapsed).collect()
}

/// One table row's latencies and, if the ADD chart shows them, their label there.
struct Series {
    table: String,
    chart: Option<String>,
    d: Vec<Duration>,
}

fn series(table: &str, chart: Option<&str>, d: Vec<Duration>) -> Series {
    Series {
        table: table.to_string(),
        chart: chart.map(str::to_string),
        d,
    }
}

/// The raw samples behind the table, for bench-plot's charts: the charted rows' latencies and
/// both bursts' timelines.
fn write_samples(series: &[Series], chain: &[Span], alone: &[Span]) {
    let rows = series
        .iter()
        .filter_map(|s| Some(samples::latency_rows(s.chart.as_deref()?, &s.d)))
        .flatten();
    samples::write("ambient-add.csv", "series,ms", rows);
    let par = chain.len();
    let mut rows = samples::timeline_rows(&format!("{par} at once: whole chain"), chain);
    rows.extend(samples::timeline_rows(
        &format!("{par} at once: istio-cni alone (the chain's other plugins ran before)"),
        alone,
    ));
    samples::write("ambient-burst.csv", "burst,start_ms,end_ms", rows);
}

/// The table's rows: one after another (cnitool, istio-cni's own ADD, agent enroll), the burst
/// (the same and the agent's queue), the burst of istio-cni alone (the same three).
fn table(
    par: usize,
    [seq_wall, own_seq, agent_seq]: [Vec<Duration>; 3],
    [par_wall, own_par, agent_par, queued_par]: [Vec<Duration>; 4],
    [alone_wall, own_alone, agent_alone]: [Vec<Duration>; 3],
) -> [Series; 10] {
    let at_once = |what: &str| format!("{par} at once{what}");
    [
        series(
            "sequential: cnitool, whole chain",
            Some("sequential: whole chain"),
            seq_wall,
        ),
        series(
            "sequential: istio-cni's own ADD (its log)",
            Some("sequential: istio-cni's own ADD"),
            own_seq,
        ),
        series(
            "sequential: agent enroll (rules + probe set + ztunnel Ack)",
            Some("sequential: agent enroll"),
            agent_seq,
        ),
        series(
            &at_once(": cnitool, whole chain"),
            Some(&at_once(": whole chain")),
            par_wall,
        ),
        series(
            &at_once(": istio-cni's own ADD"),
            Some(&at_once(": istio-cni's own ADD")),
            own_par,
        ),
        series(
            &at_once(": agent enroll"),
            Some(&at_once(": agent enroll")),
            agent_par,
        ),
        series(
            &at_once(": agent queue (waiting for the pod's own lock)"),
            None,
            queued_par,
        ),
        series(
            &at_once(
                ", istio-cni alone (the chain's other plugins ran before): each ADD as the runtime sees it",
            ),
            Some(&at_once(": istio-cni alone")),
            alone_wall,
        ),
        series(&at_once(", istio-cni alone: its own ADD"), None, own_alone),
        series(
            &at_once(", istio-cni alone: agent enroll"),
            None,
            agent_alone,
        ),
    ]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: usize| {
        args.next()
            .map(|s| s.parse().expect("a number of pods"))
            .unwrap_or(default)
    };
    let (seq, par, total) = (arg(50), arg(100), arg(500));
    assert!(
        seq + 2 * par <= total,
        "total must cover the sequential and parallel pods"
    );
    require_cni_tools();
    let zt = ztunnel_binary().expect("ztunnel (integration/scripts/build-ztunnel.sh)");
    let plans: Vec<PodPlan> = (0..total).map(plan).collect();
    let node = AmbientNode::start(&zt, &AmbientOptions::default(), &plans).expect("node");
    let pid = node.node.daemon().pid();
    let rss_idle = rss_kb(pid);

    let create = |range: std::ops::Range<usize>| -> Vec<Pod> {
        range
            .map(|i| node.create_pod(&plans[i]).expect("pod"))
            .collect()
    };
    let sequential = create(0..seq);
    let requests_before = node.kube().requests().len();
    let seq_wall = add_all(&node, &sequential);
    let own_seq = plugin_adds(&node.node.plugin_log());
    let agent_seq = agent_enrolls(&node.node.daemon().log(), "took_us");

    let parallel = create(seq..seq + par);
    let (par_spans, par_total) = burst(&parallel, |p| {
        let r = node.add(p);
        assert!(r.ok, "ADD of {} failed: {}", p.name(), r.stdout);
    });
    let own_all = plugin_adds(&node.node.plugin_log());
    let own_par = own_all[own_seq.len()..].to_vec();
    let log = node.node.daemon().log();
    let agent_par = agent_enrolls(&log, "took_us")[agent_seq.len()..].to_vec();
    let queued_par = agent_enrolls(&log, "queued_us")[agent_seq.len()..].to_vec();

    let lookups = node.kube().requests()[requests_before..]
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/api/v1/namespaces/"))
        .count();
    let (alone, alone_spans, alone_total) =
        plugin_alone_burst(&node, create(seq + par..seq + 2 * par));
    let own_all = plugin_adds(&node.node.plugin_log());
    let own_alone = own_all[own_all.len() - par..].to_vec();
    let agent_alone =
        agent_enrolls(&node.node.daemon().log(), "took_us")[agent_seq.len() + par..].to_vec();

    let rest = create(seq + 2 * par..total);
    add_all(&node, &rest);
    node.eventually("every pod enrolled", || {
        sequential
            .iter()
            .chain(&parallel)
            .chain(&alone)
            .chain(&rest)
            .all(|p| node.served(p))
    });
    let rss_full = rss_kb(pid);

    let rows = table(
        par,
        [seq_wall, own_seq, agent_seq],
        [durations(&par_spans), own_par, agent_par, queued_par],
        [durations(&alone_spans), own_alone, agent_alone],
    );
    println!("| ambient ADD ({total} pods on the node at the end) | n | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    for r in &rows {
        row(&r.table, r.d.clone());
    }
    write_samples(&rows, &par_spans, &alone_spans);
    println!(
        "\n{par} ADDs at once done in {} ms through the whole chain, {} ms for istio-cni alone. API requests (pod or namespace GETs) per ambient pod start: {:.2}. Agent RSS: {:.1} MB with 0 ambient pods, {:.1} MB with {total}.",
        par_total.as_millis(),
        alone_total.as_millis(),
        lookups as f64 / (seq + par) as f64,
        rss_idle as f64 / 1024.0,
        rss_full as f64 / 1024.0
    );
}
