//! The agent's operations against recording fakes of the kernel and of ztunnel (no root): the
//! order of every step of an enroll and a release, the undo of each failure, the startup
//! snapshot, ztunnel going and coming back, and the reconcile passes. Both fakes write to one
//! log, so the order across them is what the agent did.
//!
//! The fakes are modelled on what the live ones promise (`io.rs`): the kernel's calls either
//! do all or nothing; ztunnel's add fails at once when it is not connected
//! (`ZdsServer::add_workload`) and a del never fails for want of it.

use super::*;
use capture::{HostProbeConfig, ProbeSource};
use redirect::Backend;
use std::collections::HashSet;
use std::sync::Mutex as SyncMutex;
use std::sync::atomic::{AtomicBool, Ordering};
use zds::DelOutcome;

type Log = Arc<SyncMutex<Vec<String>>>;

fn say(log: &Log, line: String) {
    log.lock().unwrap().push(line);
}

/// The steps a fake fails, by name.
type Faults = Arc<SyncMutex<HashSet<&'static str>>>;

fn failing(faults: &Faults, step: &'static str) -> Result<(), RedirectError> {
    if faults.lock().unwrap().contains(step) {
        return Err(RedirectError::Drift(vec![format!(
            "{step} failed (injected)"
        )]));
    }
    Ok(())
}

fn ips(ips: &[IpAddr]) -> String {
    let mut s: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
    s.sort();
    s.join(",")
}

struct FakeKernel {
    log: Log,
    faults: Faults,
    /// What `check` finds (a pod's rules drifted).
    drift: Arc<SyncMutex<Vec<String>>>,
    /// What `host_check` finds.
    host_drift: Arc<SyncMutex<Vec<String>>>,
}

impl Kernel for FakeKernel {
    fn program(&self, _: &Plan, _: &Path, _: Instant) -> Result<(), RedirectError> {
        say(&self.log, "program".into());
        failing(&self.faults, "program")
    }

    fn check(&self, _: &Plan, _: &Path, _: Instant) -> Result<Vec<String>, RedirectError> {
        say(&self.log, "check".into());
        failing(&self.faults, "check")?;
        Ok(self.drift.lock().unwrap().clone())
    }

    fn unprogram(&self, _: &Path, _: Instant) -> Result<(), RedirectError> {
        say(&self.log, "unprogram".into());
        failing(&self.faults, "unprogram")
    }

    fn host_ensure(&self, _: &Plan) -> Result<(), RedirectError> {
        say(&self.log, "host_ensure".into());
        failing(&self.faults, "host_ensure")
    }

    fn host_check(&self, _: &Plan) -> Result<Vec<String>, RedirectError> {
        say(&self.log, "host_check".into());
        failing(&self.faults, "host_check")?;
        Ok(self.host_drift.lock().unwrap().clone())
    }

    fn host_add_pods_ips(&self, _: &Plan, pods: &[(&str, &[IpAddr])]) -> Result<(), RedirectError> {
        let all: Vec<IpAddr> = pods
            .iter()
            .flat_map(|(_, ips)| ips.iter().copied())
            .collect();
        say(&self.log, format!("host_add {}", ips(&all)));
        failing(&self.faults, "host_add")
    }

    fn host_sync_pods_ips(
        &self,
        _: &Plan,
        pods: &[(&str, &[IpAddr])],
    ) -> Result<Vec<IpAddr>, RedirectError> {
        let all: Vec<IpAddr> = pods
            .iter()
            .flat_map(|(_, ips)| ips.iter().copied())
            .collect();
        say(&self.log, format!("host_sync {}", ips(&all)));
        failing(&self.faults, "host_sync")?;
        Ok(Vec::new())
    }

    fn host_remove_pod_ips(&self, _: &Plan, removed: &[IpAddr]) -> Result<(), RedirectError> {
        say(&self.log, format!("host_remove {}", ips(removed)));
        failing(&self.faults, "host_remove")
    }

