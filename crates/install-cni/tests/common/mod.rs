//! Test harness: temporary directories standing in for the host's /opt/cni/bin,
//! /etc/cni/net.d, the service-account dir and the run dir, and the real daemon binary.
#![allow(dead_code)]

pub mod kube_api;
pub mod running;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_install-cni");

/// The daemon binary the tests run: `INSTALL_CNI_TEST_BIN` when set (a copy taken right after
/// the build, when other builds share the target dir and may replace BIN meanwhile), else the
/// shipped build (`ISTIO_CNI_BIN_DIR`), else BIN.
pub fn bin() -> PathBuf {
    std::env::var_os("INSTALL_CNI_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| integration::node::product_binary("install-cni", BIN))
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
        fs::copy(
            Path::new(GOLDEN).join("testdata/kube-ca.crt"),
            sa.join("ca.crt"),
        )
        .unwrap();
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
            .env("MONITORING_PORT", "0")
            .env("LISTEN_ADDRESS", "127.0.0.1")
            .env("REDIRECT_BACKEND", "iptables-legacy")
            .env("LOG_LEVEL", "info");
        c
    }

    pub fn start(&self, envs: &[(&str, &str)]) -> Daemon {
        let mut c = self.command();
        for (k, v) in envs {
            c.env(k, v);
        }
        Daemon::spawn(c)
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.run.join("istio-cni-kubeconfig")
    }
}

pub struct Daemon {
    pub child: Child,
    pub logs: Arc<Mutex<String>>,
    pub health: u16,
    pub metrics: u16,
}

impl Daemon {
    pub fn spawn(mut c: Command) -> Daemon {
        let mut child = c
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn install-cni");
        let logs = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let l2 = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("INSTALL_CNI_TEST_LOGS").is_some() {
                    eprintln!("daemon: {line}");
                }
                let mut g = l2.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        let mut d = Daemon {
            child,
            logs,
            health: 0,
            metrics: 0,
        };
        assert!(
            d.wait_log("health_addr=", Duration::from_secs(20)),
            "daemon did not start:\n{}",
            d.log()
        );
        let log = d.log();
        let port = |key: &str| -> u16 {
            let at = log.find(key).unwrap() + key.len();
            let rest = &log[at..];
            let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
            rest[..end].rsplit(':').next().unwrap().parse().unwrap()
        };
        d.health = port("health_addr=");
        d.metrics = port("metrics_addr=");
        d
    }

    pub fn log(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let port = if path == "/metrics" {
            self.metrics
        } else {
            self.health
        };
        http_get(port, path)
    }

    pub fn ready(&self) -> bool {
        self.get("/readyz").0 == 200
    }

    pub fn wait_ready(&self, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.ready()),
            "not ready: {:?}\n{}",
            self.get("/readyz"),
            self.log()
        );
    }

    pub fn metric(&self, needle: &str) -> f64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// SIGTERM and wait for exit.
    pub fn stop(mut self) -> (ExitStatus, String) {
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(50)); // let the log reader drain
                return (st, self.log());
            }
            assert!(Instant::now() < deadline, "daemon did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub use integration::node::{http_get, wait_until};

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

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
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

pub use integration::install_fixtures::*;

/// A `/proc/PID/status` value in kB (`VmRSS:` ...).
pub fn status_kb(pid: u32, key: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of the process, in seconds.
pub fn cpu_s(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0 // USER_HZ
}

/// The plugin's policy for sidecar pods with the test DaemonSet's namespace (`istio-system`).
pub fn sidecar_policy() -> pod_policy::Policy {
    pod_policy::Policy {
        scope: pod_policy::Scope {
            exclude_namespaces: Vec::new(),
            cni_namespace: "istio-system".into(),
        },
        ambient: None,
    }
}
