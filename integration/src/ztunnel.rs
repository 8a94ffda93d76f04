//! A real ztunnel (Istio's ambient node proxy) as a test peer: built from source by
//! `integration/scripts/build-ztunnel.sh`, run standalone in in-pod mode the way the ambient
//! tests need it: no istiod (`XDS_ADDRESS=` empty), workloads from a local file
//! (`LOCAL_XDS_PATH`), a fake CA (`FAKE_CA=true`, the `testing` feature), and our agent's ZDS
//! socket (`INPOD_UDS`). Each ztunnel runs in its own network namespace, so its admin (15000),
//! stats (15020) and readiness (15021) ports, on loopback there, never clash with another
//! test's; in-pod mode needs nothing from its own namespace (it enters each pod's namespace
//! through the fd the agent hands it).

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::TestNetns;

/// Where `build-ztunnel.sh` installs the binary; `$ZTUNNEL_BIN` overrides.
pub const DEFAULT_ZTUNNEL_BIN: &str = "/usr/local/bin/ztunnel-test";

/// The ports ztunnel listens on inside each pod it serves: outbound (15001), inbound plain
/// text (15006), inbound HBONE (15008), DNS (15053).
pub const INPOD_PORTS: [u16; 4] = [15001, 15006, 15008, 15053];

/// The ztunnel binary, or `None` when it is missing outside CI (the caller skips). Under
/// `CI=true` a missing binary panics: CI must never skip the real-peer tests silently.
pub fn ztunnel_binary() -> Option<PathBuf> {
    let path = PathBuf::from(
        std::env::var_os("ZTUNNEL_BIN").unwrap_or_else(|| DEFAULT_ZTUNNEL_BIN.into()),
    );
    if path.is_file() {
        return Some(path);
    }
    let msg = format!(
        "ztunnel binary {} missing: run integration/scripts/build-ztunnel.sh (or set ZTUNNEL_BIN)",
        path.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// A workload in ztunnel's local config (what istiod would otherwise send over XDS).
#[derive(Clone, Debug)]
pub struct LocalWorkload {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub ips: Vec<IpAddr>,
}

impl LocalWorkload {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "uid": format!("Kubernetes//Pod/{}/{}", self.namespace, self.name),
            "name": self.name,
            "namespace": self.namespace,
            "serviceAccount": self.service_account,
            "workloadIps": self.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "protocol": "HBONE",
            "node": "local",
            "network": "",
            // ztunnel's local config requires the key on each workload.
            "services": {},
        })
    }
}

