//! The guardian's settings: the repair controller (`REPAIR_*`), continuous reconcile and
//! controller mode (`RECONCILE_*`, `CONTROLLER_MODE`), the node taint (`NODE_TAINT_KEY`).

use super::{ConfigError, bad, parse_bool};
use clap::{ArgAction, Args};
use guardian::{ReconcileSettings, RepairSettings};
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct RepairArgs {
    /// Repair controller (istio-reference §6): watch this node's pods and fix those that started
    /// without the plugin (their istio-validation init container fails with 126).
    #[arg(long, env = "REPAIR_ENABLED", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_enabled: bool,

    /// Repair a broken pod by programming its redirect rules in place (first in precedence).
    #[arg(long, env = "REPAIR_REPAIR_PODS", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_repair_pods: bool,

    /// Delete a broken pod (UID and resourceVersion preconditions) when REPAIR_REPAIR_PODS is false.
    #[arg(long, env = "REPAIR_DELETE_PODS", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_delete_pods: bool,

    /// Label a broken pod (pods/status) when neither repair nor delete is on.
    #[arg(long, env = "REPAIR_LABEL_PODS", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_label_pods: bool,

    /// Accepted for Istio's chart (always a daemon here); must be a boolean.
    #[arg(long, env = "REPAIR_RUN_AS_DAEMON", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_run_as_daemon: bool,

    /// Extra field selectors for the pod watch (`spec.nodeName=<node>` is always added).
    #[arg(long, env = "REPAIR_FIELD_SELECTORS", default_value = "")]
    pub repair_field_selectors: String,

    /// Label selectors for the pod watch.
    #[arg(long, env = "REPAIR_LABEL_SELECTORS", default_value = "")]
    pub repair_label_selectors: String,

    /// Only pods with this annotation are considered (empty: any pod).
    #[arg(
        long,
        env = "REPAIR_SIDECAR_ANNOTATION",
        default_value = "sidecar.istio.io/status"
    )]
    pub repair_sidecar_annotation: String,

    /// Init container that fails when the plugin did not run (empty: any init container).
    #[arg(
        long,
        env = "REPAIR_INIT_CONTAINER_NAME",
        default_value = "istio-validation"
    )]
    pub repair_init_container_name: String,

    /// Its exit code when the redirect is missing (0: any non-zero exit).
    #[arg(long, env = "REPAIR_INIT_CONTAINER_EXIT_CODE", default_value = "126")]
    pub repair_init_container_exit_code: i32,

    /// Its expected termination message (empty: any).
    #[arg(
        long,
        env = "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE",
        default_value = ""
    )]
    pub repair_init_container_termination_message: String,

    /// Label key set on broken pods in label mode.
    #[arg(
        long,
        env = "REPAIR_BROKEN_POD_LABEL_KEY",
        default_value = "cni.istio.io/uninitialized"
    )]
    pub repair_broken_pod_label_key: String,

    /// Label value set on broken pods in label mode.
    #[arg(long, env = "REPAIR_BROKEN_POD_LABEL_VALUE", default_value = "true")]
    pub repair_broken_pod_label_value: String,
}

#[derive(Args, Debug, Clone)]
pub struct ReconcileArgs {
    /// Continuous reconcile: check every mesh pod's live redirect rules against its plan (on
    /// pod events and once per RECONCILE_INTERVAL) and re-apply them atomically on drift.
    #[arg(long, env = "RECONCILE_ENABLED", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub reconcile_enabled: bool,

    /// How often each mesh pod is checked (Go duration such as 5m, 90s, 1m30s, or seconds);
    /// the checks are spread evenly over it (one pod every interval/pods).
    #[arg(long, env = "RECONCILE_INTERVAL", default_value = "5m")]
    pub reconcile_interval: String,

    /// Controller mode (for clusters where the CNI chain cannot be used): the reconciler
    /// programs running pods opted in with the annotation
    /// `istio-pod-network-controller/initialize: "true"` (on the pod or its namespace) on first
    /// sight, and marks them `istio-pod-network-controller/initialized: "true"`.
    #[arg(long, env = "CONTROLLER_MODE", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub controller_mode: bool,

    /// Once ready, remove every taint with this key from this node (the node name as for
    /// REPAIR_NODE_NAME), e.g. cni.istio.io/not-ready; empty: leave taints alone.
    #[arg(long, env = "NODE_TAINT_KEY", default_value = "")]
    pub node_taint_key: String,
}

