//! Helpers shared by the trace tests (nft and iptables-legacy pods).

use capture::Plan;
use explain::trace::{TRACE_CHAIN_PREFIX, list_trace_chains};
use std::path::Path;
use std::time::Duration;

/// Waits until a trace's temporary rules are in the pod's namespace (of process `pid`, or of
/// anyone's): the trace has started. `false` after 20 s.
pub fn wait_for_trace_rules(pod: &Path, pid: Option<u32>) -> bool {
    testbed::node::wait_until(Duration::from_secs(20), || {
        list_trace_chains(Some(pod))
            .unwrap()
            .iter()
            .any(|c| pid.is_none_or(|p| c.starts_with(&format!("{TRACE_CHAIN_PREFIX}{p}-"))))
    })
}

/// Programs `plan` into the namespace at `netns` with the iptables-legacy backend (the
/// product's own path: `redirect::apply`).
#[allow(dead_code)] // not every trace test has legacy pods
pub fn apply_legacy(netns: &Path, plan: &Plan) {
    let fixed = redirect::BackendChoice::Fixed(redirect::Backend::IptablesLegacy);
    redirect::apply(plan, Some(netns), fixed).expect("apply with iptables-legacy");
}
