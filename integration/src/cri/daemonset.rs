//! The install-cni container as kubelet would create it, taken from the rendered chart
//! (`deploy/manifests/istio-cni.yaml`), not from a hand copy: the DaemonSet's pod template
//! becomes a CRI sandbox config and container config.
//!
//! What kubelet does and this does too: `envFrom` the ConfigMap, `env` values and `fieldRef`s
//! (namespace, node name), `KUBERNETES_SERVICE_HOST/PORT`, the ServiceAccount token mount at
//! `/var/run/secrets/kubernetes.io/serviceaccount`, hostPath volumes (`DirectoryOrCreate` and
//! `FileOrCreate` created), the securityContext (user, group, capabilities, read-only rootfs,
//! seccomp, privileged), `hostNetwork`, the termination grace period (StopContainer's timeout)
//! and the readiness probe (an HTTP GET the caller performs).
//!
//! What a test node changes, and why:
//! * hostPath volumes are mapped onto the node's temporary layout (`<root>/<path>`), except
//!   kernel filesystems (`/proc`, `/sys`), which are the kernel's own. A volume mounted at the
//!   same path as its host path (the chart does this for `CNI_AGENT_RUN_DIR`, because the
//!   plugin, run on the host, reads files at the path install-cni wrote them) keeps that
//!   property: the container path moves with it, and any env value naming it follows. Not a
//!   file volume (`File`, `FileOrCreate`: the xtables lock): a tool finds it by that fixed name
//!   inside the container, so only its host side moves.
//! * `KUBERNETES_SERVICE_PROTOCOL=http`: the local API server speaks plain HTTP.
//!   An env value naming a path below such a volume (`ZTUNNEL_UDS_ADDRESS` under
//!   `/var/run/ztunnel`) follows too.
//! * `host_paths` puts a hostPath volume where the test node really has it, instead of under
//!   the layout (the runtime's netns dir, `cniNetnsDir`: where this containerd mounts sandbox
//!   namespaces).
//! * `extra_env` (e.g. `REDIRECT_BACKEND`) wins over the chart's values.
//! * A path the daemon reads by default, without the rendering naming it ([`DAEMON_PATH_DEFAULTS`]:
//!   Istio's chart leaves `CNI_AGENT_RUN_DIR` and `ZTUNNEL_UDS_ADDRESS` at their defaults), is
//!   set where its mount moved, as an env value naming it would follow.
//! * `resourceFieldRef` (Istio's `GOMEMLIMIT` from `limits.memory`): the container's value, or
//!   without one the node's allocatable (here: the machine's), as kubelet does; divisor 1.
//! * AppArmor (Istio's `appArmorProfile`/annotation `unconfined`) and SELinux options are not
//!   passed on: this machine enables neither, so the container runs unconfined either way.
//!
//! `mountPropagation` is passed on (HostToContainer: netns bind mounts the runtime makes
//! after the container started appear in it; the host side must be a shared mount).

use k8s_cri::v1 as cri;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Where kubelet mounts the ServiceAccount token.
pub const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Env vars the daemon reads with a default naming a path in its container (its `--help`, and
/// Istio's): when the rendering leaves one unset and its mount moved, it is set to the new place.
pub const DAEMON_PATH_DEFAULTS: [(&str, &str); 2] = [
    ("CNI_AGENT_RUN_DIR", "/var/run/istio-cni"),
    ("ZTUNNEL_UDS_ADDRESS", "/var/run/ztunnel/ztunnel.sock"),
];
/// Host paths that are the kernel's, never relocated.
const KERNEL_PATHS: [&str; 2] = ["/proc", "/sys"];

/// The node the container lands on, as the spec generation needs it.
#[derive(Clone, Debug)]
pub struct NodeLayout {
    /// Root of the temporary host layout (hostPath `/x` becomes `<root>/x`).
    pub root: PathBuf,
    /// The ServiceAccount dir (token, ca.crt) kubelet would project.
    pub service_account_dir: PathBuf,
    pub node_name: String,
    pub api_host: String,
    pub api_port: u16,
    pub extra_env: Vec<(String, String)>,
    /// hostPath (as the chart names it) -> where it is on this node, instead of `<root>/path`.
    pub host_paths: BTreeMap<String, PathBuf>,
}

/// The DaemonSet's container, ready for the CRI.
#[derive(Clone, Debug)]
pub struct InstallCniSpec {
    pub sandbox: cri::PodSandboxConfig,
    pub container: cri::ContainerConfig,
    /// Readiness probe: HTTP GET `path` on `port` in the pod's (here: the node's) network.
    pub readiness: (String, u16),
    /// StopContainer timeout (terminationGracePeriodSeconds).
    pub grace_seconds: i64,
    /// `hostNetwork`: the probe goes to the node's loopback; else to the pod's address (Istio's
    /// chart runs the agent in a pod network unless ambient shares the host's).
    pub host_network: bool,
    /// Env as given to the container (for assertions and failure messages).
    pub env: BTreeMap<String, String>,
}

/// Reads the DaemonSet and its ConfigMap from the rendered manifest (multi-document YAML).
pub fn from_manifest(yaml: &str, node: &NodeLayout) -> io::Result<InstallCniSpec> {
    let mut daemonset = None;
    let mut configmaps = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = serde_yaml::Value::deserialize(doc).map_err(io::Error::other)?;
        match v.get("kind").and_then(|k| k.as_str()) {
            Some("DaemonSet") => {
                daemonset = Some(serde_yaml::from_value::<DaemonSet>(v).map_err(io::Error::other)?)
            }
            Some("ConfigMap") => {
                let cm: ConfigMap = serde_yaml::from_value(v).map_err(io::Error::other)?;
                configmaps.insert(cm.metadata.name.clone().unwrap_or_default(), cm);
            }
            _ => {}
        }
    }
    let ds = daemonset.ok_or_else(|| io::Error::other("no DaemonSet in the manifest"))?;
    build(&ds, &configmaps, node)
}

