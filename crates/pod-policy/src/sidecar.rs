//! Sidecar pods: Pod → decision and `capture::Config` (istio-reference §4.3 step 8–10, §4.4).
//! Pure: the pod comes from the API server, the result goes to the backends; no I/O here.

use crate::Decision;
use capture::{
    Config, ConfigError, Id, parse_cidr_list, parse_inbound_ports, parse_interception_mode_strict,
    parse_interface_list, parse_outbound_ranges, parse_port_list,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;

pub const PROXY_CONTAINER: &str = "istio-proxy";
pub const INIT_CONTAINER: &str = "istio-init";

pub mod keys {
    pub const INJECT: &str = "sidecar.istio.io/inject";
    pub const STATUS: &str = "sidecar.istio.io/status";
    pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
    pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
    pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
    pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
    pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
    pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
    pub const REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
    /// Deprecated alias of `REROUTE_VIRTUAL_INTERFACES`, read only when that one is absent.
    pub const KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";
    pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
    pub const ENV_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
    pub const ENV_DUAL_STACK: &str = "ISTIO_DUAL_STACK";
    pub const ENV_INVALID_DROP: &str = "INVALID_DROP";
    pub const ENV_DISABLE_ENVOY: &str = "DISABLE_ENVOY";
}

/// What the plugin reads from a pod (Istio's `PodInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Init containers then containers, by name.
    pub containers: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// istio-proxy's literal env values (`valueFrom` entries cannot be resolved here).
    pub proxy_env: BTreeMap<String, String>,
    /// `args[1]` when istio-proxy runs `proxy <type>`.
    pub proxy_type: Option<String>,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
}

impl PodInfo {
    pub fn from_pod(pod: &Pod) -> Self {
        let mut info = PodInfo {
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            ..Default::default()
        };
        let Some(spec) = &pod.spec else {
            return info;
        };
        // Native sidecars run istio-proxy as an init container: look at both lists.
        let all = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers);
        for c in all {
            info.containers.push(c.name.clone());
            if c.name == PROXY_CONTAINER {
                info.read_proxy(c);
            }
        }
        info
    }

    fn read_proxy(&mut self, c: &Container) {
        for e in c.env.iter().flatten() {
            if let Some(v) = &e.value {
                self.proxy_env.insert(e.name.clone(), v.clone());
            }
        }
        if let Some(args) = &c.args
            && args.first().map(String::as_str) == Some("proxy")
        {
            self.proxy_type = args.get(1).cloned();
        }
        if let Some(sc) = &c.security_context {
            self.run_as_user = sc.run_as_user;
            self.run_as_group = sc.run_as_group;
        }
    }

    fn has_container(&self, name: &str) -> bool {
        self.containers.iter().any(|c| c == name)
    }
}

/// Why a pod gets no rules, in Istio's order (§4.3 step 9). `None`: it is a sidecar pod.
pub fn skip_reason(info: &PodInfo) -> Option<String> {
    if info.has_container(INIT_CONTAINER) {
        return Some("the pod has an istio-init container (it programs its own rules)".into());
    }
    if let Some(v) = info.proxy_env.get(keys::ENV_DISABLE_ENVOY)
        && go_parse_bool(v) == Some(true)
    {
        return Some(format!("istio-proxy has {}={v}", keys::ENV_DISABLE_ENVOY));
    }
    if !info.has_container(PROXY_CONTAINER) {
        return Some("the pod has no istio-proxy container".into());
    }
    if let Some(t) = &info.proxy_type
        && !t.is_empty()
        && t != "sidecar"
    {
        return Some(format!("istio-proxy runs as {t:?}, not as a sidecar"));
    }
    // The label wins over the annotation. Like Istio, a value that is not a boolean does not
    // disable injection: the injector decided and the status annotation below tells us.
    let inject = info
        .labels
        .get(keys::INJECT)
        .map(|v| ("label", v))
        .or_else(|| {
            info.annotations
                .get(keys::INJECT)
                .map(|v| ("annotation", v))
        });
    if let Some((kind, v)) = inject
        && go_parse_bool(v) == Some(false)
    {
        return Some(format!("{kind} {}={v}", keys::INJECT));
    }
    if !info.annotations.contains_key(keys::STATUS) {
        return Some(format!("the pod has no {} annotation", keys::STATUS));
    }
    None
}

