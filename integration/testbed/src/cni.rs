//! CNI client side of a node: the real `cnitool` and helpers to read what a command printed.
//! Shared by the plugin's end-to-end tests (`crates/istio-cni/tests`) and the whole-product
//! harness ([`crate::node`]); the API server they ask is [`crate::kube_api::FakeKube`].

use crate::TestNetns;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The upstream CNI reference client (built by `integration/scripts/build-cnitool.sh`).
pub const CNITOOL: &str = "/usr/local/bin/cnitool";
/// Debian's reference plugins (`containernetworking-plugins`).
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";
/// A self-signed CA (test only): the plugin's kubeconfig carries CA data, as in production,
/// which keeps the client from loading the system trust store; the test server speaks HTTP.
pub const TEST_CA_PEM: &str = include_str!("../fixtures/ca.crt");

/// Fails clearly when the machine lacks what the end-to-end tests drive.
pub fn require_cni_tools() {
    crate::require_root();
    for p in [CNITOOL, "bridge", "host-local", "portmap", "loopback"]
        .map(|p| Path::new(DEBIAN_CNI_DIR).join(p))
    {
        assert!(
            p.exists(),
            "{} is missing: run `integration/scripts/install-deps.sh`",
            p.display()
        );
    }
}

/// What one command printed and how long it took.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn from_output(out: Output, elapsed: Duration) -> Run {
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        assert!(self.ok, "command failed: {self:#?}");
        self
    }

    /// cnitool prints the plugin's CNI error as its own error text: the code and message.
    #[track_caller]
    pub fn assert_err(&self, code: u32, msg_contains: &[&str]) -> &Self {
        assert!(!self.ok, "command unexpectedly succeeded: {self:#?}");
        let all = format!("{}{}", self.stdout, self.stderr);
        for m in msg_contains {
            assert!(all.contains(m), "{m:?} not in the error: {self:#?}");
        }
        if let Ok(v) = serde_json::from_str::<Value>(self.stdout.trim()) {
            assert_eq!(v["code"], code, "{self:#?}");
        } else {
            assert!(
                all.contains(&code.to_string()),
                "code {code} not in {self:#?}"
            );
        }
        self
    }
}

/// How to call `cnitool` on a node.
#[derive(Clone, Debug)]
pub struct CniTool<'a> {
    /// The node namespace cnitool (and so every plugin) runs in.
    pub node: &'a TestNetns,
    /// `NETCONFPATH`: the directory with the conflists.
    pub netconf: &'a Path,
    /// `CNI_PATH`, colon-separated.
    pub cni_path: String,
}

impl CniTool<'_> {
    /// `cnitool <command> <net> <pod netns>` inside the node with `CNI_ARGS`, as a runtime
    /// calls the chain (`CNI_IFNAME=eth0`).
    pub fn run(&self, net: &str, command: &str, pod: &Path, cni_args: &str) -> Run {
        self.run_with_caps(net, command, pod, cni_args, None)
    }

    /// [`CniTool::run`] with `CAP_ARGS` (cnitool's capability arguments, e.g.
    /// `{"ips": [..]}`, passed as `runtimeConfig` to plugins that declare the capability).
    pub fn run_with_caps(
        &self,
        net: &str,
        command: &str,
        pod: &Path,
        cni_args: &str,
        cap_args: Option<&str>,
    ) -> Run {
        let start = Instant::now();
        let out = self
            .node
            .run(|| {
                let mut cmd = Command::new(CNITOOL);
                cmd.args([command, net])
                    .arg(pod)
                    .env("NETCONFPATH", self.netconf)
                    .env("CNI_PATH", &self.cni_path)
                    .env("CNI_ARGS", cni_args)
                    .env("CNI_IFNAME", "eth0")
                    .env_remove("CAP_ARGS")
                    .stdin(Stdio::null());
                if let Some(caps) = cap_args {
                    cmd.env("CAP_ARGS", caps);
                }
                cmd.output()
            })
            .expect("thread in the node namespace")
            .expect("cnitool runs");
        Run::from_output(out, start.elapsed())
    }
}

/// nft (stateless: no counters) and iptables-legacy rules in a namespace ("" when none).
pub fn rules(ns: &TestNetns) -> String {
    let nft = ns.exec_ok("nft", &["-s", "list", "ruleset"]).unwrap();
    let legacy = ns
        .exec("iptables-legacy-save", &[])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let legacy: String = legacy
        .lines()
        .filter(|l| l.starts_with("-A"))
        .map(|l| format!("{l}\n"))
        .collect();
    nft.trim().to_string() + legacy.trim()
}

/// The pod's first address of the given family from an ADD result.
pub fn result_ip(result: &Value, v6: bool) -> Option<std::net::IpAddr> {
    result["ips"].as_array()?.iter().find_map(|ip| {
        let a: std::net::IpAddr = ip["address"].as_str()?.split('/').next()?.parse().ok()?;
        (a.is_ipv6() == v6).then_some(a)
    })
}

/// The pod's IPv4 address from an ADD result.
pub fn pod_ip(result: &Value) -> std::net::IpAddr {
    result_ip(result, false).expect("an IPv4 address in the ADD result")
}

/// Standard base64 (kubeconfig CA data).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// CNI_ARGS as kubelet/containerd send them.
pub fn k8s_args(k8s_ns: &str, name: &str) -> String {
    if k8s_ns.is_empty() {
        "IgnoreUnknown=1".to_string()
    } else {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef"
        )
    }
}

/// The plugin's own ADD durations, from its JSON log (`command succeeded`, `elapsed_us`).
pub fn plugin_adds(log: &str) -> Vec<Duration> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"] == "command succeeded" && l["spans"][0]["command"] == "ADD"
        })
        .filter_map(|l| l["fields"]["elapsed_us"].as_u64())
        .map(Duration::from_micros)
        .collect()
}

/// Percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