/// ztunnel's `LOCAL_XDS_PATH` file. JSON is YAML, and serde_json does the quoting; the
/// `policies` and `services` keys are required even when empty.
pub fn local_config(workloads: &[LocalWorkload]) -> String {
    let doc = serde_json::json!({
        "workloads": workloads.iter().map(LocalWorkload::to_json).collect::<Vec<_>>(),
        "policies": [],
        "services": [],
    });
    serde_json::to_string_pretty(&doc).expect("JSON of plain values")
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A running ztunnel in its own namespace; killed (and its files removed) on drop.
pub struct Ztunnel {
    binary: PathBuf,
    inpod_uds: PathBuf,
    dir: PathBuf,
    netns: TestNetns,
    child: Option<Child>,
    starts: u32,
}

impl Ztunnel {
    /// Starts ztunnel, connecting to the agent's ZDS socket `inpod_uds` (it retries until
    /// the socket is served, with a backoff up to 15 s).
    pub fn start(binary: &Path, inpod_uds: &Path, workloads: &[LocalWorkload]) -> io::Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ztunnel-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("local.yaml"), local_config(workloads))?;
        let mut zt = Ztunnel {
            binary: binary.to_path_buf(),
            inpod_uds: inpod_uds.to_path_buf(),
            netns: TestNetns::with_prefix("zt")?,
            dir,
            child: None,
            starts: 0,
        };
        zt.spawn()?;
        Ok(zt)
    }

    fn spawn(&mut self) -> io::Result<()> {
        self.starts += 1;
        let log = std::fs::File::create(self.log_path())?;
        let mut cmd = Command::new(&self.binary);
        cmd.current_dir(&self.dir)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("XDS_ADDRESS", "")
            .env("LOCAL_XDS_PATH", self.dir.join("local.yaml"))
            .env("FAKE_CA", "true")
            .env("INPOD_UDS", &self.inpod_uds)
            .env("NODE_NAME", "local")
            .env("ZTUNNEL_WORKER_THREADS", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Forked from a thread inside the namespace: the child is born there.
        let child = self.netns.run(|| cmd.spawn())??;
        self.child = Some(child);
        Ok(())
    }

    /// The namespace ztunnel runs in (its admin/stats/readiness ports are on its loopback).
    pub fn netns(&self) -> &TestNetns {
        &self.netns
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (not exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills ztunnel at once (SIGKILL), as a crash would; its in-pod listeners die with it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops ztunnel gracefully (SIGTERM), SIGKILL if it is not gone within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: plain kill(2) on our own child's pid (not yet reaped, so not reused).
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts ztunnel again after `kill`/`stop` (same config, same socket, fresh log).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("ztunnel-{}.log", self.starts))
    }

    /// The log of the current (or last) run, for assertions and failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Ztunnel {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The TCP ports in LISTEN state in the namespace at `ns` (IPv4 and IPv6), read from
/// `/proc/thread-self/net/tcp{,6}` on a thread inside it (`/proc/self/net` would show the
/// namespace of the process's main thread).
pub fn listening_tcp_ports(ns: &Path) -> io::Result<BTreeSet<u16>> {
    let tables = netns::run_in(Some(ns), || {
        ["tcp", "tcp6"]
            .iter()
            .map(|t| std::fs::read_to_string(format!("/proc/thread-self/net/{t}")))
            .collect::<io::Result<Vec<String>>>()
    })
    .map_err(io::Error::other)??;
    Ok(tables.iter().flat_map(|t| parse_listening(t)).collect())
}

/// Local ports of the LISTEN (state `0A`) rows of a `/proc/net/tcp` table.
fn parse_listening(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let local = cols.nth(1)?;
            let state = cols.nth(1)?;
            let port = local.rsplit(':').next()?;
            (state == "0A").then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

/// Whether all of ztunnel's in-pod ports listen in the namespace at `ns`.
pub fn serves_pod(ns: &Path) -> io::Result<bool> {
    let ports = listening_tcp_ports(ns)?;
    Ok(INPOD_PORTS.iter().all(|p| ports.contains(p)))
}

/// Whether none of ztunnel's in-pod ports listen in the namespace at `ns`.
pub fn serves_nothing(ns: &Path) -> io::Result<bool> {
    let ports = listening_tcp_ports(ns)?;
    Ok(!INPOD_PORTS.iter().any(|p| ports.contains(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_rows_are_parsed_from_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:1F90 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n";
        assert_eq!(parse_listening(table), [15001]);
        let table6 = "  sl  local_address remote_address st\n\
   0: 00000000000000000000000000000000:3AA8 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(parse_listening(table6), [15016]);
    }

    #[test]
    fn local_config_has_the_keys_ztunnel_requires() {
        let cfg = local_config(&[LocalWorkload {
            name: "a".into(),
            namespace: "default".into(),
            service_account: "sa".into(),
            ips: vec!["10.0.0.2".parse().unwrap()],
        }]);
        let v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
        assert_eq!(v["policies"], serde_json::json!([]));
        assert_eq!(v["services"], serde_json::json!([]));
        assert_eq!(v["workloads"][0]["services"], serde_json::json!({}));
        assert_eq!(v["workloads"][0]["workloadIps"][0], "10.0.0.2");
    }
}
