//! CNI spec 1.1 protocol pieces: commands, environment, error codes, result conversion.
//! Everything here is pure: `main` reads the process environment and stdin and writes stdout.

use serde_json::{Map, Value, json};
use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;

mod v02;

/// The spec versions this plugin speaks (VERSION output), oldest first: all of libcni's
/// (`version.All`, as Istio's plugin); 0.1.0/0.2.0 results have their own shape (`v02`).
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
/// Used in error replies when the request's version is unknown or unsupported.
pub const LATEST_VERSION: &str = "1.1.0";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl FromStr for Command {
    type Err = CniError;
    fn from_str(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::new(
                    ErrorCode::InvalidEnv,
                    format!(
                        "CNI_COMMAND {other:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"
                    ),
                ));
            }
        })
    }
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

/// Error codes from the spec (SPEC.md "Error"), plus ours from 100 on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    ContainerUnknown = 3,
    /// Missing/invalid CNI_* variables, CNI_ARGS included.
    InvalidEnv = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADDs.
    NotAvailable = 50,
    /// A pod annotation, label or proxy container field has a bad value.
    InvalidPodSpec = 100,
    /// Programming or removing the rules failed.
    Redirect = 101,
    /// CHECK: the live rules differ from the plan.
    RulesDrift = 102,
    /// The kubeconfig could not be loaded.
    Kubeconfig = 103,
    /// A bug: the plugin panicked.
    Internal = 110,
}

/// A failed command as the runtime sees it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: ErrorCode,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The JSON the spec wants on stdout.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code as u32,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

/// The CNI_* variables. Which are required depends on the command (SPEC.md "Parameters").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniEnv {
    pub container_id: String,
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: String,
    pub path: String,
}

impl CniEnv {
    /// Reads the variables through `get` (the process environment in `main`, a map in tests),
    /// and validates what libcni's `skel` validates for every plugin: the container ID and the
    /// interface name (`utils.ValidateContainerID`, `ValidateInterfaceName`).
    pub fn load(
        command: Command,
        get: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, CniError> {
        let text = |name: &str| -> Result<Option<String>, CniError> {
            get(name)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.into_string().map_err(|v| {
                        CniError::new(
                            ErrorCode::InvalidEnv,
                            format!("{name} {:?} is not valid UTF-8", v.to_string_lossy()),
                        )
                    })
                })
                .transpose()
        };
        let required = |name: &str| -> Result<String, CniError> {
            text(name)?.ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidEnv,
                    format!("{name} is required for {}", command.as_str()),
                )
            })
        };
        // A path is bytes: taken as the runtime gave it.
        let netns = || {
            get("CNI_NETNS")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let env = match command {
            Command::Add | Command::Check => CniEnv {
                container_id: required("CNI_CONTAINERID")?,
                netns: Some(netns().ok_or_else(|| {
                    CniError::new(
                        ErrorCode::InvalidEnv,
                        format!("CNI_NETNS is required for {}", command.as_str()),
                    )
                })?),
                ifname: required("CNI_IFNAME")?,
                args: cni_args(&get),
                path: lossy(&get, "CNI_PATH"),
            },
            // DEL: the namespace may already be gone, so CNI_NETNS is optional.
            Command::Del => CniEnv {
                container_id: required("CNI_CONTAINERID")?,
                netns: netns(),
                ifname: required("CNI_IFNAME")?,
                args: cni_args(&get),
                path: lossy(&get, "CNI_PATH"),
            },
            Command::Status | Command::Gc | Command::Version => {
                return Ok(CniEnv {
                    path: lossy(&get, "CNI_PATH"),
                    ..CniEnv::default()
                });
            }
        };
        validate_container_id(&env.container_id)?;
        validate_ifname(&env.ifname)?;
        Ok(env)
    }
}

/// CNI_ARGS, whose keys this plugin reads are validated when parsed (pod names are DNS names);
/// bytes that are not UTF-8 can only sit in other keys' values, ignored as Istio's
/// `IgnoreUnknown` ignores them, so they must not make the pod look like no pod at all.
fn cni_args(get: &impl Fn(&str) -> Option<OsString>) -> String {
    lossy(get, "CNI_ARGS")
}

