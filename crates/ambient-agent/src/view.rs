//! The agent as the node's enrollment report sees it (`istio-nftables status`): the running
//! [`Agent`] (its enrolled pods: rules programmed and ztunnel's Ack received; its host probe
//! rule), and when each pod was last programmed or repaired. One agent runs per daemon, so
//! this is one process-wide registry ([`AGENT`]): the agent publishes itself once started,
//! stamps a pod when it enrolls (the plugin's ADD or its own enroll: both end in
//! [`crate::annotate`]) or repairs it, and forgets pods it no longer serves.

use crate::agent::{Agent, AgentError, WorkerError};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// The daemon's one agent.
pub static AGENT: AgentView = AgentView {
    agent: OnceLock::new(),
    programmed: Mutex::new(None),
};

pub struct AgentView {
    agent: OnceLock<Arc<Agent>>,
    /// Last programmed or repaired, by pod UID.
    programmed: Mutex<Option<HashMap<String, SystemTime>>>,
}

/// Stamps kept at most (a bound: forgetting one only blanks its time in the report).
const MAX_STAMPS: usize = 16384;

impl AgentView {
    /// The agent, once it started (ZDS bound, startup discovery done).
    pub fn agent(&self) -> Option<Arc<Agent>> {
        self.agent.get().cloned()
    }

    pub(crate) fn publish(&self, agent: Arc<Agent>) {
        let _ = self.agent.set(agent);
    }

    fn stamps(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, SystemTime>>> {
        self.programmed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod's rules were programmed or repaired now.
    pub(crate) fn stamp(&self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        let mut g = self.stamps();
        let m = g.get_or_insert_with(HashMap::new);
        if m.len() >= MAX_STAMPS && !m.contains_key(uid) {
            m.clear();
        }
        m.insert(uid.to_string(), SystemTime::now());
    }

    /// Keeps the stamps of the pods `keep` says are still served.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        if let Some(m) = self.stamps().as_mut() {
            m.retain(|uid, _| keep(uid));
        }
    }

    /// When the pod with `uid` was last programmed or repaired by this agent.
    pub fn programmed(&self, uid: &str) -> Option<SystemTime> {
        self.stamps().as_ref().and_then(|m| m.get(uid).copied())
    }

    /// The enrolled pods' UIDs (served: ztunnel acknowledged them), with their addresses.
    pub async fn enrolled(&self) -> Option<Vec<(String, Vec<IpAddr>)>> {
        let agent = self.agent()?;
        let pods = agent.enrolled().await;
        Some(pods.into_iter().map(|(p, _)| (p.uid, p.ips)).collect())
    }

    /// The addresses in the host probe set (`None`: no agent yet). Blocking work runs off the
    /// async thread.
    pub async fn probe_ips(&self) -> Option<Result<Vec<IpAddr>, AgentError>> {
        let agent = self.agent()?;
        let read = tokio::task::spawn_blocking(move || {
            let s = agent.settings();
            s.host.pod_ips(&s.host_plan).map_err(AgentError::HostCheck)
        });
        Some(read.await.unwrap_or_else(|e| {
            Err(AgentError::Worker {
                what: "reading the host probe sets".into(),
                source: WorkerError::Join(e),
            })
        }))
    }
}
