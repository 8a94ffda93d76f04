//! A backend that touches no kernel and records every call it gets, for unit tests of what
//! `redirect` asks of its backends and in which order. Several share one [`Journal`], so a
//! test sees the order across backends. Its "rules" are a flag: set by `apply`, cleared by
//! `cleanup` and `remove_plan`.

use super::RuleBackend;
use crate::{Backend, RedirectError, Scope};
use capture::{Plan, ProbeSource};
use netns::NsLock;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// One call a [`NullBackend`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Apply(Backend, Plan),
    Check(Backend, Plan),
    Cleanup(Backend, Scope),
    RemovePlan(Backend, Plan),
    HostEnsure(Backend, Plan),
    HostRemoveAll(Backend),
}

/// The calls of every backend sharing it, in order.
#[derive(Clone, Debug, Default)]
pub struct Journal(Arc<Mutex<Vec<Call>>>);

impl Journal {
    fn push(&self, call: Call) {
        self.0.lock().unwrap().push(call);
    }

    /// The calls so far, and forgets them.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// A recording stand-in for the backend of kind `kind`.
#[derive(Debug)]
pub struct NullBackend {
    pub kind: Backend,
    pub journal: Journal,
    /// Whether rules of ours are "there".
    pub ours: Mutex<bool>,
    /// [`RuleBackend::unsupported`]'s answer.
    pub unsupported: Option<String>,
    /// [`RuleBackend::claims`]'s answer.
    pub claims: Option<String>,
    /// What [`RuleBackend::check`] reports while rules are there.
    pub drift: Vec<String>,
    /// [`RuleBackend::apply`] fails (and changes nothing).
    pub refuse_apply: bool,
}

impl NullBackend {
    pub fn new(kind: Backend, journal: &Journal) -> NullBackend {
        NullBackend {
            kind,
            journal: journal.clone(),
            ours: Mutex::new(false),
            unsupported: None,
            claims: None,
            drift: Vec::new(),
            refuse_apply: false,
        }
    }

    /// Starts with rules of ours in place.
    pub fn holding_ours(self) -> NullBackend {
        *self.ours.lock().unwrap() = true;
        self
    }

    fn set_ours(&self, there: bool) {
        *self.ours.lock().unwrap() = there;
    }
}

impl RuleBackend for NullBackend {
    fn kind(&self) -> Backend {
        self.kind
    }

    fn unsupported(&self) -> Option<String> {
        self.unsupported.clone()
    }

    fn claims(&self) -> Option<String> {
        self.claims.clone()
    }

    fn apply(&self, plan: &Plan, _held: &NsLock) -> Result<(), RedirectError> {
        self.journal.push(Call::Apply(self.kind, plan.clone()));
        if self.refuse_apply {
            return Err(RedirectError::Drift(vec![format!("{} refused", self.kind)]));
        }
        self.set_ours(true);
        Ok(())
    }

    fn check(&self, plan: &Plan) -> Result<Vec<String>, RedirectError> {
        self.journal.push(Call::Check(self.kind, plan.clone()));
        Ok(match *self.ours.lock().unwrap() {
            true => self.drift.clone(),
            false => vec![format!("no {} rules", self.kind)],
        })
    }

    fn cleanup(&self, scope: Scope, _held: &NsLock) -> Result<(), RedirectError> {
        self.journal.push(Call::Cleanup(self.kind, scope));
        self.set_ours(false);
        Ok(())
    }

    fn remove_plan(&self, plan: &Plan, _held: &NsLock) -> Result<(), RedirectError> {
        self.journal.push(Call::RemovePlan(self.kind, plan.clone()));
        self.set_ours(false);
        Ok(())
    }

    fn has_ours(&self) -> Result<bool, RedirectError> {
        Ok(*self.ours.lock().unwrap())
    }

    fn dry_run(&self, _plan: &Plan) -> String {
        format!("{} dry run\n", self.kind)
    }

    fn probe_source(&self, _kubelet_uid: Option<u32>) -> ProbeSource {
        ProbeSource::AnyLocalSocket
    }

    fn host_describe(&self) -> &'static str {
        "nowhere"
    }

    fn host_ensure(&self, plan: &Plan) -> Result<(), RedirectError> {
        self.journal.push(Call::HostEnsure(self.kind, plan.clone()));
        Ok(())
    }

    fn host_add_pods_ips(&self, _: &Plan, _: &[(&str, &[IpAddr])]) -> Result<(), RedirectError> {
        Ok(())
    }

    fn host_pod_ips(&self, _: &Plan) -> Result<Vec<IpAddr>, RedirectError> {
        Ok(Vec::new())
    }

    fn host_sync_pods_ips(
        &self,
        _: &Plan,
        _: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError> {
        Ok(Vec::new())
    }

    fn host_remove_pod_ips(&self, _: &Plan, _: &[IpAddr]) -> Result<(), RedirectError> {
        Ok(())
    }

    fn host_check(&self, _: &Plan) -> Result<Vec<String>, RedirectError> {
        Ok(Vec::new())
    }

    fn host_remove_all(&self) -> Result<bool, RedirectError> {
        self.journal.push(Call::HostRemoveAll(self.kind));
        Ok(false)
    }
}
