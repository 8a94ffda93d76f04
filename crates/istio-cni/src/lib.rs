//! istio-cni: the CNI plugin kubelet runs last in a pod's chain (istio-reference §4). It looks
//! the pod up (the node daemon's cache, else the API server) and lets `pod_policy` decide: a
//! sidecar pod's redirect rules are programmed through `redirect`; an ambient pod is handed to
//! the node agent ([`agent`]: `pluginevent.sock`), which programs it and hands it to ztunnel;
//! any other pod passes through.
//!
//! The binary is a thin shell around [`run`]: the parsers and decisions are public so tests and
//! the fuzz targets can drive them without a process.

pub mod agent;
pub mod cni;
pub mod commands;
pub mod figures;
pub mod k8s;
pub mod logging;
pub mod node_cache;
pub mod settings;

use cni::{CniEnv, CniError, Command, ErrorCode, LATEST_VERSION};
use serde_json::Value;
use std::ffi::OsString;
use std::time::Instant;

/// What the process prints and how it exits.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub stdout: Option<Value>,
    pub exit_code: i32,
}

impl Outcome {
    fn ok(stdout: Option<Value>) -> Self {
        Self {
            stdout,
            exit_code: 0,
        }
    }

    pub fn error(e: &CniError, cni_version: &str) -> Self {
        Self {
            stdout: Some(e.to_json(cni_version)),
            exit_code: 1,
        }
    }
}

/// The most a network configuration on stdin may hold: the installer reads node configs up to
/// the same size; a runtime never sends more, and more would only cost memory.
pub const MAX_STDIN_BYTES: u64 = 64 << 20;

/// The network configuration from `stdin`, refused past [`MAX_STDIN_BYTES`] without reading on.
pub fn read_stdin(stdin: impl std::io::Read) -> Result<Vec<u8>, CniError> {
    use std::io::Read;
    let mut buf = Vec::new();
    stdin
        .take(MAX_STDIN_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CniError::new(ErrorCode::Io, format!("reading stdin: {e}")))?;
    if buf.len() as u64 > MAX_STDIN_BYTES {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!(
                "the network configuration on stdin is larger than {} MiB",
                MAX_STDIN_BYTES >> 20
            ),
        ));
    }
    Ok(buf)
}

/// The `cniVersion` to answer errors in: the request's when it has a usable one.
fn reply_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| cni::is_supported(v))
        .unwrap_or_else(|| LATEST_VERSION.to_string())
}

/// One plugin invocation: environment through `get_env`, the network configuration in `stdin`.
/// Installs logging (once per process) from the configuration.
pub fn run(get_env: impl Fn(&str) -> Option<OsString>, stdin: &[u8]) -> Outcome {
    let start = Instant::now();
    let version = reply_version(stdin);
    let command = match get_env("CNI_COMMAND")
        .unwrap_or_default()
        .to_string_lossy()
        .parse::<Command>()
    {
        Ok(c) => c,
        Err(e) => return Outcome::error(&e, &version),
    };
    if command == Command::Version {
        let requested = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string));
        return Outcome::ok(Some(cni::version_reply(requested.as_deref())));
    }
    let conf = match settings::parse_netconf(stdin) {
        Ok(c) => c,
        Err(e) => {
            logging::init("info", None, None);
            tracing::error!(command = command.as_str(), error = %e, "invalid network configuration");
            return Outcome::error(&e, &version);
        }
    };
    let notes = logging::init(
        &conf.settings.plugin_log_level,
        Some(&conf.settings.log_path()),
        Some(&conf.settings.log_socket()),
    );
    // Best effort here so that even the first lines carry the pod; the commands validate.
    let lossy = |name| {
        get_env(name)
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let container_id = loggable_container_id(&lossy("CNI_CONTAINERID"));
    let pod = settings::parse_cni_args(&lossy("CNI_ARGS")).unwrap_or_default();
    let span = logging::command_span(
        command.as_str(),
        &container_id,
        &pod.pod_namespace,
        &pod.pod_name,
    );
    let _entered = span.enter();
    for n in notes {
        tracing::warn!("{n}");
    }
    let result = cni::allows(command, &conf.cni_version)
        .and_then(|()| CniEnv::load(command, &get_env))
        .and_then(|env| match command {
            Command::Add => commands::add(&conf, &env).map(Some),
            Command::Del => commands::del(&conf, &env).map(|_| None),
            Command::Check => commands::check(&conf, &env).map(|_| None),
            Command::Status => commands::status(&conf).map(|_| None),
            Command::Gc => commands::gc(&conf).map(|_| None),
            Command::Version => unreachable!("handled above"),
        });
    let elapsed = start.elapsed();
    let elapsed_us = elapsed.as_micros() as u64;
    let peak_rss_kb = peak_rss_kb();
    // ADD's figures for the daemon's histograms: one non-blocking datagram, never waited for.
    let figures = (command == Command::Add).then(|| figures::for_add(result.is_ok(), elapsed));
    let (mode, lookup) = figures
        .as_ref()
        .map_or(("", ""), |f| (f.mode.as_str(), f.lookup_source.as_str()));
    let lookup_us = figures.as_ref().map_or(0, |f| f.lookup_us);
    let outcome = match result {
        Ok(out) => {
            tracing::info!(
                elapsed_us,
                peak_rss_kb,
                mode,
                lookup,
                lookup_us,
                "command succeeded"
            );
            Outcome::ok(out)
        }
        Err(e) => {
            tracing::error!(elapsed_us, peak_rss_kb, mode, lookup, lookup_us, code = e.code as u32, error = %e, details = %e.details, "command failed");
            Outcome::error(&e, &conf.cni_version)
        }
    };
    if let Some(f) = figures {
        figures::send(f);
    }
    outcome
}

/// The process's peak resident set (VmHWM), for the log line that ends each invocation.
/// The container ID as the log span carries it: as given when it is a valid CNI name, else
/// escaped and marked (the command then refuses it by name). A raw newline here was a forged
/// line in the daemon's log, which relays this span.
fn loggable_container_id(raw: &str) -> String {
    if raw.is_empty() || cni::is_cni_name(raw) {
        return raw.to_string();
    }
    format!("(invalid) {}", raw.escape_debug())
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The error a panic turns into (the caller prints it; a panic is always our bug).
pub fn panic_error(info: &str) -> CniError {
    CniError::new(ErrorCode::Internal, "istio-cni panicked (a bug)").with_details(info.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn stdin_past_the_cap_is_refused_without_reading_it_all() {
        let cap = super::MAX_STDIN_BYTES as usize;
        assert_eq!(super::read_stdin(&vec![b' '; cap][..]).unwrap().len(), cap);
        // An endless stream: refused after cap + 1 bytes.
        let e = super::read_stdin(std::io::repeat(b' ')).unwrap_err();
        assert_eq!(e.code, super::ErrorCode::InvalidConfig);
        assert!(e.msg.contains("64 MiB"), "{e}");
    }

    #[test]
    fn a_container_id_reaches_the_log_span_only_as_one_line_of_plain_text() {
        assert_eq!(super::loggable_container_id("c0ffee-1.x_y"), "c0ffee-1.x_y");
        let forged = super::loggable_container_id("c1\n2026-01-01 INFO forged\u{1b}[2J");
        assert!(!forged.chars().any(char::is_control), "{forged:?}");
        assert!(forged.starts_with("(invalid) c1\\n2026"), "{forged:?}");
    }
}
