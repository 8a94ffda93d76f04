//! HTTP/1.1 over a unix socket in the node's run dir, both ends of it: the plugin asks
//! ([`client`]), the node daemon answers ([`server`]). Istio's plugin talks to its agent the
//! same way (`pluginevent.sock`); the pod lookup (`pods.sock`) uses the same two halves.
//!
//! Every socket is root-only (0600) and bound without following a planted file; every request
//! is bounded by one timeout, so a hung daemon can never hold a pod's ADD.

pub mod client;
pub mod server;

pub use hyper::{Method, StatusCode};
