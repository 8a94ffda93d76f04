//! `istio-nftables status`: the node's enrollment report. Every pod on the node, what it should
//! get and why, what it has (its rules: ok, drifted, missing, on both backends; ambient: acked
//! by ztunnel, in the host probe set), when the daemon last programmed or repaired it, and a
//! summary; from the node daemon (`<run_dir>/status.sock`, `cni_config::status`), else from
//! the kernel alone ([`kernel`]). Rendering is pure ([`render`]).

pub mod kernel;
pub mod render;

use clap::{CommandFactory, FromArgMatches, Parser};
use cni_config::status::Report;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use uds_http::client::request;

const ABOUT: &str = "The node's enrollment report: every pod on the node, what it should get and \
                     why, what it has, when it was last programmed or repaired, and a summary.";

const AFTER_HELP: &str = "\
Run on the node, as root. The report comes from the node daemon (install-cni, its status.sock in
the run dir): what each pod should get (the plugin's decision and its reason) and what it has (its
live rules compared with its plan: ok, drifted, missing, both_backends; for ambient pods whether
ztunnel acknowledged it and its IPs are in the host probe set). When the daemon does not answer,
the report is the kernel's alone: one row per network namespace with the rules of ours it holds,
and what each should get is unknown.

Exit status: 0 every pod that should be captured is; 1 a pod that should be captured is not (also
without the daemon: a namespace with our rules on both backends); 2 bad input, or --pod names no
pod on this node; 3 the daemon did not answer and nothing the kernel shows is provably wrong
(whether every pod is captured cannot be told without it).";

/// The daemon checks every pod's rules for a report: a large node takes a while.
const TIMEOUT: Duration = Duration::from_secs(60);
const UNKNOWN: u8 = 3;

#[derive(Parser, Debug)]
struct StatusArgs {
    /// One pod (NAMESPACE/NAME) instead of the whole node.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pod: Option<String>,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// The daemon's run dir (its status.sock).
    #[arg(long, env = "CNI_AGENT_RUN_DIR", default_value = cni_config::DEFAULT_RUN_DIR)]
    run_dir: PathBuf,
    /// Do not ask the daemon: the kernel's view alone.
    #[arg(long)]
    kernel: bool,
    /// The host's /proc (the kernel's view: network namespaces with a process).
    #[arg(long, default_value = "/proc", value_name = "DIR")]
    proc_root: PathBuf,
    /// Where named network namespaces are bound (the kernel's view).
    #[arg(long, default_value = "/var/run/netns", value_name = "DIR")]
    netns_dir: PathBuf,
}

fn parse(argv: Vec<String>) -> StatusArgs {
    let cmd = StatusArgs::command()
        .name("istio-nftables status")
        .bin_name("istio-nftables status")
        .about(ABOUT)
        .after_help(AFTER_HELP);
    let matches = cmd.get_matches_from(std::iter::once("istio-nftables status".into()).chain(argv));
    StatusArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// What the daemon said.
enum Asked {
    Report(Box<Report>),
    /// Its answer ends the command (`--pod` not on the node, a bad query): message, status.
    Refused(String, u8),
    /// No report from it (not running, not ready): why.
    NoAnswer(String),
}

fn ask(a: &StatusArgs, pod: Option<(&str, &str)>) -> Asked {
    let socket = a.run_dir.join(cni_config::status::STATUS_SOCKET);
    let path = cni_config::status::path(pod);
    let answer = match request(&socket, uds_http::Method::GET, &path, Vec::new(), TIMEOUT) {
        Ok(a) => a,
        Err(e) => return Asked::NoAnswer(e.to_string()),
    };
    match answer.status {
        200 => match serde_json::from_slice::<Report>(&answer.body) {
            Ok(r) => Asked::Report(Box::new(r)),
            Err(e) => Asked::NoAnswer(format!(
                "{}: its report cannot be read: {e}",
                socket.display()
            )),
        },
        400 | 404 => Asked::Refused(answer.text(), 2),
        code => Asked::NoAnswer(format!("{}: {code} {}", socket.display(), answer.text())),
    }
}

/// `argv`: the arguments after `status`.
pub fn main(argv: Vec<String>) -> ExitCode {
    let a = parse(argv);
    crate::init_logging();
    let pod = match a.pod.as_deref().map(crate::pod::parse).transpose() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("istio-nftables status: {e}");
            return ExitCode::from(2);
        }
    };
    let asked = match a.kernel {
        true => Asked::NoAnswer("--kernel: not asked".into()),
        false => ask(&a, pod.as_ref().map(|(n, p)| (n.as_str(), p.as_str()))),
    };
    let report = match asked {
        Asked::Report(r) => *r,
        Asked::Refused(why, code) => {
            eprintln!("istio-nftables status: {why}");
            return ExitCode::from(code);
        }
        Asked::NoAnswer(why) if pod.is_some() => {
            eprintln!(
                "istio-nftables status: --pod needs the node daemon (pods are named by its pod cache), which did not answer: {why}; `istio-nftables status` alone shows the kernel's view"
            );
            return ExitCode::from(UNKNOWN);
        }
        Asked::NoAnswer(why) => {
            eprintln!(
                "istio-nftables status: the node daemon did not answer ({why}); reporting what the kernel alone shows"
            );
            match kernel::report(&a.proc_root, &a.netns_dir, &why) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("istio-nftables status: {e}");
                    return ExitCode::from(UNKNOWN);
                }
            }
        }
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("plain types serialize")
        );
    } else {
        print!("{}", render::text(&report));
    }
    ExitCode::from(render::exit_code(&report))
}
