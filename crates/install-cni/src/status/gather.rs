//! The report's data, in two steps: [`judge`] (pure: each pod of the cache → what it should
//! get and why, with the daemon's knowledge of it: the reconciler's last check, the agent's
//! enrolled set) and [`read_kernel`] (blocking: the node's running network namespaces once,
//! then each pod's namespace found by its IP and UID, and its live rules compared with its
//! plan: `redirect::present` + `redirect::check_until`).

use ambient_agent::agent::AmbientPodRef;
use capture::Plan;
use cni_config::status::{AmbientState, Mode, PodEntry, Rules, classify};
use k8s_openapi::api::core::v1::Pod;
use pod_policy::{Decision, Labels, Policy};
use redirect::{Backend, BackendChoice};
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Longest wait for a pod namespace's lock while reading its rules (an ADD in flight).
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// What the pod's rules are compared with.
pub enum Want {
    /// Nothing of ours should be there.
    Nothing,
    /// The sidecar plan for this config, built in the pod's namespace.
    Sidecar(Box<capture::Config>),
    /// The ambient in-pod plan (`None`: the agent has not started; not compared).
    Ambient(Option<Box<Plan>>),
}

/// One pod, judged; its kernel part still to read.
pub struct Judged {
    pub entry: PodEntry,
    pub want: Want,
}

/// What the daemon knows beside the pod cache.
pub struct Known<'a> {
    pub policy: &'a Policy,
    pub ledger: &'a guardian::reconcile::ledger::Ledger,
    /// The agent's served pods' UIDs (`None`: no agent, or not started yet).
    pub enrolled: Option<&'a HashSet<String>>,
    /// The host probe set's addresses (`None`: not read).
    pub probe_ips: Option<&'a [IpAddr]>,
    /// The agent's in-pod plan for an ambient pod.
    pub ambient_plan: &'a (dyn Fn(&AmbientPodRef) -> Option<Plan> + Sync),
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The pod's decision (Istio's order) and what the daemon knows about it. Pure.
pub fn judge(pod: &Pod, ns_labels: &Labels, k: &Known) -> Judged {
    let uid = pod.metadata.uid.clone();
    let mut entry = PodEntry {
        ips: pod_policy::bypass::pod_ips(pod),
        mode: Mode::None,
        ..PodEntry::unknown(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
            uid.clone(),
        )
    };
    if let Some(why) = pod_policy::bypass::finished(pod) {
        entry.reason = format!("{why}: its rules go with its sandbox");
        return Judged {
            entry,
            want: Want::Nothing,
        };
    }
    let want = match pod_policy::decide(pod, ns_labels, k.policy) {
        Ok(Decision::Skip(why)) => {
            entry.reason = why;
            Want::Nothing
        }
        Ok(Decision::Sidecar(pc)) => {
            entry.mode = Mode::Sidecar;
            entry.reason = "a sidecar pod (istio-proxy): the plugin programs its redirect".into();
            let key = format!("{}/{}", entry.namespace, entry.name);
            if let Some(r) = k.ledger.get(&key, uid.as_deref()) {
                entry.last_checked = Some(unix(r.last_checked));
                entry.last_programmed = r.last_programmed.map(unix);
            }
            Want::Sidecar(Box::new(pc.config))
        }
        Ok(Decision::Ambient(_)) | Err(pod_policy::PolicyError::Ambient(_)) => {
            entry.mode = Mode::Ambient;
            entry.reason = "ambient: the enablement selectors enroll it (pod or namespace)".into();
            judge_ambient(pod, &mut entry, k)
        }
        Err(e) => {
            entry.mode = Mode::Sidecar;
            entry.reason = format!("a sidecar pod whose annotations cannot be used: {e}");
            entry.detail = Some("the plugin refuses its ADD".into());
            Want::Nothing
        }
    };
    Judged { entry, want }
}

fn judge_ambient(pod: &Pod, entry: &mut PodEntry, k: &Known) -> Want {
    let uid = entry.uid.clone().unwrap_or_default();
    entry.last_programmed = ambient_agent::view::AGENT.programmed(&uid).map(unix);
    entry.ambient = Some(AmbientState {
        acked: k.enrolled.is_some_and(|e| e.contains(&uid)),
        in_probe_set: k
            .probe_ips
            .map(|set| !entry.ips.is_empty() && entry.ips.iter().all(|ip| set.contains(ip))),
    });
    match ambient_agent::pod_ref(pod, Vec::new()) {
        Ok(r) => Want::Ambient((k.ambient_plan)(&r).map(Box::new)),
        Err(e) => {
            entry.detail = Some(format!("the agent cannot enroll it: {e}"));
            Want::Ambient(None)
        }
    }
}

