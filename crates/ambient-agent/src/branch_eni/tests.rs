use super::*;
use std::sync::Arc;

/// A node as the kernel stand-in sees it: the gate, the branch ENI layouts aws-vpc-cni has
/// (by address), whether adding fails; every call recorded.
#[derive(Default)]
struct Fake {
    early_demux_off: bool,
    layouts: Mutex<HashMap<IpAddr, BranchEni>>,
    add_fails: bool,
    calls: Mutex<Vec<String>>,
}

impl Fake {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl Kernel for Arc<Fake> {
    fn early_demux_disabled(&self) -> bool {
        self.record("gate".into());
        self.early_demux_off
    }

    fn detect(&self, ip: IpAddr) -> Result<Option<BranchEni>, RedirectError> {
        self.record(format!("detect {ip}"));
        Ok(self.layouts.lock().unwrap().get(&ip).cloned())
    }

    fn add(&self, ip: IpAddr, eni: &BranchEni) -> Result<(), RedirectError> {
        self.record(format!("add {ip} {} {}", eni.veth, eni.table));
        if self.add_fails {
            return Err(RedirectError::Drift(vec!["EPERM".into()]));
        }
        Ok(())
    }

    fn remove(&self, ip: IpAddr, eni: &BranchEni) -> Vec<String> {
        self.record(format!("remove {ip} {} {}", eni.veth, eni.table));
        Vec::new()
    }
}

const BRANCH: &str = "10.0.5.7";
const REGULAR: &str = "10.0.5.9";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn eni() -> BranchEni {
    BranchEni {
        table: 101,
        veth: "vlan8c1f0a5e7b2".into(),
        iif_priority: 10,
    }
}

/// An SGP node (tcp_early_demux=0) with one branch ENI pod address.
fn sgp_node() -> Arc<Fake> {
    let fake = Fake {
        early_demux_off: true,
        ..Fake::default()
    };
    fake.layouts.lock().unwrap().insert(ip(BRANCH), eni());
    Arc::new(fake)
}

#[test]
fn enroll_adds_the_rules_for_branch_eni_addresses_and_release_removes_what_was_remembered() {
    let node = sgp_node();
    let probe = BranchEniProbe::with_kernel(true, Box::new(node.clone()));
    probe.add("default/app", &[ip(BRANCH), ip(REGULAR)]);
    assert_eq!(
        node.calls(),
        [
            "gate",
            "detect 10.0.5.7",
            "add 10.0.5.7 vlan8c1f0a5e7b2 101",
            "detect 10.0.5.9"
        ]
    );
    assert_eq!(probe.added(), [(ip(BRANCH), eni())]);
    // Enrolled again (a re-ADD): detected and added again (the kernel keeps one of each),
    // the gate not read again.
    probe.add("default/app", &[ip(BRANCH)]);
    assert_eq!(
        node.calls(),
        ["detect 10.0.5.7", "add 10.0.5.7 vlan8c1f0a5e7b2 101"]
    );
    // aws-vpc-cni tore its layout down first: the remembered one is removed all the same.
    node.layouts.lock().unwrap().clear();
    probe.remove(&[ip(BRANCH), ip(REGULAR)]);
    assert_eq!(node.calls(), ["remove 10.0.5.7 vlan8c1f0a5e7b2 101"]);
    assert!(probe.added().is_empty());
    probe.remove(&[ip(BRANCH)]);
    assert!(
        node.calls().is_empty(),
        "released twice: nothing left to do"
    );
}

#[test]
fn a_node_with_tcp_early_demux_on_is_never_looked_at_past_the_gate_read_once() {
    let node = Arc::new(Fake::default());
    node.layouts.lock().unwrap().insert(ip(BRANCH), eni());
    let probe = BranchEniProbe::with_kernel(true, Box::new(node.clone()));
    probe.add("default/a", &[ip(BRANCH)]);
    probe.add("default/b", &[ip(REGULAR)]);
    probe.remove(&[ip(BRANCH)]);
    probe.flush();
    assert_eq!(node.calls(), ["gate"]);
}

#[test]
fn switched_off_the_kernel_is_not_touched_at_all() {
    let node = sgp_node();
    let probe = BranchEniProbe::with_kernel(false, Box::new(node.clone()));
    probe.add("default/app", &[ip(BRANCH)]);
    probe.remove(&[ip(BRANCH)]);
    probe.flush();
    assert!(node.calls().is_empty());
}

#[test]
fn a_failed_add_is_logged_not_remembered_and_never_fails_the_caller() {
    let node = Arc::new(Fake {
        add_fails: true,
        ..Arc::into_inner(sgp_node()).unwrap()
    });
    let probe = BranchEniProbe::with_kernel(true, Box::new(node.clone()));
    probe.add("default/app", &[ip(BRANCH)]);
    assert!(probe.added().is_empty());
    probe.remove(&[ip(BRANCH)]);
    assert_eq!(
        node.calls(),
        [
            "gate",
            "detect 10.0.5.7",
            "add 10.0.5.7 vlan8c1f0a5e7b2 101"
        ]
    );
}

#[test]
fn flush_removes_every_rule_added_once() {
    let node = sgp_node();
    let other = BranchEni {
        table: 102,
        veth: "vlan0000".into(),
        iif_priority: 10,
    };
    node.layouts
        .lock()
        .unwrap()
        .insert(ip("10.0.5.8"), other.clone());
    let probe = BranchEniProbe::with_kernel(true, Box::new(node.clone()));
    probe.add("default/a", &[ip(BRANCH)]);
    probe.add("default/b", &[ip("10.0.5.8")]);
    node.calls();
    probe.flush();
    let mut calls = node.calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "remove 10.0.5.7 vlan8c1f0a5e7b2 101",
            "remove 10.0.5.8 vlan0000 102"
        ]
    );
    probe.flush();
    assert!(node.calls().is_empty());
}
