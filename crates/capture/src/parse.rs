//! Parsers for the string forms istio-iptables accepts. Every error names the field it came
//! from, so a bad flag, env var or pod annotation is reported by its own name.

use crate::config::*;
use crate::ids::{Id, IdDb, IdKind};
use crate::net::IpNet;
use std::net::IpAddr;

/// istio's `config.Split`: comma separated, empty items dropped, whitespace trimmed.
pub fn split_list(s: &str) -> Vec<&str> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// The reason a list item is bad: names the item only when the value has more than one (the
/// error already shows the whole value, so a single item would be repeated).
fn item_reason(value: &str, item: &str, reason: impl std::fmt::Display) -> String {
    if value.trim() == item {
        reason.to_string()
    } else {
        format!("item {item:?}: {reason}")
    }
}

pub fn parse_port(field: &str, value: &str) -> Result<u16, ConfigError> {
    let v = value.trim();
    match v.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(ConfigError::new(
            field,
            value,
            "expected a port number between 1 and 65535",
        )),
    }
}

pub fn parse_port_list(field: &str, value: &str) -> Result<Vec<u16>, ConfigError> {
    let mut ports = Vec::new();
    for item in split_list(value) {
        let p = item
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                ConfigError::new(
                    field,
                    value,
                    item_reason(value, item, "not a port number between 1 and 65535"),
                )
            })?;
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    Ok(ports)
}

pub fn parse_u32(field: &str, value: &str) -> Result<u32, ConfigError> {
    value
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(field, value, "expected a non-negative 32-bit number"))
}

/// Go's `strconv.ParseBool`, which istio-iptables uses for boolean env vars.
pub fn parse_bool(field: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ConfigError::new(field, value, "expected true or false")),
    }
}

pub fn parse_inbound_ports(field: &str, value: &str) -> Result<InboundPorts, ConfigError> {
    match value.trim() {
        "" => Ok(InboundPorts::None),
        "*" => Ok(InboundPorts::All),
        _ => {
            let ports = parse_port_list(field, value)?;
            Ok(if ports.is_empty() {
                InboundPorts::None
            } else {
                InboundPorts::List(ports)
            })
        }
    }
}

pub fn parse_cidr_list(field: &str, value: &str) -> Result<Vec<IpNet>, ConfigError> {
    let mut nets = Vec::new();
    for item in split_list(value) {
        if item == "*" {
            return Err(ConfigError::new(
                field,
                value,
                "the wildcard '*' is not allowed here",
            ));
        }
        let net: IpNet = item
            .parse()
            .map_err(|e| ConfigError::new(field, value, item_reason(value, item, e)))?;
        if !nets.contains(&net) {
            nets.push(net);
        }
    }
    Ok(nets)
}

pub fn parse_outbound_ranges(field: &str, value: &str) -> Result<OutboundRanges, ConfigError> {
    match value.trim() {
        "*" => Ok(OutboundRanges::All),
        _ => {
            let nets = parse_cidr_list(field, value)?;
            Ok(if nets.is_empty() {
                OutboundRanges::None
            } else {
                OutboundRanges::List(nets)
            })
        }
    }
}

/// Linux interface names: 1–15 bytes, no '/', whitespace or ':' (the kernel's `dev_valid_name`).
pub fn parse_interface_list(field: &str, value: &str) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::new();
    for item in split_list(value) {
        let ok = item.len() < 16
            && item != "."
            && item != ".."
            && item
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':' && b != b'"' && b != b'\'');
        if !ok {
            return Err(ConfigError::new(
                field,
                value,
                item_reason(value, item, "not a valid interface name"),
            ));
        }
        if !out.iter().any(|o| o == item) {
            out.push(item.to_string());
        }
    }
    Ok(out)
}

pub fn parse_interception_mode(field: &str, value: &str) -> Result<InterceptionMode, ConfigError> {
    // istio-iptables: only the exact string TPROXY switches behaviour; the CNI plugin rejects
    // anything but REDIRECT/TPROXY itself (see `parse_interception_mode_strict`).
    let _ = field;
    Ok(if value.trim() == "TPROXY" {
        InterceptionMode::Tproxy
    } else {
        InterceptionMode::Redirect
    })
}

/// The pod annotation form: only `REDIRECT` and `TPROXY` are meaningful for a sidecar.
pub fn parse_interception_mode_strict(
    field: &str,
    value: &str,
) -> Result<InterceptionMode, ConfigError> {
    match value.trim() {
        "REDIRECT" => Ok(InterceptionMode::Redirect),
        "TPROXY" => Ok(InterceptionMode::Tproxy),
        _ => Err(ConfigError::new(
            field,
            value,
            "expected REDIRECT or TPROXY",
        )),
    }
}

pub fn parse_ipv6_mode(field: &str, value: &str) -> Result<Ipv6Mode, ConfigError> {
    match value.trim() {
        "auto" => Ok(Ipv6Mode::Auto),
        "on" | "true" => Ok(Ipv6Mode::On),
        "off" | "false" => Ok(Ipv6Mode::Off),
        _ => Err(ConfigError::new(field, value, "expected auto, on or off")),
    }
}

