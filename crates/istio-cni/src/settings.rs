//! The network configuration on stdin and CNI_ARGS, parsed and validated (pure).

use crate::cni::{self, CniError, ErrorCode};
use cni_config::PluginSettings;
use redirect::{Backend, BackendChoice};
use serde_json::Value;
use std::time::Duration;

/// Upper bounds that keep a misconfigured lookup from holding a sandbox creation: CRI-O gives
/// the whole CNI chain 2 minutes (half of kubelet's 4-minute RunPodSandbox); the lookup deadline
/// may take at most 90 s of it. Attempts, timeouts and pauses must fit inside the deadline
/// (checked in [`lookup_settings`]).
const MAX_ATTEMPTS: u32 = 120;
const MAX_INTERVAL: Duration = Duration::from_secs(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_DEADLINE: Duration = Duration::from_secs(90);

/// The parsed stdin of ADD/DEL/CHECK/STATUS/GC.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub prev_result: Option<Value>,
    pub settings: PluginSettings,
    pub backend: BackendChoice,
    pub lookup: LookupSettings,
}

/// Bounds of the pod GET: `attempts` tries, `interval` apart, each at most `timeout`, all of it
/// within `deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupSettings {
    pub attempts: u32,
    pub interval: Duration,
    pub timeout: Duration,
    pub deadline: Duration,
}

impl LookupSettings {
    /// The longest a lookup can take (for messages and tests).
    pub fn budget(&self) -> Duration {
        self.deadline
            .min((self.timeout + self.interval) * self.attempts)
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::InvalidConfig, msg)
}

/// Parses the network configuration. Never panics, whatever the bytes.
pub fn parse_netconf(stdin: &[u8]) -> Result<NetConf, CniError> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            ErrorCode::Decode,
            format!("the network configuration on stdin is not valid JSON: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(CniError::new(
            ErrorCode::Decode,
            "the network configuration on stdin is not a JSON object",
        ));
    }
    let cni_version = match value.get("cniVersion") {
        Some(Value::String(v)) => v.clone(),
        None => return Err(invalid("the network configuration has no cniVersion")),
        Some(other) => return Err(invalid(format!("cniVersion {other} is not a string"))),
    };
    if !cni::is_supported(&cni_version) {
        return Err(cni::incompatible(&cni_version));
    }
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // libcni's skel refuses a configuration without a valid name before any command runs.
    if !cni::is_cni_name(&name) {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!(
                "the network configuration's name {name:?} is missing or has characters other than letters, digits, '_', '.' and '-'"
            ),
        ));
    }
    let prev_result = value.get("prevResult").filter(|v| !v.is_null()).cloned();
    let settings = plugin_settings(&value)?;
    run_dir(&settings.cni_agent_run_dir)?;
    let backend = backend_choice(&settings)?;
    let lookup = lookup_settings(&settings)?;
    ambient_settings(&settings)?;
    Ok(NetConf {
        cni_version,
        name,
        prev_result,
        settings,
        backend,
        lookup,
    })
}

/// Our fields of the configuration; an error names the field by its JSON path.
fn plugin_settings(value: &Value) -> Result<PluginSettings, CniError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        invalid(format!(
            "invalid istio-cni setting {}: {}",
            e.path(),
            e.inner()
        ))
    })
}

/// The plugin writes its log there: a relative or empty path would land in whatever directory
/// the runtime happens to run the plugin from.
fn run_dir(dir: &str) -> Result<(), CniError> {
    if dir.is_empty() || !std::path::Path::new(dir).is_absolute() {
        return Err(invalid(format!(
            "cni_agent_run_dir {dir:?} must be an absolute path"
        )));
    }
    Ok(())
}

/// The selectors must be valid Kubernetes selectors, and the handoff bounded like the lookup.
fn ambient_settings(s: &PluginSettings) -> Result<(), CniError> {
    for (i, sel) in s.enablement_selectors.iter().enumerate() {
        sel.validate()
            .map_err(|e| invalid(format!("enablement_selectors[{i}]: {e}")))?;
    }
    let t = Duration::from_millis(s.ambient_handoff_timeout_ms);
    if t.is_zero() || t > MAX_DEADLINE {
        return Err(invalid(format!(
            "ambient_handoff_timeout_ms {} must be between 1 and {}",
            s.ambient_handoff_timeout_ms,
            MAX_DEADLINE.as_millis()
        )));
    }
    Ok(())
}

/// `redirect_backend`, with Istio's `native_nftables: true` meaning nft.
pub fn backend_choice(settings: &PluginSettings) -> Result<BackendChoice, CniError> {
    let choice: BackendChoice = settings.redirect_backend.parse().map_err(|e| {
        invalid(format!(
            "redirect_backend {:?}: {e}",
            settings.redirect_backend
        ))
    })?;
    if !settings.native_nftables {
        return Ok(choice);
    }
    match choice {
        BackendChoice::Auto | BackendChoice::Fixed(Backend::Nft) => {
            Ok(BackendChoice::Fixed(Backend::Nft))
        }
        BackendChoice::Fixed(Backend::IptablesLegacy) => Err(invalid(
            "native_nftables is true but redirect_backend is iptables-legacy; set one of them",
        )),
    }
}

