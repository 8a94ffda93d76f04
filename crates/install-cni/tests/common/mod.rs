//! Test harness: temporary directories standing in for the host's /opt/cni/bin,
//! /etc/cni/net.d, the service-account dir and the run dir, and the real daemon binary.
// Each test binary uses a part of the helpers and re-exports.
#![allow(dead_code, unused_imports)]

pub mod kube_api;
pub mod running;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_install-cni");

/// The daemon binary the tests run: `INSTALL_CNI_TEST_BIN` when set (a copy taken right after
/// the build, when other builds share the target dir and may replace BIN meanwhile), else the
/// shipped build (`ISTIO_CNI_BIN_DIR`), else BIN.
pub fn bin() -> PathBuf {
    std::env::var_os("INSTALL_CNI_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| testbed::node::product_binary("install-cni", BIN))
}

pub struct Env {
    pub tmp: tempfile::TempDir,
    pub src: PathBuf,
    pub bin: PathBuf,
    pub net: PathBuf,
    pub run: PathBuf,
    pub sa: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let p = |n: &str| {
            let d = tmp.path().join(n);
            fs::create_dir_all(&d).unwrap();
            d
        };
        let (src, bin, net, run, sa) =
            (p("image-bin"), p("host-bin"), p("net.d"), p("run"), p("sa"));
        fs::write(src.join("istio-cni"), b"#!/bin/sh\necho istio-cni\n").unwrap();
        fs::write(
            src.join("istio-nftables"),
            b"#!/bin/sh\necho istio-nftables\n",
        )
        .unwrap();
        fs::write(sa.join("token"), "service_account_token_string").unwrap();
        fs::copy(golden_dir().join("testdata/kube-ca.crt"), sa.join("ca.crt")).unwrap();
        Env {
            tmp,
            src,
            bin,
            net,
            run,
            sa,
        }
    }

    /// Daemon command with every directory pointed into the temp dir and ports left to the OS.
    pub fn command(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
            .env("KUBERNETES_SERVICE_PORT", "443")
            .env("MOUNTED_CNI_NET_DIR", &self.net)
            .env("CNI_AGENT_RUN_DIR", &self.run)
            .env("CNI_BIN_SOURCE_DIR", &self.src)
            .env("CNI_BIN_TARGET_DIRS", &self.bin)
            .env("SERVICE_ACCOUNT_DIR", &self.sa)
            .env("HEALTH_PORT", "0")
            .env("MONITORING_PORT", "any")
            .env("LISTEN_ADDRESS", "127.0.0.1")
            .env("REDIRECT_BACKEND", "iptables-legacy")
            // Istio's default (the daemon's is on): the tests chain into the primary's file and
            // compare it with Istio's; tests/owned_config.rs sets it.
            .env("ISTIO_OWNED_CNI_CONFIG", "false")
            .env("LOG_LEVEL", "info");
        c
    }

    pub fn start(&self, envs: &[(&str, &str)]) -> Daemon {
        let mut c = self.command();
        for (k, v) in envs {
            c.env(k, v);
        }
        spawn(c)
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.run.join("istio-cni-kubeconfig")
    }

    /// The daemon on a node whose primary is Calico's `10-calico.conflist` ([`calico`]), once it
    /// is ready (chained into it) within `wait`: the list's path and the daemon.
    pub fn ready_on_calico(&self, wait: Duration) -> (PathBuf, Daemon) {
        let conflist = self.net.join("10-calico.conflist");
        fs::write(&conflist, calico()).unwrap();
        let d = self.start(&[]);
        d.wait_ready(wait);
        (conflist, d)
    }
}

/// The primary config most tests start from: Istio's Calico fixture.
pub fn calico() -> Vec<u8> {
    golden("test-testdata/pre/calico.conflist")
}

/// The daemon in the caller's network namespace (the harness every daemon test shares:
/// [`testbed::node::Daemon`]); panics when it does not start.
pub fn spawn(c: Command) -> Daemon {
    Daemon::spawn(c, None).unwrap_or_else(|e| panic!("{e}"))
}

pub use testbed::node::{Daemon, http_get, wait_until};

/// Every file under `dir` with its bytes and mode (for before/after comparisons).
pub fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    let mut m = BTreeMap::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_file() {
            let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
            m.insert(
                e.file_name().to_string_lossy().into_owned(),
                (fs::read(&p).unwrap(), mode),
            );
        }
    }
    m
}

pub fn read_json(p: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&fs::read(p).ok()?).ok()
}

/// Atomic write, the way real primaries (Cilium's renameio, kubelet) replace their files.
pub fn atomic_write(p: &Path, bytes: &[u8]) {
    let tmp = p.with_extension("writer-tmp");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, p).unwrap();
}

/// Rewrites the conflist without our entry (atomic, like the primary CNI) `n` times, spaced
/// `gap` apart, and measures how long each takes until istio-cni is back.
pub fn measure_repairs(conflist: &Path, n: usize, gap: Duration) -> Vec<Duration> {
    let mut lat = Vec::new();
    for _ in 0..n {
        let mut v = read_json(conflist).expect("valid conflist");
        let plugins: Vec<serde_json::Value> = v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] != "istio-cni")
            .cloned()
            .collect();
        v["plugins"] = serde_json::Value::Array(plugins);
        let t0 = Instant::now();
        atomic_write(conflist, serde_json::to_vec_pretty(&v).unwrap().as_slice());
        // Fine-grained poll: the repair itself takes about a millisecond.
        loop {
            if fs::read_to_string(conflist)
                .map(|s| s.contains("\"istio-cni\""))
                .unwrap_or(false)
            {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "not repaired within 10 s"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        lat.push(t0.elapsed());
        std::thread::sleep(gap);
    }
    lat.sort();
    lat
}

pub use testbed::install_fixtures::*;

pub use testbed::cni::percentile;
pub use testbed::proc_stats::{cpu_s, status_kb};

/// The plugin's policy for sidecar pods with the test DaemonSet's namespace (`istio-system`).
pub fn sidecar_policy() -> pod_policy::Policy {
    pod_policy::Policy {
        scope: pod_policy::Scope {
            exclude_namespaces: Vec::new(),
            cni_namespace: "istio-system".into(),
            ..Default::default()
        },
        ambient: None,
    }
}
