//! Ambient pods under a real runtime: the [`RuntimeNode`] (private containerd, the CNI chain it
//! calls) with install-cni started from `deploy/manifests/istio-cni-ambient.yaml` (the chart
//! with `ambient.enabled=true`: the node agent, its container spec and mounts as the DaemonSet
//! has them), the full fake Kubernetes API (pods and namespaces, get/list/watch) and a REAL
//! ztunnel on the node side connected to the agent's ZDS socket.
//!
//! How the pieces meet, as on a real node:
//! * ZDS: the chart's hostPath `/var/run/ztunnel` is the layout's `<root>/var/run/ztunnel`; the
//!   agent serves `ztunnel.sock` there from inside its container, ztunnel (a process in its own
//!   network namespace, `integration::ztunnel`) connects to the same file.
//! * Pod namespaces: containerd mounts each sandbox's netns under its state dir
//!   (`netns_mounts_under_state_dir`); that directory is the chart's `cniNetnsDir` volume
//!   ([`NodeLayout::host_paths`]), made a shared mount so the agent's HostToContainer mount
//!   sees namespaces created after it started. The plugin hands the agent the path containerd
//!   gave it.
//! * The host's /proc: the real one (the chart's `/host/proc`), which is what the restarted
//!   agent searches for running pods' namespaces by IP. So the pods' addresses come from a
//!   range of their own ([`NodeOptions::range_v4`]: no other test's pod has them), handed out
//!   in order: ztunnel's local config (its workloads: identity and address) is written before
//!   any sandbox exists, each [`PodPlan`] predicts its address and [`AmbientRuntime::run`]
//!   checks the runtime gave it.
//!
//! [`NodeLayout::host_paths`]: super::daemonset::NodeLayout::host_paths

use super::runtime_node::{AMBIENT_MANIFEST, CRI_NODE_NAME};
use super::{Cri, CriResult, RuntimeNode, Sandbox, pod_config};
use crate::ambient::{DATAPLANE_MODE, eventually, probe_set};
use crate::node::NodeOptions;
use crate::pods::{APP_UID, DemoPod, PodKind};
use crate::ztunnel::{
    LocalWorkload, Ztunnel, hbone_labels, metric_sum, serves_nothing, serves_pod,
};
use crate::{ConnectSpec, Listen, Outcome, Probe, connect};
use serde_json::json;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Istio's chart sets `ALLOW_SWITCH_TO_HOST_NS=true`: the daemon would do its node-level work
/// in `/host/proc/1/ns/net`, and this rig's `/host/proc` is the machine's own /proc, whose PID 1
/// is the machine's root namespace, not the test node's. The switch is off here (the host probe
/// rule stays in the agent pod's namespace); `crates/redirect/tests/host_switch.rs` tests it.
pub const NO_HOST_SWITCH: [(&str, &str); 1] = [("ALLOW_SWITCH_TO_HOST_NS", "false")];

/// The app's port in every pod.
pub const APP_PORT: u16 = 8080;
/// Bound on every wait: the ambient node's (ztunnel's reconnect backoff grows to seconds).
pub use crate::ambient::BOUND;
/// ztunnel's metric of opened connections.
pub use crate::ztunnel::OPENED;

/// How a pod is (or is not) enrolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enroll {
    /// `istio.io/dataplane-mode=ambient` on the pod.
    PodLabel,
    /// The label on its namespace ([`MESH_NAMESPACE`]), none on the pod.
    NamespaceLabel,
    /// No label anywhere: left alone.
    None,
}

/// The namespace labelled `istio.io/dataplane-mode=ambient`.
pub const MESH_NAMESPACE: &str = "mesh";

/// A pod to run: its name, how it is enrolled and the address host-local will give it.
#[derive(Clone, Debug)]
pub struct PodPlan {
    pub name: String,
    pub enroll: Enroll,
    pub ip: Ipv4Addr,
}

impl PodPlan {
    pub fn namespace(&self) -> &str {
        match self.enroll {
            Enroll::NamespaceLabel => MESH_NAMESPACE,
            _ => "default",
        }
    }

    /// ztunnel's view of it (identity: its service account, named after the pod).
    pub fn workload(&self) -> LocalWorkload {
        LocalWorkload {
            name: self.name.clone(),
            namespace: self.namespace().into(),
            service_account: self.name.clone(),
            ips: vec![IpAddr::V4(self.ip)],
        }
    }

    /// The Pod the API server returns (Pending, no IP yet; uid as [`pod_config`] sends it).
    pub fn demo_pod(&self) -> DemoPod {
        let ns = self.namespace();
        let uid = crate::cri::pod_uid(ns, &self.name);
        let label = self.enroll == Enroll::PodLabel;
        DemoPod::scheduled(
            PodKind::NoSidecar,
            &self.name,
            ns,
            &uid,
            CRI_NODE_NAME,
            label,
        )
    }
}

