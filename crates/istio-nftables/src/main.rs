//! `istio-nftables`: a drop-in for `istio-iptables` (same flags, env vars and defaults) that
//! programs the redirect as one nftables netlink batch, or with iptables-legacy.

mod args;
mod explain;
mod migrate;
mod pod;
mod status;
mod validation;

use args::Args;
use clap::{Command, CommandFactory, FromArgMatches};
use redirect::{Backend, BackendChoice};
use std::process::ExitCode;

/// istio-iptables' exit code when the validation probe fails.
const VALIDATION_FAILED: u8 = 126;

/// A command of its own beside istio-iptables' flags: `istio-nftables NAME …` hands the
/// arguments after NAME to `run`, which parses them (and its own `--help`).
struct Subcommand {
    name: &'static str,
    about: &'static str,
    run: fn(Vec<String>) -> ExitCode,
}

/// The commands `--help` lists, in its order; one row each.
const COMMANDS: &[Subcommand] = &[
    Subcommand {
        name: "explain",
        about: "Where a connection goes through a pod's live rules, and why (--trace: the kernel confirms it)",
        run: explain::main,
    },
    Subcommand {
        name: "status",
        about: "The node's enrollment report: every pod, what it should get and what it has (exit 1: a pod that should be captured is not)",
        run: status::main,
    },
    Subcommand {
        name: "migrate",
        about: "Move a running pod's rules to the other backend without a gap in capture",
        run: migrate::main,
    },
];

fn main() -> ExitCode {
    let mut argv = std::env::args();
    let first = argv.nth(1);
    if let Some(c) = COMMANDS.iter().find(|c| first.as_deref() == Some(c.name)) {
        return (c.run)(argv.collect());
    }
    let args = parse();
    init_logging();
    let settings = match args.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("istio-nftables: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&settings) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("istio-nftables: {e}");
            ExitCode::from(1)
        }
    }
}

/// istio-iptables' flags, or exits (status 2 on bad input, 0 for `--help`/`--version`).
fn parse() -> Args {
    let mut cmd = cli();
    let matches = cmd.get_matches_mut();
    if let Some(name) = matches.subcommand_name() {
        // Only reached when the command is not the first argument (`main` dispatches that).
        cmd.error(
            clap::error::ErrorKind::ArgumentConflict,
            format!("the command {name} must come first: istio-nftables {name} ..."),
        )
        .exit();
    }
    Args::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

/// The plain command's parser, with [`COMMANDS`] listed as commands. They are dispatched in
/// `main` before this parser sees the arguments, so here they only show in `--help` and usage.
fn cli() -> Command {
    COMMANDS.iter().fold(
        Args::command()
            .subcommand_value_name("COMMAND")
            .subcommand_help_heading("Commands")
            .disable_help_subcommand(true)
            // `istio-nftables -p 1 explain` is a mistake, never the plain command.
            .args_conflicts_with_subcommands(true)
            .after_help("`istio-nftables COMMAND --help` describes each command."),
        |cmd, c| cmd.subcommand(Command::new(c.name).about(c.about)),
    )
}

/// Logs to stderr (stdout carries results), level from `LOG_LEVEL` (a filter directive),
/// info without it; colours only on a terminal. Without `LOG_LEVEL` a plain level filter
/// stands in for the directive parser (a twentieth of an apply's instructions).
fn init_logging() {
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match std::env::var_os("LOG_LEVEL") {
        Some(_) => fmt
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("LOG_LEVEL")
                    .unwrap_or_else(|_| "info".into()),
            )
            .init(),
        None => fmt
            .with_max_level(tracing::level_filters::LevelFilter::INFO)
            .init(),
    }
}

fn run(s: &args::Settings) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let netns = s.network_namespace.as_deref();
    if s.cleanup_only {
        redirect::cleanup(netns)?;
        eprintln!("istio-nftables: removed our rules");
        return Ok(ExitCode::SUCCESS);
    }
    let facts = redirect::read_facts_for(
        &s.config,
        netns,
        Some(std::path::Path::new("/etc/resolv.conf")),
    )?;
    let plan = match capture::Plan::build(&s.config, &facts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("istio-nftables: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    for w in &plan.warnings {
        tracing::warn!("{w}");
    }
    if s.dry_run {
        let backend = match s.backend {
            BackendChoice::Fixed(b) => b,
            BackendChoice::Auto => redirect::detect(netns)
                .map(|d| d.backend)
                .unwrap_or(Backend::Nft),
        };
        print!("{}", redirect::dry_run(&plan, backend));
        return Ok(ExitCode::SUCCESS);
    }
    if s.check {
        let drift = redirect::check(&plan, netns, s.backend)?;
        if drift.is_empty() {
            eprintln!("istio-nftables: rules are in place");
            return Ok(ExitCode::SUCCESS);
        }
        for d in &drift {
            println!("{d}");
        }
        return Ok(ExitCode::from(1));
    }
    if !s.skip_rule_apply {
        let used = redirect::apply(&plan, netns, s.backend)?;
        tracing::info!(backend = %used.backend, reason = %used.reason, "rules programmed");
    }
    if s.run_validation {
        if let Err(e) = validation::run(&s.validation) {
            eprintln!("istio-nftables: validation failed: {e}");
            return Ok(ExitCode::from(VALIDATION_FAILED));
        }
        eprintln!("istio-nftables: validation passed");
    }
    Ok(ExitCode::SUCCESS)
}
