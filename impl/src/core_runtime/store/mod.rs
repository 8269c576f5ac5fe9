//! Core's durable records ("Ownership and connection": "Core owns durable Session,
//! Turn, input and Environment records, scheduling and coordination").
//!
//! * [`CoreStore`]: the storage trait (so a server database can follow).
//! * [`sqlite::SqliteStore`]: embedded SQLite in WAL mode with `synchronous=FULL`, so a
//!   record is durable once its transaction committed, also across `kill -9`.
//! * [`credential`]: daemon credentials (`rcd_…` secrets, SHA-256 hashes, constant-time
//!   comparison, refusal of Project/Core keys).
//! * [`outcome`]: the Turn state projection and the subordination rules of "Native
//!   failure classification" (I/O-free).
//!
//! Every mutation is one transaction: a failed call leaves nothing half-written.
//! Timestamps are milliseconds since the Unix epoch, passed in by the caller (an
//! injected clock), never read inside the store.

pub mod credential;
pub mod outcome;
pub mod sqlite;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use outcome::{CoreErrorCode, TurnOutcome, TurnState};
pub use sqlite::SqliteStore;

/// Bound on Turn events one page returns (`after_sequence` paging).
pub const EVENTS_PAGE_MAX: u32 = 1000;

/// Bound on active inputs one Turn may carry ("one input per Run at a time" keeps the
/// in-flight count at one; this bounds the queue behind it).
pub const INPUTS_PER_TURN_MAX: u64 = 256;

/// Bound on durable events of one Turn. The last place is reserved for the terminal
/// `done`, so a Turn whose stream exceeds the bound still stores how it ended; the
/// events past it are not stored and are counted in the outcome's `events_dropped`.
pub const EVENTS_PER_TURN_MAX: u64 = 1_000_000;

/// A storage failure. [`StoreError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No record with this identity.
    #[error("{kind} `{id}` not found")]
    NotFound {
        /// Record kind (`agent`, `environment`, `session`, `turn`, …).
        kind: &'static str,
        /// The identity looked up.
        id: String,
    },
    /// A record with this identity already exists.
    #[error("{kind} `{id}` already exists")]
    AlreadyExists {
        /// Record kind.
        kind: &'static str,
        /// The identity.
        id: String,
    },
    /// The Session already has a Turn that is not terminal (one Turn per Session at a time).
    #[error("session `{0}` has an active turn")]
    SessionBusy(String),
    /// The Session holds an unsettled write reservation ("blocking successor mutations
    /// across restarts until exactly settled").
    #[error("session `{0}` holds an unsettled write reservation")]
    WriteReserved(String),
    /// The record is not in a state that allows the change (e.g. a terminal Turn).
    #[error("invalid state transition: {0}")]
    InvalidState(String),
    /// A bound of this module was reached.
    #[error("limit reached: {0}")]
    LimitReached(&'static str),
    /// The database failed (I/O, corruption, constraint).
    #[error("database error: {0}")]
    Database(String),
    /// A stored value could not be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::NotFound { .. } => "not_found",
            StoreError::AlreadyExists { .. } => "already_exists",
            StoreError::SessionBusy(_) => "session_busy",
            StoreError::WriteReserved(_) => "write_reserved",
            StoreError::InvalidState(_) => "invalid_state",
            StoreError::LimitReached(_) => "limit_reached",
            StoreError::Database(_) => "storage_error",
            StoreError::Corrupt(_) => "storage_corrupt",
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> Self {
        StoreError::Database(err.to_string())
    }
}

/// Environment type of a Core Environment record ("Capability declarations").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentKind {
    /// No execution environment (`disable_execution_environment`).
    None,
    /// Platform-hosted (`local_environment`).
    OpenaiHosted,
    /// User-owned (`local_environment`).
    SelfHosted,
}

