//! The durable header records of each transcript ("The instruction header and its
//! revisions": "The observation is written once and replayed like any other record"),
//! so that the host can answer `runtime.instructions` from them.
//!
//! One SQLite table (in `instructions.db`, opened by [`crate::durable::open`]) holds the
//! records of every transcript, each as its JSON record, in the order written. The first
//! record of a transcript is a pin; a revision extends the newest record's text (its base
//! digest is that record's digest) and is written once: appending the revision the
//! newest record already is (same digest, same base) returns that record (our reading of
//! "written once", scoped to the newest record so that a text changed back and again is
//! still recorded each time). This module never renders an observation and never
//! decides on its own when to pin (that is [`super::rules`]).

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::chain::{ChainError, Resolution, resolve};
use super::records::{Actor, Digest, HeaderPin, HeaderRecord, HeaderRevision};
use super::revise::build_revision;
use super::rules::{Decision, Occasion, decide};
use super::sources::{Source, SourceSetError, check_sources, joined_text};

/// The database file in the host's data directory (our choice; the spec says the
/// records are written and replayed, not where).
pub const DATABASE_FILE: &str = "instructions.db";

/// Why the store could not read or write.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened.
    #[error("cannot open the instruction store: {0}")]
    Open(String),
    /// SQLite failed.
    #[error("instruction store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A thread panicked while holding the connection.
    #[error("the instruction store's lock is poisoned")]
    Poisoned,
    /// A stored record is not a header record.
    #[error("record {seq} of transcript {transcript:?} does not decode: {error}")]
    Decode {
        /// The transcript.
        transcript: String,
        /// The record's position (from 1).
        seq: u64,
        /// Why.
        error: String,
    },
    /// A record does not encode as JSON.
    #[error("a header record does not encode: {0}")]
    Encode(String),
    /// The chain has no resolution (no pin, or a pin that does not verify).
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// A revision whose base is not the newest record's text.
    #[error("the revision applies to {base}, the newest record is {newest}")]
    StaleBase {
        /// The newest record's digest.
        newest: Digest,
        /// The revision's base digest.
        base: Digest,
    },
    /// A change on a chain that stopped: a revision after the stop could not resolve.
    /// The head moves at the next fold.
    #[error("the chain stopped at revision {index} ({code}); no revision can extend it")]
    ChainStopped {
        /// [`super::ChainStop::index`].
        index: usize,
        /// [`super::LinkError::code`].
        code: &'static str,
    },
    /// The current sources are not a set.
    #[error(transparent)]
    Sources(#[from] SourceSetError),
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The record was written at this position (from 1).
    Written(u64),
    /// The newest record already was this one, at this position.
    Existing(u64),
}

/// What [`InstructionStore::record`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The head was pinned (rule 1 or 3).
    Pinned(HeaderPin),
    /// A revision was written (rule 2): render it at this sequence.
    Revised(HeaderRevision),
    /// Nothing: the head keeps its bytes.
    Kept,
}

/// The instruction store.
#[derive(Debug)]
pub struct InstructionStore {
    conn: Mutex<Connection>,
}