/// Hands out [`PodPlan`]s with the addresses host-local gives, in the order pods are run.
pub struct Plans {
    first: Ipv4Addr,
    next: Ipv4Addr,
    last: Ipv4Addr,
}

impl Plans {
    /// A range in 10.88.0.0/16 of this rig's own: a third octet from the pid and a count of
    /// the rigs this process made, so tests running side by side never share an address
    /// (the agent finds pods by address through the host's /proc).
    pub fn new() -> Plans {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let nth = MADE.fetch_add(1, Ordering::Relaxed);
        let octet = 100 + ((std::process::id() % 50) * 2 + nth) as u8 % 100;
        let first = Ipv4Addr::new(10, 88, octet, 10);
        Plans {
            first,
            next: first,
            last: Ipv4Addr::new(10, 88, octet, 250),
        }
    }

    /// host-local's `rangeStart`, `rangeEnd`.
    pub fn range(&self) -> (Ipv4Addr, Ipv4Addr) {
        (self.first, self.last)
    }

    /// The next pod (the next address: host-local allocates in order and never reuses an
    /// address before the range wraps).
    pub fn pod(&mut self, name: &str, enroll: Enroll) -> PodPlan {
        let ip = self.next;
        self.next = Ipv4Addr::from(u32::from(ip) + 1);
        PodPlan {
            name: name.into(),
            enroll,
            ip,
        }
    }
}

impl Default for Plans {
    fn default() -> Self {
        Plans::new()
    }
}

/// A running ambient-node sandbox and its app (a landing probe on [`APP_PORT`]).
pub struct AmbientSandbox {
    pub plan: PodPlan,
    pub sandbox: Sandbox,
    pub app: Probe,
}

impl AmbientSandbox {
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(self.plan.ip)
    }
    pub fn netns(&self) -> &Path {
        self.sandbox.netns()
    }
}

/// A handle on a network namespace that outlives the runtime's mount of it (StopPodSandbox
/// unmounts and deletes the netns file): `path()` names it through this process's fd.
pub struct NetnsHandle(File);

impl NetnsHandle {
    pub fn open(path: &Path) -> io::Result<NetnsHandle> {
        File::open(path).map(NetnsHandle)
    }
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.0.as_raw_fd()
        ))
    }
}

/// The node: containerd, the agent in its container, ztunnel. Fields drop in order: containerd
/// (every sandbox stopped and removed) before ztunnel.
pub struct AmbientRuntime {
    pub rn: RuntimeNode,
    pub zt: Ztunnel,
    /// Where containerd mounts sandbox namespaces (the chart's `cniNetnsDir` volume).
    pub netns_dir: PathBuf,
    /// Settings the agent's container gets over the chart's (e.g. `REDIRECT_BACKEND`).
    pub agent_env: Vec<(&'static str, &'static str)>,
    /// The rendered chart the agent's pod comes from (`None`: [`AMBIENT_MANIFEST`]).
    pub agent_yaml: Option<String>,
    /// `netns_dir` as the chart's hostPath (`cniNetnsDir`) names it: its canonical path.
    pub netns_host_path: PathBuf,
}

impl AmbientRuntime {
    /// containerd, the API (namespaces `default`, `istio-system` and [`MESH_NAMESPACE`]
    /// labelled ambient), ztunnel knowing `workloads`, then the agent's container, ready
    /// (which needs ztunnel connected).
    pub fn start(
        pause_bin: &Path,
        ztunnel_bin: &Path,
        range: (Ipv4Addr, Ipv4Addr),
        workloads: &[PodPlan],
    ) -> io::Result<AmbientRuntime> {
        Self::start_with(pause_bin, ztunnel_bin, range, workloads, Vec::new())
    }

    /// [`AmbientRuntime::start`] with `agent_env` over the chart's settings.
    pub fn start_with(
        pause_bin: &Path,
        ztunnel_bin: &Path,
        range: (Ipv4Addr, Ipv4Addr),
        workloads: &[PodPlan],
        agent_env: Vec<(&'static str, &'static str)>,
    ) -> io::Result<AmbientRuntime> {
        let rn = RuntimeNode::with_node(pause_bin, Self::node_options(range))?;
        Self::put_namespaces(&rn);
        let netns_dir = rn.containerd.shared_netns_dir()?;
        let zt = Self::ztunnel(&rn, ztunnel_bin, workloads)?;
        let mut n = AmbientRuntime {
            rn,
            zt,
            netns_host_path: netns_dir.clone(),
            netns_dir,
            agent_env,
            agent_yaml: None,
        };
        n.start_agent()?;
        Ok(n)
    }

