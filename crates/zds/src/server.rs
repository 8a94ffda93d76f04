//! The ZDS server: listens on the socket, keeps one ztunnel connection, and drives the
//! protocol on it (hello, snapshot, one Ack per message). One task owns the connection, so
//! messages are strictly sequential; callers talk to it through [`ZdsServer`].

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::error::{LinkError, NetnsCheckError, ZdsError};
use crate::socket::{self, SeqpacketConn};
use crate::store::{Entry, Store};
use crate::wire::{self, Request, Response, WorkloadInfo};

/// Timeouts; every wait on ztunnel is bounded by one of these.
#[derive(Clone, Debug)]
pub struct ZdsConfig {
    /// How long to wait for the Ack of one message. On expiry the connection is dropped.
    pub ack_timeout: Duration,
    /// How long a new connection may take to send its hello.
    pub hello_timeout: Duration,
    /// How long a request may wait for the connection (behind a snapshot, which takes up to
    /// pods x `ack_timeout`, or other pods' requests). An add not started by then is answered
    /// [`ZdsError::Busy`] and never sent; so an add takes at most this plus its Acks.
    pub queue_timeout: Duration,
}

impl Default for ZdsConfig {
    fn default() -> Self {
        ZdsConfig {
            ack_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(5),
            queue_timeout: Duration::from_secs(3),
        }
    }
}

/// How a `del_workload` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelOutcome {
    /// ztunnel acknowledged the `DelWorkload`.
    Acked,
    /// No usable connection: the pod is out of the store, so the snapshot of ztunnel's next
    /// connection leaves it out and ztunnel drops it then.
    Deferred,
}

/// Builds a server whose store already holds the pods found at startup, so that the first
/// ztunnel to connect gets the full snapshot (an empty one would make it drop every pod).
pub struct ZdsServerBuilder {
    socket: PathBuf,
    config: ZdsConfig,
    store: Store,
}

impl ZdsServerBuilder {
    pub fn config(mut self, config: ZdsConfig) -> Self {
        self.config = config;
        self
    }

    /// A pod to serve from the first connection on.
    pub fn workload(mut self, uid: impl Into<String>, info: WorkloadInfo, netns: OwnedFd) -> Self {
        self.store.insert(
            uid.into(),
            Entry::Served {
                info,
                netns: Arc::new(netns),
            },
        );
        self
    }

    /// A pod that exists but whose netns was not found: ztunnel keeps what it has for it.
    pub fn keep(mut self, uid: impl Into<String>) -> Self {
        self.store.insert(uid.into(), Entry::Kept);
        self
    }

    /// Listens on the socket (replacing a stale socket file, refusing a live one) and starts
    /// serving on the current tokio runtime.
    pub fn bind(self) -> Result<ZdsServer, ZdsError> {
        let (listener, socket_id) = listen(&self.socket)?;
        let (commands_tx, commands) = mpsc::channel(1024);
        let (ready_tx, ready) = watch::channel(false);
        let store = Arc::new(Mutex::new(self.store));
        let (greeted_tx, greeted) = mpsc::channel(4);
        let acceptor = tokio::spawn(accept_loop(
            self.socket.clone(),
            listener,
            self.config.hello_timeout,
            greeted_tx,
        ));
        let task = ConnectionTask {
            socket: self.socket.clone(),
            config: self.config.clone(),
            store: store.clone(),
            ready: ready_tx,
        };
        let task = tokio::spawn(task.run(greeted, commands));
        info!(socket = %self.socket.display(), "ZDS server listening");
        Ok(ZdsServer {
            socket: self.socket,
            socket_id,
            commands: commands_tx,
            config: self.config,
            ready,
            store,
            tasks: [acceptor, task],
        })
    }
}

/// The agent's handle on the ZDS socket. Dropping it stops the server, closes the ztunnel
/// connection and removes the socket file.
pub struct ZdsServer {
    socket: PathBuf,
    /// (dev, inode) of the socket file we created: only that file is removed on drop.
    socket_id: (u64, u64),
    commands: mpsc::Sender<Command>,
    config: ZdsConfig,
    ready: watch::Receiver<bool>,
    store: Arc<Mutex<Store>>,
    /// The accept loop and the connection task.
    tasks: [tokio::task::JoinHandle<()>; 2],
}

enum Command {
    Add {
        uid: String,
        info: WorkloadInfo,
        netns: Arc<OwnedFd>,
        /// Not started by then: answered `Busy`, never sent.
        deadline: tokio::time::Instant,
        reply: oneshot::Sender<Result<(), ZdsError>>,
    },
    Del {
        uid: String,
        reply: oneshot::Sender<DelOutcome>,
    },
}