fn lookup_settings(s: &PluginSettings) -> Result<LookupSettings, CniError> {
    let interval = Duration::from_millis(s.pod_lookup_interval_ms);
    let timeout = Duration::from_millis(s.pod_lookup_timeout_ms);
    if !(1..=MAX_ATTEMPTS).contains(&s.pod_lookup_attempts) {
        return Err(invalid(format!(
            "pod_lookup_attempts {} must be between 1 and {MAX_ATTEMPTS}",
            s.pod_lookup_attempts
        )));
    }
    if interval > MAX_INTERVAL {
        return Err(invalid(format!(
            "pod_lookup_interval_ms {} must be at most {}",
            s.pod_lookup_interval_ms,
            MAX_INTERVAL.as_millis()
        )));
    }
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(invalid(format!(
            "pod_lookup_timeout_ms {} must be between 1 and {}",
            s.pod_lookup_timeout_ms,
            MAX_TIMEOUT.as_millis()
        )));
    }
    let deadline = Duration::from_millis(s.pod_lookup_deadline_ms);
    if deadline.is_zero() || deadline > MAX_DEADLINE {
        return Err(invalid(format!(
            "pod_lookup_deadline_ms {} must be between 1 and {}",
            s.pod_lookup_deadline_ms,
            MAX_DEADLINE.as_millis()
        )));
    }
    if timeout > deadline {
        return Err(invalid(format!(
            "pod_lookup_timeout_ms {} must not exceed pod_lookup_deadline_ms {}",
            s.pod_lookup_timeout_ms, s.pod_lookup_deadline_ms
        )));
    }
    // The pauses alone must leave room for the last attempt, or the later attempts are fiction.
    let pauses = interval * (s.pod_lookup_attempts - 1);
    if pauses >= deadline {
        return Err(invalid(format!(
            "pod_lookup_attempts {} with pod_lookup_interval_ms {} pause {} ms in total, which does not fit pod_lookup_deadline_ms {}",
            s.pod_lookup_attempts,
            s.pod_lookup_interval_ms,
            pauses.as_millis(),
            s.pod_lookup_deadline_ms
        )));
    }
    Ok(LookupSettings {
        attempts: s.pod_lookup_attempts,
        interval,
        timeout,
        deadline,
    })
}

/// What the runtime tells us about the pod through CNI_ARGS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct K8sArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub infra_container_id: String,
    pub pod_uid: String,
}

impl K8sArgs {
    /// Both name and namespace given: a Kubernetes pod.
    pub fn is_pod(&self) -> bool {
        !self.pod_name.is_empty() && !self.pod_namespace.is_empty()
    }
}

