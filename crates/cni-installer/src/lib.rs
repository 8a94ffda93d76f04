//! The file installer (Istio's `install-cni` contract, istio-reference §5): puts the istio-cni
//! binaries, the plugin's kubeconfig and its entry in the node's CNI configuration in place,
//! keeps them there while anything else rewrites them, and removes exactly what it put there
//! on shutdown.
//!
//! Pure logic (CNI config discovery and merging in [`discovery`], the kubeconfig in
//! [`kubeconfig`], the storm [`throttle`]) is separate from I/O (one install pass and the
//! cleanup in [`install`], the inotify [`watch`], the loop in [`run`]). On shutdown,
//! [`upgrade`] decides whether the install stays for the next daemon (a rollout) or goes
//! ([`affinity`]: whether the DaemonSet still selects this node). [`owned`]: the opt-in
//! conflist of our own (`ISTIO_OWNED_CNI_CONFIG`).

pub mod affinity;
pub mod discovery;
pub mod gojson;
pub mod install;
pub mod kubeconfig;
pub mod owned;
pub mod run;
pub mod settings;
pub mod throttle;
pub mod upgrade;
pub mod watch;

pub use settings::Settings;
