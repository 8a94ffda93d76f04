//! The snapshot store: every pod the agent wants ztunnel to serve, with the netns fd to hand
//! over again on each new connection. Pure bookkeeping; the server sends what it returns.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::wire::{Request, WorkloadInfo};

/// A known pod.
#[derive(Clone, Debug)]
pub enum Entry {
    /// Served: its identity and its netns, held open so it can be sent again.
    Served {
        info: WorkloadInfo,
        netns: Arc<OwnedFd>,
    },
    /// Known to exist, but its netns was not found (e.g. after an agent restart): ztunnel is
    /// told to keep whatever it has for the pod (`KeepWorkload`).
    Kept,
}

/// uid -> entry; ordered so snapshots are deterministic.
#[derive(Clone, Debug, Default)]
pub struct Store {
    entries: BTreeMap<String, Entry>,
}

/// One message of a snapshot and the fd to send with it.
pub type Step = (Request, Option<Arc<OwnedFd>>);

impl Store {
    pub fn insert(&mut self, uid: String, entry: Entry) {
        self.entries.insert(uid, entry);
    }

    pub fn remove(&mut self, uid: &str) -> Option<Entry> {
        self.entries.remove(uid)
    }

    pub fn get(&self, uid: &str) -> Option<&Entry> {
        self.entries.get(uid)
    }

    pub fn uids(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What a new connection gets, in order: an `Add` (with its netns) or a `Keep` per known
    /// pod, then `SnapshotSent`, after which ztunnel drops every pod not named.
    pub fn snapshot(&self) -> Vec<Step> {
        let mut steps: Vec<Step> = self
            .entries
            .iter()
            .map(|(uid, entry)| match entry {
                Entry::Served { info, netns } => (
                    Request::Add {
                        uid: uid.clone(),
                        info: info.clone(),
                    },
                    Some(netns.clone()),
                ),
                Entry::Kept => (Request::Keep { uid: uid.clone() }, None),
            })
            .collect();
        steps.push((Request::SnapshotSent, None));
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> Arc<OwnedFd> {
        Arc::new(std::fs::File::open("/dev/null").unwrap().into())
    }

    fn info(name: &str) -> WorkloadInfo {
        WorkloadInfo {
            name: name.into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        }
    }

    #[test]
    fn empty_store_snapshot_is_just_snapshot_sent() {
        let steps = Store::default().snapshot();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].0, Request::SnapshotSent);
        assert!(steps[0].1.is_none());
    }

    #[test]
    fn snapshot_names_every_pod_once_in_uid_order_then_snapshot_sent() {
        let mut store = Store::default();
        let fd = devnull();
        store.insert(
            "uid-b".into(),
            Entry::Served {
                info: info("b"),
                netns: fd.clone(),
            },
        );
        store.insert("uid-a".into(), Entry::Kept);
        store.insert(
            "uid-c".into(),
            Entry::Served {
                info: info("c"),
                netns: fd.clone(),
            },
        );
        // Re-inserting replaces (a pod whose sandbox got a new netns).
        store.insert(
            "uid-b".into(),
            Entry::Served {
                info: info("b2"),
                netns: fd.clone(),
            },
        );
        let steps = store.snapshot();
        let reqs: Vec<_> = steps.iter().map(|(r, _)| r.clone()).collect();
        assert_eq!(
            reqs,
            [
                Request::Keep {
                    uid: "uid-a".into()
                },
                Request::Add {
                    uid: "uid-b".into(),
                    info: info("b2")
                },
                Request::Add {
                    uid: "uid-c".into(),
                    info: info("c")
                },
                Request::SnapshotSent,
            ]
        );
        // The fd goes exactly with the Adds.
        for (req, fd) in &steps {
            assert_eq!(req.carries_netns(), fd.is_some(), "{req:?}");
        }
    }

    #[test]
    fn removed_pod_is_not_in_the_next_snapshot() {
        let mut store = Store::default();
        store.insert("uid-a".into(), Entry::Kept);
        store.insert("uid-b".into(), Entry::Kept);
        assert!(store.remove("uid-a").is_some());
        assert!(store.remove("uid-a").is_none());
        assert_eq!(store.uids(), ["uid-b"]);
        assert_eq!(store.snapshot().len(), 2);
    }
}
