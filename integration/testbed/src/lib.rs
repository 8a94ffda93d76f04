//! The kernel test rigs shared by every crate's tests. Depends on no crate of this workspace
//! (it sits below all of them, so any crate's tests may use it without a cycle); the rigs that
//! need the product's own types are in `integration`.
//!
//! * [`TestNetns`]: a uniquely named network namespace (`ip netns add`), loopback up, deleted
//!   on drop — also when the test panics.
//! * [`PodWorld`]: a "pod" and a "world" namespace joined by a veth pair, dual stack or
//!   IPv4 only, with default routes both ways. Extra links (e.g. a KubeVirt-style `eth1`)
//!   can be added with [`PodWorld::add_link`].
//! * [`Probe`]: TCP/UDP listeners inside a namespace that record every connection, with the
//!   port it landed on and its original destination (`SO_ORIGINAL_DST`, or the local address
//!   for TPROXY), and answer the client with the same facts.
//! * [`connect`] / [`send_udp`]: a client that runs inside a namespace as a given uid/gid
//!   (only its own thread changes identity) and reports where the connection landed.
//!
//! * [`run_in`]: a closure inside a namespace, on a thread of its own.
//!
//! * [`ambient`]: an ambient node (the agent, a real ztunnel, the full fake API, a fake
//!   kubelet) and pods ADDed through the chain.
//! * [`cni`]: the CNI client side (`cnitool`, what a command printed).
//! * [`install_fixtures`]: Istio's install-cni fixtures and how our install is compared.
//! * [`kube_api`]: the one fake Kubernetes API server (pods, namespaces, nodes, DaemonSets,
//!   events; get, list, watch, patch) with every fault mode the tests use.
//! * [`dns`]: one DNS A query from inside a namespace (who answers: ztunnel's DNS proxy?).
//! * [`ztunnel`]: a real ztunnel (built by `scripts/build-ztunnel.sh`) in its own namespace,
//!   the peer of the ambient node agent's ZDS socket.
//! * [`node`]: the whole product on one machine — a node namespace with a host layout,
//!   the real `install-cni` daemon, and the [`pods`] a node sees.
//! * [`host_probe`], [`legacy_trace`]: what the host probe rule's and `explain --trace`'s
//!   kernel tests share; [`cgroup`], [`proc_stats`], [`uds_flood`]: pod cgroups, a process's
//!   CPU and memory, a socket flood.
//!
//! Everything runs in-process (no python, no `ip netns exec` per connection), with bounded
//! timeouts, so a test can afford hundreds of namespaces and connections. All of it needs
//! root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
//!
//! ```no_run
//! use testbed::*;
//! let w = PodWorld::new().unwrap();
//! let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
//! let _server = Probe::world(w.world.path()).unwrap();
//! let out = connect(w.pod.path(), &ConnectSpec::new(w.world_v4.into(), 80));
//! assert_eq!(out.landed_port(), Some(80)); // nothing redirects yet
//! ```

pub mod ambient;
pub mod cgroup;
pub mod cni;
pub mod dns;
pub mod host_probe;
pub mod install_fixtures;
pub mod kube_api;
pub mod legacy_trace;
pub mod node;
mod ns;
pub mod pods;
mod probe;
pub mod proc_stats;
pub mod uds_flood;
pub mod ztunnel;

pub use ns::{Link, POD_LINK_LOCAL, PodWorld, TestNetns, WORLD_LINK_LOCAL, exec_at, run_in};

/// istio-iptables flags of the CNI plugin's default sidecar pod (istio-reference §1.6 b).
pub const CNI_DEFAULT_FLAGS: [&str; 16] = [
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
    "-o",
    "15020",
];

/// [`CNI_DEFAULT_FLAGS`] with `--ipv6 on|off|auto` (e.g. IPv6 rules whatever the addresses).
pub fn cni_default_flags_with_ipv6(ipv6: &'static str) -> Vec<&'static str> {
    let mut flags = CNI_DEFAULT_FLAGS.to_vec();
    flags.extend(["--ipv6", ipv6]);
    flags
}
pub use probe::{
    Accepted, ConnectSpec, Landed, Listen, ListenKind, Outcome, Probe, SHORT_TIMEOUT, Transport,
    connect, send_udp,
};

/// True when the process may create namespaces (root). Tests that need the kernel call
/// [`require_root`] so a non-root run fails with one clear message instead of many.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Panics with a clear message when not running as root.
pub fn require_root() {
    assert!(
        is_root(),
        "this test needs root (network namespaces, netfilter); run it as root"
    );
}
