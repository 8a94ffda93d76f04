//! Ambient mode's rules as a `Plan`: the in-pod rules the node agent programs inside each
//! ambient pod's namespace (ztunnel proxies the pod from there), and the host rule that SNATs
//! kubelet's probes so they reach the app without ztunnel.
//!
//! The rule algorithm is Istio's `AppendInpodRules` / `CreateHostRulesForHealthChecks`
//! (cni/pkg/{iptables,nftables}), step by step and in the same order, so that the legacy
//! backend renders Istio's iptables goldens byte for byte and the nft backend its nft goldens
//! (after the deviations in nft/DEVIATIONS.md). Pure: no I/O; the kubelet uid is resolved by
//! the caller (`node_view::kubelet::kubelet_uid`).

use crate::config::ConfigError;
use crate::ids::Id;
use crate::net::IpNet;
use crate::plan::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ChainId::*;
use Table::*;

/// Istio's ambient constants (cni/pkg/config/config.go).
pub mod ambient_constants {
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// ztunnel marks its own sockets with this (within `INPOD_MASK`).
    pub const INPOD_MARK: u32 = 0x539;
    pub const INPOD_MASK: u32 = 0xfff;
    /// Connmark of connections ztunnel accepted inbound; restored on their replies.
    pub const INPOD_TPROXY_MARK: u32 = 0x111;
    pub const INPOD_TPROXY_MASK: u32 = 0xfff;
    /// Policy routing table for `INPOD_TPROXY_MARK` (local default via lo), and its rule's pref.
    pub const ROUTE_TABLE_INBOUND: u32 = 100;
    pub const INPOD_MARK_RULE_PRIORITY: u32 = 32764;
    pub const ZTUNNEL_OUTBOUND_PORT: u16 = 15001;
    pub const ZTUNNEL_INBOUND_PLAINTEXT_PORT: u16 = 15006;
    /// HBONE: reaches ztunnel directly, never redirected.
    pub const ZTUNNEL_INBOUND_PORT: u16 = 15008;
    pub const DNS_CAPTURE_PORT: u16 = 15053;
    /// Where kubelet's probes appear to come from inside the pod (`HOST_PROBE_SNAT_IP`).
    pub const HOST_PROBE_SNAT_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
    /// `HOST_PROBE_SNAT_IPV6`.
    pub const HOST_PROBE_SNAT_V6: Ipv6Addr = Ipv6Addr::new(
        0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
    );
    /// The host's named sets of ambient pod IPs (Istio's `ProbeIPSet` + `-v4`/`-v6`).
    pub const PROBE_SET_V4: &str = "istio-inpod-probes-v4";
    pub const PROBE_SET_V6: &str = "istio-inpod-probes-v6";
}

use ambient_constants::*;

/// A pod's DNS capture setting (Istio's `PodDNSUnset/Enabled/Disabled`): the pod's
/// annotation overrides the node-wide `AMBIENT_DNS_CAPTURE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PodDns {
    #[default]
    Unset,
    Enabled,
    Disabled,
}

/// Everything that changes an ambient pod's in-pod rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmbientConfig {
    /// `AMBIENT_DNS_CAPTURE`: DNS to ztunnel's 15053 unless the pod says otherwise.
    pub redirect_dns: bool,
    /// `AMBIENT_IPV6`: IPv6 rules installed (else IPv6 traffic is left untouched).
    pub ipv6: bool,
    /// `HOST_PROBE_SNAT_IP`.
    pub host_probe_snat_v4: Ipv4Addr,
    /// `HOST_PROBE_SNAT_IPV6`.
    pub host_probe_snat_v6: Ipv6Addr,
    /// The pod's own settings.
    pub pod: AmbientPod,
}

/// Per-pod overrides (Istio's `PodOverrides`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AmbientPod {
    /// `ambient.istio.io/dns-capture`.
    pub dns: PodDns,
    /// `ambient.istio.io/bypass-inbound-capture`: inbound is not captured (ingress gateways).
    pub ingress_mode: bool,
    /// `istio.io/reroute-virtual-interfaces`: inbound TCP on these goes to ztunnel's outbound
    /// port (KubeVirt, VMs, DinD).
    pub virtual_interfaces: Vec<String>,
}

