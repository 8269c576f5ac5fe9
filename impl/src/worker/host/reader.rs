//! The reading half of a generation's connection: one task per worker that reads the
//! socket continuously, strictly decodes each frame and hands the messages to the host
//! in order, so the end of the stream or a bad frame is noticed even while the worker is
//! idle ("On EOF, bad framing, [...] or identity mismatch, invalidate the
//! connection/generation. Never attempt to resume a new frame after a partial payload").
//!
//! On the first fault the task reports it once, marks the generation invalid, shuts the
//! socket down in both directions (the worker reads the end of the stream) and, after
//! [`STOP_DELAY`], drops the supervisor's watch connection, which stops every process of
//! the generation. The delay lets a worker that is exiting by itself report its own
//! status to [`super::Worker`]'s record. The channel to the host is bounded, so a worker
//! that floods the host is read no faster than the host takes its messages.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::mpsc;

use super::{HostError, WatchHandle};
use crate::worker::wire::frame::decoder;
use crate::worker::wire::{Direction, Expect, Identifier, Message, decode_envelope};

/// Time between invalidation and the hard stop of the generation's processes.
pub const STOP_DELAY: Duration = Duration::from_millis(1000);

/// Messages read ahead of the host.
const INBOX: usize = 64;

/// What the host holds of the reading half.
pub(super) struct Reader {
    pub(super) inbox: mpsc::Receiver<Result<Message, HostError>>,
    pub(super) valid: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the reader of `read` for the connection's identity.
pub(super) fn start(
    read: OwnedReadHalf,
    watch: WatchHandle,
    session_id: Identifier,
    generation: Identifier,
) -> Reader {
    let (tx, inbox) = mpsc::channel(INBOX);
    let valid = Arc::new(AtomicBool::new(true));
    let task = tokio::spawn(read_loop(
        read,
        tx,
        valid.clone(),
        watch,
        session_id,
        generation,
    ));
    Reader { inbox, valid, task }
}

async fn read_loop(
    mut read: OwnedReadHalf,
    tx: mpsc::Sender<Result<Message, HostError>>,
    valid: Arc<AtomicBool>,
    watch: WatchHandle,
    session_id: Identifier,
    generation: Identifier,
) {
    let expect = Expect {
        session_id: session_id.as_str(),
        generation: generation.as_str(),
        direction: Direction::WorkerToHost,
    };
    let mut frames = decoder();
    let mut buf = vec![0u8; 64 * 1024];
    let fault = 'read: loop {
        let n = match read.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => break HostError::Io(e.to_string()),
        };
        if n == 0 {
            break match frames.finish() {
                Err(e) => HostError::Wire(e.into()),
                Ok(()) => HostError::Eof,
            };
        }
        frames.push(&buf[..n]);
        loop {
            match frames.next_frame() {
                Ok(Some(payload)) => match decode_envelope(&payload, Some(&expect)) {
                    Ok(envelope) => {
                        if tx.send(Ok(envelope.message)).await.is_err() {
                            break 'read HostError::Invalidated;
                        }
                    }
                    Err(e) => break 'read HostError::Wire(e),
                },
                Ok(None) => break,
                Err(e) => break 'read HostError::Wire(e.into()),
            }
        }
    };
    valid.store(false, Ordering::SeqCst);
    // Never blocks: with the inbox full the host meets the queued messages first.
    let _ = tx.try_send(Err(fault));
    drop(tx);
    // The connection is over for both directions.
    let _ = nix::sys::socket::shutdown(read.as_ref().as_raw_fd(), nix::sys::socket::Shutdown::Both);
    tokio::time::sleep(STOP_DELAY).await;
    if let Ok(mut watch) = watch.lock() {
        watch.take();
    }
}
