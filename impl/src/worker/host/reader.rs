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
//!
//! A `host_request` that names no live execution (a finished cell's background task, a
//! hook worker, a request while no cell runs) is refused `no_scope` here, at once, so a
//! worker waiting for that reply does not wait for the host's next cell ("Host effects
//! require the current live execution"; "that scope expires when the foreground cell
//! ends"). The live cell's own requests go to the host in order.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::mpsc;

use super::{HostError, Interrupter, SharedWriter, WatchHandle, write_frame};
use crate::worker::wire::frame::decoder;
use crate::worker::wire::{
    Direction, Envelope, Expect, Identifier, Message, Reply, decode_envelope,
};

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

/// What the reader needs to refuse a request of no live execution itself.
pub(super) struct Refusals {
    /// The connection's writing half (shared with the host).
    pub(super) writer: SharedWriter,
    /// Which execution is live now.
    pub(super) live: Interrupter,
    /// The refusal's code (the host's choice of name).
    pub(super) no_scope: &'static str,
    /// The refusal's message (a hook worker never has a host-effect scope).
    pub(super) message: &'static str,
    /// The bound of one write.
    pub(super) bound: Duration,
}

/// Starts the reader of `read` for the connection's identity.
pub(super) fn start(
    read: OwnedReadHalf,
    watch: WatchHandle,
    refusals: Refusals,
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
        refusals,
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
    refusals: Refusals,
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
                        if let Message::HostRequest {
                            id, execution_id, ..
                        } = &envelope.message
                            && refusals.live.running().as_ref() != Some(execution_id)
                        {
                            let reply = Envelope {
                                message: Message::HostReply {
                                    id: id.clone(),
                                    execution_id: execution_id.clone(),
                                    reply: Reply::Error {
                                        code: refusals.no_scope.into(),
                                        message: refusals.message.into(),
                                    },
                                },
                                ..envelope
                            };
                            if let Err(e) =
                                write_frame(&refusals.writer, &reply, refusals.bound).await
                            {
                                break 'read e;
                            }
                            continue;
                        }
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
