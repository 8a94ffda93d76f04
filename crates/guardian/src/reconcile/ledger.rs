//! What the reconciler last found for each pod it keeps, for the node's enrollment report
//! (`istio-nftables status`): when it last checked the pod's rules, what the check found, and
//! when it last programmed or repaired them. Written by the reconcile loop after each check;
//! pods no longer reconciled are dropped.

use super::check::Outcome;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One pod's last check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The pod's UID when checked (a pod re-created under its name is another pod).
    pub uid: Option<String>,
    pub last_checked: SystemTime,
    /// The last check that (re)programmed the rules: repaired, migrated, or programmed on
    /// first sight in controller mode.
    pub last_programmed: Option<SystemTime>,
    /// `ok`, `repaired`, `migrated`, `repair_failed` or `failed`.
    pub outcome: &'static str,
    /// The drift found, or why the check or repair failed.
    pub detail: Vec<String>,
    /// The pod's namespace as found.
    pub netns: Option<PathBuf>,
}

/// Shared between the reconcile loop (writes) and the daemon's status server (reads).
#[derive(Clone, Debug, Default)]
pub struct Ledger(Arc<Mutex<HashMap<String, Record>>>);

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a finished check of `key` at `now`.
    pub fn record(
        &self,
        key: &str,
        uid: Option<String>,
        outcome: &Outcome,
        netns: Option<PathBuf>,
        now: SystemTime,
    ) {
        let (name, programmed, detail) = match outcome {
            Outcome::Ok => ("ok", false, Vec::new()),
            Outcome::Repaired { drift, .. } => ("repaired", true, drift.clone()),
            Outcome::Migrated { drift, .. } => ("migrated", true, drift.clone()),
            Outcome::RepairFailed { drift, error } => {
                let mut d = drift.clone();
                d.push(format!("re-applying failed: {error}"));
                ("repair_failed", false, d)
            }
            Outcome::Failed(e) => ("failed", false, vec![e.clone()]),
        };
        let mut g = self.lock();
        let previous = g
            .get(key)
            .filter(|r| r.uid == uid)
            .and_then(|r| r.last_programmed);
        g.insert(
            key.to_string(),
            Record {
                uid,
                last_checked: now,
                last_programmed: if programmed { Some(now) } else { previous },
                outcome: name,
                detail,
                netns,
            },
        );
    }

    /// The last check of `key` (`namespace/name`), if it was of the pod with `uid`.
    pub fn get(&self, key: &str, uid: Option<&str>) -> Option<Record> {
        self.lock()
            .get(key)
            .filter(|r| uid.is_none() || r.uid.as_deref() == uid)
            .cloned()
    }

    /// Keeps only the pods `keep` says are still reconciled.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_repair_is_remembered_until_the_pod_is_another() {
        let l = Ledger::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let repaired = Outcome::Repaired {
            drift: vec!["missing chain".into()],
            backend: redirect::Backend::Nft,
        };
        l.record("shop/web", Some("u1".into()), &repaired, None, t0);
        let t1 = t0 + Duration::from_secs(60);
        l.record("shop/web", Some("u1".into()), &Outcome::Ok, None, t1);
        let r = l.get("shop/web", Some("u1")).unwrap();
        assert_eq!(
            (r.outcome, r.last_checked, r.last_programmed),
            ("ok", t1, Some(t0))
        );
        assert!(l.get("shop/web", Some("u2")).is_none());
        l.record("shop/web", Some("u2".into()), &Outcome::Ok, None, t1);
        assert_eq!(l.get("shop/web", None).unwrap().last_programmed, None);
        l.retain(|k| k != "shop/web");
        assert!(l.get("shop/web", None).is_none());
    }
}