fn build(
    ds: &DaemonSet,
    configmaps: &BTreeMap<String, ConfigMap>,
    node: &NodeLayout,
) -> io::Result<InstallCniSpec> {
    let bad = |what: &str| io::Error::other(format!("DaemonSet: {what}"));
    let namespace = ds.metadata.namespace.clone().unwrap_or("default".into());
    let name = ds.metadata.name.clone().ok_or_else(|| bad("no name"))?;
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or_else(|| bad("no pod template"))?;
    let c = pod.containers.first().ok_or_else(|| bad("no container"))?;
    let pod_name = format!("{name}-test");
    let host_network = pod.host_network.unwrap_or(false);

    let (mounts, moved) = mounts(c, pod, node)?;
    let env = env(c, configmaps, &namespace, &pod_name, node, &moved)?;
    let security = security_context(c, host_network);
    let readiness = readiness(c)?;

    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: pod_name.clone(),
            uid: format!("{pod_name}-uid"),
            namespace: namespace.clone(),
            attempt: 0,
        }),
        hostname: String::new(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: security.namespace_options.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone().ok_or_else(|| bad("no image"))?,
            ..Default::default()
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        mounts,
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(security),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(InstallCniSpec {
        sandbox,
        container,
        readiness,
        grace_seconds: pod.termination_grace_period_seconds.unwrap_or(30),
        host_network,
        env,
    })
}

/// hostPath volumes onto the layout, plus the ServiceAccount mount. Returns the mounts and the
/// container paths that moved (old -> new), for env values that name them.
fn mounts(
    c: &Container,
    pod: &k8s_openapi::api::core::v1::PodSpec,
    node: &NodeLayout,
) -> io::Result<(Vec<cri::Mount>, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    let mut moved = BTreeMap::new();
    for m in c.volume_mounts.iter().flatten() {
        let vol = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .ok_or_else(|| io::Error::other(format!("volumeMount {}: no such volume", m.name)))?;
        let hp = vol.host_path.as_ref().ok_or_else(|| {
            io::Error::other(format!("volume {}: only hostPath is supported", vol.name))
        })?;
        let host = match node.host_paths.get(&hp.path) {
            Some(p) => p.clone(),
            None => relocate(&node.root, &hp.path),
        };
        let is_file = matches!(hp.type_.as_deref(), Some("File" | "FileOrCreate"));
        match hp.type_.as_deref() {
            Some("DirectoryOrCreate") => std::fs::create_dir_all(&host)?,
            Some("FileOrCreate") => {
                std::fs::create_dir_all(host.parent().unwrap_or(Path::new("/")))?;
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&host)?;
            }
            _ => {}
        }
        let mut container_path = m.mount_path.clone();
        if m.mount_path == hp.path && host != Path::new(&hp.path) && !is_file {
            container_path = host.display().to_string();
            moved.insert(m.mount_path.clone(), container_path.clone());
        }
        out.push(cri::Mount {
            container_path,
            host_path: host.display().to_string(),
            readonly: m.read_only.unwrap_or(false),
            propagation: propagation(m.mount_propagation.as_deref())? as i32,
            ..Default::default()
        });
    }
    out.push(cri::Mount {
        container_path: SERVICE_ACCOUNT_MOUNT.into(),
        host_path: node.service_account_dir.display().to_string(),
        readonly: true,
        ..Default::default()
    });
    Ok((out, moved))
}