/// A variable only passed along or searched (CNI_ARGS, CNI_PATH, which the plugin never uses):
/// bytes that are not UTF-8 are no reason to fail a command.
fn lossy(get: &impl Fn(&str) -> Option<OsString>, name: &str) -> String {
    get(name)
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// libcni's name rule for container IDs and network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn is_cni_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn validate_container_id(id: &str) -> Result<(), CniError> {
    if is_cni_name(id) {
        return Ok(());
    }
    Err(CniError::new(
        ErrorCode::InvalidEnv,
        format!(
            "CNI_CONTAINERID {id:?} has characters other than letters, digits, '_', '.' and '-' (or does not start with a letter or digit)"
        ),
    ))
}

/// The kernel's rule for interface names (`dev_valid_name`), as libcni checks it.
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let why = if name.len() > 15 {
        "is longer than 15 bytes"
    } else if name == "." || name == ".." {
        "is . or .."
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        "contains '/', ':' or whitespace"
    } else {
        return Ok(());
    };
    Err(CniError::new(
        ErrorCode::InvalidEnv,
        format!("CNI_IFNAME {name:?} {why}"),
    ))
}

/// Whether the configuration's `cniVersion` has `command` at all: CHECK came in 0.4.0, STATUS
/// and GC in 1.1.0 (libcni's `skel` answers the same way: code 1).
pub fn allows(command: Command, version: &str) -> Result<(), CniError> {
    let since = match command {
        Command::Check => "0.4.0",
        Command::Status | Command::Gc => "1.1.0",
        Command::Add | Command::Del | Command::Version => return Ok(()),
    };
    let position = |v: &str| SUPPORTED_VERSIONS.iter().position(|s| *s == v);
    if position(version) >= position(since) {
        return Ok(());
    }
    Err(CniError::new(
        ErrorCode::IncompatibleVersion,
        format!(
            "cniVersion {version:?} does not allow {} (it came in {since})",
            command.as_str()
        ),
    ))
}

pub fn is_supported(version: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&version)
}