impl Default for AmbientConfig {
    fn default() -> Self {
        Self {
            redirect_dns: false,
            ipv6: false,
            host_probe_snat_v4: HOST_PROBE_SNAT_V4,
            host_probe_snat_v6: HOST_PROBE_SNAT_V6,
            pod: AmbientPod::default(),
        }
    }
}

/// Which local traffic to ambient pods is a kubelet probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeSource {
    /// Sockets of the kubelet's uid (Istio's nft mode: `meta skuid <kubelet uid>`).
    KubeletUid(u32),
    /// Any local socket (Istio's iptables mode: `-m owner --socket-exists`).
    AnyLocalSocket,
}

/// Where kubelet's probes appear to come from inside an ambient pod (Istio's
/// `HOST_PROBE_SNAT_IP` / `HOST_PROBE_SNAT_IPV6`): the host rule SNATs them to it and the
/// in-pod rules let it in, so both plans take the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSnat {
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl Default for ProbeSnat {
    fn default() -> Self {
        ProbeSnat {
            v4: HOST_PROBE_SNAT_V4,
            v6: HOST_PROBE_SNAT_V6,
        }
    }
}

impl ProbeSnat {
    /// Unicast addresses only; the error names the variable and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        snat_address_errors(self.v4, self.v6)
    }
}

/// The host rule's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProbeConfig {
    pub ipv6: bool,
    pub host_probe_snat_v4: Ipv4Addr,
    pub host_probe_snat_v6: Ipv6Addr,
    pub source: ProbeSource,
}

impl HostProbeConfig {
    /// Istio's SNAT addresses ([`HOST_PROBE_SNAT_V4`], [`HOST_PROBE_SNAT_V6`]).
    pub fn new(source: ProbeSource, ipv6: bool) -> Self {
        Self {
            ipv6,
            host_probe_snat_v4: HOST_PROBE_SNAT_V4,
            host_probe_snat_v6: HOST_PROBE_SNAT_V6,
            source,
        }
    }

    /// The host rule ([`Plan::ambient_host`]) for `source` with Istio's SNAT addresses
    /// (`HOST_PROBE_SNAT_IP` and `HOST_PROBE_SNAT_IPV6` left unset): those are unicast, so this
    /// one cannot fail.
    pub fn default_plan(source: ProbeSource, ipv6: bool) -> Plan {
        let cfg = Self::new(source, ipv6);
        debug_assert!(cfg.validate().is_ok(), "Istio's SNAT addresses are unicast");
        Plan::host_rules(&cfg)
    }
}

fn interface_name_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("an interface name cannot be empty")
    } else if name.len() >= 16 {
        Some("an interface name has at most 15 bytes")
    } else if name.contains(['/', ' ', '\t', '\n', ',', '"']) || name == "." || name == ".." {
        Some("not a valid interface name")
    } else {
        None
    }
}

fn snat_address_errors(v4: Ipv4Addr, v6: Ipv6Addr) -> Result<(), ConfigError> {
    if v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() {
        return Err(ConfigError::new(
            "HOST_PROBE_SNAT_IP",
            v4.to_string(),
            "must be a unicast address",
        ));
    }
    if v6.is_unspecified() || v6.is_multicast() {
        return Err(ConfigError::new(
            "HOST_PROBE_SNAT_IPV6",
            v6.to_string(),
            "must be a unicast address",
        ));
    }
    Ok(())
}

impl AmbientConfig {
    /// Checks every field; the error names the setting and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        snat_address_errors(self.host_probe_snat_v4, self.host_probe_snat_v6)?;
        for name in &self.pod.virtual_interfaces {
            if let Some(reason) = interface_name_error(name) {
                return Err(ConfigError::new(
                    "istio.io/reroute-virtual-interfaces",
                    name.clone(),
                    reason,
                ));
            }
        }
        Ok(())
    }

    /// DNS capture for this pod: the pod's setting, else the node's.
    pub fn dns_capture(&self) -> bool {
        match self.pod.dns {
            PodDns::Unset => self.redirect_dns,
            PodDns::Enabled => true,
            PodDns::Disabled => false,
        }
    }
}