/// The CRI's propagation for a volumeMount's `mountPropagation` (kubelet's mapping).
fn propagation(mode: Option<&str>) -> io::Result<cri::MountPropagation> {
    use cri::MountPropagation as P;
    match mode {
        None | Some("None") => Ok(P::PropagationPrivate),
        Some("HostToContainer") => Ok(P::PropagationHostToContainer),
        Some("Bidirectional") => Ok(P::PropagationBidirectional),
        Some(other) => Err(io::Error::other(format!(
            "mountPropagation {other:?} is not a Kubernetes mode"
        ))),
    }
}

fn relocate(root: &Path, host_path: &str) -> PathBuf {
    if KERNEL_PATHS
        .iter()
        .any(|k| Path::new(host_path).starts_with(k))
    {
        PathBuf::from(host_path)
    } else {
        root.join(host_path.trim_start_matches('/'))
    }
}

fn env(
    c: &Container,
    configmaps: &BTreeMap<String, ConfigMap>,
    namespace: &str,
    pod_name: &str,
    node: &NodeLayout,
    moved: &BTreeMap<String, String>,
) -> io::Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    for from in c.env_from.iter().flatten() {
        let name = from
            .config_map_ref
            .as_ref()
            .map(|r| r.name.clone())
            .ok_or_else(|| io::Error::other("envFrom: only configMapRef is supported"))?;
        let cm = configmaps
            .get(&name)
            .ok_or_else(|| io::Error::other(format!("envFrom: no ConfigMap {name}")))?;
        env.extend(cm.data.clone().unwrap_or_default());
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                let field = from.field_ref.as_ref().map(|f| f.field_path.as_str());
                match field {
                    Some("metadata.namespace") => namespace.into(),
                    Some("metadata.name") => pod_name.into(),
                    Some("spec.nodeName") => node.node_name.clone(),
                    None if from.resource_field_ref.is_some() => {
                        resource_field(c, from.resource_field_ref.as_ref().expect("checked"))?
                    }
                    other => {
                        return Err(io::Error::other(format!(
                            "env {}: unsupported valueFrom {other:?}",
                            e.name
                        )));
                    }
                }
            }
            (None, None) => String::new(),
        };
        env.insert(e.name.clone(), value);
    }
    for v in env.values_mut() {
        if let Some(new) = follow_move(v, moved) {
            *v = new;
        }
    }
    for (name, default) in DAEMON_PATH_DEFAULTS {
        if !env.contains_key(name)
            && let Some(new) = follow_move(default, moved)
        {
            env.insert(name.into(), new);
        }
    }
    env.insert("KUBERNETES_SERVICE_HOST".into(), node.api_host.clone());
    env.insert("KUBERNETES_SERVICE_PORT".into(), node.api_port.to_string());
    env.insert("KUBERNETES_SERVICE_PROTOCOL".into(), "http".into());
    env.extend(node.extra_env.iter().cloned());
    Ok(env)
}

/// A `resourceFieldRef` as kubelet resolves it: the container's limit or request, else (a
/// limit not set) the node's allocatable: memory from `/proc/meminfo`, CPUs online.
fn resource_field(
    c: &Container,
    r: &k8s_openapi::api::core::v1::ResourceFieldSelector,
) -> io::Result<String> {
    let divisor = r.divisor.as_ref().map_or("1", |q| q.0.as_str());
    let err = |why: &str| io::Error::other(format!("resourceFieldRef {}: {why}", r.resource));
    if divisor != "1" {
        return Err(err("only divisor 1 is supported"));
    }
    let res = c.resources.clone().unwrap_or_default();
    let set = match r.resource.split_once('.') {
        Some(("limits", k)) => res.limits.and_then(|m| m.get(k).cloned()),
        Some(("requests", k)) => res.requests.and_then(|m| m.get(k).cloned()),
        _ => return Err(err("not limits.* or requests.*")),
    };
    if let Some(q) = set {
        return Ok(q.0);
    }
    match r.resource.as_str() {
        "limits.memory" | "requests.memory" => {
            let meminfo = std::fs::read_to_string("/proc/meminfo")?;
            let kib: u64 = meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .ok_or_else(|| err("no MemTotal in /proc/meminfo"))?;
            Ok((kib * 1024).to_string())
        }
        "limits.cpu" | "requests.cpu" => Ok(std::thread::available_parallelism()?.to_string()),
        _ => Ok("0".into()),
    }
}

/// `value` when it names a moved container path or a path below one, at its new place.
fn follow_move(value: &str, moved: &BTreeMap<String, String>) -> Option<String> {
    moved.iter().find_map(|(old, new)| {
        if value == old {
            return Some(new.clone());
        }
        let rest = value.strip_prefix(old.as_str())?.strip_prefix('/')?;
        Some(format!("{new}/{rest}"))
    })
}

