//! istio-iptables' flags (tools/istio-iptables/pkg/cmd/root.go): same long and short names,
//! env vars and defaults; precedence flag > env > default. Values are kept as strings here and
//! parsed by `capture`'s parsers so that every error names the flag and the value.

use crate::validation::Probe;
use capture::{Config, ConfigError};
use clap::Parser;
use redirect::{Backend, BackendChoice};
use std::path::PathBuf;
use std::time::Duration;

// Boolean flags are `Option<String>`: `--flag`, `--flag=false`, or the env var with Go's
// ParseBool spellings, parsed by `flag_bool` so errors name the flag.
#[derive(Parser, Debug)]
#[command(
    name = "istio-nftables",
    args_override_self = true,
    version,
    about = "Program Istio's sidecar traffic redirect into a network namespace with nftables (one atomic netlink batch) or iptables-legacy.",
    long_about = "A drop-in for istio-iptables: the same flags, environment variables and defaults. \
                  Flags win over environment variables, which win over defaults. \
                  Without a command it programs (or checks, or removes) a namespace's rules \
                  from these flags."
)]
pub struct Args {
    /// Port Envoy captures outbound traffic on.
    #[arg(short = 'p', long = "envoy-port")]
    envoy_port: Option<String>,
    /// Port Envoy captures inbound traffic on.
    #[arg(
        short = 'z',
        long = "inbound-capture-port",
        env = "INBOUND_CAPTURE_PORT"
    )]
    inbound_capture_port: Option<String>,
    /// HBONE tunnel port; never redirected.
    #[arg(short = 'e', long = "inbound-tunnel-port", env = "INBOUND_TUNNEL_PORT")]
    inbound_tunnel_port: Option<String>,
    /// Envoy's user ids (comma list; names allowed). Default: uid of $ENVOY_USER, else 1337.
    #[arg(short = 'u', long = "proxy-uid", env = "PROXY_UID")]
    proxy_uid: Option<String>,
    /// Envoy's group ids (comma list; names allowed). Default: the proxy uid.
    #[arg(short = 'g', long = "proxy-gid", env = "PROXY_GID")]
    proxy_gid: Option<String>,
    /// Inbound interception mode: REDIRECT or TPROXY.
    #[arg(
        short = 'm',
        long = "istio-inbound-interception-mode",
        env = "ISTIO_INBOUND_INTERCEPTION_MODE"
    )]
    interception_mode: Option<String>,
    /// Inbound ports to capture: a list, '*' for all, empty for none.
    #[arg(short = 'b', long = "istio-inbound-ports", env = "ISTIO_INBOUND_PORTS")]
    inbound_ports: Option<String>,
    /// Inbound ports not captured when -b is '*'.
    #[arg(
        short = 'd',
        long = "istio-local-exclude-ports",
        env = "ISTIO_LOCAL_EXCLUDE_PORTS"
    )]
    inbound_exclude_ports: Option<String>,
    /// Interfaces on which nothing is captured.
    #[arg(
        short = 'c',
        long = "istio-exclude-interfaces",
        env = "ISTIO_EXCLUDE_INTERFACES"
    )]
    exclude_interfaces: Option<String>,
    /// Outbound destinations to capture: CIDR list, '*' for all, empty for none.
    #[arg(short = 'i', long = "istio-service-cidr", env = "ISTIO_SERVICE_CIDR")]
    service_cidr: Option<String>,
    /// Outbound destinations never captured (CIDR list).
    #[arg(
        short = 'x',
        long = "istio-service-exclude-cidr",
        env = "ISTIO_SERVICE_EXCLUDE_CIDR"
    )]
    service_exclude_cidr: Option<String>,
    /// TCP ports always redirected outbound.
    #[arg(
        short = 'q',
        long = "istio-outbound-ports",
        env = "ISTIO_OUTBOUND_PORTS"
    )]
    outbound_ports: Option<String>,
    /// TCP and UDP ports never redirected outbound.
    #[arg(
        short = 'o',
        long = "istio-local-outbound-ports-exclude",
        env = "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"
    )]
    outbound_exclude_ports: Option<String>,
    /// Interfaces whose inbound traffic is treated as outbound (KubeVirt).
    #[arg(
        short = 'k',
        long = "kube-virt-interfaces",
        env = "KUBE_VIRT_INTERFACES"
    )]
    kube_virt_interfaces: Option<String>,
    /// Mark for TPROXY'd inbound packets.
    #[arg(
        short = 't',
        long = "istio-inbound-tproxy-mark",
        env = "ISTIO_INBOUND_TPROXY_MARK"
    )]
    tproxy_mark: Option<String>,
    /// Routing table for TPROXY'd inbound packets.
    #[arg(
        short = 'r',
        long = "istio-inbound-tproxy-route-table",
        env = "ISTIO_INBOUND_TPROXY_ROUTE_TABLE"
    )]
    tproxy_route_table: Option<String>,
    /// Print the rules instead of programming them.
    #[arg(short = 'n', long = "dry-run", env = "DRY_RUN", num_args = 0..=1, default_missing_value = "true")]
    dry_run: Option<String>,
    /// Original port of the validation probe.
    #[arg(long = "iptables-probe-port", env = "IPTABLES_PROBE_PORT")]
    probe_port: Option<String>,
    /// Validation probe timeout (e.g. 5s, 500ms).
    #[arg(long = "probe-timeout", env = "PROBE_TIMEOUT")]
    probe_timeout: Option<String>,
    /// Do not program rules (use with --run-validation).
    #[arg(long = "skip-rule-apply", env = "SKIP_RULE_APPLY", num_args = 0..=1, default_missing_value = "true")]
    skip_rule_apply: Option<String>,
    /// Check that the redirect works with a probe connection.
    #[arg(long = "run-validation", env = "RUN_VALIDATION", num_args = 0..=1, default_missing_value = "true")]
    run_validation: Option<String>,
    /// Redirect DNS to istio-agent (env alias ISTIO_META_DNS_CAPTURE).
    #[arg(long = "redirect-dns", env = "REDIRECT_DNS", num_args = 0..=1, default_missing_value = "true")]
    redirect_dns: Option<String>,
    /// Capture DNS to every server, not only resolv.conf's.
    #[arg(long = "capture-all-dns", env = "CAPTURE_ALL_DNS", num_args = 0..=1, default_missing_value = "true")]
    capture_all_dns: Option<String>,
    /// Drop invalid packets (env alias INVALID_DROP).
    #[arg(long = "drop-invalid", env = "DROP_INVALID", num_args = 0..=1, default_missing_value = "true")]
    drop_invalid: Option<String>,
    /// Dual stack: any global IPv6 address turns IPv6 rules on (env alias ISTIO_DUAL_STACK).
    #[arg(long = "dual-stack", env = "DUAL_STACK", num_args = 0..=1, default_missing_value = "true")]
    dual_stack: Option<String>,
    /// Network namespace to program (path, e.g. /var/run/netns/pod or /proc/PID/ns/net).
    #[arg(long = "network-namespace", env = "NETWORK_NAMESPACE")]
    network_namespace: Option<String>,
    /// Allow --network-namespace to name this process's own (or the host's) namespace. Without
    /// it such a path is refused: it would redirect the node's traffic. Omitting
    /// --network-namespace always means the current namespace, as in istio-iptables.
    #[arg(long = "allow-current-namespace")]
    allow_current_namespace: bool,
    /// Accepted for compatibility (the pod-scoped lock is always used for iptables-legacy).
    #[arg(long = "cni-mode", env = "CNI_MODE", num_args = 0..=1, default_missing_value = "true")]
    cni_mode: Option<String>,
    /// Accepted for compatibility: applying always replaces our rules atomically.
    #[arg(long = "reconcile", env = "RECONCILE", num_args = 0..=1, default_missing_value = "true")]
    reconcile: Option<String>,
    /// Only remove our rules.
    #[arg(long = "cleanup-only", env = "CLEANUP_ONLY", num_args = 0..=1, default_missing_value = "true")]
    cleanup_only: Option<String>,
    /// Accepted for compatibility: applying always replaces our rules atomically.
    #[arg(long = "force-apply", env = "FORCE_APPLY", num_args = 0..=1, default_missing_value = "true")]
    force_apply: Option<String>,
    /// Istio's switch for nftables; same as --backend nft.
    #[arg(long = "native-nftables", env = "NATIVE_NFTABLES", num_args = 0..=1, default_missing_value = "true")]
    native_nftables: Option<String>,
    /// `legacy` selects iptables-legacy, `nft` nftables.
    #[arg(long = "force-iptables-binary", env = "FORCE_IPTABLES_BINARY")]
    force_iptables_binary: Option<String>,
    /// IPv6 rules: auto (detect from the namespace's addresses), on or off.
    #[arg(long = "ipv6", env = "ISTIO_IPV6")]
    ipv6: Option<String>,
    /// DNS servers to capture instead of the namespace's resolv.conf.
    #[arg(long = "dns-servers", env = "DNS_SERVERS")]
    dns_servers: Option<String>,
    /// auto (detect per namespace), nft or iptables-legacy.
    #[arg(long = "backend", env = "REDIRECT_BACKEND")]
    backend: Option<String>,
    /// Compare the live rules with the configuration; print differences, exit 1 on drift.
    #[arg(long = "check")]
    check: bool,
}

