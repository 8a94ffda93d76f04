//! Who made a temporary chain or TRACE rule, and whether that run is provably gone.
//!
//! A run tags what it adds `istio-explain-<pid>-<start>-<pidns>-<created>-<n>`: its pid as
//! `getpid()` gives it, its start time (`/proc/<pid>/stat` field 22, clock ticks after boot),
//! the inode of its PID namespace (`/proc/self/ns/pid`), the wall-clock second it made the
//! tag (`CLOCK_REALTIME`, which no namespace changes) and a counter. The chart's pods run
//! without hostPID, so a run from `kubectl exec` and one on the host see different pids:
//! a pid alone says nothing about a run in another PID namespace.
//!
//! Another run's tag is dead when (and only when) that is provable:
//! - same PID namespace as ours (and our `/proc` is of it): its pid has no `/proc` entry, or is
//!   a zombie, or started at another time (the pid was reused);
//! - another PID namespace, or ours unknown: it was made more than [`MAX_RUN`] ago, longer than
//!   a run can live (the longest `--wait`, [`MAX_WAIT`], plus a margin for the namespace lock
//!   and the connection).
//!
//! Anything else, including the `istio-explain-<pid>-<n>` tags of earlier versions, whose
//! namespace is unknown, is left alone.

use super::TRACE_CHAIN_PREFIX;
use std::io;
use std::path::Path;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest `--wait` (a run waits at most this long for a connection).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The longest a run can hold a chain or TRACE rule: [`MAX_WAIT`], plus the namespace lock's
/// waits (35 s each), the connection's timeout and slack, with a wide margin.
pub const MAX_RUN: Duration = Duration::from_secs(3600 + 600);

/// A parsed tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22; 0 = unknown.
    pub start: u64,
    /// The PID namespace's inode; 0 = unknown.
    pub pidns: u64,
    /// Seconds since the epoch when the tag was made.
    pub created: u64,
}

/// This process, as a tag describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Me {
    pub pid: u32,
    /// 0 when our `/proc` is not of our PID namespace (then no pid can be checked).
    pub start: u64,
    pub pidns: u64,
}

static ME: LazyLock<Me> = LazyLock::new(|| me_in(Path::new("/proc")));

/// This process under `proc` (`/proc`): start time and PID namespace are known only when
/// `proc/self` is this process, i.e. that `/proc` shows our PID namespace.
fn me_in(proc: &Path) -> Me {
    let pid = std::process::id();
    let unknown = Me {
        pid,
        start: 0,
        pidns: 0,
    };
    let ours =
        std::fs::read_link(proc.join("self")).is_ok_and(|p| p == Path::new(&pid.to_string()));
    if !ours {
        return unknown;
    }
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat"));
    let ns = std::fs::metadata(proc.join("self/ns/pid"));
    match (stat.ok().and_then(|s| parse_stat(&s)), ns) {
        (Some((_, start)), Ok(m)) => Me {
            pid,
            start,
            pidns: std::os::unix::fs::MetadataExt::ino(&m),
        },
        _ => unknown,
    }
}

