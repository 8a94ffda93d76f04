//! Behavioural parity between the nft backend and the iptables-legacy backend (issue 3):
//! for each configuration, twin pod/world topologies get the same plan, one through each
//! backend, and the same connection matrix must land on the same port with the same
//! original destination in both.
//!
//! The legacy half always runs (and must apply cleanly). If the nft backend cannot apply a
//! plan, the test still runs every legacy matrix and then FAILS, listing the nft errors:
//! parity is never skipped silently.

use capture::{
    Config, Facts, Id, InboundPorts, InterceptionMode, Ipv6Mode, OutboundRanges, OwnerGroups, Plan,
};
use integration::*;
use redirect::{Backend, BackendChoice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Extra destinations behind the world (on its lo): one the "include/exclude CIDR" configs
/// exclude, one outside every include list.
const FAR_EXCLUDED_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const FAR_OTHER_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const FAR_EXCLUDED_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const FAR_OTHER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);

fn ids(v: &[u32]) -> Vec<Id> {
    v.iter().map(|&i| Id::numeric(i)).collect()
}

fn configs() -> Vec<(&'static str, Config)> {
    let base = Config::cni_default;
    let v4 = |c: Config| Config {
        ipv6: Ipv6Mode::Off,
        ..c
    };
    let dual = |c: Config| Config {
        ipv6: Ipv6Mode::On,
        ..c
    };
    let cidrs = |s: &[&str]| s.iter().map(|c| c.parse().unwrap()).collect::<Vec<_>>();
    vec![
        ("redirect-v4", v4(base())),
        ("redirect-dual", dual(base())),
        (
            "tproxy-v4",
            v4(Config {
                inbound_mode: InterceptionMode::Tproxy,
                ..base()
            }),
        ),
        (
            "tproxy-dual",
            dual(Config {
                inbound_mode: InterceptionMode::Tproxy,
                ..base()
            }),
        ),
        (
            "dns-v4",
            v4(Config {
                redirect_dns: true,
                capture_all_dns: true,
                ..base()
            }),
        ),
        (
            "dns-dual-uid-gid",
            dual(Config {
                redirect_dns: true,
                capture_all_dns: true,
                proxy_uids: ids(&[1337, 1500]),
                proxy_gids: ids(&[1337, 1600]),
                ..base()
            }),
        ),
        (
            "kube-virt-eth1",
            dual(Config {
                reroute_virtual_interfaces: vec!["eth1".into()],
                ..base()
            }),
        ),
        (
            "exclude-eth1",
            dual(Config {
                exclude_interfaces: vec!["eth1".into()],
                ..base()
            }),
        ),
        (
            "include-exclude-cidrs",
            dual(Config {
                outbound_ranges: OutboundRanges::List(cidrs(&[
                    "10.0.0.0/8",
                    "192.0.2.0/24",
                    "fd00::/16",
                    "2001:db8::/48",
                ])),
                outbound_ranges_exclude: cidrs(&["192.0.2.1/32", "2001:db8::1/128"]),
                ..base()
            }),
        ),
        (
            "ports-include-lists",
            v4(Config {
                inbound_ports: InboundPorts::List(vec![8080]),
                outbound_ranges: OutboundRanges::None,
                outbound_ports_include: vec![9999],
                ..base()
            }),
        ),
        (
            "ports-exclude-lists",
            dual(Config {
                inbound_ports_exclude: vec![15020, 15021, 15090, 8080],
                outbound_ports_exclude: vec![15020, 443, 53],
                ..base()
            }),
        ),
        (
            "uid-gid-lists",
            v4(Config {
                proxy_uids: ids(&[1337, 1500]),
                proxy_gids: ids(&[1337, 1600]),
                ..base()
            }),
        ),
        (
            "owner-groups-only",
            v4(Config {
                owner_groups: OwnerGroups::Only(ids(&[1700])),
                ..base()
            }),
        ),
        (
            "owner-groups-except",
            dual(Config {
                owner_groups: OwnerGroups::AllExcept(ids(&[1700])),
                ..base()
            }),
        ),
        (
            "drop-invalid-dual",
            dual(Config {
                drop_invalid: true,
                ..base()
            }),
        ),
        (
            "no-inbound-capture",
            dual(Config {
                inbound_ports: InboundPorts::None,
                ..base()
            }),
        ),
    ]
}

/// One pod/world pair with eth0 + eth1, probes everywhere and far destinations behind the world.
struct Twin {
    w: PodWorld,
    _probes: [Probe; 2],
}