/// Go's `strconv.ParseBool`.
pub fn go_parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// A config plus what was tolerated on the way (logged by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodConfig {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// Annotations and the istio-proxy container → istio-iptables config (§4.4). Every annotation
/// is validated; the error names the annotation and its value.
pub fn config_from_pod(info: &PodInfo) -> Result<PodConfig, ConfigError> {
    let ann = |k: &str| info.annotations.get(k).map(String::as_str);
    let mut cfg = Config::cni_default();
    let mut warnings = Vec::new();

    if let Some(v) = ann(keys::INTERCEPTION_MODE) {
        cfg.inbound_mode = parse_interception_mode_strict(keys::INTERCEPTION_MODE, v)?;
    }
    if let Some(v) = ann(keys::INCLUDE_OUTBOUND_IP_RANGES) {
        cfg.outbound_ranges = parse_outbound_ranges(keys::INCLUDE_OUTBOUND_IP_RANGES, v)?;
    }
    if let Some(v) = ann(keys::EXCLUDE_OUTBOUND_IP_RANGES) {
        cfg.outbound_ranges_exclude = parse_cidr_list(keys::EXCLUDE_OUTBOUND_IP_RANGES, v)?;
    }
    if let Some(v) = ann(keys::INCLUDE_INBOUND_PORTS) {
        cfg.inbound_ports = parse_inbound_ports(keys::INCLUDE_INBOUND_PORTS, v)?;
    }
    // Absent: Istio's default "15020". Either way 15020,15021,15090 are appended (agent,
    // health and Envoy metrics must never be captured) and the list deduplicated.
    let mut exclude_in = match ann(keys::EXCLUDE_INBOUND_PORTS) {
        Some(v) => parse_port_list(keys::EXCLUDE_INBOUND_PORTS, v)?,
        None => vec![15020],
    };
    for p in capture::constants::ALWAYS_EXCLUDED_INBOUND {
        if !exclude_in.contains(&p) {
            exclude_in.push(p);
        }
    }
    cfg.inbound_ports_exclude = exclude_in;
    // 15020 is excluded outbound only when the annotation is absent (Istio's default value).
    if let Some(v) = ann(keys::EXCLUDE_OUTBOUND_PORTS) {
        cfg.outbound_ports_exclude = parse_port_list(keys::EXCLUDE_OUTBOUND_PORTS, v)?;
    }
    if let Some(v) = ann(keys::INCLUDE_OUTBOUND_PORTS) {
        cfg.outbound_ports_include = parse_port_list(keys::INCLUDE_OUTBOUND_PORTS, v)?;
    }
    if let Some(v) = ann(keys::REROUTE_VIRTUAL_INTERFACES) {
        cfg.reroute_virtual_interfaces = parse_interface_list(keys::REROUTE_VIRTUAL_INTERFACES, v)?;
    } else if let Some(v) = ann(keys::KUBEVIRT_INTERFACES) {
        cfg.reroute_virtual_interfaces = parse_interface_list(keys::KUBEVIRT_INTERFACES, v)?;
        warnings.push(format!(
            "{} is deprecated, use {}",
            keys::KUBEVIRT_INTERFACES,
            keys::REROUTE_VIRTUAL_INTERFACES
        ));
    }
    if let Some(v) = ann(keys::EXCLUDE_INTERFACES) {
        cfg.exclude_interfaces = parse_interface_list(keys::EXCLUDE_INTERFACES, v)?;
    }

    if let Some(uid) = proxy_id("istio-proxy securityContext.runAsUser", info.run_as_user)? {
        cfg.proxy_uids = vec![uid];
    }
    if let Some(gid) = proxy_id("istio-proxy securityContext.runAsGroup", info.run_as_group)? {
        cfg.proxy_gids = vec![gid];
    }

    // Env values: istio-agent parses the same variables and falls back to false on a bad
    // value, so the rules follow the agent (a warning, not a failure), as Istio does.
    let mut env_bool = |key: &str| -> bool {
        match info.proxy_env.get(key) {
            None => false,
            Some(v) => go_parse_bool(v).unwrap_or_else(|| {
                warnings.push(format!(
                    "istio-proxy env {key}={v:?} is not a boolean; treated as false"
                ));
                false
            }),
        }
    };
    let dns = env_bool(keys::ENV_DNS_CAPTURE);
    cfg.redirect_dns = dns;
    // The CNI path never knows the pod's nameservers, so DNS capture means all port-53 traffic.
    cfg.capture_all_dns = dns;
    cfg.dual_stack = env_bool(keys::ENV_DUAL_STACK);
    cfg.drop_invalid = env_bool(keys::ENV_INVALID_DROP);

    Ok(PodConfig {
        config: cfg,
        warnings,
    })
}

