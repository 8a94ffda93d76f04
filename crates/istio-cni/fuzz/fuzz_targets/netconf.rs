//! stdin of every command: the network configuration, CNI_ARGS and prevResult conversion
//! must answer with an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(conf) = istio_cni::settings::parse_netconf(data) {
        for v in istio_cni::cni::SUPPORTED_VERSIONS {
            let _ = istio_cni::cni::convert_result(conf.prev_result.as_ref(), v);
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = istio_cni::settings::parse_cni_args(s);
    }
});
