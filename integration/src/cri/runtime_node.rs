//! A [`Node`] whose pods are started by a private containerd over the CRI, with the plugin
//! installed by the containerized install-cni (the DaemonSet's container from the rendered
//! chart). Fields drop in order: the CRI client, then containerd (stops and removes every
//! sandbox, kills itself and its shims, unmounts, removes its dir), then the node.

use super::daemonset::{InstallCniSpec, NodeLayout, from_manifest};
use super::images::{install_cni_archive, pause_archive, repo_root};
use super::{Containerd, Cri, CriResult, PAUSE_IMAGE, SandboxNet, pod_config};
use crate::node::{Node, NodeOptions, WAIT, http_get, wait_until};
use crate::pods::{Addrs, DemoPod, From, expectations};
use crate::{Probe, TestNetns};
use crate::{Transport, connect, send_udp};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// The rendered chart the install-cni container comes from.
pub const MANIFEST: &str = "deploy/manifests/istio-cni.yaml";
/// The same with `ambient.enabled=true`: the ambient node agent.
pub const AMBIENT_MANIFEST: &str = "deploy/manifests/istio-cni-ambient.yaml";
/// The node the install-cni container runs on (`spec.nodeName`).
pub const CRI_NODE_NAME: &str = "cri-node";

/// A sandbox containerd started.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub pod: DemoPod,
    pub net: SandboxNet,
}

impl Sandbox {
    pub fn netns(&self) -> &Path {
        self.net.netns.as_deref().expect("the sandbox has a netns")
    }
}

/// The running install-cni container.
#[derive(Debug)]
pub struct InstallCni {
    pub sandbox_id: String,
    pub container_id: String,
    pub spec: InstallCniSpec,
}

pub struct RuntimeNode {
    pub cri: Cri,
    pub containerd: Containerd,
    pub node: Node,
    pub install: Option<InstallCni>,
    /// Where the install-cni container reaches the API server (`KUBERNETES_SERVICE_HOST/PORT`):
    /// the node's loopback for a host-network pod; see [`RuntimeNode::serve_api_on_gateway`].
    pub api_endpoint: (String, u16),
}

impl RuntimeNode {
    /// Node, containerd, the pause and install-cni images imported. `pause_bin`: the
    /// `pause` package's static binary ([`super::images::pause_binary`]). `install_cni_env`: overrides of the chart's env (e.g.
    /// `REDIRECT_BACKEND`).
    pub fn new(pause_bin: &Path) -> io::Result<RuntimeNode> {
        RuntimeNode::with_node(pause_bin, NodeOptions::new(PathBuf::new()))
    }

    /// [`RuntimeNode::new`] on a node laid out with `opts` (e.g. the full API for ambient).
    pub fn with_node(pause_bin: &Path, opts: NodeOptions) -> io::Result<RuntimeNode> {
        Self::with_runtime(pause_bin, opts, true)
    }

    /// [`RuntimeNode::with_node`] with containerd mounting sandbox namespaces under its state
    /// dir or not ([`Containerd::start_with`]).
    pub fn with_runtime(
        pause_bin: &Path,
        opts: NodeOptions,
        netns_under_state_dir: bool,
    ) -> io::Result<RuntimeNode> {
        crate::cni::require_cni_tools();
        let node = Node::new(opts)?;
        let containerd = Containerd::start_with(&node, netns_under_state_dir)?;
        let pause = containerd.dir.join("pause.oci.tar");
        pause_archive(pause_bin, PAUSE_IMAGE, &pause)?;
        containerd.import(&pause)?;
        containerd.import(&install_cni_archive(&containerd.dir)?)?;
        let cri = Cri::connect(&containerd.socket)?;
        let api_endpoint = ("127.0.0.1".to_string(), node.api_port());
        Ok(RuntimeNode {
            cri,
            containerd,
            node,
            install: None,
            api_endpoint,
        })
    }

