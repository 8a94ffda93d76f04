//! The node's enrollment report (`<cni_agent_run_dir>/status.sock`, `GET /status[?pod=NS/NAME]`):
//! every pod on the node, what it should get and why (`pod_policy`'s decision), what it has
//! (its live rules, and for ambient pods the agent's view), and a summary. The daemon builds it
//! from its pod cache, the reconciler's and the agent's per-pod state and the kernel;
//! `istio-nftables status` prints it, or builds a kernel-only one when the daemon is down.
//! The same summary is the daemon's `istio_cni_pods{mode,state}` gauge.
//!
//! Pure: the wire types, each pod's [`State`] from what was found ([`classify`]), the
//! [`Summary`]. Answers: 200 with a [`Report`]; 404 when `pod` is not on the node; 400 for a bad
//! query; 503 while the daemon's pod cache has not listed yet.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Socket file name inside the run dir (root only, as the other sockets there).
pub const STATUS_SOCKET: &str = "status.sock";
pub const STATUS_PATH: &str = "/status";

/// What the pod should get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Sidecar redirect rules in the pod (the plugin's ADD, kept by the reconciler).
    Sidecar,
    /// Ambient: in-pod rules, the pod's IPs in the host probe set, ztunnel serving it.
    Ambient,
    /// Nothing: the pod is left alone (the reason says why).
    None,
    /// Not known: no API (the daemon is down; the report was read from the kernel alone).
    Unknown,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::Ambient => "ambient",
            Mode::None => "none",
            Mode::Unknown => "unknown",
        }
    }
}

/// What the pod's network namespace holds, compared with what it should get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rules {
    /// The live rules match the pod's plan.
    Ok,
    /// Rules of ours are there but differ from the plan (see `drift`).
    Drifted,
    /// No rules of ours, though the pod should have them.
    Missing,
    /// Rules of ours on both backends (nft and iptables-legacy) at once.
    BothBackends,
    /// No rules of ours, and the pod should have none.
    None,
    /// Rules of ours in a pod that should have none.
    Leftover,
    /// Rules of ours (sidecar or ambient, see `backend`), not compared with a plan: no API.
    Present,
    /// Not read: no network namespace (not running yet, host network) or an error (`detail`).
    Unknown,
}

impl Rules {
    pub fn as_str(self) -> &'static str {
        match self {
            Rules::Ok => "ok",
            Rules::Drifted => "drifted",
            Rules::Missing => "missing",
            Rules::BothBackends => "both_backends",
            Rules::None => "none",
            Rules::Leftover => "leftover",
            Rules::Present => "present",
            Rules::Unknown => "unknown",
        }
    }
}

/// The pod's standing: the report's and the metric's `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Should be captured and is.
    Captured,
    /// Should be captured and is not (the alert's condition; `status` exits 1).
    NotCaptured,
    /// Should be captured, not running yet (no IP, or its namespace not found on the node).
    Pending,
    /// Should get nothing and has nothing.
    Skipped,
    /// Should get nothing but holds rules of ours.
    Leftover,
    /// Cannot tell (kernel-only report, or its rules could not be read).
    Unknown,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Captured => "captured",
            State::NotCaptured => "not_captured",
            State::Pending => "pending",
            State::Skipped => "skipped",
            State::Leftover => "leftover",
            State::Unknown => "unknown",
        }
    }
}

/// The ambient agent's view of an ambient pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmbientState {
    /// Enrolled: its rules programmed and ztunnel's Ack received (the agent serves it).
    pub acked: bool,
    /// All its IPs are in the host probe set (`None`: not read).
    pub in_probe_set: Option<bool>,
}

/// Where the report came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The node daemon (its pod cache: what each pod should get is known).
    Daemon,
    /// The kernel alone (the daemon was not reachable): network namespaces and their rules.
    Kernel,
}

