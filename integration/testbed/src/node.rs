//! The whole product on one machine, the way a node runs it.
//!
//! A [`Node`] is a network namespace plus a temporary host layout:
//!
//! ```text
//! <root>/opt/cni/bin/            bridge, host-local, portmap, loopback (Debian's, symlinked);
//!                                install-cni copies istio-cni and istio-nftables here
//! <root>/etc/cni/net.d/10-bridge.conflist   the primary CNI config (bridge + host-local, portmap)
//! <root>/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}
//! <root>/var/run/istio-cni/      the plugin's kubeconfig and log (written by install-cni / istio-cni)
//! <root>/var/lib/cni/networks/   host-local's leases
//! ```
//!
//! The real `install-cni` daemon runs inside the node namespace against that layout (as the
//! DaemonSet does with its host mounts) and chains `istio-cni` into the conflist; a local API
//! server serves the demo pods; `cnitool` ADDs pod namespaces through the whole chain with the
//! `K8S_POD_*` CNI_ARGS kubelet sends. Everything is torn down on drop, also when a test
//! panics: the daemon is killed (and dies with the process that started it, via
//! `PR_SET_PDEATHSIG`), the directory removed, the namespace deleted.

use crate::cni::{CniTool, DEBIAN_CNI_DIR, Run, TEST_CA_PEM, k8s_args, result_ip};
use crate::kube_api::FakeKube;
use crate::pods::{Addrs, DemoPod, Expect, From};
use crate::probe::{Outcome, Transport, connect, send_udp};
use crate::{TestNetns, require_root};
use serde_json::{Value, json};
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The primary network's name (the conflist's `name`, what cnitool is given).
pub const NET: &str = "k8s-pod-network";
pub const CONFLIST: &str = "10-bridge.conflist";
pub const GATEWAY_V4: &str = "10.88.0.1";
pub const GATEWAY_V6: &str = "fd00:88::1";
/// The product's binaries a node gets.
pub const BINARIES: [&str; 3] = ["istio-cni", "install-cni", "istio-nftables"];
/// Bound on every wait in this harness.
/// The node's name: the demo pods' `spec.nodeName`, what the daemon's pod watch selects.
pub const NODE_NAME: &str = "worker-1";
pub const WAIT: Duration = Duration::from_secs(20);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The product binary `name` a crate's tests run: `$ISTIO_CNI_BIN_DIR/<name>` when set
/// (test.sh points it at the one release build the image and the deploy checks use, so every
/// suite tests the bytes that ship), else `built` (cargo's `CARGO_BIN_EXE_<name>`).
pub fn product_binary(name: &str, built: &str) -> PathBuf {
    match std::env::var_os("ISTIO_CNI_BIN_DIR") {
        Some(d) => PathBuf::from(d).join(name),
        None => PathBuf::from(built),
    }
}

/// Where the product's binaries are: `$ISTIO_CNI_BIN_DIR`, else the cargo profile directory
/// of the running executable (`target/<triple>/<profile>/`, also for test binaries in
/// `deps/`). `cargo test --workspace` and `cargo build --bins` put all three there.
pub fn product_bin_dir() -> io::Result<PathBuf> {
    let dir = match std::env::var_os("ISTIO_CNI_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe()?;
            let mut d = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
            if d.ends_with("deps") {
                d.pop();
            }
            d
        }
    };
    for b in BINARIES {
        if !dir.join(b).is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} missing: build the product first (`cargo build --bins`, or \
                     `cargo test --workspace`), or point ISTIO_CNI_BIN_DIR at the binaries",
                    dir.join(b).display()
                ),
            ));
        }
    }
    Ok(dir)
}

