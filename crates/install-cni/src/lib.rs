//! install-cni: the node daemon that installs the istio-cni plugin, keeps it installed and
//! removes it on shutdown (Istio's `install-cni` contract, istio-reference §5).
//!
//! Pure logic (config validation, CNI config discovery/merge, kubeconfig building, backend
//! decision, throttle) is separate from I/O (`install`, `watch`, `http`, `daemon`).

pub mod ambient;
pub mod config;
pub mod daemon;
pub mod podplan;
pub mod reconcile;
pub mod repair;
pub mod taint;
