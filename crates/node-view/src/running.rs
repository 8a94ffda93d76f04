//! Finding a running pod's network namespace through the host's /proc (Istio's `getPodNetNs`):
//! the namespace with an interface holding the pod IP, reached through its oldest process
//! (the pause container; an init container may exit while we work).
//!
//! With the pod's UID, a namespace whose process kubelet's cgroups put in ANOTHER pod is never
//! the pod's, even when it holds the IP (a dead sandbox's address reused while the API still
//! lists the pod): Istio's agent pairs namespaces to pods the same way ([`crate::cgroup`]).
//! Namespaces whose processes name no pod (cgroups outside kubepods) are matched by IP alone.
//!
//! Processes are grouped by namespace inode first, so each namespace is entered once however
//! many processes share it. The host's namespace (`<proc>/1/ns/net`) and our own are never
//! candidates: a host-network pod's IP is the node's, and programming the node would redirect
//! every connection on it.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("reading the host network namespace {path}: {source}")]
    Host { path: PathBuf, source: io::Error },
    #[error("listing {path}: {source}")]
    List { path: PathBuf, source: io::Error },
    #[error(
        "no network namespace under {proc_root} has an interface with {ip} ({namespaces} namespace(s) searched)"
    )]
    NotFound {
        proc_root: PathBuf,
        ip: IpAddr,
        namespaces: usize,
    },
    #[error("{ip} is on interfaces in {} different network namespaces ({}); refusing to guess", .paths.len(), .paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Ambiguous { ip: IpAddr, paths: Vec<PathBuf> },
    #[error(
        "{ip} is held by {path}, whose processes belong to pod {owner} (their cgroups), not to pod {uid}"
    )]
    OtherPod {
        ip: IpAddr,
        path: PathBuf,
        owner: String,
        uid: String,
    },
}

/// Why [`locate`] found no namespace: [`FindError`] (naming the proc root, the IP and the
/// paths), said as logs and Events say it.
#[derive(Debug, thiserror::Error)]
#[error("finding the pod's network namespace: {0}")]
pub struct LocateError(#[from] pub FindError);

/// The network namespace of the running pod with `ip` (and UID `uid`, when known) under the
/// host's /proc. Blocking.
pub fn locate(proc_root: &Path, ip: IpAddr, uid: Option<&str>) -> Result<PathBuf, LocateError> {
    Ok(find_pod_netns(proc_root, ip, uid)?)
}

/// One namespace and the process that represents it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Candidate {
    pid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22); `u64::MAX` if unknown.
    start: u64,
}

/// Start time from `/proc/PID/stat` text: field 22, counted after the `)` closing `comm`
/// (which may itself hold spaces and parentheses).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first; starttime is field 22.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

fn ns_inode(p: &Path) -> io::Result<u64> {
    netns::inode(p)
}

/// One running network namespace other than the host's: reached through its oldest process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningNetns {
    /// `<proc_root>/<pid>/ns/net`.
    pub path: PathBuf,
    pub pid: u32,
    /// The namespace's inode.
    pub inode: u64,
    /// The pod UID its oldest process's cgroups name (`None`: outside kubepods).
    pub pod_uid: Option<String>,
}

/// Every network namespace with a process under `proc_root`, except the host's and our own,
/// oldest first, each once (through its oldest process). Blocking; enters no namespace.
pub fn namespaces(proc_root: &Path) -> Result<Vec<RunningNetns>, FindError> {
    let mut cands: Vec<(u64, Candidate)> = candidates(proc_root)?.into_iter().collect();
    cands.sort_by_key(|(_, c)| (c.start, c.pid));
    Ok(cands
        .into_iter()
        .map(|(inode, c)| {
            let dir = proc_root.join(c.pid.to_string());
            let cgroups = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
            RunningNetns {
                path: dir.join("ns/net"),
                pid: c.pid,
                inode,
                pod_uid: crate::cgroup::pod_uid(&cgroups),
            }
        })
        .collect())
}

/// The processes under `proc_root` grouped by network namespace inode (the oldest of each),
/// the host's namespace (`<proc>/1/ns/net`) and our own left out.
fn candidates(proc_root: &Path) -> Result<HashMap<u64, Candidate>, FindError> {
    let host_path = proc_root.join("1/ns/net");
    let own = ns_inode(Path::new("/proc/thread-self/ns/net")).ok();
    // Some sandboxes make PID 1's namespace unreadable even to root; the daemon runs on the
    // host network, so its own namespace is the host's then.
    let host = match (ns_inode(&host_path), own) {
        (Ok(ino), _) => ino,
        (Err(e), Some(own)) if e.kind() == std::io::ErrorKind::PermissionDenied => own,
        (Err(source), _) => {
            return Err(FindError::Host {
                path: host_path,
                source,
            });
        }
    };
    let entries = std::fs::read_dir(proc_root).map_err(|source| FindError::List {
        path: proc_root.to_path_buf(),
        source,
    })?;
    let mut by_ns: HashMap<u64, Candidate> = HashMap::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let dir = proc_root.join(pid.to_string());
        // Processes come and go, kernel threads share the host's namespace: skip what fails.
        let Ok(ino) = ns_inode(&dir.join("ns/net")) else {
            continue;
        };
        if ino == host || Some(ino) == own {
            continue;
        }
        let start = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| parse_start_time(&s))
            .unwrap_or(u64::MAX);
        let c = Candidate { pid, start };
        by_ns
            .entry(ino)
            .and_modify(|best| {
                if (c.start, c.pid) < (best.start, best.pid) {
                    *best = c.clone();
                }
            })
            .or_insert(c);
    }
    Ok(by_ns)
}

