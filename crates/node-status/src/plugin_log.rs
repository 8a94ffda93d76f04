//! `<run_dir>/log.sock`: the plugin's log lines ([`cni_config::log`]) printed in the daemon's
//! own log stream, so `kubectl logs` of the node agent shows what the plugin did for each pod
//! (Istio's `--log-uds-address`). Each datagram is one JSON line as the plugin wrote it; its
//! level, message, pod, container, command and other fields are kept. A line that is not the
//! plugin's JSON is printed as it came, marked so. The plugin's figures for each ADD
//! ([`cni_config::log::FiguresDatagram`]) come on the same socket: they become observations in
//! [`crate::figures`], outside the line budget, and are not printed.

use serde_json::{Map, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::net::UnixDatagram;

/// Lines relayed at once after a quiet spell (a node's burst of pod starts fits).
pub const LINE_BURST: usize = 1000;
/// Lines relayed per second beyond the burst; the rest are counted and the count reported.
pub const LINES_PER_SECOND: u32 = 200;

/// Target of the relayed lines (filter with `RUST_LOG`/`LOG_LEVEL` like any other).
pub const TARGET: &str = "istio_cni_plugin";

#[derive(Debug, thiserror::Error)]
#[error("plugin log socket {path}: {source}")]
pub struct RelayError {
    path: PathBuf,
    source: std::io::Error,
}

/// Binds the socket (root only; a stale one replaced, a planted file refused) and prints
/// what arrives, a server in `jobs`.
pub fn start(run_dir: &Path, jobs: &crate::jobs::Jobs) -> Result<(), RelayError> {
    let path = run_dir.join(cni_config::log::LOG_SOCKET);
    let err = |source| RelayError {
        path: path.clone(),
        source,
    };
    node_fs::prepare_socket(&path).map_err(err)?;
    let socket = UnixDatagram::bind(&path).map_err(err)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    tracing::info!(socket = %path.display(), "plugin log socket listening");
    jobs.spawn(
        "plugin log relay",
        crate::jobs::Stage::Server,
        relay(socket),
    );
    Ok(())
}

async fn relay(socket: UnixDatagram) {
    let mut buf = vec![0u8; cni_config::log::MAX_LINE + 1];
    let mut budget = Budget::new(Instant::now());
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => {
                if take_figures(&buf[..n]) {
                    continue;
                }
                let now = Instant::now();
                if let Some(dropped) = budget.report(now) {
                    tracing::warn!(
                        dropped,
                        per_second = LINES_PER_SECOND,
                        "plugin log relay: dropped lines over its budget (the plugin's file keeps its own)"
                    );
                }
                if budget.take(now) {
                    print(&Line::parse(&buf[..n]));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "plugin log socket: receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A datagram of the plugin's figures is observed (and not printed); anything else is a line.
pub fn take_figures(datagram: &[u8]) -> bool {
    if !datagram.starts_with(b"{\"figures\"") {
        return false;
    }
    match serde_json::from_slice::<cni_config::log::FiguresDatagram>(datagram) {
        Ok(d) => {
            crate::figures::global().observe_plugin_add(&d.figures);
            true
        }
        Err(_) => false,
    }
}

/// How many lines the relay may print: a bucket of [`LINE_BURST`] refilled at
/// [`LINES_PER_SECOND`], so a flood on the socket costs the daemon's log a bounded number of
/// lines; the refused ones are counted for the next report.
#[derive(Debug)]
pub struct Budget {
    tokens: f64,
    at: Instant,
    dropped: u64,
    reported: Instant,
}

impl Budget {
    pub fn new(now: Instant) -> Budget {
        Budget {
            tokens: LINE_BURST as f64,
            at: now,
            dropped: 0,
            reported: now,
        }
    }

    /// Whether a line arriving at `now` may be printed.
    pub fn take(&mut self, now: Instant) -> bool {
        let refill =
            now.saturating_duration_since(self.at).as_secs_f64() * f64::from(LINES_PER_SECOND);
        self.tokens = (self.tokens + refill).min(LINE_BURST as f64);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }

    /// The lines dropped since the last report, at most once a second.
    pub fn report(&mut self, now: Instant) -> Option<u64> {
        if self.dropped == 0
            || now.saturating_duration_since(self.reported) < Duration::from_secs(1)
        {
            return None;
        }
        self.reported = now;
        Some(std::mem::take(&mut self.dropped))
    }
}

/// One plugin line, taken apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Line {
    pub level: String,
    pub message: String,
    /// `namespace/name`, empty for commands without a pod.
    pub pod: String,
    pub container: String,
    pub command: String,
    /// The event's other fields, `key=value` separated by spaces.
    pub fields: String,
}

impl Line {
    pub fn parse(datagram: &[u8]) -> Line {
        let text = String::from_utf8_lossy(datagram);
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text.trim()) else {
            return Line {
                level: "WARN".into(),
                message: format!("(not the plugin's JSON) {}", escaped(text.trim())),
                ..Line::default()
            };
        };
        let span = innermost_span(&obj);
        let get = |m: &Map<String, Value>, k: &str| m.get(k).map(plain).unwrap_or_default();
        let mut fields = obj
            .get("fields")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let message = fields
            .remove("message")
            .map(|v| plain(&v))
            .unwrap_or_default();
        let pod = match (get(&span, "pod_namespace"), get(&span, "pod_name")) {
            (_, name) if name.is_empty() => String::new(),
            (ns, name) => format!("{ns}/{name}"),
        };
        Line {
            level: get(&obj, "level"),
            message,
            pod,
            container: get(&span, "container_id"),
            command: get(&span, "command"),
            fields: fields
                .iter()
                .map(|(k, v)| format!("{k}={}", plain(v)))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// The `cni` span's fields (the outermost span carries the pod).
fn innermost_span(obj: &Map<String, Value>) -> Map<String, Value> {
    obj.get("spans")
        .and_then(Value::as_array)
        .and_then(|s| s.first())
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// A field as one line of plain text: its control characters escaped (`\n`, `\u{1b}`), so
/// nothing a pod's spec, the runtime or the API server put into it (a newline in a container
/// ID, an ESC in a Status message) can start a forged line in the daemon's log or drive the
/// reader's terminal.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => escaped(s),
        other => escaped(&other.to_string()),
    }
}

fn escaped(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn print(l: &Line) {
    macro_rules! at {
        ($level:expr) => {
            tracing::event!(target: TARGET, $level, pod = %l.pod, container = %l.container, command = %l.command, fields = %l.fields, "plugin: {}", l.message)
        };
    }
    match l.level.as_str() {
        "ERROR" => at!(tracing::Level::ERROR),
        "WARN" => at!(tracing::Level::WARN),
        "DEBUG" => at!(tracing::Level::DEBUG),
        "TRACE" => at!(tracing::Level::TRACE),
        _ => at!(tracing::Level::INFO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_a_burst_then_its_rate_and_reports_the_rest_once_a_second() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let burst = (0..LINE_BURST * 3).filter(|_| b.take(t0)).count();
        assert_eq!(burst, LINE_BURST);
        assert_eq!(b.report(t0), None, "not before a second has passed");
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.report(t1), Some(2 * LINE_BURST as u64));
        assert_eq!(
            b.report(t1 + Duration::from_secs(5)),
            None,
            "nothing new dropped"
        );
        // One second refills LINES_PER_SECOND lines, never more than the burst.
        let refilled = (0..LINE_BURST).filter(|_| b.take(t1)).count();
        assert_eq!(refilled, LINES_PER_SECOND as usize);
        let later = t1 + Duration::from_secs(3600);
        assert_eq!(
            (0..LINE_BURST * 2).filter(|_| b.take(later)).count(),
            LINE_BURST
        );
    }

    #[test]
    fn control_characters_in_any_relayed_field_are_escaped_not_printed() {
        let forged = "x\n2026-01-01T00:00:00Z  INFO forged line\u{1b}[2J";
        let line = serde_json::json!({
            "level": "ERROR",
            "fields": {"message": forged, "error": forged, "code": 7},
            "spans": [{"command": forged, "container_id": forged, "pod_namespace": forged, "pod_name": forged}]
        })
        .to_string();
        let l = Line::parse(line.as_bytes());
        for (what, text) in [
            ("message", &l.message),
            ("pod", &l.pod),
            ("container", &l.container),
            ("command", &l.command),
            ("fields", &l.fields),
        ] {
            assert!(!text.chars().any(char::is_control), "{what}: {text:?}");
            assert!(
                text.contains("\\n2026") && text.contains("\\u{1b}[2J"),
                "{what}: {text:?}"
            );
        }
        let raw = Line::parse(b"not json\nforged\x1b[2J");
        assert!(
            !raw.message.chars().any(char::is_control),
            "{:?}",
            raw.message
        );
    }

    #[test]
    fn a_plugin_line_keeps_level_message_pod_and_fields() {
        let line = br#"{"timestamp":"t","level":"INFO","fields":{"message":"not in the mesh, no rules","reason":"no istio-proxy container"},"target":"istio_cni::commands","spans":[{"command":"ADD","container_id":"c1","pod_namespace":"default","pod_name":"web","name":"cni"}]}"#;
        let l = Line::parse(line);
        assert_eq!(l.level, "INFO");
        assert_eq!(l.message, "not in the mesh, no rules");
        assert_eq!(l.pod, "default/web");
        assert_eq!((l.container.as_str(), l.command.as_str()), ("c1", "ADD"));
        assert_eq!(l.fields, "reason=no istio-proxy container");
    }

    #[test]
    fn the_plugins_figures_are_observed_not_printed() {
        let f = crate::figures::global();
        let before = f.plugin_add.count(&["ambient", "failure"]);
        let failed = f.failures.get(&["handoff_failed"]);
        let d = cni_config::log::FiguresDatagram {
            figures: cni_config::log::AddFigures {
                mode: "ambient".into(),
                result: "failure".into(),
                reason: "handoff_failed".into(),
                elapsed_us: 5000,
                lookup_source: "api".into(),
                lookup_us: 2000,
            },
        };
        assert!(take_figures(&serde_json::to_vec(&d).unwrap()));
        assert_eq!(f.plugin_add.count(&["ambient", "failure"]), before + 1);
        assert_eq!(f.failures.get(&["handoff_failed"]), failed + 1);
        assert!(f.pod_lookup.count(&["api"]) >= 1);
        // A log line, or a broken figures datagram, is a line to print.
        assert!(!take_figures(
            br#"{"level":"INFO","fields":{"message":"x"}}"#
        ));
        assert!(!take_figures(br#"{"figures": 7}"#));
    }

    #[test]
    fn anything_else_is_printed_as_it_came() {
        let l = Line::parse(b"\xffgarbage{");
        assert_eq!(l.level, "WARN");
        assert!(l.message.contains("not the plugin's JSON"), "{l:?}");
        assert_eq!(Line::parse(b"{\"level\":\"ERROR\"}").pod, "");
    }
}
