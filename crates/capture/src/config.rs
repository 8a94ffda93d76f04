use crate::ids::Id;
use crate::net::IpNet;
use std::net::IpAddr;

/// How inbound traffic reaches Envoy (`-m`). Istio treats every value but `TPROXY` as REDIRECT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InterceptionMode {
    #[default]
    Redirect,
    Tproxy,
}

/// Which inbound ports are captured (`-b`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum InboundPorts {
    /// Empty `-b`: no inbound capture at all.
    #[default]
    None,
    /// `-b '*'`: everything except `-d` ports.
    All,
    /// An explicit list; `-d` is ignored.
    List(Vec<u16>),
}

/// Which outbound destinations are captured (`-i`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum OutboundRanges {
    /// `-i '*'`.
    All,
    /// A CIDR list; empty means no outbound capture except `-q` ports.
    List(Vec<IpNet>),
    #[default]
    None,
}

/// `ISTIO_OUTBOUND_OWNER_GROUPS` / `_EXCLUDE`: whose traffic is captured by group.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum OwnerGroups {
    /// Include `*` and no exclusions: no rule.
    #[default]
    All,
    /// Only these groups are captured.
    Only(Vec<Id>),
    /// Everyone but these groups is captured.
    AllExcept(Vec<Id>),
}

/// `--ipv6`: whether IPv6 rules are installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Ipv6Mode {
    /// Istio's detection from the namespace's addresses (`--dual-stack` widens it).
    #[default]
    Auto,
    On,
    Off,
}

