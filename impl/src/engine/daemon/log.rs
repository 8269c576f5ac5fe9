//! The durable event log ("StreamEvents", "Bounds and backpressure").
//!
//! Every run event is committed to SQLite before any client sees it. One writer thread
//! owns the write connection and commits whatever is queued in one transaction (group
//! commit), so a fast run costs one fsync per batch, not per event; the queue to it is
//! bounded and is the only thing that may slow a run (the disk, never a client).
//!
//! After a batch commits, the writer takes each run's [`RunLog`] lock, moves its
//! `latest` sequence and hands the events to the run's live tails. A tail is a bounded
//! queue: one that is full is cut off (marked lagged) instead of waiting, so "a slow
//! client [...] never backpressures kernel execution".
//!
//! [`EventLog::capture`] implements "atomically captures retained bounds and a
//! count/byte-bounded page [...] Live tail registration occurs under the same lock only
//! at the captured head, preventing a replay/tail gap": the page is read and the tail
//! registered while the run's lock is held, and the writer needs that lock to publish.
//!
//! This module owns the events table and the tails; it never decides what a run emits.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prost::Message;
use rusqlite::{Connection, params};
use tokio::sync::{mpsc, watch};

use crate::engine::proto::engine::v1::RunEvent;

/// Events a live tail may hold undelivered before its reader is cut off as slow.
pub const TAIL_QUEUE_MAX: usize = 1_024;

/// Events queued to the writer thread before a run waits for the disk.
pub const WRITE_QUEUE_MAX: usize = 8_192;

/// Times a failed batch is committed again before the daemon stops.
pub const COMMIT_ATTEMPTS: u32 = 4;

/// Most events committed in one transaction.
pub const WRITE_BATCH_MAX: usize = 2_048;

/// One run's published state.
#[derive(Debug)]
pub struct RunLog {
    run_id: String,
    state: Mutex<LogState>,
    /// The next sequence the run's executor assigns.
    next: AtomicU64,
    committed: watch::Sender<u64>,
}

#[derive(Debug)]
struct LogState {
    latest: u64,
    oldest: u64,
    closed: bool,
    tails: Vec<TailSender>,
}

#[derive(Debug)]
struct TailSender {
    tx: mpsc::Sender<Arc<RunEvent>>,
    lagged: Arc<AtomicBool>,
}

/// A live tail: events after the captured head, in order.
#[derive(Debug)]
pub struct Tail {
    /// The events.
    pub rx: mpsc::Receiver<Arc<RunEvent>>,
    lagged: Arc<AtomicBool>,
}

impl Tail {
    /// Whether the tail ended because its reader fell [`TAIL_QUEUE_MAX`] events behind.
    pub fn lagged(&self) -> bool {
        self.lagged.load(Ordering::Acquire)
    }
}

impl RunLog {
    /// A run's log whose last sequence is `latest` and oldest retained one `oldest`
    /// (`latest + 1` when nothing is retained).
    pub fn new(run_id: &str, latest: u64, oldest: u64, closed: bool) -> Arc<Self> {
        Arc::new(Self {
            run_id: run_id.to_string(),
            state: Mutex::new(LogState {
                latest,
                oldest,
                closed,
                tails: Vec::new(),
            }),
            next: AtomicU64::new(latest + 1),
            committed: watch::channel(latest).0,
        })
    }

    /// The run.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Takes the next sequence (the run's executor is the only caller per run).
    pub fn next_sequence(&self) -> u64 {
        self.next.fetch_add(1, Ordering::AcqRel)
    }

    /// The latest published sequence.
    pub fn latest(&self) -> u64 {
        self.lock().latest
    }

    /// Waits until `sequence` is committed and published.
    pub async fn committed(&self, sequence: u64) {
        let mut rx = self.committed.subscribe();
        let _ = rx.wait_for(|c| *c >= sequence).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A captured page.
#[derive(Debug)]
pub struct Page {
    /// The events, in order.
    pub events: Vec<RunEvent>,
    /// The run's latest sequence at capture.
    pub latest: u64,
    /// The oldest retained sequence at capture.
    pub oldest: u64,
    /// The sequence the page starts after: the request's `after_sequence`, or, for `0`
    /// ("from the first retained one"), the one before the oldest retained event.
    pub after: u64,
    /// The tail registered at the captured head, when asked and the page reached it.
    pub tail: Option<Tail>,
}

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The cursor is before the retained history.
    #[error(
        "cursor_gap: after_sequence {after} is before the oldest retained event {oldest}; resume from {} or later",
        oldest.saturating_sub(1)
    )]
    Gap {
        /// The cursor.
        after: u64,
        /// The oldest retained sequence.
        oldest: u64,
    },
    /// The cursor is past the latest event.
    #[error("cursor_ahead: after_sequence {after} is past the latest event {latest}")]
    Ahead {
        /// The cursor.
        after: u64,
        /// The latest sequence.
        latest: u64,
    },
    /// The database failed.
    #[error("event log: {0}")]
    Store(String),
}

