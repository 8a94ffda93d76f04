//! iptables-legacy backend: the same `Plan` as the nft backend, rendered in istio-iptables'
//! restore format (byte-identical to Istio's payloads).

mod render;

pub use render::{render_payload, rule_args};
