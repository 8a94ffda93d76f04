//! What the evaluator needs from the namespace besides its rules: its addresses, the route
//! (interface and source address) to a destination, and its TCP listeners. Read in the
//! namespace the calling thread is in.

use super::eval::World;
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NsFacts {
    /// `(interface, address)` of every address in the namespace.
    pub addresses: Vec<(String, IpAddr)>,
    /// TCP listening sockets: `(local address, port)`.
    pub listeners: Vec<(IpAddr, u16)>,
    /// Outbound: the route's output interface and source address for the destination.
    pub route: Option<(String, IpAddr)>,
    /// The connection's zone (link-local `--dst`) resolved in the namespace: `(name, index)`;
    /// inbound without a zone, the one interface that has the destination address.
    pub zone: Option<(String, u32)>,
}

impl NsFacts {
    /// Reads the current namespace.
    pub fn read() -> io::Result<NsFacts> {
        let mut addresses = Vec::new();
        for ifa in nix::ifaddrs::getifaddrs().map_err(io::Error::from)? {
            let Some(a) = ifa.address else { continue };
            let ip = if let Some(v4) = a.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else if let Some(v6) = a.as_sockaddr_in6() {
                IpAddr::V6(v6.ip())
            } else {
                continue;
            };
            addresses.push((ifa.interface_name, ip));
        }
        let mut listeners = Vec::new();
        for (file, v6) in [("tcp", false), ("tcp6", true)] {
            let path = format!("/proc/thread-self/net/{file}");
            if let Ok(text) = std::fs::read_to_string(&path) {
                listeners.extend(parse_proc_listeners(&text, v6));
            }
        }
        Ok(NsFacts {
            addresses,
            listeners,
            route: None,
            zone: None,
        })
    }

    /// Whether `a` is an address of this namespace (all of 127.0.0.0/8 is, via lo).
    pub fn is_local(&self, a: IpAddr) -> bool {
        match a {
            IpAddr::V4(v4) if v4.is_loopback() => true,
            _ => self.addresses.iter().any(|(_, x)| *x == a),
        }
    }

