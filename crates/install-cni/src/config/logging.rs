//! Istio's logging flags (`istio.io/pkg/log` options, attached to install-cni's command by
//! `cni/pkg/cmd/root.go`), so Istio's DaemonSet args start this daemon: `--log_output_level`
//! (per-scope levels), `--log_as_json`, `--log_target`, `--log_caller`, `--log_stacktrace_level`,
//! and ControlZ's `--ctrlz_port` / `--ctrlz_address` (accepted, nothing served). Flags, as in
//! Istio; `--log_as_json` also reads `LOG_AS_JSON`, which our chart sets. Both `--flag=value` and `--flag value`
//! work, as with Go's pflag; a boolean takes its value only after `=`.
//!
//! Istio's scopes map onto our tracing filter: `default` (or a bare level) is the daemon's level
//! (`LOG_LEVEL`), `cni-agent` the daemon's own crates, `cni-plugin` the plugin's level (written
//! into its config, as Istio passes that scope's level down) and its lines relayed into this log,
//! `all` every one of them. Other scopes (Istio's libraries' `klog`, `grpc`, ..., or unknown
//! names) are accepted and ignored with a warning, as Istio ignores unknown scopes.

use super::{ConfigError, bad, parse_bool};
use clap::{ArgAction, Args};
use std::path::PathBuf;

#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Istio's per-scope levels: `<scope>:<level>,...` or a bare `<level>` (the default scope).
    /// Scopes: default (this daemon, as LOG_LEVEL), cni-agent (this daemon's own modules),
    /// cni-plugin (the plugin's level, as PLUGIN_LOG_LEVEL), all; others are ignored with a
    /// warning. Levels: debug, info, warn, error, fatal, none (and trace).
    #[arg(long = "log_output_level", value_name = "SCOPE:LEVEL,...")]
    pub log_output_level: Option<String>,

    /// Log lines as JSON objects instead of plain text (Istio's flag; `--log_as_json` alone
    /// means true). Our chart sets it as `LOG_AS_JSON` (`global.logAsJson`).
    #[arg(long = "log_as_json", env = "LOG_AS_JSON", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool,
          action = ArgAction::Set)]
    pub log_as_json: bool,

    /// Where the log goes: stdout, stderr or a file path (appended to); repeat for several
    /// (Istio's flag; without it: stderr).
    #[arg(long = "log_target", value_name = "TARGET", action = ArgAction::Append)]
    pub log_target: Vec<String>,

    /// Comma-separated scopes whose lines carry the source file and line (any of default,
    /// cni-agent, cni-plugin or all turns it on for the whole log).
    #[arg(long = "log_caller", value_name = "SCOPES", default_value = "")]
    pub log_caller: String,

    /// Istio's per-scope stack-trace levels: checked like --log_output_level, otherwise
    /// ignored (no stack traces are captured).
    #[arg(
        long = "log_stacktrace_level",
        value_name = "SCOPE:LEVEL,...",
        default_value = "default:none"
    )]
    pub log_stacktrace_level: String,

    /// Istio's ControlZ port: accepted and ignored (no ControlZ or pprof endpoint is served).
    #[arg(long = "ctrlz_port", value_name = "PORT")]
    pub ctrlz_port: Option<u16>,

    /// Istio's ControlZ address: accepted and ignored.
    #[arg(long = "ctrlz_address", value_name = "ADDRESS")]
    pub ctrlz_address: Option<String>,
}

/// Where log lines are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    Stderr,
    File(PathBuf),
}

/// The daemon's logging, resolved from LOG_LEVEL, PLUGIN_LOG_LEVEL and Istio's flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logging {
    /// A tracing `EnvFilter` directive string (e.g. `info,install_cni=debug`).
    pub filter: String,
    /// The plugin's level from the `cni-plugin` (or `all`) scope, in the plugin's words.
    pub plugin_level: Option<String>,
    pub json: bool,
    pub targets: Vec<LogTarget>,
    /// Source file and line on every line.
    pub caller: bool,
    /// What was accepted but ignored, for the log once it is set up.
    pub warnings: Vec<String>,
}