    /// The node with the agent's pod from another rendering (`yaml`: Istio's chart), laid out
    /// as that chart expects: containerd mounts sandbox namespaces in `/var/run/netns` (its
    /// default; the chart mounts that directory at `/host/var/run/netns`), and the agent, in a
    /// pod network, reaches the API server at the node's bridge address
    /// ([`RuntimeNode::serve_api_on_gateway`]). Only the env the rig must give is added
    /// (the plugin's and agent's log levels stay as rendered).
    pub fn start_rendered(
        pause_bin: &Path,
        ztunnel_bin: &Path,
        range: (Ipv4Addr, Ipv4Addr),
        workloads: &[PodPlan],
        yaml: String,
    ) -> io::Result<AmbientRuntime> {
        let mut rn = RuntimeNode::with_runtime(pause_bin, Self::node_options(range), false)?;
        rn.serve_api_on_gateway()?;
        // The machine's /var/run/netns (as sandboxes name it), shared; the hostPath its
        // canonical path.
        let shared = rn.containerd.shared_netns_dir()?;
        Self::put_namespaces(&rn);
        let zt = Self::ztunnel(&rn, ztunnel_bin, workloads)?;
        let mut n = AmbientRuntime {
            rn,
            zt,
            netns_dir: PathBuf::from(super::containerd::MACHINE_NETNS_DIR),
            agent_env: Vec::new(),
            agent_yaml: Some(yaml),
            netns_host_path: shared,
        };
        n.start_agent()?;
        Ok(n)
    }

    fn node_options(range: (Ipv4Addr, Ipv4Addr)) -> NodeOptions {
        let mut opts = NodeOptions::new(PathBuf::new());
        opts.full_api = true;
        opts.dual_stack = false;
        opts.range_v4 = Some(range);
        opts
    }

    fn put_namespaces(rn: &RuntimeNode) {
        let kube = &rn.node.api;
        for ns in ["default", "istio-system"] {
            kube.put_namespace_meta(ns, json!({}), json!({}));
        }
        kube.put_namespace_meta(
            MESH_NAMESPACE,
            json!({DATAPLANE_MODE: "ambient"}),
            json!({}),
        );
    }

    /// ztunnel on the node's `/var/run/ztunnel/ztunnel.sock` (in the layout), knowing `workloads`.
    fn ztunnel(rn: &RuntimeNode, bin: &Path, workloads: &[PodPlan]) -> io::Result<Ztunnel> {
        let zds_socket = rn.node.root.join("var/run/ztunnel/ztunnel.sock");
        std::fs::create_dir_all(zds_socket.parent().expect("has a parent"))?;
        let ws: Vec<LocalWorkload> = workloads.iter().map(PodPlan::workload).collect();
        Ztunnel::start(bin, &zds_socket, &ws)
    }

    /// The agent's pod from the ambient manifest, ready (ztunnel connected).
    fn start_agent(&mut self) -> io::Result<()> {
        // info: every ADD/DEL in the plugin's log, every enrollment in the agent's.
        let mut env = vec![("PLUGIN_LOG_LEVEL", "info"), ("LOG_LEVEL", "info")];
        env.extend(self.agent_env.iter().copied());
        let host_paths =
            BTreeMap::from([("/var/run/netns".to_string(), self.netns_host_path.clone())]);
        let started = match &self.agent_yaml {
            None => self
                .rn
                .start_install_cni_from(AMBIENT_MANIFEST, &env, host_paths),
            Some(yaml) => self
                .rn
                .start_install_cni_yaml(yaml, &NO_HOST_SWITCH, host_paths),
        };
        started
            .map_err(|e| io::Error::other(format!("{e}\nztunnel log:\n{}", self.zt.log_tail(30))))
    }

    /// The agent's pod deleted (StopContainer with the grace period: SIGTERM) and a new one
    /// created, as when its DaemonSet pod is replaced. Returns the old agent's log.
    pub fn replace_agent(&mut self) -> io::Result<String> {
        let i = self.rn.install.as_ref().expect("the agent runs");
        let status = self.rn.cri.container_status(&i.container_id);
        let log_path = status.map(|s| s.log_path).unwrap_or_default();
        self.rn
            .stop_install_cni()
            .map_err(|e| io::Error::other(format!("stopping install-cni: {}", e.message())))?;
        // Read after the stop (its shutdown is in it); the runtime leaves the file.
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        self.start_agent()?;
        Ok(log)
    }