/// One pod (or, kernel-only, one network namespace).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodEntry {
    /// Empty in a kernel-only report.
    pub namespace: String,
    pub name: String,
    /// The pod's UID (kernel-only: from its processes' cgroups, when they name one).
    pub uid: Option<String>,
    pub ips: Vec<IpAddr>,
    pub mode: Mode,
    /// Why it gets that (`pod_policy`'s reason).
    pub reason: String,
    /// The network namespace read (a `/proc/PID/ns/net` or `/var/run/netns` path).
    pub netns: Option<String>,
    pub rules: Rules,
    /// The backend holding its rules (`nft`, `iptables-legacy`, `both`).
    pub backend: Option<String>,
    /// How the live rules differ from the plan (`rules: drifted`).
    pub drift: Vec<String>,
    /// Ambient pods: the agent's view.
    pub ambient: Option<AmbientState>,
    /// When the daemon last programmed or repaired its rules (Unix seconds).
    pub last_programmed: Option<u64>,
    /// When the reconciler last checked them (Unix seconds).
    pub last_checked: Option<u64>,
    pub state: State,
    /// Why the rules could not be read, or what else there is to know.
    pub detail: Option<String>,
}

impl PodEntry {
    /// A pod (or namespace) of which nothing is known yet: the readers fill in what they find.
    pub fn unknown(namespace: String, name: String, uid: Option<String>) -> PodEntry {
        PodEntry {
            namespace,
            name,
            uid,
            ips: Vec::new(),
            mode: Mode::Unknown,
            reason: String::new(),
            netns: None,
            rules: Rules::Unknown,
            backend: None,
            drift: Vec::new(),
            ambient: None,
            last_programmed: None,
            last_checked: None,
            state: State::Unknown,
            detail: None,
        }
    }
}

/// Pods by `(mode, state)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub pods: usize,
    pub captured: usize,
    pub not_captured: usize,
    pub pending: usize,
    pub counts: Vec<Count>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub mode: Mode,
    pub state: State,
    pub pods: usize,
}

impl Summary {
    pub fn of(pods: &[PodEntry]) -> Summary {
        let mut by: std::collections::BTreeMap<(Mode, State), usize> = Default::default();
        for p in pods {
            *by.entry((p.mode, p.state)).or_default() += 1;
        }
        let total = |s: State| pods.iter().filter(|p| p.state == s).count();
        Summary {
            pods: pods.len(),
            captured: total(State::Captured),
            not_captured: total(State::NotCaptured),
            pending: total(State::Pending),
            counts: by
                .into_iter()
                .map(|((mode, state), pods)| Count { mode, state, pods })
                .collect(),
        }
    }

    /// Pods with this mode and state.
    pub fn count(&self, mode: Mode, state: State) -> usize {
        self.counts
            .iter()
            .find(|c| c.mode == mode && c.state == state)
            .map_or(0, |c| c.pods)
    }
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub source: Source,
    /// The node's name (the daemon's `NODE_NAME`; kernel-only: the host name).
    pub node: String,
    /// The node's backend for new rules (kernel-only: not known).
    pub node_backend: Option<String>,
    /// Whether the ambient agent runs (kernel-only: not known).
    pub ambient_enabled: Option<bool>,
    /// When the report was made (Unix seconds).
    pub generated: u64,
    pub pods: Vec<PodEntry>,
    pub summary: Summary,
    /// What the reader should know about the whole report (e.g. why modes are unknown).
    pub notes: Vec<String>,
}

/// The pod's [`State`] from what it should get and what was found. `acked`/`in_probe_set`:
/// the agent's view of an ambient pod; `running`: its namespace was found (else, without an
/// error, it has not started yet).
pub fn classify(mode: Mode, rules: Rules, ambient: Option<&AmbientState>, running: bool) -> State {
    match mode {
        Mode::Sidecar | Mode::Ambient if !running && rules == Rules::Unknown => State::Pending,
        Mode::Sidecar | Mode::Ambient => match rules {
            Rules::Unknown => State::Unknown,
            Rules::Ok if mode == Mode::Sidecar => State::Captured,
            Rules::Ok => match ambient {
                Some(a) if a.acked && a.in_probe_set != Some(false) => State::Captured,
                _ => State::NotCaptured,
            },
            _ => State::NotCaptured,
        },
        Mode::None => match rules {
            Rules::Leftover | Rules::BothBackends => State::Leftover,
            _ => State::Skipped,
        },
        Mode::Unknown => match rules {
            Rules::BothBackends => State::NotCaptured,
            _ => State::Unknown,
        },
    }
}

/// `GET /status` for the whole node, or for one pod.
pub fn path(pod: Option<(&str, &str)>) -> String {
    match pod {
        None => STATUS_PATH.to_string(),
        Some((ns, name)) => {
            let q = form_urlencoded::Serializer::new(String::new())
                .append_pair("pod", &format!("{ns}/{name}"))
                .finish();
            format!("{STATUS_PATH}?{q}")
        }
    }
}

