//! The agent's book of the node, with no I/O: the pods it serves, the enrolls under way, the
//! pods the startup snapshot kept without their namespace, and the host probe rule's state.
//! Every decision that depends only on it (which addresses may leave the probe sets, when the
//! host rule goes) is made here and unit-tested below.

use super::AmbientPodRef;
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A pod ztunnel serves.
pub(super) struct Enrolled {
    pub pod: AmbientPodRef,
    /// Our own handle on the pod's namespace (ZDS holds another for snapshots).
    pub netns: Arc<OwnedFd>,
}

/// What a release finds for a pod.
pub(super) enum Taken {
    /// The pod was served: its entry.
    Served(Enrolled),
    /// The startup snapshot kept it without its namespace: its addresses.
    Kept(Vec<IpAddr>),
    /// The agent had nothing for it.
    Unknown,
}

#[derive(Default)]
pub(super) struct Book {
    pub pods: HashMap<String, Enrolled>,
    host_installed: bool,
    /// The last pod went but the host rule's removal failed (e.g. a foreign iptables rule
    /// still uses a probe set, which the kernel then refuses to destroy): each reconcile pass
    /// tries again while no pod needs the rule.
    host_removal_pending: bool,
    /// Enrolls between their host-rule check and their end, by UID, with the addresses they
    /// put in the probe sets: the host rule and those addresses stay for them.
    in_flight: HashMap<String, Vec<IpAddr>>,
    /// Ambient pods the startup snapshot kept for ztunnel without finding their namespace, by
    /// UID, with their addresses: these stay in the probe sets until the pod is enrolled or
    /// released.
    kept: HashMap<String, Vec<IpAddr>>,
    /// Startup discovery is over: the probe sets may be pruned to the pods above. Before it, a
    /// valid pod not yet adopted would lose its address.
    discovered: bool,
}

impl Book {
    /// Every address a served, enrolling or kept pod holds, with its pod's UID.
    pub fn held(&self) -> Vec<(String, Vec<IpAddr>)> {
        let served = self.pods.iter().map(|(uid, e)| (uid, &e.pod.ips));
        served
            .chain(self.in_flight.iter())
            .chain(self.kept.iter())
            .map(|(uid, ips)| (uid.clone(), ips.clone()))
            .collect()
    }

    pub fn host_installed(&self) -> bool {
        self.host_installed
    }

    /// The host rule was written.
    pub fn host_in(&mut self) {
        self.host_installed = true;
        self.host_removal_pending = false;
    }

    /// Whether the host rule must go now: it is in and no pod holds an address.
    pub fn host_idle(&self) -> bool {
        self.host_installed && self.held().is_empty()
    }

    /// The host rule's removal was tried (`removed`: it finished). Either way the rule is no
    /// longer ours to keep: a reconcile pass must not write it back for no pod, only finish
    /// its removal.
    pub fn host_out(&mut self, removed: bool) {
        self.host_installed = false;
        self.host_removal_pending = !removed;
    }

    /// Whether an earlier removal of the host rule is to be finished now.
    pub fn host_removal_due(&self) -> bool {
        !self.host_installed && self.host_removal_pending && self.held().is_empty()
    }

    /// Startup discovery is done: `kept` are the pods kept without their namespace.
    pub fn discovered(&mut self, kept: Vec<(String, Vec<IpAddr>)>) {
        self.kept.extend(kept);
        self.discovered = true;
    }

    /// Whether the probe sets may lose addresses no pod holds (startup discovery is over).
    pub fn may_prune(&self) -> bool {
        self.discovered
    }

    /// An enroll passed its host-rule check: its addresses are held until it ends.
    pub fn begin(&mut self, pod: &AmbientPodRef) {
        self.in_flight.insert(pod.uid.clone(), pod.ips.clone());
    }

    /// Records an enroll's outcome: a served pod enters the book (returning the entry it
    /// replaced, a former sandbox's); a failed one leaves it.
    pub fn finish(
        &mut self,
        pod: &AmbientPodRef,
        netns: &Arc<OwnedFd>,
        served: bool,
    ) -> Option<Enrolled> {
        self.in_flight.remove(&pod.uid);
        if !served {
            return self.pods.remove(&pod.uid);
        }
        self.kept.remove(&pod.uid);
        let entry = Enrolled {
            pod: pod.clone(),
            netns: netns.clone(),
        };
        self.pods.insert(pod.uid.clone(), entry)
    }

