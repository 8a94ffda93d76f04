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

use crate::{Listen, TestNetns};

/// Where `build-ztunnel.sh` installs the binary; `$ZTUNNEL_BIN` overrides.
pub const DEFAULT_ZTUNNEL_BIN: &str = "/usr/local/bin/ztunnel-test";

/// ztunnel's Prometheus port (in its own namespace).
pub const STATS_PORT: u16 = 15020;

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
    fn to_json(&self, services: &[LocalService]) -> serde_json::Value {
        // The services this workload is an endpoint of: "<ns>/<hostname>" -> port map.
        let member_of: serde_json::Map<String, serde_json::Value> = services
            .iter()
            .filter(|s| s.endpoints.contains(&self.name))
            .map(|s| {
                let key = format!("{}/{}", s.namespace, s.hostname());
                (
                    key,
                    serde_json::json!({ s.port.to_string(): s.target_port }),
                )
            })
            .collect();
        serde_json::json!({
            "uid": format!("Kubernetes//Pod/{}/{}", self.namespace, self.name),
            "name": self.name,
            // Metrics label source/destination_workload with this (else "unknown").
            "workloadName": self.name,
            "namespace": self.namespace,
            "serviceAccount": self.service_account,
            // The SPIFFE identities' trust domain (spiffe://cluster.local/ns/../sa/..).
            "trustDomain": "cluster.local",
            "workloadIps": self.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "protocol": "HBONE",
            "node": "local",
            "network": "",
            // ztunnel's local config requires the key on each workload.
            "services": member_of,
        })
    }
}

/// A Kubernetes service in ztunnel's local config: a VIP and a hostname its DNS proxy
/// answers (`<name>.<namespace>.svc.cluster.local`), with workloads (by name) as endpoints.
#[derive(Clone, Debug)]
pub struct LocalService {
    pub name: String,
    pub namespace: String,
    pub vip: IpAddr,
    pub port: u16,
    pub target_port: u16,
    /// Names of the [`LocalWorkload`]s behind it.
    pub endpoints: Vec<String>,
}

impl LocalService {
    /// Service `name` in `default` whose one endpoint is the workload of the same name.
    pub fn for_workload(name: &str, vip: IpAddr, port: u16, target_port: u16) -> LocalService {
        LocalService {
            name: name.into(),
            namespace: "default".into(),
            vip,
            port,
            target_port,
            endpoints: vec![name.into()],
        }
    }

    pub fn hostname(&self) -> String {
        format!("{}.{}.svc.cluster.local", self.name, self.namespace)
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "namespace": self.namespace,
            "hostname": self.hostname(),
            // NetworkAddress: "<network>/<ip>", the default network is empty.
            "vips": [format!("/{}", self.vip)],
            "ports": { self.port.to_string(): self.target_port },
        })
    }
}

/// ztunnel's `LOCAL_XDS_PATH` file (YAML: port maps need integer keys, which JSON cannot
/// have); the `policies` and `services` keys are required even when empty.
pub fn local_config(workloads: &[LocalWorkload]) -> String {
    local_config_with_services(workloads, &[])
}

/// [`local_config`] with services (and each workload's membership in them).
pub fn local_config_with_services(
    workloads: &[LocalWorkload],
    services: &[LocalService],
) -> String {
    let doc = serde_json::json!({
        "workloads": workloads.iter().map(|w| w.to_json(services)).collect::<Vec<_>>(),
        "policies": [],
        "services": services.iter().map(LocalService::to_json).collect::<Vec<_>>(),
    });
    serde_yaml::to_string(&to_yaml(doc)).expect("YAML of plain values")
}