impl HostProbeConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        snat_address_errors(self.host_probe_snat_v4, self.host_probe_snat_v6)
    }
}

struct Steps {
    steps: Vec<Step>,
    ipv6: bool,
}

impl Steps {
    /// One rule appended to `chain` of `table` (IPv6 rules dropped with IPv6 off, as
    /// Istio's `AppendV6RuleIfSupported`).
    fn add(&mut self, table: Table, chain: ChainId, rule: Rule) {
        self.at(table, chain, Position::Append, rule);
    }

    fn at(&mut self, table: Table, chain: ChainId, at: Position, rule: Rule) {
        if rule.family == Family::V6 && !self.ipv6 {
            return;
        }
        self.steps.push(Step(vec![PlacedRule {
            table,
            chain,
            at,
            rule,
        }]));
    }

    /// Several rules emitted together in one loop over the same values.
    fn group(&mut self, rules: Vec<PlacedRule>) {
        if rules
            .iter()
            .all(|r| r.rule.matches.iter().all(|m| m.alternatives() > 0))
        {
            self.steps.push(Step(rules));
        }
    }
}

fn rule(family: Family, matches: Vec<Match>, action: Action, comment: &str) -> Rule {
    Rule {
        family,
        matches,
        action,
        comment: comment.into(),
    }
}

fn jump(to: ChainId, comment: &str) -> Rule {
    rule(Family::Any, vec![], Action::Jump(to), comment)
}

/// Not ztunnel's own traffic.
fn not_ztunnel() -> Match {
    Match::MarkMasked {
        mark: INPOD_MARK,
        mask: INPOD_MASK,
        negate: true,
    }
}

fn ztunnel() -> Match {
    Match::MarkMasked {
        mark: INPOD_MARK,
        mask: INPOD_MASK,
        negate: false,
    }
}