/// runAsUser/runAsGroup: 0 or absent keeps Istio's 1337; anything else must fit a Linux id.
fn proxy_id(field: &str, v: Option<i64>) -> Result<Option<Id>, ConfigError> {
    match v {
        None | Some(0) => Ok(None),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| *n != u32::MAX)
            .map(|n| Some(Id::numeric(n)))
            .ok_or_else(|| ConfigError::new(field, n.to_string(), "not a valid Linux id")),
    }
}

/// Istio's sidecar checks alone: [`Decision::Skip`] (why) or [`Decision::Sidecar`] (the
/// config ADD programs); never [`Decision::Ambient`].
pub fn decide(pod: &Pod) -> Result<Decision, ConfigError> {
    let info = PodInfo::from_pod(pod);
    match skip_reason(&info) {
        Some(reason) => Ok(Decision::Skip(reason)),
        None => Ok(Decision::Sidecar(Box::new(config_from_pod(&info)?))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capture::{InboundPorts, InterceptionMode, OutboundRanges};

    fn sidecar(annotations: &[(&str, &str)]) -> PodInfo {
        let mut a: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        a.entry(keys::STATUS.into()).or_insert_with(|| "{}".into());
        PodInfo {
            containers: vec!["app".into(), PROXY_CONTAINER.into()],
            annotations: a,
            proxy_type: Some("sidecar".into()),
            ..Default::default()
        }
    }

    fn cfg(info: &PodInfo) -> Config {
        config_from_pod(info).unwrap().config
    }

    #[test]
    fn defaults_are_istios_cni_defaults() {
        let c = cfg(&sidecar(&[]));
        assert_eq!(c, Config::cni_default());
        assert_eq!(c.inbound_ports, InboundPorts::All);
        assert_eq!(c.outbound_ranges, OutboundRanges::All);
        assert_eq!(c.inbound_ports_exclude, vec![15020, 15021, 15090]);
        assert_eq!(c.outbound_ports_exclude, vec![15020]);
    }

    #[test]
    fn annotations_map_to_flags() {
        let c = cfg(&sidecar(&[
            (keys::INTERCEPTION_MODE, "TPROXY"),
            (
                keys::INCLUDE_OUTBOUND_IP_RANGES,
                "10.0.0.0/8, 192.168.0.0/16",
            ),
            (keys::EXCLUDE_OUTBOUND_IP_RANGES, "10.96.0.1/32"),
            (keys::INCLUDE_INBOUND_PORTS, "8080,9090"),
            (keys::EXCLUDE_INBOUND_PORTS, "15090,22"),
            (keys::EXCLUDE_OUTBOUND_PORTS, "3306"),
            (keys::INCLUDE_OUTBOUND_PORTS, "443"),
            (keys::KUBEVIRT_INTERFACES, "old0"),
            (keys::REROUTE_VIRTUAL_INTERFACES, "tap0,tap1"),
            (keys::EXCLUDE_INTERFACES, "eth1"),
        ]));
        assert_eq!(c.inbound_mode, InterceptionMode::Tproxy);
        assert!(matches!(c.outbound_ranges, OutboundRanges::List(ref l) if l.len() == 2));
        assert_eq!(c.outbound_ranges_exclude.len(), 1);
        assert_eq!(c.inbound_ports, InboundPorts::List(vec![8080, 9090]));
        assert_eq!(c.inbound_ports_exclude, vec![15090, 22, 15020, 15021]);
        assert_eq!(c.outbound_ports_exclude, vec![3306]);
        assert_eq!(c.outbound_ports_include, vec![443]);
        assert_eq!(c.reroute_virtual_interfaces, vec!["tap0", "tap1"]);
        assert_eq!(c.exclude_interfaces, vec!["eth1"]);
    }

    #[test]
    fn empty_exclude_outbound_ports_drops_15020_and_alias_works() {
        let info = sidecar(&[
            (keys::EXCLUDE_OUTBOUND_PORTS, ""),
            (keys::KUBEVIRT_INTERFACES, "net1"),
        ]);
        let pc = config_from_pod(&info).unwrap();
        assert!(pc.config.outbound_ports_exclude.is_empty());
        assert_eq!(pc.config.reroute_virtual_interfaces, vec!["net1"]);
        assert_eq!(pc.warnings.len(), 1);
    }

    #[test]
    fn bad_annotations_name_annotation_and_value() {
        for (k, v) in [
            (keys::INTERCEPTION_MODE, "NONE"),
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/33"),
            (keys::EXCLUDE_OUTBOUND_IP_RANGES, "*"),
            (keys::INCLUDE_INBOUND_PORTS, "80,http"),
            (keys::EXCLUDE_INBOUND_PORTS, "70000"),
            (keys::EXCLUDE_OUTBOUND_PORTS, "-1"),
            (keys::INCLUDE_OUTBOUND_PORTS, "0"),
            (keys::REROUTE_VIRTUAL_INTERFACES, "a/b"),
            (keys::EXCLUDE_INTERFACES, "waytoolonginterfacename"),
        ] {
            let e = config_from_pod(&sidecar(&[(k, v)])).unwrap_err();
            let s = e.to_string();
            assert!(s.contains(k) && s.contains(v), "{s}");
        }
    }

    #[test]
    fn run_as_user_and_env() {
        let mut info = sidecar(&[]);
        info.run_as_user = Some(1000670000);
        info.run_as_group = Some(0);
        info.proxy_env = [
            (keys::ENV_DNS_CAPTURE, "true"),
            (keys::ENV_DUAL_STACK, "1"),
            (keys::ENV_INVALID_DROP, "yes"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let pc = config_from_pod(&info).unwrap();
        assert_eq!(pc.config.proxy_uids, vec![Id::numeric(1000670000)]);
        assert_eq!(pc.config.proxy_gids, vec![Id::numeric(1337)]);
        assert!(pc.config.redirect_dns && pc.config.capture_all_dns && pc.config.dual_stack);
        assert!(!pc.config.drop_invalid);
        assert_eq!(pc.warnings.len(), 1);
        info.run_as_user = Some(-5);
        assert!(config_from_pod(&info).is_err());
    }

    #[test]
    fn skip_rules_in_istios_order() {
        assert_eq!(skip_reason(&sidecar(&[])), None);
        let mut i = sidecar(&[]);
        i.containers.insert(0, INIT_CONTAINER.into());
        assert!(skip_reason(&i).unwrap().contains("istio-init"));
        let mut i = sidecar(&[]);
        i.proxy_env
            .insert(keys::ENV_DISABLE_ENVOY.into(), "true".into());
        assert!(skip_reason(&i).unwrap().contains("DISABLE_ENVOY"));
        let mut i = sidecar(&[]);
        i.containers.retain(|c| c != PROXY_CONTAINER);
        assert!(skip_reason(&i).unwrap().contains("no istio-proxy"));
        let mut i = sidecar(&[]);
        i.proxy_type = Some("router".into());
        assert!(skip_reason(&i).unwrap().contains("router"));
        let i = sidecar(&[(keys::INJECT, "false")]);
        assert!(skip_reason(&i).unwrap().contains("annotation"));
        let mut i = sidecar(&[(keys::INJECT, "false")]);
        i.labels.insert(keys::INJECT.into(), "true".into());
        assert_eq!(skip_reason(&i), None, "the label wins");
        let i = sidecar(&[(keys::INJECT, "maybe")]);
        assert_eq!(skip_reason(&i), None);
        let mut i = sidecar(&[]);
        i.annotations.remove(keys::STATUS);
        assert!(skip_reason(&i).unwrap().contains(keys::STATUS));
    }

    #[test]
    fn reads_native_sidecar_from_init_containers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {"sidecar.istio.io/status": "{}"}},
            "spec": {
                "initContainers": [{"name": "istio-proxy", "args": ["proxy", "sidecar"],
                    "restartPolicy": "Always",
                    "env": [{"name": "ISTIO_META_DNS_CAPTURE", "value": "true"},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}],
                "containers": [{"name": "app"}]
            }
        }))
        .unwrap();
        match decide(&pod).unwrap() {
            Decision::Sidecar(pc) => assert!(pc.config.capture_all_dns),
            other => panic!("{other:?}"),
        }
    }
}