/// JSON to YAML, with all-digit map keys (ports) as integers.
fn to_yaml(v: serde_json::Value) -> serde_yaml::Value {
    use serde_yaml::Value as Y;
    match v {
        serde_json::Value::Object(map) => Y::Mapping(
            map.into_iter()
                .map(|(k, v)| {
                    let key = match k.parse::<u64>() {
                        Ok(n) => Y::Number(n.into()),
                        Err(_) => Y::String(k),
                    };
                    (key, to_yaml(v))
                })
                .collect(),
        ),
        serde_json::Value::Array(items) => Y::Sequence(items.into_iter().map(to_yaml).collect()),
        other => serde_yaml::to_value(other).expect("a JSON scalar is YAML"),
    }
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
        Self::start_with_services(binary, inpod_uds, workloads, &[])
    }

    /// [`Ztunnel::start`] with services in its config (VIPs, DNS names).
    pub fn start_with_services(
        binary: &Path,
        inpod_uds: &Path,
        workloads: &[LocalWorkload],
        services: &[LocalService],
    ) -> io::Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ztunnel-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("local.yaml"),
            local_config_with_services(workloads, services),
        )?;
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

    /// ztunnel's Prometheus metrics, from its stats port (15020) inside its namespace; empty
    /// when it does not answer.
    pub fn metrics(&self) -> String {
        self.netns
            .run(|| crate::node::http_get(STATS_PORT, "/metrics"))
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// The sum of the samples of metric `name` whose labels include all of `labels`
    /// (see [`metric_sum`]).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics(), name, labels)
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
    let tables = crate::run_in(Some(ns), || {
        ["tcp", "tcp6"]
            .iter()
            .map(|t| std::fs::read_to_string(format!("/proc/thread-self/net/{t}")))
            .collect::<io::Result<Vec<String>>>()
    })??;
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

/// A stand-in for ztunnel inside a pod, for the rule tests that run without it: its in-pod
/// listeners (15001 outbound, 15006 TPROXY inbound, 15008 HBONE, DNS on 15053 over UDP and
/// TCP) and the app's 8080 as one probe, which reports the port a connection landed on.
pub const ZTUNNEL_STAND_IN: [Listen; 6] = [
    Listen::tcp(15001),
    Listen::tproxy(15006),
    Listen::tcp(15008),
    Listen::udp(15053),
    Listen::tcp(15053),
    Listen::tcp(8080),
];

/// ztunnel's counter of TCP connections it opened (by reporter, source and destination).
pub const OPENED: &str = "istio_tcp_connections_opened_total";

/// The labels of a connection `src` → `dst` over HBONE as the destination's ztunnel counts it
/// in [`OPENED`] (mutual TLS).
pub fn hbone_labels<'a>(src: &'a str, dst: &'a str) -> [(&'static str, &'a str); 4] {
    [
        ("reporter", "destination"),
        ("source_workload", src),
        ("destination_workload", dst),
        ("connection_security_policy", "mutual_tls"),
    ]
}

/// The labels of a connection from `src` to a destination outside the mesh, passed through
/// by `src`'s ztunnel, as it counts it in [`OPENED`].
pub fn passthrough_labels(src: &str) -> [(&'static str, &str); 3] {
    [
        ("reporter", "source"),
        ("source_workload", src),
        ("destination_workload", "unknown"),
    ]
}

/// Sums the samples of `name` (Prometheus text format) whose label set contains every
/// `key="value"` of `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, label_set) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let wanted = labels
                .iter()
                .all(|(k, v)| label_set.contains(&format!("{k}=\"{v}\"")));
            (metric == name && wanted).then(|| value.parse::<f64>().ok())?
        })
        .sum()
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
    fn metric_samples_are_summed_by_label() {
        let text = "# HELP x y\n\
istio_tcp_connections_opened_total{reporter=\"source\",destination_workload=\"b\"} 2\n\
istio_tcp_connections_opened_total{reporter=\"destination\",destination_workload=\"b\"} 1\n\
istio_tcp_connections_closed_total{reporter=\"source\"} 5\n";
        let m = "istio_tcp_connections_opened_total";
        assert_eq!(metric_sum(text, m, &[]), 3.0);
        assert_eq!(metric_sum(text, m, &[("reporter", "destination")]), 1.0);
        assert_eq!(metric_sum(text, m, &[("destination_workload", "c")]), 0.0);
    }

    #[test]
    fn services_appear_in_the_config_and_on_their_endpoints() {
        let w = |name: &str| LocalWorkload {
            name: name.into(),
            namespace: "default".into(),
            service_account: "sa".into(),
            ips: vec![],
        };
        let svc = LocalService {
            name: "b".into(),
            namespace: "default".into(),
            vip: "10.96.0.20".parse().unwrap(),
            port: 80,
            target_port: 8080,
            endpoints: vec!["b".into()],
        };
        let cfg = local_config_with_services(&[w("a"), w("b")], &[svc]);
        let v: serde_yaml::Value = serde_yaml::from_str(&cfg).unwrap();
        assert_eq!(v["services"][0]["hostname"], "b.default.svc.cluster.local");
        assert_eq!(v["services"][0]["vips"][0], "/10.96.0.20");
        // Ports are integer keys (ztunnel's u16), not strings.
        assert_eq!(v["services"][0]["ports"][80], 8080);
        assert_eq!(
            v["workloads"][0]["services"],
            serde_yaml::Value::Mapping(Default::default())
        );
        assert_eq!(
            v["workloads"][1]["services"]["default/b.default.svc.cluster.local"][80],
            8080
        );
    }

    #[test]
    fn local_config_has_the_keys_ztunnel_requires() {
        let cfg = local_config(&[LocalWorkload {
            name: "a".into(),
            namespace: "default".into(),
            service_account: "sa".into(),
            ips: vec!["10.0.0.2".parse().unwrap()],
        }]);
        let v: serde_yaml::Value = serde_yaml::from_str(&cfg).unwrap();
        assert_eq!(v["policies"], serde_yaml::Value::Sequence(vec![]));
        assert_eq!(v["services"], serde_yaml::Value::Sequence(vec![]));
        assert_eq!(
            v["workloads"][0]["services"],
            serde_yaml::Value::Mapping(Default::default())
        );
        assert_eq!(v["workloads"][0]["workloadIps"][0], "10.0.0.2");
    }
}
