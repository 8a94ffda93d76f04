//! The plugin's log lines to the node daemon (`<cni_agent_run_dir>/log.sock`, Istio's
//! `--log-uds-address`): one JSON line per datagram, as the plugin writes it to its file. The
//! daemon prints them in its own log stream, so `kubectl logs` of the node agent shows what
//! the plugin decided for each pod. Best effort by design: a send that would block or fail is
//! dropped (the plugin's file keeps every line); a pod's ADD never waits for the daemon.

/// Socket file name inside the run dir (a datagram socket, root only).
pub const LOG_SOCKET: &str = "log.sock";
/// Longer lines are not sent (they stay in the file).
pub const MAX_LINE: usize = 32 * 1024;

/// A datagram that is not a log line but the plugin's figures for one ADD, for the daemon's
/// histograms (`{"figures": {...}}`, see [`AddFigures`]). Sent once per ADD on the same socket,
/// level or no level: the same one non-blocking send, dropped when the queue is full.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FiguresDatagram {
    pub figures: AddFigures,
}

/// One ADD as the plugin timed it. Every text is one of the constants below (the daemon ignores
/// any other value rather than creating a series).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AddFigures {
    /// One of [`MODES`].
    pub mode: String,
    /// One of [`RESULTS`].
    pub result: String,
    /// A failed ADD: one of [`PLUGIN_FAILURE_REASONS`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The whole invocation, from the process' start of `run` to its outcome.
    pub elapsed_us: u64,
    /// Who answered the pod lookup, one of [`LOOKUP_SOURCES`]; empty: no lookup answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lookup_source: String,
    /// The lookup as the plugin waited for it (a cache miss's time included in `api`).
    #[serde(default)]
    pub lookup_us: u64,
}

/// What the pod turned out to be: `sidecar` (rules programmed), `ambient` (handed to the node
/// agent), `none` (passed through: not in the mesh, excluded, not a pod), `unknown` (the ADD
/// failed before its pod was decided).
pub const MODES: [&str; 4] = ["sidecar", "ambient", "none", "unknown"];
pub const RESULTS: [&str; 2] = ["success", "failure"];
/// `cache`: the node daemon's pod cache (`pods.sock`); `api`: the API server.
pub const LOOKUP_SOURCES: [&str; 2] = ["cache", "api"];
/// The step a failed ADD failed at: the network configuration, CNI environment or previous
/// result (`config_failed`), opening CNI_NETNS (`netns_failed`), the pod lookup
/// (`lookup_failed`), deciding from an invalid pod spec (`decide_failed`), reading the pod's
/// addresses, building or programming its rules (`rules_failed`), the hand-off of an ambient pod
/// to the node agent (`handoff_failed`: the agent counts its own step beside it).
pub const PLUGIN_FAILURE_REASONS: [&str; 6] = [
    "config_failed",
    "netns_failed",
    "lookup_failed",
    "decide_failed",
    "rules_failed",
    "handoff_failed",
];
