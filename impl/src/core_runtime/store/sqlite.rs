//! [`SqliteStore`]: [`CoreStore`] on embedded SQLite.
//!
//! The database is `core.sqlite3` in the data directory. It runs in WAL mode with
//! `synchronous=FULL` (a committed transaction is on disk before `COMMIT` returns),
//! foreign keys on, and a versioned schema: [`MIGRATIONS`] are applied in order inside
//! one transaction each, recorded in `schema_migrations`. Every mutation runs in an
//! `IMMEDIATE` transaction (the Session lock is the database write lock).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde_json::Value;

use super::credential::{acceptable_shape, digest_eq, hash_secret, listed_prefix};
use super::outcome::{CoreErrorCode, TurnOutcome, TurnState};
use super::*;

/// File name of the database inside the data directory.
pub const DATABASE_FILE: &str = "core.sqlite3";

/// How long a writer waits for the database lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one migration per version (index + 1). Never edit a released entry:
/// append a new one.
pub const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE devices (
    device_id TEXT PRIMARY KEY,
    owner_epoch INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE credentials (
    credential_id TEXT PRIMARY KEY,
    device_id TEXT NOT NULL REFERENCES devices(device_id),
    prefix TEXT NOT NULL,
    secret_sha256 BLOB NOT NULL,
    created_at_ms INTEGER NOT NULL,
    revoked_at_ms INTEGER
);
CREATE INDEX credentials_device ON credentials(device_id);
CREATE TABLE agents (
    agent_id TEXT PRIMARY KEY,
    definition TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE environments (
    environment_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('none', 'openai_hosted', 'self_hosted')),
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL REFERENCES agents(agent_id),
    environment_id TEXT NOT NULL REFERENCES environments(environment_id),
    frozen TEXT NOT NULL,
    native_session_id TEXT,
    started_turns INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE turns (
    turn_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    state TEXT NOT NULL,
    input TEXT NOT NULL,
    run_id TEXT UNIQUE,
    device_id TEXT,
    owner_epoch INTEGER,
    not_before_ms INTEGER NOT NULL,
    input_cursor INTEGER NOT NULL DEFAULT 0,
    outcome TEXT NOT NULL DEFAULT '{}',
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX turns_state ON turns(state, not_before_ms, created_at_ms);
CREATE INDEX turns_session ON turns(session_id, state);
CREATE TABLE turn_events (
    turn_id TEXT NOT NULL REFERENCES turns(turn_id),
    sequence INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    recorded_at_ms INTEGER NOT NULL,
    PRIMARY KEY (turn_id, sequence)
);
CREATE TABLE inputs (
    input_id TEXT PRIMARY KEY,
    turn_id TEXT NOT NULL REFERENCES turns(turn_id),
    position INTEGER NOT NULL,
    input TEXT NOT NULL,
    state TEXT NOT NULL,
    error_code TEXT,
    created_at_ms INTEGER NOT NULL,
    UNIQUE (turn_id, position)
);
CREATE TABLE interactions (
    turn_id TEXT NOT NULL REFERENCES turns(turn_id),
    interaction_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    answer TEXT,
    delivery_id TEXT,
    PRIMARY KEY (turn_id, kind, interaction_id)
);
CREATE TABLE write_reservations (
    reservation_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX one_open_write_per_session ON write_reservations(session_id) WHERE state = 'reserved';
"#];

/// Core's records in one SQLite database.
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    /// [`EVENTS_PER_TURN_MAX`], lowered by tests.
    events_max: u64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn to_json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(corrupt)
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(corrupt)
}

const TURN_COLUMNS: &str = "turn_id, session_id, state, input, run_id, device_id, owner_epoch, \
     not_before_ms, input_cursor, outcome, cancel_requested, created_at_ms, updated_at_ms";

type TurnRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    String,
    i64,
    i64,
    i64,
);

fn turn_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<TurnRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
        row.get(10)?,
        row.get(11)?,
        row.get(12)?,
    ))
}

fn turn_from_row(r: TurnRow) -> Result<TurnRecord, StoreError> {
    Ok(TurnRecord {
        turn_id: r.0,
        session_id: r.1,
        state: TurnState::parse(&r.2).ok_or_else(|| corrupt(format!("turn state `{}`", r.2)))?,
        input: from_json(&r.3)?,
        run_id: r.4,
        device_id: r.5,
        owner_epoch: r.6.map(|e| e as u64),
        not_before_ms: r.7,
        input_cursor: r.8 as u64,
        outcome: from_json(&r.9)?,
        cancel_requested: r.10 != 0,
        created_at_ms: r.11,
        updated_at_ms: r.12,
    })
}

