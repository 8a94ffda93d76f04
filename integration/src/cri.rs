//! The product under a real container runtime: a private Debian `containerd` 1.6 (CRI plugin)
//! in a [`crate::node::Node`]'s namespace, driven over the CRI v1 API like kubelet does.
//!
//! * [`containerd`]: the daemon (own config, root, state, socket under a temp dir; torn down on
//!   drop, also on failure);
//! * [`images`]: the local pause image and the install-cni image archive;
//! * [`daemonset`]: the install-cni container spec from the rendered chart;
//! * [`ambient`]: ambient pods with the node agent's container and a real ztunnel;
//! * [`Cri`]: a blocking CRI client (RuntimeService) over the unix socket.
//!
//! containerd calls the CNI chain itself: ADD on RunPodSandbox with its own `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID`, `K8S_POD_UID`), DEL on
//! StopPodSandbox (with the netns) and on RemovePodSandbox, and never CHECK.

pub mod ambient;
pub mod containerd;
pub mod daemonset;
pub mod images;
pub mod runtime_node;

pub use containerd::{Containerd, PAUSE_IMAGE};
pub use daemonset::InstallCniSpec;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as api;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
pub use runtime_node::{RuntimeNode, Sandbox, has_our_rules, rules_at};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Bound on one CRI call (a hang fails the test instead of blocking it).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A CRI error: the gRPC status message (containerd puts the CNI plugin's error text there).
pub type CriResult<T> = Result<T, tonic::Status>;

/// A blocking CRI client: each call runs on the client's own tokio runtime.
pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

/// What a sandbox's status says about its network.
#[derive(Clone, Debug)]
pub struct SandboxNet {
    pub ready: bool,
    pub ip: Option<IpAddr>,
    pub additional_ips: Vec<IpAddr>,
    /// The sandbox's network namespace (from the verbose runtime spec).
    pub netns: Option<PathBuf>,
}

impl Cri {
    pub fn connect(socket: &Path) -> std::io::Result<Cri> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let socket = socket.to_path_buf();
        let channel = rt.block_on(async move {
            Endpoint::try_from("http://[::]:50051")
                .map_err(std::io::Error::other)?
                .timeout(CALL_TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(socket).await?,
                        ))
                    }
                }))
                .await
                .map_err(std::io::Error::other)
        })?;
        Ok(Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
        })
    }

    fn call<F, T>(&self, f: impl FnOnce(RuntimeServiceClient<Channel>) -> F) -> CriResult<T>
    where
        F: std::future::Future<Output = CriResult<tonic::Response<T>>>,
    {
        self.rt
            .block_on(f(self.client.clone()))
            .map(|r| r.into_inner())
    }

    pub fn version(&self) -> CriResult<api::VersionResponse> {
        self.call(|mut c| async move { c.version(api::VersionRequest::default()).await })
    }

    /// The CNI configuration the CRI plugin has loaded (verbose Status, `cniconfig`).
    pub fn cni_config(&self) -> CriResult<String> {
        let req = api::StatusRequest { verbose: true };
        self.call(|mut c| async move { c.status(req).await })
            .map(|r| r.info.get("cniconfig").cloned().unwrap_or_default())
    }

    /// Plugin types of the pod network chain the CRI plugin has loaded (loopback excluded).
    pub fn cni_chain(&self) -> CriResult<Vec<String>> {
        let v: serde_json::Value = serde_json::from_str(&self.cni_config()?).unwrap_or_default();
        let networks = v["Networks"].as_array().cloned().unwrap_or_default();
        Ok(networks
            .iter()
            .filter(|n| n["IFName"] != "lo")
            .flat_map(|n| {
                n["Config"]["Plugins"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|p| p["Network"]["type"].as_str().map(String::from))
            .collect())
    }

    pub fn run_pod(&self, config: &api::PodSandboxConfig) -> CriResult<String> {
        let req = run_request(config);
        self.call(|mut c| async move { c.run_pod_sandbox(req).await })
            .map(|r| r.pod_sandbox_id)
    }

    /// RunPodSandbox for every config at once; results in the same order, each with how long
    /// its call took.
    pub fn run_pods_concurrently(
        &self,
        configs: &[api::PodSandboxConfig],
    ) -> Vec<(CriResult<String>, Duration)> {
        self.rt.block_on(async {
            let tasks: Vec<_> = configs
                .iter()
                .map(|cfg| {
                    let mut c = self.client.clone();
                    let req = run_request(cfg);
                    tokio::spawn(async move {
                        let t0 = std::time::Instant::now();
                        let r = c.run_pod_sandbox(req).await;
                        (r.map(|r| r.into_inner().pod_sandbox_id), t0.elapsed())
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("RunPodSandbox task"));
            }
            out
        })
    }

    pub fn stop_pod(&self, id: &str) -> CriResult<()> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(|mut c| async move { c.stop_pod_sandbox(req).await })
            .map(drop)
    }

    /// RemovePodSandbox, then the pod's cgroup parents kubelet would remove (see
    /// [`pod_config`]; containerd removes only the sandbox's own cgroup).
    pub fn remove_pod(&self, id: &str) -> CriResult<()> {
        let uid = self.sandbox_uid(id);
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(|mut c| async move { c.remove_pod_sandbox(req).await })?;
        if let Some(uid) = uid {
            remove_pod_cgroups(&uid);
        }
        Ok(())
    }

    /// The pod UID a sandbox was run with, if containerd still knows it.
    fn sandbox_uid(&self, id: &str) -> Option<String> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let r = self
            .call(|mut c| async move { c.pod_sandbox_status(req).await })
            .ok()?;
        Some(r.status?.metadata?.uid)
    }

    pub fn list_pods(&self) -> CriResult<Vec<api::PodSandbox>> {
        self.call(|mut c| async move {
            c.list_pod_sandbox(api::ListPodSandboxRequest::default())
                .await
        })
        .map(|r| r.items)
    }

    /// The sandbox's state, addresses and network namespace.
    pub fn pod_net(&self, id: &str) -> CriResult<SandboxNet> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        let r = self.call(|mut c| async move { c.pod_sandbox_status(req).await })?;
        let status = r.status.unwrap_or_default();
        let net = status.network.unwrap_or_default();
        let parse = |s: &str| s.parse::<IpAddr>().ok();
        Ok(SandboxNet {
            ready: status.state == api::PodSandboxState::SandboxReady as i32,
            ip: parse(&net.ip),
            additional_ips: net
                .additional_ips
                .iter()
                .filter_map(|i| parse(&i.ip))
                .collect(),
            netns: r.info.get("info").and_then(|i| netns_of(i)),
        })
    }

    pub fn create_container(
        &self,
        pod_id: &str,
        config: &api::ContainerConfig,
        sandbox: &api::PodSandboxConfig,
    ) -> CriResult<String> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox.clone()),
        };
        self.call(|mut c| async move { c.create_container(req).await })
            .map(|r| r.container_id)
    }

    pub fn start_container(&self, id: &str) -> CriResult<()> {
        let req = api::StartContainerRequest {
            container_id: id.into(),
        };
        self.call(|mut c| async move { c.start_container(req).await })
            .map(drop)
    }

    /// StopContainer: SIGTERM, SIGKILL after `timeout_s`.
    pub fn stop_container(&self, id: &str, timeout_s: i64) -> CriResult<()> {
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout: timeout_s,
        };
        self.call(|mut c| async move { c.stop_container(req).await })
            .map(drop)
    }

    pub fn remove_container(&self, id: &str) -> CriResult<()> {
        let req = api::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call(|mut c| async move { c.remove_container(req).await })
            .map(drop)
    }

    pub fn container_status(&self, id: &str) -> CriResult<api::ContainerStatus> {
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        self.call(|mut c| async move { c.container_status(req).await })
            .map(|r| r.status.unwrap_or_default())
    }

    /// Stops and removes every sandbox (their containers go with them). Best effort: used by
    /// teardown.
    pub fn remove_everything(&self) {
        for p in self.list_pods().unwrap_or_default() {
            let _ = self.stop_pod(&p.id);
            let _ = self.remove_pod(&p.id);
        }
    }
}

