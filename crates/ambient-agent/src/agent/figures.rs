//! The step an enroll failed at, for `istio_cni_enrollment_failures_total{reason}`
//! (`node_status::figures`; the plugin's own steps are counted from its figures).

use super::AgentError;

/// One of `node_status::figures::AGENT_FAILURE_REASONS`, or the plugin's `rules_failed`.
pub fn failure_reason(e: &AgentError) -> &'static str {
    match e {
        AgentError::Plan { .. } | AgentError::Rules { .. } | AgentError::Clear { .. } => {
            "rules_failed"
        }
        AgentError::Host { .. } | AgentError::HostCheck(_) => "host_rule_failed",
        AgentError::Ztunnel {
            source: zds::ZdsError::NotConnected { .. },
            ..
        } => "ztunnel_not_connected",
        AgentError::Ztunnel { .. } => "ztunnel_send_failed",
        AgentError::Worker { .. } => "internal_failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_one_the_daemon_exports() {
        let exported = node_status::figures::failure_reasons();
        let errors = [
            AgentError::Rules {
                pod: "p".into(),
                source: redirect::RedirectError::Drift(vec!["d".into()]),
            },
            AgentError::HostCheck(redirect::RedirectError::Drift(vec!["h".into()])),
            AgentError::Ztunnel {
                pod: "p".into(),
                source: zds::ZdsError::NotConnected {
                    socket: "/s".into(),
                    pod: "p".into(),
                },
            },
            AgentError::Worker {
                what: "p".into(),
                source: super::super::WorkerError::Dup(std::io::Error::other("w")),
            },
        ];
        let reasons: Vec<_> = errors.iter().map(failure_reason).collect();
        assert_eq!(
            reasons,
            [
                "rules_failed",
                "host_rule_failed",
                "ztunnel_not_connected",
                "internal_failed"
            ]
        );
        assert!(reasons.iter().all(|r| exported.contains(r)), "{reasons:?}");
        assert!(exported.contains(&"ztunnel_send_failed"));
    }
}