/// The one row `sql` selects with `params`, mapped by `map`; [`StoreError::NotFound`]
/// (`kind`, `id`) when there is none. Every keyed lookup of a record goes through here.
fn one_row<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    (kind, id): (&'static str, &str),
    map: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<T, StoreError> {
    conn.query_row(sql, params, map)
        .optional()?
        .ok_or_else(|| StoreError::NotFound {
            kind,
            id: id.to_string(),
        })
}

/// Runs an `INSERT OR IGNORE` of a record that must be new; [`StoreError::AlreadyExists`]
/// (`kind`, `id`) when its key is taken. The caller commits.
fn insert_new<P: rusqlite::Params>(
    tx: &Transaction<'_>,
    sql: &str,
    params: P,
    (kind, id): (&'static str, &str),
) -> Result<(), StoreError> {
    if tx.execute(sql, params)? == 0 {
        return Err(StoreError::AlreadyExists {
            kind,
            id: id.to_string(),
        });
    }
    Ok(())
}

/// [`StoreError::NotFound`] (`kind`, `id`) unless `table` has a row whose `column` is `id`.
fn require_row(
    tx: &Transaction<'_>,
    (table, column): (&str, &str),
    (kind, id): (&'static str, &str),
) -> Result<(), StoreError> {
    one_row(
        tx,
        &format!("SELECT 1 FROM {table} WHERE {column} = ?1"),
        params![id],
        (kind, id),
        |_| Ok(()),
    )
}

fn load_turn(tx: &Connection, turn_id: &str) -> Result<TurnRecord, StoreError> {
    let row = one_row(
        tx,
        &format!("SELECT {TURN_COLUMNS} FROM turns WHERE turn_id = ?1"),
        params![turn_id],
        ("turn", turn_id),
        turn_row,
    )?;
    turn_from_row(row)
}

type InputRow = (String, String, i64, String, String, Option<String>, i64);

fn input_from_row(r: InputRow) -> Result<InputRecord, StoreError> {
    Ok(InputRecord {
        input_id: r.0,
        turn_id: r.1,
        position: r.2 as u64,
        input: from_json(&r.3)?,
        state: InputState::parse(&r.4).ok_or_else(|| corrupt(format!("input state `{}`", r.4)))?,
        error_code: r.5,
        created_at_ms: r.6,
    })
}

type InteractionRow = (
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

fn interaction_from_row(r: InteractionRow) -> Result<InteractionRecord, StoreError> {
    Ok(InteractionRecord {
        turn_id: r.0,
        interaction_id: r.1,
        kind: InteractionKind::parse(&r.2).ok_or_else(|| corrupt("interaction kind"))?,
        request: from_json(&r.3)?,
        state: InteractionState::parse(&r.4).ok_or_else(|| corrupt("interaction state"))?,
        answer: r.5.as_deref().map(from_json).transpose()?,
        delivery_id: r.6,
    })
}

/// Whether the Session has a Turn that is not terminal.
fn session_has_active_turn(tx: &Transaction<'_>, session_id: &str) -> Result<bool, StoreError> {
    Ok(tx
        .query_row(
            "SELECT 1 FROM turns WHERE session_id = ?1 AND state NOT IN ('completed','failed','cancelled') LIMIT 1",
            params![session_id],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

fn session_has_open_write(tx: &Transaction<'_>, session_id: &str) -> Result<bool, StoreError> {
    Ok(tx
        .query_row(
            "SELECT 1 FROM write_reservations WHERE session_id = ?1 AND state = 'reserved'",
            params![session_id],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

fn write_state_str(state: WriteState) -> &'static str {
    state.as_str()
}

/// The event kind whose place below [`EVENTS_PER_TURN_MAX`] is reserved.
const TERMINAL_EVENT_KIND: &str = "done";

/// Mode of the data directory: the owner only.
pub const DATA_DIR_MODE: u32 = 0o700;
/// Mode of the database file (SQLite gives its `-wal` and `-shm` files the same).
pub const DATABASE_FILE_MODE: u32 = 0o600;

/// Creates `data_dir` (0700) and the database file `path` (0600) if missing, and takes
/// group and other access away from existing ones: the database holds Turn inputs and
/// events, Session records and workspace write records, for the owner alone.
fn private_files(data_dir: &Path, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATA_DIR_MODE)
        .create(data_dir)?;
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(DATA_DIR_MODE))?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(DATABASE_FILE_MODE)
        .open(path)?;
    for file in [
        path.to_path_buf(),
        path.with_extension("sqlite3-wal"),
        path.with_extension("sqlite3-shm"),
    ] {
        if file.exists() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(DATABASE_FILE_MODE))?;
        }
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the database in `data_dir` and applies pending
    /// migrations. The directory is made 0700 and the database files 0600
    /// ([`DATA_DIR_MODE`], [`DATABASE_FILE_MODE`]).
    ///
    /// # Errors
    /// [`StoreError::Database`] when the directory or database cannot be opened, or a
    /// migration fails; [`StoreError::Corrupt`] when the database has a newer schema.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(DATABASE_FILE);
        private_files(data_dir, &path)
            .map_err(|e| StoreError::Database(format!("{}: {e}", data_dir.display())))?;
        let conn = Connection::open(&path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Database(format!(
                "journal_mode is {mode}, not wal"
            )));
        }
        conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")?;
        let mut store = Self {
            conn,
            path,
            events_max: EVENTS_PER_TURN_MAX,
        };
        store.migrate()?;
        Ok(store)
    }

    /// The same store with another event bound than [`EVENTS_PER_TURN_MAX`] (at most
    /// it): Core's `limits.events_per_turn`, for tests of the bound.
    pub fn with_events_max(mut self, max: u64) -> Self {
        self.events_max = max.min(EVENTS_PER_TURN_MAX);
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The applied schema version.
    ///
    /// # Errors
    /// Database failures.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        Ok(self.conn.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )?)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        self.conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)",
        )?;
        let current = self.schema_version()? as usize;
        if current > MIGRATIONS.len() {
            return Err(StoreError::Corrupt(format!(
                "schema version {current} is newer than this build ({})",
                MIGRATIONS.len()
            )));
        }
        for (index, sql) in MIGRATIONS.iter().enumerate().skip(current) {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(sql)?;
            tx.execute(
                "INSERT INTO schema_migrations (version) VALUES (?1)",
                params![index as i64 + 1],
            )?;
            tx.commit()?;
        }
        Ok(())
    }

    fn tx(&mut self) -> Result<Transaction<'_>, StoreError> {
        Ok(self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?)
    }
}

impl CoreStore for SqliteStore {
    fn add_credential(
        &mut self,
        credential_id: &str,
        device_id: &str,
        secret: &str,
        now_ms: i64,
    ) -> Result<String, StoreError> {
        if !acceptable_shape(secret) {
            return Err(StoreError::InvalidState(
                "not acceptable as a daemon credential (Project/Core key, shorter than 24 or longer than 512 bytes, or not visible ASCII)".into(),
            ));
        }
        let hash = hash_secret(secret);
        let tx = self.tx()?;
        // A revoked secret stays revoked: provisioning it again (a restart with the same
        // environment) must not bring it back.
        let revoked: Option<String> = tx
            .query_row(
                "SELECT credential_id FROM credentials WHERE secret_sha256 = ?1 AND revoked_at_ms IS NOT NULL",
                params![hash.as_slice()],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = revoked {
            return Err(StoreError::InvalidState(format!(
                "this secret is credential {id}, which was revoked"
            )));
        }
        tx.execute(
            "INSERT OR IGNORE INTO devices (device_id, created_at_ms) VALUES (?1, ?2)",
            params![device_id, now_ms],
        )?;
        let existing: Option<String> = tx
            .query_row(
                "SELECT credential_id FROM credentials WHERE device_id = ?1 AND secret_sha256 = ?2 AND revoked_at_ms IS NULL",
                params![device_id, hash.as_slice()],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = existing {
            tx.commit()?;
            return Ok(id);
        }
        tx.execute(
            "INSERT INTO credentials (credential_id, device_id, prefix, secret_sha256, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![credential_id, device_id, listed_prefix(secret), hash.as_slice(), now_ms],
        )?;
        tx.commit()?;
        Ok(credential_id.to_string())
    }

    fn verify_credential(
        &mut self,
        device_id: &str,
        presented: &str,
    ) -> Result<Option<String>, StoreError> {
        if !acceptable_shape(presented) {
            return Ok(None);
        }
        let hash = hash_secret(presented);
        let mut stmt = self.conn.prepare(
            "SELECT credential_id, secret_sha256 FROM credentials WHERE device_id = ?1 AND revoked_at_ms IS NULL",
        )?;
        let rows = stmt
            .query_map(params![device_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        // Compare against every candidate without an early exit.
        let mut found = None;
        for (id, stored) in rows {
            if digest_eq(&stored, &hash) && found.is_none() {
                found = Some(id);
            }
        }
        Ok(found)
    }

    fn revoke_credential(&mut self, credential_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE credentials SET revoked_at_ms = ?2 WHERE credential_id = ?1 AND revoked_at_ms IS NULL",
            params![credential_id, now_ms],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    fn list_credentials(&mut self) -> Result<Vec<CredentialInfo>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT credential_id, device_id, prefix, created_at_ms, revoked_at_ms FROM credentials ORDER BY created_at_ms, credential_id",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(CredentialInfo {
                    credential_id: r.get(0)?,
                    device_id: r.get(1)?,
                    prefix: r.get(2)?,
                    created_at_ms: r.get(3)?,
                    revoked_at_ms: r.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    fn bump_owner_epoch(&mut self, device_id: &str) -> Result<u64, StoreError> {
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE devices SET owner_epoch = owner_epoch + 1 WHERE device_id = ?1",
            params![device_id],
        )?;
        if n != 1 {
            return Err(StoreError::NotFound {
                kind: "device",
                id: device_id.to_string(),
            });
        }
        let epoch: i64 = tx.query_row(
            "SELECT owner_epoch FROM devices WHERE device_id = ?1",
            params![device_id],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(epoch as u64)
    }

    fn owner_epoch(&mut self, device_id: &str) -> Result<u64, StoreError> {
        let epoch: i64 = one_row(
            &self.conn,
            "SELECT owner_epoch FROM devices WHERE device_id = ?1",
            params![device_id],
            ("device", device_id),
            |r| r.get(0),
        )?;
        Ok(epoch as u64)
    }

    fn insert_agent(&mut self, agent: &AgentRecord) -> Result<(), StoreError> {
        let tx = self.tx()?;
        insert_new(
            &tx,
            "INSERT OR IGNORE INTO agents (agent_id, definition, created_at_ms) VALUES (?1, ?2, ?3)",
            params![
                agent.agent_id,
                to_json(&agent.definition)?,
                agent.created_at_ms
            ],
            ("agent", &agent.agent_id),
        )?;
        tx.commit()?;
        Ok(())
    }

    fn agent(&mut self, agent_id: &str) -> Result<AgentRecord, StoreError> {
        let (definition, created_at_ms): (String, i64) = one_row(
            &self.conn,
            "SELECT definition, created_at_ms FROM agents WHERE agent_id = ?1",
            params![agent_id],
            ("agent", agent_id),
            |r| r.try_into(),
        )?;
        Ok(AgentRecord {
            agent_id: agent_id.to_string(),
            definition: from_json(&definition)?,
            created_at_ms,
        })
    }

    fn insert_environment(&mut self, environment: &EnvironmentRecord) -> Result<(), StoreError> {
        let tx = self.tx()?;
        insert_new(
            &tx,
            "INSERT OR IGNORE INTO environments (environment_id, kind, created_at_ms) VALUES (?1, ?2, ?3)",
            params![
                environment.environment_id,
                environment.kind.as_str(),
                environment.created_at_ms
            ],
            ("environment", &environment.environment_id),
        )?;
        tx.commit()?;
        Ok(())
    }

    fn environment(&mut self, environment_id: &str) -> Result<EnvironmentRecord, StoreError> {
        let (kind, created_at_ms): (String, i64) = one_row(
            &self.conn,
            "SELECT kind, created_at_ms FROM environments WHERE environment_id = ?1",
            params![environment_id],
            ("environment", environment_id),
            |r| r.try_into(),
        )?;
        Ok(EnvironmentRecord {
            environment_id: environment_id.to_string(),
            kind: EnvironmentKind::parse(&kind).ok_or_else(|| corrupt("environment kind"))?,
            created_at_ms,
        })
    }

    fn insert_session(&mut self, session: &SessionRecord) -> Result<(), StoreError> {
        let tx = self.tx()?;
        require_row(&tx, ("agents", "agent_id"), ("agent", &session.agent_id))?;
        require_row(
            &tx,
            ("environments", "environment_id"),
            ("environment", &session.environment_id),
        )?;
        insert_new(
            &tx,
            "INSERT OR IGNORE INTO sessions (session_id, agent_id, environment_id, frozen, native_session_id, started_turns, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                session.session_id,
                session.agent_id,
                session.environment_id,
                to_json(&session.frozen)?,
                session.native_session_id,
                session.started_turns as i64,
                session.created_at_ms
            ],
            ("session", &session.session_id),
        )?;
        tx.commit()?;
        Ok(())
    }

    fn session(&mut self, session_id: &str) -> Result<SessionRecord, StoreError> {
        type Row = (String, String, String, Option<String>, i64, i64);
        let r: Row = one_row(
            &self.conn,
            "SELECT agent_id, environment_id, frozen, native_session_id, started_turns, created_at_ms FROM sessions WHERE session_id = ?1",
            params![session_id],
            ("session", session_id),
            |r| r.try_into(),
        )?;
        Ok(SessionRecord {
            session_id: session_id.to_string(),
            agent_id: r.0,
            environment_id: r.1,
            frozen: from_json(&r.2)?,
            native_session_id: r.3,
            started_turns: r.4 as u64,
            created_at_ms: r.5,
        })
    }

    fn active_turn(&mut self, session_id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .query_row(
                "SELECT turn_id FROM turns WHERE session_id = ?1 AND state NOT IN ('completed','failed','cancelled') LIMIT 1",
                params![session_id],
                |r| r.get(0),
            )
            .optional()?)
    }

    fn create_turn(
        &mut self,
        turn_id: &str,
        session_id: &str,
        input: &Value,
        now_ms: i64,
    ) -> Result<TurnRecord, StoreError> {
        let tx = self.tx()?;
        require_row(&tx, ("sessions", "session_id"), ("session", session_id))?;
        if session_has_active_turn(&tx, session_id)? {
            return Err(StoreError::SessionBusy(session_id.to_string()));
        }
        if session_has_open_write(&tx, session_id)? {
            return Err(StoreError::WriteReserved(session_id.to_string()));
        }
        tx.execute(
            "INSERT INTO turns (turn_id, session_id, state, input, not_before_ms, created_at_ms, updated_at_ms) VALUES (?1, ?2, 'queued', ?3, ?4, ?4, ?4)",
            params![turn_id, session_id, to_json(input)?, now_ms],
        )?;
        let turn = load_turn(&tx, turn_id)?;
        tx.commit()?;
        Ok(turn)
    }

    fn turn(&mut self, turn_id: &str) -> Result<TurnRecord, StoreError> {
        load_turn(&self.conn, turn_id)
    }

    fn claimable_turns(&mut self, now_ms: i64, limit: u32) -> Result<Vec<TurnRecord>, StoreError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {TURN_COLUMNS} FROM turns WHERE state = 'queued' AND not_before_ms <= ?1 ORDER BY created_at_ms, turn_id LIMIT ?2"
        ))?;
        let rows = stmt
            .query_map(params![now_ms, limit as i64], turn_row)?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter().map(turn_from_row).collect()
    }

    fn claim_turn(
        &mut self,
        turn_id: &str,
        device_id: &str,
        owner_epoch: u64,
        run_id: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE turns SET state = 'claimed', device_id = ?2, owner_epoch = ?3, run_id = ?4, updated_at_ms = ?5 WHERE turn_id = ?1 AND state = 'queued' AND cancel_requested = 0",
            params![turn_id, device_id, owner_epoch as i64, run_id, now_ms],
        )?;
        if n == 1 {
            tx.execute(
                "UPDATE sessions SET started_turns = started_turns + 1 WHERE session_id = (SELECT session_id FROM turns WHERE turn_id = ?1)",
                params![turn_id],
            )?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    fn requeue_turn(
        &mut self,
        turn_id: &str,
        not_before_ms: i64,
        now_ms: i64,
    ) -> Result<TurnState, StoreError> {
        let tx = self.tx()?;
        let turn = load_turn(&tx, turn_id)?;
        if turn.state != TurnState::Claimed {
            return Err(StoreError::InvalidState(format!(
                "turn `{turn_id}` is not claimed"
            )));
        }
        let state = if turn.cancel_requested {
            TurnState::Cancelled
        } else {
            TurnState::Queued
        };
        tx.execute(
            "UPDATE turns SET state = ?4, device_id = NULL, owner_epoch = NULL, run_id = NULL, not_before_ms = ?2, updated_at_ms = ?3 WHERE turn_id = ?1",
            params![turn_id, not_before_ms, now_ms, state.as_str()],
        )?;
        if state == TurnState::Cancelled {
            tx.execute(
                "UPDATE inputs SET state = 'not_delivered' WHERE turn_id = ?1 AND state = 'queued'",
                params![turn_id],
            )?;
        }
        // The claim did not start the Turn after all.
        tx.execute(
            "UPDATE sessions SET started_turns = started_turns - 1 WHERE session_id = (SELECT session_id FROM turns WHERE turn_id = ?1) AND started_turns > 0",
            params![turn_id],
        )?;
        tx.commit()?;
        Ok(state)
    }

    fn advance_turn(
        &mut self,
        turn_id: &str,
        to: TurnState,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let from = match to {
            TurnState::Starting => TurnState::Claimed,
            TurnState::Running => TurnState::Starting,
            other => {
                return Err(StoreError::InvalidState(format!(
                    "cannot advance to {}",
                    other.as_str()
                )));
            }
        };
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE turns SET state = ?2, updated_at_ms = ?4 WHERE turn_id = ?1 AND state = ?3",
            params![turn_id, to.as_str(), from.as_str(), now_ms],
        )?;
        if n != 1 {
            return Err(StoreError::InvalidState(format!(
                "turn `{turn_id}` is not {}",
                from.as_str()
            )));
        }
        tx.commit()?;
        Ok(())
    }

    fn request_cancel(&mut self, turn_id: &str, now_ms: i64) -> Result<TurnRecord, StoreError> {
        let tx = self.tx()?;
        let turn = load_turn(&tx, turn_id)?;
        if turn.state.is_terminal() {
            return Err(StoreError::InvalidState(format!(
                "turn `{turn_id}` is {}",
                turn.state.as_str()
            )));
        }
        tx.execute(
            "UPDATE turns SET cancel_requested = 1, updated_at_ms = ?2 WHERE turn_id = ?1",
            params![turn_id, now_ms],
        )?;
        let turn = load_turn(&tx, turn_id)?;
        tx.commit()?;
        Ok(turn)
    }

    fn update_outcome(
        &mut self,
        turn_id: &str,
        outcome: &TurnOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE turns SET outcome = ?2, updated_at_ms = ?3 WHERE turn_id = ?1 AND state NOT IN ('completed','failed','cancelled')",
            params![turn_id, to_json(outcome)?, now_ms],
        )?;
        if n != 1 {
            return Err(StoreError::InvalidState(format!(
                "turn `{turn_id}` is terminal or missing"
            )));
        }
        tx.commit()?;
        Ok(())
    }

    fn finish_turn(
        &mut self,
        turn_id: &str,
        state: TurnState,
        outcome: &TurnOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if !state.is_terminal() {
            return Err(StoreError::InvalidState(format!(
                "{} is not terminal",
                state.as_str()
            )));
        }
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE turns SET state = ?2, outcome = ?3, updated_at_ms = ?4 WHERE turn_id = ?1 AND state NOT IN ('completed','failed','cancelled')",
            params![turn_id, state.as_str(), to_json(outcome)?, now_ms],
        )?;
        if n != 1 {
            return Err(StoreError::InvalidState(format!(
                "turn `{turn_id}` is terminal or missing"
            )));
        }
        tx.execute(
            "UPDATE inputs SET state = 'not_delivered' WHERE turn_id = ?1 AND state = 'queued'",
            params![turn_id],
        )?;
        tx.execute(
            "UPDATE inputs SET state = 'unknown' WHERE turn_id = ?1 AND state = 'delivering'",
            params![turn_id],
        )?;
        tx.execute(
            "UPDATE interactions SET state = 'unknown' WHERE turn_id = ?1 AND state = 'delivering'",
            params![turn_id],
        )?;
        if let Some(native) = &outcome.native_session_id {
            tx.execute(
                "UPDATE sessions SET native_session_id = ?2 WHERE session_id = (SELECT session_id FROM turns WHERE turn_id = ?1)",
                params![turn_id, native],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn append_events(
        &mut self,
        turn_id: &str,
        events: &[(String, Value)],
        now_ms: i64,
    ) -> Result<Appended, StoreError> {
        let events_max = self.events_max;
        let tx = self.tx()?;
        require_row(&tx, ("turns", "turn_id"), ("turn", turn_id))?;
        let mut last: i64 = tx.query_row(
            "SELECT COALESCE(MAX(sequence), 0) FROM turn_events WHERE turn_id = ?1",
            params![turn_id],
            |r| r.get(0),
        )?;
        let (mut stored, mut dropped) = (0u64, 0u64);
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO turn_events (turn_id, sequence, kind, payload, recorded_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for (kind, payload) in events {
                // The last place is the terminal event's.
                let bound = if kind == TERMINAL_EVENT_KIND {
                    events_max
                } else {
                    events_max.saturating_sub(1)
                };
                if last as u64 >= bound {
                    dropped += 1;
                    continue;
                }
                last += 1;
                insert.execute(params![turn_id, last, kind, to_json(payload)?, now_ms])?;
                stored += 1;
            }
        }
        tx.commit()?;
        Ok(Appended {
            stored,
            dropped,
            last_sequence: last as u64,
        })
    }

    fn event_page(
        &mut self,
        turn_id: &str,
        after_sequence: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        load_turn(&self.conn, turn_id)?;
        let limit = limit.min(EVENTS_PAGE_MAX);
        let mut stmt = self.conn.prepare(
            "SELECT sequence, kind, payload, recorded_at_ms FROM turn_events WHERE turn_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3",
        )?;
        let mut rows = stmt.query(params![
            turn_id,
            after_sequence.min(i64::MAX as u64) as i64,
            limit as i64
        ])?;
        let mut page = Vec::new();
        let mut bytes = 0usize;
        while let Some(row) = rows.next()? {
            let payload_json: String = row.get(2)?;
            if !page.is_empty() && bytes + payload_json.len() > max_bytes {
                break;
            }
            // Checked, not built: a corrupt row must not make the page invalid JSON.
            serde_json::from_str::<&serde_json::value::RawValue>(&payload_json).map_err(|e| {
                StoreError::Corrupt(format!("event payload of turn {turn_id}: {e}"))
            })?;
            bytes += payload_json.len();
            page.push(StoredEvent {
                sequence: row.get::<_, i64>(0)? as u64,
                kind: row.get(1)?,
                payload_json,
                recorded_at_ms: row.get(3)?,
            });
        }
        Ok(page)
    }

    fn enqueue_input(
        &mut self,
        turn_id: &str,
        input_id: &str,
        input: &Value,
        now_ms: i64,
    ) -> Result<InputRecord, StoreError> {
        let tx = self.tx()?;
        let turn = load_turn(&tx, turn_id)?;
        if turn.state.is_terminal() {
            return Err(StoreError::InvalidState(format!(
                "turn `{turn_id}` is {}",
                turn.state.as_str()
            )));
        }
        let count: i64 = tx.query_row(
            "SELECT COUNT(*) FROM inputs WHERE turn_id = ?1",
            params![turn_id],
            |r| r.get(0),
        )?;
        if count as u64 >= INPUTS_PER_TURN_MAX {
            return Err(StoreError::LimitReached("inputs per turn"));
        }
        insert_new(
            &tx,
            "INSERT OR IGNORE INTO inputs (input_id, turn_id, position, input, state, created_at_ms) VALUES (?1, ?2, ?3, ?4, 'queued', ?5)",
            params![input_id, turn_id, count, to_json(input)?, now_ms],
            ("input", input_id),
        )?;
        tx.commit()?;
        Ok(InputRecord {
            input_id: input_id.to_string(),
            turn_id: turn_id.to_string(),
            position: count as u64,
            input: input.clone(),
            state: InputState::Queued,
            error_code: None,
            created_at_ms: now_ms,
        })
    }

    fn inputs(&mut self, turn_id: &str) -> Result<Vec<InputRecord>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT input_id, turn_id, position, input, state, error_code, created_at_ms FROM inputs WHERE turn_id = ?1 ORDER BY position",
        )?;
        let rows = stmt
            .query_map(params![turn_id], |r| r.try_into())?
            .collect::<Result<Vec<InputRow>, _>>()?;
        rows.into_iter().map(input_from_row).collect()
    }

    fn set_input_state(
        &mut self,
        input_id: &str,
        state: InputState,
        error_code: Option<&str>,
    ) -> Result<(), StoreError> {
        let tx = self.tx()?;
        let (turn_id, current, position): (String, String, i64) = one_row(
            &tx,
            "SELECT turn_id, state, position FROM inputs WHERE input_id = ?1",
            params![input_id],
            ("input", input_id),
            |r| r.try_into(),
        )?;
        let current = InputState::parse(&current).ok_or_else(|| corrupt("input state"))?;
        let allowed = match (current, state) {
            (InputState::Queued, InputState::Delivering | InputState::NotDelivered) => true,
            (InputState::Delivering, s) => s != InputState::Queued && s != InputState::Delivering,
            (
                InputState::Written,
                InputState::Accepted
                | InputState::Failed
                | InputState::Rejected
                | InputState::Unknown,
            ) => true,
            _ => false,
        };
        if !allowed {
            return Err(StoreError::InvalidState(format!(
                "input `{input_id}` cannot go from {} to {}",
                current.as_str(),
                state.as_str()
            )));
        }
        tx.execute(
            "UPDATE inputs SET state = ?2, error_code = ?3 WHERE input_id = ?1",
            params![input_id, state.as_str(), error_code],
        )?;
        if state == InputState::Accepted {
            // The cursor moves past the accepted input only, never backwards.
            tx.execute(
                "UPDATE turns SET input_cursor = MAX(input_cursor, ?2) WHERE turn_id = ?1",
                params![turn_id, position + 1],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn record_interaction(&mut self, record: &InteractionRecord) -> Result<(), StoreError> {
        let tx = self.tx()?;
        tx.execute(
            "INSERT OR IGNORE INTO interactions (turn_id, interaction_id, kind, request, state) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                record.turn_id,
                record.interaction_id,
                record.kind.as_str(),
                to_json(&record.request)?,
                record.state.as_str()
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn interaction(
        &mut self,
        turn_id: &str,
        interaction_id: &str,
        kind: InteractionKind,
    ) -> Result<InteractionRecord, StoreError> {
        let row: InteractionRow = one_row(
            &self.conn,
            "SELECT turn_id, interaction_id, kind, request, state, answer, delivery_id FROM interactions WHERE turn_id = ?1 AND interaction_id = ?2 AND kind = ?3",
            params![turn_id, interaction_id, kind.as_str()],
            ("interaction", interaction_id),
            |r| r.try_into(),
        )?;
        interaction_from_row(row)
    }

    fn interactions(&mut self, turn_id: &str) -> Result<Vec<InteractionRecord>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT turn_id, interaction_id, kind, request, state, answer, delivery_id FROM interactions WHERE turn_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt
            .query_map(params![turn_id], |r| r.try_into())?
            .collect::<Result<Vec<InteractionRow>, _>>()?;
        rows.into_iter().map(interaction_from_row).collect()
    }

    fn answer_interaction(
        &mut self,
        turn_id: &str,
        interaction_id: &str,
        kind: InteractionKind,
        answer: &Value,
        delivery_id: &str,
    ) -> Result<(), StoreError> {
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE interactions SET state = 'delivering', answer = ?4, delivery_id = ?5 WHERE turn_id = ?1 AND interaction_id = ?2 AND kind = ?3 AND state = 'pending'",
            params![turn_id, interaction_id, kind.as_str(), to_json(answer)?, delivery_id],
        )?;
        if n != 1 {
            return Err(StoreError::InvalidState(format!(
                "interaction `{interaction_id}` is not pending"
            )));
        }
        tx.commit()?;
        Ok(())
    }

    fn settle_interaction(
        &mut self,
        turn_id: &str,
        interaction_id: &str,
        kind: InteractionKind,
        state: InteractionState,
    ) -> Result<(), StoreError> {
        let from: &[&str] = match state {
            InteractionState::Applied
            | InteractionState::NotApplied
            | InteractionState::Unknown => &["delivering"],
            InteractionState::Withdrawn => &["pending", "delivering"],
            InteractionState::Pending | InteractionState::Delivering => {
                return Err(StoreError::InvalidState(format!(
                    "{} is not a settlement",
                    state.as_str()
                )));
            }
        };
        let tx = self.tx()?;
        let current: Option<String> = tx
            .query_row(
                "SELECT state FROM interactions WHERE turn_id = ?1 AND interaction_id = ?2 AND kind = ?3",
                params![turn_id, interaction_id, kind.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        let current = current.ok_or_else(|| StoreError::NotFound {
            kind: "interaction",
            id: interaction_id.to_string(),
        })?;
        if !from.contains(&current.as_str()) {
            return Err(StoreError::InvalidState(format!(
                "interaction `{interaction_id}` is {current}, cannot become {}",
                state.as_str()
            )));
        }
        tx.execute(
            "UPDATE interactions SET state = ?4 WHERE turn_id = ?1 AND interaction_id = ?2 AND kind = ?3",
            params![turn_id, interaction_id, kind.as_str(), state.as_str()],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn reserve_write(&mut self, r: &WriteReservation) -> Result<(), StoreError> {
        let tx = self.tx()?;
        require_row(&tx, ("sessions", "session_id"), ("session", &r.session_id))?;
        if session_has_open_write(&tx, &r.session_id)? {
            return Err(StoreError::WriteReserved(r.session_id.clone()));
        }
        if session_has_active_turn(&tx, &r.session_id)? {
            return Err(StoreError::SessionBusy(r.session_id.clone()));
        }
        tx.execute(
            "INSERT INTO write_reservations (reservation_id, session_id, path, size, sha256, state, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'reserved', ?6)",
            params![r.reservation_id, r.session_id, r.path, r.size as i64, r.sha256, r.created_at_ms],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn settle_write(&mut self, reservation_id: &str, state: WriteState) -> Result<(), StoreError> {
        if state == WriteState::Reserved {
            return Err(StoreError::InvalidState("settling needs a receipt".into()));
        }
        let tx = self.tx()?;
        let n = tx.execute(
            "UPDATE write_reservations SET state = ?2 WHERE reservation_id = ?1 AND state = 'reserved'",
            params![reservation_id, write_state_str(state)],
        )?;
        if n != 1 {
            return Err(StoreError::InvalidState(format!(
                "reservation `{reservation_id}` is not reserved"
            )));
        }
        tx.commit()?;
        Ok(())
    }

    fn open_write(&mut self, session_id: &str) -> Result<Option<WriteReservation>, StoreError> {
        type Row = (String, String, i64, String, i64);
        let row: Option<Row> = self
            .conn
            .query_row(
                "SELECT reservation_id, path, size, sha256, created_at_ms FROM write_reservations WHERE session_id = ?1 AND state = 'reserved'",
                params![session_id],
                |r| r.try_into(),
            )
            .optional()?;
        Ok(row.map(|r| WriteReservation {
            reservation_id: r.0,
            session_id: session_id.to_string(),
            path: r.1,
            size: r.2 as u64,
            sha256: r.3,
            state: WriteState::Reserved,
            created_at_ms: r.4,
        }))
    }

    fn write_reservation(
        &mut self,
        session_id: &str,
        reservation_id: &str,
    ) -> Result<WriteReservation, StoreError> {
        type Row = (String, i64, String, String, i64);
        let r: Row = one_row(
            &self.conn,
            "SELECT path, size, sha256, state, created_at_ms FROM write_reservations WHERE session_id = ?1 AND reservation_id = ?2",
            params![session_id, reservation_id],
            ("write", reservation_id),
            |r| r.try_into(),
        )?;
        Ok(WriteReservation {
            reservation_id: reservation_id.to_string(),
            session_id: session_id.to_string(),
            path: r.0,
            size: r.1 as u64,
            sha256: r.2,
            state: WriteState::parse(&r.3)
                .ok_or_else(|| StoreError::Corrupt(format!("write state `{}`", r.3)))?,
            created_at_ms: r.4,
        })
    }

    fn recover(&mut self, now_ms: i64) -> Result<RecoveryReport, StoreError> {
        let tx = self.tx()?;
        let mut report = RecoveryReport::default();
        let mut stmt = tx.prepare(&format!(
            "SELECT {TURN_COLUMNS} FROM turns WHERE state IN ('claimed','starting','running') ORDER BY created_at_ms"
        ))?;
        let rows = stmt
            .query_map([], turn_row)?
            .collect::<Result<Vec<_>, _>>()?;
        drop(stmt);
        for row in rows {
            let mut turn = turn_from_row(row)?;
            // The terminal drain: the outcome is rebuilt from the journal with the
            // extraction live delivery uses, so an event committed just before the crash
            // counts even when its outcome update was not.
            let journal: Vec<(String, String)> = {
                let mut events = tx.prepare(
                    "SELECT kind, payload FROM turn_events WHERE turn_id = ?1 AND kind IN ('error','usage') ORDER BY sequence",
                )?;
                events
                    .query_map(params![turn.turn_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?
            };
            for (kind, payload) in journal {
                if let Ok(value) = serde_json::from_str::<serde_json::Value>(&payload) {
                    turn.outcome.apply_recorded(&kind, &value);
                }
            }
            let code = if turn.state == TurnState::Running {
                report.stream_incomplete.push(turn.turn_id.clone());
                CoreErrorCode::EventStreamIncomplete
            } else {
                report.delivery_unknown.push(turn.turn_id.clone());
                CoreErrorCode::DeliveryUnknown
            };
            turn.outcome.error_code = Some(code);
            tx.execute(
                "UPDATE turns SET state = 'failed', outcome = ?2, updated_at_ms = ?3 WHERE turn_id = ?1",
                params![turn.turn_id, to_json(&turn.outcome)?, now_ms],
            )?;
            tx.execute(
                "UPDATE inputs SET state = 'not_delivered' WHERE turn_id = ?1 AND state = 'queued'",
                params![turn.turn_id],
            )?;
        }
        report.inputs_unknown = tx.execute(
            "UPDATE inputs SET state = 'unknown' WHERE state IN ('delivering')",
            [],
        )? as u64;
        report.interactions_unknown = tx.execute(
            "UPDATE interactions SET state = 'unknown' WHERE state = 'delivering'",
            [],
        )? as u64;
        tx.commit()?;
        Ok(report)
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;

#[cfg(test)]
impl SqliteStore {
    /// [`CoreStore::event_page`] with each payload parsed, without a byte bound.
    pub(crate) fn events(
        &mut self,
        turn_id: &str,
        after_sequence: u64,
        limit: u32,
    ) -> Result<Vec<TurnEvent>, StoreError> {
        self.event_page(turn_id, after_sequence, limit, usize::MAX)?
            .into_iter()
            .map(|e| {
                Ok(TurnEvent {
                    sequence: e.sequence,
                    kind: e.kind,
                    payload: from_json(&e.payload_json)?,
                    recorded_at_ms: e.recorded_at_ms,
                })
            })
            .collect()
    }
}
