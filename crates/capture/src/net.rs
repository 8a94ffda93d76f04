use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP prefix as written by the user (`10.0.0.0/8`, `2001:db8::/32`, `127.0.0.1/32`).
///
/// The address is kept as given (host bits are not cleared) because iptables prints what it was
/// given and Istio's goldens do too; `network()` gives the masked address for set intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl IpNet {
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    pub fn host(addr: IpAddr) -> Self {
        Self {
            addr,
            prefix: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    pub fn max_prefix(&self) -> u8 {
        if self.is_ipv4() { 32 } else { 128 }
    }

    pub fn is_host(&self) -> bool {
        self.prefix == self.max_prefix()
    }

    /// First address of the prefix (host bits cleared).
    pub fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        }
    }

    /// One past the last address of the prefix, or `None` when the prefix reaches the end of
    /// the address space (nft then omits the closing interval element).
    pub fn end_exclusive(&self) -> Option<IpAddr> {
        match self.network() {
            IpAddr::V4(a) => {
                let size = 1u64 << (32 - self.prefix as u32);
                let end = u32::from(a) as u64 + size;
                (end <= u32::MAX as u64).then(|| IpAddr::V4(Ipv4Addr::from(end as u32)))
            }
            IpAddr::V6(a) => {
                if self.prefix == 0 {
                    return None;
                }
                let size = 1u128 << (128 - self.prefix as u32);
                u128::from(a)
                    .checked_add(size)
                    .map(|e| IpAddr::V6(Ipv6Addr::from(e)))
            }
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.is_ipv4() {
            return false;
        }
        IpNet {
            addr: ip,
            prefix: self.prefix,
        }
        .network()
            == self.network()
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", DisplayIp(self.addr), self.prefix)
    }
}

/// Formats an address the way glibc's `inet_ntop` (and so `nft` and `iptables`) does: like
/// Rust, except that IPv4-compatible IPv6 addresses keep their dotted tail (`::127.0.0.53`).
pub struct DisplayIp(pub IpAddr);

impl fmt::Display for DisplayIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V6(a) => {
                let w = a.segments();
                if w[..6].iter().all(|x| *x == 0) && w[6] != 0 {
                    let [.., c, d, e, g] = a.octets();
                    return write!(f, "::{c}.{d}.{e}.{g}");
                }
                write!(f, "{a}")
            }
            v4 => write!(f, "{v4}"),
        }
    }
}

impl FromStr for IpNet {
    type Err = String;

    /// Go's `netip.ParsePrefix`: the prefix length is mandatory.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| "missing /prefix length".to_string())?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        if len.is_empty()
            || !len.bytes().all(|b| b.is_ascii_digit())
            || (len.len() > 1 && len.starts_with('0'))
        {
            return Err(format!("{len:?} is not a prefix length"));
        }
        let prefix: u8 = len
            .parse()
            .map_err(|_| format!("{len:?} is not a prefix length"))?;
        IpNet::new(addr, prefix)
            .ok_or_else(|| format!("prefix length {prefix} is too long for {addr}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_computes_intervals() {
        let n: IpNet = "10.1.2.3/8".parse().unwrap();
        assert_eq!(n.to_string(), "10.1.2.3/8");
        assert_eq!(n.network().to_string(), "10.0.0.0");
        assert_eq!(n.end_exclusive().unwrap().to_string(), "11.0.0.0");
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert_eq!(all.end_exclusive(), None);
        let v6: IpNet = "2001:db8::/32".parse().unwrap();
        assert_eq!(v6.end_exclusive().unwrap().to_string(), "2001:db9::");
        assert!("10.0.0.0".parse::<IpNet>().is_err());
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("*".parse::<IpNet>().is_err());
        assert!(n.contains("10.200.0.1".parse().unwrap()));
        let dns: IpNet = "::127.0.0.53/128".parse().unwrap();
        assert_eq!(dns.to_string(), "::127.0.0.53/128");
        assert_eq!("::6/128".parse::<IpNet>().unwrap().to_string(), "::6/128");
    }
}