/// `K=V;K=V`. Unknown keys are ignored (runtimes always send `IgnoreUnknown=1` and more keys
/// than we use); a pair without `=` or a pod name/namespace that is not a valid Kubernetes
/// name is an error, because the name ends up in the API request path.
pub fn parse_cni_args(args: &str) -> Result<K8sArgs, CniError> {
    let mut out = K8sArgs::default();
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(CniError::new(
                ErrorCode::InvalidEnv,
                format!("CNI_ARGS: {pair:?} is not a KEY=VALUE pair"),
            ));
        };
        match key {
            "K8S_POD_NAME" => out.pod_name = value.to_string(),
            "K8S_POD_NAMESPACE" => out.pod_namespace = value.to_string(),
            "K8S_POD_INFRA_CONTAINER_ID" => out.infra_container_id = value.to_string(),
            "K8S_POD_UID" => out.pod_uid = value.to_string(),
            _ => {}
        }
    }
    if !out.pod_namespace.is_empty() && !pod_policy::names::is_namespace_name(&out.pod_namespace) {
        return Err(CniError::new(
            ErrorCode::InvalidEnv,
            format!(
                "CNI_ARGS: K8S_POD_NAMESPACE {:?} is not a valid namespace name",
                out.pod_namespace
            ),
        ));
    }
    if !out.pod_name.is_empty() && !pod_policy::names::is_pod_name(&out.pod_name) {
        return Err(CniError::new(
            ErrorCode::InvalidEnv,
            format!(
                "CNI_ARGS: K8S_POD_NAME {:?} is not a valid pod name",
                out.pod_name
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_conf_and_ignores_unknown_fields() {
        let c = parse_netconf(
            br#"{"cniVersion":"0.3.1","name":"k8s-pod-network","type":"istio-cni",
                "ambient_enabled":false,"exclude_namespaces":["istio-system"],
                "native_nftables":true,"prevResult":{"cniVersion":"0.3.1","ips":[]}}"#,
        )
        .unwrap();
        assert_eq!(c.cni_version, "0.3.1");
        assert_eq!(c.backend, BackendChoice::Fixed(Backend::Nft));
        assert_eq!(c.settings.exclude_namespaces, vec!["istio-system"]);
        assert!(c.prev_result.is_some());
        assert_eq!(c.lookup.attempts, 30);
    }

    #[test]
    fn bad_configs_get_the_spec_codes() {
        let code = |s: &str| parse_netconf(s.as_bytes()).unwrap_err().code;
        assert_eq!(code("{not json"), ErrorCode::Decode);
        assert_eq!(code("[]"), ErrorCode::Decode);
        assert_eq!(code(r#"{"name":"x"}"#), ErrorCode::InvalidConfig);
        assert_eq!(
            code(r#"{"cniVersion":"0.5.0"}"#),
            ErrorCode::IncompatibleVersion
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n","redirect_backend":"ebpf"}"#),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(
                r#"{"cniVersion":"1.0.0","name":"n","native_nftables":true,"redirect_backend":"iptables-legacy"}"#
            ),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n","pod_lookup_attempts":0}"#),
            ErrorCode::InvalidConfig
        );
        let e = parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"n","exclude_namespaces":"kube-system"}"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("invalid type"), "{e}");
        assert!(e.msg.contains("setting exclude_namespaces:"), "{e}");
        let e = parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","exclude_namespaces":["a",7]}"#)
            .unwrap_err();
        assert!(e.msg.contains("exclude_namespaces[1]"), "{e}");
    }

    #[test]
    fn ambient_settings_are_validated_by_field() {
        let e = parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"n","enablement_selectors":[{"podSelector":{"matchExpressions":[{"key":"k","operator":"In"}]}}]}"#,
        )
        .unwrap_err();
        assert!(
            e.msg.contains("enablement_selectors[0]") && e.msg.contains("\"k\""),
            "{}",
            e.msg
        );
        let e = parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"n","enablement_selectors":[{"podSelector":{"matchLabel":{}}}]}"#,
        )
        .unwrap_err();
        assert!(
            e.msg.contains("enablement_selectors[0].podSelector") && e.msg.contains("matchLabel"),
            "{}",
            e.msg
        );
        let e =
            parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","ambient_handoff_timeout_ms":0}"#)
                .unwrap_err();
        assert!(e.msg.contains("ambient_handoff_timeout_ms 0"), "{}", e.msg);
    }

    #[test]
    fn run_dir_must_be_absolute() {
        for dir in ["", "run", "./run"] {
            let conf = format!(
                r#"{{"cniVersion":"1.0.0","name":"n","name":"n","cni_agent_run_dir":"{dir}"}}"#
            );
            let e = parse_netconf(conf.as_bytes()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig);
            assert!(e.msg.contains("cni_agent_run_dir"), "{e}");
        }
    }

    #[test]
    fn lookup_bounds_fit_the_deadline() {
        let err = |fields: &str| {
            parse_netconf(
                format!(r#"{{"cniVersion":"1.0.0","name":"n","name":"n",{fields}}}"#).as_bytes(),
            )
            .unwrap_err()
            .msg
        };
        // The old accepted maxima: 120 × (60 s + 10 s).
        let e = err(
            r#""pod_lookup_attempts":120,"pod_lookup_timeout_ms":60000,"pod_lookup_interval_ms":10000"#,
        );
        assert!(e.contains("pod_lookup_deadline_ms"), "{e}");
        let e = err(r#""pod_lookup_timeout_ms":40000,"pod_lookup_deadline_ms":20000"#);
        assert!(e.contains("pod_lookup_timeout_ms 40000"), "{e}");
        let e = err(r#""pod_lookup_deadline_ms":600000"#);
        assert!(e.contains("pod_lookup_deadline_ms 600000"), "{e}");
        let e = err(r#""pod_lookup_deadline_ms":0"#);
        assert!(e.contains("pod_lookup_deadline_ms 0"), "{e}");
        // The defaults fit, and the budget is the deadline.
        let c = parse_netconf(br#"{"cniVersion":"1.0.0","name":"n"}"#).unwrap();
        assert_eq!(c.lookup.budget(), Duration::from_secs(30));
    }

    #[test]
    fn cni_args() {
        let a = parse_cni_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc",
        )
        .unwrap();
        assert!(a.is_pod());
        assert_eq!(a.pod_name, "web-0");
        assert!(!parse_cni_args("").unwrap().is_pod());
        assert!(!parse_cni_args("K8S_POD_NAME=x").unwrap().is_pod());
        let e = parse_cni_args("K8S_POD_NAME").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnv);
        assert!(parse_cni_args("K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=x").is_err());
        assert!(parse_cni_args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=../x").is_err());
        assert!(parse_cni_args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a.b-c").is_ok());
    }
}