fn loopback(v6: bool) -> IpNet {
    if v6 {
        IpNet::host(IpAddr::V6(Ipv6Addr::LOCALHOST))
    } else {
        IpNet::host(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}

fn not_to_loopback(v6: bool) -> Match {
    Match::Daddr {
        nets: vec![loopback(v6)],
        negate: true,
    }
}

fn family(v6: bool) -> Family {
    if v6 { Family::V6 } else { Family::V4 }
}

fn dport(port: u16, negate: bool) -> Match {
    Match::DstPort {
        ports: vec![port],
        negate,
    }
}

const TCP: Match = Match::Proto(L4::Tcp);
const UDP: Match = Match::Proto(L4::Udp);

impl Plan {
    /// The in-pod rules of an ambient pod (Istio's `AppendInpodRules`), in Istio's order.
    pub fn ambient(cfg: &AmbientConfig) -> Result<Plan, ConfigError> {
        cfg.validate()?;
        let dns = cfg.dns_capture();
        let mut s = Steps {
            steps: Vec::new(),
            ipv6: cfg.ipv6,
        };
        base_chain_jumps(&mut s, dns);
        virtual_interfaces(&mut s, &cfg.pod.virtual_interfaces);
        mark_ztunnel_connections(&mut s);
        probes_and_inbound(&mut s, cfg);
        restore_ztunnel_mark(&mut s);
        if dns {
            dns_to_ztunnel(&mut s);
        }
        outbound_to_ztunnel(&mut s);
        Ok(Plan {
            steps: s.steps,
            ipv6: cfg.ipv6,
            tproxy_routes: Some(TproxyRoutes {
                mark: INPOD_TPROXY_MARK,
                table: ROUTE_TABLE_INBOUND,
                ipv6: cfg.ipv6,
                mask: Some(INPOD_TPROXY_MASK),
                priority: Some(INPOD_MARK_RULE_PRIORITY),
            }),
            ipv6_passthrough_addr: false,
            warnings: Vec::new(),
            sets: Vec::new(),
        })
    }

    /// The host rule SNATing kubelet's probes to ambient pods (Istio's
    /// `CreateHostRulesForHealthChecks`) and the named sets of ambient pod IPs it looks up.
    pub fn ambient_host(cfg: &HostProbeConfig) -> Result<Plan, ConfigError> {
        cfg.validate()?;
        Ok(Plan::host_rules(cfg))
    }

    /// [`Plan::ambient_host`] for a config already validated.
    fn host_rules(cfg: &HostProbeConfig) -> Plan {
        let mut s = Steps {
            steps: Vec::new(),
            ipv6: cfg.ipv6,
        };
        s.at(
            AmbientNat,
            Postrouting,
            Position::Insert(1),
            jump(IstioPostrouting, "kubelet probes to ambient pods"),
        );
        let source = match cfg.source {
            ProbeSource::KubeletUid(uid) => Match::Uid {
                ids: vec![Id::numeric(uid)],
                negate: false,
            },
            ProbeSource::AnyLocalSocket => Match::SocketExists,
        };
        let mut sets = Vec::new();
        for v6 in [false, true] {
            if v6 && !cfg.ipv6 {
                continue;
            }
            let (set, to) = if v6 {
                (PROBE_SET_V6, IpAddr::V6(cfg.host_probe_snat_v6))
            } else {
                (PROBE_SET_V4, IpAddr::V4(cfg.host_probe_snat_v4))
            };
            s.add(
                AmbientNat,
                IstioPostrouting,
                rule(
                    family(v6),
                    vec![source.clone(), TCP, Match::DaddrInSet(set.into())],
                    Action::Snat(to),
                    "kubelet probe to an ambient pod: SNAT so ztunnel lets it through",
                ),
            );
            sets.push(NamedSet {
                table: AmbientNat,
                name: set.into(),
                v6,
                comment: "IPs of the ambient pods on this node".into(),
            });
        }
        Plan {
            steps: s.steps,
            ipv6: cfg.ipv6,
            tproxy_routes: None,
            ipv6_passthrough_addr: false,
            warnings: Vec::new(),
            sets,
        }
    }
}

/// Base chains jump to Istio's chains (raw only with DNS capture).
fn base_chain_jumps(s: &mut Steps, dns: bool) {
    s.add(
        AmbientMangle,
        Prerouting,
        jump(IstioPrerouting, "ambient inbound marks"),
    );
    s.add(
        AmbientMangle,
        Output,
        jump(IstioOutput, "ambient outbound marks"),
    );
    s.add(AmbientNat, Output, jump(IstioOutput, "ambient outbound"));
    if dns {
        s.add(
            AmbientRaw,
            Prerouting,
            jump(IstioPrerouting, "DNS conntrack zones"),
        );
        s.add(AmbientRaw, Output, jump(IstioOutput, "DNS conntrack zones"));
    }
    s.add(
        AmbientNat,
        Prerouting,
        jump(IstioPrerouting, "ambient inbound"),
    );
}

/// Inbound TCP on virtual interfaces is outbound traffic of the VM: straight to ztunnel's
/// outbound port, and nothing else applies to it.
fn virtual_interfaces(s: &mut Steps, ifaces: &[String]) {
    let on = || vec![Match::InIface(ifaces.to_vec()), TCP];
    let placed = |r: Rule| PlacedRule {
        table: AmbientNat,
        chain: IstioPrerouting,
        at: Position::Append,
        rule: r,
    };
    s.group(vec![
        placed(rule(
            Family::Any,
            on(),
            Action::Redirect {
                port: ZTUNNEL_OUTBOUND_PORT,
            },
            "virtual interface: inbound TCP is outbound, to ztunnel (15001)",
        )),
        placed(rule(
            Family::Any,
            on(),
            Action::Return,
            "virtual interface: nothing else applies",
        )),
    ]);
}

/// Packets of ztunnel's sockets mark their connection, so replies can be routed back to it.
fn mark_ztunnel_connections(s: &mut Steps) {
    s.add(
        AmbientMangle,
        IstioPrerouting,
        rule(
            Family::Any,
            vec![ztunnel()],
            Action::SetConnMarkMasked {
                value: INPOD_TPROXY_MARK,
                mask: INPOD_TPROXY_MASK,
            },
            "ztunnel's packet (mark 0x539): mark its connection 0x111",
        ),
    );
}

/// Kubelet probes (SNATed on the host to the probe address) pass untouched both ways; the
/// rest of inbound TCP goes to ztunnel's plaintext port, except HBONE (15008) and
/// ztunnel's own packets. Ingress mode captures no inbound.
fn probes_and_inbound(s: &mut Steps, cfg: &AmbientConfig) {
    let probe = |v6: bool| {
        if v6 {
            IpAddr::V6(cfg.host_probe_snat_v6)
        } else {
            IpAddr::V4(cfg.host_probe_snat_v4)
        }
    };
    let tcp_module = Match::L4Module(L4::Tcp);
    if !cfg.pod.ingress_mode {
        for v6 in [false, true] {
            s.add(
                AmbientNat,
                IstioPrerouting,
                rule(
                    family(v6),
                    vec![Match::FromAddr(probe(v6)), TCP, tcp_module.clone()],
                    Action::Accept,
                    "kubelet probe (SNATed on the host): not captured",
                ),
            );
        }
    }
    for v6 in [false, true] {
        s.add(
            AmbientNat,
            IstioOutput,
            rule(
                family(v6),
                vec![Match::ToAddr(probe(v6)), TCP, tcp_module.clone()],
                Action::Accept,
                "reply to a kubelet probe: not captured",
            ),
        );
    }
    if cfg.pod.ingress_mode {
        return;
    }
    for v6 in [false, true] {
        s.add(
            AmbientNat,
            IstioPrerouting,
            rule(
                family(v6),
                vec![
                    not_to_loopback(v6),
                    TCP,
                    dport(ZTUNNEL_INBOUND_PORT, true),
                    not_ztunnel(),
                ],
                Action::Redirect {
                    port: ZTUNNEL_INBOUND_PLAINTEXT_PORT,
                },
                "inbound TCP to ztunnel (15006); HBONE (15008) goes to ztunnel directly",
            ),
        );
    }
}

/// Replies of connections ztunnel accepted carry its mark again (policy routing sends
/// them back to ztunnel's transparent socket).
fn restore_ztunnel_mark(s: &mut Steps) {
    s.add(
        AmbientMangle,
        IstioOutput,
        rule(
            Family::Any,
            vec![Match::ConnMarkMasked {
                mark: INPOD_TPROXY_MARK,
                mask: INPOD_TPROXY_MASK,
            }],
            Action::RestoreMarkFullMasks,
            "connection marked 0x111: restore the packet mark",
        ),
    );
}

/// DNS (UDP not over lo, TCP not to localhost) to ztunnel's DNS proxy; ztunnel's own
/// queries upstream and their answers get conntrack zone 1 so they never collide with the
/// app's redirected ones (istio#33469).
fn dns_to_ztunnel(s: &mut Steps) {
    let to_dns = Action::Redirect {
        port: DNS_CAPTURE_PORT,
    };
    let udp_module = Match::L4Module(L4::Udp);
    s.add(
        AmbientNat,
        IstioOutput,
        rule(
            Family::Any,
            vec![
                Match::NotOutIface("lo".into()),
                UDP,
                not_ztunnel(),
                udp_module.clone(),
                dport(53, false),
            ],
            to_dns.clone(),
            "DNS over UDP to ztunnel (15053)",
        ),
    );
    for v6 in [false, true] {
        s.add(
            AmbientNat,
            IstioOutput,
            rule(
                family(v6),
                vec![not_to_loopback(v6), TCP, dport(53, false), not_ztunnel()],
                to_dns.clone(),
                "DNS over TCP to ztunnel (15053)",
            ),
        );
    }
    s.add(
        AmbientRaw,
        IstioOutput,
        rule(
            Family::Any,
            vec![UDP, ztunnel(), udp_module.clone(), dport(53, false)],
            Action::CtZone(1),
            "ztunnel's DNS query upstream: conntrack zone 1",
        ),
    );
    s.add(
        AmbientRaw,
        IstioPrerouting,
        rule(
            Family::Any,
            vec![UDP, not_ztunnel(), udp_module, Match::SrcPort(53)],
            Action::CtZone(1),
            "DNS answer from upstream: conntrack zone 1",
        ),
    );
}

/// Outbound: ztunnel's inbound replies pass, app-to-itself over lo passes, the rest of TCP
/// not to localhost and not from ztunnel goes to ztunnel's outbound port.
fn outbound_to_ztunnel(s: &mut Steps) {
    s.add(
        AmbientNat,
        IstioOutput,
        rule(
            Family::Any,
            vec![
                TCP,
                Match::MarkMasked {
                    mark: INPOD_TPROXY_MARK,
                    mask: INPOD_TPROXY_MASK,
                    negate: false,
                },
            ],
            Action::Accept,
            "reply of a connection ztunnel accepted (mark 0x111): not captured",
        ),
    );
    for v6 in [false, true] {
        s.add(
            AmbientNat,
            IstioOutput,
            rule(
                family(v6),
                vec![not_to_loopback(v6), Match::OutIface(vec!["lo".into()])],
                Action::Accept,
                "app to its own pod IP over lo: not captured",
            ),
        );
    }
    for v6 in [false, true] {
        s.add(
            AmbientNat,
            IstioOutput,
            rule(
                family(v6),
                vec![not_to_loopback(v6), TCP, not_ztunnel()],
                Action::Redirect {
                    port: ZTUNNEL_OUTBOUND_PORT,
                },
                "outbound TCP to ztunnel (15001)",
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Istio's SNAT addresses are valid: the plan needs no error, and is the checked one.
    #[test]
    fn the_default_host_plan_is_the_validated_one() {
        for source in [ProbeSource::KubeletUid(0), ProbeSource::AnyLocalSocket] {
            for ipv6 in [false, true] {
                let checked = Plan::ambient_host(&HostProbeConfig::new(source.clone(), ipv6));
                let default = HostProbeConfig::default_plan(source.clone(), ipv6);
                assert_eq!(default, checked.unwrap());
            }
        }
    }

    #[test]
    fn bad_values_name_the_field() {
        let mut cfg = AmbientConfig::default();
        cfg.pod.virtual_interfaces = vec!["way-too-long-interface".into()];
        let e = Plan::ambient(&cfg).unwrap_err();
        assert_eq!(e.field, "istio.io/reroute-virtual-interfaces");
        assert_eq!(e.value, "way-too-long-interface");
        let cfg = AmbientConfig {
            host_probe_snat_v4: Ipv4Addr::UNSPECIFIED,
            ..AmbientConfig::default()
        };
        assert_eq!(Plan::ambient(&cfg).unwrap_err().field, "HOST_PROBE_SNAT_IP");
        let host = HostProbeConfig {
            host_probe_snat_v6: Ipv6Addr::UNSPECIFIED,
            ..HostProbeConfig::new(ProbeSource::KubeletUid(0), true)
        };
        assert_eq!(
            Plan::ambient_host(&host).unwrap_err().field,
            "HOST_PROBE_SNAT_IPV6"
        );
    }

    #[test]
    fn pod_dns_setting_overrides_the_node() {
        let mut cfg = AmbientConfig {
            redirect_dns: true,
            ..AmbientConfig::default()
        };
        assert!(cfg.dns_capture());
        cfg.pod.dns = PodDns::Disabled;
        assert!(!cfg.dns_capture());
        cfg.redirect_dns = false;
        cfg.pod.dns = PodDns::Enabled;
        assert!(cfg.dns_capture());
        let tables = |c: &AmbientConfig| Plan::ambient(c).unwrap().tables();
        assert_eq!(tables(&cfg), Table::AMBIENT);
        cfg.pod.dns = PodDns::Unset;
        assert_eq!(tables(&cfg), [AmbientNat, AmbientMangle]);
    }

    #[test]
    fn plans_own_their_data_plane_tables() {
        let plan = Plan::ambient(&AmbientConfig::default()).unwrap();
        assert_eq!(plan.owned_tables(), Table::AMBIENT);
        let routes = plan.tproxy_routes.unwrap();
        assert_eq!((routes.mark, routes.mask), (0x111, Some(0xfff)));
        let host = HostProbeConfig::default_plan(ProbeSource::KubeletUid(7), true);
        assert_eq!(host.sets.len(), 2);
        assert_eq!(host.tables(), [AmbientNat]);
    }
}