    /// A pod of the startup snapshot, served as found.
    pub fn adopt(&mut self, pod: AmbientPodRef, netns: OwnedFd) {
        let netns = Arc::new(netns);
        self.pods.insert(pod.uid.clone(), Enrolled { pod, netns });
    }

    /// Takes the pod out of the book for its release.
    pub fn take(&mut self, uid: &str) -> Taken {
        if let Some(e) = self.pods.remove(uid) {
            return Taken::Served(e);
        }
        match self.kept.remove(uid) {
            Some(ips) => Taken::Kept(ips),
            None => Taken::Unknown,
        }
    }

    /// Splits the addresses `uid` gives up into those another pod still holds (they stay: an
    /// address reused while the pod it came from was still enrolled, whose DEL was missed) and
    /// those that may leave the probe sets.
    pub fn removable(&self, uid: &str, ips: &[IpAddr]) -> (Vec<IpAddr>, Vec<IpAddr>) {
        let held: Vec<IpAddr> = self
            .held()
            .into_iter()
            .filter(|(u, _)| u.as_str() != uid)
            .flat_map(|(_, ips)| ips)
            .collect();
        ips.iter().copied().partition(|ip| held.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tests::{netns as fd, pod};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_another_pod_holds_never_leaves_the_probe_sets() {
        let mut book = Book::default();
        book.adopt(pod("old", &["10.0.0.5"]), fd());
        book.begin(&pod("new", &["10.0.0.5", "10.0.0.6"]));
        let (stay, go) = book.removable("new", &[ip("10.0.0.5"), ip("10.0.0.6")]);
        assert_eq!(stay, vec![ip("10.0.0.5")]);
        assert_eq!(go, vec![ip("10.0.0.6")]);
    }

    #[test]
    fn enrolls_under_way_and_kept_pods_hold_their_addresses_and_the_host_rule() {
        let mut book = Book::default();
        book.host_in();
        book.begin(&pod("a", &["10.0.0.1"]));
        book.discovered(vec![("k".into(), vec![ip("10.0.0.9")])]);
        let mut held: Vec<String> = book.held().into_iter().map(|(u, _)| u).collect();
        held.sort();
        assert_eq!(held, ["a", "k"]);
        assert!(!book.host_idle());
        let failed = book.finish(&pod("a", &["10.0.0.1"]), &Arc::new(fd()), false);
        assert!(failed.is_none());
        assert!(matches!(book.take("k"), Taken::Kept(ips) if ips == vec![ip("10.0.0.9")]));
        assert!(
            book.host_idle(),
            "no pod holds an address: the host rule goes"
        );
    }

    #[test]
    fn a_served_re_enroll_returns_the_former_sandbox_and_ends_a_kept_entry() {
        let mut book = Book::default();
        book.discovered(vec![("a".into(), vec![ip("10.0.0.1")])]);
        book.adopt(pod("a", &["10.0.0.1"]), fd());
        let again = pod("a", &["10.0.0.2"]);
        book.begin(&again);
        let old = book
            .finish(&again, &Arc::new(fd()), true)
            .expect("former entry");
        assert_eq!(old.pod.ips, vec![ip("10.0.0.1")]);
        assert!(matches!(book.take("a"), Taken::Served(e) if e.pod.ips == vec![ip("10.0.0.2")]));
        assert!(
            matches!(book.take("a"), Taken::Unknown),
            "kept entry ended with the enroll"
        );
    }

    #[test]
    fn a_failed_removal_of_the_host_rule_is_due_again_only_while_no_pod_needs_it() {
        let mut book = Book::default();
        book.host_in();
        book.host_out(false);
        assert!(book.host_removal_due());
        book.begin(&pod("a", &["10.0.0.1"]));
        assert!(!book.host_removal_due(), "a pod enrolling needs the rule");
        book.host_in();
        assert!(!book.host_removal_due(), "written again: nothing pending");
    }

    #[test]
    fn the_probe_sets_are_pruned_only_after_startup_discovery() {
        let mut book = Book::default();
        assert!(!book.may_prune());
        book.discovered(Vec::new());
        assert!(book.may_prune());
    }
}