    /// Serves the pod, RunPodSandbox, checks its address is the planned one, reports it
    /// Running with that IP (as kubelet would) and starts its app.
    pub fn run(&self, plan: &PodPlan) -> CriResult<AmbientSandbox> {
        let demo = plan.demo_pod();
        self.rn.serve(&demo);
        let id = self
            .rn
            .cri
            .run_pod(&pod_config(&demo.namespace, &demo.name))?;
        let sandbox = self.rn.sandbox(id, &demo)?;
        assert_eq!(
            sandbox.net.ip,
            Some(IpAddr::V4(plan.ip)),
            "{}: host-local did not hand out the planned address; leases: {:?}\nplugin log:\n{}\ncontainerd:\n{}",
            plan.name,
            std::fs::read_dir(self.rn.node.ipam_dir.join(crate::node::NET))
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>()),
            self.rn.node.plugin_log(),
            self.rn.containerd.log_tail()
        );
        assert!(
            sandbox.netns().starts_with(&self.netns_dir),
            "{}: netns {} outside {}",
            plan.name,
            sandbox.netns().display(),
            self.netns_dir.display()
        );
        let kube = &self.rn.node.api;
        assert!(kube.set_status(&demo.namespace, &demo.name, "Running", &[plan.ip.into()]));
        let app = Probe::start(sandbox.netns(), &plan.name, &[Listen::tcp(APP_PORT)])
            .expect("the app's listener in the sandbox");
        Ok(AmbientSandbox {
            plan: plan.clone(),
            sandbox,
            app,
        })
    }

    /// [`AmbientRuntime::run`], panicking with the logs on failure.
    #[track_caller]
    pub fn run_ok(&self, plan: &PodPlan) -> AmbientSandbox {
        self.run(plan).unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox {}: {}\n{}",
                plan.name,
                e.message(),
                self.logs()
            )
        })
    }

    /// containerd SIGKILLed (its shims and sandboxes keep running) and started again.
    pub fn restart_containerd(&mut self) -> io::Result<()> {
        self.rn.containerd.restart()?;
        self.rn.cri = Cri::connect(&self.rn.containerd.socket)?;
        Ok(())
    }

    /// The app's connection from `from` to `dst:port` (as the app's uid; the first HBONE
    /// connection waits for a certificate, hence the long timeout).
    pub fn connect(&self, from: &AmbientSandbox, dst: IpAddr, port: u16) -> Outcome {
        let spec = ConnectSpec::new(dst, port)
            .uid(APP_UID)
            .gid(APP_UID)
            .timeout(Duration::from_secs(10));
        connect(from.netns(), &spec)
    }

    /// ztunnel's count of connections from `src` to `dst` its inbound (in `dst`) accepted
    /// over mutual TLS, i.e. HBONE.
    pub fn hbone_count(&self, src: &str, dst: &str) -> f64 {
        metric_sum(&self.zt.metrics(), OPENED, &hbone_labels(src, dst))
    }

    /// ztunnel's count of in-pod proxies it started (a pod taken again with the same netns
    /// is not restarted: the count stays).
    pub fn proxies_started(&self) -> f64 {
        metric_sum(
            &self.zt.metrics(),
            "workload_manager_proxies_started_total",
            &[],
        )
    }

    /// ztunnel's count of in-pod proxies running.
    pub fn active_proxies(&self) -> f64 {
        metric_sum(
            &self.zt.metrics(),
            "workload_manager_active_proxy_count",
            &[],
        )
    }

    /// The node's probe set (addresses of the pods the agent serves).
    pub fn probe_set(&self) -> Vec<IpAddr> {
        let mut v = probe_set(&self.rn.node.ns);
        v.sort();
        v
    }

    /// How many snapshots ztunnel took from an agent (one per ZDS connection).
    pub fn snapshots(&self) -> usize {
        self.zt.log().matches("received snapshot sent").count()
    }

    /// The agent's, ztunnel's and containerd's recent logs, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "agent (install-cni container) log:\n{}\nztunnel log:\n{}\ncontainerd:\n{}",
            tail(&self.rn.install_cni_log(), 40),
            self.zt.log_tail(30),
            self.rn.containerd.log_tail()
        )
    }

    /// Polls `check` until it holds; panics with `what` and the logs if not within [`BOUND`].
    #[track_caller]
    pub fn eventually(&self, what: &str, check: impl FnMut() -> bool) {
        eventually(what, || self.logs(), check);
    }
}

/// Whether ztunnel listens on all its in-pod ports in the namespace at `netns`.
pub fn served(netns: &Path) -> bool {
    serves_pod(netns).unwrap_or(false)
}

/// Whether none of ztunnel's in-pod ports listen in the namespace at `netns`.
pub fn not_served(netns: &Path) -> bool {
    serves_nothing(netns).unwrap_or(false)
}

/// `family name` of our nftables tables (`istio-*`: ambient's or the sidecar's) in the
/// namespace at `netns`.
pub fn istio_tables(netns: &Path) -> Vec<String> {
    let out = crate::exec_at(netns, "nft", &["list", "tables"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.strip_prefix("table "))
        .filter(|t| t.contains("istio-"))
        .map(str::to_string)
        .collect()
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
