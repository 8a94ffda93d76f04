//! ADD latency and memory with the real client and a local API server, for the README table.
//! `cargo test -p istio-cni --test bench -- --ignored --nocapture` (root). Uses the release
//! binary (built if missing; `ISTIO_CNI_BIN` overrides) and writes
//! integration/results/cni-plugin.txt.

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::TestNetns;
use testbed::cni::percentile;

const PODS: usize = 200;

fn pod_count() -> usize {
    std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PODS)
}

fn release_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ISTIO_CNI_BIN") {
        return PathBuf::from(p);
    }
    let bin = common::build_release_plugin();
    bin.canonicalize().unwrap_or(bin)
}

/// Runs the plugin once (inside the node) and returns its wall time and peak RSS (wait4).
fn timed_plugin(node: &Node, env: &[(&str, String)], stdin: &[u8]) -> (Duration, u64, bool) {
    node.ns
        .run(|| {
            let start = Instant::now();
            // Reaped by wait4 below, which also gives the child's rusage.
            #[allow(clippy::zombie_processes)]
            let mut child = Command::new(&node.opts.plugin)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(stdin).unwrap();
            let mut status = 0;
            // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            let pid = child.id() as libc::pid_t;
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            assert_eq!(r, pid);
            let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            (start.elapsed(), usage.ru_maxrss as u64, ok)
        })
        .unwrap()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn add_latency_and_peak_rss() {
    let plugin = release_binary();
    let node = Node::new(NodeOptions {
        plugin: plugin.clone(),
        attempts: 30,
        interval_ms: 1000,
        timeout_ms: 5000,
        // Istio's 30 attempts 1 s apart fit only the default 30 s deadline (the plugin refuses
        // pauses that cannot fit inside it).
        deadline_ms: 30_000,
        ..Default::default()
    });
    let fixture = fixture("sidecar");

    // 1. The plugin alone, as the last plugin of the chain: bridge + portmap ran first
    //    (cnitool, conflist without istio-cni), then istio-cni gets their result.
    let mut alone = Vec::new();
    let mut max_rss_kb = 0;
    let mut pods = Vec::new();
    for i in 0..pod_count() {
        let name = format!("alone-{i}");
        node.api.put("default", &name, fixture.clone());
        let pod = TestNetns::with_prefix("cnib").unwrap();
        let base = node.cnitool_net(BASE_NET, "add", pod.path(), &k8s_args("default", &name));
        let prev = base.assert_ok().json();
        let stdin = node.plugin_stdin(Some(prev));
        let env = [
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", format!("bench{i}")),
            ("CNI_NETNS", pod.path().display().to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_ARGS", k8s_args("default", &name)),
            ("CNI_PATH", "/usr/lib/cni".to_string()),
        ];
        let (d, rss, ok) = timed_plugin(&node, &env, &stdin);
        assert!(ok, "plugin ADD failed for {name}");
        assert!(rules(&pod).contains("istio-proxy-nat"));
        alone.push(d);
        max_rss_kb = max_rss_kb.max(rss);
        pods.push((pod, name));
    }
    for (pod, name) in &pods {
        node.cnitool_net(BASE_NET, "del", pod.path(), &k8s_args("default", name));
    }
    drop(pods);

    // 2. The whole chain through cnitool (bridge + host-local, portmap, istio-cni).
    let mut chain = Vec::new();
    let mut pods = Vec::new();
    for i in 0..pod_count() {
        let name = format!("chain-{i}");
        node.api.put("default", &name, fixture.clone());
        let pod = TestNetns::with_prefix("cnib").unwrap();
        let r = node.add(&pod, "default", &name);
        r.assert_ok();
        chain.push(r.elapsed);
        pods.push((pod, name));
    }
    for (pod, name) in &pods {
        node.del(pod, "default", name);
    }

    // The plugin's own view (first line of main to the result), from its log.
    let mut internal: Vec<Duration> = node
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"] == "command succeeded" && l["spans"][0]["command"] == "ADD"
        })
        .filter_map(|l| l["fields"]["elapsed_us"].as_u64())
        .map(Duration::from_micros)
        .collect();

    alone.sort();
    chain.sort();
    internal.sort();
    let size = std::fs::metadata(&plugin).unwrap().len();
    let report = format!(
        "istio-cni ADD benchmark ({PODS} pods each, sequential; sidecar fixture, nft backend, local HTTP API server)\n\
         binary: {} ({:.1} MB, static)\n\
         plugin alone (fork+exec+GET+netns+nft batch, wall): p50 {} p99 {} max {}\n\
         plugin internal (main to result, from its log, {} ADDs): p50 {} p99 {}\n\
         whole chain via cnitool (bridge+host-local, portmap, istio-cni): p50 {} p99 {}\n\
         plugin peak RSS (wait4 ru_maxrss, max over {PODS} runs): {:.1} MB\n\
         targets: p50 <= 10 ms, peak RSS <= 20 MB; load average at the end: {}\n",
        plugin.display(),
        size as f64 / 1048576.0,
        ms(percentile(&alone, 0.5)),
        ms(percentile(&alone, 0.99)),
        ms(*alone.last().unwrap()),
        internal.len(),
        ms(percentile(&internal, 0.5)),
        ms(percentile(&internal, 0.99)),
        ms(percentile(&chain, 0.5)),
        ms(percentile(&chain, 0.99)),
        max_rss_kb as f64 / 1024.0,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
    );
    println!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/results");
    std::fs::create_dir_all(&out).unwrap();
    if pod_count() == PODS {
        std::fs::write(out.join("cni-plugin.txt"), &report).unwrap();
    } else {
        println!(
            "{}",
            node.log()
                .lines()
                .rev()
                .take(80)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        percentile(&alone, 0.5) <= Duration::from_millis(10),
        "{report}"
    );
    assert!(max_rss_kb <= 20 * 1024, "{report}");
}
