//! Which pod a process belongs to, from its cgroups (`/proc/PID/cgroup`), as Istio's agent
//! tells pods apart (`podcgroupns_linux.go`, after SPIRE): kubelet puts every container of a
//! pod under a cgroup named for the pod's UID, e.g.
//!
//! - `/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/<container id>` (cgroupfs);
//! - `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod72f7f152_440c_66ac_9084_e0fc1d8a910c.slice/cri-containerd-<id>.scope`
//!   (systemd: the UID's dashes become underscores).
//!
//! A process outside kubepods (the host's, or a test's) names no pod. Pure text parsing.

/// The pod UID (canonical, with dashes) the cgroup file `text` names; `None` when no line
/// names one, or when lines name different pods (a process moved between pods is nobody's).
pub fn pod_uid(text: &str) -> Option<String> {
    let mut found: Option<String> = None;
    for line in text.lines() {
        // `hierarchy-ID:controller-list:cgroup-path`; the path may itself hold colons.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let Some(uid) = uid_in_path(path) else {
            continue;
        };
        match &found {
            Some(f) if *f != uid => return None,
            _ => found = Some(uid),
        }
    }
    found
}

/// Lengths of the UID's five hex groups.
const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];

/// The first `pod<uid>` in `path` preceded by punctuation and followed by punctuation or the
/// end, the groups separated by one punctuation character each (or none).
fn uid_in_path(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let mut from = 0;
    while let Some(i) = path[from..].find("pod").map(|i| i + from) {
        from = i + 3;
        if i == 0 || !b[i - 1].is_ascii_punctuation() {
            continue;
        }
        if let Some(uid) = uid_at(&b[i + 3..]) {
            return Some(uid);
        }
    }
    None
}

/// The UID at the start of `b`, in canonical form, if one is there and ends a segment.
fn uid_at(b: &[u8]) -> Option<String> {
    let mut at = 0;
    let mut groups: Vec<&str> = Vec::with_capacity(GROUPS.len());
    for (n, len) in GROUPS.iter().enumerate() {
        if n > 0 && b.get(at).is_some_and(u8::is_ascii_punctuation) {
            at += 1;
        }
        let group = b.get(at..at + len)?;
        if !group.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        groups.push(std::str::from_utf8(group).ok()?);
        at += len;
    }
    match b.get(at) {
        None => {}
        Some(c) if c.is_ascii_punctuation() => {}
        Some(_) => return None,
    }
    Some(groups.join("-").to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "2c48913c-b29f-11e7-9350-020968147796";

    #[test]
    fn istios_examples() {
        let cases = [
            "12:pids:/kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961",
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/docker-9bca8d63.scope",
            "0::/docker/8d461fa5/kubepods/besteffort/pod2c48913c-b29f-11e7-9350-020968147796/aff34703",
            "1:name=systemd:/kubepods-besteffort-pod2c48913c_b29f_11e7_9350_020968147796.slice:cri-containerd:b2a10285",
            "0::/../../pod2c48913c-b29f-11e7-9350-020968147796/9bca8d63",
            "0::/kubepods/pod2C48913Cb29f11e79350020968147796/x",
        ];
        for c in cases {
            assert_eq!(pod_uid(c).as_deref(), Some(UID), "{c}");
        }
    }

    #[test]
    fn no_pod_or_not_a_uid() {
        for c in [
            "0::/user.slice/user-0.slice/session-1.scope",
            "0::/system.slice/containerd.service",
            "0::/../crio-45490e76e0878aaa.scope",
            // not preceded by punctuation, a group too short, trailing hex
            "0::/kubepodspod2c48913c-b29f-11e7-9350-020968147796/x",
            "0::/kubepods/pod2c48913c-b29f-11e7-9350-02096814779/x",
            "0::/kubepods/pod2c48913c-b29f-11e7-9350-0209681477961/x",
            "garbage without colons",
            "",
        ] {
            assert_eq!(pod_uid(c), None, "{c}");
        }
    }

    #[test]
    fn hybrid_hierarchies_agree_or_name_nobody() {
        let one = format!("12:pids:/kubepods/pod{UID}/c1\n11:cpu:/\n0::/kubepods/pod{UID}/c1\n");
        assert_eq!(pod_uid(&one).as_deref(), Some(UID));
        let two = format!(
            "12:pids:/kubepods/pod{UID}/c1\n0::/kubepods/pod11111111-2222-3333-4444-555555555555/c2\n"
        );
        assert_eq!(pod_uid(&two), None);
    }
}