/// A `GET /status` query the daemon cannot read (answered 400); each names the field and value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatusQueryError {
    #[error("pod {0:?}: expected NAMESPACE/NAME")]
    Pod(String),
    #[error("unknown field {0:?}")]
    UnknownField(String),
}

/// The pod a query asks for (`None`: every pod); the error names the field and value.
pub fn parse_query(query: &str) -> Result<Option<(String, String)>, StatusQueryError> {
    let mut pod = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "pod" => match v.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    pod = Some((ns.to_string(), name.to_string()))
                }
                _ => return Err(StatusQueryError::Pod(v.into_owned())),
            },
            other => return Err(StatusQueryError::UnknownField(other.into())),
        }
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mode: Mode, state: State) -> PodEntry {
        PodEntry {
            mode,
            rules: Rules::Ok,
            state,
            ..PodEntry::unknown("shop".into(), "web".into(), None)
        }
    }

    #[test]
    fn states_follow_what_the_pod_should_get_and_has() {
        use Mode as M;
        use Rules as R;
        use State as S;
        let acked = AmbientState {
            acked: true,
            in_probe_set: Some(true),
        };
        let unacked = AmbientState {
            acked: false,
            in_probe_set: Some(true),
        };
        let off_set = AmbientState {
            acked: true,
            in_probe_set: Some(false),
        };
        for (mode, rules, amb, running, want) in [
            (M::Sidecar, R::Ok, None, true, S::Captured),
            (M::Sidecar, R::Drifted, None, true, S::NotCaptured),
            (M::Sidecar, R::Missing, None, true, S::NotCaptured),
            (M::Sidecar, R::BothBackends, None, true, S::NotCaptured),
            (M::Sidecar, R::Unknown, None, false, S::Pending),
            (M::Sidecar, R::Unknown, None, true, S::Unknown),
            (M::Ambient, R::Ok, Some(&acked), true, S::Captured),
            (M::Ambient, R::Ok, Some(&unacked), true, S::NotCaptured),
            (M::Ambient, R::Ok, Some(&off_set), true, S::NotCaptured),
            (M::Ambient, R::Ok, None, true, S::NotCaptured),
            (M::Ambient, R::Missing, Some(&acked), true, S::NotCaptured),
            (M::None, R::None, None, true, S::Skipped),
            (M::None, R::Unknown, None, false, S::Skipped),
            (M::None, R::Leftover, None, true, S::Leftover),
            (M::Unknown, R::Present, None, true, S::Unknown),
            (M::Unknown, R::BothBackends, None, true, S::NotCaptured),
        ] {
            assert_eq!(
                classify(mode, rules, amb, running),
                want,
                "{mode:?} {rules:?} {amb:?} {running}"
            );
        }
    }

    #[test]
    fn the_summary_counts_by_mode_and_state() {
        let pods = [
            entry(Mode::Sidecar, State::Captured),
            entry(Mode::Sidecar, State::Captured),
            entry(Mode::Sidecar, State::NotCaptured),
            entry(Mode::Ambient, State::Pending),
            entry(Mode::None, State::Skipped),
        ];
        let s = Summary::of(&pods);
        assert_eq!(
            (s.pods, s.captured, s.not_captured, s.pending),
            (5, 2, 1, 1)
        );
        assert_eq!(s.count(Mode::Sidecar, State::Captured), 2);
        assert_eq!(s.count(Mode::Ambient, State::Captured), 0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["counts"][0]["mode"], "sidecar");
        assert_eq!(json["counts"][0]["state"], "captured");
    }

    #[test]
    fn queries_name_one_pod_or_none() {
        assert_eq!(parse_query("").unwrap(), None);
        let p = path(Some(("shop", "web-1")));
        assert_eq!(p, "/status?pod=shop%2Fweb-1");
        let q = p.split_once('?').unwrap().1;
        assert_eq!(
            parse_query(q).unwrap(),
            Some(("shop".into(), "web-1".into()))
        );
        for (bad, want) in [
            ("pod=web", "expected NAMESPACE/NAME"),
            ("pod=a/b/c", "expected NAMESPACE/NAME"),
            ("color=red", "unknown field"),
        ] {
            let e = parse_query(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
