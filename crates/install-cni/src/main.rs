//! `install-cni`, the node daemon (the istio-cni DaemonSet's container): reads Istio's
//! environment and flags into each job's settings and runs the jobs the library crates own,
//! sharing one view of the node: `cni_installer` (installs and repairs the plugin),
//! `node_view` (the API client, the one pod and namespace watch, running pods through the host's
//! /proc), `guardian` (repair, reconcile, controller mode) and `ambient_agent` (ambient pods,
//! ZDS to ztunnel), with `node_status` serving readiness, health and metrics. The wiring is in
//! the `install_cni` library (`config`, `daemon`); this file is the process.

use clap::Parser;
use install_cni::config::{Args, Config, env_vars};
use std::process::ExitCode;

/// Threads for the blocking work (entering pods' namespaces to program or check rules). A
/// burst of 100 ambient ADDs once started 100 of them: each took a malloc arena (RSS 28 MB
/// with 500 pods), and on a node's few cores they only queued for the CPU. Work beyond this
/// waits in tokio's queue; a pod's own operations stay ordered by the agent's per-pod lock.
/// The cost: a thread waiting for a namespace lock held by another process (at most the
/// agent's 10 s `LOCK_WAIT`) is one of the 8, so only 8 such hung holders at once delay others.
const BLOCKING_THREADS: usize = 8;

fn init_logging(level: &str) {
    // Istio's levels include panic/fatal; tracing's lowest is error.
    let level = match level {
        "panic" | "fatal" => "error",
        l => l,
    };
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    // clap exits with status 2 and a message naming the flag/variable on unparseable values.
    let args = Args::parse();
    if args.list_env {
        for v in env_vars() {
            println!("{v}");
        }
        return ExitCode::SUCCESS;
    }
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("install-cni: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&cfg.log_level);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("install-cni: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(install_cni::daemon::main(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