    fn host_remove_all(&self) -> Result<bool, RedirectError> {
        say(&self.log, "host_remove_all".into());
        failing(&self.faults, "host_remove_all")?;
        Ok(true)
    }
}

/// How ztunnel answers an add it does not acknowledge.
type Refusal = fn(&str) -> ZdsError;

/// ztunnel as ZDS shows it: connected or not, answering each add with its Ack or an error.
struct FakeZtunnel {
    log: Log,
    ready: AtomicBool,
    /// The error the next adds get (ztunnel refused the pod, or the link dropped).
    refuse: SyncMutex<Option<Refusal>>,
    /// The pods of the store (those of the startup snapshot, then the ones added).
    known: SyncMutex<Vec<String>>,
    /// Adds wait here until released (to hold an enroll in ztunnel's hands).
    gate: tokio::sync::Semaphore,
}

impl Ztunnel for FakeZtunnel {
    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn socket_path(&self) -> &Path {
        Path::new("/var/run/ztunnel/ztunnel.sock")
    }

    fn known_workloads(&self) -> Vec<String> {
        self.known.lock().unwrap().clone()
    }

    async fn add_workload(&self, uid: &str, _: WorkloadInfo, _: OwnedFd) -> Result<(), ZdsError> {
        let _pass = self.gate.acquire().await.expect("gate open");
        say(&self.log, format!("zds_add {uid}"));
        if !self.is_ready() {
            return Err(link_dropped(uid));
        }
        if let Some(refuse) = *self.refuse.lock().unwrap() {
            return Err(refuse(uid));
        }
        self.known.lock().unwrap().push(uid.to_string());
        Ok(())
    }

    async fn del_workload(&self, uid: &str) -> Result<DelOutcome, ZdsError> {
        say(&self.log, format!("zds_del {uid}"));
        self.known.lock().unwrap().retain(|k| k != uid);
        Ok(DelOutcome::Acked)
    }
}

fn refused(uid: &str) -> ZdsError {
    ZdsError::Rejected {
        socket: "/var/run/ztunnel/ztunnel.sock".into(),
        pod: uid.into(),
        message: "no such workload".into(),
    }
}

fn link_dropped(uid: &str) -> ZdsError {
    ZdsError::Link {
        socket: "/var/run/ztunnel/ztunnel.sock".into(),
        pod: uid.into(),
        source: zds::LinkError::Closed,
    }
}

/// An agent on fakes, and the handles to steer and read them.
struct Rig {
    agent: Agent<FakeZtunnel, FakeKernel>,
    log: Log,
    faults: Faults,
    drift: Arc<SyncMutex<Vec<String>>>,
    host_drift: Arc<SyncMutex<Vec<String>>>,
}

impl Rig {
    fn new() -> Rig {
        let log: Log = Arc::default();
        let faults: Faults = Arc::default();
        let (drift, host_drift) = (Arc::default(), Arc::default());
        let kernel = FakeKernel {
            log: log.clone(),
            faults: faults.clone(),
            drift: Arc::clone(&drift),
            host_drift: Arc::clone(&host_drift),
        };
        let ztunnel = FakeZtunnel {
            log: log.clone(),
            ready: AtomicBool::new(true),
            refuse: SyncMutex::new(None),
            known: SyncMutex::new(Vec::new()),
            gate: tokio::sync::Semaphore::new(tokio::sync::Semaphore::MAX_PERMITS),
        };
        let host_plan =
            Plan::ambient_host(&HostProbeConfig::new(ProbeSource::AnyLocalSocket, false))
                .expect("host plan");
        let settings = AgentSettings {
            backend: BackendChoice::Fixed(Backend::Nft),
            dns_capture: true,
            ipv6: false,
            probe_snat: ProbeSnat::default(),
            host_plan,
            host: HostProbeRule::new(Backend::Nft),
            aws_branch_eni_probe: false,
        };
        Rig {
            agent: Agent::with_io(ztunnel, kernel, settings),
            log,
            faults,
            drift,
            host_drift,
        }
    }

