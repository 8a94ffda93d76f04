//! The demo pods: real Pod JSON (as the API server returns it for an injected Bookinfo pod),
//! one per kind of pod a node sees, and what real connections must do in each.

use crate::probe::{ConnectSpec, Outcome, SHORT_TIMEOUT, Transport};
use serde_json::Value;
use std::net::IpAddr;

/// The label (pod or namespace) that enrolls pods with Istio's default selectors (here, below
/// the ambient node that uses it too, as a pod carries it).
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// An injected sidecar pod (Istio 1.27 injector output: istio-validation init container,
/// istio-proxy running as 1337, the status annotation).
pub const SIDECAR_POD_JSON: &str = include_str!("../fixtures/pod-sidecar.json");
/// A pod in a namespace without injection.
pub const PLAIN_POD_JSON: &str = include_str!("../fixtures/pod-no-sidecar.json");

/// The uid the application containers run as.
pub const APP_UID: u32 = 1000;
/// Envoy's uid/gid (the injector's default).
pub const PROXY_UID: u32 = 1337;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// REDIRECT, the default.
    Sidecar,
    /// `sidecar.istio.io/interceptionMode: TPROXY` (inbound via TPROXY, proxy as root).
    Tproxy,
    /// `ISTIO_META_DNS_CAPTURE=true` on istio-proxy.
    DnsCapture,
    /// `ISTIO_DUAL_STACK=true`, exercised over IPv6.
    DualStack,
    /// A sidecar pod in `kube-system`, which the plugin is configured to leave alone.
    ExcludedNamespace,
    /// No istio-proxy at all.
    NoSidecar,
}

impl PodKind {
    pub const ALL: [PodKind; 6] = [
        PodKind::Sidecar,
        PodKind::Tproxy,
        PodKind::DnsCapture,
        PodKind::DualStack,
        PodKind::ExcludedNamespace,
        PodKind::NoSidecar,
    ];

    /// Whether the plugin programs rules for it.
    pub fn captured(self) -> bool {
        !matches!(self, PodKind::ExcludedNamespace | PodKind::NoSidecar)
    }

    pub fn describe(self) -> &'static str {
        match self {
            PodKind::Sidecar => "sidecar (REDIRECT)",
            PodKind::Tproxy => "sidecar, TPROXY interception",
            PodKind::DnsCapture => "sidecar with DNS capture",
            PodKind::DualStack => "sidecar, dual stack (IPv6)",
            PodKind::ExcludedNamespace => "sidecar in an excluded namespace",
            PodKind::NoSidecar => "no sidecar",
        }
    }
}

/// One demo pod: its Kubernetes identity and the JSON the API server returns.
#[derive(Clone, Debug)]
pub struct DemoPod {
    pub kind: PodKind,
    pub namespace: String,
    pub name: String,
    pub json: Value,
}

impl DemoPod {
    /// A workload pod as the API server returns it once scheduled on `node` and before
    /// kubelet reports its IP (Pending): in `namespace` with `uid`, labelled `app=<name>` (and
    /// `istio.io/dataplane-mode=ambient` when `ambient_label`), its service account named
    /// after it (ztunnel's identity).
    pub fn scheduled(
        kind: PodKind,
        name: &str,
        namespace: &str,
        uid: &str,
        node: &str,
        ambient_label: bool,
    ) -> DemoPod {
        let mut pod = DemoPod::new(kind, name);
        let j = &mut pod.json;
        j["metadata"]["name"] = name.into();
        j["metadata"]["namespace"] = namespace.into();
        j["metadata"]["uid"] = uid.into();
        j["metadata"]["labels"] = serde_json::json!({"app": name});
        if ambient_label {
            j["metadata"]["labels"][DATAPLANE_MODE] = "ambient".into();
        }
        j["spec"]["nodeName"] = node.into();
        j["spec"]["serviceAccountName"] = name.into();
        j["status"] = serde_json::json!({"phase": "Pending"});
        pod.namespace = namespace.into();
        pod
    }

    /// The pod of `kind`, named `name` (in `default`, or `kube-system` for the excluded one).
    pub fn new(kind: PodKind, name: &str) -> DemoPod {
        let mut json: Value = serde_json::from_str(match kind {
            PodKind::NoSidecar => PLAIN_POD_JSON,
            _ => SIDECAR_POD_JSON,
        })
        .expect("fixture is JSON");
        let namespace = match kind {
            PodKind::ExcludedNamespace => "kube-system",
            _ => "default",
        };
        if kind == PodKind::Tproxy {
            json["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] = "TPROXY".into();
        }
        let proxy = json["spec"]["containers"]
            .as_array_mut()
            .expect("containers")
            .iter_mut()
            .find(|c| c["name"] == "istio-proxy");
        match (kind, proxy) {
            (PodKind::Tproxy, Some(proxy)) => {
                // What the injector writes for TPROXY: the annotation (above), and the proxy
                // as root with NET_ADMIN (runAsUser 0 keeps the 1337 default in the rules).
                let sc = &mut proxy["securityContext"];
                sc["runAsUser"] = 0.into();
                sc["runAsNonRoot"] = false.into();
                sc["capabilities"]["add"] = serde_json::json!(["NET_ADMIN"]);
                push_env(proxy, "ISTIO_META_INTERCEPTION_MODE", "TPROXY");
            }
            (PodKind::DnsCapture, Some(proxy)) => push_env(proxy, "ISTIO_META_DNS_CAPTURE", "true"),
            (PodKind::DualStack, Some(proxy)) => push_env(proxy, "ISTIO_DUAL_STACK", "true"),
            _ => {}
        }
        json["metadata"]["name"] = name.into();
        json["metadata"]["namespace"] = namespace.into();
        DemoPod {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            json,
        }
    }
}

fn push_env(container: &mut Value, name: &str, value: &str) {
    let env = container["env"].as_array_mut().expect("env");
    env.retain(|e| e["name"] != name);
    env.push(serde_json::json!({"name": name, "value": value}));
}

/// The addresses a probe needs: the pod's (from the ADD result) and the node's gateway.
#[derive(Clone, Copy, Debug)]
pub struct Addrs {
    pub pod_v4: IpAddr,
    pub pod_v6: Option<IpAddr>,
    pub gw_v4: IpAddr,
    pub gw_v6: IpAddr,
}

/// Who opens a probe connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum From {
    /// Inside the pod namespace.
    Pod,
    /// The node (kubelet probes, other pods through the bridge).
    Node,
}

