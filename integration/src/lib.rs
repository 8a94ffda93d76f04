//! The whole product on one node, for `integration/tests`, the demo and the benchmarks:
//! everything of [`testbed`] (re-exported: namespaces, probes, the fake API server, the node,
//! ztunnel, the ambient node), plus the rigs that need the product's own types, which testbed
//! (below every product crate) cannot have:
//!
//! * [`OpenConnection`]: an `explain::Connection` opened for real in a [`PodWorld`];
//! * [`host_probe`]: a pod on a node with the host probe rule, through `redirect`;
//! * [`legacy_trace`]: a plan programmed with the iptables-legacy backend, through `redirect`;
//! * [`ambient`]: the node's legacy probe ipset as `iptables_legacy::live` reads it;
//! * [`golden`]: Istio's goldens as capture's types (the `golden` crate);
//! * [`cri`]: the same node under a real container runtime — a private containerd driven over
//!   the CRI, running the install-cni image with the chart's DaemonSet spec.

pub mod cri;

pub use golden;
pub use testbed::*;

/// An `explain::Connection` opened for real.
pub trait OpenConnection {
    /// Opens `c` for real: outbound from the pod, inbound from the world, with its source,
    /// uid, gid and mark, through `zone` when given (link-local addresses); where it landed.
    /// What `explain`'s answers are compared with.
    fn open(&self, c: &explain::Connection, zone: Option<&str>) -> Outcome;
}

impl OpenConnection for PodWorld {
    fn open(&self, c: &explain::Connection, zone: Option<&str>) -> Outcome {
        let mut spec = ConnectSpec::new(c.dst.ip(), c.dst.port());
        if let Some(z) = zone {
            spec = spec.zone(z);
        }
        if let Some(s) = c.src {
            spec = spec.src(s);
        }
        if let Some(u) = c.uid {
            spec = spec.uid(u);
        }
        if let Some(g) = c.gid {
            spec = spec.gid(g);
        }
        if let Some(m) = c.mark {
            spec = spec.mark(m);
        }
        let ns = match c.direction {
            explain::Direction::Outbound => self.pod.path(),
            explain::Direction::Inbound => self.world.path(),
        };
        match c.protocol {
            explain::Protocol::Tcp => connect(ns, &spec),
            explain::Protocol::Udp => send_udp(ns, &spec),
        }
    }
}

/// [`testbed::ambient`] and the node's legacy probe ipset as the product reads it.
pub mod ambient {
    use std::net::IpAddr;
    use testbed::TestNetns;
    pub use testbed::ambient::*;

    /// The node's legacy probe ipset of an [`AmbientNode`].
    pub trait ProbeIpset {
        /// The members of the node's legacy probe ipset `set` (see [`probe_ipset`]).
        fn probe_ipset(&self, set: &str) -> Vec<(IpAddr, String)>;
    }

    impl ProbeIpset for AmbientNode {
        fn probe_ipset(&self, set: &str) -> Vec<(IpAddr, String)> {
            probe_ipset(&self.node.ns, set)
        }
    }

    /// The members of the node's legacy probe ipset `set` (`istio-inpod-probes-v4/v6`) as
    /// `(address, comment)`; empty when the set does not exist.
    pub fn probe_ipset(node: &TestNetns, set: &str) -> Vec<(IpAddr, String)> {
        let out = node.exec_ok("ipset", &["save", set]).unwrap_or_default();
        iptables_legacy::live::parse_ipset_save(&out, set)
            .into_iter()
            .map(|m| (m.addr, m.comment.unwrap_or_default()))
            .collect()
    }
}

/// [`testbed::host_probe`] and a pod on a node with the host probe rule, through `redirect`.
pub mod host_probe {
    use capture::{HostProbeConfig, Plan, ProbeSource};
    use std::net::IpAddr;
    use testbed::PodWorld;
    pub use testbed::host_probe::*;

    /// An IPv4 ambient pod and its node (the world side): the pod has the default in-pod rules
    /// (nft), the node the nft host probe rule for the kubelet's uid `kubelet_uid` with the pod's
    /// address in its set. Returns the two and the host rule's plan.
    pub fn nft_pod_on_node(kubelet_uid: u32) -> (PodWorld, Plan) {
        pod_on_node(redirect::Backend::Nft, ProbeSource::KubeletUid(kubelet_uid))
    }

    /// [`nft_pod_on_node`] on an iptables-legacy node: the pod's ambient rules and Istio's legacy
    /// host rule (`nat ISTIO_POSTRT`, any local socket, the ipset `istio-inpod-probes-v4`).
    pub fn legacy_pod_on_node() -> (PodWorld, Plan) {
        pod_on_node(
            redirect::Backend::IptablesLegacy,
            ProbeSource::AnyLocalSocket,
        )
    }

    fn pod_on_node(backend: redirect::Backend, source: ProbeSource) -> (PodWorld, Plan) {
        let w = PodWorld::ipv4_only().expect("pod and world namespaces");
        let inpod = Plan::ambient(&capture::AmbientConfig::default()).expect("the in-pod plan");
        let fixed = redirect::BackendChoice::Fixed(backend);
        redirect::apply(&inpod, Some(w.pod.path()), fixed).expect("the in-pod rules");
        let host = HostProbeConfig::default_plan(source, false);
        let pod = IpAddr::V4(w.pod_v4);
        let rule = redirect::host_probe::HostProbeRule::new(backend);
        in_ns(w.world.path(), || {
            rule.ensure(&host)?;
            rule.add_pod_ips(&host, &[pod], "uid-a")
        })
        .expect("the host rule");
        (w, host)
    }
}

/// [`testbed::legacy_trace`] and a plan programmed with the iptables-legacy backend.
pub mod legacy_trace {
    use std::path::Path;
    pub use testbed::legacy_trace::*;

    /// Programs `plan` into the namespace at `netns` with the iptables-legacy backend (the
    /// product's own path: `redirect::apply`).
    pub fn apply_legacy(netns: &Path, plan: &capture::Plan) {
        let fixed = redirect::BackendChoice::Fixed(redirect::Backend::IptablesLegacy);
        redirect::apply(plan, Some(netns), fixed).expect("apply with iptables-legacy");
    }
}
