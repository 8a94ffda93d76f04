//! `istio-nftables`: a drop-in for `istio-iptables` (same flags, env vars and defaults) that
//! programs the redirect as one nftables netlink batch, or with iptables-legacy.

mod args;
mod explain;
mod migrate;
mod pod;
mod validation;

use args::Args;
use clap::Parser;
use redirect::{Backend, BackendChoice};
use std::process::ExitCode;

/// istio-iptables' exit code when the validation probe fails.
const VALIDATION_FAILED: u8 = 126;

fn main() -> ExitCode {
    // `istio-nftables explain …` and `… migrate …` are their own commands; everything else is
    // istio-iptables' flags.
    let mut argv = std::env::args();
    match argv.nth(1).as_deref() {
        Some("explain") => return explain::main(argv.collect()),
        Some("migrate") => return migrate::main(argv.collect()),
        _ => {}
    }
    let args = Args::parse();
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
