//! The API writes the daemon makes in the background (Events, the ambient agent's pod
//! annotations): best effort, never holding up the job that asks for them. The API client's
//! read timeout is the watches' (minutes), so each write is bounded here, and only so many wait
//! at once: an API server that stops answering costs a bounded number of tasks, and what does
//! not fit is dropped with a warning (the next pass or enroll writes it again).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One family of background writes, with its bound.
pub struct BackgroundWrites {
    /// What the writes are, for logs ("event", "pod annotation").
    what: &'static str,
    max_pending: usize,
    timeout: Duration,
    pending: AtomicUsize,
}

impl BackgroundWrites {
    /// At most `max_pending` writes waiting, each at most `timeout`.
    pub const fn new(what: &'static str, max_pending: usize, timeout: Duration) -> Self {
        BackgroundWrites {
            what,
            max_pending,
            timeout,
            pending: AtomicUsize::new(0),
        }
    }

    /// Writes waiting for the API server now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Starts `write` in the background unless `max_pending` are already waiting (then it is
    /// dropped, logged with `key`); returns whether it started. Needs a tokio runtime.
    pub fn spawn(
        &'static self,
        key: &str,
        write: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        if self.pending.fetch_add(1, Ordering::SeqCst) >= self.max_pending {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(pod = %key, pending = self.max_pending, "{} not written: the API server has not answered the earlier ones", self.what);
            return false;
        }
        let key = Arc::<str>::from(key);
        tokio::spawn(async move {
            if tokio::time::timeout(self.timeout, write).await.is_err() {
                tracing::warn!(pod = %key, timeout_s = self.timeout.as_secs(), "{} not written: no answer from the API server", self.what);
            }
            self.pending.fetch_sub(1, Ordering::SeqCst);
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::BackgroundWrites;
    use std::time::Duration;

    static HUNG: BackgroundWrites =
        BackgroundWrites::new("test write", 2, Duration::from_millis(200));

    /// A hung API server: writes pile up to the bound, the rest are dropped, and each waiting
    /// one gives up after its timeout, which frees its place.
    #[tokio::test]
    async fn writes_to_a_hung_server_are_bounded_in_number_and_in_time() {
        assert!(HUNG.spawn("default/a", std::future::pending()));
        assert!(HUNG.spawn("default/b", std::future::pending()));
        assert!(!HUNG.spawn("default/c", std::future::pending()));
        assert_eq!(HUNG.pending(), 2);
        let started = tokio::time::Instant::now();
        while HUNG.pending() > 0 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(HUNG.pending(), 0, "both gave up after their timeout");
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "not before it"
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert!(HUNG.spawn("default/d", async move {
            let _ = tx.send(());
        }));
        rx.await.unwrap();
        while HUNG.pending() > 0 {
            tokio::task::yield_now().await;
        }
        // A write that finished freed its place: two more fit.
        assert!(HUNG.spawn("default/e", async {}) && HUNG.spawn("default/f", async {}));
    }
}
