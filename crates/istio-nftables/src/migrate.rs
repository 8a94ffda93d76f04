//! `istio-nftables migrate`: move a running pod's rules to the other backend in place, with no
//! moment where a new connection escapes capture (`redirect::migrate`).

use crate::args::{Args, Settings};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use redirect::{Backend, BackendChoice};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

const AFTER_HELP: &str = "\
The pod's configuration is given with the usual istio-iptables flags (the ones its rules were
programmed with): the new backend's rules are built from them and must match exactly before the
old ones are removed.

Exit status: 0 migrated (or already on the target backend); 1 the migration failed (the message
says what the namespace holds now: when the new rules could not be programmed, the old ones are
untouched); 2 bad input (the message names the argument and value).";

const ABOUT: &str = "Move a running pod's redirect rules to another backend in place: the new \
                     rules are programmed and verified first, then the old ones removed, all \
                     under the namespace's lock.";

/// The command's name and texts are set in [`parse`]: the flattened [`Args`] brings the plain
/// command's own, which would win over attributes here.
#[derive(Parser, Debug)]
pub struct MigrateArgs {
    /// The backend to move the pod's rules to.
    #[arg(long = "to", value_enum, value_name = "BACKEND")]
    to: Target,
    #[command(flatten)]
    pod: Args,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Target {
    Nft,
    IptablesLegacy,
}

impl From<Target> for Backend {
    fn from(t: Target) -> Backend {
        match t {
            Target::Nft => Backend::Nft,
            Target::IptablesLegacy => Backend::IptablesLegacy,
        }
    }
}

/// `argv`: the arguments after `migrate`.
pub fn main(argv: Vec<String>) -> ExitCode {
    let args = parse(argv);
    crate::init_logging();
    let to = Backend::from(args.to);
    let settings = match args
        .pod
        .settings()
        .map_err(|e| e.to_string())
        .and_then(|s| {
            refuse_other_modes(&s, to)?;
            Ok(s)
        }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("istio-nftables migrate: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(netns) = settings.network_namespace.as_deref() else {
        eprintln!(
            "istio-nftables migrate: --network-namespace: required (the pod's namespace, e.g. /var/run/netns/NAME)"
        );
        return ExitCode::from(2);
    };
    run(&settings, netns, to)
}

/// Parses or exits (status 2 on bad input, as clap does; 0 for --help).
fn parse(argv: Vec<String>) -> MigrateArgs {
    let cmd = MigrateArgs::command()
        .name("istio-nftables migrate")
        .bin_name("istio-nftables migrate")
        .about(ABOUT)
        .long_about(ABOUT)
        .after_help(AFTER_HELP);
    let matches =
        cmd.get_matches_from(std::iter::once("istio-nftables migrate".into()).chain(argv));
    MigrateArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The flags that choose another mode of the plain command make no sense here.
fn refuse_other_modes(s: &Settings, to: Backend) -> Result<(), String> {
    let modes = [
        ("--check", s.check),
        ("--cleanup-only", s.cleanup_only),
        ("--dry-run", s.dry_run),
        ("--skip-rule-apply", s.skip_rule_apply),
        ("--run-validation", s.run_validation),
    ];
    if let Some((flag, _)) = modes.iter().find(|(_, on)| *on) {
        return Err(format!("{flag}: not used by migrate"));
    }
    match s.backend {
        BackendChoice::Fixed(b) if b != to => Err(format!(
            "--backend (or FORCE_IPTABLES_BINARY / --native-nftables / REDIRECT_BACKEND): {b} contradicts --to {to}"
        )),
        _ => Ok(()),
    }
}

fn run(s: &Settings, netns: &Path, to: Backend) -> ExitCode {
    let facts = match redirect::read_facts(Some(netns), Some(Path::new("/etc/resolv.conf"))) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("istio-nftables migrate: {e}");
            return ExitCode::from(1);
        }
    };
    let plan = match capture::Plan::build(&s.config, &facts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("istio-nftables migrate: {e}");
            return ExitCode::from(2);
        }
    };
    for w in &plan.warnings {
        tracing::warn!("{w}");
    }
    let started = Instant::now();
    let deadline = started + redirect::DEFAULT_LOCK_WAIT;
    match redirect::migrate(&plan, Some(netns), to, deadline) {
        Ok(m) => {
            println!("{}: {m} ({:.1?})", netns.display(), started.elapsed());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("istio-nftables migrate: {}: {e}", netns.display());
            ExitCode::from(1)
        }
    }
}
