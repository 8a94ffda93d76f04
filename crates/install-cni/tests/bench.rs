//! Benchmark (ignored by default; run with
//! `cargo test --release -p install-cni --test bench -- --ignored --nocapture`): idle RSS and
//! CPU of the daemon process, repair latency p50/p99 after a primary rewrite, CPU during a
//! 1,000-rewrite storm. Results go to integration/results/install-cni.txt.

mod common;

use common::*;
use std::fs;
use std::time::{Duration, Instant};

#[test]
#[ignore]
fn bench_install_cni() {
    let env = Env::new();
    // Realistic binary sizes: the daemon's own static binary stands in for the plugin.
    fs::copy(BIN, env.src.join("istio-cni")).unwrap();
    fs::copy(BIN, env.src.join("istio-nftables")).unwrap();
    let bin_size = fs::metadata(BIN).unwrap().len();
    let list = env.net.join("10-calico.conflist");
    fs::write(&list, golden("test-testdata/pre/calico.conflist")).unwrap();
    let t0 = Instant::now();
    let d = env.start(&[]);
    d.wait_ready(Duration::from_secs(20));
    let startup = t0.elapsed();
    let pid = d.pid();

    std::thread::sleep(Duration::from_secs(2));
    let (c0, w0) = (cpu_s(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let idle_cpu_pct = (cpu_s(pid) - c0) / w0.elapsed().as_secs_f64() * 100.0;
    let idle_rss = status_kb(pid, "VmRSS:");

    let n = 40;
    let c1 = cpu_s(pid);
    let lat = measure_repairs(&list, n, Duration::from_millis(1200));
    let repair_cpu_ms = (cpu_s(pid) - c1) * 1000.0 / n as f64;
    let (p50, p99, max) = (
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        *lat.last().unwrap(),
    );

    // Storm: 1,000 rewrites dropping our entry, as fast as the writer goes.
    let bytes = fs::read(&list).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let mut stripped = v.clone();
    stripped["plugins"] = serde_json::Value::Array(v["plugins"].as_array().unwrap()[..2].to_vec());
    let stripped = serde_json::to_vec_pretty(&stripped).unwrap();
    let c2 = cpu_s(pid);
    let ws = Instant::now();
    for _ in 0..1000 {
        atomic_write(&list, &stripped);
        std::thread::sleep(Duration::from_micros(500));
    }
    let storm_wall = ws.elapsed();
    let healed = wait_until(Duration::from_secs(12), || {
        read_json(&list).is_some_and(|v| types(&v) == ["calico", "portmap", "istio-cni"])
    });
    let storm_heal = ws.elapsed();
    let storm_cpu = cpu_s(pid) - c2;
    let peak_rss = status_kb(pid, "VmHWM:");
    let repairs = d.log().matches("repaired").count();
    let (st, _) = d.stop().unwrap();
    assert!(st.success() && healed);

    let report = format!(
        "install-cni benchmark ({profile} build, {cpus} CPUs, kernel {kernel})\n\
         binaries installed: 2 x {bin_mb:.1} MB\n\
         startup to ready: {startup:?}\n\
         idle RSS: {idle_rss} kB ({idle_mb:.1} MB)   [target <= 20 MB]\n\
         peak RSS (VmHWM, whole run): {peak_rss} kB\n\
         idle CPU: {idle_cpu_pct:.3} % of one core over 10 s\n\
         repair latency (primary rewrites the conflist without our entry -> entry back), {n} samples 1.2 s apart:\n\
         \x20 p50 {p50:?}  p99 {p99:?}  max {max:?}   [target p50 <= 100 ms]\n\
         CPU per repair (incl. the quiet re-check after our own write): {repair_cpu_ms:.2} ms\n\
         storm: 1000 rewrites in {storm_wall:?}; daemon repaired {repairs_storm} times (throttled), \
         CPU {storm_cpu:.2} s, healed {storm_heal:?} after the storm began\n",
        profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        bin_mb = bin_size as f64 / 1e6,
        idle_mb = idle_rss as f64 / 1024.0,
        repairs_storm = repairs.saturating_sub(n),
    );
    println!("{report}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/results");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("install-cni.txt"), &report).unwrap();
    assert!(idle_rss <= 20 * 1024, "idle RSS {idle_rss} kB");
    assert!(p50 <= Duration::from_millis(100), "p50 {p50:?}");
}