impl EnvironmentKind {
    /// The wire/public name.
    pub fn as_str(self) -> &'static str {
        match self {
            EnvironmentKind::None => "none",
            EnvironmentKind::OpenaiHosted => "openai_hosted",
            EnvironmentKind::SelfHosted => "self_hosted",
        }
    }

    /// Parses a public name.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "none" => Some(Self::None),
            "openai_hosted" => Some(Self::OpenaiHosted),
            "self_hosted" => Some(Self::SelfHosted),
            _ => None,
        }
    }
}

/// A credential as listed (never the secret, never its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CredentialInfo {
    /// Credential ID (`cred_…`), used to revoke.
    pub credential_id: String,
    /// The device it authenticates.
    pub device_id: String,
    /// The first characters of the secret (`rcd_` plus four), for recognition.
    pub prefix: String,
    /// Issue time (ms since the epoch).
    pub created_at_ms: i64,
    /// Revocation time, if revoked.
    pub revoked_at_ms: Option<i64>,
}

/// An Agent record: the public Agent definition, stored verbatim as validated JSON
/// (its shape is documented in `docs/core-api.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRecord {
    /// Agent ID (canonical UUID).
    pub agent_id: String,
    /// The validated Agent definition.
    pub definition: Value,
    /// Creation time (ms).
    pub created_at_ms: i64,
}

/// An Environment record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentRecord {
    /// Environment ID (canonical UUID).
    pub environment_id: String,
    /// Its type.
    pub kind: EnvironmentKind,
    /// Creation time (ms).
    pub created_at_ms: i64,
}

/// A Session record: the Agent and Environment binding and the configuration frozen at
/// creation (the "immutable Session configuration" of `execution_prepare`).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// Session ID (canonical UUID).
    pub session_id: String,
    /// The Agent.
    pub agent_id: String,
    /// The Environment.
    pub environment_id: String,
    /// The frozen configuration (Agent definition and Environment type at creation).
    pub frozen: Value,
    /// Native Session identity reported by the Harness (`done.native_session_id`).
    pub native_session_id: Option<String>,
    /// Number of Turns that left `queued` (were claimed) in this Session.
    pub started_turns: u64,
    /// Creation time (ms).
    pub created_at_ms: i64,
}

/// A Turn record.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    /// Turn ID (canonical UUID).
    pub turn_id: String,
    /// Its Session.
    pub session_id: String,
    /// Lifecycle state.
    pub state: TurnState,
    /// The ordered initial `MessageInput` list (JSON array).
    pub input: Value,
    /// Run ID, assigned when claimed.
    pub run_id: Option<String>,
    /// Device it was claimed on.
    pub device_id: Option<String>,
    /// Owner epoch of the device connection that claimed it.
    pub owner_epoch: Option<u64>,
    /// Earliest time a Worker may (re)try to claim it (ms).
    pub not_before_ms: i64,
    /// Position after the last active input with an `accepted` receipt.
    pub input_cursor: u64,
    /// Outcome (set when terminal; partial facts before).
    pub outcome: TurnOutcome,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// Creation time (ms).
    pub created_at_ms: i64,
    /// Last update (ms).
    pub updated_at_ms: i64,
}

/// One durable Turn event as stored: its payload is the stored JSON text
/// ([`CoreStore::event_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Per-Turn sequence, from 1, without gaps.
    pub sequence: u64,
    /// Event type.
    pub kind: String,
    /// The payload's JSON text (checked to be JSON).
    pub payload_json: String,
    /// Record time (ms).
    pub recorded_at_ms: i64,
}

impl StoredEvent {
    /// The event as the public JSON object `{"sequence","type","payload","recorded_at_ms"}`.
    pub fn to_json(&self) -> String {
        let kind = serde_json::to_string(&self.kind).unwrap_or_else(|_| "\"\"".into());
        format!(
            "{{\"sequence\":{},\"type\":{kind},\"payload\":{},\"recorded_at_ms\":{}}}",
            self.sequence, self.payload_json, self.recorded_at_ms
        )
    }
}

