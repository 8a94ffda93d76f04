//! The single source of truth for *what* the redirect rules are.
//!
//! `Config` holds every istio-iptables setting, typed and validated; `Plan::build` turns a
//! `Config` plus the facts read from the target namespace (`Facts`) into an ordered list of
//! rules that every backend renders. Nothing here touches the kernel, files or the network.

mod ambient;
mod backend;
mod build;
mod config;
mod ids;
mod net;
mod parse;
mod plan;

pub use ambient::*;
pub use backend::Backend;
pub use config::*;
pub use ids::{Id, IdDb, IdError, IdKind};
pub use net::{DisplayIp, IpNet};
pub use parse::*;
pub use plan::*;

/// Ports and marks Istio hard-codes (tools/istio-iptables/pkg/constants).
pub mod constants {
    /// istio-agent's DNS proxy listener.
    pub const DNS_AGENT_PORT: u16 = 15053;
    /// Mark Envoy's own loopback traffic gets in TPROXY mode.
    pub const OUTBOUND_MARK: u32 = 1338;
    /// Source address Envoy binds when forwarding inbound traffic to the app.
    pub const INBOUND_PASSTHROUGH_V4: &str = "127.0.0.6/32";
    pub const INBOUND_PASSTHROUGH_V6: &str = "::6/128";
    pub const LOOPBACK_V6: &str = "::1/128";
    /// Ports the CNI plugin always excludes from inbound capture (agent, health, Envoy metrics).
    pub const ALWAYS_EXCLUDED_INBOUND: [u16; 3] = [15020, 15021, 15090];
}
