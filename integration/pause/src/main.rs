//! The pod sandbox's pause process for the container-runtime e2e (packed into a local image by
//! `integration::cri::images`; no registry is reachable). Like Kubernetes' pause: holds the
//! sandbox's namespaces, reaps orphans (it is PID 1), exits on SIGINT/SIGTERM.

fn main() {
    // SAFETY: plain signal-mask and wait syscalls on a zeroed, initialised sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD] {
            libc::sigaddset(&mut set, sig);
        }
        // Blocked signals are delivered through sigwait: no handler, no race (PID 1 ignores
        // signals it has no handler for, so blocking + waiting is what makes SIGTERM work).
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut sig = 0;
            if libc::sigwait(&set, &mut sig) != 0 {
                continue;
            }
            if sig != libc::SIGCHLD {
                std::process::exit(0);
            }
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
        }
    }
}