    /// The log since the last call.
    fn steps(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn fail(&self, step: &'static str) {
        self.faults.lock().unwrap().insert(step);
    }

    fn heal(&self) {
        self.faults.lock().unwrap().clear();
    }

    fn ztunnel(&self) -> &FakeZtunnel {
        self.agent.zds()
    }

    /// Enrolls pod `uid` with `addresses`, which must fail.
    async fn enroll_fails(&self, uid: &str, addresses: &[&str]) -> AgentError {
        let served = self.agent.enroll(pod(uid, addresses), netns()).await;
        served.expect_err("the enroll should fail")
    }

    /// Enrolls pod `uid` with `addresses`, which must succeed.
    async fn serve(&self, uid: &str, addresses: &[&str]) {
        let served = self.agent.enroll(pod(uid, addresses), netns()).await;
        served.unwrap_or_else(|e| panic!("enrolling {uid}: {e}"));
    }
}

pub(super) fn pod(uid: &str, addresses: &[&str]) -> AmbientPodRef {
    AmbientPodRef {
        uid: uid.into(),
        name: format!("app-{uid}"),
        namespace: "default".into(),
        service_account: "default".into(),
        ips: addresses.iter().map(|ip| ip.parse().unwrap()).collect(),
        settings: AmbientPod::default(),
    }
}

/// A stand-in for a pod's namespace: any file has the identity (device, inode) the agent
/// compares.
pub(super) fn netns() -> OwnedFd {
    OwnedFd::from(tempfile::tempfile().unwrap())
}

#[tokio::test]
async fn an_enroll_writes_the_rules_then_the_host_rule_then_the_probe_address_then_tells_ztunnel() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    assert_eq!(
        rig.steps(),
        ["program", "host_ensure", "host_add 10.0.0.1", "zds_add a"]
    );
    rig.serve("b", &["10.0.0.2"]).await;
    assert_eq!(
        rig.steps(),
        ["program", "host_add 10.0.0.2", "zds_add b"],
        "the host rule is written once, with the first pod"
    );
    assert!(rig.agent.is_enrolled("a").await && rig.agent.is_enrolled("b").await);
    assert_eq!(
        rig.agent.uid_of("default", "app-b").await.as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn without_ztunnel_an_enroll_fails_as_unavailable_before_touching_anything() {
    let rig = Rig::new();
    rig.ztunnel().ready.store(false, Ordering::SeqCst);
    let err = rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("no ztunnel connected"), "{err}");
    assert!(rig.steps().is_empty());
    assert!(!rig.agent.is_enrolled("a").await);
}

#[tokio::test]
async fn rules_that_cannot_be_written_fail_the_enroll_with_nothing_else_done() {
    let rig = Rig::new();
    rig.fail("program");
    let err = rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert!(matches!(err, AgentError::Rules { .. }), "{err}");
    assert_eq!(
        rig.steps(),
        ["program"],
        "one atomic batch: nothing to undo"
    );
    assert!(!rig.agent.is_enrolled("a").await);
}

#[tokio::test]
async fn no_host_rule_undoes_the_pods_rules() {
    let rig = Rig::new();
    rig.fail("host_ensure");
    let err = rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert!(matches!(err, AgentError::Host { .. }), "{err}");
    assert_eq!(rig.steps(), ["program", "host_ensure", "unprogram"]);
    rig.heal();
    rig.serve("a", &["10.0.0.1"]).await;
    assert_eq!(
        rig.steps(),
        ["program", "host_ensure", "host_add 10.0.0.1", "zds_add a"],
        "the host rule was never recorded as written: the next enroll writes it"
    );
}

#[tokio::test]
async fn a_probe_address_that_cannot_be_added_undoes_everything_in_reverse() {
    let rig = Rig::new();
    rig.fail("host_add");
    let err = rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert!(matches!(err, AgentError::Host { .. }), "{err}");
    assert_eq!(
        rig.steps(),
        [
            "program",
            "host_ensure",
            "host_add 10.0.0.1",
            "unprogram",
            "host_remove 10.0.0.1",
            "host_remove_all"
        ]
    );
    assert!(!rig.agent.is_enrolled("a").await);
}

#[tokio::test]
async fn a_pod_ztunnel_refuses_is_undone_and_is_not_reported_as_a_retry_later() {
    let rig = Rig::new();
    *rig.ztunnel().refuse.lock().unwrap() = Some(refused);
    let err = rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert!(
        matches!(err, AgentError::Ztunnel { .. }) && !err.is_unavailable(),
        "{err}"
    );
    assert_eq!(
        rig.steps(),
        [
            "program",
            "host_ensure",
            "host_add 10.0.0.1",
            "zds_add a",
            "unprogram",
            "host_remove 10.0.0.1",
            "host_remove_all"
        ]
    );
}

#[tokio::test]
async fn a_failed_re_enroll_leaves_the_pod_unserved_and_keeps_what_other_pods_need() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.serve("b", &["10.0.0.2"]).await;
    rig.steps();
    *rig.ztunnel().refuse.lock().unwrap() = Some(refused);
    rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert_eq!(
        rig.steps(),
        [
            "program",
            "host_add 10.0.0.1",
            "zds_add a",
            "unprogram",
            "host_remove 10.0.0.1"
        ],
        "b still needs the host rule"
    );
    assert!(
        !rig.agent.is_enrolled("a").await,
        "ZDS forgot it: so does the agent"
    );
    assert!(rig.agent.is_enrolled("b").await);
}