/// The daemon's own crates (tracing targets): Istio's `cni-agent` scope.
const AGENT_TARGETS: &[&str] = &[
    "install_cni",
    "cni_installer",
    "guardian",
    "ambient_agent",
    "node_view",
    "node_status",
    "redirect",
    "nft_backend",
    "iptables_legacy",
    "pod_routes",
    "netns",
    "zds",
    "uds_http",
    "node_fs",
    "pod_policy",
    "cni_config",
    "capture",
];

/// Istio's level names (`istio.io/pkg/log`), plus `trace`.
const LEVELS: &[&str] = &["debug", "info", "warn", "error", "fatal", "none", "trace"];

/// An Istio level as a tracing level (`none`: off; `fatal`: error).
fn tracing_level(l: &str) -> &str {
    match l {
        "none" => "off",
        "fatal" | "panic" => "error",
        other => other,
    }
}

/// Istio's `convertScopedLevel` over a comma list: (scope, level) pairs; a bare level is the
/// default scope's. Blank items are skipped.
fn scoped_levels(flag: &'static str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let pieces: Vec<&str> = item.split(':').collect();
        let (scope, level) = match pieces.as_slice() {
            [l] => ("default", *l),
            [s, l] => (*s, *l),
            _ => {
                return Err(bad(
                    flag,
                    text,
                    format!("{item:?}: expected <scope>:<level>"),
                ));
            }
        };
        if !LEVELS.contains(&level) {
            return Err(bad(
                flag,
                text,
                format!(
                    "{item:?}: level {level:?} is not one of {}",
                    LEVELS.join("|")
                ),
            ));
        }
        out.push((scope.to_string(), level.to_string()));
    }
    Ok(out)
}

fn ignored_scope(flag: &str, scope: &str) -> String {
    format!("{flag}: scope {scope:?} has no counterpart in this daemon; ignored")
}

/// `log_level`: LOG_LEVEL (the base, unless the default scope says otherwise).
pub fn settings(a: &LogArgs, log_level: &str) -> Result<Logging, ConfigError> {
    let mut warnings = Vec::new();
    let mut base = tracing_level(log_level).to_string();
    let mut agent: Option<String> = None;
    let mut plugin: Option<String> = None;
    let levels = scoped_levels(
        "--log_output_level",
        a.log_output_level.as_deref().unwrap_or(""),
    )?;
    for (scope, level) in levels {
        match scope.as_str() {
            "default" => base = tracing_level(&level).to_string(),
            "cni-agent" => agent = Some(level),
            "cni-plugin" => plugin = Some(level),
            "all" => {
                base = tracing_level(&level).to_string();
                agent = Some(level.clone());
                plugin = Some(level);
            }
            other => warnings.push(ignored_scope("--log_output_level", other)),
        }
    }
    if plugin.as_deref() == Some("trace") {
        return Err(bad(
            "--log_output_level",
            a.log_output_level.clone().unwrap_or_default(),
            "the cni-plugin scope's levels are debug|info|warn|error|fatal|none",
        ));
    }
    let mut filter = base;
    if let Some(l) = &agent {
        for t in AGENT_TARGETS {
            filter.push_str(&format!(",{t}={}", tracing_level(l)));
        }
    }
    if let Some(l) = &plugin {
        filter.push_str(&format!(
            ",{}={}",
            node_status::plugin_log::TARGET,
            tracing_level(l)
        ));
    }
    for (scope, level) in scoped_levels("--log_stacktrace_level", &a.log_stacktrace_level)? {
        if level != "none" {
            warnings.push(format!(
                "--log_stacktrace_level: {scope}:{level} ignored (no stack traces are captured)"
            ));
        }
    }
    let mut caller = false;
    for scope in a
        .log_caller
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match scope {
            "default" | "cni-agent" | "cni-plugin" | "all" => caller = true,
            other => warnings.push(ignored_scope("--log_caller", other)),
        }
    }
    if let Some(p) = a.ctrlz_port {
        warnings.push(format!("--ctrlz_port={p}: ControlZ is not served; ignored"));
    }
    if let Some(addr) = &a.ctrlz_address {
        warnings.push(format!(
            "--ctrlz_address={addr}: ControlZ is not served; ignored"
        ));
    }
    Ok(Logging {
        filter,
        plugin_level: plugin,
        json: a.log_as_json,
        targets: targets(&a.log_target)?,
        caller,
        warnings,
    })
}

