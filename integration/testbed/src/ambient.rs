//! An ambient node: the [`Node`] harness with the node agent on (install-cni with
//! `AMBIENT_ENABLED=true`), a REAL ztunnel connected to the agent's ZDS socket, the full fake
//! Kubernetes API ([`crate::kube_api::FakeKube`]: the plugin GETs pods and namespaces, the
//! agent lists and watches them), a fake kubelet process (so the agent finds kubelet's uid),
//! and pods ADDed through the real CNI chain with cnitool.
//!
//! The agent's host /proc (`REPAIR_PROC_ROOT`) is this node's own: a directory of links to
//! the /proc entries of the node's processes only (`1` and the kubelet, both in the node's
//! namespace, and each pod's sandbox). That is what a DaemonSet sees of its node, keeps other
//! tests' processes (other fake kubelets, other pods) out of the agent's scans, and works
//! where the real `/proc/1/ns/net` is unreadable (a sandboxed CI whose pid 1 is protected).
//!
//! Each pod has a fixed IPv4 address and, on a dual-stack node ([`AmbientOptions::dual_stack`]),
//! optionally a fixed IPv6 one too (host-local's `IP=` CNI arg; its `ips` capability for
//! both), because ztunnel learns the workloads (identity, addresses) from its local config
//! before any pod exists; a sandbox
//! process living in the pod's namespace (what the agent finds through /proc after a
//! restart); and its app, a landing probe on 8080.

use crate::cni::Run;
use crate::node::{Node, NodeOptions, product_bin_dir};
use crate::pods::{APP_UID, DemoPod, PodKind};
use crate::probe::{ConnectSpec, Listen, Outcome, Probe, connect};
use crate::ztunnel::{LocalService, LocalWorkload, Ztunnel, serves_nothing, serves_pod};
use crate::{TestNetns, require_root};
use serde_json::{Value, json};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The node's name (the agent's pod watch selects `spec.nodeName=<this>`).
pub const NODE_NAME: &str = "node-e2e";
/// The uid the fake kubelet runs as: the host probe rule SNATs this uid's connections.
pub const KUBELET_UID: u32 = 4242;
/// Some other local uid on the node (its connections to pods are not probes).
pub const OTHER_UID: u32 = 4343;
pub const APP_PORT: u16 = 8080;
pub const POD_NAMESPACE: &str = "default";
pub use crate::pods::DATAPLANE_MODE;
/// Bound on every wait of an ambient test (ztunnel's reconnect backoff grows to seconds).
pub const BOUND: Duration = Duration::from_secs(30);

/// What kind of pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Labelled `istio.io/dataplane-mode=ambient`.
    Ambient,
    /// No label, no sidecar: the plugin leaves it alone (until a label enrolls it).
    Plain,
    /// An injected sidecar pod (the sidecar path, never ambient).
    Sidecar,
}

/// A pod to create: name, fixed address(es), kind.
#[derive(Clone, Debug)]
pub struct PodPlan {
    pub name: String,
    pub ip: Ipv4Addr,
    /// The pod's fixed IPv6 address (dual stack; needs [`AmbientOptions::dual_stack`]).
    pub ip6: Option<Ipv6Addr>,
    pub mode: Mode,
}

impl PodPlan {
    pub fn new(name: &str, ip: [u8; 4], mode: Mode) -> PodPlan {
        PodPlan {
            name: name.into(),
            ip: ip.into(),
            ip6: None,
            mode,
        }
    }

    /// The same pod, dual stack: `ip6` is its IPv6 address (in the node's `fd00:88::/64`).
    pub fn with_ip6(mut self, ip6: Ipv6Addr) -> PodPlan {
        self.ip6 = Some(ip6);
        self
    }

    /// The pod's addresses, IPv4 first.
    pub fn ips(&self) -> Vec<IpAddr> {
        let mut ips = vec![IpAddr::V4(self.ip)];
        ips.extend(self.ip6.map(IpAddr::V6));
        ips
    }