impl Twin {
    fn new() -> Twin {
        let mut w = PodWorld::new().expect("pod/world");
        w.add_link("eth1").expect("eth1");
        w.world
            .sh(&format!(
                "ip addr add {FAR_EXCLUDED_V4}/32 dev lo && ip addr add {FAR_OTHER_V4}/32 dev lo && \
                 ip addr add {FAR_EXCLUDED_V6}/128 dev lo nodad && ip addr add {FAR_OTHER_V6}/128 dev lo nodad"
            ))
            .expect("far addresses");
        let probes = [
            Probe::sidecar(w.pod.path()).expect("pod probe"),
            Probe::world(w.world.path()).expect("world probe"),
        ];
        Twin { w, _probes: probes }
    }

    /// Replaces this twin's addresses by symbolic names, so both twins' results compare.
    fn normalize(&self, s: String) -> String {
        let w = &self.w;
        let mut pairs: Vec<(String, &str)> = vec![
            (w.pod_v4.to_string(), "POD4"),
            (w.world_v4.to_string(), "WORLD4"),
            (w.links[1].pod_v4.to_string(), "POD4_ETH1"),
            (w.links[1].world_v4.to_string(), "WORLD4_ETH1"),
        ];
        for (a, n) in [
            (w.pod_v6, "POD6"),
            (w.world_v6, "WORLD6"),
            (w.links[1].pod_v6, "POD6_ETH1"),
            (w.links[1].world_v6, "WORLD6_ETH1"),
        ] {
            if let Some(a) = a {
                pairs.push((a.to_string(), n));
            }
        }
        // Longest first, so 10.1.2.1 does not eat into 10.1.2.12.
        pairs.sort_by_key(|(a, _)| std::cmp::Reverse(a.len()));
        let mut out = s;
        for (a, n) in pairs {
            out = out.replace(&a, n);
        }
        out
    }
}

#[derive(Clone, Copy)]
enum Side {
    Pod,
    World,
}

#[derive(Clone, Copy)]
enum Proto {
    Tcp,
    Udp,
}

/// A connection of the matrix, described with addresses picked from the twin.
struct Case {
    name: String,
    from: Side,
    proto: Proto,
    spec: ConnectSpec,
}

fn matrix(t: &Twin, v6: bool) -> Vec<Case> {
    let w = &t.w;
    let (pod, world, pod1, lo, six, far_x, far_o): (
        IpAddr,
        IpAddr,
        IpAddr,
        IpAddr,
        IpAddr,
        IpAddr,
        IpAddr,
    ) = if v6 {
        (
            w.pod_v6.unwrap().into(),
            w.world_v6.unwrap().into(),
            w.links[1].pod_v6.unwrap().into(),
            Ipv6Addr::LOCALHOST.into(),
            "::6".parse().unwrap(),
            FAR_EXCLUDED_V6.into(),
            FAR_OTHER_V6.into(),
        )
    } else {
        (
            w.pod_v4.into(),
            w.world_v4.into(),
            w.links[1].pod_v4.into(),
            Ipv4Addr::LOCALHOST.into(),
            Ipv4Addr::new(127, 0, 0, 6).into(),
            FAR_EXCLUDED_V4.into(),
            FAR_OTHER_V4.into(),
        )
    };
    let mut m = Vec::new();
    let mut add = |name: &str, from: Side, proto: Proto, spec: ConnectSpec| {
        m.push(Case {
            name: name.to_string(),
            from,
            proto,
            spec,
        })
    };
    use Proto::*;
    use Side::*;
    // Outbound as the app (root), to several ports and destinations.
    for port in [80, 443, 9999, 15020] {
        add(
            &format!("app -> world:{port}"),
            Pod,
            Tcp,
            ConnectSpec::new(world, port),
        );
    }
    add(
        "app -> far excluded:80",
        Pod,
        Tcp,
        ConnectSpec::new(far_x, 80),
    );
    add("app -> far other:80", Pod, Tcp, ConnectSpec::new(far_o, 80));
    // Outbound as Envoy and the other ids the configs name.
    for (label, uid, gid) in [
        ("uid 1337", 1337, 1337),
        ("uid 1337 only", 1337, 1000),
        ("gid 1337 only", 1000, 1337),
        ("uid 1500", 1500, 1000),
        ("gid 1600", 1000, 1600),
        ("gid 1700", 1000, 1700),
        ("uid/gid 1000", 1000, 1000),
    ] {
        add(
            &format!("{label} -> world:80"),
            Pod,
            Tcp,
            ConnectSpec::new(world, 80).uid(uid).gid(gid),
        );
    }
    // Loopback and the inbound passthrough source.
    add("app -> lo:15021", Pod, Tcp, ConnectSpec::new(lo, 15021));
    add(
        "app -> own pod ip:8080",
        Pod,
        Tcp,
        ConnectSpec::new(pod, 8080),
    );
    add(
        "uid 1337 -> own pod ip:8080",
        Pod,
        Tcp,
        ConnectSpec::new(pod, 8080).uid(1337).gid(1337),
    );
    add(
        "uid 1337 -> lo:15021",
        Pod,
        Tcp,
        ConnectSpec::new(lo, 15021).uid(1337).gid(1337),
    );
    add(
        "src 127.0.0.6 -> own pod ip:8080",
        Pod,
        Tcp,
        ConnectSpec::new(pod, 8080).src(six),
    );
    if !v6 {
        add(
            "validation 127.0.0.1 -> 127.0.0.6:15002 as 1337",
            Pod,
            Tcp,
            ConnectSpec::new(six, 15002).uid(1337).gid(1337).src(lo),
        );
    }
    // DNS.
    add("app udp -> world:53", Pod, Udp, ConnectSpec::new(world, 53));
    add(
        "uid 1337 udp -> world:53",
        Pod,
        Udp,
        ConnectSpec::new(world, 53).uid(1337).gid(1337),
    );
    add("app tcp -> world:53", Pod, Tcp, ConnectSpec::new(world, 53));
    add(
        "uid 1337 tcp -> world:53",
        Pod,
        Tcp,
        ConnectSpec::new(world, 53).uid(1337).gid(1337),
    );
    // Inbound.
    for port in [8080, 15001, 15008, 15020, 15021, 15090] {
        add(
            &format!("world -> pod:{port}"),
            World,
            Tcp,
            ConnectSpec::new(pod, port),
        );
    }
    add(
        "world -> pod eth1:8080",
        World,
        Tcp,
        ConnectSpec::new(pod1, 8080),
    );
    add(
        "world -> pod eth1:15021",
        World,
        Tcp,
        ConnectSpec::new(pod1, 15021),
    );
    m
}