/// One durable Turn event with its payload parsed (the store's tests read events so).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnEvent {
    /// Per-Turn sequence, from 1, without gaps.
    pub sequence: u64,
    /// Event type (a wire message type such as `delta`, or a Core event such as
    /// `turn_state`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Event payload.
    pub payload: Value,
    /// Record time (ms).
    pub recorded_at_ms: i64,
}

/// State of one active input ("Active-input receipts").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputState {
    /// Waiting to be delivered.
    Queued,
    /// `prompt_steer` is being delivered; no receipt yet.
    Delivering,
    /// `written` received (not consumption).
    Written,
    /// `accepted`: native consumption confirmed; the cursor moved past it.
    Accepted,
    /// `failed` receipt: definitely not written.
    Failed,
    /// `rejected` receipt: refused before any native call.
    Rejected,
    /// Outcome unknown (`unknown` receipt, no `written` in time, or the connection or
    /// Core was lost while in flight). Never redelivered.
    Unknown,
    /// The Turn ended before this input was delivered.
    NotDelivered,
}

impl InputState {
    /// The public name.
    pub fn as_str(self) -> &'static str {
        match self {
            InputState::Queued => "queued",
            InputState::Delivering => "delivering",
            InputState::Written => "written",
            InputState::Accepted => "accepted",
            InputState::Failed => "failed",
            InputState::Rejected => "rejected",
            InputState::Unknown => "unknown",
            InputState::NotDelivered => "not_delivered",
        }
    }

    /// Parses a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "queued" => InputState::Queued,
            "delivering" => InputState::Delivering,
            "written" => InputState::Written,
            "accepted" => InputState::Accepted,
            "failed" => InputState::Failed,
            "rejected" => InputState::Rejected,
            "unknown" => InputState::Unknown,
            "not_delivered" => InputState::NotDelivered,
            _ => return None,
        })
    }

    /// Whether a receipt is still outstanding (the input is in flight).
    pub fn in_flight(self) -> bool {
        matches!(self, InputState::Delivering | InputState::Written)
    }
}

/// One active input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputRecord {
    /// Input ID (the `prompt_steer.input_id`).
    pub input_id: String,
    /// Its Turn.
    pub turn_id: String,
    /// Position in the Turn's input order, from 0.
    pub position: u64,
    /// The ordered `MessageInput` list (JSON array).
    pub input: Value,
    /// Receipt state.
    pub state: InputState,
    /// Receipt error code, when the Runtime gave one.
    pub error_code: Option<String>,
    /// Creation time (ms).
    pub created_at_ms: i64,
}

/// State of a durable write reservation ("Workspace operations").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteState {
    /// Reserved under the Session lock; blocks successor mutations until settled.
    Reserved,
    /// The exact commit receipt arrived.
    Committed,
    /// The exact rejection receipt arrived.
    Rejected,
    /// Settled without a receipt because no `workspace_write` frame was ever queued
    /// for the Runtime (e.g. no device could be admitted): nothing can have changed.
    Abandoned,
}

impl WriteState {
    /// The stored and public name.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteState::Reserved => "reserved",
            WriteState::Committed => "committed",
            WriteState::Rejected => "rejected",
            WriteState::Abandoned => "abandoned",
        }
    }

    /// Parses [`WriteState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "reserved" => WriteState::Reserved,
            "committed" => WriteState::Committed,
            "rejected" => WriteState::Rejected,
            "abandoned" => WriteState::Abandoned,
            _ => return None,
        })
    }
}

/// A durable write reservation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WriteReservation {
    /// Reservation ID (also the `workspace_write` operation ID).
    pub reservation_id: String,
    /// Its Session.
    pub session_id: String,
    /// Workspace-relative path.
    pub path: String,
    /// Body size in bytes.
    pub size: u64,
    /// SHA-256 of the body (lower-case hex).
    pub sha256: String,
    /// State.
    pub state: WriteState,
    /// Creation time (ms).
    pub created_at_ms: i64,
}

