//! RunPodSandbox latency under a real container runtime, with and without istio-cni in the
//! chain: our share of a real pod start. A private containerd 1.6 (integration::cri) on a node
//! whose plugin the containerized install-cni installed; sidecar demo pods; p50/p95 of N
//! sandboxes one after another, then M at once (each call's latency, and the wall time). Then
//! install-cni is stopped (it removes the plugin), containerd reloads the chain without it, and
//! the same runs again on the same runtime. Every sandbox is checked (our rules iff istio-cni
//! is in the chain) and stopped + removed between runs (not timed).
//!
//! Usage: bench-cri [sequential sandboxes] [concurrent sandboxes] — prints a Markdown table.
//! Needs the `pause` binary next to itself (`cargo build --release -p integration --bins`) and
//! the image (`$ISTIO_CNI_IMAGE`, else deploy/scripts/build-image.sh builds it).

use integration::cni::percentile;
use integration::cri::{RuntimeNode, Sandbox, has_our_rules, pod_config, rules_at};
use integration::node::{WAIT, wait_until};
use integration::pods::{DemoPod, PodKind};
use std::time::{Duration, Instant};

struct Stats {
    seq: Vec<Duration>,
    par: Vec<Duration>,
    par_wall: Duration,
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
        rn.node.serve(p);
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
        par_wall,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seq: usize = args.next().map(|s| s.parse().expect("count")).unwrap_or(30);
    let par: usize = args.next().map(|s| s.parse().expect("count")).unwrap_or(20);
    let pause = std::env::current_exe().unwrap().with_file_name("pause");
    let mut rn = RuntimeNode::new(&pause).unwrap();
    rn.start_install_cni(&[]).unwrap();
    let mut with = measure(&rn, "with", seq, par, true);

    rn.stop_install_cni().expect("StopContainer install-cni");
    let reloaded = wait_until(WAIT, || {
        rn.cri
            .cni_config()
            .is_ok_and(|c| c.contains("portmap") && !c.contains("istio-cni"))
    });
    assert!(reloaded, "containerd kept istio-cni in its chain");
    let mut without = measure(&rn, "without", seq, par, false);

    println!(
        "| chain (containerd 1.6 CRI, sidecar pod) | one after another: p50 / p95 ms (n={seq}) | {par} at once: p50 / p95 ms per call | {par} at once: wall ms |"
    );
    println!("|---|---|---|---|");
    for (name, s) in [
        ("bridge + portmap", &mut without),
        ("bridge + portmap + istio-cni", &mut with),
    ] {
        println!(
            "| {name} | {} | {} | {} |",
            p50_p95(&mut s.seq),
            p50_p95(&mut s.par),
            ms(s.par_wall)
        );
    }
    let share = |w: &[Duration], wo: &[Duration]| {
        percentile(w, 0.5).as_secs_f64() * 1000.0 - percentile(wo, 0.5).as_secs_f64() * 1000.0
    };
    println!(
        "| istio-cni's share (p50 difference) | {:+.1} ms | {:+.1} ms | |",
        share(&with.seq, &without.seq),
        share(&with.par, &without.par)
    );
}