#[tokio::test]
async fn a_release_tells_ztunnel_first_then_removes_the_rules_then_the_addresses() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.serve("b", &["10.0.0.2"]).await;
    rig.steps();
    assert!(rig.agent.release("a", "test").await);
    assert_eq!(
        rig.steps(),
        ["zds_del a", "unprogram", "host_remove 10.0.0.1"]
    );
    assert!(rig.agent.release("b", "test").await);
    assert_eq!(
        rig.steps(),
        [
            "zds_del b",
            "unprogram",
            "host_remove 10.0.0.2",
            "host_remove_all"
        ],
        "the host rule goes with the last pod"
    );
    assert!(!rig.agent.release("b", "again").await);
    assert!(rig.steps().is_empty(), "a second release does nothing");
}

#[tokio::test]
async fn a_release_goes_on_when_a_step_fails() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.steps();
    rig.fail("unprogram");
    rig.fail("host_remove");
    assert!(rig.agent.release("a", "test").await);
    assert_eq!(
        rig.steps(),
        [
            "zds_del a",
            "unprogram",
            "host_remove 10.0.0.1",
            "host_remove_all"
        ]
    );
    assert!(!rig.agent.is_enrolled("a").await);
}

#[tokio::test]
async fn an_address_another_pod_holds_stays_when_its_former_owner_is_released() {
    let rig = Rig::new();
    // `b` got `a`'s address while `a`'s DEL was missed.
    rig.serve("a", &["10.0.0.1"]).await;
    rig.serve("b", &["10.0.0.1"]).await;
    rig.steps();
    assert!(rig.agent.release("a", "test").await);
    assert_eq!(rig.steps(), ["zds_del a", "unprogram"]);
}

#[tokio::test]
async fn a_re_created_sandbox_with_new_addresses_drops_the_old_ones() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.steps();
    rig.serve("a", &["10.0.0.7"]).await;
    assert_eq!(
        rig.steps(),
        [
            "program",
            "host_add 10.0.0.7",
            "zds_add a",
            "host_remove 10.0.0.1"
        ]
    );
}

