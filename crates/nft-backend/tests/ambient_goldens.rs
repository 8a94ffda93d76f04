//! Golden parity with Istio's 14 ambient nftables goldens (../shared/golden/nftables/
//! cni-ambient), on the real kernel, exactly as `istio_goldens.rs` does for the sidecar:
//! Istio's golden is loaded with `nft -f` into one fresh namespace, ours goes through our
//! netlink batch into another (in-pod: `nft_backend::apply`; host: `ambient_host::ensure`),
//! and the two `nft list ruleset` are compared after the normalisation of `common/norm.rs`
//! (every step one deviation of nft/DEVIATIONS.md) plus deviation 7 below.
//!
//! Our listings are also checked in byte for byte as `nft/listings/ambient-<case>.nft`
//! (`UPDATE_LISTINGS=1` rewrites them).

#[path = "common/norm.rs"]
mod norm;

use capture::Plan;
use golden::AmbientCase;
use std::collections::BTreeMap;

#[path = "common/cases.rs"]
mod cases;

use cases::{ambient_goldens, listings_dir};

fn is_host(plan: &Plan) -> bool {
    !plan.sets.is_empty()
}

/// Programs the plan through netlink into a fresh namespace; `nft list ruleset` there.
fn our_listing(plan: &Plan) -> String {
    testbed::require_root();
    let ns = testbed::TestNetns::with_prefix("amb-ours").unwrap();
    netns::run_in(Some(ns.path()), || {
        if is_host(plan) {
            nft_backend::ambient_host::ensure(plan)
        } else {
            nft_backend::apply(plan).map(|_| ())
        }
    })
    .unwrap()
    .unwrap();
    ns.exec_ok("nft", &["list", "ruleset"]).unwrap()
}

/// The sets Istio's host rule refers to, as its `HostNftSetManager` creates them before the
/// rule (the golden holds only the rule).
fn istio_host_sets(plan: &Plan) -> String {
    let mut out = String::from("add table inet istio-ambient-nat\n");
    for s in &plan.sets {
        out.push_str(&format!(
            "add set inet istio-ambient-nat {} {{ type {}; comment \"UUID of the pods that are part of ambient mesh\"; }}\n",
            s.name,
            if s.v6 { "ipv6_addr" } else { "ipv4_addr" }
        ));
    }
    out
}

/// Loads Istio's golden with `nft -f` (as knftables does) into a fresh namespace.
fn istio_listing(case: &AmbientCase) -> String {
    let golden = std::fs::read_to_string(&case.golden).unwrap();
    let text = if is_host(&case.plan) {
        istio_host_sets(&case.plan) + &golden + "\n"
    } else {
        golden + "\n"
    };
    let file = std::env::temp_dir().join(format!(
        "istio-ambient-{}-{}.nft",
        std::process::id(),
        case.name
    ));
    std::fs::write(&file, text).unwrap();
    let ns = testbed::TestNetns::with_prefix("amb-istio").unwrap();
    let loaded = ns.exec_ok("nft", &["-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    loaded.unwrap();
    ns.exec_ok("nft", &["list", "ruleset"]).unwrap()
}

/// Deviation 7: our host rule sits in its own chain `istio-postrouting`, which the base chain
/// `postrouting` jumps to unconditionally (as iptables' `ISTIO_POSTRT`); Istio's nft mode
/// writes it into `postrouting` directly. A base chain whose only rule is an unconditional
/// jump behaves exactly as if the target's rules were in it, so the target is inlined (and
/// must be jumped to from nowhere else).
fn inline_sole_jumps(rs: &mut norm::Ruleset) {
    let keys: Vec<(String, String)> = rs.keys().cloned().collect();
    for key in keys {
        let target = match rs[&key].rules.as_slice() {
            [only] if only.matches.is_empty() && rs[&key].base.is_some() => {
                only.stmts[0].strip_prefix("jump ").map(str::to_string)
            }
            _ => None,
        };
        let Some(target) = target else { continue };
        let tkey = (key.0.clone(), target.clone());
        let jumpers = rs
            .iter()
            .filter(|(k, _)| k.0 == key.0)
            .flat_map(|(_, c)| &c.rules)
            .filter(|r| r.stmts.iter().any(|s| *s == format!("jump {target}")))
            .count();
        if key.1 == "postrouting" && jumpers == 1 {
            let inlined = rs.remove(&tkey).expect("jump target exists").rules;
            rs.get_mut(&key).unwrap().rules = inlined;
        }
    }
}

#[test]
fn istio_ambient_nft_goldens_match_after_documented_normalisation() {
    let gids = BTreeMap::new();
    let mut failures = Vec::new();
    let cases = ambient_goldens();
    for case in &cases {
        let ours = our_listing(&case.plan);
        let istio = istio_listing(case);
        let ctx = norm::Ours {
            ipv6: case.plan.ipv6,
            drop_invalid: false,
            gid_names: &gids,
        };
        let mut ours = norm::ours(&ours, &ctx);
        inline_sole_jumps(&mut ours);
        let problems = norm::compare(&norm::istio(&istio), &ours);
        if !problems.is_empty() {
            failures.push(format!("== {}\n  {}", case.name, problems.join("\n  ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} ambient cases differ from Istio's nft mode beyond the documented deviations:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn our_ambient_listings_are_checked_in() {
    let update = std::env::var_os("UPDATE_LISTINGS").is_some_and(|v| v == "1");
    let dir = listings_dir();
    let cases = ambient_goldens();
    let mut failures = Vec::new();
    for case in &cases {
        let live = our_listing(&case.plan);
        let file = dir.join(format!("ambient-{}.nft", case.name));
        if update {
            std::fs::write(&file, &live).unwrap();
            continue;
        }
        match std::fs::read_to_string(&file) {
            Ok(expected) if expected == live => {}
            Ok(expected) => failures.push(format!(
                "{}:\n--- file\n{expected}--- live\n{live}",
                file.display()
            )),
            Err(e) => failures.push(format!("{}: {e}", file.display())),
        }
    }
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if let Some(name) = stem.strip_prefix("ambient-")
            && !cases.iter().any(|c| c.name == name)
        {
            failures.push(format!("{}: no such case", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "live listings differ from nft/listings (regenerate with UPDATE_LISTINGS=1 \
         cargo test -p nft-backend --test ambient_goldens our_ambient_listings_are_checked_in):\n{}",
        failures.join("\n")
    );
}

/// What `--dry-run` would print for an ambient plan (`render_text`) is what the batch
/// programs: loaded with `nft -f`, it lists exactly as our netlink batch does.
#[test]
fn dry_run_text_of_ambient_plans_loads_to_the_same_ruleset() {
    let mut failures = Vec::new();
    for case in ambient_goldens() {
        let text = nft_backend::render_text(&case.plan);
        let file = std::env::temp_dir().join(format!(
            "ours-ambient-{}-{}.nft",
            std::process::id(),
            case.name
        ));
        std::fs::write(&file, &text).unwrap();
        let ns = testbed::TestNetns::with_prefix("amb-text").unwrap();
        let loaded = ns.exec_ok("nft", &["-f", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        if let Err(e) = loaded {
            failures.push(format!(
                "{}: nft -f refused our text: {e}\n{text}",
                case.name
            ));
            continue;
        }
        let from_text = ns.exec_ok("nft", &["list", "ruleset"]).unwrap();
        if from_text != our_listing(&case.plan) {
            failures.push(format!("{}: listing differs:\n{from_text}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
