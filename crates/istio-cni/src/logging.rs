//! JSON log lines to stderr, to `<cni_agent_run_dir>/istio-cni.log`, and to the node daemon
//! (`log.sock`, see [`cni_config::log`]), which prints them in its own log. Never stdout:
//! stdout is the CNI result. The file keeps every line, also when the daemon is unreachable;
//! a line the daemon cannot take at once is dropped from the relay, never waited for.
//!
//! Many plugin processes write the same file at once (one per pod), so the file is opened
//! with O_APPEND and each event is written with one `write` call (the formatter hands us the
//! whole line); the size cap is enforced by whichever process sees it exceeded first.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tracing::Level;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Size at which the log is rotated to `<file>.1` (Istio: 10 MB rolling file).
pub const MAX_LOG_BYTES: u64 = 10 * 1024 * 1024;

/// Istio's level names (`plugin_log_level`); unknown names are reported and mean `info`.
pub fn level_filter(name: &str) -> Result<LevelFilter, String> {
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "none" => LevelFilter::OFF,
        "panic" | "fatal" | "error" => LevelFilter::ERROR,
        "warn" | "warning" => LevelFilter::WARN,
        "" | "info" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        other => return Err(format!("unknown plugin_log_level {other:?}, using info")),
    })
}

/// A size-capped append-only file with one backup.
pub struct RotatingFile {
    path: PathBuf,
    max: u64,
    file: Mutex<Option<File>>,
}

impl RotatingFile {
    pub fn open(path: &Path, max: u64) -> io::Result<Self> {
        let file = open_append(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            max,
            file: Mutex::new(Some(file)),
        })
    }

    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let Some(file) = guard.as_mut() else {
            return Ok(());
        };
        let meta = file.metadata()?;
        if meta.len() + buf.len() as u64 > self.max {
            // Only the process whose file is still the live one rotates; the others notice
            // the rename (different inode) and just reopen.
            let live = std::fs::metadata(&self.path).ok();
            if live.is_some_and(|m| m.ino() == meta.ino() && m.dev() == meta.dev()) {
                let mut backup = self.path.clone().into_os_string();
                backup.push(".1");
                let _ = std::fs::rename(&self.path, backup);
            }
            *file = open_append(&self.path)?;
        }
        file.write_all(buf)
    }
}

/// Never through a symlink: someone who can write the run dir must not make us append to a
/// file elsewhere. (The rotation's rename does not follow a symlink at `<file>.1`: it replaces
/// the link itself.) Never anything but a regular file either: a FIFO planted at the name would
/// hold the ADD in `open` until a reader came (opened non-blocking, it fails at once instead)
/// or in `write` once its pipe is full.
fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(e.kind(), "it is a symlink; not following it"),
            Some(libc::ENXIO) => io::Error::new(e.kind(), "not a regular file (a FIFO or socket)"),
            _ => e,
        })?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file; not writing to it",
        ));
    }
    Ok(file)
}

/// Where whole lines go.
pub trait Sink: Send + Sync {
    /// Takes one line; never fails the command (errors are the sink's to swallow).
    fn write_line(&self, line: &[u8]);
}

impl Sink for RotatingFile {
    fn write_line(&self, line: &[u8]) {
        let _ = self.append(line);
    }
}

/// The node daemon's log socket: a connected, non-blocking datagram socket.
pub struct Relay(std::os::unix::net::UnixDatagram);

impl Relay {
    /// `None` when no daemon listens there (the file alone then has the lines).
    pub fn connect(socket: &Path) -> Option<Relay> {
        let s = std::os::unix::net::UnixDatagram::unbound().ok()?;
        s.connect(socket).ok()?;
        s.set_nonblocking(true).ok()?;
        Some(Relay(s))
    }
}

impl Sink for Relay {
    fn write_line(&self, line: &[u8]) {
        // A full queue (EAGAIN), a daemon gone (ECONNREFUSED), a line too long: dropped.
        if line.len() <= cni_config::log::MAX_LINE {
            let _ = self.0.send(line);
        }
    }
}

/// The relay's socket, also for the ADD's figures (`crate::figures`).
static FIGURES_TO: std::sync::OnceLock<Arc<Relay>> = std::sync::OnceLock::new();

/// One non-blocking datagram to the daemon on the relay's socket: dropped when there is no
/// daemon or its queue is full, as the log lines.
pub fn send_figures(datagram: &[u8]) {
    if let Some(r) = FIGURES_TO.get() {
        r.write_line(datagram);
    }
}

/// One formatted event, written in one call when dropped.
pub struct LineWriter {
    target: Arc<dyn Sink>,
    buf: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.target.write_line(&self.buf);
        }
    }
}

#[derive(Clone)]
pub struct SinkMaker(Arc<dyn Sink>);

impl<'a> MakeWriter<'a> for SinkMaker {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            target: self.0.clone(),
            buf: Vec::with_capacity(512),
        }
    }
}

/// stderr (the runtime shows it when a command fails).
struct Stderr;