    /// The API server also at the node's bridge address ([`crate::node::GATEWAY_V4`], same
    /// port), as kube-proxy makes the `kubernetes` Service reachable: a DNAT in the node's
    /// namespace (from pods and from the node itself) to the server on its loopback. For an
    /// install-cni pod in a pod network (Istio's chart); its kubeconfig for the plugin names
    /// the same address, which the node reaches too.
    pub fn serve_api_on_gateway(&mut self) -> io::Result<()> {
        let port = self.node.api_port();
        let gw = crate::node::GATEWAY_V4;
        let to = format!("ip daddr {gw} tcp dport {port} dnat to 127.0.0.1:{port}");
        self.node.ns.sh(&format!(
            "sysctl -qw net.ipv4.conf.all.route_localnet=1 && nft -f - <<'EOF'\n\
             table ip cri-api-service {{\n\
               chain pre {{ type nat hook prerouting priority -100; {to}; }}\n\
               chain out {{ type nat hook output priority -100; {to}; }}\n\
             }}\nEOF"
        ))?;
        self.api_endpoint = (gw.to_string(), port);
        Ok(())
    }

    /// Creates and starts the install-cni container from the rendered chart and waits until its
    /// readiness probe passes.
    pub fn start_install_cni(&mut self, extra_env: &[(&str, &str)]) -> io::Result<()> {
        self.start_install_cni_from(MANIFEST, extra_env, BTreeMap::new())
    }

    /// [`RuntimeNode::start_install_cni`] from the rendered `manifest` (relative to the
    /// repository), with hostPath volumes at `host_paths` (see [`NodeLayout::host_paths`]).
    pub fn start_install_cni_from(
        &mut self,
        manifest: &str,
        extra_env: &[(&str, &str)],
        host_paths: BTreeMap<String, PathBuf>,
    ) -> io::Result<()> {
        let yaml = std::fs::read_to_string(repo_root().join(manifest))?;
        self.start_install_cni_yaml(&yaml, extra_env, host_paths)
    }

    /// [`RuntimeNode::start_install_cni_from`] a rendered manifest's text (e.g. Istio's chart).
    pub fn start_install_cni_yaml(
        &mut self,
        yaml: &str,
        extra_env: &[(&str, &str)],
        host_paths: BTreeMap<String, PathBuf>,
    ) -> io::Result<()> {
        let layout = NodeLayout {
            root: self.node.root.clone(),
            service_account_dir: self.node.sa_dir.clone(),
            node_name: CRI_NODE_NAME.into(),
            api_host: self.api_endpoint.0.clone(),
            api_port: self.api_endpoint.1,
            extra_env: extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            host_paths,
        };
        let mut spec = from_manifest(yaml, &layout)?;
        // kubelet's pod log directory (`/var/log/pods/<ns>_<name>_<uid>`), here under
        // containerd's dir; each container attempt logs to `<name>/<attempt>.log` in it.
        let meta = spec.sandbox.metadata.clone().unwrap_or_default();
        spec.sandbox.log_directory = self
            .containerd
            .dir
            .join("pod-logs")
            .join(format!("{}_{}_{}", meta.namespace, meta.name, meta.uid))
            .display()
            .to_string();
        let sandbox_id = self
            .cri
            .run_pod(&spec.sandbox)
            .map_err(|e| self.cri_err("RunPodSandbox install-cni", e))?;
        self.install = Some(InstallCni {
            sandbox_id,
            container_id: String::new(),
            spec,
        });
        self.start_install_cni_container(0)
    }

    fn cri_err(&self, what: &str, e: tonic::Status) -> io::Error {
        io::Error::other(format!(
            "{what}: {}\ncontainerd:\n{}",
            e.message(),
            self.containerd.log_tail()
        ))
    }