impl InstructionStore {
    /// Opens (creating) `dir/`[`DATABASE_FILE`] (0600, WAL, `synchronous=FULL`).
    ///
    /// # Errors
    /// The file-system or SQLite error.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let conn = crate::durable::open(&dir.join(DATABASE_FILE)).map_err(StoreError::Open)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS header_records (
                 transcript TEXT NOT NULL,
                 seq INTEGER NOT NULL,
                 type TEXT NOT NULL CHECK (type IN ('header_pin', 'header_revision')),
                 digest TEXT NOT NULL,
                 base_digest TEXT,
                 record TEXT NOT NULL,
                 PRIMARY KEY (transcript, seq)
             );",
        )?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| StoreError::Poisoned)
    }

    /// Appends `record` to `transcript`'s records (the transcript's identity: our
    /// reading, the session's ID).
    ///
    /// # Errors
    /// [`ChainError::NoPin`] for a revision before any pin, [`StoreError::StaleBase`] for
    /// a revision that does not extend the newest record, or SQLite's error.
    pub fn append(&self, transcript: &str, record: &HeaderRecord) -> Result<Appended, StoreError> {
        let mut conn = self.lock()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let appended = append_in(&tx, transcript, record)?;
        tx.commit()?;
        Ok(appended)
    }

    /// Every record of `transcript`, in the order written.
    ///
    /// # Errors
    /// SQLite's error, or a record that does not decode.
    pub fn records(&self, transcript: &str) -> Result<Vec<HeaderRecord>, StoreError> {
        let conn = self.lock()?;
        read(&conn, transcript)
    }

    /// `transcript`'s chain resolved (the answer to `runtime.instructions`, see
    /// [`Resolution::reply`]).
    ///
    /// # Errors
    /// [`StoreError::Chain`] when there is no pin or it does not verify; SQLite's error.
    pub fn resolve(&self, transcript: &str) -> Result<Resolution, StoreError> {
        Ok(resolve(&self.records(transcript)?)?)
    }

    /// Applies the header rules to `transcript` while the runtime's current sources are
    /// `sources`, in one transaction: pins, writes a revision (built against the newest
    /// reconstructable text and attributed to `actor`), or keeps. `at_ms` is the pin's
    /// `pinned_at_ms` or the revision's `observed_at_ms`.
    ///
    /// # Errors
    /// [`StoreError::Sources`] when `sources` is not a set; [`StoreError::ChainStopped`]
    /// when a revision is due on a chain that stopped; [`ChainError::PinDoesNotVerify`];
    /// SQLite's error.
    pub fn record(
        &self,
        transcript: &str,
        sources: Vec<Source>,
        occasion: Occasion,
        actor: Actor,
        at_ms: u64,
    ) -> Result<Recorded, StoreError> {
        check_sources(&sources)?;
        let mut conn = self.lock()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let resolution = match resolve(&read(&tx, transcript)?) {
            Ok(resolution) => Some(resolution),
            Err(ChainError::NoPin) => None,
            Err(other) => return Err(other.into()),
        };
        let text = joined_text(&sources);
        let head = resolution.as_ref().map(Resolution::head);
        let recorded = match (
            decide(head.as_ref(), &Digest::of(&text), occasion),
            resolution,
        ) {
            (Decision::Keep, _) => Recorded::Kept,
            (Decision::Pin(reason), _) => {
                let pin = HeaderPin::new(text, reason, at_ms);
                append_in(&tx, transcript, &HeaderRecord::HeaderPin(pin.clone()))?;
                Recorded::Pinned(pin)
            }
            (Decision::Revise, None) => return Err(ChainError::NoPin.into()),
            (Decision::Revise, Some(resolution)) => {
                if let Some(stop) = &resolution.stop {
                    return Err(StoreError::ChainStopped {
                        index: stop.index,
                        code: stop.error.code(),
                    });
                }
                let revision = build_revision(&resolution.newest, sources, actor, at_ms)?;
                append_in(
                    &tx,
                    transcript,
                    &HeaderRecord::HeaderRevision(revision.clone()),
                )?;
                Recorded::Revised(revision)
            }
        };
        tx.commit()?;
        Ok(recorded)
    }
}

fn append_in(
    conn: &Connection,
    transcript: &str,
    record: &HeaderRecord,
) -> Result<Appended, StoreError> {
    let newest: Option<(i64, String)> = conn
        .query_row(
            "SELECT seq, record FROM header_records
             WHERE transcript = ?1 ORDER BY seq DESC LIMIT 1",
            params![transcript],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let newest = match newest {
        Some((seq, json)) => {
            let seq = seq as u64;
            Some((seq, decode(transcript, seq, &json)?))
        }
        None => None,
    };
    let base = match record {
        HeaderRecord::HeaderPin(_) => {
            if let Some((seq, existing)) = &newest
                && existing == record
            {
                return Ok(Appended::Existing(*seq));
            }
            None
        }
        HeaderRecord::HeaderRevision(revision) => {
            let base = revision.change.base_digest();
            let Some((seq, existing)) = &newest else {
                return Err(ChainError::NoPin.into());
            };
            if let HeaderRecord::HeaderRevision(existing) = existing
                && existing.digest == revision.digest
                && existing.change.base_digest() == base
            {
                return Ok(Appended::Existing(*seq));
            }
            if existing.digest() != base {
                return Err(StoreError::StaleBase {
                    newest: existing.digest().clone(),
                    base: base.clone(),
                });
            }
            Some(base.as_str())
        }
    };
    let kind = match record {
        HeaderRecord::HeaderPin(_) => "header_pin",
        HeaderRecord::HeaderRevision(_) => "header_revision",
    };
    let seq = newest.map_or(1, |(seq, _)| seq + 1);
    let json = serde_json::to_string(record).map_err(|e| StoreError::Encode(e.to_string()))?;
    conn.execute(
        "INSERT INTO header_records (transcript, seq, type, digest, base_digest, record)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            transcript,
            seq as i64,
            kind,
            record.digest().as_str(),
            base,
            json
        ],
    )?;
    Ok(Appended::Written(seq))
}

fn decode(transcript: &str, seq: u64, json: &str) -> Result<HeaderRecord, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Decode {
        transcript: transcript.to_string(),
        seq,
        error: e.to_string(),
    })
}

fn read(conn: &Connection, transcript: &str) -> Result<Vec<HeaderRecord>, StoreError> {
    let mut statement =
        conn.prepare("SELECT seq, record FROM header_records WHERE transcript = ?1 ORDER BY seq")?;
    let rows = statement.query_map(params![transcript], |row| {
        Ok((row.get::<_, i64>(0)? as u64, row.get::<_, String>(1)?))
    })?;
    let mut records = Vec::new();
    for row in rows {
        let (seq, json) = row?;
        records.push(decode(transcript, seq, &json)?);
    }
    Ok(records)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