/// Kind of a routed interaction ("Envelope and identity").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionKind {
    /// `permission_request` (identity: `request_id`).
    Permission,
    /// `prompt_for_user_choice` (identity: `ask_id`).
    UserChoice,
    /// `function_call` (identity: `call_id`).
    Function,
}

impl InteractionKind {
    /// The public name.
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionKind::Permission => "permission",
            InteractionKind::UserChoice => "user_choice",
            InteractionKind::Function => "function",
        }
    }

    /// Parses a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "permission" => InteractionKind::Permission,
            "user_choice" => InteractionKind::UserChoice,
            "function" => InteractionKind::Function,
            _ => return None,
        })
    }
}

/// State of an interaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionState {
    /// Waiting for an answer.
    Pending,
    /// An answer was sent; no acknowledgement yet.
    Delivering,
    /// `interaction_decision_ack.applied=true` with the matching delivery ID.
    Applied,
    /// The acknowledgement said `applied=false`.
    NotApplied,
    /// Withdrawn by the Runtime (`permission_cancel`).
    Withdrawn,
    /// The answer's fate is unknown (connection lost before the acknowledgement).
    Unknown,
}

impl InteractionState {
    /// The public name.
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionState::Pending => "pending",
            InteractionState::Delivering => "delivering",
            InteractionState::Applied => "applied",
            InteractionState::NotApplied => "not_applied",
            InteractionState::Withdrawn => "withdrawn",
            InteractionState::Unknown => "unknown",
        }
    }

    /// Parses a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "pending" => InteractionState::Pending,
            "delivering" => InteractionState::Delivering,
            "applied" => InteractionState::Applied,
            "not_applied" => InteractionState::NotApplied,
            "withdrawn" => InteractionState::Withdrawn,
            "unknown" => InteractionState::Unknown,
            _ => return None,
        })
    }
}

/// A routed interaction (permission request, user-choice prompt or function call).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InteractionRecord {
    /// Its Turn.
    pub turn_id: String,
    /// The interaction ID (`request_id`, `ask_id` or `call_id`).
    pub interaction_id: String,
    /// Kind.
    pub kind: InteractionKind,
    /// The request payload as received.
    pub request: Value,
    /// State.
    pub state: InteractionState,
    /// The answer payload sent (decision, answers or function result), once answered.
    pub answer: Option<Value>,
    /// The delivery ID of the answer attempt.
    pub delivery_id: Option<String>,
}

/// What restart recovery changed ("A kill -9 of Core at any point loses no committed
/// record and replays nothing on restart").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Turns failed with `delivery_unknown` (claimed or starting when Core stopped).
    pub delivery_unknown: Vec<String>,
    /// Turns failed with `event_stream_incomplete` (running when Core stopped).
    pub stream_incomplete: Vec<String>,
    /// Inputs whose in-flight delivery became `unknown`.
    pub inputs_unknown: u64,
    /// Interactions whose in-flight answer became `unknown`.
    pub interactions_unknown: u64,
}

/// What [`CoreStore::append_events`] did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Events stored.
    pub stored: u64,
    /// Events past the Turn's bound, not stored.
    pub dropped: u64,
    /// The Turn's last event sequence afterwards (0: none).
    pub last_sequence: u64,
}

/// Core's durable records. Every method is one transaction.
pub trait CoreStore: Send {
    // --- devices and credentials -------------------------------------------------