    /// Creates and starts install-cni's container (restart count `attempt`) in its sandbox and
    /// waits until its readiness probe passes.
    fn start_install_cni_container(&mut self, attempt: u32) -> io::Result<()> {
        let i = self.install.as_mut().expect("install-cni sandbox");
        if let Some(m) = i.spec.container.metadata.as_mut() {
            m.attempt = attempt;
            i.spec.container.log_path = format!("{}/{attempt}.log", m.name);
        }
        let i = self.install.as_ref().expect("install-cni sandbox");
        let container_id = self
            .cri
            .create_container(&i.sandbox_id, &i.spec.container, &i.spec.sandbox)
            .map_err(|e| self.cri_err("CreateContainer install-cni", e))?;
        self.cri
            .start_container(&container_id)
            .map_err(|e| self.cri_err("StartContainer install-cni", e))?;
        let (path, port) = i.spec.readiness.clone();
        // kubelet probes a pod-network pod at its address, a host-network one on the node.
        let ip = match i.spec.host_network {
            true => None,
            false => self.cri.pod_net(&i.sandbox_id).ok().and_then(|n| n.ip),
        };
        self.install.as_mut().expect("install-cni").container_id = container_id;
        let ready = wait_until(WAIT, || self.install_cni_probe(ip, port, &path) == 200);
        if !ready {
            return Err(io::Error::other(format!(
                "install-cni not ready on {ip:?}:{port}{path} within {WAIT:?}; its log:\n{}",
                self.install_cni_log()
            )));
        }
        Ok(())
    }

    /// The HTTP status of GET `path` on `port` of the install-cni pod (at `ip`, else the
    /// node's loopback) from the node's namespace; 0 when nothing answered.
    pub fn install_cni_probe(&self, ip: Option<std::net::IpAddr>, port: u16, path: &str) -> u16 {
        let get = || match ip {
            None => http_get(port, path).0,
            Some(ip) => http_get_at(ip, port, path),
        };
        self.node.ns.run(get).unwrap_or(0)
    }

    /// install-cni's container crashes (StopContainer with no grace: SIGKILL, no cleanup) and
    /// kubelet restarts it: a new container, the next attempt, in the same sandbox. Returns
    /// the old container's log.
    pub fn crash_and_restart_install_cni(&mut self) -> io::Result<String> {
        let log = self.crash_install_cni()?;
        self.restart_install_cni()?;
        Ok(log)
    }

    /// install-cni's container crashes (SIGKILL: nothing cleaned up) and is removed; its
    /// sandbox stays. Returns its log.
    pub fn crash_install_cni(&mut self) -> io::Result<String> {
        let old = self
            .install
            .as_ref()
            .expect("install-cni started")
            .container_id
            .clone();
        let log = self.install_cni_log();
        self.cri
            .stop_container(&old, 0)
            .map_err(|e| self.cri_err("StopContainer install-cni", e))?;
        self.cri
            .remove_container(&old)
            .map_err(|e| self.cri_err("RemoveContainer install-cni", e))?;
        Ok(log)
    }

    /// kubelet restarts the crashed container: the next attempt in the same sandbox, ready.
    pub fn restart_install_cni(&mut self) -> io::Result<()> {
        let i = self.install.as_ref().expect("install-cni sandbox");
        let attempt = i.spec.container.metadata.as_ref().map_or(0, |m| m.attempt) + 1;
        self.start_install_cni_container(attempt)
    }

    /// The install-cni container's output (containerd's CRI log file).
    pub fn install_cni_log(&self) -> String {
        let Some(i) = &self.install else {
            return String::new();
        };
        let status = self.cri.container_status(&i.container_id);
        let path = status.map(|s| s.log_path).unwrap_or_default();
        std::fs::read_to_string(&path).unwrap_or_else(|e| format!("({path}: {e})"))
    }

    /// StopContainer with the DaemonSet's grace period (SIGTERM: install-cni uninstalls), then
    /// removes its container and sandbox.
    pub fn stop_install_cni(&mut self) -> CriResult<()> {
        let i = self.install.take().expect("install-cni started");
        self.cri
            .stop_container(&i.container_id, i.spec.grace_seconds)?;
        self.cri.remove_container(&i.container_id)?;
        self.cri.stop_pod(&i.sandbox_id)?;
        self.cri.remove_pod(&i.sandbox_id)
    }

    /// Serves `pod` from the API server and asks containerd for its sandbox.
    pub fn run(&self, pod: &DemoPod) -> CriResult<Sandbox> {
        self.serve(pod);
        let id = self.cri.run_pod(&pod_config(&pod.namespace, &pod.name))?;
        self.sandbox(id, pod)
    }