/// Options for [`Node::new`].
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Directory with istio-cni, install-cni and istio-nftables.
    pub bin_source: PathBuf,
    /// `REDIRECT_BACKEND` for the daemon.
    pub backend: String,
    /// `PLUGIN_LOG_LEVEL`.
    pub plugin_log_level: String,
    /// Extra daemon environment.
    pub env: Vec<(String, String)>,
    /// The conflist's host-local ranges include IPv6 (every pod dual stack).
    pub dual_stack: bool,
    /// The primary plugin (bridge) declares the `ips` capability, so a pod's addresses can be
    /// fixed per ADD ([`Node::cni_with_ips`]).
    pub ips_capability: bool,
    /// The fake API serves everything ([`FakeKube`]: pod and namespace get/list/watch, ...):
    /// what the ambient node agent and the daemon's pod cache need. Without it, single objects
    /// only ([`FakeKube::objects_only`]: the plugin's pod GETs, the daemon's DaemonSet).
    pub full_api: bool,
    /// host-local's `rangeStart`/`rangeEnd` inside 10.88.0.0/16 (addresses handed out in
    /// order from the start: predictable, and apart from other nodes' pods).
    pub range_v4: Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)>,
}

impl NodeOptions {
    pub fn new(bin_source: PathBuf) -> Self {
        NodeOptions {
            bin_source,
            backend: "auto".into(),
            plugin_log_level: "info".into(),
            env: Vec::new(),
            dual_stack: true,
            ips_capability: false,
            full_api: false,
            range_v4: None,
        }
    }
}

/// A node: namespace, host layout, API server, install-cni.
pub struct Node {
    pub ns: TestNetns,
    pub root: PathBuf,
    pub bin_dir: PathBuf,
    pub net_dir: PathBuf,
    pub sa_dir: PathBuf,
    pub run_dir: PathBuf,
    pub ipam_dir: PathBuf,
    /// The node's API server; the daemon and the plugin use it.
    pub api: FakeKube,
    /// The same server as `api`, when [`NodeOptions::full_api`] (the benchmarks' spelling).
    pub kube: Option<FakeKube>,
    pub opts: NodeOptions,
    daemon: Option<Daemon>,
}