    /// Stores a daemon credential for `device_id` (creating the device), keeping only
    /// the SHA-256 of `secret`. Idempotent for an identical non-revoked secret.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] when `secret` is a Project/Core key.
    fn add_credential(
        &mut self,
        credential_id: &str,
        device_id: &str,
        secret: &str,
        now_ms: i64,
    ) -> Result<String, StoreError>;
    /// Verifies a presented daemon credential for `device_id` in constant time
    /// against every non-revoked credential of the device. `Ok(None)` = refused.
    ///
    /// # Errors
    /// Database failures only.
    fn verify_credential(
        &mut self,
        device_id: &str,
        presented: &str,
    ) -> Result<Option<String>, StoreError>;
    /// Revokes a credential; `false` if it does not exist or was already revoked.
    ///
    /// # Errors
    /// Database failures only.
    fn revoke_credential(&mut self, credential_id: &str, now_ms: i64) -> Result<bool, StoreError>;
    /// Lists credentials (no secrets, no hashes).
    ///
    /// # Errors
    /// Database failures only.
    fn list_credentials(&mut self) -> Result<Vec<CredentialInfo>, StoreError>;
    /// Fences the device's owner lease: increments and returns its owner epoch.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown device.
    fn bump_owner_epoch(&mut self, device_id: &str) -> Result<u64, StoreError>;
    /// Reads the device's current owner epoch.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown device.
    fn owner_epoch(&mut self, device_id: &str) -> Result<u64, StoreError>;

    // --- configuration records ---------------------------------------------------

    /// Inserts an Agent.
    ///
    /// # Errors
    /// [`StoreError::AlreadyExists`].
    fn insert_agent(&mut self, agent: &AgentRecord) -> Result<(), StoreError>;
    /// Reads an Agent.
    ///
    /// # Errors
    /// [`StoreError::NotFound`].
    fn agent(&mut self, agent_id: &str) -> Result<AgentRecord, StoreError>;
    /// Inserts an Environment.
    ///
    /// # Errors
    /// [`StoreError::AlreadyExists`].
    fn insert_environment(&mut self, environment: &EnvironmentRecord) -> Result<(), StoreError>;
    /// Reads an Environment.
    ///
    /// # Errors
    /// [`StoreError::NotFound`].
    fn environment(&mut self, environment_id: &str) -> Result<EnvironmentRecord, StoreError>;
    /// Inserts a Session (Agent and Environment must exist).
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for a missing Agent or Environment; [`StoreError::AlreadyExists`].
    fn insert_session(&mut self, session: &SessionRecord) -> Result<(), StoreError>;
    /// Reads a Session.
    ///
    /// # Errors
    /// [`StoreError::NotFound`].
    fn session(&mut self, session_id: &str) -> Result<SessionRecord, StoreError>;
    /// The Session's non-terminal Turn, if any (the Session holds at most one).
    ///
    /// # Errors
    /// [`StoreError::Database`].
    fn active_turn(&mut self, session_id: &str) -> Result<Option<String>, StoreError>;

    // --- Turns -------------------------------------------------------------------

