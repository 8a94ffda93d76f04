//! The root-free tier (no root, no kernel): every golden's plan → `nft_ir` → text, the text
//! `--dry-run` prints (`render_text`), checked
//!
//! * against our checked-in listing `nft/listings/<case>.nft`, which the kernel tier
//!   (`istio_goldens.rs`, `ambient_goldens.rs`) keeps equal byte for byte to `nft list ruleset`
//!   after our batch: the rendered rules must be the listed ones, in order, clause for clause,
//!   comments included; and
//! * for every sidecar golden with Istio's kernel listing (24 of the 28), against Istio's
//!   listing after the same documented normalisation as the kernel tier (`common/norm.rs`).
//!
//! Two differences between `nft -f` text and `nft list` are undone first, on both sides where
//! they appear: `nft list` writes standard priorities by name (`dstnat`, `mangle`, …), and
//! leaves out a protocol match a header match implies (`meta l4proto tcp` before `tcp dport`,
//! `meta nfproto ipv4` before `ip daddr`), exactly as nft's own listing does.

#[path = "common/norm.rs"]
mod norm;

use capture::{Facts, Plan};
use std::collections::BTreeMap;

#[path = "common/cases.rs"]
mod cases;

use cases::{GROUP_NAMES, listings_dir};

/// One case: its listing's stem, its plan, and what the normalisation needs to know.
struct Case {
    name: String,
    plan: Plan,
    drop_invalid: bool,
    /// Istio's kernel listing, when shipped.
    istio: Option<String>,
}

/// The sidecar goldens (with Istio's kernel listing where it ships one) and the CNI defaults.
fn sidecar_cases() -> Vec<Case> {
    let istio_listing = |name: &str| {
        let file = golden::golden_dir().join(format!("nftables/kernel-listing/{name}.nft"));
        std::fs::read_to_string(file).ok()
    };
    cases::sidecar_goldens()
        .into_iter()
        .chain(cases::cni_defaults())
        .map(|c| Case {
            plan: Plan::build(&c.cfg, &Facts::default()).unwrap(),
            drop_invalid: c.cfg.drop_invalid,
            istio: istio_listing(&c.name),
            name: c.name,
        })
        .collect()
}

fn ambient_cases() -> Vec<Case> {
    cases::ambient_goldens()
        .into_iter()
        .map(|c| Case {
            name: format!("ambient-{}", c.name),
            plan: c.plan,
            drop_invalid: false,
            istio: None,
        })
        .collect()
}

/// Standard priorities by number, as `nft -f` text writes them.
fn numeric_priorities(text: &str) -> String {
    [
        ("dstnat", "-100"),
        ("srcnat", "100"),
        ("mangle", "-150"),
        ("raw", "-300"),
        ("filter", "0"),
    ]
    .iter()
    .fold(text.to_string(), |t, (name, n)| {
        t.replace(&format!("priority {name};"), &format!("priority {n};"))
    })
}

/// A rule line without the protocol matches its header matches imply (as `nft list` writes it).
fn implied_dropped(line: &str) -> String {
    let (rule, comment) = match line.find(" comment \"") {
        Some(i) => line.split_at(i),
        None => (line, ""),
    };
    let mut rule = format!(" {}", rule.trim_start());
    for (dep, needs) in [
        ("meta l4proto tcp ", ["tcp dport", "tcp sport"]),
        ("meta l4proto udp ", ["udp dport", "udp sport"]),
        ("meta nfproto ipv4 ", ["ip daddr", "ip saddr"]),
        ("meta nfproto ipv6 ", ["ip6 daddr", "ip6 saddr"]),
    ] {
        if needs.iter().any(|n| rule.contains(&format!(" {n} "))) {
            rule = rule.replacen(&format!(" {dep}"), " ", 1);
        }
    }
    let indent = &line[..line.len() - line.trim_start().len()];
    format!("{indent}{}{comment}", rule.trim_start())
}

/// `render_text`'s output in the form `nft list ruleset` gives the same rules.
fn as_listed(text: &str) -> String {
    numeric_priorities(text)
        .lines()
        .map(implied_dropped)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn rendered_text_is_the_kernel_listing_of_the_batch() {
    let mut failures = Vec::new();
    let cases: Vec<Case> = sidecar_cases().into_iter().chain(ambient_cases()).collect();
    for case in &cases {
        let ours = norm::parse(&as_listed(&nft_backend::render_text(&case.plan)));
        let file = listings_dir().join(format!("{}.nft", case.name));
        let listed = std::fs::read_to_string(&file).unwrap();
        let listed = norm::parse(&numeric_priorities(&listed));
        if ours != listed {
            let keys: std::collections::BTreeSet<_> = ours.keys().chain(listed.keys()).collect();
            for k in keys {
                if ours.get(k) != listed.get(k) {
                    failures.push(format!(
                        "{} {k:?}:\n  rendered: {:?}\n  listed:   {:?}",
                        case.name,
                        ours.get(k),
                        listed.get(k)
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases render other rules than the kernel lists:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn rendered_text_matches_istios_kernel_listings_after_documented_normalisation() {
    let gids: BTreeMap<u32, String> = GROUP_NAMES
        .iter()
        .map(|(n, g)| (*g, n.to_string()))
        .collect();
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in sidecar_cases() {
        let Some(istio) = &case.istio else { continue };
        let ctx = norm::Ours {
            ipv6: case.plan.ipv6,
            drop_invalid: case.drop_invalid,
            gid_names: &gids,
        };
        let ours = norm::ours(&as_listed(&nft_backend::render_text(&case.plan)), &ctx);
        let problems = norm::compare(&norm::istio(&numeric_priorities(istio)), &ours);
        if !problems.is_empty() {
            failures.push(format!("== {}\n  {}", case.name, problems.join("\n  ")));
        }
        checked += 1;
    }
    assert_eq!(checked, 24, "every shipped kernel listing is checked");
    assert!(
        failures.is_empty(),
        "{} cases differ from Istio's nft mode beyond the documented deviations:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_rule_of_every_golden_renders() {
    for case in sidecar_cases().into_iter().chain(ambient_cases()) {
        let text = nft_backend::render_text(&case.plan);
        // A rule the renderer cannot write falls back to its expressions' debug form.
        assert!(
            !text.contains("Meta {") && !text.contains("Cmp {"),
            "{}: a rule did not render:\n{text}",
            case.name
        );
    }
}
