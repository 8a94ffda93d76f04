//! Kubernetes' name rules for the objects the plugin and the agent name in API paths and
//! logs. Checked before a name is used: `../../p1` is not a pod name, it is a path.

/// An RFC 1123 label, as Kubernetes validates namespace names.
pub fn is_namespace_name(s: &str) -> bool {
    is_dns_label(s)
}

/// An RFC 1123 subdomain, as Kubernetes validates pod names.
pub fn is_pod_name(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|l| !l.is_empty() && is_dns_label(l))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_paths_or_too_long_are_refused() {
        for ok in ["web-0", "a.b-c", "x"] {
            assert!(is_pod_name(ok), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "../../p1",
            "a/b",
            "A",
            "-a",
            "a..b",
            "a\nb",
            &"a".repeat(254),
        ] {
            assert!(!is_pod_name(bad), "{bad:?}");
        }
        assert!(is_namespace_name("istio-system"));
        for bad in ["", "a.b", "a/b", "..", &"a".repeat(64)] {
            assert!(!is_namespace_name(bad), "{bad:?}");
        }
    }
}
