//! The daemon's long-running jobs, supervised: each spawned job is owned here with its name and
//! stage, so a shutdown can stop them in order, bounded, and say which one misbehaved.
//!
//! Stages drain in order: the watches first (consumers see no new events), then the consumers
//! (their in-flight work ends before the servers go), then the servers (the plugin's calls are
//! answered as long as possible). Each stage gets its share of the deadline; a job that
//! overruns it is aborted and named.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A job's stop signal (for [`Jobs::spawn_graceful`]): `cancelled().await` resolves when the
/// job's stage drains.
pub type Stop = CancellationToken;

/// When a job stops, in draining order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Produces events (the pod and namespace watches).
    Watch,
    /// Acts on events or state (repair, reconcile, the ambient agent, the taint removal).
    Consumer,
    /// Answers the plugin or the admin (sockets, the log relay).
    Server,
}

const STAGES: [Stage; 3] = [Stage::Watch, Stage::Consumer, Stage::Server];

struct Job {
    name: String,
    stage: Stage,
    handle: JoinHandle<()>,
}

struct Inner {
    /// One stop signal per stage, indexed like [`STAGES`].
    stop: [CancellationToken; 3],
    jobs: Mutex<Vec<Job>>,
}

/// The set of supervised jobs; clones share it (a job may start jobs of its own).
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<Inner>,
}

impl Default for Jobs {
    fn default() -> Self {
        Self::new()
    }
}

/// How each job ended in [`Jobs::drain`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Stopped (or had ended) in time, in draining order.
    pub stopped: Vec<String>,
    /// Overran its stage's share of the deadline: aborted.
    pub aborted: Vec<String>,
    /// Panicked (before or during the drain).
    pub panicked: Vec<String>,
}

impl Jobs {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                stop: Default::default(),
                jobs: Mutex::new(Vec::new()),
            }),
        }
    }

    fn token(&self, stage: Stage) -> CancellationToken {
        let i = STAGES.iter().position(|s| *s == stage).unwrap_or(0);
        self.inner.stop[i].clone()
    }

    /// Spawns `job`; when its stage drains it is dropped at its next await point (what a job
    /// with no cleanup of its own needs).
    pub fn spawn<F>(&self, name: impl Into<String>, stage: Stage, job: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_graceful(name, stage, move |stop| async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = job => {}
            }
        });
    }

    /// Spawns the job `start` makes with its stage's stop signal: the job watches the signal
    /// itself and ends when its work allows it.
    pub fn spawn_graceful<F>(
        &self,
        name: impl Into<String>,
        stage: Stage,
        start: impl FnOnce(Stop) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(start(self.token(stage)));
        let job = Job {
            name: name.into(),
            stage,
            handle,
        };
        self.inner.jobs.lock().unwrap().push(job);
    }

    /// The names of the jobs spawned so far, in spawning order.
    pub fn names(&self) -> Vec<String> {
        let jobs = self.inner.jobs.lock().unwrap();
        jobs.iter().map(|j| j.name.clone()).collect()
    }

    /// Stops the jobs stage by stage within `within`: each stage's signal, then its jobs
    /// awaited until its share (what is left, split among the stages left); a job still
    /// running then is aborted. Each job's end is logged.
    pub async fn drain(&self, within: Duration) -> Drained {
        let end = Instant::now() + within;
        let mut out = Drained::default();
        for (i, stage) in STAGES.iter().enumerate() {
            let jobs: Vec<Job> = {
                let mut all = self.inner.jobs.lock().unwrap();
                let (this, rest) = all.drain(..).partition(|j| j.stage == *stage);
                *all = rest;
                this
            };
            let left = end.saturating_duration_since(Instant::now());
            let share = Instant::now() + left / (STAGES.len() - i) as u32;
            self.inner.stop[i].cancel();
            for job in jobs {
                finish(job, share, &mut out).await;
            }
        }
        out
    }
}

