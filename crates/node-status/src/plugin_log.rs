//! `<run_dir>/log.sock`: the plugin's log lines ([`cni_config::log`]) printed in the daemon's
//! own log stream, so `kubectl logs` of the node agent shows what the plugin did for each pod
//! (Istio's `--log-uds-address`). Each datagram is one JSON line as the plugin wrote it; its
//! level, message, pod, container, command and other fields are kept. A line that is not the
//! plugin's JSON is printed as it came, marked so.

use serde_json::{Map, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::net::UnixDatagram;

/// Target of the relayed lines (filter with `RUST_LOG`/`LOG_LEVEL` like any other).
pub const TARGET: &str = "istio_cni_plugin";

#[derive(Debug, thiserror::Error)]
#[error("plugin log socket {path}: {source}")]
pub struct RelayError {
    path: PathBuf,
    source: std::io::Error,
}

/// Binds the socket (root only; a stale one replaced, a planted file refused) and prints
/// what arrives until the runtime ends.
pub fn start(run_dir: &Path) -> Result<(), RelayError> {
    let path = run_dir.join(cni_config::log::LOG_SOCKET);
    let err = |source| RelayError {
        path: path.clone(),
        source,
    };
    node_fs::prepare_socket(&path).map_err(err)?;
    let socket = UnixDatagram::bind(&path).map_err(err)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    tracing::info!(socket = %path.display(), "plugin log socket listening");
    tokio::spawn(relay(socket));
    Ok(())
}

async fn relay(socket: UnixDatagram) {
    let mut buf = vec![0u8; cni_config::log::MAX_LINE + 1];
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => print(&Line::parse(&buf[..n])),
            Err(e) => {
                tracing::warn!(error = %e, "plugin log socket: receive failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
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
                message: format!("(not the plugin's JSON) {}", text.trim()),
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

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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
    fn anything_else_is_printed_as_it_came() {
        let l = Line::parse(b"\xffgarbage{");
        assert_eq!(l.level, "WARN");
        assert!(l.message.contains("not the plugin's JSON"), "{l:?}");
        assert_eq!(Line::parse(b"{\"level\":\"ERROR\"}").pod, "");
    }
}
