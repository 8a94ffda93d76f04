//! Waiting for the traced packet, for either backend: lets the connection go, feeds what the
//! kernel reports to a collector until the attempt is over and the reports have settled (or
//! the wait runs out), and stops at once on SIGINT/SIGTERM.

use super::{Attempt, CONNECT_TIMEOUT, TraceError, TraceHow, connect, signals};
use std::time::{Duration, Instant};

/// After the attempt ended, how long other hooks may still report the packet.
const SETTLE: Duration = Duration::from_millis(100);
/// How often the loop looks at the connecting thread.
const TICK: Duration = Duration::from_millis(20);

/// Where the kernel's reports come from (nftrace events, TRACE lines).
pub trait Source {
    type Item;
    fn drain(&mut self) -> Result<Vec<Self::Item>, TraceError>;
    fn raw_fd(&self) -> i32;
}

/// What keeps the traced packet's reports.
pub trait Collect<I> {
    fn feed(&mut self, item: I);
    /// Whether the traced packet was seen.
    fn seen(&self) -> bool;
}

/// Lets the connection go and collects the traced packet's reports until it is done.
pub fn watch<S: Source, C: Collect<S::Item>>(
    listener: &mut S,
    signals: &signals::Guard,
    prober: Option<&connect::Prober>,
    c: &mut C,
    how: TraceHow,
) -> Result<Attempt, TraceError> {
    let started = Instant::now();
    let limit = match how {
        TraceHow::Connect => CONNECT_TIMEOUT + Duration::from_secs(1),
        TraceHow::Wait(d) => d,
    };
    if let Some(p) = prober {
        p.go();
    }
    let mut attempt = prober.is_none().then_some(Attempt::Observed);
    let mut quiet_since: Option<Instant> = None;
    loop {
        if let Some(signal) = signals.received() {
            return Err(TraceError::Interrupted { signal });
        }
        for e in listener.drain()? {
            c.feed(e);
        }
        if attempt.is_none() {
            attempt = prober.and_then(connect::Prober::poll);
        }
        // Done: the attempt finished (or, waiting, the packet was seen) and the reports settled.
        let finished = attempt.is_some() && (prober.is_some() || c.seen());
        if finished {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= SETTLE {
                break;
            }
        }
        if started.elapsed() >= limit {
            if prober.is_none() && !c.seen() {
                return Err(TraceError::NothingSeen { waited: limit });
            }
            break;
        }
        wait_readable(listener.raw_fd(), signals.wake_fd(), TICK);
    }
    Ok(attempt.unwrap_or(Attempt::TimedOut))
}

fn wait_readable(a: i32, b: i32, timeout: Duration) {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfd entries; EINTR just ends the wait early.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as i32) };
}