    /// ztunnel's view of the pod (identity = its service account, named after the pod).
    pub fn workload(&self) -> LocalWorkload {
        LocalWorkload {
            name: self.name.clone(),
            namespace: POD_NAMESPACE.into(),
            service_account: self.name.clone(),
            ips: self.ips(),
        }
    }

    /// The Pod JSON the API server returns for it (before kubelet reports its IP).
    pub fn demo_pod(&self) -> DemoPod {
        let kind = match self.mode {
            Mode::Sidecar => PodKind::Sidecar,
            Mode::Ambient | Mode::Plain => PodKind::NoSidecar,
        };
        let uid = format!("uid-{}", self.name);
        let ambient = self.mode == Mode::Ambient;
        DemoPod::scheduled(kind, &self.name, POD_NAMESPACE, &uid, NODE_NAME, ambient)
    }
}

/// Settings of the agent under test.
#[derive(Clone, Debug)]
pub struct AmbientOptions {
    /// `AMBIENT_DNS_CAPTURE`.
    pub dns_capture: bool,
    /// Extra daemon environment (overrides the defaults).
    pub env: Vec<(String, String)>,
    /// Services in ztunnel's config (VIPs, names its DNS proxy answers).
    pub services: Vec<LocalService>,
    /// `AMBIENT_IPV6` (the rig's default: off).
    pub ipv6: bool,
    /// The node's primary network has an IPv6 range too (pods with [`PodPlan::ip6`]).
    pub dual_stack: bool,
}

impl Default for AmbientOptions {
    fn default() -> Self {
        AmbientOptions {
            dns_capture: true,
            env: Vec::new(),
            services: Vec::new(),
            ipv6: false,
            dual_stack: false,
        }
    }
}

/// A process named `kubelet` (sleep, exec'd through a symlink named `kubelet`) running as
/// [`KUBELET_UID`], with "kubelet" in its command line: what the agent's kubelet-uid scan of
/// /proc looks for (`comm` and `cmdline` come from the name exec'd).
pub struct FakeKubelet {
    child: Child,
}