/// `(state, starttime)` from a `/proc/<pid>/stat` line (fields after the command's last `)`).
fn parse_stat(s: &str) -> Option<(char, u64)> {
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    // Field 3 is the state; field 22 the start time.
    let start = f.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh tag for this run: `istio-explain-<pid>-<start>-<pidns>-<created>-<n>`.
pub fn unique_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let me = *ME;
    format!(
        "{TRACE_CHAIN_PREFIX}{}-{}-{}-{}-{}",
        me.pid,
        me.start,
        me.pidns,
        now_secs(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The tag's fields; `None` for any other name (also the tags of earlier versions).
pub fn parse(tag: &str) -> Option<Tag> {
    let rest = tag.strip_prefix(TRACE_CHAIN_PREFIX)?;
    let f: Vec<&str> = rest.split('-').collect();
    let [pid, start, pidns, created, n] = f[..] else {
        return None;
    };
    n.parse::<u32>().ok()?;
    Some(Tag {
        pid: pid.parse().ok()?,
        start: start.parse().ok()?,
        pidns: pidns.parse().ok()?,
        created: created.parse().ok()?,
    })
}

/// Whether the run that made `tag` is provably gone (see the module doc).
pub fn is_dead(tag: &str) -> bool {
    dead_in(Path::new("/proc"), &ME, tag, now_secs())
}

/// [`is_dead`] with `/proc` at `proc`, this process `me` and the time `now`.
pub fn dead_in(proc: &Path, me: &Me, tag: &str, now: u64) -> bool {
    let Some(t) = parse(tag) else {
        return false;
    };
    let same_ns = me.pidns != 0 && t.pidns == me.pidns && t.start != 0;
    if !same_ns {
        return now > t.created.saturating_add(MAX_RUN.as_secs());
    }
    if t.pid == me.pid && t.start == me.start {
        return false; // ours
    }
    match std::fs::read_to_string(proc.join(t.pid.to_string()).join("stat")) {
        Err(e) => e.kind() == io::ErrorKind::NotFound,
        Ok(s) => match parse_stat(&s) {
            Some((state, start)) => matches!(state, 'Z' | 'X' | 'x') || start != t.start,
            None => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, state: char, start: u64) -> String {
        // 52 fields, as the kernel writes them; the command may hold spaces and parentheses.
        let mut f = vec!["0".to_string(); 50];
        f[0] = state.to_string();
        f[19] = start.to_string();
        format!("{pid} (a) b) {}\n", f.join(" "))
    }

    fn proc_with(entries: &[(u32, char, u64)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for &(pid, state, start) in entries {
            let p = d.path().join(pid.to_string());
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("stat"), stat(pid, state, start)).unwrap();
        }
        d
    }

    const ME_: Me = Me {
        pid: 10,
        start: 500,
        pidns: 4026531836,
    };

    #[test]
    fn parses_only_the_full_tag() {
        assert_eq!(
            parse("istio-explain-12-345-4026531836-1700000000-3"),
            Some(Tag {
                pid: 12,
                start: 345,
                pidns: 4026531836,
                created: 1700000000
            })
        );
        assert_eq!(parse("istio-explain-123-4"), None);
        assert_eq!(parse("istio-explain-x-1-2-3-4"), None);
        assert_eq!(parse("istio-output"), None);
    }

    #[test]
    fn parses_the_start_time_after_the_last_parenthesis() {
        assert_eq!(parse_stat(&stat(7, 'S', 98765)), Some(('S', 98765)));
    }

    #[test]
    fn in_our_pid_namespace_only_a_gone_zombie_or_reused_pid_is_dead() {
        let p = proc_with(&[(20, 'S', 700), (21, 'Z', 701), (22, 'S', 999)]);
        let ns = ME_.pidns;
        let now = 1_700_000_000;
        let tag = |pid, start| format!("istio-explain-{pid}-{start}-{ns}-{now}-0");
        assert!(!dead_in(p.path(), &ME_, &tag(20, 700), now), "alive");
        assert!(dead_in(p.path(), &ME_, &tag(21, 701), now), "zombie");
        assert!(dead_in(p.path(), &ME_, &tag(22, 702), now), "pid reused");
        assert!(dead_in(p.path(), &ME_, &tag(23, 703), now), "gone");
        assert!(!dead_in(p.path(), &ME_, &tag(10, 500), now), "ours");
        // Alive stays alive however old.
        assert!(!dead_in(p.path(), &ME_, &tag(20, 700), now + 86400));
    }

    #[test]
    fn from_another_pid_namespace_only_age_proves_death() {
        // pid 20 exists here, pid 23 does not: neither says anything about the other namespace.
        let p = proc_with(&[(20, 'S', 700)]);
        let now = 1_700_000_000;
        let max = MAX_RUN.as_secs();
        for pid in [20, 23] {
            let tag = format!("istio-explain-{pid}-700-4026532999-{now}-0");
            assert!(!dead_in(p.path(), &ME_, &tag, now));
            assert!(!dead_in(p.path(), &ME_, &tag, now + max));
            assert!(dead_in(p.path(), &ME_, &tag, now + max + 1));
        }
        // Our own namespace unknown (our /proc is another namespace's): the same.
        let blind = Me {
            start: 0,
            pidns: 0,
            ..ME_
        };
        let tag = format!("istio-explain-23-703-{}-{now}-0", ME_.pidns);
        assert!(!dead_in(p.path(), &blind, &tag, now + 5));
        assert!(dead_in(p.path(), &blind, &tag, now + max + 1));
        // Tags of earlier versions: never.
        assert!(!dead_in(p.path(), &ME_, "istio-explain-23-0", u64::MAX));
    }

    #[test]
    fn this_process_is_known_under_its_own_proc() {
        let me = me_in(Path::new("/proc"));
        assert_eq!(me.pid, std::process::id());
        assert_ne!(me.start, 0);
        assert_ne!(me.pidns, 0);
        let t = parse(&unique_name()).unwrap();
        assert_eq!((t.pid, t.start, t.pidns), (me.pid, me.start, me.pidns));
        assert!(!is_dead(&unique_name()));
    }
}