fn targets(given: &[String]) -> Result<Vec<LogTarget>, ConfigError> {
    if given.is_empty() {
        return Ok(vec![LogTarget::Stderr]);
    }
    given
        .iter()
        .map(|t| match t.trim() {
            "stdout" => Ok(LogTarget::Stdout),
            "stderr" => Ok(LogTarget::Stderr),
            "" => Err(bad(
                "--log_target",
                t.as_str(),
                "expected stdout, stderr or a path",
            )),
            path => Ok(LogTarget::File(PathBuf::from(path))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    fn parse(args: &[&str]) -> Result<Logging, String> {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        let c = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        settings(&c.log, "info").map_err(|e| e.to_string())
    }

    #[test]
    fn istio_chart_args_and_both_flag_forms() {
        let l = parse(&["--log_output_level=info", "--log_as_json"]).unwrap();
        assert_eq!(l.filter, "info");
        assert!(l.json);
        assert_eq!(l.targets, [LogTarget::Stderr]);
        let l = parse(&[
            "--log_output_level",
            "default:warn,cni-agent:debug,cni-plugin:none",
        ])
        .unwrap();
        assert!(
            l.filter.starts_with("warn,install_cni=debug,"),
            "{}",
            l.filter
        );
        assert!(l.filter.ends_with(",istio_cni_plugin=off"), "{}", l.filter);
        assert_eq!(l.plugin_level.as_deref(), Some("none"));
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        let l = parse(&["--log_output_level=all:debug"]).unwrap();
        assert!(l.filter.starts_with("debug,"));
        assert_eq!(l.plugin_level.as_deref(), Some("debug"));
        assert!(!parse(&["--log_as_json=false"]).unwrap().json);
        assert!(parse(&["--log_as_json=maybe"]).is_err());
    }

    #[test]
    fn unknown_scopes_warn_bad_levels_fail() {
        let l = parse(&["--log_output_level=klog:debug,fancy:info,default:error"]).unwrap();
        assert_eq!(l.filter, "error");
        assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
        assert!(l.warnings[0].contains("klog"));
        for bad in ["default:chatty", "a:b:c", "verbose", "cni-plugin:trace"] {
            let e = parse(&[&format!("--log_output_level={bad}")]).unwrap_err();
            assert!(
                e.contains("--log_output_level") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        assert!(parse(&["--log_stacktrace_level=default:loud"]).is_err());
    }

    #[test]
    fn targets_caller_stacktrace_ctrlz() {
        let l = parse(&[
            "--log_target=stdout",
            "--log_target",
            "/tmp/x.log",
            "--log_caller=cni-agent",
            "--log_stacktrace_level=default:error",
            "--ctrlz_port",
            "9876",
            "--ctrlz_address=localhost",
        ])
        .unwrap();
        assert_eq!(
            l.targets,
            [LogTarget::Stdout, LogTarget::File("/tmp/x.log".into())]
        );
        assert!(l.caller);
        assert_eq!(l.warnings.len(), 3, "{:?}", l.warnings);
        assert!(!parse(&[]).unwrap().caller);
        assert!(parse(&["--ctrlz_port=70000"]).is_err());
    }
}
