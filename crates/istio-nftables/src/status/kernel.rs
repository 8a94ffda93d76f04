//! The report without the daemon: what the kernel alone says. Every network namespace on the
//! node (each with a process under the host's /proc, through `node_view::running`, the
//! discovery the daemon uses; and every one bound under /var/run/netns), its addresses, the
//! pod UID its processes' cgroups name, and which of our rule sets it holds
//! (`redirect::present`). Without the API nothing says what each pod SHOULD get: modes are
//! `unknown`, rules `present` or `none`, and only a namespace holding our rules on both
//! backends at once is provably wrong.

use cni_config::status::{PodEntry, Report, Rules, Source, Summary, classify};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Every namespace found, oldest process first, then the bound ones; each once.
fn namespaces(
    proc_root: &Path,
    netns_dir: &Path,
) -> Result<Vec<(PathBuf, Option<String>)>, String> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let host = netns::inode(&proc_root.join("1/ns/net")).ok();
    for n in node_view::running::namespaces(proc_root).map_err(|e| e.to_string())? {
        if seen.insert(n.inode) {
            found.push((n.path, n.pod_uid));
        }
    }
    let mut bound: Vec<PathBuf> = std::fs::read_dir(netns_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    bound.sort();
    for path in bound {
        let Ok(ino) = netns::inode(&path) else {
            continue;
        };
        if Some(ino) != host && seen.insert(ino) {
            found.push((path, None));
        }
    }
    Ok(found)
}

fn entry(path: &Path, uid: Option<String>) -> PodEntry {
    let mut e = PodEntry {
        reason: "no API: the daemon is not reachable".into(),
        netns: Some(path.display().to_string()),
        ..PodEntry::unknown(String::new(), String::new(), uid)
    };
    match redirect::read_facts(Some(path), None) {
        Ok(f) => {
            e.ips = f
                .local_addrs
                .into_iter()
                .filter(|ip| !ip.is_loopback())
                .collect()
        }
        Err(err) => e.detail = Some(format!("reading its addresses: {err}")),
    }
    match redirect::present::present(Some(path)) {
        Ok(p) => {
            e.backend = p.backend().map(String::from);
            e.rules = match (p.any(), p.nft() && p.legacy) {
                (_, true) => Rules::BothBackends,
                (true, false) => Rules::Present,
                (false, false) => Rules::None,
            };
            let kind = match (p.nft_sidecar || p.legacy, p.nft_ambient) {
                (true, true) => Some("sidecar and ambient rules"),
                (true, false) => Some("sidecar rules"),
                (false, true) => Some("ambient in-pod rules"),
                (false, false) => None,
            };
            if let (Some(kind), None) = (kind, &e.detail) {
                e.detail = Some(format!(
                    "holds our {kind} (not compared with a plan: no API)"
                ));
            }
        }
        Err(err) => e.detail = Some(format!("reading its rules: {err}")),
    }
    e.state = classify(e.mode, e.rules, None, true);
    e
}

/// The kernel-only report; `why`: why the daemon did not answer (a note).
pub fn report(proc_root: &Path, netns_dir: &Path, why: &str) -> Result<Report, String> {
    let pods: Vec<PodEntry> = namespaces(proc_root, netns_dir)?
        .into_iter()
        .map(|(path, uid)| entry(&path, uid))
        .collect();
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    Ok(Report {
        source: Source::Kernel,
        node,
        node_backend: None,
        ambient_enabled: None,
        generated: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        summary: Summary::of(&pods),
        pods,
        notes: vec![
            format!("the daemon did not answer ({why}): this is the kernel's view alone"),
            "one row per network namespace; what each pod should get needs the daemon's pod cache"
                .into(),
        ],
    })
}