impl ZdsServer {
    pub fn builder(socket: impl Into<PathBuf>) -> ZdsServerBuilder {
        ZdsServerBuilder {
            socket: socket.into(),
            config: ZdsConfig::default(),
            store: Store::default(),
        }
    }

    /// A server with an empty store and the given timeouts.
    pub fn bind(socket: impl Into<PathBuf>, config: ZdsConfig) -> Result<ZdsServer, ZdsError> {
        Self::builder(socket).config(config).bind()
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Hands the pod's netns to ztunnel and returns once ztunnel acknowledged it. The pod is
    /// in the store (sent again on every reconnect) exactly when its last add succeeded: a
    /// failed add also forgets what an earlier add of the same uid stored. Fails at once when
    /// no ztunnel is connected, so callers can fail closed. A pod ztunnel refuses is withdrawn
    /// (`DelWorkload`), so ztunnel does not keep retrying a pod the caller gave up on.
    /// Bounded: `queue_timeout` to start, then its Acks (see [`ZdsConfig::queue_timeout`]).
    pub async fn add_workload(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: OwnedFd,
    ) -> Result<(), ZdsError> {
        let pod = pod_label(uid, Some(&info));
        self.validate(&pod, uid, &info, &netns)?;
        let (reply, answer) = oneshot::channel();
        let (queue, ack) = (self.config.queue_timeout, self.config.ack_timeout);
        let cmd = Command::Add {
            uid: uid.to_string(),
            info,
            netns: Arc::new(netns),
            deadline: tokio::time::Instant::now() + queue,
            reply,
        };
        // The task answers within queue + Add's Ack + the withdrawal's Ack; one Ack of slack.
        let bound = queue + 3 * ack;
        let sent = async {
            self.commands.send(cmd).await.map_err(|_| self.stopped())?;
            answer.await.map_err(|_| self.stopped())?
        };
        tokio::time::timeout(bound, sent)
            .await
            .map_err(|_| ZdsError::Busy {
                socket: self.socket.clone(),
                pod,
                waited: bound,
            })?
    }

    /// Stops ztunnel serving the pod: out of the store at once, then `DelWorkload` when a
    /// ztunnel is connected. Never fails for want of ztunnel (see [`DelOutcome::Deferred`]).
    /// Bounded: a Del still queued after `queue_timeout` plus two Acks is answered `Deferred`
    /// and stays queued (it is sent, or the pod left out of the next snapshot, in order).
    pub async fn del_workload(&self, uid: &str) -> Result<DelOutcome, ZdsError> {
        let (reply, answer) = oneshot::channel();
        let cmd = Command::Del {
            uid: uid.to_string(),
            reply,
        };
        let bound = self.config.queue_timeout + 2 * self.config.ack_timeout;
        let sent = async {
            self.commands.send(cmd).await.map_err(|_| self.stopped())?;
            answer.await.map_err(|_| self.stopped())
        };
        match tokio::time::timeout(bound, sent).await {
            Ok(outcome) => outcome,
            Err(_) => {
                warn!(socket = %self.socket.display(), uid, ?bound, "DelWorkload still queued; deferred");
                Ok(DelOutcome::Deferred)
            }
        }
    }

    /// Whether a ztunnel is connected and has acknowledged its snapshot.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Readiness as a watch channel (for `/readyz`: ready only while ztunnel is connected).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// Waits until ready or `timeout`; returns whether ready.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut ready = self.ready.clone();
        tokio::time::timeout(timeout, ready.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The uids of the pods in the store (what the next snapshot names).
    pub fn known_workloads(&self) -> Vec<String> {
        lock(&self.store).uids()
    }

    fn validate(
        &self,
        pod: &str,
        uid: &str,
        info: &WorkloadInfo,
        netns: &OwnedFd,
    ) -> Result<(), ZdsError> {
        let req = Request::Add {
            uid: uid.to_string(),
            info: info.clone(),
        };
        wire::encode_request(&req).map_err(|source| ZdsError::InvalidRequest {
            socket: self.socket.clone(),
            pod: pod.to_string(),
            source,
        })?;
        check_netns(netns).map_err(|source| ZdsError::NotANetns {
            socket: self.socket.clone(),
            pod: pod.to_string(),
            source,
        })
    }

    fn stopped(&self) -> ZdsError {
        ZdsError::Stopped {
            socket: self.socket.clone(),
        }
    }
}

impl Drop for ZdsServer {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
        if std::fs::symlink_metadata(&self.socket)
            .is_ok_and(|m| (m.dev(), m.ino()) == self.socket_id)
        {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// How the pod is named in errors and logs: `namespace/name (uid U)`, or the uid alone.
fn pod_label(uid: &str, info: Option<&WorkloadInfo>) -> String {
    match info {
        Some(i) if !i.name.is_empty() => format!("{}/{} (uid {uid})", i.namespace, i.name),
        _ => format!("uid {uid}"),
    }
}

/// ztunnel only logs a wrong fd; we refuse it before sending. Netns fds live on nsfs
/// (`/proc/PID/ns/net`, `/var/run/netns/NAME`).
fn check_netns(fd: &OwnedFd) -> Result<(), NetnsCheckError> {
    use nix::sys::statfs::{NSFS_MAGIC, fstatfs};
    let fs = fstatfs(fd.as_fd()).map_err(NetnsCheckError::Statfs)?;
    if fs.filesystem_type() == NSFS_MAGIC {
        Ok(())
    } else {
        Err(NetnsCheckError::Filesystem(fs.filesystem_type()))
    }
}

fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    // The store is plain data: a panic elsewhere cannot leave it half-updated.
    store.lock().unwrap_or_else(|e| e.into_inner())
}

/// Binds the listening socket. A socket file nobody listens on (a previous agent's) is
/// replaced; a live one is refused, so two agents never fight over ztunnel.
fn listen(path: &Path) -> Result<(UnixListener, (u64, u64)), ZdsError> {
    let listen_err = |source| ZdsError::Listen {
        socket: path.to_path_buf(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ZdsError::NotASocket {
                socket: path.to_path_buf(),
            });
        }
        if socket::connect(path).is_ok() {
            return Err(ZdsError::InUse {
                socket: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(listen_err)?;
    }
    let listener = socket::listen(path).map_err(listen_err)?;
    let meta = std::fs::symlink_metadata(path).map_err(listen_err)?;
    Ok((listener, (meta.dev(), meta.ino())))
}

/// How many connections may be waiting for their hello at once; over it the oldest is
/// dropped, so a flood of silent connections holds a bounded number of descriptors while a
/// ztunnel, which says hello at once, still gets through.
pub const MAX_PENDING_HELLOS: usize = 64;

/// Accepts connections and reads each one's hello on its own task, so a silent client delays
/// nobody. Only greeted connections reach the connection task (and may replace its current
/// one): a mere connect, e.g. a second agent probing the socket, never disturbs ztunnel.
async fn accept_loop(
    socket: PathBuf,
    listener: UnixListener,
    hello_timeout: Duration,
    greeted: mpsc::Sender<SeqpacketConn>,
) {
    let mut pending: std::collections::VecDeque<tokio::task::JoinHandle<()>> = Default::default();
    let mut dropped = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(socket = %socket.display(), "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        pending.retain(|h| !h.is_finished());
        if pending.len() >= MAX_PENDING_HELLOS {
            if let Some(oldest) = pending.pop_front() {
                oldest.abort();
            }
            dropped += 1;
            if dropped.is_power_of_two() {
                warn!(socket = %socket.display(), dropped, max = MAX_PENDING_HELLOS, "too many connections without hello; the oldest dropped");
            }
        }
        let (socket, greeted) = (socket.clone(), greeted.clone());
        pending.push_back(tokio::spawn(async move {
            let conn = SeqpacketConn::new(stream);
            match read_hello(&conn, hello_timeout).await {
                Ok(()) => {
                    let _ = greeted.send(conn).await;
                }
                Err(e) => {
                    warn!(socket = %socket.display(), "ztunnel hello failed: {e}; connection dropped")
                }
            }
        }));
    }
}

async fn read_hello(conn: &SeqpacketConn, timeout: Duration) -> Result<(), LinkError> {
    let packet = tokio::time::timeout(timeout, conn.recv())
        .await
        .map_err(|_| LinkError::Timeout(timeout))??
        .ok_or(LinkError::Closed)?;
    Ok(wire::decode_hello(&packet.bytes)?)
}

enum AddFailure {
    NotConnected,
    Rejected(String),
    Link(LinkError),
}

enum Event {
    Greeted(Option<SeqpacketConn>),
    Command(Option<Command>),
    Ended(String),
}

/// The task that owns the ztunnel connection.
struct ConnectionTask {
    socket: PathBuf,
    config: ZdsConfig,
    store: Arc<Mutex<Store>>,
    ready: watch::Sender<bool>,
}

impl ConnectionTask {
    async fn run(
        self,
        mut greeted: mpsc::Receiver<SeqpacketConn>,
        mut commands: mpsc::Receiver<Command>,
    ) {
        let mut conn: Option<SeqpacketConn> = None;
        loop {
            // The select only picks the event; acting on it (which replaces `conn`) comes after,
            // once the futures borrowing `conn` are gone. All three are cancel-safe.
            let event = tokio::select! {
                new = greeted.recv() => Event::Greeted(new),
                cmd = commands.recv() => Event::Command(cmd),
                gone = idle(conn.as_ref()), if conn.is_some() => Event::Ended(gone),
            };
            match event {
                Event::Greeted(None) => return,
                Event::Greeted(Some(new)) => {
                    if conn.take().is_some() {
                        info!(socket = %self.socket.display(), "a new ztunnel connection replaces the current one");
                    }
                    self.ready.send_replace(false);
                    conn = self.send_snapshot(new).await;
                    self.ready.send_replace(conn.is_some());
                }
                Event::Command(None) => return,
                Event::Command(Some(cmd)) => {
                    if !self.handle(cmd, conn.as_ref()).await {
                        conn = None;
                        self.ready.send_replace(false);
                    }
                }
                Event::Ended(why) => {
                    warn!(socket = %self.socket.display(), "ztunnel connection ended: {why}");
                    conn = None;
                    self.ready.send_replace(false);
                }
            }
        }
    }

    /// Sends the snapshot on a greeted connection; returns it if ztunnel took it all.
    async fn send_snapshot(&self, conn: SeqpacketConn) -> Option<SeqpacketConn> {
        let steps = lock(&self.store).snapshot();
        let pods = steps.len() - 1;
        for (req, netns) in steps {
            let fd = netns.as_ref().map(|fd| fd.as_fd());
            match self.exchange(&conn, &req, fd).await {
                Ok(Response::Ack) => {}
                // ztunnel keeps a pod it could not start pending and retries it itself.
                Ok(Response::Nack(e)) if req != Request::SnapshotSent => {
                    warn!(socket = %self.socket.display(), uid = req.uid(), "ztunnel refused a snapshot pod: {e}")
                }
                Ok(Response::Nack(e)) => {
                    warn!(socket = %self.socket.display(), "ztunnel refused SnapshotSent: {e}; connection dropped");
                    return None;
                }
                Err(e) => {
                    warn!(socket = %self.socket.display(), uid = req.uid(), "snapshot failed: {e}; connection dropped");
                    return None;
                }
            }
        }
        info!(socket = %self.socket.display(), pods, "ztunnel connected, snapshot sent");
        Some(conn)
    }

    /// Runs one command; returns false when the connection must be dropped.
    async fn handle(&self, cmd: Command, conn: Option<&SeqpacketConn>) -> bool {
        match cmd {
            Command::Add {
                uid,
                info,
                netns,
                deadline,
                reply,
            } => {
                if reply.is_closed() || tokio::time::Instant::now() > deadline {
                    let pod = pod_label(&uid, Some(&info));
                    warn!(socket = %self.socket.display(), %pod, "AddWorkload not started within the queue timeout; not sent");
                    // A failed add forgets the pod; if ztunnel served it, it is told so.
                    let served = lock(&self.store).remove(&uid).is_some();
                    let _ = reply.send(Err(self.busy(pod)));
                    return !served || self.withdraw_unasked(conn, &uid).await;
                }
                let (result, keep) = self.add(conn, &uid, info, netns).await;
                let served = result.is_ok();
                if reply.send(result).is_err() && served {
                    // The caller gave up: it reports the pod unserved, so ztunnel must not serve it.
                    lock(&self.store).remove(&uid);
                    return keep && self.withdraw_unasked(conn, &uid).await;
                }
                keep
            }
            Command::Del { uid, reply } => {
                let (outcome, keep) = self.del(conn, &uid).await;
                let _ = reply.send(outcome);
                keep
            }
        }
    }

    async fn add(
        &self,
        conn: Option<&SeqpacketConn>,
        uid: &str,
        info: WorkloadInfo,
        netns: Arc<OwnedFd>,
    ) -> (Result<(), ZdsError>, bool) {
        let pod = pod_label(uid, Some(&info));
        let (result, keep) = self.try_add(conn, uid, &info, &netns).await;
        let mut store = lock(&self.store);
        match result {
            Ok(()) => {
                store.insert(uid.to_string(), Entry::Served { info, netns });
                debug!(socket = %self.socket.display(), %pod, "ztunnel serves pod");
                (Ok(()), keep)
            }
            Err(failure) => {
                store.remove(uid);
                (Err(self.add_error(pod, failure)), keep)
            }
        }
    }

    /// The Add exchange; returns whether the connection is still usable.
    async fn try_add(
        &self,
        conn: Option<&SeqpacketConn>,
        uid: &str,
        info: &WorkloadInfo,
        netns: &Arc<OwnedFd>,
    ) -> (Result<(), AddFailure>, bool) {
        let Some(conn) = conn else {
            return (Err(AddFailure::NotConnected), true);
        };
        let req = Request::Add {
            uid: uid.to_string(),
            info: info.clone(),
        };
        match self.exchange(conn, &req, Some(netns.as_fd())).await {
            Ok(Response::Ack) => (Ok(()), true),
            Ok(Response::Nack(message)) => {
                let keep = self.withdraw(conn, uid).await;
                (Err(AddFailure::Rejected(message)), keep)
            }
            Err(e) => (Err(AddFailure::Link(e)), false),
        }
    }

    fn add_error(&self, pod: String, failure: AddFailure) -> ZdsError {
        let socket = self.socket.clone();
        match failure {
            AddFailure::NotConnected => ZdsError::NotConnected { socket, pod },
            AddFailure::Rejected(message) => ZdsError::Rejected {
                socket,
                pod,
                message,
            },
            AddFailure::Link(source) => ZdsError::Link {
                socket,
                pod,
                source,
            },
        }
    }

    fn busy(&self, pod: String) -> ZdsError {
        ZdsError::Busy {
            socket: self.socket.clone(),
            pod,
            waited: self.config.queue_timeout,
        }
    }

    async fn withdraw_unasked(&self, conn: Option<&SeqpacketConn>, uid: &str) -> bool {
        match conn {
            Some(conn) => self.withdraw(conn, uid).await,
            None => true,
        }
    }

    /// After a refused Add: ztunnel holds the pod pending and would retry it; tell it not to.
    async fn withdraw(&self, conn: &SeqpacketConn, uid: &str) -> bool {
        let req = Request::Del {
            uid: uid.to_string(),
        };
        match self.exchange(conn, &req, None).await {
            Ok(_) => true,
            Err(e) => {
                warn!(socket = %self.socket.display(), uid, "withdrawing a refused pod failed: {e}; connection dropped");
                false
            }
        }
    }

    async fn del(&self, conn: Option<&SeqpacketConn>, uid: &str) -> (DelOutcome, bool) {
        let removed = lock(&self.store).remove(uid);
        let Some(conn) = conn else {
            return (DelOutcome::Deferred, true);
        };
        let req = Request::Del {
            uid: uid.to_string(),
        };
        match self.exchange(conn, &req, None).await {
            Ok(Response::Ack) => (DelOutcome::Acked, true),
            Ok(Response::Nack(e)) => {
                // ztunnel only refuses a Del on a protocol error; start over with a snapshot.
                warn!(socket = %self.socket.display(), uid, known = removed.is_some(), "ztunnel refused DelWorkload: {e}; connection dropped");
                (DelOutcome::Deferred, false)
            }
            Err(e) => {
                warn!(socket = %self.socket.display(), uid, "DelWorkload not confirmed: {e}; connection dropped");
                (DelOutcome::Deferred, false)
            }
        }
    }

    /// One request and its Ack, both within `ack_timeout`.
    async fn exchange(
        &self,
        conn: &SeqpacketConn,
        req: &Request,
        netns: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Response, LinkError> {
        let bytes = wire::encode_request(req)?;
        // Acks carry no id: one already waiting (a second Ack, a late one) would pass for this
        // request's. The connection's state is unknown: drop it.
        match conn.try_recv() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Ok(Some(p)) => return Err(LinkError::Unsolicited(p.bytes.len())),
            Ok(None) => return Err(LinkError::Closed),
            Err(e) => return Err(e.into()),
        }
        let timeout = self.config.ack_timeout;
        let round_trip = async {
            conn.send(&bytes, netns).await?;
            let packet = conn.recv().await?.ok_or(LinkError::Closed)?;
            Ok::<_, LinkError>(wire::decode_response(&packet.bytes)?)
        };
        tokio::time::timeout(timeout, round_trip)
            .await
            .map_err(|_| LinkError::Timeout(timeout))?
    }
}

/// Resolves when an idle connection ends: EOF, an error, or a message nobody asked for
/// (ztunnel only ever answers).
async fn idle(conn: Option<&SeqpacketConn>) -> String {
    let Some(conn) = conn else {
        return std::future::pending().await;
    };
    match conn.recv().await {
        Ok(None) => "ztunnel closed it".to_string(),
        Ok(Some(p)) => format!("unexpected {}-byte message while idle", p.bytes.len()),
        Err(e) => format!("socket error: {e}"),
    }
}
