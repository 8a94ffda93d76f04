//! Whatever the API server returns: Pod JSON → decision.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pod) = serde_json::from_slice(data) {
        let _ = pod_policy::sidecar::decide(&pod);
    }
});
