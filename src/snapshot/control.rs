//! The control socket: `ringbag trigger` talks to a running recorder over a unix stream
//! socket, one JSON line each way (a [`TriggerRequest`], then an [`Outcome`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::snapshotter::Cmd;
use super::trigger::{Origin, Outcome, TriggerRequest};

/// The service's control socket (systemd's `RuntimeDirectory=ringbag`).
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/ringbag/control.sock";
/// A request line longer than this is refused.
const MAX_REQUEST: u64 = 64 * 1024;
/// How long a connection may take to send its request, and the recorder to answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing listens there: no recorder is running (bad input for `ringbag trigger`).
    #[error("{}: no recorder is listening ({source}); is `ringbag record --snapshot-size ... --control-socket {}` or the service running?", path.display(), path.display())]
    NoRecorder {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another recorder already listens there (bad input for `record`).
    #[error("{}: another recorder already listens on this control socket", path.display())]
    InUse { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: unexpected answer from the recorder: {answer}", path.display())]
    Protocol { path: PathBuf, answer: String },
}

/// The listening side, in a thread of its own.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Bind `path` (replacing a stale socket nobody listens on) and serve triggers into `tx`.
    pub fn start(path: &Path, tx: Sender<Cmd>) -> Result<ControlServer, ControlError> {
        let io = |source| ControlError::Io {
            path: path.to_path_buf(),
            source,
        };
        if path.symlink_metadata().is_ok() {
            if UnixStream::connect(path).is_ok() {
                return Err(ControlError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(io)?;
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let listener = UnixListener::bind(path).map_err(io)?;
        // Polled, so the thread notices the stop flag without a wake-up connection.
        listener.set_nonblocking(true).map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ringbag-control".into())
                .spawn(move || serve(listener, tx, &stop))
                .map_err(io)?
        };
        log::info!("control socket {}: listening for triggers", path.display());
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            handle: Some(handle),
        })
    }

    /// Stop listening and remove the socket file.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(listener: UnixListener, tx: Sender<Cmd>, stop: &AtomicBool) {
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = answer(stream, &tx) {
                    log::warn!("control socket: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                log::warn!("control socket: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// One connection: read a request line, hand it to the snapshot thread, write its answer.
fn answer(stream: UnixStream, tx: &Sender<Cmd>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let outcome = match serde_json::from_str::<TriggerRequest>(line.trim()) {
        Err(e) => Outcome::Refused {
            why: format!("not a trigger request: {e}"),
        },
        Ok(req) => {
            let (rtx, rrx) = crossbeam_channel::bounded(1);
            let sent = tx.send(Cmd::Trigger {
                req,
                origin: Origin::Socket,
                at_ns: None,
                reply: Some(rtx),
            });
            match sent.ok().and_then(|_| rrx.recv_timeout(IO_TIMEOUT).ok()) {
                Some(o) => o,
                None => Outcome::Refused {
                    why: "the recorder is stopping".into(),
                },
            }
        }
    };
    let mut text = serde_json::to_string(&outcome).unwrap_or_default();
    text.push('\n');
    (&stream).write_all(text.as_bytes())
}

/// `ringbag trigger`: send one request to the recorder at `path`, return its answer.
pub fn send_trigger(path: &Path, req: &TriggerRequest) -> Result<Outcome, ControlError> {
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let stream = UnixStream::connect(path).map_err(|source| ControlError::NoRecorder {
        path: path.to_path_buf(),
        source,
    })?;
    stream.set_read_timeout(Some(IO_TIMEOUT * 2)).map_err(io)?;
    let mut text = serde_json::to_string(req).unwrap_or_default();
    text.push('\n');
    (&stream).write_all(text.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    BufReader::new((&stream).take(MAX_REQUEST))
        .read_line(&mut answer)
        .map_err(io)?;
    serde_json::from_str(answer.trim()).map_err(|_| ControlError::Protocol {
        path: path.to_path_buf(),
        answer: answer.trim().to_string(),
    })
}
