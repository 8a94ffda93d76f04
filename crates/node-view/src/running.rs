//! Finding a running pod's network namespace through the host's /proc (Istio's `getPodNetNs`):
//! the namespace with an interface holding the pod IP, reached through its oldest process
//! (the pause container; an init container may exit while we work).
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
}

/// The network namespace of the running pod with `ip` under the host's /proc, as a message
/// for logs and Events on failure. Blocking.
pub fn locate(proc_root: &Path, ip: IpAddr) -> Result<PathBuf, String> {
    find_pod_netns(proc_root, ip).map_err(|e| format!("finding the pod's network namespace: {e}"))
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

/// `<proc_root>/<pid>/ns/net` of the oldest process in the namespace holding `ip`.
pub fn find_pod_netns(proc_root: &Path, ip: IpAddr) -> Result<PathBuf, FindError> {
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
    let namespaces = by_ns.len();
    let mut found: Vec<PathBuf> = Vec::new();
    let mut cands: Vec<Candidate> = by_ns.into_values().collect();
    cands.sort_by_key(|c| (c.start, c.pid));
    for c in cands {
        let path = proc_root.join(c.pid.to_string()).join("ns/net");
        // A namespace that vanished or cannot be entered is not the pod's.
        if let Ok(true) = netns::run_in(Some(&path), || has_address(ip)) {
            found.push(path);
        }
    }
    match found.len() {
        0 => Err(FindError::NotFound {
            proc_root: proc_root.to_path_buf(),
            ip,
            namespaces,
        }),
        1 => Ok(found.remove(0)),
        _ => Err(FindError::Ambiguous { ip, paths: found }),
    }
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
        let e = find_pod_netns(Path::new("/nonexistent/proc"), "10.0.0.1".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/proc/1/ns/net"), "{e}");
    }

    #[test]
    fn the_hosts_own_address_is_never_a_pod() {
        // 127.0.0.1 lives in the host namespace (skipped) and in every other namespace's lo
        // only once it is up; either way the host itself must not be returned.
        // The host is PID 1's namespace, or ours where PID 1's cannot be read (as above).
        if let Ok(p) = find_pod_netns(Path::new("/proc"), "127.0.0.1".parse().unwrap()) {
            let host = netns::inode(Path::new("/proc/1/ns/net"))
                .or_else(|_| netns::inode(Path::new("/proc/thread-self/ns/net")))
                .unwrap();
            assert_ne!(netns::inode(&p).unwrap(), host);
        }
    }
}