impl FakeKubelet {
    /// Starts it inside `node` (kubelet lives in the host's network namespace).
    pub fn start(dir: &Path, node: &TestNetns) -> io::Result<FakeKubelet> {
        std::fs::create_dir_all(dir)?;
        let bin = dir.join("kubelet");
        // A link, not a copy: a copy's write descriptor, inherited by a child another test
        // thread forks meanwhile, makes this exec fail with ETXTBSY ("Text file busy").
        let _ = std::fs::remove_file(&bin);
        std::os::unix::fs::symlink(sleep_binary()?, &bin)?;
        let mut cmd = Command::new(&bin);
        cmd.arg("infinity")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Ok(FakeKubelet {
            child: spawn_in(node, cmd, Some(KUBELET_UID))?,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sleep_binary() -> io::Result<&'static str> {
    ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no sleep binary"))
}

/// Spawns `cmd` inside `ns`, as `uid` (uid and gid) when given: the child joins the
/// namespace between fork and exec (then drops root: setns needs it), from the calling
/// thread, not a short-lived one (PR_SET_PDEATHSIG fires when the forking *thread* exits),
/// and gets SIGKILL should the test die first.
pub fn spawn_in(ns: &TestNetns, mut cmd: Command, uid: Option<u32>) -> io::Result<Child> {
    use std::os::fd::AsRawFd;
    let ns_file = std::fs::File::open(ns.path())?;
    let fd = ns_file.as_raw_fd();
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(id) = uid
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(id, id, id) != 0
                    || libc::setresuid(id, id, id) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd.spawn();
    drop(ns_file);
    child
}

/// A pod: its namespace, a sandbox process living in it, its app on 8080.
pub struct Pod {
    pub plan: PodPlan,
    pub demo: DemoPod,
    pub ns: TestNetns,
    pub app: Probe,
    sandbox: Child,
}

impl Pod {
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(self.plan.ip)
    }
    /// The pod's IPv6 address (panics for an IPv4-only pod).
    pub fn ip6(&self) -> IpAddr {
        IpAddr::V6(self.plan.ip6.expect("a dual-stack pod"))
    }
    pub fn name(&self) -> &str {
        &self.plan.name
    }
    pub fn uid(&self) -> String {
        format!("uid-{}", self.plan.name)
    }
    /// The pid of the process in the pod's namespace (what /proc shows for it).
    pub fn sandbox_pid(&self) -> u32 {
        self.sandbox.id()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.sandbox.kill();
        let _ = self.sandbox.wait();
    }
}

/// The node with the agent, ztunnel and a fake kubelet.
pub struct AmbientNode {
    pub node: Node,
    pub zt: Ztunnel,
    /// `ZTUNNEL_UDS_ADDRESS`: the agent serves ZDS here, ztunnel's `INPOD_UDS`.
    pub zds_socket: PathBuf,
    /// `REPAIR_PROC_ROOT`: the node's /proc (see the module doc).
    pub proc_root: PathBuf,
    pub kubelet: FakeKubelet,
}

impl AmbientNode {
    /// Lays out the node, starts ztunnel (knowing `workloads`: every pod that may become
    /// ambient) and then the agent, and waits until the agent is ready (ztunnel connected).
    pub fn start(
        ztunnel_bin: &Path,
        opts: &AmbientOptions,
        workloads: &[PodPlan],
    ) -> io::Result<AmbientNode> {
        require_root();
        let mut node_opts = NodeOptions::new(product_bin_dir()?);
        node_opts.full_api = true;
        node_opts.dual_stack = opts.dual_stack;
        node_opts.ips_capability = opts.dual_stack;
        let mut node = Node::new(node_opts)?;
        let zds_socket = node.root.join("var/run/ztunnel/ztunnel.sock");
        std::fs::create_dir_all(zds_socket.parent().expect("has a parent"))?;
        let proc_root = node.root.join("host/proc");
        std::fs::create_dir_all(&proc_root)?;
        node.opts.env = ambient_env(&zds_socket, &proc_root, opts);
        let kube = &node.api;
        kube.put_namespace_meta(POD_NAMESPACE, json!({}), json!({}));
        kube.put_namespace_meta("istio-system", json!({}), json!({}));
        let kubelet = FakeKubelet::start(&node.root.join("kubelet-bin"), &node.ns)?;
        // The node's "init" (whose namespace is the host's) and its kubelet.
        link_process(&proc_root, "1", kubelet.pid())?;
        link_process(&proc_root, &kubelet.pid().to_string(), kubelet.pid())?;
        let ws: Vec<LocalWorkload> = workloads.iter().map(PodPlan::workload).collect();
        let zt = Ztunnel::start_with_services(ztunnel_bin, &zds_socket, &ws, &opts.services)?;
        let started = node.start_daemon();
        let amb = AmbientNode {
            node,
            zt,
            zds_socket,
            proc_root,
            kubelet,
        };
        if let Err(e) = started {
            return Err(io::Error::other(format!(
                "{e}\nztunnel log:\n{}",
                amb.zt.log_tail(30)
            )));
        }
        Ok(amb)
    }

    pub fn kube(&self) -> &crate::kube_api::FakeKube {
        &self.node.api
    }

    /// Creates the pod (namespace, sandbox process, app) and puts it into the API server;
    /// not ADDed yet.
    pub fn create_pod(&self, plan: &PodPlan) -> io::Result<Pod> {
        let ns = TestNetns::with_prefix(&format!("amb-{}", plan.name))?;
        let demo = plan.demo_pod();
        self.node.serve(&demo);
        let mut cmd = Command::new(sleep_binary()?);
        cmd.arg("infinity")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let sandbox = spawn_in(&ns, cmd, None)?;
        link_process(&self.proc_root, &sandbox.id().to_string(), sandbox.id())?;
        let app = Probe::start(ns.path(), &plan.name, &[Listen::tcp(APP_PORT)])?;
        Ok(Pod {
            plan: plan.clone(),
            demo,
            ns,
            app,
            sandbox,
        })
    }

    /// CNI ADD through the chain with the pod's fixed address; on success the API server
    /// reports the pod Running with its IP, as kubelet would.
    pub fn add(&self, pod: &Pod) -> Run {
        let run = self.cni(&pod.plan, "add", pod);
        if run.ok {
            self.set_status(pod, "Running", &pod.plan.ips());
        }
        run
    }

    /// The chain without istio-cni for an IPv4 pod (its address assigned, not in the mesh
    /// yet): the first half of [`AmbientNode::add`], for timing istio-cni alone.
    pub fn add_primary_only(&self, pod: &Pod) -> Run {
        assert!(pod.plan.ip6.is_none(), "IPv4 pods only");
        let ip = format!("IP={}", pod.plan.ip);
        self.node.primary_only("add", &pod.ns, &pod.demo, &ip)
    }

    /// The second half: istio-cni alone with the result of [`AmbientNode::add_primary_only`];
    /// on success the pod is Running, as kubelet reports it.
    pub fn add_plugin_alone(&self, pod: &Pod, prev_result: &Value) -> Run {
        let run = self
            .node
            .plugin_alone("add", &pod.ns, &pod.demo, prev_result);
        if run.ok {
            self.set_status(pod, "Running", &pod.plan.ips());
        }
        run
    }

    /// CNI DEL through the chain.
    pub fn del(&self, pod: &Pod) -> Run {
        self.cni(&pod.plan, "del", pod)
    }

    /// The chain with the pod's fixed addresses: host-local's `IP=` for an IPv4-only pod,
    /// the `ips` capability for a dual-stack one.
    fn cni(&self, plan: &PodPlan, command: &str, pod: &Pod) -> Run {
        if plan.ip6.is_some() {
            self.node
                .cni_with_ips(command, &pod.ns, &pod.demo, &plan.ips())
        } else {
            let ip = format!("IP={}", plan.ip);
            self.node.cni_with_args(command, &pod.ns, &pod.demo, &ip)
        }
    }

    /// Creates and ADDs the pod; panics (with the logs) when the ADD fails.
    pub fn start_pod(&self, plan: &PodPlan) -> Pod {
        let pod = self.create_pod(plan).expect("create the pod");
        let run = self.add(&pod);
        if !run.ok {
            panic!(
                "ADD of {} failed: {}\n{}\nagent log:\n{}\nztunnel log:\n{}",
                plan.name,
                run.stdout,
                run.stderr,
                tail(&self.node.daemon().log(), 40),
                self.zt.log_tail(30)
            );
        }
        pod
    }

    fn set_status(&self, pod: &Pod, phase: &str, ips: &[IpAddr]) {
        let kube = self.kube();
        if !kube.set_status(POD_NAMESPACE, pod.name(), phase, ips) {
            // Not stored (deleted from the API): sent back as created, with the status.
            let mut json = pod.demo.json.clone();
            crate::kube_api::with_status(&mut json, phase, ips);
            kube.modify(json);
        }
    }

    /// Sets (`Some`) or removes (`None`) the pod's `istio.io/dataplane-mode` label: a
    /// MODIFIED event on the agent's watch.
    pub fn label(&self, pod: &Pod, mode: Option<&str>) {
        let kube = self.kube();
        let mut json = kube.pod(POD_NAMESPACE, pod.name()).expect("pod served");
        let labels = json["metadata"]["labels"].as_object_mut().expect("labels");
        match mode {
            Some(m) => {
                labels.insert(DATAPLANE_MODE.into(), Value::from(m));
            }
            None => {
                labels.remove(DATAPLANE_MODE);
            }
        }
        kube.modify(json);
    }

    /// Takes the pod's sandbox out of the node's /proc: the agent can no longer find the pod's
    /// network namespace (as when its processes cannot be seen or entered).
    pub fn hide_from_proc(&self, pod: &Pod) -> io::Result<()> {
        std::fs::remove_file(self.proc_root.join(pod.sandbox_pid().to_string()))
    }

    /// The pod's `ambient.istio.io/redirection` annotation in the API server (the agent
    /// writes `enabled` on enrolled pods; istiod relies on it).
    pub fn redirection_annotation(&self, pod: &Pod) -> Option<String> {
        let json = self.kube().pod(POD_NAMESPACE, pod.name())?;
        json["metadata"]["annotations"]["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_string)
    }

    /// Whether ztunnel listens on all its in-pod ports in the pod's namespace.
    pub fn served(&self, pod: &Pod) -> bool {
        serves_pod(pod.ns.path()).unwrap_or(false)
    }

    /// Whether none of ztunnel's in-pod ports listen in the pod's namespace.
    pub fn not_served(&self, pod: &Pod) -> bool {
        serves_nothing(pod.ns.path()).unwrap_or(false)
    }

    /// The nftables tables in the pod's namespace (`family name`).
    pub fn tables(&self, pod: &Pod) -> Vec<String> {
        tables(&pod.ns)
    }

    /// The ambient tables in the pod's namespace.
    pub fn ambient_tables(&self, pod: &Pod) -> Vec<String> {
        self.tables(pod)
            .into_iter()
            .filter(|t| t.contains("istio-ambient"))
            .collect()
    }

    /// The IPv4 addresses in the node's probe set (see [`probe_set`]).
    pub fn probe_set(&self) -> Vec<IpAddr> {
        probe_set(&self.node.ns)
    }

    /// The IPv6 addresses in the node's `istio-inpod-probes-v6` (exists with `AMBIENT_IPV6`).
    pub fn probe_set_v6(&self) -> Vec<IpAddr> {
        probe_set_named(&self.node.ns, "istio-inpod-probes-v6")
    }

    /// The node's ipsets (names).
    pub fn ipsets(&self) -> Vec<String> {
        ipsets(&self.node.ns)
    }

    /// The node's ambient host table as `nft list` prints it (for failure messages).
    pub fn host_table(&self) -> String {
        self.node
            .ns
            .exec_ok("nft", &["list", "table", "inet", "istio-ambient-nat"])
            .unwrap_or_else(|e| format!("(no host table: {e})"))
    }

    /// The app's connection from `from` (as the app's uid). HBONE's first connection waits
    /// for a certificate, so the timeout is long.
    pub fn from_pod(&self, from: &Pod, dst: IpAddr, port: u16) -> Outcome {
        let spec = ConnectSpec::new(dst, port)
            .uid(APP_UID)
            .gid(APP_UID)
            .timeout(Duration::from_secs(10));
        connect(from.ns.path(), &spec)
    }

    /// A connection from the node's own namespace as `uid` (kubelet's probe, or not).
    pub fn from_node(&self, uid: u32, dst: IpAddr, port: u16) -> Outcome {
        let spec = ConnectSpec::new(dst, port)
            .uid(uid)
            .gid(uid)
            .timeout(Duration::from_secs(10));
        connect(self.node.ns.path(), &spec)
    }

    /// The agent's and ztunnel's recent logs, for failure messages.
    pub fn logs(&self) -> String {
        let agent = self
            .node
            .daemon_opt()
            .map(|d| tail(&d.log(), 40))
            .unwrap_or_else(|| "(agent not running)".into());
        format!(
            "agent log:\n{agent}\nztunnel log:\n{}",
            self.zt.log_tail(30)
        )
    }

    /// Polls `check` until it holds; panics with `what` and the logs if not within [`BOUND`].
    #[track_caller]
    pub fn eventually(&self, what: &str, check: impl FnMut() -> bool) {
        eventually(what, || self.logs(), check);
    }
}

/// What an ambient node test needs: root, cnitool and Debian's CNI plugins (a panic when one
/// is missing), and the ztunnel binary: `None` outside CI, the test returns at once; under
/// `CI=true` a missing binary panics, so CI never skips.
pub fn prerequisites() -> Option<std::path::PathBuf> {
    crate::cni::require_cni_tools();
    crate::ztunnel::ztunnel_binary()
}

/// Asserts that `o` landed on `probe`'s `port` (with the node's logs when not).
#[track_caller]
pub fn lands(n: &AmbientNode, o: &Outcome, probe: &str, port: u16) {
    match o.landed() {
        Some(l) if l.probe == probe && l.port == port => {}
        _ => panic!("expected to land on {probe}:{port}, got {o}\n{}", n.logs()),
    }
}

/// The peer address the app of `pod` saw on its last connection.
#[track_caller]
pub fn last_peer(pod: &Pod) -> IpAddr {
    pod.app
        .accepted()
        .last()
        .map(|a| a.peer.ip())
        .expect("the app accepted a connection")
}

/// ztunnel's count of connections it opened with these labels.
pub fn opened(n: &AmbientNode, labels: &[(&str, &str)]) -> f64 {
    crate::ztunnel::metric_sum(&n.zt.metrics(), crate::ztunnel::OPENED, labels)
}

/// Polls `check` every 50 ms (ztunnel's metrics are read over HTTP) until it holds; panics
/// with `what` and `logs()` if not within [`BOUND`].
#[track_caller]
pub fn eventually(what: &str, logs: impl Fn() -> String, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !check() {
        if Instant::now() > deadline {
            panic!("{what}: not within {BOUND:?}\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Makes process `pid` visible in the node's /proc as `<proc_root>/<name>`.
pub fn link_process(proc_root: &Path, name: &str, pid: u32) -> io::Result<()> {
    std::os::unix::fs::symlink(format!("/proc/{pid}"), proc_root.join(name))
}

/// The daemon environment of the ambient agent.
fn ambient_env(
    zds_socket: &Path,
    proc_root: &Path,
    opts: &AmbientOptions,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("AMBIENT_ENABLED", "true".to_string()),
        ("ZTUNNEL_UDS_ADDRESS", zds_socket.display().to_string()),
        ("AMBIENT_DNS_CAPTURE", opts.dns_capture.to_string()),
        ("AMBIENT_IPV6", opts.ipv6.to_string()),
        ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "true".into()),
        ("REPAIR_PROC_ROOT", proc_root.display().to_string()),
        ("KUBERNETES_NODE_NAME", NODE_NAME.into()),
        ("REPAIR_NODE_NAME", NODE_NAME.into()),
        ("LOG_LEVEL", "debug".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    env.extend(opts.env.iter().cloned());
    env
}

/// The IPv4 addresses in the probe set of the node namespace `node` (`inet istio-ambient-nat`
/// `istio-inpod-probes-v4`); empty when the set (or table) does not exist.
pub fn probe_set(node: &TestNetns) -> Vec<IpAddr> {
    probe_set_named(node, "istio-inpod-probes-v4")
}

/// The node's ipsets (names).
pub fn ipsets(node: &TestNetns) -> Vec<String> {
    let out = node.exec_ok("ipset", &["list", "-n"]);
    out.unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `iptables-legacy-save` (or `ip6tables-legacy-save`) of the namespace at `netns` without
/// comments and counters; empty when legacy iptables was never used there.
pub fn legacy_save(netns: &Path, v6: bool) -> String {
    let bin = if v6 {
        "ip6tables-legacy-save"
    } else {
        "iptables-legacy-save"
    };
    let text = crate::exec_at(netns, bin, &[])
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string() + "\n")
        .collect()
}

/// The addresses in the node's nft probe set `set`; empty when it (or its table) is missing.
pub fn probe_set_named(node: &TestNetns, set: &str) -> Vec<IpAddr> {
    let out = node.exec(
        "nft",
        &["-j", "list", "set", "inet", "istio-ambient-nat", set],
    );
    let Ok(out) = out else { return Vec::new() };
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["set"]["elem"].as_array())
        .flatten()
        // A plain element is a string; one with a comment (the pod's uid) an object.
        .filter_map(|e| e.as_str().or_else(|| e["elem"]["val"].as_str()))
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// `family name` of every nftables table in the namespace.
pub fn tables(ns: &TestNetns) -> Vec<String> {
    ns.exec_ok("nft", &["list", "tables"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(str::to_string)
        .collect()
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
