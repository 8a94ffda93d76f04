//! The plugin's log lines to the node daemon (`<cni_agent_run_dir>/log.sock`, Istio's
//! `--log-uds-address`): one JSON line per datagram, as the plugin writes it to its file. The
//! daemon prints them in its own log stream, so `kubectl logs` of the node agent shows what
//! the plugin decided for each pod. Best effort by design: a send that would block or fail is
//! dropped (the plugin's file keeps every line); a pod's ADD never waits for the daemon.

/// Socket file name inside the run dir (a datagram socket, root only).
pub const LOG_SOCKET: &str = "log.sock";
/// Longer lines are not sent (they stay in the file).
pub const MAX_LINE: usize = 32 * 1024;
