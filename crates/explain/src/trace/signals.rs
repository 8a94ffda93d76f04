//! SIGINT/SIGTERM during a trace: recorded instead of killing the process, so the temporary
//! chain is always removed. Installed while at least one trace runs; the previous handlers
//! are restored when the last one ends.

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

/// The signal received (0 = none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// Write end of the self-pipe (-1 = none): wakes a waiting `poll` at once.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

struct Installed {
    users: usize,
    old_int: SigAction,
    old_term: SigAction,
    read: OwnedFd,
    _write: OwnedFd,
}

static STATE: Mutex<Option<Installed>> = Mutex::new(None);

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; a full pipe just drops the byte.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
}

/// While alive, SIGINT and SIGTERM are caught (see [`Guard::received`]).
pub struct Guard {
    wake: i32,
}

impl Guard {
    pub fn install() -> std::io::Result<Guard> {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = state.as_mut() {
            s.users += 1;
            return Ok(Guard {
                wake: s.read.as_raw_fd(),
            });
        }
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        WAKE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
        RECEIVED.store(0, Ordering::SeqCst);
        let act = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler only touches atomics and calls write(2).
        let old_int = unsafe { sigaction(Signal::SIGINT, &act) }?;
        let old_term = match unsafe { sigaction(Signal::SIGTERM, &act) } {
            Ok(o) => o,
            Err(e) => {
                // SAFETY: restoring what was there.
                let _ = unsafe { sigaction(Signal::SIGINT, &old_int) };
                return Err(e.into());
            }
        };
        let wake = read.as_raw_fd();
        *state = Some(Installed {
            users: 1,
            old_int,
            old_term,
            read,
            _write: write,
        });
        Ok(Guard { wake })
    }

    /// A descriptor that becomes readable when a signal arrives (for `poll`).
    pub fn wake_fd(&self) -> i32 {
        self.wake
    }

    /// The signal received since the handlers were installed, if any.
    pub fn received(&self) -> Option<i32> {
        match RECEIVED.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = state.as_mut() else { return };
        s.users -= 1;
        if s.users > 0 {
            return;
        }
        let s = state.take().expect("checked above");
        // SAFETY: restoring the handlers that were installed before ours.
        unsafe {
            let _ = sigaction(Signal::SIGINT, &s.old_int);
            let _ = sigaction(Signal::SIGTERM, &s.old_term);
        }
        WAKE_FD.store(-1, Ordering::SeqCst);
        // A signal caught here is not lost: the caller sees `Interrupted` and exits.
    }
}
