//! `install-cni`, the node daemon (the istio-cni DaemonSet's container): reads Istio's
//! environment and flags into each job's settings and runs the jobs the library crates own,
//! sharing one view of the node: `cni_installer` (installs and repairs the plugin),
//! `node_view` (the API client, the one pod and namespace watch, running pods through the host's
//! /proc), `guardian` (repair, reconcile, controller mode) and `ambient_agent` (ambient pods,
//! ZDS to ztunnel), with `node_status` serving readiness, health and metrics. The wiring is in
//! the `install_cni` library (`config`, `daemon`); this file is the process.

use clap::Parser;
use install_cni::config::logging::{LogTarget, Logging};
use install_cni::config::{Args, Config, env_vars};
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// Threads for the blocking work (entering pods' namespaces to program or check rules). A
/// burst of 100 ambient ADDs once started 100 of them: each took a malloc arena (RSS 28 MB
/// with 500 pods), and on a node's few cores they only queued for the CPU. Work beyond this
/// waits in tokio's queue; a pod's own operations stay ordered by the agent's per-pod lock.
/// The cost: a thread waiting for a namespace lock held by another process (at most the
/// agent's 10 s `LOCK_WAIT`) is one of the 8, so only 8 such hung holders at once delay others.
const BLOCKING_THREADS: usize = 8;

/// One writer per line for every `--log_target` (stdout, stderr, files opened for append).
#[derive(Clone)]
struct Targets(Arc<Vec<Target>>);

enum Target {
    Stdout,
    Stderr,
    File(Mutex<std::fs::File>),
}

impl Targets {
    fn open(targets: &[LogTarget]) -> Result<Targets, String> {
        let mut out = Vec::new();
        for t in targets {
            out.push(match t {
                LogTarget::Stdout => Target::Stdout,
                LogTarget::Stderr => Target::Stderr,
                LogTarget::File(p) => Target::File(Mutex::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(p)
                        .map_err(|e| format!("invalid --log_target={}: {e}", p.display()))?,
                )),
            });
        }
        Ok(Targets(Arc::new(out)))
    }
}

impl Write for Targets {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    /// A line is written whole to each target; a failing target does not stop the others.
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        for t in self.0.iter() {
            let _ = match t {
                Target::Stdout => std::io::stdout().lock().write_all(buf),
                Target::Stderr => std::io::stderr().lock().write_all(buf),
                Target::File(f) => f.lock().unwrap_or_else(|e| e.into_inner()).write_all(buf),
            };
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn init_logging(l: &Logging) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&l.filter)
        .map_err(|e| format!("log filter {:?}: {e}", l.filter))?;
    let targets = Targets::open(&l.targets)?;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || targets.clone())
        .with_ansi(false)
        .with_target(false)
        .with_file(l.caller)
        .with_line_number(l.caller);
    if l.json {
        fmt.json().flatten_event(true).init();
    } else {
        fmt.init();
    }
    for w in &l.warnings {
        tracing::warn!("{w}");
    }
    Ok(())
}

fn main() -> ExitCode {
    // Istio's `install-cni version` subcommand (its chart never passes it; tools and people do).
    if std::env::args_os().nth(1).is_some_and(|a| a == "version") {
        println!("install-cni version {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
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
    if let Err(e) = init_logging(&cfg.logging) {
        eprintln!("install-cni: configuration error: {e}");
        return ExitCode::from(2);
    }
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
