//! Link-local destinations and their zone: `--dst '[fe80::1%eth0]:80'` (or `%2`, an interface
//! index). The zone names an interface of the POD's namespace, so it is parsed here and
//! resolved inside that namespace ([`resolve`]).

use crate::ExplainError;
use crate::connection::{Connection, Direction, Zone};
use crate::facts::NsFacts;
use std::ffi::{CStr, CString};
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

const DST_FORM: &str = "expected ADDR:PORT, e.g. 10.0.0.1:80, [fd00::1]:443 or [fe80::1%eth0]:80";

/// Parses `--dst`: `ADDR:PORT`, `[V6]:PORT`, or `[V6%ZONE]:PORT` with ZONE an interface name
/// or index. The zone is returned as written (checked against the namespace later).
pub fn parse_dst(s: &str) -> Result<(SocketAddr, Option<Zone>), String> {
    let Some(rest) = s.strip_prefix('[') else {
        return s.parse().map(|a| (a, None)).map_err(|_| DST_FORM.into());
    };
    let (inside, port) = rest.split_once("]:").ok_or_else(|| DST_FORM.to_string())?;
    let port: u16 = port.parse().map_err(|_| DST_FORM.to_string())?;
    let (addr, zone) = match inside.split_once('%') {
        Some((a, z)) => (a, Some(z)),
        None => (inside, None),
    };
    let ip: std::net::Ipv6Addr = addr.parse().map_err(|_| DST_FORM.to_string())?;
    let dst = SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0));
    let Some(z) = zone else {
        return Ok((dst, None));
    };
    if z.is_empty() {
        return Err("empty zone after '%': name an interface of the pod, e.g. %eth0".into());
    }
    if !is_link_local(dst.ip()) {
        return Err(format!(
            "zone %{z}: a zone applies to link-local addresses (fe80::/10) only"
        ));
    }
    let zone = match z.parse::<u32>() {
        Ok(0) => return Err("zone %0: interface indexes start at 1".into()),
        Ok(i) => Zone::Index(i),
        Err(_) if z.len() < libc::IFNAMSIZ && !z.contains(['/', ' ', '\0']) => {
            Zone::Name(z.to_string())
        }
        Err(_) => return Err(format!("zone %{z}: not an interface name or index")),
    };
    Ok((dst, Some(zone)))
}

/// fe80::/10.
pub fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
}

/// The zone's interface in the CURRENT namespace: `(name, index)`, or `None` if it has none.
pub fn resolve(zone: &Zone) -> Option<(String, u32)> {
    match zone {
        Zone::Name(n) => {
            let c = CString::new(n.as_str()).ok()?;
            // SAFETY: a NUL-terminated name.
            let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
            (i != 0).then(|| (n.clone(), i))
        }
        Zone::Index(i) => {
            let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
            // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname requires.
            let p = unsafe { libc::if_indextoname(*i, buf.as_mut_ptr()) };
            if p.is_null() {
                return None;
            }
            // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
            let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
            Some((name.to_string_lossy().into_owned(), *i))
        }
    }
}

fn bad(conn: &Connection, why: String) -> ExplainError {
    ExplainError::BadInput {
        arg: "--dst",
        value: conn.dst_shown(),
        why,
    }
}

/// The connection's zone resolved in the current (the pod's) namespace, checked: a zone
/// names an interface there (inbound: the one holding the address); an outbound link-local
/// destination needs one (the kernel refuses to connect without it); an inbound one without
/// a zone arrives on the one interface holding the address.
pub(crate) fn check(
    conn: &Connection,
    facts: &NsFacts,
) -> Result<Option<(String, u32)>, ExplainError> {
    let dst = conn.dst.ip();
    let Some(zone) = &conn.zone else {
        if !is_link_local(dst) {
            return Ok(None);
        }
        return match conn.direction {
            Direction::Outbound => Err(bad(
                conn,
                format!(
                    "a link-local destination needs a zone, the pod's interface to reach it \
                     through: [{dst}%eth0]:{} (interfaces: {})",
                    conn.dst.port(),
                    facts.interface_list()
                ),
            )),
            Direction::Inbound => {
                let mut on: Vec<&str> = facts
                    .addresses
                    .iter()
                    .filter(|(_, a)| *a == dst)
                    .map(|(n, _)| n.as_str())
                    .collect();
                on.dedup();
                match on.as_slice() {
                    [] => Ok(None), // not an address of the pod: validate() says so
                    [one] => Ok(resolve(&Zone::Name(one.to_string()))),
                    many => Err(bad(
                        conn,
                        format!(
                            "{dst} is on several interfaces ({}): name the one it arrives on, \
                             e.g. [{dst}%{}]:{}",
                            many.join(", "),
                            many[0],
                            conn.dst.port()
                        ),
                    )),
                }
            }
        };
    };
    if !is_link_local(dst) {
        return Err(bad(
            conn,
            format!("zone %{zone}: a zone applies to link-local addresses (fe80::/10) only"),
        ));
    }
    let Some((name, index)) = resolve(zone) else {
        return Err(bad(
            conn,
            format!(
                "zone %{zone}: no such interface in the pod's namespace (interfaces: {})",
                facts.interface_list()
            ),
        ));
    };
    if conn.direction == Direction::Inbound && !facts.addresses.contains(&(name.clone(), dst)) {
        return Err(bad(
            conn,
            format!(
                "zone %{zone}: {dst} is not an address of {name} (the pod's: {})",
                facts.address_list()
            ),
        ));
    }
    Ok(Some((name, index)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dst_with_and_without_zone() {
        let (a, z) = parse_dst("[fe80::1%eth0]:80").unwrap();
        assert_eq!(a, "[fe80::1]:80".parse().unwrap());
        assert_eq!(z, Some(Zone::Name("eth0".into())));
        let (_, z) = parse_dst("[fe80::1%3]:80").unwrap();
        assert_eq!(z, Some(Zone::Index(3)));
        assert_eq!(parse_dst("10.0.0.1:80").unwrap().1, None);
        assert_eq!(parse_dst("[fd00::1]:443").unwrap().1, None);
        assert_eq!(parse_dst("[fe80::2]:8080").unwrap().1, None);
    }

    #[test]
    fn bad_zones_say_why() {
        for (s, why) in [
            ("[fe80::1%]:80", "empty zone"),
            ("[fe80::1%0]:80", "zone %0"),
            ("[fd00::1%eth0]:80", "link-local addresses (fe80::/10) only"),
            ("[fe80::1%a/b]:80", "zone %a/b: not an interface name"),
            (
                "[fe80::1%averyveryverylongname]:80",
                "not an interface name",
            ),
            ("[fe80::1%eth0]", "expected ADDR:PORT"),
            ("10.0.0.1%eth0:80", "expected ADDR:PORT"),
        ] {
            let e = parse_dst(s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn link_local_is_fe80_slash_10() {
        assert!(is_link_local("fe80::1".parse().unwrap()));
        assert!(is_link_local("febf::1".parse().unwrap()));
        assert!(!is_link_local("fec0::1".parse().unwrap()));
        assert!(!is_link_local("10.0.0.1".parse().unwrap()));
    }
}
