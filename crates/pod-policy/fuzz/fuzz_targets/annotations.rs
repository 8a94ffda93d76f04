//! Annotation values and proxy env: split the input into (key index, value) pairs and run
//! the pod → Config → Plan path. Errors are fine, panics are not.
#![no_main]

use pod_policy::sidecar::{PodInfo, config_from_pod, keys, skip_reason};
use libfuzzer_sys::fuzz_target;

const ANNOTATIONS: [&str; 12] = [
    keys::INTERCEPTION_MODE,
    keys::INCLUDE_OUTBOUND_IP_RANGES,
    keys::EXCLUDE_OUTBOUND_IP_RANGES,
    keys::INCLUDE_INBOUND_PORTS,
    keys::EXCLUDE_INBOUND_PORTS,
    keys::INCLUDE_OUTBOUND_PORTS,
    keys::EXCLUDE_OUTBOUND_PORTS,
    keys::REROUTE_VIRTUAL_INTERFACES,
    keys::KUBEVIRT_INTERFACES,
    keys::EXCLUDE_INTERFACES,
    keys::INJECT,
    keys::STATUS,
];
const ENV: [&str; 4] = [
    keys::ENV_DNS_CAPTURE,
    keys::ENV_DUAL_STACK,
    keys::ENV_INVALID_DROP,
    keys::ENV_DISABLE_ENVOY,
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut info = PodInfo {
        containers: vec!["app".into(), "istio-proxy".into()],
        ..Default::default()
    };
    // Lines "<n>=<value>": n < 12 an annotation, 12..16 an env var, 16/17 runAsUser/Group.
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k.parse::<usize>() {
            Ok(i) if i < ANNOTATIONS.len() => {
                info.annotations.insert(ANNOTATIONS[i].into(), v.into());
            }
            Ok(i) if i < ANNOTATIONS.len() + ENV.len() => {
                info.proxy_env
                    .insert(ENV[i - ANNOTATIONS.len()].into(), v.into());
            }
            Ok(16) => info.run_as_user = v.parse().ok(),
            Ok(17) => info.run_as_group = v.parse().ok(),
            _ => {}
        }
    }
    let _ = skip_reason(&info);
    if let Ok(pc) = config_from_pod(&info) {
        let facts = capture::Facts {
            local_addrs: vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            ..Default::default()
        };
        let _ = capture::Plan::build(&pc.config, &facts);
    }
});