/// Every setting that changes the rules. Defaults are istio-iptables' (`DefaultConfig()`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `-p`: outbound capture port.
    pub proxy_port: u16,
    /// `-z`: inbound capture port.
    pub inbound_capture_port: u16,
    /// `-e`: HBONE tunnel port, never redirected.
    pub inbound_tunnel_port: u16,
    /// `-u`: Envoy's user(s).
    pub proxy_uids: Vec<Id>,
    /// `-g`: Envoy's group(s).
    pub proxy_gids: Vec<Id>,
    /// `-m`.
    pub inbound_mode: InterceptionMode,
    /// `-b`.
    pub inbound_ports: InboundPorts,
    /// `-d`: only used with `-b '*'`.
    pub inbound_ports_exclude: Vec<u16>,
    /// `-c`: neither direction captured on these interfaces.
    pub exclude_interfaces: Vec<String>,
    /// `-i`.
    pub outbound_ranges: OutboundRanges,
    /// `-x`.
    pub outbound_ranges_exclude: Vec<IpNet>,
    /// `-q`: TCP ports always redirected.
    pub outbound_ports_include: Vec<u16>,
    /// `-o`: TCP and UDP ports never redirected.
    pub outbound_ports_exclude: Vec<u16>,
    /// `-k`: inbound on these interfaces is treated as outbound (KubeVirt).
    pub reroute_virtual_interfaces: Vec<String>,
    /// `-t`.
    pub tproxy_mark: u32,
    /// `-r`.
    pub tproxy_route_table: u32,
    pub redirect_dns: bool,
    pub capture_all_dns: bool,
    pub drop_invalid: bool,
    pub dual_stack: bool,
    pub owner_groups: OwnerGroups,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`.
    pub host_ipv4_loopback: IpNet,
    pub ipv6: Ipv6Mode,
    /// `--dns-servers`: used instead of the namespace's resolv.conf.
    pub dns_servers: Option<Vec<IpAddr>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            proxy_port: 15001,
            inbound_capture_port: 15006,
            inbound_tunnel_port: 15008,
            proxy_uids: vec![Id::numeric(1337)],
            proxy_gids: vec![Id::numeric(1337)],
            inbound_mode: InterceptionMode::Redirect,
            inbound_ports: InboundPorts::None,
            inbound_ports_exclude: Vec::new(),
            exclude_interfaces: Vec::new(),
            outbound_ranges: OutboundRanges::None,
            outbound_ranges_exclude: Vec::new(),
            outbound_ports_include: Vec::new(),
            outbound_ports_exclude: Vec::new(),
            reroute_virtual_interfaces: Vec::new(),
            tproxy_mark: 1337,
            tproxy_route_table: 133,
            redirect_dns: false,
            capture_all_dns: false,
            drop_invalid: false,
            dual_stack: false,
            owner_groups: OwnerGroups::All,
            host_ipv4_loopback: IpNet {
                addr: IpAddr::V4([127, 0, 0, 1].into()),
                prefix: 32,
            },
            ipv6: Ipv6Mode::Auto,
            dns_servers: None,
        }
    }
}

impl Config {
    /// The CNI plugin's default sidecar (istio-reference §1.6b): capture everything, inbound
    /// excludes 15020/15021/15090, outbound exclude 15020.
    pub fn cni_default() -> Self {
        Self {
            inbound_ports: InboundPorts::All,
            inbound_ports_exclude: vec![15020, 15021, 15090],
            outbound_ranges: OutboundRanges::All,
            outbound_ports_exclude: vec![15020],
            ..Self::default()
        }
    }

    /// Whether `Plan::build` reads [`Facts::local_addrs`] for this config: only `--ipv6 auto`
    /// detects the family from the namespace's addresses.
    pub fn reads_local_addrs(&self) -> bool {
        self.ipv6 == Ipv6Mode::Auto
    }

    /// Whether `Plan::build` reads [`Facts::resolv_conf_servers`] for this config: DNS capture
    /// of resolv.conf's servers (not all DNS, no `--dns-servers`).
    pub fn reads_resolv_conf(&self) -> bool {
        self.redirect_dns && !self.capture_all_dns && self.dns_servers.is_none()
    }
}

/// What `Plan::build` needs to know about the target namespace; read by the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// Addresses on the namespace's interfaces (for `--ipv6 auto`).
    pub local_addrs: Vec<IpAddr>,
    /// Nameservers from the namespace's resolv.conf (for DNS capture without `--dns-servers`).
    pub resolv_conf_servers: Vec<IpAddr>,
}

/// A setting with a bad value. `field` names the flag, env var or annotation the value came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for {field}: {value:?}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub value: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;

    /// `reads_*` are what lets a caller skip reading a fact: a fact they call unread must not
    /// change the plan, whatever the namespace holds.
    #[test]
    fn facts_called_unread_do_not_change_the_plan() {
        let rich = Facts {
            local_addrs: vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            resolv_conf_servers: vec!["10.96.0.10".parse().unwrap(), "fd00::a".parse().unwrap()],
        };
        let mut checked = 0;
        for ipv6 in [Ipv6Mode::On, Ipv6Mode::Off, Ipv6Mode::Auto] {
            for (redirect_dns, capture_all_dns) in [(false, false), (true, false), (true, true)] {
                for dns_servers in [None, Some(vec!["10.1.1.1".parse().unwrap()])] {
                    for inbound_mode in [InterceptionMode::Redirect, InterceptionMode::Tproxy] {
                        let cfg = Config {
                            ipv6,
                            redirect_dns,
                            capture_all_dns,
                            dns_servers: dns_servers.clone(),
                            inbound_mode,
                            dual_stack: true,
                            ..Config::cni_default()
                        };
                        let pruned = Facts {
                            local_addrs: match cfg.reads_local_addrs() {
                                true => rich.local_addrs.clone(),
                                false => Vec::new(),
                            },
                            resolv_conf_servers: match cfg.reads_resolv_conf() {
                                true => rich.resolv_conf_servers.clone(),
                                false => Vec::new(),
                            },
                        };
                        assert_eq!(
                            Plan::build(&cfg, &rich),
                            Plan::build(&cfg, &pruned),
                            "{cfg:?}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 36);
    }
}