/// VERSION's reply.
pub fn version_reply(request_version: Option<&str>) -> Value {
    json!({
        "cniVersion": request_version.filter(|v| !v.is_empty()).unwrap_or(LATEST_VERSION),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// The result shape generations: 0.1.0–0.2.0 (`ip4`/`ip6`), 0.3.0–0.4.0 (`ips[].version`),
/// 1.0.0, 1.1.0 (more fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    V02,
    V03,
    V10,
    V11,
}

fn shape(version: &str) -> Option<Shape> {
    match version {
        "0.1.0" | "0.2.0" => Some(Shape::V02),
        "0.3.0" | "0.3.1" | "0.4.0" => Some(Shape::V03),
        "1.0.0" => Some(Shape::V10),
        "1.1.0" => Some(Shape::V11),
        _ => None,
    }
}

/// Fields each result object has in each shape (libcni's types040/types100 structs).
const IFACE_V03: &[&str] = &["name", "mac", "sandbox"];
const IFACE_V10: &[&str] = &["name", "mac", "mtu", "sandbox"];
const IFACE_V11: &[&str] = &["name", "mac", "mtu", "sandbox", "socketPath", "pciID"];
const IP_V03: &[&str] = &["version", "interface", "address", "gateway"];
const IP_V10: &[&str] = &["interface", "address", "gateway"];
const ROUTE_V03: &[&str] = &["dst", "gw"];
const ROUTE_V11: &[&str] = &["dst", "gw", "mtu", "advmss", "priority", "table", "scope"];
const TOP: &[&str] = &["cniVersion", "interfaces", "ips", "routes", "dns"];

/// The result an ADD prints: `prev` (the chain's result so far) converted to `target`, or an
/// empty result of that version. Same shape: only `cniVersion` changes; otherwise the fields the
/// target version does not define are dropped and `ips[].version` is added or removed, as
/// libcni's converters do; a 0.1.0/0.2.0 result goes through the 0.4.0 shape both ways (`v02`).
pub fn convert_result(prev: Option<&Value>, target: &str) -> Result<Value, CniError> {
    let to = shape(target).ok_or_else(|| incompatible(target))?;
    let Some(prev) = prev else {
        if to == Shape::V02 {
            return Err(v02::no_address(target));
        }
        return Ok(json!({ "cniVersion": target, "dns": {} }));
    };
    validate_prev_result(prev)?;
    let Some(obj) = prev.as_object() else {
        return Err(CniError::new(
            ErrorCode::Decode,
            "prevResult is not a JSON object",
        ));
    };
    // libcni sends prevResult in the configuration's version; trust an explicit one.
    let from_version = obj
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or(target);
    let mut from = shape(from_version).ok_or_else(|| {
        CniError::new(
            ErrorCode::IncompatibleVersion,
            format!("prevResult has unsupported cniVersion {from_version:?}"),
        )
        .with_details(format!("supported: {}", SUPPORTED_VERSIONS.join(", ")))
    })?;
    let mut out = obj.clone();
    if from == Shape::V02 && to == Shape::V02 {
        v02::require_address(&out, target)?;
    } else if from == Shape::V02 {
        out = v02::up(&out);
        from = Shape::V03;
    }
    // Down to 0.2.0 goes through the 0.4.0 shape, as libcni's converters do.
    let via = if to == Shape::V02 { Shape::V03 } else { to };
    if from != via && from != Shape::V02 {
        reshape(&mut out, via);
    }
    if to == Shape::V02 && from != Shape::V02 {
        out = v02::down(&out, target)?;
    }
    out.insert("cniVersion".into(), target.into());
    Ok(Value::Object(out))
}

/// A 0.3.0+ result's fields for the 0.3.0+ shape `to`.
fn reshape(out: &mut Map<String, Value>, to: Shape) {
    out.retain(|k, _| TOP.contains(&k.as_str()));
    let (iface, ip, route) = match to {
        Shape::V02 | Shape::V03 => (IFACE_V03, IP_V03, ROUTE_V03),
        Shape::V10 => (IFACE_V10, IP_V10, ROUTE_V03),
        Shape::V11 => (IFACE_V11, IP_V10, ROUTE_V11),
    };
    retain_each(out, "interfaces", iface);
    retain_each(out, "routes", route);
    if let Some(Value::Array(ips)) = out.get_mut("ips") {
        for entry in ips.iter_mut().filter_map(Value::as_object_mut) {
            if to == Shape::V03 && !entry.contains_key("version") {
                let v6 = entry
                    .get("address")
                    .and_then(Value::as_str)
                    .is_some_and(|a| a.contains(':'));
                entry.insert("version".into(), if v6 { "6" } else { "4" }.into());
            }
            entry.retain(|k, _| ip.contains(&k.as_str()));
        }
    }
}

/// The pod's addresses in a result of any version, without their prefixes: `ips[].address`,
/// or a 0.1.0/0.2.0 result's `ip4.ip` and `ip6.ip` (what the ambient hand-off gives ztunnel).
pub fn result_ips(result: &Value) -> Vec<std::net::IpAddr> {
    let listed = result
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let legacy = ["ip4", "ip6"].into_iter().filter_map(|k| result.get(k));
    listed
        .filter_map(|ip| ip.get("address"))
        .chain(legacy.filter_map(|cfg| cfg.get("ip")))
        .filter_map(|a| a.as_str()?.split('/').next()?.parse().ok())
        .collect()
}

/// The fields of a result (any version) with the types libcni gives them; only for validation,
/// the conversion itself works on the JSON so that fields we do not know survive.
mod shape {
    use serde::Deserialize;
    use std::net::IpAddr;

    /// `ADDRESS/PREFIX` as Go's `net.ParseCIDR` reads it (host bits allowed: `10.0.0.5/24`).
    #[derive(Deserialize)]
    #[serde(try_from = "String")]
    struct Cidr;

    impl TryFrom<String> for Cidr {
        type Error = String;
        fn try_from(s: String) -> std::result::Result<Self, String> {
            let bad = || format!("{s:?} is not an ADDRESS/PREFIX");
            let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            match prefix.parse::<u8>() {
                Ok(p) if p <= max && !prefix.starts_with('+') => Ok(Cidr),
                _ => Err(bad()),
            }
        }
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct Result {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
        interfaces: Option<Vec<Interface>>,
        ips: Option<Vec<Ip>>,
        routes: Option<Vec<Route>>,
        dns: Option<Dns>,
        ip4: Option<IpConfig>,
        ip6: Option<IpConfig>,
    }

    /// 0.1.0/0.2.0's `ip4`/`ip6`.
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct IpConfig {
        ip: Cidr,
        gateway: Option<MaybeIp>,
        routes: Option<Vec<Route>>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Interface {
        name: Option<String>,
        mac: Option<String>,
        mtu: Option<u32>,
        sandbox: Option<String>,
        #[serde(rename = "socketPath")]
        socket_path: Option<String>,
        #[serde(rename = "pciID")]
        pci_id: Option<String>,
    }

    /// An address, or nothing: Go decodes `""` as a nil `net.IP`, as if the field were absent.
    #[derive(Deserialize)]
    #[serde(try_from = "String")]
    struct MaybeIp;

    impl TryFrom<String> for MaybeIp {
        type Error = String;
        fn try_from(s: String) -> std::result::Result<Self, String> {
            match s.is_empty() || s.parse::<IpAddr>().is_ok() {
                true => Ok(MaybeIp),
                false => Err(format!("{s:?} is not an IP address")),
            }
        }
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Ip {
        version: Option<String>,
        interface: Option<u32>,
        address: Cidr,
        gateway: Option<MaybeIp>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Route {
        dst: Cidr,
        gw: Option<MaybeIp>,
        mtu: Option<u32>,
        advmss: Option<u32>,
        priority: Option<u32>,
        table: Option<u32>,
        scope: Option<u32>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Dns {
        nameservers: Option<Vec<String>>,
        domain: Option<String>,
        search: Option<Vec<String>>,
        options: Option<Vec<String>>,
    }
}

/// A malformed prevResult fails ADD with the JSON path of the bad field.
fn validate_prev_result(prev: &Value) -> Result<(), CniError> {
    serde_path_to_error::deserialize::<_, shape::Result>(prev)
        .map(|_| ())
        .map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." {
                "prevResult".to_string()
            } else {
                format!("prevResult.{path}")
            };
            CniError::new(ErrorCode::Decode, format!("invalid {at}: {}", e.inner()))
        })
}

fn retain_each(obj: &mut Map<String, Value>, key: &str, fields: &[&str]) {
    if let Some(Value::Array(items)) = obj.get_mut(key) {
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            item.retain(|k, _| fields.contains(&k.as_str()));
        }
    }
}

pub fn incompatible(version: &str) -> CniError {
    CniError::new(
        ErrorCode::IncompatibleVersion,
        format!("cniVersion {version:?} is not supported"),
    )
    .with_details(format!("supported: {}", SUPPORTED_VERSIONS.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn v1_result() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500, "sandbox": "/var/run/netns/p"}],
            "ips": [
                {"interface": 0, "address": "10.244.0.5/24", "gateway": "10.244.0.1"},
                {"interface": 0, "address": "fd00::5/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {"nameservers": ["10.96.0.10"]}
        })
    }

    #[test]
    fn same_version_passes_through_unchanged() {
        let r = v1_result();
        assert_eq!(convert_result(Some(&r), "1.0.0").unwrap(), r);
    }

    #[test]
    fn v1_to_v04_adds_ip_versions_and_drops_unknown_fields() {
        let r = convert_result(Some(&v1_result()), "0.4.0").unwrap();
        assert_eq!(r["cniVersion"], "0.4.0");
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["ips"][1]["version"], "6");
        assert!(r["interfaces"][0].get("mtu").is_none());
        assert_eq!(r["interfaces"][0]["sandbox"], "/var/run/netns/p");
        assert_eq!(r["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn v03_to_v1_removes_ip_versions() {
        let prev = json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.1.1.2/24", "interface": 0}],
        });
        let r = convert_result(Some(&prev), "1.1.0").unwrap();
        assert_eq!(r["cniVersion"], "1.1.0");
        assert!(r["ips"][0].get("version").is_none());
        assert_eq!(r["ips"][0]["address"], "10.1.1.2/24");
    }

    #[test]
    fn no_prev_result_gives_an_empty_result_and_bad_versions_fail() {
        assert_eq!(
            convert_result(None, "0.3.1").unwrap(),
            json!({"cniVersion": "0.3.1", "dns": {}})
        );
        for v in ["0.2.0", "0.5.0", ""] {
            assert_eq!(
                convert_result(None, v).unwrap_err().code,
                ErrorCode::IncompatibleVersion
            );
        }
        assert_eq!(
            convert_result(Some(&json!([1])), "1.0.0").unwrap_err().code,
            ErrorCode::Decode
        );
    }

    #[test]
    fn malformed_prev_results_name_the_path() {
        for (prev, path) in [
            (json!("x"), "prevResult:"),
            (json!({"ips": {}}), "prevResult.ips:"),
            (
                json!({"ips": [{"address": 5}]}),
                "prevResult.ips[0].address",
            ),
            (json!({"ips": [{}]}), "prevResult.ips[0]"),
            (
                json!({"interfaces": [{"mtu": "x"}]}),
                "prevResult.interfaces[0].mtu",
            ),
            (
                json!({"routes": [{"dst": "0.0.0.0/0", "gw": 1}]}),
                "prevResult.routes[0].gw",
            ),
            (
                json!({"dns": {"nameservers": "8.8.8.8"}}),
                "prevResult.dns.nameservers",
            ),
            (json!({"cniVersion": 1}), "prevResult.cniVersion"),
            (
                json!({"ips": [{"address": "bogus"}]}),
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.5"}]}),
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.5/33"}]}),
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.5/24", "gateway": "not-an-ip"}]}),
                "prevResult.ips[0].gateway",
            ),
            (
                json!({"routes": [{"dst": "nowhere"}]}),
                "prevResult.routes[0].dst",
            ),
            (
                json!({"routes": [{"dst": "::/0", "gw": "fe80::1%eth0"}]}),
                "prevResult.routes[0].gw",
            ),
        ] {
            let e = convert_result(Some(&prev), "1.0.0").unwrap_err();
            assert_eq!(e.code, ErrorCode::Decode);
            assert!(e.msg.contains(path), "{prev}: {e}");
        }
    }

    #[test]
    fn env_requirements_follow_the_command() {
        let vars: HashMap<&str, &str> = [("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "eth0")].into();
        let get = |k: &str| vars.get(k).map(OsString::from);
        let e = CniEnv::load(Command::Add, get).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnv);
        assert!(e.msg.contains("CNI_NETNS"));
        let del = CniEnv::load(Command::Del, get).unwrap();
        assert_eq!(del.netns, None);
        assert!(CniEnv::load(Command::Status, |_| None).is_ok());
        assert_eq!(
            "FOO".parse::<Command>().unwrap_err().code,
            ErrorCode::InvalidEnv
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_named_or_ignored() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || OsString::from_vec(b"caf\xe9".to_vec());
        let env = |k: &str, v: OsString| {
            let vars: HashMap<&str, OsString> = [
                ("CNI_CONTAINERID", OsString::from("c1")),
                ("CNI_IFNAME", OsString::from("eth0")),
                ("CNI_NETNS", OsString::from("/var/run/netns/p")),
                ("CNI_ARGS", OsString::from("K8S_POD_NAME=web")),
            ]
            .into_iter()
            .chain([(k, v)])
            .collect();
            CniEnv::load(Command::Add, move |k| vars.get(k).cloned())
        };
        // CNI_ARGS: the pod is still found; the odd value is in a key nobody reads.
        let mut args = b"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;X=".to_vec();
        args.extend_from_slice(b"caf\xe9");
        let ok = env("CNI_ARGS", OsString::from_vec(args)).unwrap();
        assert!(ok.args.contains("K8S_POD_NAME=web"), "{ok:?}");
        // A namespace path is bytes, kept exactly.
        let netns = env("CNI_NETNS", bad()).unwrap().netns.unwrap();
        assert_eq!(netns.into_os_string(), bad());
        for var in ["CNI_CONTAINERID", "CNI_IFNAME"] {
            let e = env(var, bad()).unwrap_err();
            assert!(e.msg.contains(var) && e.msg.contains("UTF-8"), "{e}");
        }
        // CNI_PATH is never used: no reason to fail.
        assert!(env("CNI_PATH", bad()).is_ok());
    }

    #[test]
    fn empty_gateways_read_as_absent_as_go_does() {
        let prev = json!({"cniVersion": "1.0.0",
            "ips": [{"address": "10.0.0.5/24", "gateway": ""}],
            "routes": [{"dst": "0.0.0.0/0", "gw": ""}]});
        assert!(convert_result(Some(&prev), "1.0.0").is_ok());
    }

    #[test]
    fn container_ids_and_interface_names_follow_libcni() {
        let load = |id: &str, ifname: &str| {
            let vars: HashMap<&str, OsString> = [
                ("CNI_CONTAINERID", OsString::from(id)),
                ("CNI_IFNAME", OsString::from(ifname)),
            ]
            .into();
            CniEnv::load(Command::Del, move |k| vars.get(k).cloned())
        };
        for id in ["c1", "0a1b2c", "cnitool-77383ca0a0715733ca6f", "a_b.c-d"] {
            assert!(load(id, "eth0").is_ok(), "{id}");
        }
        for id in ["-bad", "a/b", "a\nb", "../../etc", ".x", "a b"] {
            let e = load(id, "eth0").unwrap_err();
            assert!(
                e.msg.contains("CNI_CONTAINERID") && e.msg.contains(&format!("{id:?}")),
                "{e}"
            );
        }
        for ifname in ["a/b", "abcdefghijklmnop", ".", "..", "e th0", "e:0", "e\t0"] {
            let e = load("c1", ifname).unwrap_err();
            assert!(e.msg.contains("CNI_IFNAME"), "{ifname:?}: {e}");
        }
        assert!(load("c1", "abcdefghijklmno").is_ok());
    }

    #[test]
    fn check_status_and_gc_need_the_version_that_brought_them() {
        for (command, refused, allowed) in [
            (
                Command::Check,
                ["0.1.0", "0.2.0", "0.3.0", "0.3.1"].as_slice(),
                ["0.4.0", "1.0.0", "1.1.0"].as_slice(),
            ),
            (
                Command::Status,
                &["0.2.0", "0.3.1", "0.4.0", "1.0.0"],
                &["1.1.0"],
            ),
            (Command::Gc, &["0.1.0", "0.3.0", "1.0.0"], &["1.1.0"]),
        ] {
            for v in refused {
                let e = allows(command, v).unwrap_err();
                assert_eq!(e.code, ErrorCode::IncompatibleVersion);
                assert!(e.msg.contains(command.as_str()) && e.msg.contains(v), "{e}");
            }
            for v in allowed {
                assert!(allows(command, v).is_ok(), "{command:?} {v}");
            }
        }
        for v in SUPPORTED_VERSIONS {
            assert!(allows(Command::Add, v).is_ok() && allows(Command::Del, v).is_ok());
        }
    }

    #[test]
    fn version_reply_lists_every_supported_version() {
        let r = version_reply(Some("0.4.0"));
        assert_eq!(r["cniVersion"], "0.4.0");
        assert_eq!(
            r["supportedVersions"],
            json!([
                "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
            ])
        );
        assert_eq!(version_reply(None)["cniVersion"], LATEST_VERSION);
    }
}
