//! A "node" for end-to-end tests: testbed's node ([`testbed::node::Node`]: its network
//! namespace, host layout and fake Kubernetes API server bound inside it, where the plugin
//! runs) without the install-cni daemon: the conflist with istio-cni and the kubeconfig are
//! written here, and the real CNI client (`cnitool`) runs Debian's bridge/host-local/portmap
//! and then istio-cni.
#![allow(dead_code, unused_imports)]

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use testbed::TestNetns;
pub use testbed::cni::{CNITOOL, CniTool, Run, base64, k8s_args, pod_ip, require_cni_tools, rules};
pub use testbed::kube_api::{ApiMode, FakeKube};

pub const NET: &str = "k8s-pod-network";
/// The same chain without istio-cni (to time the plugin alone on a realistic pod).
pub const BASE_NET: &str = "k8s-base";
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_istio-cni");
/// Where the bridge plugin puts the gateway (in the node namespace).
pub const GATEWAY: &str = "10.88.0.1";

/// Fails the test clearly when the machine lacks what the end-to-end tests drive.
pub fn require_tools() {
    require_cni_tools();
}

pub fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Settings of the istio-cni entry in the conflist.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub cni_version: &'static str,
    pub attempts: u32,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// `pod_lookup_deadline_ms`.
    pub deadline_ms: u64,
    /// Point the kubeconfig at a port nobody listens on.
    pub api_down: bool,
    pub write_kubeconfig: bool,
    /// The istio-cni binary (default: the one cargo built for this test).
    pub plugin: PathBuf,
    /// `redirect_backend`.
    pub backend: &'static str,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            cni_version: "1.0.0",
            attempts: 3,
            interval_ms: 100,
            timeout_ms: 1000,
            deadline_ms: 10_000,
            api_down: false,
            write_kubeconfig: true,
            // ISTIO_CNI_TEST_PLUGIN: run the suites against another build (e.g. an older one,
            // to see a test fail before its fix).
            plugin: std::env::var_os("ISTIO_CNI_TEST_PLUGIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| testbed::node::product_binary("istio-cni", PLUGIN)),
            backend: "auto",
        }
    }
}

/// testbed's node (its `ns`, `api`, directories: through `Deref`) with the plugin's settings.
pub struct Node {
    pub base: testbed::node::Node,
    /// The node's directory (removed with the node): scratch space for the tests.
    pub dir: PathBuf,
    pub opts: NodeOptions,
}

impl std::ops::Deref for Node {
    type Target = testbed::node::Node;
    fn deref(&self) -> &testbed::node::Node {
        &self.base
    }
}

impl Node {
    pub fn new(opts: NodeOptions) -> Node {
        require_tools();
        let bin_source = opts.plugin.parent().expect("the plugin's directory");
        let base_opts = testbed::node::NodeOptions::new(bin_source.to_path_buf());
        let base = testbed::node::Node::new(base_opts).unwrap();
        let dir = base.root.clone();
        let node = Node { base, dir, opts };
        node.write_conflist();
        if node.opts.write_kubeconfig {
            node.write_kubeconfig();
        }
        node
    }

    pub fn run_dir(&self) -> PathBuf {
        self.base.run_dir.clone()
    }

    pub fn plugin_conf(&self) -> Value {
        json!({
            "name": "istio-cni",
            "type": "istio-cni",
            "plugin_log_level": std::env::var("CNI_TEST_LOG_LEVEL").unwrap_or("debug".into()),
            "cni_agent_run_dir": self.run_dir(),
            "exclude_namespaces": ["kube-system"],
            "pod_namespace": "istio-system",
            "native_nftables": false,
            "redirect_backend": self.opts.backend,
            "pod_lookup_attempts": self.opts.attempts,
            "pod_lookup_interval_ms": self.opts.interval_ms,
            "pod_lookup_timeout_ms": self.opts.timeout_ms,
            "pod_lookup_deadline_ms": self.opts.deadline_ms,
            "ambient_enabled": false
        })
    }

    fn write_conflist(&self) {
        self.write_conflist_as(NET, true);
        self.write_conflist_as(BASE_NET, false);
    }

