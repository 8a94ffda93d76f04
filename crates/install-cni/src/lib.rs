//! install-cni: the node daemon, as Istio ships it (istio-reference §5). This crate only wires
//! the jobs together; each job is a crate of its own:
//!
//! - `cni_installer`: installs the plugin (binaries, kubeconfig, CNI config), keeps it
//!   installed, removes it on shutdown;
//! - `node_view`: the node's Kubernetes view (API client, one pod watch, running pods);
//! - `guardian`: repair, continuous reconcile and migration, controller mode, node taint;
//! - `ambient_agent`: the ambient node agent (plugin events, ZDS to ztunnel, host probe rule);
//! - `node_status`: readiness (`/readyz`, the plugin's STATUS), health and metrics.
//!
//! [`status`] serves the node's enrollment report (`istio-nftables status`) from all of them.
//!
//! [`config`] turns Istio's environment into each job's settings; [`daemon`] starts them.

pub mod config;
pub mod daemon;
pub mod status;
