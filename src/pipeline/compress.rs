//! The recorder's split compressor (`--compression-mode file`): a pool of threads at nice 19
//! (and the lowest best-effort I/O priority) running the bag's [`CompressJob`]s, fed through
//! a bounded channel the writer never waits on ([`Compression::offer`] is a `try_send`).

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::bag::filemode::{CompressJob, FileCompression};
use crate::bag::writer::Compression;

/// The [`Compression`] the pipeline installs in its bag writer.
pub struct CompressPool {
    tx: Option<Sender<CompressJob>>,
    handles: Vec<JoinHandle<()>>,
}

impl CompressPool {
    /// Start `c.threads` threads behind a queue of `c.queue_size` splits (0 = unbounded).
    /// None if not one thread can be spawned (the writer then compresses inline).
    pub fn start(c: &FileCompression) -> Option<Self> {
        let (tx, rx) = match c.queue_size {
            0 => crossbeam_channel::unbounded(),
            n => crossbeam_channel::bounded(n),
        };
        let handles: Vec<_> = (0..c.threads.max(1))
            .filter_map(|i| {
                let rx: Receiver<CompressJob> = rx.clone();
                std::thread::Builder::new()
                    .name(format!("ringbag-zstd{i}"))
                    .spawn(move || {
                        crate::upload::agent::lower_priority("compression", false);
                        for job in rx {
                            job.run();
                        }
                    })
                    .ok()
            })
            .collect();
        (!handles.is_empty()).then_some(CompressPool {
            tx: Some(tx),
            handles,
        })
    }
}

impl Compression for CompressPool {
    fn offer(&mut self, job: CompressJob) -> Result<(), CompressJob> {
        match &self.tx {
            Some(tx) => tx.try_send(job).map_err(|e| match e {
                TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
            }),
            None => Err(job),
        }
    }

    fn push(&mut self, job: CompressJob) {
        match &self.tx {
            Some(tx) => {
                if let Err(e) = tx.send(job) {
                    // Every thread is gone (a panic): compress here.
                    e.into_inner().run();
                }
            }
            None => job.run(),
        }
    }

    fn wait_all(&mut self) {
        // Closing the channel ends each thread once the queue is empty.
        self.tx = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for CompressPool {
    fn drop(&mut self) {
        self.wait_all();
    }
}
