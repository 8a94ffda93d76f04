//! `istio-cni`: reads CNI_* and stdin, prints the result or a CNI error on stdout.

use std::io::Write;
use std::panic::{self, AssertUnwindSafe};

fn print(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, v);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

fn main() {
    let stdin = match istio_cni::read_stdin(std::io::stdin().lock()) {
        Ok(stdin) => stdin,
        Err(e) => {
            eprintln!("istio-cni: {e}");
            print(&e.to_json(istio_cni::cni::LATEST_VERSION));
            std::process::exit(1);
        }
    };
    let version = serde_json::from_slice::<serde_json::Value>(&stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| istio_cni::cni::is_supported(v))
        .unwrap_or_else(|| istio_cni::cni::LATEST_VERSION.into());

    // Release builds abort on panic (workspace profile), so catch_unwind cannot help there:
    // the hook answers the runtime with a CNI error before the abort. With unwinding the hook
    // only logs and catch_unwind below produces the answer.
    let hook_version = version.clone();
    panic::set_hook(Box::new(move |info| {
        let e = istio_cni::panic_error(&info.to_string());
        eprintln!("istio-cni: {info}");
        if cfg!(panic = "abort") {
            print(&e.to_json(&hook_version));
        }
    }));

    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        istio_cni::run(|k| std::env::var_os(k), &stdin)
    }))
    .unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        istio_cni::Outcome::error(&istio_cni::panic_error(&msg), &version)
    });
    if let Some(v) = &outcome.stdout {
        print(v);
    }
    std::process::exit(outcome.exit_code);
}
