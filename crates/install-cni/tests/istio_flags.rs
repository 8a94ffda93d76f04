//! Istio's DaemonSet passes its own flags and environment: the daemon starts with them and
//! reads them as Istio's binary does (logging flags, MONITORING_PORT off, KUBECONFIG_MODE), and
//! its /metrics carries Istio's metric names beside ours.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

#[test]
fn istio_log_flags_start_the_daemon() {
    let env = Env::new();
    fs::write(env.net.join("10-calico.conflist"), calico()).unwrap();
    let file = env.run.parent().unwrap().join("daemon.log");
    let mut c = env.command();
    c.args([
        "--log_output_level=default:info,cni-plugin:debug,klog:warn",
        "--log_target=stderr",
        "--log_target",
        file.to_str().unwrap(),
        "--log_caller",
        "default",
        "--log_stacktrace_level=default:none",
        "--ctrlz_port",
        "9876",
    ]);
    let d = spawn(c);
    d.wait_ready(T);
    let log = d.log();
    assert!(log.contains("\"klog\"") && log.contains("ignored"), "{log}");
    assert!(log.contains("--ctrlz_port=9876"), "{log}");
    assert!(log.contains(".rs:"), "--log_caller: file and line\n{log}");
    let copy = fs::read_to_string(&file).unwrap();
    assert!(copy.contains("health_addr="), "{copy}");
    let conflist = read_json(&env.net.join("10-calico.conflist")).unwrap();
    let entry = conflist["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "istio-cni")
        .cloned()
        .unwrap();
    assert_eq!(
        entry["plugin_log_level"], "debug",
        "the cni-plugin scope's level goes to the plugin, as Istio's"
    );
}

#[test]
fn log_as_json_writes_json_lines() {
    let env = Env::new();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    // A busy HEALTH_PORT stops the daemon right after logging starts.
    let out = env
        .command()
        .args(["--log_output_level", "info", "--log_as_json"])
        .env("HEALTH_PORT", &port)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        lines.iter().any(|j| j["level"] == "ERROR"
            && j["message"].as_str().unwrap_or("").contains("HEALTH_PORT")),
        "{err}"
    );
    let out = env.command().arg("--log_as_json=sure").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn monitoring_port_zero_switches_metrics_off() {
    let env = Env::new();
    fs::write(env.net.join("10-calico.conflist"), calico()).unwrap();
    let d = env.start(&[("MONITORING_PORT", "0")]);
    d.wait_ready(T);
    assert!(d.log().contains("metrics_addr=off"), "{}", d.log());
    assert_eq!(d.metrics, 0);
    assert_eq!(http_get(d.health, "/metrics").0, 404);
}

#[test]
fn kubeconfig_mode_as_istio_reads_it() {
    for (mode, want) in [("384", 0o600), ("0640", 0o640)] {
        let env = Env::new();
        fs::write(env.net.join("10-calico.conflist"), calico()).unwrap();
        let d = env.start(&[("KUBECONFIG_MODE", mode)]);
        d.wait_ready(T);
        let got = fs::metadata(env.kubeconfig()).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, want, "KUBECONFIG_MODE={mode}");
    }
    let env = Env::new();
    let out = env
        .command()
        .env("KUBECONFIG_MODE", "600")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("KUBECONFIG_MODE"),
        "{err}"
    );
}

#[test]
fn metrics_carry_the_process_families() {
    let env = Env::new();
    let (_, d) = env.ready_on_calico(T);
    assert!(d.metric("process_resident_memory_bytes ") > 1e6);
    assert!(d.metric("process_open_fds ") >= 3.0);
    assert!(d.metric("process_max_fds ") >= d.metric("process_open_fds "));
    assert!(d.metric("process_cpu_seconds_total ") >= 0.0);
    assert!(d.metric("process_virtual_memory_bytes ") > 1e6);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = d.metric("process_start_time_seconds ");
    assert!(
        started <= now + 1.0 && started > now - 120.0,
        "{started} vs {now}"
    );
    let (_, m) = d.get("/metrics");
    assert!(!m.contains("ztunnel_connected"), "not in ambient mode");
}

/// Istio's `install-cni version` subcommand answers with the version and exits 0 (our
/// `--version` too), starting nothing.
#[test]
fn the_version_subcommand_prints_the_version() {
    for arg in ["version", "--version"] {
        let out = std::process::Command::new(bin()).arg(arg).output().unwrap();
        assert!(out.status.success(), "{arg}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{arg}: {text}");
    }
}
