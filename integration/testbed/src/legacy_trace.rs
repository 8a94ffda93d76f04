//! What `explain --trace` may leave in an iptables-legacy pod: nothing. Shared by the trace
//! tests of the explain crate, the integration sweeps and the CLI tests.

use crate::ambient::legacy_save;
use crate::exec_at;
use std::path::Path;

/// `nft list ruleset` in the namespace (must stay empty in a legacy pod: the product never
/// puts both backends in one pod, and the legacy trace adds nothing of nft's).
pub fn nft_ruleset(netns: &Path) -> String {
    let out = exec_at(netns, "nft", &["list", "ruleset"]).expect("nft list ruleset");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The TRACE rules of `explain --trace` (tagged `istio-explain-…`), both families.
pub fn trace_rules(netns: &Path) -> Vec<String> {
    [false, true]
        .into_iter()
        .flat_map(|v6| {
            legacy_save(netns, v6)
                .lines()
                .filter(|l| l.contains("istio-explain-"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The packet loggers bound to IPv4 (2) and IPv6 (10) in the namespace, as
/// `/proc/net/netfilter/nf_log` names them (`NONE`, `nf_log_ipv4`, `nfnetlink_log`).
pub fn loggers(netns: &Path) -> [String; 2] {
    let text = crate::run_in(Some(netns), || {
        std::fs::read_to_string("/proc/thread-self/net/netfilter/nf_log").unwrap_or_default()
    })
    .expect("the namespace");
    [2, 10].map(|pf: u8| {
        text.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()?.parse::<u8>().ok()? == pf).then(|| w.next().unwrap_or("").to_string())
            })
            .unwrap_or_default()
    })
}

/// Everything a finished trace left in the legacy pod at `netns` (empty: nothing): an nft
/// table, a TRACE rule, nfnetlink_log still bound to a family.
pub fn left_in_legacy_pod(netns: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let nft = nft_ruleset(netns);
    if !nft.trim().is_empty() {
        left.push(format!("nft ruleset in a legacy pod:\n{nft}"));
    }
    left.extend(
        trace_rules(netns)
            .into_iter()
            .map(|r| format!("TRACE rule left: {r}")),
    );
    for l in loggers(netns) {
        if l == "nfnetlink_log" {
            left.push("nfnetlink_log still bound to a family".into());
        }
    }
    left
}

/// `nft monitor` running in a namespace: whatever nftables object is added, changed or
/// removed there while it runs (a legacy pod must see none, even briefly).
pub struct NftMonitor {
    child: std::process::Child,
}

impl NftMonitor {
    pub fn start(netns: &Path) -> NftMonitor {
        let child = crate::run_in(Some(netns), || {
            std::process::Command::new("nft")
                .arg("monitor")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        })
        .expect("the namespace")
        .expect("nft monitor");
        // Subscribed before anything it must see can happen.
        std::thread::sleep(std::time::Duration::from_millis(200));
        NftMonitor { child }
    }

    /// Stops it and returns what it printed (empty: nothing of nft's changed).
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let out = self.child.wait_with_output().expect("nft monitor's output");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