impl Sink for Stderr {
    fn write_line(&self, line: &[u8]) {
        let _ = io::stderr().lock().write_all(line);
    }
}

/// Every sink of the invocation: each event is formatted once and the line handed to each.
struct Tee(Vec<Arc<dyn Sink>>);

impl Sink for Tee {
    fn write_line(&self, line: &[u8]) {
        for sink in &self.0 {
            sink.write_line(line);
        }
    }
}

/// Installs the global subscriber: stderr, the log file and the daemon's relay, each when
/// given and usable. Returns notes about problems (unknown level, log file not writable) for
/// the caller to log once the subscriber is up.
pub fn init(level: &str, log_file: Option<&Path>, relay: Option<&Path>) -> Vec<String> {
    let mut notes = Vec::new();
    let level = level_filter(level).unwrap_or_else(|e| {
        notes.push(e);
        LevelFilter::INFO
    });
    // Our lines at the configured level; the libraries' (kube, hyper, rustls) only when they
    // warn: their debug output is about connection pools, not about the pod.
    let filter = Targets::new()
        .with_target("istio_cni", level)
        .with_default(level.min(LevelFilter::WARN));
    let mut sinks: Vec<Arc<dyn Sink>> = vec![Arc::new(Stderr)];
    if let Some(p) = log_file {
        match RotatingFile::open(p, MAX_LOG_BYTES) {
            Ok(f) => sinks.push(Arc::new(f)),
            Err(e) => notes.push(format!("cannot open log file {}: {e}", p.display())),
        }
    }
    if let Some(r) = relay.and_then(Relay::connect) {
        let r = Arc::new(r);
        let _ = FIGURES_TO.set(r.clone());
        sinks.push(r);
    }
    let _ = tracing_subscriber::registry()
        .with(json_layer(SinkMaker(Arc::new(Tee(sinks))), filter))
        .try_init();
    notes
}

/// JSON lines; the span list (outermost first) puts the pod and container on every line, also
/// on lines logged inside a library's own span.
fn json_layer<S, W>(writer: W, filter: Targets) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(false)
        .with_span_list(true)
        .with_writer(writer)
        .with_filter(filter)
}

/// The span every line of one invocation is logged in: it carries the pod and container.
/// Pod fields are empty for commands without a pod (STATUS, GC).
pub fn command_span(
    command: &str,
    container_id: &str,
    pod_namespace: &str,
    pod_name: &str,
) -> tracing::Span {
    let span = tracing::span!(
        Level::INFO,
        "cni",
        command,
        container_id,
        pod_namespace = tracing::field::Empty,
        pod_name = tracing::field::Empty,
    );
    if !pod_name.is_empty() {
        span.record("pod_namespace", pod_namespace);
        span.record("pod_name", pod_name);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn levels() {
        assert_eq!(level_filter("debug").unwrap(), LevelFilter::DEBUG);
        assert_eq!(level_filter("FATAL").unwrap(), LevelFilter::ERROR);
        assert!(level_filter("loud").is_err());
    }

    #[test]
    fn rotates_at_the_cap_keeping_one_backup() {
        let dir = std::env::temp_dir().join(format!("istio-cni-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("istio-cni.log");
        let f = RotatingFile::open(&path, 100).unwrap();
        for i in 0..10 {
            f.append(format!("line {i:02} ......................\n").as_bytes())
                .unwrap();
        }
        let live = std::fs::read_to_string(&path).unwrap();
        let backup = std::fs::read_to_string(dir.join("istio-cni.log.1")).unwrap();
        assert!(live.len() <= 100 && backup.len() <= 100);
        assert!(live.contains("line 09"));
        assert!(!dir.join("istio-cni.log.2").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn never_opens_a_fifo_and_never_waits_for_one() {
        let dir = std::env::temp_dir().join(format!("istio-cni-log-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("istio-cni.log");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a plain syscall on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No reader: refused at once (a blocking open would wait forever).
        let e = RotatingFile::open(&path, 100).err().expect("refused");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // A reader that never reads: refused too (writes would wait once the pipe is full).
        let _reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let e = RotatingFile::open(&path, 100).err().expect("refused");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn never_writes_through_a_symlink() {
        let dir = std::env::temp_dir().join(format!("istio-cni-log-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let outside = dir.join("outside");
        std::fs::write(&outside, "untouched").unwrap();
        let path = dir.join("istio-cni.log");
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        let e = RotatingFile::open(&path, 100).err().expect("refused");
        assert!(e.to_string().contains("symlink"), "{e}");
        // A symlinked backup is replaced by the rotation, never written through.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("istio-cni.log.1")).unwrap();
        let f = RotatingFile::open(&path, 50).unwrap();
        for i in 0..5 {
            f.append(format!("line {i} ..................\n").as_bytes())
                .unwrap();
        }
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
        assert!(
            !std::fs::symlink_metadata(dir.join("istio-cni.log.1"))
                .unwrap()
                .is_symlink()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