async fn finish(mut job: Job, until: Instant, out: &mut Drained) {
    let (name, stage) = (job.name, job.stage);
    match tokio::time::timeout_at(until, &mut job.handle).await {
        Ok(Ok(())) => {
            tracing::info!(job = %name, ?stage, "shutdown: job stopped");
            out.stopped.push(name);
        }
        Ok(Err(e)) if e.is_panic() => {
            tracing::error!(job = %name, ?stage, "shutdown: the job had panicked");
            out.panicked.push(name);
        }
        Ok(Err(_)) => {
            tracing::info!(job = %name, ?stage, "shutdown: job stopped (cancelled)");
            out.stopped.push(name);
        }
        Err(_) => {
            job.handle.abort();
            tracing::warn!(job = %name, ?stage, "shutdown: the job overran its share of the deadline; aborted");
            out.aborted.push(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Drained, Jobs, Stage};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    type Log = Arc<Mutex<Vec<&'static str>>>;

    /// A job that records its name once its stop arrives.
    fn recorder(jobs: &Jobs, name: &'static str, stage: Stage, log: &Log) {
        let log = log.clone();
        jobs.spawn_graceful(name, stage, move |stop| async move {
            stop.cancelled().await;
            log.lock().unwrap().push(name);
        });
    }

    #[tokio::test]
    async fn drains_watches_then_consumers_then_servers() {
        let (jobs, log) = (Jobs::new(), Log::default());
        recorder(&jobs, "server", Stage::Server, &log);
        recorder(&jobs, "consumer", Stage::Consumer, &log);
        recorder(&jobs, "watch", Stage::Watch, &log);
        // Dropped at its await when its stage drains: no cooperation needed.
        jobs.spawn("plain", Stage::Consumer, std::future::pending());
        let d = jobs.drain(Duration::from_secs(5)).await;
        assert_eq!(*log.lock().unwrap(), ["watch", "consumer", "server"]);
        assert_eq!(d.stopped, ["watch", "consumer", "plain", "server"]);
        assert!(d.aborted.is_empty() && d.panicked.is_empty(), "{d:?}");
    }

    #[tokio::test]
    async fn a_job_that_ignores_the_stop_is_aborted_and_named() {
        let jobs = Jobs::new();
        let dropped = Arc::new(());
        let held = dropped.clone();
        jobs.spawn_graceful("deaf", Stage::Consumer, move |_stop| async move {
            let _held = held;
            std::future::pending::<()>().await
        });
        recorder(&jobs, "server", Stage::Server, &Log::default());
        let started = tokio::time::Instant::now();
        let d = jobs.drain(Duration::from_millis(300)).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        let want = Drained {
            stopped: vec!["server".into()],
            aborted: vec!["deaf".into()],
            panicked: vec![],
        };
        assert_eq!(d, want);
        tokio::task::yield_now().await;
        assert_eq!(
            Arc::strong_count(&dropped),
            1,
            "the aborted job's future is dropped"
        );
    }

    #[tokio::test]
    async fn a_job_that_panicked_is_reported() {
        let jobs = Jobs::new();
        jobs.spawn("broken", Stage::Watch, async { panic!("on purpose") });
        jobs.spawn("fine", Stage::Watch, async {});
        tokio::task::yield_now().await;
        let d = jobs.drain(Duration::from_secs(1)).await;
        assert_eq!(d.panicked, ["broken"]);
        assert_eq!(d.stopped, ["fine"]);
    }

    #[tokio::test]
    async fn a_job_spawned_by_a_job_is_drained_too() {
        let jobs = Jobs::new();
        let inner = jobs.clone();
        jobs.spawn("parent", Stage::Consumer, async move {
            inner.spawn("child", Stage::Server, std::future::pending());
            std::future::pending().await
        });
        tokio::task::yield_now().await;
        assert_eq!(jobs.names(), ["parent", "child"]);
        let d = jobs.drain(Duration::from_secs(1)).await;
        assert_eq!(d.stopped, ["parent", "child"]);
    }
}