#[tokio::test]
async fn a_cni_del_of_another_sandbox_leaves_the_served_one_alone() {
    let rig = Rig::new();
    let (live, old) = (
        tempfile::NamedTempFile::new().unwrap(),
        tempfile::NamedTempFile::new().unwrap(),
    );
    let fd = OwnedFd::from(std::fs::File::open(live.path()).unwrap());
    rig.agent.enroll(pod("a", &["10.0.0.1"]), fd).await.unwrap();
    rig.steps();
    assert!(!rig.agent.release_sandbox("a", old.path(), "CNI DEL").await);
    assert!(
        !rig.agent
            .release_sandbox("a", Path::new("/nonexistent/netns"), "CNI DEL")
            .await
    );
    assert!(rig.steps().is_empty());
    assert!(rig.agent.release_sandbox("a", live.path(), "CNI DEL").await);
    assert_eq!(rig.steps()[0], "zds_del a");
}

#[tokio::test]
async fn the_startup_snapshot_is_adopted_then_the_probe_sets_pruned_to_it() {
    let rig = Rig::new();
    rig.ztunnel()
        .known
        .lock()
        .unwrap()
        .extend(["a".into(), "k".into()]);
    rig.agent
        .adopt(pod("a", &["10.0.0.1"]), netns())
        .await
        .unwrap();
    let kept: IpAddr = "10.0.0.9".parse().unwrap();
    rig.agent.discovered(vec![("k".into(), vec![kept])]).await;
    assert_eq!(
        rig.steps(),
        [
            "host_ensure",
            "host_add 10.0.0.1",
            "host_sync 10.0.0.1,10.0.0.9"
        ],
        "a pod kept without its namespace keeps its address"
    );
    // The kept pod is deleted: it leaves ztunnel's store and the probe sets, the rule stays.
    assert!(!rig.agent.release("k", "pod deleted").await);
    assert_eq!(rig.steps(), ["zds_del k", "host_remove 10.0.0.9"]);
    // A kept pod that runs again is enrolled and no longer kept.
    assert!(rig.agent.is_enrolled("a").await);
}

#[tokio::test]
async fn a_leftover_host_rule_goes_at_startup_when_no_ambient_pod_runs() {
    let rig = Rig::new();
    rig.fail("host_remove_all");
    rig.agent.discovered(Vec::new()).await;
    assert_eq!(rig.steps(), ["host_remove_all"]);
    // Its removal failed: each reconcile pass tries again until it goes.
    assert!(rig.agent.reconcile_host().await.unwrap().is_empty());
    assert_eq!(rig.steps(), ["host_remove_all"]);
    rig.heal();
    rig.agent.reconcile_host().await.unwrap();
    assert_eq!(rig.steps(), ["host_remove_all"]);
    rig.agent.reconcile_host().await.unwrap();
    assert!(rig.steps().is_empty(), "removed: nothing more to do");
}

#[tokio::test]
async fn ztunnel_gone_and_back_the_served_pods_stay_and_new_ones_wait_for_it() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.ztunnel().ready.store(false, Ordering::SeqCst);
    let err = rig.enroll_fails("b", &["10.0.0.2"]).await;
    assert!(err.is_unavailable(), "{err}");
    assert!(
        rig.agent.is_enrolled("a").await,
        "ZDS replays its store on reconnect"
    );
    rig.steps();
    rig.ztunnel().ready.store(true, Ordering::SeqCst);
    rig.serve("b", &["10.0.0.2"]).await;
    assert_eq!(rig.steps(), ["program", "host_add 10.0.0.2", "zds_add b"]);
}

#[tokio::test]
async fn ztunnel_lost_mid_enroll_is_a_retry_later_and_the_pod_is_undone() {
    let rig = Rig::new();
    *rig.ztunnel().refuse.lock().unwrap() = Some(link_dropped);
    let err = rig.enroll_fails("a", &["10.0.0.1"]).await;
    assert!(err.is_unavailable(), "{err}");
    assert!(rig.steps().contains(&"unprogram".to_string()));
    assert!(!rig.agent.is_enrolled("a").await);
}