/// `--network-namespace`: a network namespace, and not ours or the host's unless allowed.
fn foreign_namespace(path: &str, allow_current: bool) -> Result<PathBuf, ConfigError> {
    use netns::ForeignError;
    match netns::ensure_foreign(std::path::Path::new(path)) {
        Ok(_) => Ok(PathBuf::from(path)),
        Err(ForeignError::Own { .. } | ForeignError::Host { .. }) if allow_current => {
            Ok(PathBuf::from(path))
        }
        Err(e) if e.is_missing() => Err(ConfigError::new(
            "--network-namespace",
            path,
            "no such file",
        )),
        Err(e @ (ForeignError::Own { .. } | ForeignError::Host { .. })) => Err(ConfigError::new(
            "--network-namespace",
            path,
            format!("{e}; pass --allow-current-namespace to program it anyway"),
        )),
        Err(e) => Err(ConfigError::new("--network-namespace", path, e.to_string())),
    }
}

/// Everything the CLI does, parsed and validated.
#[derive(Debug)]
pub struct Settings {
    pub config: Config,
    pub network_namespace: Option<PathBuf>,
    pub dry_run: bool,
    pub skip_rule_apply: bool,
    pub run_validation: bool,
    pub cleanup_only: bool,
    pub check: bool,
    pub backend: BackendChoice,
    pub validation: Probe,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn flag_bool(field: &str, v: &Option<String>, alias: Option<&str>) -> Result<bool, ConfigError> {
    match v.clone().or_else(|| alias.and_then(env)) {
        Some(s) => capture::parse_bool(field, &s),
        None => Ok(false),
    }
}

/// Go's `time.ParseDuration` for the forms people use: `5s`, `500ms`, `1m`, `1.5s`.
fn parse_duration(field: &str, v: &str) -> Result<Duration, ConfigError> {
    let v = v.trim();
    let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
    let n: f64 = num
        .parse()
        .map_err(|_| ConfigError::new(field, v, "expected a duration like 5s or 500ms"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => {
            return Err(ConfigError::new(
                field,
                v,
                "expected a duration like 5s or 500ms",
            ));
        }
    };
    if !(0.0..=3600.0).contains(&secs) {
        return Err(ConfigError::new(
            field,
            v,
            "expected a duration between 0 and 1h",
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Args {
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let config = self.capture_config()?;
        let backend = self.backend_choice()?;
        // Accepted for compatibility; validate their spelling all the same.
        flag_bool("--cni-mode", &self.cni_mode, None)?;
        flag_bool("--reconcile", &self.reconcile, None)?;
        flag_bool("--force-apply", &self.force_apply, None)?;
        let network_namespace = self
            .network_namespace
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| foreign_namespace(p, self.allow_current_namespace))
            .transpose()?;
        let validation = self.validation_probe(config.inbound_capture_port)?;
        Ok(Settings {
            config,
            network_namespace,
            dry_run: flag_bool("--dry-run", &self.dry_run, None)?,
            skip_rule_apply: flag_bool("--skip-rule-apply", &self.skip_rule_apply, None)?,
            run_validation: flag_bool("--run-validation", &self.run_validation, None)?,
            cleanup_only: flag_bool("--cleanup-only", &self.cleanup_only, None)?,
            check: self.check,
            backend,
            validation,
        })
    }

    /// `-u`/`-g` as text: the flags, else istio-iptables' defaults (the uid of `$ENVOY_USER`,
    /// istio-proxy, else 1337; the gid defaults to the uid).
    fn proxy_ids(&self, db: &capture::IdDb) -> (String, String) {
        let uid_text = match self.proxy_uid.as_deref() {
            Some(u) if !u.trim().is_empty() => u.to_string(),
            _ => {
                let user = env("ENVOY_USER").unwrap_or_else(|| "istio-proxy".into());
                db.lookup(capture::IdKind::User, &user)
                    .unwrap_or(1337)
                    .to_string()
            }
        };
        let gid_text = match self.proxy_gid.as_deref() {
            Some(g) if !g.trim().is_empty() => g.to_string(),
            _ => uid_text.clone(),
        };
        (uid_text, gid_text)
    }

    /// Every istio-iptables flag and environment variable as a validated capture `Config`.
    fn capture_config(&self) -> Result<capture::Config, ConfigError> {
        use capture::*;
        let db = IdDb::on_demand(|| {
            let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
            (read("/etc/passwd"), read("/etc/group"))
        });
        let d = Config::default();
        let or = |v: &Option<String>| v.clone().unwrap_or_default();
        let port = |flag: &str, v: &Option<String>, default: u16| -> Result<u16, ConfigError> {
            v.as_deref()
                .map(|v| parse_port(flag, v))
                .transpose()
                .map(|p| p.unwrap_or(default))
        };
        let mark = |flag: &str, v: &Option<String>, default: u32| -> Result<u32, ConfigError> {
            v.as_deref()
                .map(|v| parse_u32(flag, v))
                .transpose()
                .map(|m| m.unwrap_or(default))
        };
        let (uid_text, gid_text) = self.proxy_ids(&db);
        Ok(Config {
            proxy_port: port("--envoy-port", &self.envoy_port, d.proxy_port)?,
            inbound_capture_port: port(
                "--inbound-capture-port",
                &self.inbound_capture_port,
                d.inbound_capture_port,
            )?,
            inbound_tunnel_port: port(
                "--inbound-tunnel-port",
                &self.inbound_tunnel_port,
                d.inbound_tunnel_port,
            )?,
            proxy_uids: parse_id_list("--proxy-uid", &uid_text, IdKind::User, &db)?,
            proxy_gids: parse_id_list("--proxy-gid", &gid_text, IdKind::Group, &db)?,
            inbound_mode: parse_interception_mode(
                "--istio-inbound-interception-mode",
                &or(&self.interception_mode),
            )?,
            inbound_ports: parse_inbound_ports("--istio-inbound-ports", &or(&self.inbound_ports))?,
            inbound_ports_exclude: parse_port_list(
                "--istio-local-exclude-ports",
                &or(&self.inbound_exclude_ports),
            )?,
            exclude_interfaces: parse_interface_list(
                "--istio-exclude-interfaces",
                &or(&self.exclude_interfaces),
            )?,
            outbound_ranges: parse_outbound_ranges(
                "--istio-service-cidr",
                &or(&self.service_cidr),
            )?,
            outbound_ranges_exclude: parse_cidr_list(
                "--istio-service-exclude-cidr",
                &or(&self.service_exclude_cidr),
            )?,
            outbound_ports_include: parse_port_list(
                "--istio-outbound-ports",
                &or(&self.outbound_ports),
            )?,
            outbound_ports_exclude: parse_port_list(
                "--istio-local-outbound-ports-exclude",
                &or(&self.outbound_exclude_ports),
            )?,
            reroute_virtual_interfaces: parse_interface_list(
                "--kube-virt-interfaces",
                &or(&self.kube_virt_interfaces),
            )?,
            tproxy_mark: mark(
                "--istio-inbound-tproxy-mark",
                &self.tproxy_mark,
                d.tproxy_mark,
            )?,
            tproxy_route_table: mark(
                "--istio-inbound-tproxy-route-table",
                &self.tproxy_route_table,
                d.tproxy_route_table,
            )?,
            redirect_dns: flag_bool(
                "--redirect-dns",
                &self.redirect_dns,
                Some("ISTIO_META_DNS_CAPTURE"),
            )?,
            capture_all_dns: flag_bool("--capture-all-dns", &self.capture_all_dns, None)?,
            drop_invalid: flag_bool("--drop-invalid", &self.drop_invalid, Some("INVALID_DROP"))?,
            dual_stack: flag_bool("--dual-stack", &self.dual_stack, Some("ISTIO_DUAL_STACK"))?,
            owner_groups: parse_owner_groups(
                "ISTIO_OUTBOUND_OWNER_GROUPS",
                &env("ISTIO_OUTBOUND_OWNER_GROUPS").unwrap_or_else(|| "*".into()),
                "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
                &env("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE").unwrap_or_default(),
                &db,
            )?,
            host_ipv4_loopback: match env("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR") {
                Some(v) => parse_loopback_cidr("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", &v)?,
                None => d.host_ipv4_loopback,
            },
            ipv6: match self.ipv6.as_deref() {
                Some(v) => parse_ipv6_mode("--ipv6", v)?,
                None => Ipv6Mode::Auto,
            },
            dns_servers: self
                .dns_servers
                .as_deref()
                .map(|v| parse_ip_list("--dns-servers", v))
                .transpose()?,
        })
    }

    /// `--backend`, else `FORCE_IPTABLES_BINARY`, else `--native-nftables`, else auto.
    fn backend_choice(&self) -> Result<BackendChoice, ConfigError> {
        if let Some(b) = &self.backend {
            return b.parse().map_err(|e: redirect::UnknownBackend| {
                ConfigError::new("--backend", b, e.to_string())
            });
        }
        if let Some(f) = self
            .force_iptables_binary
            .as_deref()
            .filter(|f| !f.is_empty())
        {
            return match Backend::from_istio_binary(f) {
                Some(backend) => Ok(BackendChoice::Fixed(backend)),
                None => Err(ConfigError::new(
                    "--force-iptables-binary",
                    f,
                    "expected legacy or nft",
                )),
            };
        }
        Ok(
            if flag_bool("--native-nftables", &self.native_nftables, None)? {
                BackendChoice::Fixed(Backend::Nft)
            } else {
                BackendChoice::Auto
            },
        )
    }

    /// `--run-validation`'s probe (istio-iptables' defaults: port 15002, 5 s).
    fn validation_probe(&self, listen_port: u16) -> Result<Probe, ConfigError> {
        Ok(Probe {
            listen_port,
            probe_port: self
                .probe_port
                .as_deref()
                .map(|v| capture::parse_port("--iptables-probe-port", v))
                .transpose()?
                .unwrap_or(15002),
            timeout: self
                .probe_timeout
                .as_deref()
                .map(|v| parse_duration("--probe-timeout", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(5)),
        })
    }
}