fn security_context(c: &Container, host_network: bool) -> cri::LinuxContainerSecurityContext {
    let sc = c.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.clone().unwrap_or_default();
    let seccomp = sc.seccomp_profile.as_ref().map(|p| cri::SecurityProfile {
        profile_type: match p.type_.as_str() {
            "RuntimeDefault" => cri::security_profile::ProfileType::RuntimeDefault as i32,
            "Localhost" => cri::security_profile::ProfileType::Localhost as i32,
            _ => cri::security_profile::ProfileType::Unconfined as i32,
        },
        localhost_ref: p.localhost_profile.clone().unwrap_or_default(),
    });
    cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: caps.add.unwrap_or_default(),
            drop_capabilities: caps.drop.unwrap_or_default(),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(cri::NamespaceOption {
            network: if host_network {
                cri::NamespaceMode::Node as i32
            } else {
                cri::NamespaceMode::Pod as i32
            },
            pid: cri::NamespaceMode::Container as i32,
            ipc: cri::NamespaceMode::Pod as i32,
            ..Default::default()
        }),
        run_as_user: sc.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        no_new_privs: !sc.allow_privilege_escalation.unwrap_or(true),
        seccomp,
        ..Default::default()
    }
}

fn readiness(c: &Container) -> io::Result<(String, u16)> {
    let get = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .ok_or_else(|| io::Error::other("install-cni has no httpGet readiness probe"))?;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let port = match &get.port {
        IntOrString::Int(p) => *p as u16,
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port as u16)
            .ok_or_else(|| io::Error::other(format!("readiness probe: no port named {name}")))?,
    };
    Ok((get.path.clone().unwrap_or("/".into()), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_follow_a_moved_mount_and_paths_below_it() {
        let moved = BTreeMap::from([(
            "/var/run/ztunnel".to_string(),
            "/tmp/n/var/run/ztunnel".to_string(),
        )]);
        assert_eq!(
            follow_move("/var/run/ztunnel", &moved).as_deref(),
            Some("/tmp/n/var/run/ztunnel")
        );
        assert_eq!(
            follow_move("/var/run/ztunnel/ztunnel.sock", &moved).as_deref(),
            Some("/tmp/n/var/run/ztunnel/ztunnel.sock")
        );
        // A sibling with the same prefix is another path.
        assert_eq!(follow_move("/var/run/ztunnel-x/s", &moved), None);
        assert_eq!(follow_move("true", &moved), None);
    }

    /// Istio's chart: the run dir and ztunnel's dir mounted at their host paths, the daemon's
    /// defaults naming them (no env does), `GOMEMLIMIT` from `limits.memory` with no limit.
    #[test]
    fn the_daemons_path_defaults_follow_moved_mounts_and_resource_fields_resolve() {
        let root = std::env::temp_dir().join(format!("ds-defaults-{}", std::process::id()));
        let yaml = r#"
kind: DaemonSet
apiVersion: apps/v1
metadata: {name: istio-cni-node, namespace: istio-system}
spec:
  selector: {matchLabels: {k8s-app: istio-cni-node}}
  template:
    metadata: {labels: {k8s-app: istio-cni-node}}
    spec:
      containers:
        - name: install-cni
          image: x/install-cni:1
          readinessProbe: {httpGet: {path: /readyz, port: 8000}}
          env:
            - name: GOMEMLIMIT
              valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: "1"}}
          volumeMounts:
            - {mountPath: /var/run/istio-cni, name: run}
            - {mountPath: /var/run/ztunnel, name: zt}
      volumes:
        - {name: run, hostPath: {path: /var/run/istio-cni}}
        - {name: zt, hostPath: {path: /var/run/ztunnel, type: DirectoryOrCreate}}
"#;
        let node = NodeLayout {
            root: root.clone(),
            service_account_dir: root.join("sa"),
            node_name: "n".into(),
            api_host: "127.0.0.1".into(),
            api_port: 1,
            extra_env: Vec::new(),
            host_paths: BTreeMap::new(),
        };
        let spec = from_manifest(yaml, &node).unwrap();
        let r = root.display();
        assert_eq!(
            spec.env["CNI_AGENT_RUN_DIR"],
            format!("{r}/var/run/istio-cni")
        );
        assert_eq!(
            spec.env["ZTUNNEL_UDS_ADDRESS"],
            format!("{r}/var/run/ztunnel/ztunnel.sock")
        );
        assert!(spec.env["GOMEMLIMIT"].parse::<u64>().unwrap() > 1 << 20);
        assert!(!spec.host_network);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn mount_propagation_is_kubelets_mapping() {
        use cri::MountPropagation as P;
        assert_eq!(propagation(None).unwrap(), P::PropagationPrivate);
        assert_eq!(
            propagation(Some("HostToContainer")).unwrap(),
            P::PropagationHostToContainer
        );
        assert_eq!(
            propagation(Some("Bidirectional")).unwrap(),
            P::PropagationBidirectional
        );
        assert!(propagation(Some("Shared")).is_err());
    }
}