#[tokio::test]
async fn a_release_waits_for_the_enroll_of_the_same_pod() {
    let rig = Arc::new(Rig::new());
    rig.ztunnel()
        .gate
        .forget_permits(tokio::sync::Semaphore::MAX_PERMITS);
    let enroll = {
        let rig = rig.clone();
        tokio::spawn(async move { rig.agent.enroll(pod("a", &["10.0.0.1"]), netns()).await })
    };
    let release = {
        let rig = rig.clone();
        tokio::spawn(async move { rig.agent.release("a", "pod deleted").await })
    };
    // Both are under way; the enroll is in ztunnel's hands until the gate opens.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!release.is_finished());
    rig.ztunnel().gate.add_permits(1);
    enroll.await.unwrap().unwrap();
    assert!(
        release.await.unwrap(),
        "the release came after the enroll: it found the pod"
    );
    let steps = rig.steps();
    let at = |s: &str| steps.iter().position(|x| x == s).unwrap();
    assert!(at("zds_add a") < at("zds_del a"), "{steps:?}");
}

#[tokio::test]
async fn a_drifted_pod_is_written_again_and_one_in_sync_is_left_alone() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.steps();
    assert!(rig.agent.reconcile("a").await.unwrap().is_empty());
    assert_eq!(rig.steps(), ["check"]);
    rig.drift
        .lock()
        .unwrap()
        .push("chain istio-prerouting missing".into());
    assert_eq!(rig.agent.reconcile("a").await.unwrap().len(), 1);
    assert_eq!(rig.steps(), ["check", "program"]);
    assert!(rig.agent.reconcile("unknown").await.unwrap().is_empty());
    rig.fail("check");
    assert!(matches!(
        rig.agent.reconcile("a").await,
        Err(AgentError::Rules { .. })
    ));
}

#[tokio::test]
async fn a_drifted_host_rule_is_written_again_and_its_sets_refilled() {
    let rig = Rig::new();
    rig.serve("a", &["10.0.0.1"]).await;
    rig.steps();
    rig.agent.reconcile_host().await.unwrap();
    assert_eq!(
        rig.steps(),
        ["host_check", "host_add 10.0.0.1"],
        "before startup discovery nothing is pruned"
    );
    rig.agent.discovered(Vec::new()).await;
    rig.steps();
    rig.host_drift.lock().unwrap().push("table gone".into());
    assert_eq!(rig.agent.reconcile_host().await.unwrap().len(), 1);
    assert_eq!(
        rig.steps(),
        ["host_check", "host_ensure", "host_sync 10.0.0.1"]
    );
    rig.fail("host_check");
    let err = rig.agent.reconcile_host().await.unwrap_err();
    assert!(matches!(err, AgentError::HostCheck(_)), "{err}");
}

#[tokio::test]
async fn clearing_a_former_pod_removes_its_leftovers_but_never_a_served_pods() {
    let rig = Rig::new();
    rig.agent
        .clear(&pod("old", &["10.0.0.3"]), netns())
        .await
        .unwrap();
    assert_eq!(rig.steps(), ["unprogram", "host_remove 10.0.0.3"]);
    rig.serve("a", &["10.0.0.1"]).await;
    rig.steps();
    rig.agent
        .clear(&pod("a", &["10.0.0.1"]), netns())
        .await
        .unwrap();
    assert!(rig.steps().is_empty(), "a served pod is not cleared");
    rig.fail("unprogram");
    let err = rig
        .agent
        .clear(&pod("old", &["10.0.0.3"]), netns())
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::Clear { .. }), "{err}");
}

#[tokio::test]
async fn invalid_pod_settings_fail_the_enroll_before_any_rule() {
    let rig = Rig::new();
    let mut bad = pod("a", &["10.0.0.1"]);
    bad.settings.virtual_interfaces = vec!["not an interface name!".into()];
    match rig.agent.enroll(bad, netns()).await {
        Err(AgentError::Plan { pod, .. }) => assert_eq!(pod, "default/app-a"),
        other => panic!("expected a plan error, got {other:?}"),
    }
    assert!(rig.steps().is_empty());
}