    /// Serves `pod` from the API with the UID its sandbox config carries ([`pod_config`]), as
    /// kubelet creates a sandbox for the API server's pod: the plugin refuses a pod whose UID
    /// is not the sandbox's `K8S_POD_UID`.
    pub fn serve(&self, pod: &DemoPod) {
        let mut served = pod.clone();
        served.json["metadata"]["uid"] = super::pod_uid(&pod.namespace, &pod.name).into();
        self.node.serve(&served);
    }

    /// The status of a sandbox containerd started.
    pub fn sandbox(&self, id: String, pod: &DemoPod) -> CriResult<Sandbox> {
        let net = self.cri.pod_net(&id)?;
        Ok(Sandbox {
            id,
            pod: pod.clone(),
            net,
        })
    }

    /// StopPodSandbox (DEL with the netns) + RemovePodSandbox (DEL again).
    pub fn stop_and_remove(&self, s: &Sandbox) -> CriResult<()> {
        self.cri.stop_pod(&s.id)?;
        self.cri.remove_pod(&s.id)
    }

    /// host-local leases currently held on the node's network.
    pub fn leases(&self) -> usize {
        std::fs::read_dir(self.node.ipam_dir.join(crate::node::NET))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .parse::<std::net::IpAddr>()
                            .is_ok()
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Connections that prove the sandbox's redirect (or its absence), each checked where it
    /// lands: the pod runs the sidecar/app listeners, the node the "world". Returns the
    /// mismatches.
    pub fn traffic_mismatches(&self, s: &Sandbox) -> Vec<String> {
        let _sidecar = Probe::sidecar(s.netns()).expect("listeners in the sandbox");
        let _world = Probe::world(self.node.ns.path()).expect("listeners in the node");
        let addrs = Addrs {
            pod_v4: s.net.ip.expect("the sandbox has an IPv4 address"),
            pod_v6: s.net.additional_ips.iter().copied().find(|a| a.is_ipv6()),
            gw_v4: crate::node::GATEWAY_V4.parse().unwrap(),
            gw_v6: crate::node::GATEWAY_V6.parse().unwrap(),
        };
        let mut bad = Vec::new();
        for e in expectations(s.pod.kind, &addrs) {
            let ns = match e.from {
                From::Pod => s.netns(),
                From::Node => self.node.ns.path(),
            };
            let out = match e.transport {
                Transport::Tcp => connect(ns, &e.spec),
                Transport::Udp => send_udp(ns, &e.spec),
            };
            if !e.matches(&out) {
                bad.push(format!("{}: expected {}, got {out}", e.what, e.expected()));
            }
        }
        bad
    }

    /// The node namespace.
    pub fn node_ns(&self) -> &TestNetns {
        &self.node.ns
    }
}

/// The status code of `GET path` on `ip:port` (0: no answer within 5 s).
fn http_get_at(ip: std::net::IpAddr, port: u16, path: &str) -> u16 {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&(ip, port).into(), timeout) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(timeout));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n");
    let mut resp = String::new();
    if s.write_all(req.as_bytes()).is_err() || s.read_to_string(&mut resp).is_err() {
        return 0;
    }
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// nft (stateless) and iptables-legacy `-A` rules in the network namespace at `netns`.
pub fn rules_at(netns: &Path) -> String {
    let run = |program: &str, args: &[&str]| {
        crate::exec_at(netns, program, args)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let nft = run("nft", &["-s", "list", "ruleset"]);
    let legacy: String = run("iptables-legacy-save", &[])
        .lines()
        .chain(run("ip6tables-legacy-save", &[]).lines())
        .filter(|l| l.starts_with("-A"))
        .map(|l| format!("{l}\n"))
        .collect();
    nft.trim().to_string() + legacy.trim()
}

/// Whether the rules include the plugin's (nft tables or iptables chains).
pub fn has_our_rules(rules: &str) -> bool {
    rules.contains("istio-proxy-") || rules.contains("ISTIO_")
}