    /// `eth0 10.1.1.2, lo 127.0.0.1, …` for error messages.
    pub fn address_list(&self) -> String {
        self.addresses
            .iter()
            .map(|(n, a)| format!("{n} {a}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The interface owning local address `a`.
    pub fn iface_of(&self, a: IpAddr) -> Option<&str> {
        if let IpAddr::V4(v4) = a
            && v4.is_loopback()
        {
            return Some("lo");
        }
        self.addresses
            .iter()
            .find(|(_, x)| *x == a)
            .map(|(n, _)| n.as_str())
    }

    /// The output interface and source address the kernel picks for `dst` (`lo` for a local
    /// destination) through the zone's interface (`(name, index)`, link-local destinations).
    /// Asks the routing table by connecting a UDP socket (nothing is sent): also for local
    /// destinations, whose source is the local route's (127.0.0.6 is reached from 127.0.0.1).
    pub fn route_to(
        &self,
        dst: IpAddr,
        zone: Option<&(String, u32)>,
    ) -> io::Result<(String, IpAddr)> {
        let (bind, to): (SocketAddr, SocketAddr) = match dst {
            IpAddr::V6(a) => (
                "[::]:0".parse().unwrap(),
                SocketAddrV6::new(a, 9, 0, zone.map_or(0, |z| z.1)).into(),
            ),
            IpAddr::V4(_) => ("0.0.0.0:0".parse().unwrap(), SocketAddr::new(dst, 9)),
        };
        let s = UdpSocket::bind(bind)?;
        s.connect(to)?;
        let src = s.local_addr()?.ip();
        if self.is_local(dst) {
            return Ok(("lo".into(), src));
        }
        if let Some((name, _)) = zone {
            return Ok((name.clone(), src));
        }
        let oif = self
            .iface_of(src)
            .ok_or_else(|| io::Error::other(format!("no interface owns source address {src}")))?;
        Ok((oif.to_string(), src))
    }

    /// The interfaces with an address, each once: `lo, eth0` (for error messages).
    pub fn interface_list(&self) -> String {
        let mut names: Vec<&str> = self.addresses.iter().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        names.sort();
        names.dedup();
        names.join(", ")
    }
}

fn parse_proc_listeners(text: &str, v6: bool) -> Vec<(IpAddr, u16)> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 || f[3] != "0A" {
            continue;
        }
        let Some((addr, port)) = f[1].split_once(':') else {
            continue;
        };
        let Ok(port) = u16::from_str_radix(port, 16) else {
            continue;
        };
        let ip = if v6 {
            let mut b = [0u8; 16];
            for i in 0..4 {
                let Ok(w) = u32::from_str_radix(&addr[i * 8..i * 8 + 8], 16) else {
                    continue;
                };
                // /proc prints each 32-bit word in host order.
                b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            IpAddr::from(b)
        } else {
            let Ok(w) = u32::from_str_radix(addr, 16) else {
                continue;
            };
            IpAddr::from(w.to_ne_bytes())
        };
        out.push((ip, port));
    }
    out
}

impl World for NsFacts {
    fn has_listener(&self, ipv6: bool, port: u16) -> bool {
        self.listeners.iter().any(|(a, p)| {
            *p == port && (a.is_ipv6() == ipv6 || (!ipv6 && a.is_unspecified() && a.is_ipv6()))
        })
    }

    fn redirect_address(&self, iface: &str, dst: IpAddr) -> Option<IpAddr> {
        // The kernel's order (getifaddrs dumps each interface's list as the kernel keeps it:
        // IPv6 by scope, widest first). IPv6 (nf_nat_redirect_ipv6): the first address whose
        // scope the destination's has, where only link-local (and loopback) destinations have
        // a scope to match; never an IPv4-mapped one.
        let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local());
        self.addresses
            .iter()
            .filter(|(n, a)| n == iface && a.is_ipv6() == dst.is_ipv6())
            .map(|(_, a)| *a)
            .filter(|a| !matches!(a, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()))
            .find(|a| !link_local(&dst) || link_local(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_address_matches_the_destination_s_scope() {
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        let f = NsFacts {
            addresses: [
                ("eth0", "10.0.0.2"),
                ("eth0", "fd77::2"),
                ("eth0", "fe80::2"),
                ("eth1", "fe80::9"),
            ]
            .iter()
            .map(|(n, x)| (n.to_string(), a(x)))
            .collect(),
            ..NsFacts::default()
        };
        let to = |dst| f.redirect_address("eth0", a(dst));
        assert_eq!(to("fe80::2"), Some(a("fe80::2")));
        assert_eq!(to("fd77::2"), Some(a("fd77::2")));
        assert_eq!(to("10.0.0.2"), Some(a("10.0.0.2")));
        // No link-local address on the interface: no target (the kernel drops the packet).
        let g = NsFacts {
            addresses: vec![("eth0".into(), a("fd77::2"))],
            ..NsFacts::default()
        };
        assert_eq!(g.redirect_address("eth0", a("fe80::2")), None);
    }

    #[test]
    fn proc_net_tcp_listeners() {
        let v4 = "  sl  local_address rem_address   st\n   0: 00000000:3A99 00000000:0000 0A 0\n   1: 0100007F:1F90 0100007F:C350 01 0\n";
        assert_eq!(
            parse_proc_listeners(v4, false),
            vec![("0.0.0.0".parse().unwrap(), 15001)]
        );
        let v6 = "  sl\n   0: 00000000000000000000000001000000:3A9E 00000000000000000000000000000000:0000 0A 0\n";
        assert_eq!(
            parse_proc_listeners(v6, true),
            vec![("::1".parse().unwrap(), 15006)]
        );
    }
}
