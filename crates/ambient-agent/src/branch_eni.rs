//! Istio's AWS branch ENI probe (`AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`, on by default) as the
//! agent runs it, Istio's `meshDataplane` part of it: when a pod's addresses go into the host
//! probe sets (enroll, startup adoption), each one aws-vpc-cni routes through a branch ENI
//! (Security Groups for Pods) gets Istio's two `ip rule`s in the node's namespace, and the
//! layout found is remembered; when its addresses leave the sets (release, a failed enroll
//! undone, a sandbox's old address) the rules go, from what was remembered (aws-vpc-cni may
//! have removed its own rule first, so detection would no longer find them). Only on nodes
//! with `net.ipv4.tcp_early_demux=0`, read once, in the node's namespace. Nothing here fails
//! an enroll: errors are logged as Istio logs them.

use redirect::RedirectError;
use redirect::branch_eni::BranchEni;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};

/// The kernel work, in the node's namespace (`redirect::branch_eni`); a stand-in in tests.
pub(crate) trait Kernel: Send + Sync {
    fn early_demux_disabled(&self) -> bool;
    fn detect(&self, ip: IpAddr) -> Result<Option<BranchEni>, RedirectError>;
    fn add(&self, ip: IpAddr, eni: &BranchEni) -> Result<(), RedirectError>;
    /// What failed (a rule already gone is not a failure).
    fn remove(&self, ip: IpAddr, eni: &BranchEni) -> Vec<String>;
}

struct Node;

impl Kernel for Node {
    fn early_demux_disabled(&self) -> bool {
        redirect::branch_eni::early_demux_disabled().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading net.ipv4.tcp_early_demux in the node's namespace failed, assuming default (enabled)");
            false
        })
    }

    fn detect(&self, ip: IpAddr) -> Result<Option<BranchEni>, RedirectError> {
        redirect::branch_eni::detect(ip)
    }

    fn add(&self, ip: IpAddr, eni: &BranchEni) -> Result<(), RedirectError> {
        redirect::branch_eni::add(ip, eni)
    }

    fn remove(&self, ip: IpAddr, eni: &BranchEni) -> Vec<String> {
        redirect::branch_eni::remove(ip, eni).unwrap_or_else(|e| vec![e.to_string()])
    }
}

/// The agent's branch ENI probe rules: the switch, the gate (read once, as Istio's
/// `sync.Once`), and the layouts rules were added for, by pod address.
pub struct BranchEniProbe {
    enabled: bool,
    kernel: Box<dyn Kernel>,
    gate: OnceLock<bool>,
    added: Mutex<HashMap<IpAddr, BranchEni>>,
}

impl std::fmt::Debug for BranchEniProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BranchEniProbe")
            .field("enabled", &self.enabled)
            .field("gate", &self.gate.get())
            .field("added", &self.added())
            .finish()
    }
}

impl BranchEniProbe {
    /// `enabled`: `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`.
    pub fn new(enabled: bool) -> BranchEniProbe {
        BranchEniProbe::with_kernel(enabled, Box::new(Node))
    }

    pub(crate) fn with_kernel(enabled: bool, kernel: Box<dyn Kernel>) -> BranchEniProbe {
        BranchEniProbe {
            enabled,
            kernel,
            gate: OnceLock::new(),
            added: Mutex::new(HashMap::new()),
        }
    }

    fn added_map(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, BranchEni>> {
        self.added.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The layouts rules were added for (pod address, its branch ENI).
    pub fn added(&self) -> Vec<(IpAddr, BranchEni)> {
        let mut v: Vec<_> = self.added_map().clone().into_iter().collect();
        v.sort_by_key(|(ip, _)| *ip);
        v
    }

    /// Istio's `tcpEarlyDemuxIsDisabled`: read once per agent, in the node's namespace.
    fn gate(&self) -> bool {
        *self.gate.get_or_init(|| {
            let disabled = self.kernel.early_demux_disabled();
            if disabled {
                tracing::info!(
                    "net.ipv4.tcp_early_demux=0; AWS branch ENI probe detection enabled"
                );
            } else {
                tracing::debug!(
                    "net.ipv4.tcp_early_demux=1 (default); AWS branch ENI probe detection skipped"
                );
            }
            disabled
        })
    }

    /// A pod's addresses went into the probe sets (Istio's `addPodToHostAddrSet`): each one
    /// routed through a branch ENI gets the rules. Blocking (netlink).
    pub fn add(&self, pod: &str, ips: &[IpAddr]) {
        if !self.enabled || ips.is_empty() || !self.gate() {
            return;
        }
        for &ip in ips {
            let eni = match self.kernel.detect(ip) {
                Ok(Some(eni)) => eni,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(%ip, error = %e, "branch ENI detection failed");
                    continue;
                }
            };
            tracing::debug!(%pod, %ip, veth = %eni.veth, table = eni.table, iif_priority = eni.iif_priority, "detected branch ENI pod");
            match self.kernel.add(ip, &eni) {
                Ok(()) => {
                    tracing::debug!(%pod, %ip, forward = %redirect::branch_eni::forward_rule(ip, &eni).describe(), ret = %redirect::branch_eni::return_rule(ip, &eni).describe(), "added branch ENI rules");
                    self.added_map().insert(ip, eni);
                }
                Err(e) => {
                    tracing::error!(%pod, %ip, error = %e, "failed to add branch ENI rules for pod")
                }
            }
        }
    }

    /// Addresses left the probe sets (Istio's `removePodFromHostAddrSet`): the rules added for
    /// them go, from the layout remembered. Blocking (netlink).
    pub fn remove(&self, ips: &[IpAddr]) {
        if !self.enabled {
            return;
        }
        for ip in ips {
            let Some(eni) = self.added_map().remove(ip) else {
                continue;
            };
            self.remove_one(*ip, &eni);
        }
    }

    /// Every rule this agent added goes (Istio's `flushBranchENIRules`, on shutdown when the
    /// node's rules are removed). Blocking (netlink).
    pub fn flush(&self) {
        let all = std::mem::take(&mut *self.added_map());
        for (ip, eni) in all {
            self.remove_one(ip, &eni);
        }
    }

    fn remove_one(&self, ip: IpAddr, eni: &BranchEni) {
        for e in self.kernel.remove(ip, eni) {
            tracing::debug!(%ip, veth = %eni.veth, error = %e, "failed to remove a branch ENI rule");
        }
        tracing::debug!(%ip, veth = %eni.veth, "removed branch ENI rules");
    }
}

#[cfg(test)]
mod tests;