/// `<proc_root>/<pid>/ns/net` of the oldest process in the namespace holding `ip` (and
/// belonging to pod `uid`, see the module doc).
pub fn find_pod_netns(
    proc_root: &Path,
    ip: IpAddr,
    uid: Option<&str>,
) -> Result<PathBuf, FindError> {
    let by_ns = candidates(proc_root)?;
    let namespaces = by_ns.len();
    let mut found: Vec<Holder> = Vec::new();
    let mut cands: Vec<Candidate> = by_ns.into_values().collect();
    cands.sort_by_key(|c| (c.start, c.pid));
    for c in cands {
        let dir = proc_root.join(c.pid.to_string());
        let path = dir.join("ns/net");
        // A namespace that vanished or cannot be entered is not the pod's.
        if let Ok(true) = netns::run_in(Some(&path), || has_address(ip)) {
            let cgroups = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
            let pod = crate::cgroup::pod_uid(&cgroups);
            found.push(Holder { path, pod });
        }
    }
    pick(found, ip, uid).unwrap_or_else(|| {
        Err(FindError::NotFound {
            proc_root: proc_root.to_path_buf(),
            ip,
            namespaces,
        })
    })
}

/// A namespace holding the IP, and the pod its oldest process's cgroups name.
#[derive(Debug)]
struct Holder {
    path: PathBuf,
    pod: Option<String>,
}

/// The pod's namespace among those holding its IP: the one its UID's cgroups name, else the
/// only one naming no pod; one naming another pod never. `None`: not found.
fn pick(found: Vec<Holder>, ip: IpAddr, uid: Option<&str>) -> Option<Result<PathBuf, FindError>> {
    let paths = |hs: Vec<Holder>| hs.into_iter().map(|h| h.path).collect::<Vec<_>>();
    let one_of = |mut paths: Vec<PathBuf>| match paths.len() {
        0 => None,
        1 => Some(Ok(paths.remove(0))),
        _ => Some(Err(FindError::Ambiguous { ip, paths })),
    };
    let Some(uid) = uid else {
        return one_of(paths(found));
    };
    let (mine, rest): (Vec<Holder>, Vec<Holder>) = found
        .into_iter()
        .partition(|h| h.pod.as_deref() == Some(uid));
    if !mine.is_empty() {
        return one_of(paths(mine));
    }
    let (unknown, others): (Vec<Holder>, Vec<Holder>) =
        rest.into_iter().partition(|h| h.pod.is_none());
    if let Some(r) = one_of(paths(unknown)) {
        return Some(r);
    }
    let other = others.into_iter().next()?;
    Some(Err(FindError::OtherPod {
        ip,
        path: other.path,
        owner: other.pod.unwrap_or_default(),
        uid: uid.to_string(),
    }))
}

/// Whether an interface in the calling thread's namespace holds `ip`.
fn has_address(ip: IpAddr) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return false;
    };
    addrs.filter_map(|i| i.address).any(|a| {
        a.as_sockaddr_in()
            .map(|s| IpAddr::V4(s.ip()))
            .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
            == Some(ip)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(path: &str, pod: Option<&str>) -> Holder {
        Holder {
            path: PathBuf::from(path),
            pod: pod.map(String::from),
        }
    }

    #[test]
    fn the_pods_own_cgroup_wins_and_another_pods_never_does() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let picked = |found, uid| pick(found, ip, uid).map(|r| r.map_err(|e| e.to_string()));
        let ok = |p: &str| Some(Ok(PathBuf::from(p)));
        // Two namespaces hold the IP: the one in the pod's cgroup is the pod's.
        let two = || vec![holder("/a", Some("uid-b")), holder("/b", Some("uid-a"))];
        assert_eq!(picked(two(), Some("uid-a")), ok("/b"));
        // Without the UID that is ambiguous, as before.
        assert!(matches!(picked(two(), None), Some(Err(e)) if e.contains("refusing to guess")));
        // Only another pod's namespace holds it: refused, naming that pod.
        let e = picked(vec![holder("/a", Some("uid-b"))], Some("uid-a"));
        assert!(
            matches!(&e, Some(Err(e)) if e.contains("pod uid-b") && e.contains("not to pod uid-a")),
            "{e:?}"
        );
        // A namespace naming no pod (no kubepods cgroup) is matched by IP alone.
        let found = vec![holder("/a", Some("uid-b")), holder("/c", None)];
        assert_eq!(picked(found, Some("uid-a")), ok("/c"));
        assert_eq!(picked(vec![], Some("uid-a")), None);
    }

    #[test]
    fn start_time_after_comm() {
        let stat = "4242 (pau se) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1024 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("1 (init) S 0"), None);
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn own_stat_parses() {
        let s = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_start_time(&s).is_some());
    }

    #[test]
    fn missing_proc_root_names_the_host_path() {
        let e = find_pod_netns(
            Path::new("/nonexistent/proc"),
            "10.0.0.1".parse().unwrap(),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/proc/1/ns/net"), "{e}");
    }

    #[test]
    fn the_hosts_own_address_is_never_a_pod() {
        // 127.0.0.1 lives in the host namespace (skipped) and in every other namespace's lo
        // only once it is up; either way the host itself must not be returned.
        // The host is PID 1's namespace, or ours where PID 1's cannot be read (as above).
        if let Ok(p) = find_pod_netns(Path::new("/proc"), "127.0.0.1".parse().unwrap(), None) {
            let host = netns::inode(Path::new("/proc/1/ns/net"))
                .or_else(|_| netns::inode(Path::new("/proc/thread-self/ns/net")))
                .unwrap();
            assert_ne!(netns::inode(&p).unwrap(), host);
        }
    }
}