/// One connection and where it must land: `(probe name, port)`, or `None` for "nothing
/// answers" (fail closed).
#[derive(Clone, Debug)]
pub struct Expect {
    pub what: String,
    pub from: From,
    pub transport: Transport,
    pub spec: ConnectSpec,
    pub land: Option<(&'static str, u16)>,
}

impl Expect {
    fn tcp(what: &str, from: From, spec: ConnectSpec, land: (&'static str, u16)) -> Expect {
        Expect {
            what: what.into(),
            from,
            transport: Transport::Tcp,
            spec,
            land: Some(land),
        }
    }

    fn udp(what: &str, from: From, spec: ConnectSpec, land: (&'static str, u16)) -> Expect {
        Expect {
            transport: Transport::Udp,
            ..Expect::tcp(what, from, spec, land)
        }
    }

    /// Whether `out` is what was expected.
    pub fn matches(&self, out: &Outcome) -> bool {
        match (self.land, out.landed()) {
            (Some((probe, port)), Some(l)) => l.probe == probe && l.port == port,
            (None, None) => true,
            _ => false,
        }
    }

    pub fn expected(&self) -> String {
        match self.land {
            Some((probe, port)) => format!("{probe}:{port}"),
            None => "nothing".into(),
        }
    }
}

/// The connections that prove a pod's redirect. The pod runs `Probe::sidecar` (named "pod":
/// Envoy's ports plus the app's 8080), the node runs `Probe::world` (named "world": 80, 53, …).
pub fn expectations(kind: PodKind, a: &Addrs) -> Vec<Expect> {
    let app = |dst: IpAddr, port| ConnectSpec::new(dst, port).uid(APP_UID).gid(APP_UID);
    let envoy = |dst: IpAddr, port| ConnectSpec::new(dst, port).uid(PROXY_UID).gid(PROXY_UID);
    let node = ConnectSpec::new;
    let (pod, gw) = (a.pod_v4, a.gw_v4);
    let (t, udp) = (Expect::tcp, Expect::udp);
    let lo = "127.0.0.1".parse().unwrap();
    let mut v = match kind {
        PodKind::Sidecar => vec![
            t("app -> node:80", From::Pod, app(gw, 80), ("pod", 15001)),
            t(
                "node -> pod:8080",
                From::Node,
                node(pod, 8080),
                ("pod", 15006),
            ),
            t(
                "envoy (uid 1337) -> node:80",
                From::Pod,
                envoy(gw, 80),
                ("world", 80),
            ),
            t(
                "kubelet -> pod:15021 (health)",
                From::Node,
                node(pod, 15021),
                ("pod", 15021),
            ),
            t(
                "app -> 127.0.0.1:8080",
                From::Pod,
                app(lo, 8080),
                ("pod", 8080),
            ),
        ],
        PodKind::Tproxy => vec![
            t(
                "node -> pod:8080 (TPROXY)",
                From::Node,
                node(pod, 8080),
                ("pod", 15006),
            ),
            t("app -> node:80", From::Pod, app(gw, 80), ("pod", 15001)),
            t(
                "kubelet -> pod:15021 (health)",
                From::Node,
                node(pod, 15021),
                ("pod", 15021),
            ),
        ],
        PodKind::DnsCapture => vec![
            udp(
                "app -> node:53/udp (DNS)",
                From::Pod,
                app(gw, 53),
                ("pod", 15053),
            ),
            udp(
                "envoy -> node:53/udp (DNS upstream)",
                From::Pod,
                envoy(gw, 53),
                ("world", 53),
            ),
            t("app -> node:80", From::Pod, app(gw, 80), ("pod", 15001)),
        ],
        PodKind::DualStack => {
            let pod6 = a.pod_v6.expect("the dual-stack pod has an IPv6 address");
            vec![
                t(
                    "app -> [node]:80 (IPv6)",
                    From::Pod,
                    app(a.gw_v6, 80),
                    ("pod", 15001),
                ),
                t(
                    "node -> [pod]:8080 (IPv6)",
                    From::Node,
                    node(pod6, 8080),
                    ("pod", 15006),
                ),
                t(
                    "app -> node:80 (IPv4)",
                    From::Pod,
                    app(gw, 80),
                    ("pod", 15001),
                ),
            ]
        }
        PodKind::ExcludedNamespace | PodKind::NoSidecar => vec![
            t("app -> node:80", From::Pod, app(gw, 80), ("world", 80)),
            t(
                "node -> pod:8080",
                From::Node,
                node(pod, 8080),
                ("pod", 8080),
            ),
        ],
    };
    for e in &mut v {
        if e.land.is_none() {
            e.spec.timeout = SHORT_TIMEOUT;
        }
    }
    v
}