    fn write_conflist_as(&self, net: &str, with_istio: bool) {
        let mut conflist = json!({
            "cniVersion": self.opts.cni_version,
            "name": net,
            "plugins": [
                {
                    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local", "dataDir": self.base.ipam_dir,
                        "ranges": [[{"subnet": "10.88.0.0/16", "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}]
                    }
                },
                {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}
            ]
        });
        if with_istio {
            conflist["plugins"]
                .as_array_mut()
                .unwrap()
                .push(self.plugin_conf());
        }
        // NET in the primary's file (cnitool takes the first file naming the network).
        let file = match net {
            NET => self.base.conflist(),
            _ => self.base.net_dir.join(format!("{net}.conflist")),
        };
        std::fs::write(file, serde_json::to_string_pretty(&conflist).unwrap()).unwrap();
    }

    /// Shaped like install-cni's (CA data and a token), but the test server speaks plain HTTP.
    /// The CA keeps the client from loading the system trust store, as in production.
    pub fn write_kubeconfig(&self) {
        let port = if self.opts.api_down { 1 } else { self.api.port };
        self.write_kubeconfig_for(&format!("http://127.0.0.1:{port}"));
    }

    /// A kubeconfig naming `server` (e.g. a host name whose lookup hangs).
    pub fn write_kubeconfig_for(&self, server: &str) {
        let ca = base64(
            &std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ca.crt"))
                .unwrap(),
        );
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    certificate-authority-data: {ca}\n    server: {server}\ncontexts:\n- name: istio-cni\n  context:\n    cluster: local\n    user: istio-cni\ncurrent-context: istio-cni\nusers:\n- name: istio-cni\n  user:\n    token: test-token\n"
        );
        std::fs::write(self.run_dir().join("istio-cni-kubeconfig"), kubeconfig).unwrap();
    }

    /// `cnitool <command> k8s-pod-network <pod netns>` inside the node, with the pod's CNI_ARGS.
    pub fn cnitool(&self, command: &str, pod: &Path, k8s_ns: &str, name: &str) -> Run {
        self.cnitool_args(command, pod, &k8s_args(k8s_ns, name))
    }

    pub fn cnitool_args(&self, command: &str, pod: &Path, cni_args: &str) -> Run {
        self.cnitool_net(NET, command, pod, cni_args)
    }

    pub fn cnitool_net(&self, net: &str, command: &str, pod: &Path, cni_args: &str) -> Run {
        let plugin_dir = self.opts.plugin.parent().unwrap();
        CniTool {
            node: &self.ns,
            netconf: &self.base.net_dir,
            cni_path: format!("/usr/lib/cni:{}", plugin_dir.display()),
        }
        .run(net, command, pod, cni_args)
    }

    pub fn add(&self, pod: &TestNetns, k8s_ns: &str, name: &str) -> Run {
        self.cnitool("add", pod.path(), k8s_ns, name)
    }
    pub fn check(&self, pod: &TestNetns, k8s_ns: &str, name: &str) -> Run {
        self.cnitool("check", pod.path(), k8s_ns, name)
    }
    pub fn del(&self, pod: &TestNetns, k8s_ns: &str, name: &str) -> Run {
        self.cnitool("del", pod.path(), k8s_ns, name)
    }

    /// The plugin alone, called the way a runtime calls it (inside the node namespace).
    pub fn plugin<V: AsRef<std::ffi::OsStr> + Sync>(&self, env: &[(&str, V)], stdin: &[u8]) -> Run {
        let start = Instant::now();
        let out = self
            .ns
            .run(|| {
                let mut child = Command::new(&self.opts.plugin)
                    .env_clear()
                    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                    .envs(env.iter().map(|(k, v)| (*k, v.as_ref())))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()?;
                child.stdin.take().unwrap().write_all(stdin)?;
                child.wait_with_output()
            })
            .unwrap()
            .unwrap();
        Run::from_output(out, start.elapsed())
    }

    /// istio-cni's ADD again for a pod already set up (what Multus or a runtime retry does;
    /// bridge itself refuses a second ADD, so the plugin is called directly).
    pub fn readd(&self, pod: &TestNetns, k8s_ns: &str, name: &str, prev: &Value) -> Run {
        let args = k8s_args(k8s_ns, name);
        let netns = pod.path().display().to_string();
        let env = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "readd"),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", args.as_str()),
        ];
        self.plugin(&env, &self.plugin_stdin(Some(prev.clone())))
    }

    /// The istio-cni entry as a runtime hands it to the plugin.
    pub fn plugin_stdin(&self, prev_result: Option<Value>) -> Vec<u8> {
        let mut conf = self.plugin_conf();
        conf["cniVersion"] = self.opts.cni_version.into();
        if let Some(p) = prev_result {
            conf["prevResult"] = p;
        }
        serde_json::to_vec(&conf).unwrap()
    }

    /// A cnitool run that failed in istio-cni: the message reached the client and the plugin
    /// logged the same failure with `code` (cnitool does not print codes).
    #[track_caller]
    pub fn assert_failed(&self, run: &Run, code: u32, msg_contains: &[&str]) {
        assert!(!run.ok, "command unexpectedly succeeded: {run:#?}");
        for m in msg_contains {
            assert!(run.stderr.contains(m), "{m:?} not in the error: {run:#?}");
        }
        let last = self
            .log()
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["message"] == "command failed")
            .unwrap_or_else(|| panic!("no failure logged for {run:#?}"));
        assert_eq!(last["fields"]["code"], code, "{last}");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.run_dir().join("istio-cni.log")).unwrap_or_default()
    }
}

/// Builds the release plugin (minutes on a cold cache) and returns its path.
pub fn build_release_plugin() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "istio-cni",
            "--bin",
            "istio-cni",
        ])
        .current_dir(&workspace)
        .status()
        .unwrap();
    assert!(status.success());
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    // .cargo/config.toml sets an explicit build target, so outputs go under its triple.
    target.join("x86_64-unknown-linux-gnu/release/istio-cni")
}