struct Append {
    run: Arc<RunLog>,
    sequence: u64,
    bytes: Vec<u8>,
    event: Arc<RunEvent>,
    close: bool,
}

/// The event log.
#[derive(Debug)]
pub struct EventLog {
    writer: mpsc::Sender<Append>,
    reader: Mutex<Connection>,
    retained: u64,
}

impl std::fmt::Debug for Append {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Append({} #{})", self.run.run_id, self.sequence)
    }
}

impl EventLog {
    /// Opens the log in `db` (the daemon's database file), keeping `retained` events per
    /// run, and starts the writer thread.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open(db: &Path, retained: u64) -> Result<Arc<Self>, String> {
        let conn = crate::durable::open(db)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS events (
                 run_id TEXT NOT NULL,
                 sequence INTEGER NOT NULL,
                 event BLOB NOT NULL,
                 PRIMARY KEY (run_id, sequence)
             ) WITHOUT ROWID;",
        )
        .map_err(|e| e.to_string())?;
        let reader = crate::durable::open(db)?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE_MAX);
        std::thread::Builder::new()
            .name("engine-event-writer".into())
            .spawn(move || writer(conn, rx, retained))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            writer: tx,
            reader: Mutex::new(reader),
            retained: retained.max(1),
        }))
    }

    /// Events retained per run.
    pub fn retained(&self) -> u64 {
        self.retained
    }

    /// The bounds stored for `run_id`: `(latest, oldest)`, or `None` without events.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn stored_bounds(&self, run_id: &str) -> Result<Option<(u64, u64)>, String> {
        let conn = self.reader();
        conn.query_row(
            "SELECT MAX(sequence), MIN(sequence) FROM events WHERE run_id = ?1",
            params![run_id],
            |row| Ok((row.get::<_, Option<i64>>(0)?, row.get::<_, Option<i64>>(1)?)),
        )
        .map(|(max, min)| max.zip(min).map(|(a, b)| (a as u64, b as u64)))
        .map_err(|e| e.to_string())
    }

    /// The last stored event of `run_id`.
    ///
    /// # Errors
    /// The SQLite error, or a stored event that does not decode, as text.
    pub fn last_event(&self, run_id: &str) -> Result<Option<RunEvent>, String> {
        use rusqlite::OptionalExtension;
        let conn = self.reader();
        let bytes: Option<Vec<u8>> = conn
            .query_row(
                "SELECT event FROM events WHERE run_id = ?1 ORDER BY sequence DESC LIMIT 1",
                params![run_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        bytes
            .map(|b| RunEvent::decode(b.as_slice()).map_err(|e| e.to_string()))
            .transpose()
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `event` (its `sequence` already set) for commit; `close` marks the run's
    /// last event (its tails end after it). Returns once queued, not committed: wait
    /// with [`RunLog::committed`].
    ///
    /// # Errors
    /// The writer has stopped.
    pub async fn append(
        &self,
        run: &Arc<RunLog>,
        event: RunEvent,
        close: bool,
    ) -> Result<(), String> {
        let bytes = event.encode_to_vec();
        let sequence = event.sequence;
        self.writer
            .send(Append {
                run: run.clone(),
                sequence,
                bytes,
                event: Arc::new(event),
                close,
            })
            .await
            .map_err(|_| "the event writer has stopped".to_string())
    }

    /// The atomic capture: bounds, then up to `max_events` events (and `max_bytes`
    /// encoded bytes, at least one event) after `after`, then — when `tail` is asked and
    /// the page reaches the head and the run is open — a live tail at that head, all
    /// under the run's lock.
    ///
    /// # Errors
    /// [`CaptureError`].
    pub fn capture(
        &self,
        run: &RunLog,
        after: u64,
        max_events: u32,
        max_bytes: u64,
        tail: bool,
    ) -> Result<Page, CaptureError> {
        let mut state = run.lock();
        let (latest, oldest) = (state.latest, state.oldest);
        // `after_sequence` 0 reads from the first retained event, wherever the run's
        // sequence starts (engine.proto, `StreamEventsRequest`).
        let after = if after == 0 {
            oldest.saturating_sub(1)
        } else {
            after
        };
        if after > latest {
            return Err(CaptureError::Ahead { after, latest });
        }
        if after + 1 < oldest {
            return Err(CaptureError::Gap { after, oldest });
        }
        let mut events = Vec::new();
        if after < latest {
            let conn = self.reader();
            let mut stmt = conn
                .prepare_cached(
                    "SELECT event FROM events WHERE run_id = ?1 AND sequence > ?2 AND sequence <= ?3
                     ORDER BY sequence LIMIT ?4",
                )
                .map_err(|e| CaptureError::Store(e.to_string()))?;
            let rows = stmt
                .query_map(
                    params![
                        run.run_id,
                        after as i64,
                        latest as i64,
                        i64::from(max_events)
                    ],
                    |row| row.get::<_, Vec<u8>>(0),
                )
                .map_err(|e| CaptureError::Store(e.to_string()))?;
            let mut bytes = 0u64;
            for row in rows {
                let row = row.map_err(|e| CaptureError::Store(e.to_string()))?;
                if !events.is_empty() && bytes + row.len() as u64 > max_bytes {
                    break;
                }
                bytes += row.len() as u64;
                let event = RunEvent::decode(row.as_slice())
                    .map_err(|e| CaptureError::Store(e.to_string()))?;
                events.push(event);
            }
            // Events are contiguous; a missing first one was pruned after the bounds moved.
            if events.first().map(|e| e.sequence) != Some(after + 1) {
                return Err(CaptureError::Gap {
                    after,
                    oldest: events.first().map_or(latest + 1, |e| e.sequence),
                });
            }
        }
        let reached = events.last().map_or(after, |e| e.sequence) == latest;
        let tail = (tail && reached && !state.closed).then(|| {
            let (tx, rx) = mpsc::channel(TAIL_QUEUE_MAX);
            let lagged = Arc::new(AtomicBool::new(false));
            state.tails.push(TailSender {
                tx,
                lagged: lagged.clone(),
            });
            Tail { rx, lagged }
        });
        Ok(Page {
            events,
            latest,
            oldest,
            after,
            tail,
        })
    }
}

fn writer(mut conn: Connection, mut rx: mpsc::Receiver<Append>, retained: u64) {
    let retained = retained.max(1);
    let mut batch = Vec::with_capacity(WRITE_BATCH_MAX);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < WRITE_BATCH_MAX {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut attempt = 0;
        while let Err(e) = commit(&mut conn, &batch, retained) {
            attempt += 1;
            if attempt >= COMMIT_ATTEMPTS {
                // Fail-stop: events that cannot be made durable are never published, and
                // the daemon does not go on with a hole in a run's sequence. A restart
                // recovers what was committed (the runs that were executing end
                // uncertain).
                eprintln!(
                    "contract-impl engine: the event log cannot commit ({e}); stopping so that nothing uncommitted is reported"
                );
                std::process::exit(70);
            }
            std::thread::sleep(std::time::Duration::from_millis(50 << attempt));
        }
        let mut runs: HashMap<&str, (&Arc<RunLog>, u64)> = HashMap::new();
        for a in &batch {
            let mut state = a.run.lock();
            state.latest = state.latest.max(a.sequence);
            if a.sequence >= retained {
                state.oldest = state.oldest.max(a.sequence + 1 - retained);
            }
            state
                .tails
                .retain(|t| match t.tx.try_send(a.event.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        t.lagged.store(true, Ordering::Release);
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                });
            if a.close {
                state.closed = true;
                state.tails.clear();
            }
            runs.insert(a.run.run_id.as_str(), (&a.run, a.sequence));
        }
        for (run, sequence) in runs.into_values() {
            run.committed.send_replace(sequence);
        }
        batch.clear();
    }
}

fn commit(conn: &mut Connection, batch: &[Append], retained: u64) -> Result<(), rusqlite::Error> {
    let tx = conn.transaction()?;
    {
        let mut insert =
            tx.prepare_cached("INSERT INTO events (run_id, sequence, event) VALUES (?1, ?2, ?3)")?;
        let mut prune =
            tx.prepare_cached("DELETE FROM events WHERE run_id = ?1 AND sequence <= ?2")?;
        let mut heads: HashMap<&str, u64> = HashMap::new();
        for a in batch {
            insert.execute(params![a.run.run_id, a.sequence as i64, a.bytes])?;
            heads.insert(a.run.run_id.as_str(), a.sequence);
        }
        for (run, head) in heads {
            if head > retained {
                prune.execute(params![run, (head - retained) as i64])?;
            }
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::proto::engine::v1::{MessageDelta, run_event::Kind};

    fn delta(run: &RunLog, text: &str) -> RunEvent {
        RunEvent {
            run_id: run.run_id().into(),
            sequence: run.next_sequence(),
            kind: Some(Kind::Message(MessageDelta { text: text.into() })),
        }
    }

    #[tokio::test]
    async fn pages_tail_without_gap_and_prunes_to_the_retained_window() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(&dir.path().join("e.db"), 5).unwrap();
        let run = RunLog::new("run-1", 0, 1, false);
        for i in 0..3 {
            log.append(&run, delta(&run, &i.to_string()), false)
                .await
                .unwrap();
        }
        run.committed(3).await;
        let page = log.capture(&run, 0, 2, 1 << 20, true).unwrap();
        assert_eq!(page.events.len(), 2);
        assert!(
            page.tail.is_none(),
            "a page short of the head registers no tail"
        );
        let page = log.capture(&run, 2, 2, 1 << 20, true).unwrap();
        assert_eq!(
            page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            vec![3]
        );
        let mut tail = page.tail.expect("tail at the head");
        for i in 3..8 {
            log.append(&run, delta(&run, &i.to_string()), i == 7)
                .await
                .unwrap();
        }
        let mut seen = Vec::new();
        while let Some(e) = tail.rx.recv().await {
            seen.push(e.sequence);
        }
        assert_eq!(seen, vec![4, 5, 6, 7, 8]);
        assert!(!tail.lagged());
        // Retained: 5 of 8, so 4..=8; after 3 is the edge, after 2 a gap.
        assert_eq!(
            log.capture(&run, 3, 10, 1 << 20, false)
                .unwrap()
                .events
                .len(),
            5
        );
        assert!(matches!(
            log.capture(&run, 2, 10, 1 << 20, false),
            Err(CaptureError::Gap {
                after: 2,
                oldest: 4
            })
        ));
        assert!(matches!(
            log.capture(&run, 9, 10, 1 << 20, false),
            Err(CaptureError::Ahead { .. })
        ));
        // A byte bound of one byte still returns one event.
        assert_eq!(log.capture(&run, 3, 10, 1, false).unwrap().events.len(), 1);
        // After 0 is "from the first retained one", never a gap.
        let page = log.capture(&run, 0, 10, 1 << 20, false).unwrap();
        assert_eq!((page.after, page.events.len()), (3, 5));
    }

    #[tokio::test]
    async fn a_run_numbered_from_another_origin_reads_from_it_after_zero() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(&dir.path().join("e.db"), 100).unwrap();
        let run = RunLog::new("run-o", 999, 1000, false);
        for i in 0..2 {
            log.append(&run, delta(&run, &i.to_string()), false)
                .await
                .unwrap();
        }
        run.committed(1001).await;
        let page = log.capture(&run, 0, 10, 1 << 20, false).unwrap();
        assert_eq!(
            page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            vec![1000, 1001]
        );
        assert_eq!((page.after, page.oldest, page.latest), (999, 1000, 1001));
    }

    #[tokio::test]
    async fn a_full_tail_is_cut_off_and_the_run_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(&dir.path().join("e.db"), 100_000).unwrap();
        let run = RunLog::new("run-2", 0, 1, false);
        let tail = log
            .capture(&run, 0, 10, 1 << 20, true)
            .unwrap()
            .tail
            .unwrap();
        let total = TAIL_QUEUE_MAX as u64 + 10;
        for i in 0..total {
            log.append(&run, delta(&run, "x"), false).await.unwrap();
            let _ = i;
        }
        run.committed(total).await;
        assert!(tail.lagged(), "the unread tail was cut off");
        assert_eq!(run.latest(), total, "every event committed regardless");
    }
}