fn run_matrix(t: &Twin, v6: bool) -> Vec<(String, String)> {
    matrix(t, v6)
        .into_iter()
        .map(|c| {
            let ns = match c.from {
                Side::Pod => t.w.pod.path(),
                Side::World => t.w.world.path(),
            };
            let out = match c.proto {
                Proto::Tcp => connect(ns, &c.spec),
                Proto::Udp => send_udp(ns, &c.spec),
            };
            let family = if v6 { "v6" } else { "v4" };
            (
                format!("[{family}] {}", c.name),
                t.normalize(out.to_string()),
            )
        })
        .collect()
}

fn apply(t: &Twin, plan: &Plan, backend: Backend) -> Result<(), String> {
    redirect::apply(plan, Some(t.w.pod.path()), BackendChoice::Fixed(backend))
        .map(drop)
        .map_err(|e| e.to_string())
}

fn check_config(name: &str, cfg: &Config) -> Result<(), String> {
    let plan = Plan::build(cfg, &Facts::default()).map_err(|e| e.to_string())?;
    let (legacy, nft) = std::thread::scope(|s| {
        let a = s.spawn(Twin::new);
        let b = s.spawn(Twin::new);
        (a.join().unwrap(), b.join().unwrap())
    });
    apply(&legacy, &plan, Backend::IptablesLegacy)
        .unwrap_or_else(|e| panic!("{name}: the legacy backend failed to apply: {e}"));
    let nft_result = apply(&nft, &plan, Backend::Nft);
    let families: &[bool] = if plan.ipv6 { &[false, true] } else { &[false] };
    let mut diffs = Vec::new();
    for &v6 in families {
        let l = run_matrix(&legacy, v6);
        if name == "redirect-v4" && !v6 {
            // Guard against "parity" of two broken setups.
            let get = |k: &str| {
                l.iter()
                    .find(|(n, _)| n.ends_with(k))
                    .map(|(_, o)| o.as_str())
            };
            assert_eq!(
                get("] app -> world:80"),
                Some("landed on pod:15001 (orig WORLD4:80)")
            );
            assert_eq!(
                get("] world -> pod:8080"),
                Some("landed on pod:15006 (orig POD4:8080)")
            );
            assert_eq!(
                get("] validation 127.0.0.1 -> 127.0.0.6:15002 as 1337"),
                Some("landed on pod:15006 (orig 127.0.0.6:15002)")
            );
        }
        if nft_result.is_err() {
            continue;
        }
        let n = run_matrix(&nft, v6);
        for ((case, lo), (_, no)) in l.iter().zip(&n) {
            if lo != no {
                diffs.push(format!("  {case}: legacy {lo} | nft {no}"));
            }
        }
    }
    nft_result.map_err(|e| format!("{name}: the nft backend failed to apply: {e}"))?;
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}: backends disagree:\n{}", diffs.join("\n")))
    }
}

#[test]
fn nft_and_legacy_land_connections_identically() {
    require_root();
    let configs = configs();
    assert!(configs.len() >= 12);
    // Configurations in parallel (each creates 4 namespaces), bounded by the 2 cores.
    let failures: Vec<String> = std::thread::scope(|s| {
        let chunks: Vec<_> = configs.chunks(configs.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|(name, cfg)| check_config(name, cfg).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("config thread"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} configurations failed:\n{}",
        failures.len(),
        configs.len(),
        failures.join("\n")
    );
}