fn run_request(config: &api::PodSandboxConfig) -> api::RunPodSandboxRequest {
    api::RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: String::new(),
    }
}

/// The network namespace path in containerd's verbose sandbox info (`runtimeSpec`).
fn netns_of(info: &str) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    v["runtimeSpec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .map(PathBuf::from)
}

/// The UID of the test pod `namespace/name`, shaped as Kubernetes' (a UUID), the same for
/// every call on one thread (one test): the sandbox config, its cgroup and the API server's Pod
/// agree on it, while tests running side by side with the same pod names get other UIDs, so
/// their pod cgroups never meet.
pub fn pod_uid(namespace: &str, name: &str) -> String {
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static THREADS: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static TEST: u64 = THREADS.fetch_add(1, Ordering::Relaxed);
    }
    let test = (std::process::id(), TEST.with(|t| *t));
    let half = |salt: u8| {
        let mut h = std::hash::DefaultHasher::new();
        (salt, test, namespace, name).hash(&mut h);
        h.finish()
    };
    let n = (u128::from(half(0)) << 64) | u128::from(half(1));
    let hex = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// kubelet's pod cgroup for the cgroupfs driver (what containerd's own config uses here):
/// the sandbox's processes land in `<hierarchy>/kubepods/besteffort/pod<UID>/<sandbox id>`,
/// so `/proc/PID/cgroup` names the pod as on a real node.
fn pod_cgroup_parent(uid: &str) -> String {
    format!("/kubepods/besteffort/pod{uid}")
}

/// Removes the pod's cgroup directory from every hierarchy, as kubelet does once a pod is
/// gone. Best effort. The shared `kubepods/besteffort` parents stay (as on a node): removing
/// them could race another test's runtime creating a pod under them.
fn remove_pod_cgroups(uid: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let roots: Vec<PathBuf> = std::iter::once(PathBuf::from("/sys/fs/cgroup"))
        .chain(hierarchies.flatten().map(|e| e.path()))
        .collect();
    for root in roots {
        let _ = std::fs::remove_dir(root.join(pod_cgroup_parent(uid).trim_start_matches('/')));
    }
}

/// A pod sandbox config as kubelet sends it for a pod with its own network namespace, in its
/// pod cgroup ([`pod_uid`]).
pub fn pod_config(namespace: &str, name: &str) -> api::PodSandboxConfig {
    let uid = pod_uid(namespace, name);
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: uid.clone(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        hostname: name.into(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: pod_cgroup_parent(&uid),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Pod as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