impl Node {
    /// Lays out the node and writes the primary conflist; the daemon is not started yet.
    pub fn new(opts: NodeOptions) -> io::Result<Node> {
        require_root();
        let ns = TestNetns::with_prefix("node")?;
        // IPv6 addresses on the bridge usable at once (no DAD wait); pods get theirs from
        // the bridge plugin, which turns DAD off in the pod as well.
        ns.sh(
            "sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
             net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1",
        )?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("istio-cni-node-{}-{n}", std::process::id()));
        let api = FakeKube::start_in(&ns)?;
        if !opts.full_api {
            api.objects_only();
        }
        let kube = opts.full_api.then(|| api.clone());
        let node = Node {
            bin_dir: root.join("opt/cni/bin"),
            net_dir: root.join("etc/cni/net.d"),
            sa_dir: root.join("var/run/secrets/kubernetes.io/serviceaccount"),
            run_dir: root.join("var/run/istio-cni"),
            ipam_dir: root.join("var/lib/cni/networks"),
            root,
            ns,
            api,
            kube,
            opts,
            daemon: None,
        };
        // From here on Drop removes the directory.
        for d in [
            &node.bin_dir,
            &node.net_dir,
            &node.sa_dir,
            &node.run_dir,
            &node.ipam_dir,
        ] {
            fs::create_dir_all(d)?;
        }
        for p in ["bridge", "host-local", "portmap", "loopback"] {
            std::os::unix::fs::symlink(Path::new(DEBIAN_CNI_DIR).join(p), node.bin_dir.join(p))?;
        }
        fs::write(node.sa_dir.join("token"), "demo-service-account-token")?;
        fs::write(node.sa_dir.join("ca.crt"), TEST_CA_PEM)?;
        fs::write(
            node.conflist(),
            serde_json::to_vec_pretty(&node.primary_conflist())?,
        )?;
        Ok(node)
    }

    /// The port of the API server the daemon and the plugin use.
    pub fn api_port(&self) -> u16 {
        self.api.port
    }

    pub fn conflist(&self) -> PathBuf {
        self.net_dir.join(CONFLIST)
    }

    /// What the primary CNI (here: a kubeadm-style bridge setup) writes.
    pub fn primary_conflist(&self) -> Value {
        let mut v4 = json!({"subnet": "10.88.0.0/16", "gateway": GATEWAY_V4});
        if let Some((start, end)) = self.opts.range_v4 {
            v4["rangeStart"] = start.to_string().into();
            v4["rangeEnd"] = end.to_string().into();
        }
        let mut ranges = vec![json!([v4])];
        let mut routes = vec![json!({"dst": "0.0.0.0/0"})];
        if self.opts.dual_stack {
            ranges.push(json!([{"subnet": "fd00:88::/64", "gateway": GATEWAY_V6}]));
            routes.push(json!({"dst": "::/0"}));
        }
        let mut bridge = json!({
            "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
            "hairpinMode": true,
            "ipam": {"type": "host-local", "dataDir": self.ipam_dir, "ranges": ranges, "routes": routes}
        });
        if self.opts.ips_capability {
            bridge["capabilities"] = json!({"ips": true});
        }
        json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                bridge,
                {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}
            ]
        })
    }

    /// The daemon's environment: Istio's variable names, every host path pointed into the
    /// layout, the API server reachable over plain HTTP inside the node.
    pub fn daemon_env(&self) -> Vec<(String, String)> {
        let p = |p: &Path| p.display().to_string();
        let mut env: Vec<(String, String)> = [
            ("MOUNTED_CNI_NET_DIR", p(&self.net_dir)),
            ("CNI_AGENT_RUN_DIR", p(&self.run_dir)),
            ("CNI_BIN_SOURCE_DIR", p(&self.opts.bin_source)),
            ("CNI_BIN_TARGET_DIRS", p(&self.bin_dir)),
            ("SERVICE_ACCOUNT_DIR", p(&self.sa_dir)),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", self.api_port().to_string()),
            ("KUBERNETES_SERVICE_PROTOCOL", "http".into()),
            ("HEALTH_PORT", "0".into()),
            ("MONITORING_PORT", "any".into()),
            ("LISTEN_ADDRESS", "127.0.0.1".into()),
            ("EXCLUDE_NAMESPACES", "kube-system".into()),
            ("POD_NAMESPACE", "istio-system".into()),
            ("KUBERNETES_NODE_NAME", NODE_NAME.into()),
            ("REDIRECT_BACKEND", self.opts.backend.clone()),
            ("PLUGIN_LOG_LEVEL", self.opts.plugin_log_level.clone()),
            ("LOG_LEVEL", "info".into()),
            // Without `full_api` the local API server answers single objects only (what the
            // plugin uses); the repair controller's pod watch is tested with its own crate.
            ("REPAIR_ENABLED", "false".into()),
            // Istio's default (the daemon's is on): these tests chain into the primary's
            // conflist and read it (`chain`, `plugin_alone`); the owned file's own tests set it.
            ("ISTIO_OWNED_CNI_CONFIG", "false".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        env.extend(self.opts.env.iter().cloned());
        env
    }

    /// Starts install-cni in the node namespace and waits until it is ready (installed).
    pub fn start_daemon(&mut self) -> io::Result<()> {
        let mut cmd = Command::new(self.opts.bin_source.join("install-cni"));
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(self.daemon_env());
        let d = Daemon::spawn(cmd, Some(&self.ns))?;
        self.daemon = Some(d);
        let d = self.daemon.as_ref().unwrap();
        if !wait_until(WAIT, || d.ready()) {
            let (code, body) = d.get("/readyz");
            return Err(io::Error::other(format!(
                "install-cni not ready within {WAIT:?} (/readyz: {code} {body}):\n{}",
                d.log()
            )));
        }
        Ok(())
    }

    /// Waits until the daemon's pod cache has listed this node's pods: from then on it answers
    /// the plugin's lookups (before, the plugin asks the API server, as it should).
    pub fn wait_pod_cache_listed(&self) {
        let listed = wait_until(WAIT, || self.daemon().log().contains("pod cache: listed"));
        assert!(listed, "no pod cache list:\n{}", self.daemon().log());
    }

    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("daemon started")
    }

    /// The daemon, when running.
    pub fn daemon_opt(&self) -> Option<&Daemon> {
        self.daemon.as_ref()
    }

    /// SIGTERM to the daemon; waits for it to exit (bounded) and returns status and log.
    pub fn stop_daemon(&mut self) -> io::Result<(ExitStatus, String)> {
        let d = self.daemon.take().expect("daemon started");
        d.stop()
    }

    /// The installed conflist, parsed.
    pub fn conflist_json(&self) -> Option<Value> {
        serde_json::from_slice(&fs::read(self.conflist()).ok()?).ok()
    }

    /// Plugin types in the conflist, in chain order.
    pub fn chain(&self) -> Vec<String> {
        self.conflist_json()
            .map(|v| crate::install_fixtures::types(&v))
            .unwrap_or_default()
    }

    /// The primary CNI rewrites its conflist (atomic rename, as kubelet-side writers do),
    /// dropping our entry; returns how long until the daemon had put it back.
    pub fn primary_rewrites_conflist(&self) -> io::Result<Duration> {
        let mut v = self
            .conflist_json()
            .ok_or_else(|| io::Error::other("no conflist"))?;
        let plugins: Vec<Value> = v["plugins"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p["type"] != "istio-cni")
            .collect();
        v["plugins"] = Value::Array(plugins);
        let tmp = self.conflist().with_extension("tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(&v)?)?;
        let t0 = Instant::now();
        fs::rename(&tmp, self.conflist())?;
        loop {
            if self.chain().iter().any(|t| t == "istio-cni") {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > WAIT {
                return Err(io::Error::other(format!(
                    "conflist not repaired within {WAIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The chain without istio-cni (bridge + host-local, portmap), from a directory of its
    /// own: what the runtime has done when it calls istio-cni. Its result is the `prevResult`
    /// [`Node::plugin_alone`] hands istio-cni; the benchmarks use the pair to time istio-cni
    /// without the other plugins' processes.
    pub fn primary_only(&self, command: &str, pod: &TestNetns, p: &DemoPod, extra: &str) -> Run {
        let dir = self.root.join("primary.d");
        let written = fs::create_dir_all(&dir).and_then(|()| {
            let text = serde_json::to_vec_pretty(&self.primary_conflist())?;
            fs::write(dir.join(CONFLIST), text)
        });
        written.expect("write the primary conflist");
        let args = cni_args(p, extra);
        let tool = CniTool {
            netconf: &dir,
            ..self.cnitool()
        };
        tool.run(NET, command, pod.path(), &args)
    }

    /// istio-cni alone, called as the runtime calls the last plugin of the chain: its entry in
    /// the installed conflist with the network's name, version and `prevResult`, the CNI
    /// variables as cnitool sets them, run inside the node.
    pub fn plugin_alone(&self, command: &str, pod: &TestNetns, p: &DemoPod, prev: &Value) -> Run {
        let conflist: Value =
            serde_json::from_slice(&fs::read(self.conflist()).expect("the installed conflist"))
                .expect("conflist JSON");
        let mut conf = conflist["plugins"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["type"] == "istio-cni"))
            .cloned()
            .expect("istio-cni is in the conflist");
        conf["name"] = conflist["name"].clone();
        conf["cniVersion"] = conflist["cniVersion"].clone();
        conf["prevResult"] = prev.clone();
        let stdin = serde_json::to_vec(&conf).expect("JSON");
        let container = format!("alone-{}", pod.name());
        let start = Instant::now();
        let out = self
            .ns
            .run(|| {
                let mut child = Command::new(self.bin_dir.join("istio-cni"))
                    .env("CNI_COMMAND", command.to_uppercase())
                    .env("CNI_CONTAINERID", &container)
                    .env("CNI_NETNS", pod.path())
                    .env("CNI_IFNAME", "eth0")
                    .env("CNI_ARGS", k8s_args(&p.namespace, &p.name))
                    .env("CNI_PATH", &self.bin_dir)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()?;
                child.stdin.take().expect("piped").write_all(&stdin)?;
                child.wait_with_output()
            })
            .expect("thread in the node namespace")
            .expect("istio-cni runs");
        Run::from_output(out, start.elapsed())
    }

    /// cnitool for this node: its conflists, its bin dir only (what a runtime's CNI_PATH is).
    pub fn cnitool(&self) -> CniTool<'_> {
        CniTool {
            node: &self.ns,
            netconf: &self.net_dir,
            cni_path: self.bin_dir.display().to_string(),
        }
    }

    /// Puts the pod into the API server (ADDED, or MODIFIED when it is there).
    pub fn serve(&self, pod: &DemoPod) {
        self.api.put(&pod.namespace, &pod.name, pod.json.clone());
    }

    pub fn add(&self, pod: &TestNetns, p: &DemoPod) -> Run {
        self.cni("add", pod, p)
    }
    pub fn check(&self, pod: &TestNetns, p: &DemoPod) -> Run {
        self.cni("check", pod, p)
    }
    pub fn del(&self, pod: &TestNetns, p: &DemoPod) -> Run {
        self.cni("del", pod, p)
    }
    fn cni(&self, command: &str, pod: &TestNetns, p: &DemoPod) -> Run {
        self.cni_with_args(command, pod, p, "")
    }

    /// A CNI command with extra `CNI_ARGS` (e.g. `IP=10.88.0.10`, which host-local honours:
    /// a pod's address known before its ADD).
    pub fn cni_with_args(&self, command: &str, pod: &TestNetns, p: &DemoPod, extra: &str) -> Run {
        let args = cni_args(p, extra);
        self.cnitool().run(NET, command, pod.path(), &args)
    }

    /// A CNI command whose pod gets exactly `ips` (one per range: IPv4, and IPv6 on a dual-stack
    /// node) through the `ips` capability (host-local's `runtimeConfig.ips`; Debian's
    /// host-local 1.1.1 takes a single address in `CNI_ARGS` `IP=`). Needs
    /// [`NodeOptions::ips_capability`].
    pub fn cni_with_ips(
        &self,
        command: &str,
        pod: &TestNetns,
        p: &DemoPod,
        ips: &[std::net::IpAddr],
    ) -> Run {
        let args = k8s_args(&p.namespace, &p.name);
        let caps = json!({ "ips": ips.iter().map(ToString::to_string).collect::<Vec<_>>() });
        self.cnitool()
            .run_with_caps(NET, command, pod.path(), &args, Some(&caps.to_string()))
    }

    /// Addresses for [`crate::pods::expectations`] from an ADD result.
    pub fn addrs(&self, add_result: &Value) -> Addrs {
        Addrs {
            pod_v4: result_ip(add_result, false).expect("IPv4 in the ADD result"),
            pod_v6: result_ip(add_result, true),
            gw_v4: GATEWAY_V4.parse().unwrap(),
            gw_v6: GATEWAY_V6.parse().unwrap(),
        }
    }

    /// The plugin's log (JSON lines) in the run dir.
    pub fn plugin_log(&self) -> String {
        fs::read_to_string(self.run_dir.join("istio-cni.log")).unwrap_or_default()
    }

    /// Opens the connection `e` describes (from the pod or from the node) and reports where
    /// it landed.
    pub fn probe(&self, pod: &TestNetns, e: &Expect) -> Outcome {
        let ns = match e.from {
            From::Pod => pod.path(),
            From::Node => self.ns.path(),
        };
        match e.transport {
            Transport::Tcp => connect(ns, &e.spec),
            Transport::Udp => send_udp(ns, &e.spec),
        }
    }

    /// GET on the daemon's health or metrics port, from inside the node.
    pub fn daemon_get(&self, path: &str) -> (u16, String) {
        self.daemon().get(path)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            drop(d); // killed and reaped
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The running install-cni, in a node's network namespace or in the caller's: its stderr
/// collected (echoed with `E2E_DAEMON_LOGS=1`), its health and metrics ports read from its
/// listener line, reached in its namespace. Killed and reaped on drop.
pub struct Daemon {
    child: Child,
    logs: Arc<Mutex<String>>,
    /// The thread appending the daemon's stderr to `logs`; finished at the pipe's EOF.
    reader: std::thread::JoinHandle<()>,
    /// The namespace it runs in (None: the caller's), where its ports are reached.
    ns: Option<PathBuf>,
    pub health: u16,
    pub metrics: u16,
}

impl Daemon {
    /// Spawns `cmd` inside `ns` (None: the caller's namespace) and waits for its listener
    /// line. The child joins the namespace between fork and exec, and gets SIGKILL should the
    /// spawning thread's process die first.
    pub fn spawn(mut cmd: Command, ns: Option<&TestNetns>) -> io::Result<Daemon> {
        let ns_file = ns.map(|ns| fs::File::open(ns.path())).transpose()?;
        let ns_fd = ns_file.as_ref().map(|f| f.as_raw_fd());
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = ns_fd
                    && libc::setns(fd, libc::CLONE_NEWNET) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        drop(ns_file);
        let logs = Arc::new(Mutex::new(String::new()));
        let reader = collect_lines(child.stderr.take().expect("piped"), logs.clone());
        let mut d = Daemon {
            child,
            logs,
            reader,
            ns: ns.map(|ns| ns.path().to_path_buf()),
            health: 0,
            metrics: 0,
        };
        if !d.wait_log("health_addr=", WAIT) {
            return Err(io::Error::other(format!(
                "install-cni did not start:\n{}",
                d.log()
            )));
        }
        let log = d.log();
        d.health = port_in(&log, "health_addr=");
        d.metrics = port_in(&log, "metrics_addr=");
        Ok(d)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the daemon (SIGSTOP for a hung daemon, SIGKILL for a gone one).
    #[track_caller]
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "signal {sig} to the daemon");
    }

    /// SIGKILL and reap: nothing of the daemon's own clean-up runs.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        self.child.kill()?;
        self.child.wait()
    }

    pub fn log(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    pub fn ready(&self) -> bool {
        self.get("/readyz").0 == 200
    }

    #[track_caller]
    pub fn wait_ready(&self, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.ready()),
            "not ready: {:?}\n{}",
            self.get("/readyz"),
            self.log()
        );
    }

    /// GET `path` from the health port (or the metrics port for `/metrics`), in the
    /// daemon's namespace.
    pub fn get(&self, path: &str) -> (u16, String) {
        let port = if path == "/metrics" {
            self.metrics
        } else {
            self.health
        };
        crate::run_in(self.ns.as_deref(), || http_get(port, path)).unwrap_or((0, String::new()))
    }

    /// The value of the first metrics line starting with `needle` (NaN when there is none).
    pub fn metric(&self, needle: &str) -> f64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// SIGTERM, then wait (bounded; SIGKILL after [`WAIT`]).
    pub fn stop(mut self) -> io::Result<(ExitStatus, String)> {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait()? {
                // Its last lines are written just before it exits: wait for the reader to
                // reach the pipe's end, not for a guess at how long that takes.
                wait_until(WAIT, || self.reader.is_finished());
                return Ok((st, self.log()));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "install-cni did not exit within {WAIT:?} of SIGTERM:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Appends `stream`'s lines to `logs` on a thread of its own, which ends at the stream's end.
fn collect_lines(
    stream: impl Read + Send + 'static,
    logs: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if std::env::var_os("E2E_DAEMON_LOGS").is_some() {
                eprintln!("install-cni: {line}");
            }
            let mut g = logs.lock().unwrap();
            g.push_str(&line);
            g.push('\n');
        }
    })
}

/// The port of the first `key=<addr>:<port>` in `log` (0 when there is none).
fn port_in(log: &str, key: &str) -> u16 {
    log.find(key)
        .map(|at| &log[at + key.len()..])
        .and_then(|rest| {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '"' || c == ',')
                .unwrap_or(rest.len());
            rest[..end].rsplit(':').next()?.parse().ok()
        })
        .unwrap_or(0)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A bare HTTP/1.1 GET against 127.0.0.1 (in the calling thread's namespace).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return (0, String::new());
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The pod's `CNI_ARGS` (`K8S_POD_*`) plus `extra` (`;`-separated `KEY=VALUE`s), if any.
fn cni_args(p: &DemoPod, extra: &str) -> String {
    let mut args = k8s_args(&p.namespace, &p.name);
    if !extra.is_empty() {
        args.push(';');
        args.push_str(extra);
    }
    args
}

/// Polls `f` every 2 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
