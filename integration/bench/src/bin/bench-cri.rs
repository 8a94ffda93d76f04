//! RunPodSandbox latency under a real container runtime, with and without istio-cni in the
//! chain: our share of a real pod start. A private containerd 1.6 (integration::cri) on a node
//! whose plugin the containerized install-cni installed; sidecar demo pods; p50/p95 of N
//! sandboxes one after another, then M at once (each call's latency, and the wall time); then
//! install-cni is stopped (it removes the plugin), containerd reloads the chain without it, and
//! the same runs again on the same runtime; R rounds, alternating which side goes first. Every
//! sandbox is checked (our rules iff istio-cni is in the chain) and stopped + removed between
//! runs (not timed). The plugin's own ADD time (from its log) is reported too: on a loaded
//! machine it is the steadier measure of our share.
//!
//! Usage: `bench-cri [sequential] [concurrent] [rounds]` — prints a Markdown table.
//! Needs the `pause` binary next to itself (the `pause` package: `cargo build --release
//! --workspace --bins`, as bench.sh does) and
//! the image (`$ISTIO_CNI_IMAGE`, else deploy/scripts/build-image.sh builds it).

use integration::cri::{RuntimeNode, Sandbox, has_our_rules, pod_config, rules_at};
use std::time::{Duration, Instant};
use testbed::cni::percentile;
use testbed::node::{WAIT, wait_until};
use testbed::pods::{DemoPod, PodKind};

struct Stats {
    seq: Vec<Duration>,
    par: Vec<Duration>,
    par_wall: Vec<Duration>,
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

fn p50_p95(samples: &mut [Duration]) -> String {
    samples.sort();
    format!(
        "{} / {}",
        ms(percentile(samples, 0.5)),
        ms(percentile(samples, 0.95))
    )
}

fn checked(s: Sandbox, captured: bool) -> Sandbox {
    let r = rules_at(s.netns());
    assert_eq!(has_our_rules(&r), captured, "{}:\n{r}", s.pod.name);
    s
}

fn cleanup(rn: &RuntimeNode, sandboxes: &[Sandbox]) {
    for s in sandboxes {
        rn.stop_and_remove(s).expect("Stop + Remove");
    }
}

/// One phase: `seq` sandboxes one after another, then `par` at once.
fn measure(rn: &RuntimeNode, tag: &str, seq: usize, par: usize, captured: bool) -> Stats {
    let pods: Vec<DemoPod> = (0..seq + par + 1)
        .map(|i| DemoPod::new(PodKind::Sidecar, &format!("{tag}-{i}")))
        .collect();
    for p in &pods {
        rn.serve(p);
    }
    // Warm-up (first use of the pause image's snapshot etc.), not counted.
    let warm = checked(rn.run(&pods[0]).expect("warm-up"), captured);
    cleanup(rn, &[warm]);

    let mut seq_t = Vec::new();
    let mut done = Vec::new();
    for p in &pods[1..=seq] {
        let t0 = Instant::now();
        let id = rn
            .cri
            .run_pod(&pod_config(&p.namespace, &p.name))
            .expect("RunPodSandbox");
        seq_t.push(t0.elapsed());
        done.push(checked(rn.sandbox(id, p).unwrap(), captured));
    }
    cleanup(rn, &done);

    let batch = &pods[seq + 1..];
    let configs: Vec<_> = batch
        .iter()
        .map(|p| pod_config(&p.namespace, &p.name))
        .collect();
    let t0 = Instant::now();
    let results = rn.cri.run_pods_concurrently(&configs);
    let par_wall = t0.elapsed();
    let mut par_t = Vec::new();
    let mut done = Vec::new();
    for ((r, took), p) in results.into_iter().zip(batch) {
        par_t.push(took);
        done.push(checked(
            rn.sandbox(r.expect("RunPodSandbox"), p).unwrap(),
            captured,
        ));
    }
    cleanup(rn, &done);
    Stats {
        seq: seq_t,
        par: par_t,
        par_wall: vec![par_wall],
    }
}

/// install-cni running (plugin in the chain) or stopped (it uninstalled; containerd reloaded
/// the chain without it).
fn set_chain(rn: &mut RuntimeNode, with_istio: bool) {
    if with_istio {
        // info: the plugin logs each ADD's own duration.
        rn.start_install_cni(&[("PLUGIN_LOG_LEVEL", "info")])
            .unwrap();
    } else {
        rn.stop_install_cni().expect("StopContainer install-cni");
    }
    let want: &[&str] = if with_istio {
        &["bridge", "portmap", "istio-cni"]
    } else {
        &["bridge", "portmap"]
    };
    let loaded = wait_until(WAIT, || rn.cri.cni_chain().is_ok_and(|c| c == want));
    assert!(
        loaded,
        "containerd's chain is {:?}, not {want:?}",
        rn.cri.cni_chain()
    );
}

/// The plugin's own ADD durations (its log's `elapsed_us`) for the measured pods of the "with"
/// runs: (one after another, at once). Pod names are `with-r<round>-<i>`: 0 is the warm-up,
/// 1..=seq sequential, the rest concurrent.
fn plugin_add_times(log: &str, seq: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for v in log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let span = &v["spans"][0];
        let (Some(name), Some(us)) = (
            span["pod_name"].as_str(),
            v["fields"]["elapsed_us"].as_u64(),
        ) else {
            continue;
        };
        if span["command"] != "ADD" || !name.starts_with("with-") {
            continue;
        }
        match name
            .rsplit('-')
            .next()
            .and_then(|i| i.parse::<usize>().ok())
        {
            Some(0) | None => {}
            Some(i) if i <= seq => one.push(Duration::from_micros(us)),
            Some(_) => many.push(Duration::from_micros(us)),
        }
    }
    (one, many)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seq: usize = args.next().map(|s| s.parse().expect("count")).unwrap_or(30);
    let par: usize = args.next().map(|s| s.parse().expect("count")).unwrap_or(20);
    let rounds: usize = args.next().map(|s| s.parse().expect("count")).unwrap_or(3);
    let pause = std::env::current_exe().unwrap().with_file_name("pause");
    let mut rn = RuntimeNode::new(&pause).unwrap();
    let empty = || Stats {
        seq: Vec::new(),
        par: Vec::new(),
        par_wall: Vec::new(),
    };
    let (mut with, mut without) = (empty(), empty());
    // Alternate the order every round, so drift (load from elsewhere, state that builds up)
    // does not favour either side.
    let mut installed = false;
    for round in 0..rounds {
        for with_istio in [round % 2 == 0, round % 2 != 0] {
            if with_istio != installed {
                set_chain(&mut rn, with_istio);
                installed = with_istio;
            }
            let tag = format!("{}-r{round}", if with_istio { "with" } else { "without" });
            let s = measure(&rn, &tag, seq, par, with_istio);
            let into = if with_istio { &mut with } else { &mut without };
            into.seq.extend(s.seq);
            into.par.extend(s.par);
            into.par_wall.extend(s.par_wall);
        }
    }
    let (mut adds_one, mut adds_many) = plugin_add_times(&rn.node.plugin_log(), seq);

