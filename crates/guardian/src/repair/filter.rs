//! Which pods the repair controller acts on (Istio's `matchesFilter`, istio-reference §6). Pure.

use crate::settings::RepairSettings;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

/// Istio's filter: the sidecar annotation is present (when one is configured), and some init
/// container named `init_container_name` (any, when empty) is NOT currently terminated
/// successfully while its LAST termination matches the exit code (0: any) and, when set, the
/// termination message (both trimmed).
pub fn matches(cfg: &RepairSettings, pod: &Pod) -> bool {
    if !cfg.sidecar_annotation.is_empty() {
        let has = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&cfg.sidecar_annotation));
        if !has {
            return false;
        }
    }
    let want_msg = cfg.init_termination_message.trim();
    let last_matches = |t: &ContainerStateTerminated| {
        let code_ok = cfg.init_exit_code == 0 || cfg.init_exit_code == t.exit_code;
        let msg_ok = want_msg.is_empty() || want_msg == t.message.as_deref().unwrap_or("").trim();
        code_ok && msg_ok
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref());
    statuses.into_iter().flatten().any(|c| {
        if !cfg.init_container_name.is_empty() && c.name != cfg.init_container_name {
            return false;
        }
        // Safety first: a container whose current run succeeded is never "broken"; a pod that
        // is still broken shows the failure in lastState again at the next restart.
        if let Some(t) = c.state.as_ref().and_then(|s| s.terminated.as_ref())
            && (t.reason.as_deref() == Some("Completed") || t.exit_code == 0)
        {
            return false;
        }
        c.last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(last_matches)
    })
}

/// `namespace/name` for logs and the work queue.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(annotated: bool, init: Value) -> Pod {
        let mut ann = serde_json::Map::new();
        if annotated {
            ann.insert("sidecar.istio.io/status".into(), json!("{}"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", "annotations": ann},
            "status": {"initContainerStatuses": [init]}
        }))
        .unwrap()
    }

    fn crashlooping(code: i32) -> Value {
        json!({"name": "istio-validation", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": code, "reason": "Error", "message": "iptables not set up"}}})
    }

    fn cfg() -> RepairSettings {
        RepairSettings {
            enabled: true,
            ..RepairSettings::disabled()
        }
    }

    #[test]
    fn istios_filter() {
        let c = cfg();
        assert!(matches(&c, &pod(true, crashlooping(126))));
        assert!(
            !matches(&c, &pod(false, crashlooping(126))),
            "no annotation"
        );
        assert!(!matches(&c, &pod(true, crashlooping(1))), "other exit code");
        let mut other = crashlooping(126);
        other["name"] = json!("something-else");
        assert!(!matches(&c, &pod(true, other)), "other container");
        // Failed before, succeeded since.
        let mut ok = crashlooping(126);
        ok["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
        assert!(!matches(&c, &pod(true, ok)));
        // Currently failing again (terminated, non-zero) with the matching last state.
        let mut again = crashlooping(126);
        again["state"] = json!({"terminated": {"exitCode": 126, "reason": "Error"}});
        assert!(matches(&c, &pod(true, again)));
        // Never terminated before.
        let mut fresh = crashlooping(126);
        fresh["lastState"] = json!({});
        assert!(!matches(&c, &pod(true, fresh)));
        // No init containers at all.
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(!matches(&c, &p));
    }

    #[test]
    fn exit_code_zero_and_message_and_empty_filters() {
        let mut c = cfg();
        c.init_exit_code = 0;
        assert!(matches(&c, &pod(true, crashlooping(1))));
        c.init_termination_message = " iptables not set up \n".into();
        assert!(matches(&c, &pod(true, crashlooping(1))));
        c.init_termination_message = "other".into();
        assert!(!matches(&c, &pod(true, crashlooping(1))));
        let mut c = cfg();
        c.sidecar_annotation.clear();
        c.init_container_name.clear();
        let mut other = crashlooping(126);
        other["name"] = json!("anything");
        assert!(matches(&c, &pod(false, other)));
        assert_eq!(key(&pod(true, crashlooping(126))), "default/web");
    }
}
