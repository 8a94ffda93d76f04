//! The tag of what a trace adds to the kernel, below both the tracer, which makes it, and the
//! readers of the live rules (`live_nft`, `live_legacy`), which leave what carries it out.

/// Name prefix of the temporary chains and of the TRACE rules' comments:
/// `istio-explain-<pid>-<start>-<pidns>-<created>-<n>` (see `trace::owner`).
pub const TRACE_CHAIN_PREFIX: &str = "istio-explain-";