pub fn parse_ip_list(field: &str, value: &str) -> Result<Vec<IpAddr>, ConfigError> {
    split_list(value)
        .into_iter()
        .map(|s| {
            s.parse().map_err(|_| {
                ConfigError::new(field, value, item_reason(value, s, "not an IP address"))
            })
        })
        .collect()
}

/// A uid/gid list (`-u 1337`, `-g 1337,2000`, names allowed). At least one entry.
pub fn parse_id_list(
    field: &str,
    value: &str,
    kind: IdKind,
    db: &IdDb,
) -> Result<Vec<Id>, ConfigError> {
    let mut ids: Vec<Id> = Vec::new();
    for item in split_list(value) {
        let id = db
            .resolve(kind, item)
            .map_err(|e| ConfigError::new(field, value, e.to_string()))?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err(ConfigError::new(field, value, "expected at least one id"));
    }
    Ok(ids)
}

/// Istio's `ParseInterceptFilter` plus its validation (at most 64 included groups).
pub fn parse_owner_groups(
    include_field: &str,
    include: &str,
    exclude_field: &str,
    exclude: &str,
    db: &IdDb,
) -> Result<OwnerGroups, ConfigError> {
    const MAX_GROUPS: usize = 64;
    let include = include.trim();
    if include.is_empty() || include == "*" {
        if split_list(exclude).is_empty() {
            return Ok(OwnerGroups::All);
        }
        return Ok(OwnerGroups::AllExcept(parse_id_list(
            exclude_field,
            exclude,
            IdKind::Group,
            db,
        )?));
    }
    let groups = parse_id_list(include_field, include, IdKind::Group, db)?;
    if groups.len() > MAX_GROUPS {
        return Err(ConfigError::new(
            include_field,
            include,
            format!(
                "{} groups given, at most {MAX_GROUPS} are supported",
                groups.len()
            ),
        ));
    }
    Ok(OwnerGroups::Only(groups))
}

/// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: an IPv4 loopback prefix with a mask of 8 to 32 bits.
pub fn parse_loopback_cidr(field: &str, value: &str) -> Result<IpNet, ConfigError> {
    let net: IpNet = value
        .trim()
        .parse()
        .map_err(|e: String| ConfigError::new(field, value, e))?;
    match net.addr {
        IpAddr::V4(a) if a.is_loopback() && (8..=32).contains(&net.prefix) => Ok(net),
        _ => Err(ConfigError::new(
            field,
            value,
            "expected an IPv4 loopback CIDR with a mask of 8 to 32 bits",
        )),
    }
}

/// Nameservers of a resolv.conf(5), as Istio reads them.
pub fn parse_resolv_conf(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == "nameserver")
                .then(|| words.next()?.split('%').next()?.parse().ok())?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_show_the_value_once() {
        let e = parse_cidr_list("f", "300.1.2.3/99")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            r#"invalid value for f: "300.1.2.3/99": "300.1.2.3" is not an IP address"#
        );
        let e = parse_port_list("f", "80,http").unwrap_err().to_string();
        assert_eq!(
            e,
            r#"invalid value for f: "80,http": item "http": not a port number between 1 and 65535"#
        );
        let e = parse_ip_list("f", "x").unwrap_err().to_string();
        assert_eq!(e, r#"invalid value for f: "x": not an IP address"#);
    }

    #[test]
    fn lists_and_errors_name_the_field() {
        assert_eq!(
            parse_port_list("-d", "15090, 15021,,15020,15021").unwrap(),
            vec![15090, 15021, 15020]
        );
        let e = parse_port_list("--istio-local-exclude-ports", "80,http").unwrap_err();
        assert!(e.to_string().contains("--istio-local-exclude-ports"), "{e}");
        assert!(e.to_string().contains("http"));
        assert_eq!(parse_inbound_ports("-b", "*").unwrap(), InboundPorts::All);
        assert!(parse_cidr_list("-x", "*").is_err());
        assert!(parse_interface_list("-c", "eth0,bad/name").is_err());
        assert!(parse_loopback_cidr("L", "127.0.0.1/7").is_err());
        assert!(parse_loopback_cidr("L", "10.0.0.1/8").is_err());
        assert_eq!(parse_loopback_cidr("L", "127.0.0.1/8").unwrap().prefix, 8);
        assert_eq!(
            parse_resolv_conf("# c\nnameserver 10.96.0.10\nsearch x\nnameserver fe80::1%eth0\n"),
            vec![
                "10.96.0.10".parse::<IpAddr>().unwrap(),
                "fe80::1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn owner_groups_follow_istio() {
        let db = IdDb::parse("", "java:x:900:\nftp:x:21:\n");
        assert_eq!(
            parse_owner_groups("I", "*", "E", "", &db).unwrap(),
            OwnerGroups::All
        );
        assert!(
            matches!(parse_owner_groups("I", "java,202", "E", "", &db).unwrap(), OwnerGroups::Only(g) if g.len() == 2)
        );
        assert!(
            matches!(parse_owner_groups("I", "*", "E", "888,ftp", &db).unwrap(), OwnerGroups::AllExcept(g) if g[1].id == 21)
        );
        let many = (0..65).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        assert!(
            parse_owner_groups("I", &many, "E", "", &db)
                .unwrap_err()
                .reason
                .contains("64")
        );
    }
}