/// A running namespace and its addresses.
pub struct Netns {
    pub path: PathBuf,
    pub pod_uid: Option<String>,
    pub addrs: Vec<IpAddr>,
}

/// The node's running network namespaces with their addresses (one /proc walk; each entered
/// once). Blocking.
pub fn namespaces(proc_root: &Path) -> Result<Vec<Netns>, String> {
    let found = node_view::running::namespaces(proc_root).map_err(|e| e.to_string())?;
    Ok(found
        .into_iter()
        .filter_map(|n| {
            let facts = redirect::read_facts(Some(&n.path), None).ok()?;
            Some(Netns {
                path: n.path,
                pod_uid: n.pod_uid,
                addrs: facts.local_addrs,
            })
        })
        .collect())
}

/// The pod's namespace: one holding its first IP, the one its UID's cgroups name first, else
/// one naming no pod (`node_view::running`'s rule: another pod's is never the pod's).
fn find<'a>(all: &'a [Netns], ip: IpAddr, uid: Option<&str>) -> Option<&'a Netns> {
    let holding = || all.iter().filter(move |n| n.addrs.contains(&ip));
    holding()
        .find(|n| uid.is_some() && n.pod_uid.as_deref() == uid)
        .or_else(|| holding().find(|n| n.pod_uid.is_none()))
}

/// Reads each judged pod's namespace and rules, and sets its state. Blocking.
pub fn read_kernel(pods: Vec<Judged>, all: &[Netns], backend: Backend) -> Vec<PodEntry> {
    pods.into_iter()
        .map(|j| {
            let mut e = j.entry;
            let found = e
                .ips
                .first()
                .and_then(|ip| find(all, *ip, e.uid.as_deref()));
            match found {
                Some(ns) => {
                    e.netns = Some(ns.path.display().to_string());
                    read_rules(&mut e, &j.want, &ns.path, backend);
                }
                None if matches!(j.want, Want::Nothing) => e.rules = Rules::None,
                None if e.ips.is_empty() => set_detail(&mut e, "no IP yet: not running"),
                None => set_detail(&mut e, "its network namespace is not on this node (yet)"),
            }
            let running = found.is_some();
            e.state = classify(e.mode, e.rules, e.ambient.as_ref(), running);
            e
        })
        .collect()
}

fn set_detail(e: &mut PodEntry, why: &str) {
    if e.detail.is_none() {
        e.detail = Some(why.into());
    }
}

/// The rules in `netns` compared with what the pod should have.
fn read_rules(e: &mut PodEntry, want: &Want, netns: &Path, backend: Backend) {
    let present = match redirect::present::present(Some(netns)) {
        Ok(p) => p,
        Err(err) => {
            e.detail = Some(format!("reading the rules: {err}"));
            return;
        }
    };
    e.backend = present.backend().map(String::from);
    let plan = match want {
        Want::Nothing => {
            e.rules = if present.any() {
                Rules::Leftover
            } else {
                Rules::None
            };
            return;
        }
        _ if !present.any() => {
            e.rules = Rules::Missing;
            return;
        }
        _ if present.nft() && present.legacy => {
            e.rules = Rules::BothBackends;
            return;
        }
        Want::Sidecar(config) => match guardian::podplan::plan_in(config, netns) {
            Ok((plan, _)) => plan,
            Err(err) => {
                e.detail = Some(err.to_string());
                return;
            }
        },
        Want::Ambient(Some(plan)) => (**plan).clone(),
        Want::Ambient(None) => {
            e.rules = Rules::Present;
            return;
        }
    };
    let deadline = Instant::now() + LOCK_WAIT;
    match redirect::check_until(&plan, Some(netns), BackendChoice::Fixed(backend), deadline) {
        Ok(d) if d.is_empty() => e.rules = Rules::Ok,
        Ok(d) => {
            e.rules = Rules::Drifted;
            e.drift = d;
        }
        Err(err) => e.detail = Some(format!("checking the rules: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(path: &str, uid: Option<&str>, ip: &str) -> Netns {
        Netns {
            path: path.into(),
            pod_uid: uid.map(String::from),
            addrs: vec![ip.parse().unwrap()],
        }
    }

    #[test]
    fn a_pods_namespace_is_never_another_pods() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let all = [
            ns("/a", Some("other"), "10.0.0.1"),
            ns("/b", None, "10.0.0.1"),
        ];
        assert_eq!(find(&all, ip, Some("mine")).unwrap().path, Path::new("/b"));
        assert_eq!(find(&all, ip, Some("other")).unwrap().path, Path::new("/a"));
        assert!(find(&all[..1], ip, Some("mine")).is_none());
    }
}
