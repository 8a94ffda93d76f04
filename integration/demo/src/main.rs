//! The README's main job: the whole product, in its three modes, each on a node of its own.
//!
//! 1. **Sidecar pods on an nftables node** ([`sidecar`]): a node namespace with a host layout
//!    (bin dir, conf dir with Debian's bridge + host-local + portmap conflist, service-account
//!    dir, run dir); the real `install-cni` chains istio-cni into the conflist; a local API
//!    server serves the demo pods; `cnitool` ADDs each pod through the whole chain as kubelet
//!    would. The `nft list ruleset` a node admin sees, a table of real connections and where
//!    they landed, CHECK, a primary-CNI rewrite repaired, DEL and SIGTERM.
//! 2. **The same pods on an iptables-legacy node** ([`legacy`]): the fallback's rules
//!    (`iptables-legacy-save`), no nftables table in the pod, the same connections.
//! 3. **Ambient pods with Istio's real ztunnel** ([`ambient`]): two pods talking over HBONE
//!    (ztunnel's mutual-TLS counter), a non-mesh destination passed through, kubelet's probe.
//!
//! and one `istio-nftables explain` answer per mode. Usage: `demo [bin dir]` (default: the
//! directory of this binary). Exit 0 when everything landed as expected.

mod ambient;
mod legacy;
mod sidecar;

use std::path::Path;
use std::process::{Command, ExitCode};
use testbed::cni::Run;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    if let Some(d) = std::env::args().nth(1) {
        // SAFETY: single-threaded at this point.
        unsafe { std::env::set_var("ISTIO_CNI_BIN_DIR", d) };
    }
    let started = std::time::Instant::now();
    let mut all_ok = true;
    for (title, section) in [
        (
            "1. sidecar pods on an nftables node",
            sidecar::run as fn() -> Res<bool>,
        ),
        ("2. the same pods on an iptables-legacy node", legacy::run),
        ("3. ambient pods with Istio's ztunnel", ambient::run),
    ] {
        println!("\n################ {title}\n");
        match section() {
            Ok(good) => all_ok &= good,
            Err(e) => {
                println!("FAILED: {e}");
                all_ok = false;
            }
        }
    }
    println!(
        "\n{} ({:.1} s)",
        if all_ok {
            "all pods got the rules Istio gives them, and every connection landed where Istio sends it"
        } else {
            "SOMETHING DID NOT GO AS EXPECTED (see MISMATCH / FAILED above)"
        },
        started.elapsed().as_secs_f64()
    );
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn ms(r: &Run) -> String {
    format!("{:.1} ms", r.elapsed.as_secs_f64() * 1000.0)
}

fn ok(r: &Run, what: &str) -> Res<()> {
    if r.ok {
        Ok(())
    } else {
        Err(format!("{what} failed:\n{}{}", r.stdout, r.stderr).into())
    }
}

/// Runs `istio-nftables explain` as an admin would and prints its answer; true when it
/// explained (and, with `--trace`, the kernel agreed).
fn explain(bins: &Path, args: &[&str]) -> Res<bool> {
    let cli = bins.join("istio-nftables");
    println!("\n$ istio-nftables explain {}", args.join(" "));
    let out = Command::new(cli).arg("explain").args(args).output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        println!("FAILED: explain exited {:?}", out.status.code());
    }
    Ok(out.status.success())
}

/// A section's closing line.
fn verdict(good: bool) -> &'static str {
    if good { "ok" } else { "FAILED" }
}