pub fn repair(a: &RepairArgs) -> Result<RepairSettings, ConfigError> {
    if a.repair_init_container_exit_code < 0 || a.repair_init_container_exit_code > 255 {
        return Err(bad(
            "REPAIR_INIT_CONTAINER_EXIT_CODE",
            a.repair_init_container_exit_code.to_string(),
            "expected an exit code in 0..255 (0: any)",
        ));
    }
    if a.repair_label_pods && a.repair_broken_pod_label_key.trim().is_empty() {
        return Err(bad(
            "REPAIR_BROKEN_POD_LABEL_KEY",
            "",
            "REPAIR_LABEL_PODS=true needs a label key",
        ));
    }
    for (var, text, parsed) in [
        (
            "REPAIR_LABEL_SELECTORS",
            &a.repair_label_selectors,
            pod_policy::selector_text::Selector::labels(&a.repair_label_selectors),
        ),
        (
            "REPAIR_FIELD_SELECTORS",
            &a.repair_field_selectors,
            pod_policy::selector_text::Selector::fields(&a.repair_field_selectors),
        ),
    ] {
        if let Err(e) = parsed {
            return Err(bad(var, text.trim(), e.why.to_string()));
        }
    }
    Ok(RepairSettings {
        enabled: a.repair_enabled,
        repair_pods: a.repair_repair_pods,
        delete_pods: a.repair_delete_pods,
        label_pods: a.repair_label_pods,
        field_selectors: a.repair_field_selectors.trim().to_string(),
        label_selectors: a.repair_label_selectors.trim().to_string(),
        sidecar_annotation: a.repair_sidecar_annotation.trim().to_string(),
        init_container_name: a.repair_init_container_name.trim().to_string(),
        init_exit_code: a.repair_init_container_exit_code,
        init_termination_message: a.repair_init_container_termination_message.clone(),
        label_key: a.repair_broken_pod_label_key.trim().to_string(),
        label_value: a.repair_broken_pod_label_value.trim().to_string(),
    })
}

/// Shortest and longest RECONCILE_INTERVAL accepted.
pub const RECONCILE_INTERVAL_MIN: Duration = Duration::from_millis(100);
pub const RECONCILE_INTERVAL_MAX: Duration = Duration::from_secs(24 * 3600);

/// Go's `time.ParseDuration` (a sequence of decimal numbers with units ns, us, µs, ms, s, m, h,
/// such as `5m`, `1.5s`, `1m30s`), plus a bare number meaning seconds.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || "expected a duration such as 5m, 90s, 1m30s or 300 (seconds)".to_string();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Duration::try_from_secs_f64(total).map_err(|_| err())
}

pub fn reconcile(a: &ReconcileArgs) -> Result<ReconcileSettings, ConfigError> {
    let text = a.reconcile_interval.trim();
    let interval = parse_go_duration(text).map_err(|why| bad("RECONCILE_INTERVAL", text, why))?;
    if !(RECONCILE_INTERVAL_MIN..=RECONCILE_INTERVAL_MAX).contains(&interval) {
        return Err(bad(
            "RECONCILE_INTERVAL",
            text,
            "expected a duration between 100ms and 24h",
        ));
    }
    if a.controller_mode && !a.reconcile_enabled {
        return Err(bad(
            "CONTROLLER_MODE",
            "true",
            "controller mode is part of the reconciler: it needs RECONCILE_ENABLED=true",
        ));
    }
    Ok(ReconcileSettings {
        enabled: a.reconcile_enabled,
        interval,
        controller_mode: a.controller_mode,
    })
}

/// A taint key is a label key: `[prefix/]name`, name 1..63 of `[A-Za-z0-9._-]`, the prefix a
/// DNS subdomain. Checked here so a typo fails at startup instead of never matching a taint.
pub fn node_taint_key(raw: &str, node_name: &str) -> Result<Option<String>, ConfigError> {
    let key = raw.trim();
    if key.is_empty() {
        return Ok(None);
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        (1..=253).contains(&p.len())
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    if !name_ok || !prefix_ok {
        return Err(bad(
            "NODE_TAINT_KEY",
            key,
            "expected a taint key such as cni.istio.io/not-ready ([dns-prefix/]name)",
        ));
    }
    if node_name.is_empty() {
        return Err(bad(
            "NODE_TAINT_KEY",
            key,
            "needs this node's name (KUBERNETES_NODE_NAME)",
        ));
    }
    Ok(Some(key.to_string()))
}
