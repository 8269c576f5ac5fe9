//! Reading the program's stdout (deltas or records) and stderr (the bounded tail).

use super::*;

/// Index at which `bytes` (a full piece) is cut so that a UTF-8 character whose first
/// bytes end the piece moves whole to the next piece.
pub(super) fn utf8_cut(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte: look further back
        }
        let needed = match byte {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            // ASCII, or a byte that never starts a character: it stays.
            _ => 1,
        };
        return if needed > back { len - back } else { len };
    }
    len
}

/// Reads a pipe in pieces: a line (with its `\n`) or, for longer lines, at most `max`
/// bytes.
pub(super) struct PieceReader<R> {
    pub(super) inner: BufReader<R>,
    pub(super) max: usize,
    pub(super) carry: Vec<u8>,
}

impl<R: AsyncRead + Unpin> PieceReader<R> {
    pub(super) fn new(inner: R, max: usize) -> Self {
        Self {
            inner: BufReader::new(inner),
            max,
            carry: Vec::new(),
        }
    }

    /// The next piece, or `None` at EOF. Not cancel-safe: a cancelled call loses the
    /// piece it was assembling.
    pub(super) async fn next_piece(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut piece = std::mem::take(&mut self.carry);
        loop {
            if piece.len() >= self.max {
                let cut = utf8_cut(&piece[..self.max]);
                self.carry = piece.split_off(cut);
                return Ok(Some(piece));
            }
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                return Ok((!piece.is_empty()).then_some(piece));
            }
            let window = &buf[..buf.len().min(self.max - piece.len())];
            if let Some(pos) = window.iter().position(|&b| b == b'\n') {
                piece.extend_from_slice(&window[..=pos]);
                self.inner.consume(pos + 1);
                return Ok(Some(piece));
            }
            let n = window.len();
            piece.extend_from_slice(window);
            self.inner.consume(n);
        }
    }
}

/// The next piece of `reader`, or `None` at EOF, on a read error, or when the adapter
/// gave up waiting and no data is ready (then at most
/// [`DRAIN_AFTER_GIVE_UP_MAX_BYTES`] more are read).
pub(super) async fn next_or_give_up<R: AsyncRead + Unpin>(
    reader: &mut PieceReader<R>,
    give_up: &mut watch::Receiver<bool>,
    after_give_up: &mut usize,
) -> Option<Vec<u8>> {
    if *give_up.borrow() && *after_give_up > DRAIN_AFTER_GIVE_UP_MAX_BYTES {
        return None;
    }
    let piece = tokio::select! {
        biased;
        piece = reader.next_piece() => piece,
        _ = give_up.wait_for(|g| *g) => return None,
    };
    match piece {
        Ok(Some(bytes)) => {
            if *give_up.borrow() {
                *after_give_up += bytes.len();
            }
            Some(bytes)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "command adapter: reading program output failed");
            None
        }
    }
}

/// Forwards stdout pieces as deltas. Keeps reading (and discarding) when the Run's
/// event stream was dropped, so the program never blocks on a full pipe.
pub(super) async fn forward_stdout(
    stdout: Box<dyn AsyncRead + Send + Unpin>,
    events: RunEventSink,
    mut give_up: watch::Receiver<bool>,
) {
    let mut reader = PieceReader::new(stdout, STDOUT_LINE_MAX_BYTES);
    let mut after_give_up = 0;
    let mut delivering = true;
    while let Some(bytes) = next_or_give_up(&mut reader, &mut give_up, &mut after_give_up).await {
        if delivering {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let delta = NativeEvent::Delta {
                text,
                item_id: None,
            };
            delivering = events.send(delta).await.is_ok();
        }
    }
}

/// Decodes `jsonl` stdout records into native events. The first refused record is
/// recorded as the Run's protocol violation (which stops the program); nothing after
/// it is delivered. Keeps reading (and discarding) afterwards, and when the Run's event
/// stream was dropped, so the program never blocks on a full pipe.
pub(super) async fn forward_jsonl(
    stdout: Box<dyn AsyncRead + Send + Unpin>,
    events: RunEventSink,
    mut give_up: watch::Receiver<bool>,
    run: Arc<JsonlRun>,
) {
    let mut reader = PieceReader::new(stdout, JSONL_RECORD_MAX_BYTES);
    let mut after_give_up = 0;
    let mut delivering = true;
    let mut number: u64 = 0;
    while let Some(bytes) = next_or_give_up(&mut reader, &mut give_up, &mut after_give_up).await {
        if !delivering {
            continue;
        }
        number += 1;
        match run.translate(&bytes) {
            Ok(None) => {}
            Ok(Some(event)) => delivering = events.send(event).await.is_ok(),
            Err(e) => {
                run.violate(format!("stdout record {number}: {e} ({})", e.code()));
                delivering = false;
            }
        }
    }
}

/// The bounded tail of stderr ([`STDERR_TAIL_LINES`], [`STDERR_TAIL_BYTES`], each line
/// cut at [`STDERR_LINE_MAX_BYTES`]).
pub(super) fn stderr_tail() -> OutputTail {
    OutputTail::new(STDERR_TAIL_LINES, STDERR_TAIL_BYTES, STDERR_LINE_MAX_BYTES)
}

pub(super) async fn collect_stderr(
    stderr: Box<dyn AsyncRead + Send + Unpin>,
    tail: Arc<Mutex<OutputTail>>,
    mut give_up: watch::Receiver<bool>,
) {
    let mut reader = PieceReader::new(stderr, STDERR_LINE_MAX_BYTES);
    let mut after_give_up = 0;
    while let Some(bytes) = next_or_give_up(&mut reader, &mut give_up, &mut after_give_up).await {
        tail.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(&bytes);
    }
}

/// The stdout and stderr tasks of one Run.
pub(super) struct OutputTasks {
    pub(super) stdout: Option<JoinHandle<()>>,
    pub(super) stderr: Option<JoinHandle<()>>,
}

impl OutputTasks {
    /// Waits for both tasks (cancel-safe: a finished task is not polled again).
    pub(super) async fn join(&mut self) {
        for slot in [&mut self.stdout, &mut self.stderr] {
            if let Some(task) = slot.as_mut() {
                let _ = task.await;
                *slot = None;
            }
        }
    }

    /// Waits up to `grace` for EOF, then gives up on output held open by processes
    /// outside the group and waits for the tasks to stop (delivery of pieces already
    /// read is the Run's event queue's business and is never cut).
    pub(super) async fn finish(&mut self, give_up: &watch::Sender<bool>, grace: Duration) {
        if tokio::time::timeout(grace, self.join()).await.is_err() {
            tracing::warn!(
                "command adapter: program output still open after the program ended; giving up on it"
            );
            give_up.send_replace(true);
            self.join().await;
        }
    }
}