    /// Creates a queued Turn under the Session lock: refused while the Session has a
    /// non-terminal Turn or an unsettled write reservation.
    ///
    /// # Errors
    /// [`StoreError::SessionBusy`], [`StoreError::WriteReserved`], [`StoreError::NotFound`].
    fn create_turn(
        &mut self,
        turn_id: &str,
        session_id: &str,
        input: &Value,
        now_ms: i64,
    ) -> Result<TurnRecord, StoreError>;
    /// Reads a Turn.
    ///
    /// # Errors
    /// [`StoreError::NotFound`].
    fn turn(&mut self, turn_id: &str) -> Result<TurnRecord, StoreError>;
    /// Queued Turns whose `not_before_ms <= now_ms`, oldest first, at most `limit`.
    ///
    /// # Errors
    /// Database failures only.
    fn claimable_turns(&mut self, now_ms: i64, limit: u32) -> Result<Vec<TurnRecord>, StoreError>;
    /// Claims a queued Turn for a device connection (compare-and-set from `queued`),
    /// assigning its Run ID and counting a started Turn in its Session. `false` if the
    /// Turn was no longer queued.
    ///
    /// # Errors
    /// Database failures only.
    fn claim_turn(
        &mut self,
        turn_id: &str,
        device_id: &str,
        owner_epoch: u64,
        run_id: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Returns a claimed Turn to `queued` (only after an explicit `preparation_capacity`
    /// rejection), retrying no earlier than `not_before_ms`. A Turn whose cancel was
    /// requested meanwhile is `cancelled` instead (nothing was delivered, and a queued
    /// Turn with a cancel request could never be claimed again). Returns the new state.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] unless the Turn is `claimed`.
    fn requeue_turn(
        &mut self,
        turn_id: &str,
        not_before_ms: i64,
        now_ms: i64,
    ) -> Result<TurnState, StoreError>;
    /// Moves a non-terminal Turn forward (`claimed` → `starting` → `running`).
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] for any other transition.
    fn advance_turn(&mut self, turn_id: &str, to: TurnState, now_ms: i64)
    -> Result<(), StoreError>;
    /// Records a cancel request; returns the Turn as it is now.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] for a terminal Turn.
    fn request_cancel(&mut self, turn_id: &str, now_ms: i64) -> Result<TurnRecord, StoreError>;
    /// Merges native facts (usage, classification, native Session ID) into a
    /// non-terminal Turn's outcome.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] for a terminal Turn.
    fn update_outcome(
        &mut self,
        turn_id: &str,
        outcome: &TurnOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Makes a Turn terminal with its outcome; queued inputs become `not_delivered`,
    /// in-flight ones `unknown`; a reported native Session ID is recorded on the Session.
    /// A terminal Turn is never changed again.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] if `state` is not terminal or the Turn already is.
    fn finish_turn(
        &mut self,
        turn_id: &str,
        state: TurnState,
        outcome: &TurnOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Appends one event to the Turn's durable log and returns its sequence
    /// ([`CoreStore::append_events`] with one event).
    ///
    /// # Errors
    /// [`StoreError::LimitReached`] past the Turn's bound; [`StoreError::NotFound`].
    fn append_event(
        &mut self,
        turn_id: &str,
        kind: &str,
        payload: &Value,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let appended =
            self.append_events(turn_id, &[(kind.to_string(), payload.clone())], now_ms)?;
        if appended.stored == 1 {
            Ok(appended.last_sequence)
        } else {
            Err(StoreError::LimitReached("events per turn"))
        }
    }
    /// Appends `events` (`(kind, payload)`, in order) to the Turn's durable log in **one**
    /// transaction (group commit: one fsync for the batch, each event as durable as
    /// [`CoreStore::append_event`]'s once this returns). Events past the Turn's bound
    /// (the last place is the terminal event's) are not stored. Returns how many were
    /// stored, how many dropped, and the Turn's last sequence.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown Turn; database failures (nothing of the
    /// batch is then stored).
    fn append_events(
        &mut self,
        turn_id: &str,
        events: &[(String, Value)],
        now_ms: i64,
    ) -> Result<Appended, StoreError>;
    /// A page of events as stored: `sequence > after_sequence`, in order, at most
    /// `limit` (≤ [`EVENTS_PAGE_MAX`]), and no more once their payloads reach
    /// `max_bytes` (the first event always goes in). Payloads are not parsed: the
    /// public page is written from the stored JSON text.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown Turn; [`StoreError::Corrupt`] for a
    /// stored payload that is not JSON.
    fn event_page(
        &mut self,
        turn_id: &str,
        after_sequence: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    // --- active inputs -----------------------------------------------------------

    /// Appends a queued active input to a non-terminal Turn.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] for a terminal Turn; [`StoreError::LimitReached`];
    /// [`StoreError::AlreadyExists`] for a reused input ID.
    fn enqueue_input(
        &mut self,
        turn_id: &str,
        input_id: &str,
        input: &Value,
        now_ms: i64,
    ) -> Result<InputRecord, StoreError>;
    /// The Turn's inputs in order.
    ///
    /// # Errors
    /// Database failures only.
    fn inputs(&mut self, turn_id: &str) -> Result<Vec<InputRecord>, StoreError>;
    /// Records a receipt state for an input. `accepted` advances the Turn's cursor past
    /// it in the same transaction; nothing else moves the cursor.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; [`StoreError::InvalidState`] for a settled input.
    fn set_input_state(
        &mut self,
        input_id: &str,
        state: InputState,
        error_code: Option<&str>,
    ) -> Result<(), StoreError>;

    // --- interactions ------------------------------------------------------------

    /// Records a pending interaction (idempotent for the same identity).
    ///
    /// # Errors
    /// Database failures only.
    fn record_interaction(&mut self, record: &InteractionRecord) -> Result<(), StoreError>;
    /// Reads one interaction.
    ///
    /// # Errors
    /// [`StoreError::NotFound`].
    fn interaction(
        &mut self,
        turn_id: &str,
        interaction_id: &str,
        kind: InteractionKind,
    ) -> Result<InteractionRecord, StoreError>;
    /// The Turn's interactions.
    ///
    /// # Errors
    /// Database failures only.
    fn interactions(&mut self, turn_id: &str) -> Result<Vec<InteractionRecord>, StoreError>;
    /// Records an answer attempt: `pending` → `delivering` with the answer and delivery ID.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] unless the interaction is `pending`.
    fn answer_interaction(
        &mut self,
        turn_id: &str,
        interaction_id: &str,
        kind: InteractionKind,
        answer: &Value,
        delivery_id: &str,
    ) -> Result<(), StoreError>;
    /// Settles an interaction: `applied`, `not_applied` and `unknown` only from
    /// `delivering` (an acknowledgement settles the answer in flight once; a later
    /// duplicate or conflicting one changes nothing), `withdrawn` from `pending` or
    /// `delivering`.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; [`StoreError::InvalidState`] when the interaction is
    /// not in a state `state` may follow.
    fn settle_interaction(
        &mut self,
        turn_id: &str,
        interaction_id: &str,
        kind: InteractionKind,
        state: InteractionState,
    ) -> Result<(), StoreError>;

    // --- write reservations ------------------------------------------------------

    /// Durably reserves a workspace write under the Session lock: refused while the
    /// Session has an unsettled reservation or a non-terminal Turn.
    ///
    /// # Errors
    /// [`StoreError::WriteReserved`], [`StoreError::SessionBusy`], [`StoreError::NotFound`].
    fn reserve_write(&mut self, reservation: &WriteReservation) -> Result<(), StoreError>;
    /// Settles a reservation with its exact receipt (`committed` or `rejected`), or as
    /// `abandoned` when no write frame was ever queued for the Runtime.
    ///
    /// # Errors
    /// [`StoreError::InvalidState`] unless it is `reserved`.
    fn settle_write(&mut self, reservation_id: &str, state: WriteState) -> Result<(), StoreError>;
    /// The unsettled reservation of a Session, if any.
    ///
    /// # Errors
    /// Database failures only.
    fn open_write(&mut self, session_id: &str) -> Result<Option<WriteReservation>, StoreError>;
    /// One reservation of a Session, in any state.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] unless `reservation_id` belongs to `session_id`.
    fn write_reservation(
        &mut self,
        session_id: &str,
        reservation_id: &str,
    ) -> Result<WriteReservation, StoreError>;

    // --- restart -----------------------------------------------------------------

    /// Reconciles after a restart without replaying anything: Turns that left `queued`
    /// and are not terminal fail (`delivery_unknown` for `claimed`/`starting`,
    /// `event_stream_incomplete` for `running`), in-flight inputs and answers become
    /// `unknown`. Queued Turns stay queued (nothing of theirs was sent). Write
    /// reservations stay reserved.
    ///
    /// # Errors
    /// Database failures only.
    fn recover(&mut self, now_ms: i64) -> Result<RecoveryReport, StoreError>;
}