    println!(
        "| chain (containerd 1.6 CRI, sidecar pod; {rounds} rounds) | one after another: p50 / p95 ms (n={}) | {par} at once: p50 / p95 ms per call (n={}) | {par} at once: wall ms, p50 |",
        seq * rounds,
        par * rounds
    );
    println!("|---|---|---|---|");
    for (name, s) in [
        ("bridge + portmap", &mut without),
        ("bridge + portmap + istio-cni", &mut with),
    ] {
        s.par_wall.sort();
        println!(
            "| {name} | {} | {} | {} |",
            p50_p95(&mut s.seq),
            p50_p95(&mut s.par),
            ms(percentile(&s.par_wall, 0.5))
        );
    }
    let share = |w: &[Duration], wo: &[Duration]| {
        percentile(w, 0.5).as_secs_f64() * 1000.0 - percentile(wo, 0.5).as_secs_f64() * 1000.0
    };
    println!(
        "| difference of the p50s | {:+.0} ms | {:+.0} ms | |",
        share(&with.seq, &without.seq),
        share(&with.par, &without.par)
    );
    println!(
        "| istio-cni's own ADD (its log's elapsed_us) | {} (n={}) | {} (n={}) | |",
        p50_p95_us(&mut adds_one),
        adds_one.len(),
        p50_p95_us(&mut adds_many),
        adds_many.len()
    );
}

fn p50_p95_us(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:.1} / {:.1}",
        ms(percentile(samples, 0.5)),
        ms(percentile(samples, 0.95))
    )
}
