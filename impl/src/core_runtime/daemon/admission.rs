//! Execution admission: an I/O-free state machine ("Preparation and execution order").
//!
//! Time is injected: every method that depends on it takes `now`. The service layer
//! performs the [`Effect`]s a method returns (send a status, call the adapter, arm a
//! timer, wake the cleanup worker) and reports native completions back.
//!
//! ## Admission records (connection-local)
//!
//! ```text
//!                 ┌──────── release ───────┐
//!  prepare ─► preparing ─► ready ─► starting ─► started        (terminal)
//!                │           │ │        └──► failed(native_start_failed)
//!                │           │ └── deadline ──► expired
//!                └─► failed  └── release ──► released
//!  read-only:  ready ─ release ─► (closing) ─► released
//!                                     └─► failed(cleanup_unconfirmed) ─ retry ok ─► released
//! ```
//!
//! Each handle's `revision` starts at 1 and increases by one with every published
//! status; a `rejected` answer never changes it. A reused Executor and the read-only
//! profile publish `ready` at revision 1 (no `preparing`, no native preparation).
//! At most [`Limits::admission_records`] records exist; terminal records (`started`,
//! `released`, `expired`, `failed` other than `cleanup_unconfirmed`) are evicted
//! oldest-first to make room, and when every record is live a new preparation is
//! rejected with `preparation_capacity`.
//!
//! ## Executors (Runtime-owned, survive reconnects)
//!
//! Each Executor holds one *slot*: preparation (preparing, ready reservation, read-only
//! owner), execution (starting or running a Run) or idle. A closing Executor, or one
//! whose close failed (cleanup unconfirmed), keeps its slot until a close succeeds
//! ("closing or uncertain resources keep counting against the bounds until cleanup
//! succeeds"). Closes run serially through [`Admission::take_due_close`]; a failed close
//! is retried after `cleanup_retry`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::config::{Limits, WireProfile};
use super::validate::{is_read_only, validate_prepare};
use crate::core_runtime::adapter::{NativePrepare, NativeStart};
use crate::core_runtime::wire::{
    AdmissionHandle, AgentKind, AgentKindCapabilities, AgentKindDeclaration, ContentPart,
    ControlOperation, EnvironmentFence, EnvironmentFenceResult, ExecutionConfiguration,
    ExecutionPrepare, ExecutionRelease, ExecutionStart, ExecutorId, FenceErrorCode, FenceStatus,
    LocalEnvironment, PreparationErrorCode, PreparationStatus, RunId, Uuid,
};

/// SHA-256 of a canonical (key-sorted, compact) JSON rendering.
pub type Fingerprint = [u8; 32];

/// Number of random bytes in a generated handle or Executor ID (rendered as hex).
pub const GENERATED_ID_RANDOM_BYTES: usize = 8;

/// Prefix of generated admission handles (`adm-<16 hex>`).
pub const HANDLE_PREFIX: &str = "adm-";

/// Prefix of generated Executor IDs (`exe-<16 hex>`).
pub const EXECUTOR_PREFIX: &str = "exe-";

/// Something the service layer must do after a state transition.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // short-lived, never stored in bulk
pub enum Effect {
    /// Send `preparation_status` with `Envelope.id` = `request_id`.
    Status {
        /// The preparation request ID (or the ID of the rejected request).
        request_id: String,
        /// The status.
        status: PreparationStatus,
    },
    /// Call the adapter's `prepare`; report with [`Admission::prepare_finished`].
    NativePrepare(NativePrepare),
    /// Call the adapter's `start`; report with [`Admission::start_finished`].
    NativeStart(NativeStart),
    /// Call [`Admission::expire_due`] at this instant.
    ArmExpiry(Instant),
    /// An Executor was queued for close: poll [`Admission::take_due_close`].
    WakeCleanup,
}

/// Reuse key of an idle Executor: (Session, agent kind, configuration fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecutorKey {
    /// Session identity.
    pub session_id: Uuid,
    /// Agent kind.
    pub agent_kind: AgentKind,
    /// Fingerprint of the immutable configuration.
    pub configuration: Fingerprint,
}

/// Which bound an Executor counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// `limits.active_preparations`.
    Preparation,
    /// `limits.active_executions`.
    Execution,
    /// `limits.idle_executors`.
    Idle,
}

/// Lifecycle of one Executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorState {
    /// Native preparation in flight.
    Preparing,
    /// Reserved by a `ready` admission (or the read-only profile's local owner).
    Reserved,
    /// Native start in flight for this Run.
    Starting(RunId),
    /// Running this Run.
    Active(RunId),
    /// Healthy and idle, reusable for its key.
    Idle,
    /// Waiting for a (re)try of its close.
    PendingClose {
        /// Earliest instant of the next attempt.
        not_before: Instant,
        /// FIFO order among closes.
        seq: u64,
        /// Whether an earlier attempt failed (cleanup unconfirmed).
        failed_before: bool,
    },
    /// A close attempt is running.
    Closing {
        /// Whether an earlier attempt failed.
        failed_before: bool,
    },
}

/// One Runtime-owned Executor (native resource, or the read-only profile's local owner).
#[derive(Debug, Clone)]
pub struct Executor {
    /// Its ID.
    pub id: ExecutorId,
    /// Reuse key (`None` for the read-only profile, which is never reused).
    pub key: Option<ExecutorKey>,
    /// The declaration snapshot it was admitted under.
    pub capabilities: AgentKindCapabilities,
    /// Its immutable configuration.
    pub configuration: ExecutionConfiguration,
    /// The Environment it is bound to (`None` with `disable_execution_environment`).
    pub environment_id: Option<Uuid>,
    /// Read-only preparation profile.
    pub read_only: bool,
    /// Current state.
    pub state: ExecutorState,
    /// The bound it counts against.
    pub slot: Slot,
    /// Admission handle whose status a close publishes (read-only release).
    publish_on_close: Option<AdmissionHandle>,
}

/// Lifecycle of one admission record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// `preparing` published.
    Preparing,
    /// `ready` published; expires at `deadline`.
    Ready {
        /// Expiry instant (granted + admission expiry, never extended).
        deadline: Instant,
    },
    /// `starting` published.
    Starting(RunId),
    /// `started` published (terminal).
    Started(RunId),
    /// Read-only release: waiting for the local close.
    Releasing,
    /// Read-only release: a close failed; `failed(cleanup_unconfirmed)` published.
    CleanupUnconfirmed,
    /// `released` published (terminal).
    Released,
    /// `expired` published (terminal).
    Expired,
    /// `failed` published (terminal).
    Failed(PreparationErrorCode),
}

impl Phase {
    /// Terminal records may be evicted.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Phase::Started(_) | Phase::Released | Phase::Expired | Phase::Failed(_)
        )
    }
}

#[derive(Debug, Clone)]
struct Record {
    request_id: String,
    fingerprint: Fingerprint,
    executor_id: ExecutorId,
    phase: Phase,
    revision: u64,
    last: PreparationStatus,
}

/// What a workspace operation may run against (see [`Admission::handle_owner`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// The owning Executor.
    pub executor_id: ExecutorId,
    /// Its Environment.
    pub environment_id: Option<Uuid>,
    /// Its declaration snapshot.
    pub capabilities: AgentKindCapabilities,
    /// Read-only profile.
    pub read_only: bool,
    /// The Run the handle was transferred to, if any.
    pub run_id: Option<RunId>,
}

/// The admission state machine (see the module documentation).
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    expiry: Duration,
    cleanup_retry: Duration,
    binding: LocalEnvironment,
    declarations: Vec<AgentKindDeclaration>,
    records: HashMap<AdmissionHandle, Record>,
    order: VecDeque<AdmissionHandle>,
    by_request: HashMap<String, AdmissionHandle>,
    executors: HashMap<ExecutorId, Executor>,
    close_seq: u64,
    suspension: Option<String>,
    shutting_down: bool,
    /// First revision of a handle and the step between two (the Runtime's free choice).
    /// The free choices of the wire (revision numbering, typical statuses, reuse, expiry).
    profile: WireProfile,
}

/// Canonical fingerprint of a serializable value (object keys sorted at every level).
pub fn fingerprint<T: serde::Serialize>(value: &T) -> Fingerprint {
    fn canonical(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push(':');
                    canonical(&map[k], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let value = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
    let mut text = String::new();
    canonical(&value, &mut text);
    Sha256::digest(text.as_bytes()).into()
}

fn random_id(prefix: &str) -> String {
    let bytes: [u8; GENERATED_ID_RANDOM_BYTES] = rand::random();
    format!("{prefix}{}", hex::encode(bytes))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `expires_in_ms` of a reservation due at `deadline`: the time left at `now`, less
/// `understated` (the profile's choice; then at least 1 ms, since the grant still holds).
fn expiry_ms(deadline: Instant, now: Instant, understated: Duration) -> u64 {
    let left = deadline.saturating_duration_since(now);
    if understated.is_zero() {
        millis(left)
    } else {
        millis(left.saturating_sub(understated)).max(1)
    }
}

fn rejected(
    request_id: &str,
    operation: ControlOperation,
    error_code: PreparationErrorCode,
    admission_handle: Option<AdmissionHandle>,
) -> Effect {
    Effect::Status {
        request_id: request_id.to_string(),
        status: PreparationStatus::Rejected {
            operation,
            error_code,
            admission_handle,
        },
    }
}

impl Admission {
    /// Builds an empty state machine.
    pub fn new(
        limits: Limits,
        expiry: Duration,
        cleanup_retry: Duration,
        binding: LocalEnvironment,
        declarations: Vec<AgentKindDeclaration>,
    ) -> Self {
        Self {
            limits,
            expiry,
            cleanup_retry,
            binding,
            declarations,
            records: HashMap::new(),
            order: VecDeque::new(),
            by_request: HashMap::new(),
            executors: HashMap::new(),
            close_seq: 0,
            suspension: None,
            shutting_down: false,
            profile: WireProfile::default(),
        }
    }

    /// Makes the free choices of `profile` (revision numbering, typical statuses,
    /// Executor reuse, reported expiry); the default is [`WireProfile::default`].
    pub fn with_profile(mut self, profile: WireProfile) -> Self {
        self.profile = profile;
        self
    }

    // ----------------------------------------------------------------- queries

    /// Number of Executors counting against `slot`.
    pub fn count(&self, slot: Slot) -> usize {
        self.executors.values().filter(|e| e.slot == slot).count()
    }

    /// Number of admission records held for this connection.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// The Executor `id`, if the Runtime still owns it.
    pub fn executor(&self, id: &ExecutorId) -> Option<&Executor> {
        self.executors.get(id)
    }

    /// Every Executor the Runtime owns.
    pub fn executors(&self) -> impl Iterator<Item = &Executor> {
        self.executors.values()
    }

    /// Whether the Runtime owns no Executor any more (shutdown may complete).
    pub fn is_drained(&self) -> bool {
        self.executors.is_empty()
    }

    /// Whether `device_shutdown` began.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Executors starting or running a Run.
    pub fn active_executions(&self) -> usize {
        self.executors
            .values()
            .filter(|e| {
                matches!(
                    e.state,
                    ExecutorState::Starting(_) | ExecutorState::Active(_)
                )
            })
            .count()
    }

    /// The owner behind a live admission handle (`preparing`, `ready`, `starting`,
    /// `started`), for workspace operations.
    pub fn handle_owner(&self, handle: &AdmissionHandle) -> Option<Owner> {
        let record = self.records.get(handle)?;
        let run_id = match &record.phase {
            Phase::Preparing | Phase::Ready { .. } => None,
            Phase::Starting(run) | Phase::Started(run) => Some(run.clone()),
            _ => return None,
        };
        let executor = self.executors.get(&record.executor_id)?;
        Some(Owner {
            executor_id: executor.id.clone(),
            environment_id: executor.environment_id.clone(),
            capabilities: executor.capabilities,
            read_only: executor.read_only,
            run_id,
        })
    }

    /// The current revision of `handle` (tests and diagnostics).
    pub fn revision(&self, handle: &AdmissionHandle) -> Option<u64> {
        self.records.get(handle).map(|r| r.revision)
    }

    /// The phase of `handle` (tests and diagnostics).
    pub fn phase(&self, handle: &AdmissionHandle) -> Option<&Phase> {
        self.records.get(handle).map(|r| &r.phase)
    }

    // ----------------------------------------------------------------- helpers

    fn publish(&mut self, handle: &AdmissionHandle, phase: Phase, now: Instant) -> Option<Effect> {
        let (start, step) = (
            self.profile.revision_start.max(1),
            self.profile.revision_step.max(1),
        );
        let understated = Duration::from_millis(self.profile.expiry_understated_ms);
        let silent = match &phase {
            Phase::Preparing => !self.profile.publish_preparing,
            Phase::Starting(_) => !self.profile.publish_starting,
            _ => false,
        };
        let record = self.records.get_mut(handle)?;
        if silent {
            // A typical status this profile does not publish: the phase changes, the
            // revision and the last published status do not.
            record.phase = phase;
            return None;
        }
        let previous = record.revision;
        record.revision = if previous == 0 {
            start
        } else {
            previous.saturating_add(step)
        };
        let revision = record.revision;
        let admission_handle = handle.clone();
        let status = match &phase {
            Phase::Preparing => PreparationStatus::Preparing {
                admission_handle,
                revision,
            },
            Phase::Ready { deadline } => PreparationStatus::Ready {
                admission_handle,
                revision,
                executor_id: record.executor_id.clone(),
                expires_in_ms: expiry_ms(*deadline, now, understated),
            },
            Phase::Starting(run_id) => PreparationStatus::Starting {
                admission_handle,
                revision,
                run_id: run_id.clone(),
            },
            Phase::Started(run_id) => PreparationStatus::Started {
                admission_handle,
                revision,
                run_id: run_id.clone(),
            },
            Phase::Released => PreparationStatus::Released {
                admission_handle,
                revision,
            },
            Phase::Expired => PreparationStatus::Expired {
                admission_handle,
                revision,
            },
            Phase::Failed(code) => PreparationStatus::Failed {
                admission_handle,
                revision,
                error_code: *code,
            },
            Phase::CleanupUnconfirmed => PreparationStatus::Failed {
                admission_handle,
                revision,
                error_code: PreparationErrorCode::CleanupUnconfirmed,
            },
            Phase::Releasing => {
                // Not a published status: undo the revision bump.
                record.revision = previous;
                record.phase = phase;
                return None;
            }
        };
        record.phase = phase;
        record.last = status.clone();
        Some(Effect::Status {
            request_id: record.request_id.clone(),
            status,
        })
    }

    fn queue_close(&mut self, id: &ExecutorId, now: Instant, out: &mut Vec<Effect>) {
        let seq = self.close_seq;
        if let Some(executor) = self.executors.get_mut(id) {
            if matches!(
                executor.state,
                ExecutorState::PendingClose { .. } | ExecutorState::Closing { .. }
            ) {
                return;
            }
            self.close_seq += 1;
            executor.state = ExecutorState::PendingClose {
                not_before: now,
                seq,
                failed_before: false,
            };
            out.push(Effect::WakeCleanup);
        }
    }

    /// A healthy Executor whose reservation or Run ended: keep it idle, or close it
    /// when the idle bound is full, the Runtime is shutting down, or it is read-only.
    fn settle_executor(&mut self, id: &ExecutorId, now: Instant, out: &mut Vec<Effect>) {
        let idle = self.count(Slot::Idle);
        let shutting_down = self.shutting_down;
        let Some(executor) = self.executors.get_mut(id) else {
            return;
        };
        if executor.read_only || shutting_down || idle >= self.limits.idle_executors {
            self.queue_close(id, now, out);
        } else {
            executor.state = ExecutorState::Idle;
            executor.slot = Slot::Idle;
        }
    }

    /// Makes room for one record: evicts the oldest terminal record if the table is
    /// full. Returns `false` when every record is live.
    fn make_room(&mut self) -> bool {
        if self.records.len() < self.limits.admission_records {
            return true;
        }
        let victim = self
            .order
            .iter()
            .position(|h| self.records.get(h).is_some_and(|r| r.phase.is_terminal()));
        let Some(index) = victim else {
            return false;
        };
        if let Some(handle) = self.order.remove(index)
            && let Some(record) = self.records.remove(&handle)
            && self.by_request.get(&record.request_id) == Some(&handle)
        {
            self.by_request.remove(&record.request_id);
        }
        true
    }

    fn new_handle(&self) -> AdmissionHandle {
        loop {
            if let Ok(handle) = AdmissionHandle::new(random_id(HANDLE_PREFIX))
                && !self.records.contains_key(&handle)
            {
                return handle;
            }
        }
    }

    fn new_executor_id(&self) -> ExecutorId {
        loop {
            if let Ok(id) = ExecutorId::new(random_id(EXECUTOR_PREFIX))
                && !self.executors.contains_key(&id)
            {
                return id;
            }
        }
    }

    // -------------------------------------------------------------- operations

    /// `execution_prepare` with `Envelope.id` = `request_id`.
    ///
    /// A duplicate request ID with the identical payload re-sends the record's current
    /// status (same revision, `expires_in_ms` recomputed from the unchanged deadline);
    /// with another payload it is rejected `conflicting_request`.
    pub fn prepare(
        &mut self,
        request_id: &str,
        request: ExecutionPrepare,
        now: Instant,
    ) -> Vec<Effect> {
        let op = ControlOperation::Prepare;
        let fp = fingerprint(&request);
        if let Some(handle) = self.by_request.get(request_id).cloned()
            && let Some(record) = self.records.get(&handle)
        {
            if record.fingerprint != fp {
                return vec![rejected(
                    request_id,
                    op,
                    PreparationErrorCode::ConflictingRequest,
                    None,
                )];
            }
            if record.revision == 0 {
                // Nothing published yet (the profile does not publish `preparing`): the
                // first status is still to come.
                return Vec::new();
            }
            let mut status = record.last.clone();
            if let (PreparationStatus::Ready { expires_in_ms, .. }, Phase::Ready { deadline }) =
                (&mut status, &record.phase)
            {
                *expires_in_ms = expiry_ms(
                    *deadline,
                    now,
                    Duration::from_millis(self.profile.expiry_understated_ms),
                );
            }
            return vec![Effect::Status {
                request_id: request_id.to_string(),
                status,
            }];
        }
        if self.shutting_down {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::ShuttingDown,
                None,
            )];
        }
        if self.suspension.is_some() {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::EnvironmentQuiesced,
                None,
            )];
        }
        let declaration = self
            .declarations
            .iter()
            .find(|d| d.agent_kind == request.agent_kind);
        if let Err(code) = validate_prepare(&request.configuration, declaration, &self.binding) {
            return vec![rejected(request_id, op, code, None)];
        }
        let capabilities = declaration
            .map(|d| d.capabilities)
            .unwrap_or(AgentKindCapabilities::all(false));
        let read_only = is_read_only(&request.configuration);
        let key = ExecutorKey {
            session_id: request.session_id.clone(),
            agent_kind: request.agent_kind.clone(),
            configuration: fingerprint(&request.configuration),
        };
        let reuse = if read_only || !self.profile.reuse_executors {
            None
        } else {
            self.executors
                .values()
                .find(|e| e.state == ExecutorState::Idle && e.key.as_ref() == Some(&key))
                .map(|e| e.id.clone())
        };
        if self.count(Slot::Preparation) >= self.limits.active_preparations || !self.make_room() {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::PreparationCapacity,
                None,
            )];
        }
        let handle = self.new_handle();
        let executor_id = match &reuse {
            Some(id) => id.clone(),
            None => self.new_executor_id(),
        };
        let placeholder = PreparationStatus::Preparing {
            admission_handle: handle.clone(),
            revision: 0,
        };
        self.records.insert(
            handle.clone(),
            Record {
                request_id: request_id.to_string(),
                fingerprint: fp,
                executor_id: executor_id.clone(),
                phase: Phase::Preparing,
                revision: 0,
                last: placeholder,
            },
        );
        self.order.push_back(handle.clone());
        self.by_request
            .insert(request_id.to_string(), handle.clone());
        let mut out = Vec::new();
        if let Some(id) = reuse {
            if let Some(executor) = self.executors.get_mut(&id) {
                executor.state = ExecutorState::Reserved;
                executor.slot = Slot::Preparation;
            }
            let deadline = now + self.expiry;
            out.extend(self.publish(&handle, Phase::Ready { deadline }, now));
            out.push(Effect::ArmExpiry(deadline));
            return out;
        }
        let environment_id = request
            .configuration
            .local_environment
            .as_ref()
            .map(|l| l.environment_id.clone());
        self.executors.insert(
            executor_id.clone(),
            Executor {
                id: executor_id.clone(),
                key: (!read_only).then_some(key),
                capabilities,
                configuration: request.configuration.clone(),
                environment_id,
                read_only,
                state: if read_only {
                    ExecutorState::Reserved
                } else {
                    ExecutorState::Preparing
                },
                slot: Slot::Preparation,
                publish_on_close: None,
            },
        );
        if read_only {
            // No native preparation: the profile is served from the local file system.
            let deadline = now + self.expiry;
            out.extend(self.publish(&handle, Phase::Ready { deadline }, now));
            out.push(Effect::ArmExpiry(deadline));
        } else {
            out.extend(self.publish(&handle, Phase::Preparing, now));
            out.push(Effect::NativePrepare(NativePrepare {
                executor_id,
                session_id: request.session_id,
                agent_kind: request.agent_kind,
                configuration: request.configuration,
            }));
        }
        out
    }

    /// The native preparation of `executor_id` ended. `Err(close)` is a confirmed
    /// failure; `close` says whether the Runtime must still close the resource
    /// (the outcome of the native call was unknown).
    pub fn prepare_finished(
        &mut self,
        executor_id: &ExecutorId,
        result: Result<(), bool>,
        now: Instant,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        let handle = self
            .records
            .iter()
            .find(|(_, r)| &r.executor_id == executor_id && r.phase == Phase::Preparing)
            .map(|(h, _)| h.clone());
        match result {
            Ok(()) => {
                let still_preparing = self
                    .executors
                    .get(executor_id)
                    .is_some_and(|e| e.state == ExecutorState::Preparing);
                if !still_preparing {
                    return out;
                }
                match handle {
                    Some(handle) if !self.shutting_down => {
                        if let Some(e) = self.executors.get_mut(executor_id) {
                            e.state = ExecutorState::Reserved;
                        }
                        let deadline = now + self.expiry;
                        out.extend(self.publish(&handle, Phase::Ready { deadline }, now));
                        out.push(Effect::ArmExpiry(deadline));
                    }
                    // Released while preparing, or the connection was lost: the healthy
                    // Executor becomes idle (or is closed).
                    _ => self.settle_executor(executor_id, now, &mut out),
                }
            }
            Err(must_close) => {
                if let Some(handle) = handle {
                    out.extend(self.publish(
                        &handle,
                        Phase::Failed(PreparationErrorCode::NativePreparationFailed),
                        now,
                    ));
                }
                if must_close {
                    self.queue_close(executor_id, now, &mut out);
                } else {
                    self.executors.remove(executor_id);
                }
            }
        }
        out
    }

    /// `execution_start` with `Envelope.id` = `request_id`. `write_open` tells whether a
    /// `workspace_write` transfer holds the handle's owner.
    pub fn start(
        &mut self,
        request_id: &str,
        request: ExecutionStart,
        write_open: bool,
        now: Instant,
    ) -> Vec<Effect> {
        let op = ControlOperation::Start;
        let handle = request.admission_handle.clone();
        let Some(record) = self.records.get(&handle) else {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::UnknownHandle,
                None,
            )];
        };
        let named = Some(handle.clone());
        let read_only = self
            .executors
            .get(&record.executor_id)
            .is_some_and(|e| e.read_only);
        if read_only {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::ReadOnlyProfile,
                named,
            )];
        }
        match record.phase {
            Phase::Ready { deadline } if deadline <= now => {
                let mut out = self.expire(&handle, now);
                out.push(rejected(
                    request_id,
                    op,
                    PreparationErrorCode::AdmissionExpired,
                    named,
                ));
                return out;
            }
            Phase::Ready { .. } => {}
            Phase::Preparing => {
                return vec![rejected(
                    request_id,
                    op,
                    PreparationErrorCode::HandleNotReady,
                    named,
                )];
            }
            Phase::Expired => {
                return vec![rejected(
                    request_id,
                    op,
                    PreparationErrorCode::AdmissionExpired,
                    named,
                )];
            }
            _ => {
                return vec![rejected(
                    request_id,
                    op,
                    PreparationErrorCode::StaleHandle,
                    named,
                )];
            }
        }
        if record.executor_id != request.executor_id {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::ExecutorMismatch,
                named,
            )];
        }
        let images_declared = self
            .executors
            .get(&record.executor_id)
            .is_some_and(|e| e.capabilities.message_images);
        let has_images = request.input.iter().any(|m| {
            m.content
                .iter()
                .any(|c| matches!(c, ContentPart::Image { .. }))
        });
        let code = if has_images && !images_declared {
            // "a text-only transport rejects image content rather than dropping it".
            Some(PreparationErrorCode::InvalidInput)
        } else if self.shutting_down {
            Some(PreparationErrorCode::ShuttingDown)
        } else if self.suspension.is_some() {
            Some(PreparationErrorCode::EnvironmentQuiesced)
        } else if write_open {
            Some(PreparationErrorCode::WorkspaceWriteInProgress)
        } else if self.executors.values().any(|e| {
            matches!(&e.state, ExecutorState::Starting(r) | ExecutorState::Active(r) if r == &request.run_id)
        }) {
            Some(PreparationErrorCode::ConflictingRequest)
        } else if self.count(Slot::Execution) >= self.limits.active_executions {
            Some(PreparationErrorCode::PreparationCapacity)
        } else {
            None
        };
        if let Some(code) = code {
            return vec![rejected(request_id, op, code, named)];
        }
        let executor_id = record.executor_id.clone();
        if let Some(e) = self.executors.get_mut(&executor_id) {
            e.state = ExecutorState::Starting(request.run_id.clone());
            e.slot = Slot::Execution;
        }
        let mut out = Vec::new();
        out.extend(self.publish(&handle, Phase::Starting(request.run_id.clone()), now));
        out.push(Effect::NativeStart(NativeStart {
            executor_id,
            run_id: request.run_id,
            input: request.input.into_inner(),
        }));
        out
    }

    /// The native start of `run_id` on `executor_id` ended (`ok` = confirmed started).
    /// A failed start publishes `failed(native_start_failed)` and closes the Executor.
    pub fn start_finished(
        &mut self,
        executor_id: &ExecutorId,
        run_id: &RunId,
        ok: bool,
        now: Instant,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        let handle = self
            .records
            .iter()
            .find(|(_, r)| {
                &r.executor_id == executor_id && r.phase == Phase::Starting(run_id.clone())
            })
            .map(|(h, _)| h.clone());
        let starting = self
            .executors
            .get(executor_id)
            .is_some_and(|e| e.state == ExecutorState::Starting(run_id.clone()));
        if ok && starting && !self.shutting_down {
            if let Some(e) = self.executors.get_mut(executor_id) {
                e.state = ExecutorState::Active(run_id.clone());
            }
            if let Some(handle) = handle {
                out.extend(self.publish(&handle, Phase::Started(run_id.clone()), now));
            }
        } else {
            if let Some(handle) = handle {
                let phase = if ok {
                    Phase::Failed(PreparationErrorCode::ShuttingDown)
                } else {
                    Phase::Failed(PreparationErrorCode::NativeStartFailed)
                };
                out.extend(self.publish(&handle, phase, now));
            }
            if starting {
                self.queue_close(executor_id, now, &mut out);
            }
        }
        out
    }

    /// `execution_release` with `Envelope.id` = `request_id`. Valid only before start
    /// (`preparing` or `ready`); anything else is rejected `stale_handle`.
    pub fn release(
        &mut self,
        request_id: &str,
        request: ExecutionRelease,
        now: Instant,
    ) -> Vec<Effect> {
        let op = ControlOperation::Release;
        let handle = request.admission_handle;
        let Some(record) = self.records.get(&handle) else {
            return vec![rejected(
                request_id,
                op,
                PreparationErrorCode::UnknownHandle,
                None,
            )];
        };
        let executor_id = record.executor_id.clone();
        let mut out = Vec::new();
        match record.phase {
            Phase::Preparing => {
                // The native preparation keeps running; its Executor becomes idle when it
                // finishes (see `prepare_finished`).
                out.extend(self.publish(&handle, Phase::Released, now));
            }
            Phase::Ready { deadline } if deadline <= now => {
                out.extend(self.expire(&handle, now));
                out.push(rejected(
                    request_id,
                    op,
                    PreparationErrorCode::AdmissionExpired,
                    Some(handle),
                ));
            }
            Phase::Ready { .. } => {
                let read_only = self
                    .executors
                    .get(&executor_id)
                    .is_some_and(|e| e.read_only);
                if read_only {
                    out.extend(self.publish(&handle, Phase::Releasing, now));
                    self.queue_close(&executor_id, now, &mut out);
                    if let Some(e) = self.executors.get_mut(&executor_id) {
                        e.publish_on_close = Some(handle);
                    }
                } else {
                    out.extend(self.publish(&handle, Phase::Released, now));
                    self.settle_executor(&executor_id, now, &mut out);
                }
            }
            // A read-only release whose close failed is still this handle's release in
            // progress: a repeated request re-sends the failed status it published (same
            // revision). Only the successful cleanup retry publishes `released`
            // ("an old status snapshot does not publish success").
            Phase::CleanupUnconfirmed => out.push(Effect::Status {
                request_id: request_id.to_string(),
                status: record.last.clone(),
            }),
            _ => out.push(rejected(
                request_id,
                op,
                PreparationErrorCode::StaleHandle,
                Some(handle),
            )),
        }
        out
    }

    fn expire(&mut self, handle: &AdmissionHandle, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(record) = self.records.get(handle) else {
            return out;
        };
        let executor_id = record.executor_id.clone();
        out.extend(self.publish(handle, Phase::Expired, now));
        if self
            .executors
            .get(&executor_id)
            .is_some_and(|e| e.state == ExecutorState::Reserved)
        {
            self.settle_executor(&executor_id, now, &mut out);
        }
        out
    }

    /// Expires every `ready` admission whose deadline passed (publishes `expired`).
    pub fn expire_due(&mut self, now: Instant) -> Vec<Effect> {
        let due: Vec<AdmissionHandle> = self
            .order
            .iter()
            .filter(|h| {
                matches!(self.records.get(*h).map(|r| &r.phase), Some(Phase::Ready { deadline }) if *deadline <= now)
            })
            .cloned()
            .collect();
        due.iter().flat_map(|h| self.expire(h, now)).collect()
    }

    /// The Run on `executor_id` settled natively (`done` was published): the Executor
    /// becomes idle for reuse (or is closed when the idle bound is full). A profile that
    /// never reuses Executors closes it at once ("Executor idle expiry is the Runtime's
    /// resource policy"); a released reservation still keeps its Executor idle
    /// ("releasing admission does not close the Session's idle Executor").
    pub fn run_settled(
        &mut self,
        executor_id: &ExecutorId,
        run_id: &RunId,
        now: Instant,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        if self
            .executors
            .get(executor_id)
            .is_some_and(|e| e.state == ExecutorState::Active(run_id.clone()))
        {
            if self.profile.reuse_executors {
                self.settle_executor(executor_id, now, &mut out);
            } else {
                self.queue_close(executor_id, now, &mut out);
            }
        }
        out
    }

    /// The Run's native stream ended without a settlement: its Executor is not known to
    /// be healthy, so it is closed (the Runtime keeps cleanup ownership).
    pub fn run_lost(
        &mut self,
        executor_id: &ExecutorId,
        run_id: &RunId,
        now: Instant,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        if self
            .executors
            .get(executor_id)
            .is_some_and(|e| e.state == ExecutorState::Active(run_id.clone()))
        {
            self.queue_close(executor_id, now, &mut out);
        }
        out
    }

    /// The next close to attempt: `Ok(id)` marks it closing; `Err(Some(t))` is the
    /// earliest instant a queued close becomes due; `Err(None)` when none is queued.
    pub fn take_due_close(&mut self, now: Instant) -> Result<ExecutorId, Option<Instant>> {
        // The due close whose retry fell due first (the reference), or the newest due
        // one (the profile's other order, CR-PREP-038); else the earliest to fall due.
        let newest_first = !self.profile.close_retry_oldest_first;
        let key = |not_before: Instant, seq: u64| {
            if newest_first && not_before <= now {
                (0, now, u64::MAX - seq)
            } else {
                (1, not_before, seq)
            }
        };
        let mut best: Option<(Instant, u64, ExecutorId)> = None;
        for e in self.executors.values() {
            if let ExecutorState::PendingClose {
                not_before, seq, ..
            } = e.state
                && best
                    .as_ref()
                    .is_none_or(|(t, s, _)| key(not_before, seq) < key(*t, *s))
            {
                best = Some((not_before, seq, e.id.clone()));
            }
        }
        match best {
            Some((t, _, id)) if t <= now => {
                if let Some(e) = self.executors.get_mut(&id)
                    && let ExecutorState::PendingClose { failed_before, .. } = e.state
                {
                    e.state = ExecutorState::Closing { failed_before };
                }
                Ok(id)
            }
            Some((t, _, _)) => Err(Some(t)),
            None => Err(None),
        }
    }

    /// A close attempt of `executor_id` ended. Success releases the Executor (and
    /// publishes `released` for a read-only release); failure keeps ownership, reports
    /// `failed(cleanup_unconfirmed)` once for a read-only release and schedules a
    /// retry after `cleanup_retry`.
    pub fn close_finished(
        &mut self,
        executor_id: &ExecutorId,
        ok: bool,
        now: Instant,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(executor) = self.executors.get_mut(executor_id) else {
            return out;
        };
        let publish = executor.publish_on_close.clone();
        if ok {
            self.executors.remove(executor_id);
            if let Some(handle) = publish
                && matches!(
                    self.records.get(&handle).map(|r| &r.phase),
                    Some(Phase::Releasing | Phase::CleanupUnconfirmed)
                )
            {
                out.extend(self.publish(&handle, Phase::Released, now));
            }
        } else {
            let seq = self.close_seq;
            self.close_seq += 1;
            executor.state = ExecutorState::PendingClose {
                not_before: now + self.cleanup_retry,
                seq,
                failed_before: true,
            };
            out.push(Effect::WakeCleanup);
            if let Some(handle) = publish
                && matches!(
                    self.records.get(&handle).map(|r| &r.phase),
                    Some(Phase::Releasing)
                )
            {
                out.extend(self.publish(&handle, Phase::CleanupUnconfirmed, now));
            }
        }
        out
    }

    /// The connection was lost: every admission record is dropped (nothing is
    /// replayed); unstarted reservations return their Executors to idle (read-only
    /// owners are closed); preparations, starts, Runs and closes keep going.
    pub fn connection_lost(&mut self, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        let records: Vec<Record> = self.records.drain().map(|(_, r)| r).collect();
        self.order.clear();
        self.by_request.clear();
        for record in records {
            if let Some(e) = self.executors.get_mut(&record.executor_id) {
                e.publish_on_close = None;
            }
            if matches!(record.phase, Phase::Ready { .. }) {
                self.settle_executor(&record.executor_id, now, &mut out);
            }
        }
        // Reservations without a record (none expected) are settled too.
        let orphans: Vec<ExecutorId> = self
            .executors
            .values()
            .filter(|e| e.state == ExecutorState::Reserved)
            .map(|e| e.id.clone())
            .collect();
        for id in orphans {
            self.settle_executor(&id, now, &mut out);
        }
        out
    }

    /// `device_shutdown`: new admissions are refused and every Executor that is not
    /// mid-preparation or mid-start is queued for close (those are closed when their
    /// native call returns).
    pub fn begin_shutdown(&mut self, now: Instant) -> Vec<Effect> {
        self.shutting_down = true;
        let mut out = Vec::new();
        let ids: Vec<ExecutorId> = self
            .executors
            .values()
            .filter(|e| {
                matches!(
                    e.state,
                    ExecutorState::Reserved | ExecutorState::Active(_) | ExecutorState::Idle
                )
            })
            .map(|e| e.id.clone())
            .collect();
        for id in ids {
            self.queue_close(&id, now, &mut out);
        }
        out
    }

    /// `environment_quiesce` (`Envelope.id` = `suspension_id`): refused with
    /// `execution_active` while a Run is starting or running; otherwise applied, and
    /// new admissions are refused with `environment_quiesced` until the matching
    /// resume. A later quiesce with another ID replaces the current suspension.
    pub fn quiesce(
        &mut self,
        suspension_id: &str,
        fence: &EnvironmentFence,
    ) -> EnvironmentFenceResult {
        let result = |status, error_code| EnvironmentFenceResult {
            environment_id: fence.environment_id.clone(),
            status,
            error_code,
        };
        if fence.environment_id != self.binding.environment_id {
            return result(
                FenceStatus::Rejected,
                Some(FenceErrorCode::EnvironmentMismatch),
            );
        }
        if self.active_executions() > 0 {
            return result(FenceStatus::Rejected, Some(FenceErrorCode::ExecutionActive));
        }
        self.suspension = Some(suspension_id.to_string());
        result(FenceStatus::Applied, None)
    }

    /// `environment_resume` (`Envelope.id` = `suspension_id`): applied only for the
    /// current suspension (`stale_suspension` otherwise, `not_quiesced` when none).
    pub fn resume(
        &mut self,
        suspension_id: &str,
        fence: &EnvironmentFence,
    ) -> EnvironmentFenceResult {
        let result = |status, error_code| EnvironmentFenceResult {
            environment_id: fence.environment_id.clone(),
            status,
            error_code,
        };
        if fence.environment_id != self.binding.environment_id {
            return result(
                FenceStatus::Rejected,
                Some(FenceErrorCode::EnvironmentMismatch),
            );
        }
        match &self.suspension {
            None => result(FenceStatus::Rejected, Some(FenceErrorCode::NotQuiesced)),
            Some(current) if current != suspension_id => {
                result(FenceStatus::Rejected, Some(FenceErrorCode::StaleSuspension))
            }
            Some(_) => {
                self.suspension = None;
                result(FenceStatus::Applied, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::wire::{EnvironmentType, InputRole, MessageInput};
    use crate::wire::bounded::BoundedVec;

    const EXPIRY: Duration = Duration::from_secs(300);
    const RETRY: Duration = Duration::from_secs(1);

    fn binding() -> LocalEnvironment {
        LocalEnvironment {
            environment_id: Uuid::new("00000000-0000-4000-8000-000000000001").unwrap(),
            environment_type: EnvironmentType::SelfHosted,
        }
    }

    fn machine(limits: Limits) -> Admission {
        Admission::new(
            limits,
            EXPIRY,
            RETRY,
            binding(),
            vec![AgentKindDeclaration {
                agent_kind: AgentKind::new("controlled").unwrap(),
                available: true,
                capabilities: AgentKindCapabilities::all(true),
            }],
        )
    }

    fn big() -> Limits {
        Limits {
            admission_records: 64,
            active_preparations: 1000,
            active_executions: 1000,
            idle_executors: 1000,
        }
    }

    fn request(session: &str) -> ExecutionPrepare {
        ExecutionPrepare {
            session_id: Uuid::new(session).unwrap(),
            agent_kind: AgentKind::new("controlled").unwrap(),
            configuration: ExecutionConfiguration {
                local_environment: Some(binding()),
                ..Default::default()
            },
        }
    }

    fn read_only_request() -> ExecutionPrepare {
        let mut r = request(S1);
        r.configuration.workspace_read_only = Some(true);
        r
    }

    const S1: &str = "11111111-1111-4111-8111-111111111111";
    const S2: &str = "22222222-2222-4222-8222-222222222222";

    fn statuses(effects: &[Effect]) -> Vec<(String, PreparationStatus)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Status { request_id, status } => Some((request_id.clone(), status.clone())),
                _ => None,
            })
            .collect()
    }

    fn only_status(effects: &[Effect]) -> PreparationStatus {
        let s = statuses(effects);
        assert_eq!(s.len(), 1, "{effects:?}");
        s[0].1.clone()
    }

    fn rejection(effects: &[Effect]) -> PreparationErrorCode {
        match only_status(effects) {
            PreparationStatus::Rejected { error_code, .. } => error_code,
            other => panic!("not rejected: {other:?}"),
        }
    }

    /// Prepares and completes native preparation; returns (handle, executor).
    fn ready(
        m: &mut Admission,
        id: &str,
        session: &str,
        now: Instant,
    ) -> (AdmissionHandle, ExecutorId) {
        let effects = m.prepare(id, request(session), now);
        let (handle, executor) = match effects.iter().find_map(|e| match e {
            Effect::NativePrepare(p) => Some(p.executor_id.clone()),
            _ => None,
        }) {
            Some(executor) => {
                let PreparationStatus::Preparing {
                    admission_handle,
                    revision,
                } = only_status(&effects)
                else {
                    panic!("expected preparing");
                };
                assert_eq!(revision, 1);
                let done = m.prepare_finished(&executor, Ok(()), now);
                let PreparationStatus::Ready {
                    revision,
                    executor_id,
                    ..
                } = only_status(&done)
                else {
                    panic!("expected ready");
                };
                assert_eq!(revision, 2);
                assert_eq!(executor_id, executor);
                (admission_handle, executor)
            }
            None => match only_status(&effects) {
                PreparationStatus::Ready {
                    admission_handle,
                    executor_id,
                    revision,
                    ..
                } => {
                    assert_eq!(revision, 1);
                    (admission_handle, executor_id)
                }
                other => panic!("unexpected {other:?}"),
            },
        };
        assert!(handle.as_str().starts_with(HANDLE_PREFIX) && handle.as_str().len() == 4 + 16);
        assert!(
            executor.as_str().starts_with(EXECUTOR_PREFIX) && executor.as_str().len() == 4 + 16
        );
        (handle, executor)
    }

    fn start(handle: &AdmissionHandle, executor: &ExecutorId, run: &str) -> ExecutionStart {
        ExecutionStart {
            executor_id: executor.clone(),
            admission_handle: handle.clone(),
            run_id: RunId::new(run).unwrap(),
            input: BoundedVec::new(vec![MessageInput {
                role: InputRole::User,
                content: BoundedVec::default(),
            }])
            .unwrap(),
        }
    }

    #[test]
    fn prepare_start_settle_and_reuse() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let (h, e) = ready(&mut m, "p1", S1, t0);
        let effects = m.start("p1", start(&h, &e, "run-1"), false, t0);
        assert!(matches!(
            only_status(&effects),
            PreparationStatus::Starting { revision: 3, .. }
        ));
        assert!(
            effects
                .iter()
                .any(|x| matches!(x, Effect::NativeStart(s) if s.run_id.as_str() == "run-1"))
        );
        let effects = m.start_finished(&e, &RunId::new("run-1").unwrap(), true, t0);
        assert!(matches!(
            only_status(&effects),
            PreparationStatus::Started { revision: 4, .. }
        ));
        assert_eq!(m.active_executions(), 1);
        // A second start with the same handle is stale.
        assert_eq!(
            rejection(&m.start("p1", start(&h, &e, "run-2"), false, t0)),
            PreparationErrorCode::StaleHandle
        );
        // Releasing the old handle cannot touch the Run.
        assert_eq!(
            rejection(&m.release(
                "p1",
                ExecutionRelease {
                    admission_handle: h.clone()
                },
                t0
            )),
            PreparationErrorCode::StaleHandle
        );
        assert!(
            m.run_settled(&e, &RunId::new("run-1").unwrap(), t0)
                .is_empty()
        );
        assert_eq!(m.count(Slot::Idle), 1);
        // Same key: reused, ready directly with no native preparation.
        let effects = m.prepare("p2", request(S1), t0);
        assert!(
            !effects
                .iter()
                .any(|x| matches!(x, Effect::NativePrepare(_)))
        );
        let PreparationStatus::Ready {
            executor_id,
            revision: 1,
            expires_in_ms,
            ..
        } = only_status(&effects)
        else {
            panic!()
        };
        assert_eq!(executor_id, e);
        assert_eq!(expires_in_ms, 300_000);
        // Another Session: a new Executor.
        let (_, e3) = ready(&mut m, "p3", S2, t0);
        assert_ne!(e3, e);
    }

    #[test]
    fn expiry_is_not_extended_by_retries_and_is_proactive() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let (h, e) = ready(&mut m, "p1", S1, t0);
        let t1 = t0 + Duration::from_secs(100);
        // A retry re-sends the same revision with the remaining time.
        let PreparationStatus::Ready {
            revision,
            expires_in_ms,
            ..
        } = only_status(&m.prepare("p1", request(S1), t1))
        else {
            panic!()
        };
        assert_eq!((revision, expires_in_ms), (2, 200_000));
        assert!(
            m.expire_due(t0 + EXPIRY - Duration::from_millis(1))
                .is_empty()
        );
        let effects = m.expire_due(t0 + EXPIRY);
        assert_eq!(
            statuses(&effects),
            vec![(
                "p1".to_string(),
                PreparationStatus::Expired {
                    admission_handle: h.clone(),
                    revision: 3
                }
            )]
        );
        assert_eq!(m.count(Slot::Idle), 1);
        assert_eq!(
            rejection(&m.start("p1", start(&h, &e, "r"), false, t0 + EXPIRY)),
            PreparationErrorCode::AdmissionExpired
        );
        assert_eq!(m.revision(&h), Some(3));
    }

    #[test]
    fn start_after_deadline_expires_first() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let (h, e) = ready(&mut m, "p1", S1, t0);
        let effects = m.start(
            "p1",
            start(&h, &e, "r"),
            false,
            t0 + EXPIRY + Duration::from_secs(1),
        );
        let s = statuses(&effects);
        assert!(matches!(
            s[0].1,
            PreparationStatus::Expired { revision: 3, .. }
        ));
        assert!(matches!(
            s[1].1,
            PreparationStatus::Rejected {
                error_code: PreparationErrorCode::AdmissionExpired,
                ..
            }
        ));
    }

    #[test]
    fn duplicate_and_conflicting_requests() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let effects = m.prepare("p1", request(S1), t0);
        let first = only_status(&effects);
        // Identical retry while preparing: the current status again, no second prepare.
        let again = m.prepare("p1", request(S1), t0);
        assert_eq!(only_status(&again), first);
        assert!(!again.iter().any(|e| matches!(e, Effect::NativePrepare(_))));
        assert_eq!(
            rejection(&m.prepare("p1", request(S2), t0)),
            PreparationErrorCode::ConflictingRequest
        );
        assert_eq!(m.records(), 1);
    }

    #[test]
    fn unknown_handle_mismatch_and_not_ready() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let effects = m.prepare("p1", request(S1), t0);
        let PreparationStatus::Preparing {
            admission_handle: h,
            ..
        } = only_status(&effects)
        else {
            panic!()
        };
        let other = ExecutorId::new("exe-other").unwrap();
        assert_eq!(
            rejection(&m.start("p1", start(&h, &other, "r"), false, t0)),
            PreparationErrorCode::HandleNotReady
        );
        let unknown = AdmissionHandle::new("adm-unknown").unwrap();
        assert_eq!(
            rejection(&m.start("p1", start(&unknown, &other, "r"), false, t0)),
            PreparationErrorCode::UnknownHandle
        );
        let (h2, e2) = ready(&mut m, "p2", S2, t0);
        assert_eq!(
            rejection(&m.start("p2", start(&h2, &other, "r"), false, t0)),
            PreparationErrorCode::ExecutorMismatch
        );
        assert_eq!(
            rejection(&m.start("p2", start(&h2, &e2, "r"), true, t0)),
            PreparationErrorCode::WorkspaceWriteInProgress
        );
        // Rejections never change the revision.
        assert_eq!(m.revision(&h2), Some(2));
    }

    #[test]
    fn sixty_fifth_record_evicts_terminal_or_is_refused() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let mut handles = Vec::new();
        for i in 0..64 {
            let session = format!("{:08x}-1111-4111-8111-111111111111", i);
            handles.push(ready(&mut m, &format!("p{i}"), &session, t0));
        }
        assert_eq!(m.records(), 64);
        // All live: the 65th is refused.
        assert_eq!(
            rejection(&m.prepare("p64", request(S1), t0)),
            PreparationErrorCode::PreparationCapacity
        );
        // Release the oldest: it becomes terminal and is evicted for the next one.
        let (h0, _) = handles[0].clone();
        m.release(
            "p0",
            ExecutionRelease {
                admission_handle: h0.clone(),
            },
            t0,
        );
        let _ = ready(&mut m, "p64", S1, t0);
        assert_eq!(m.records(), 64);
        assert!(m.phase(&h0).is_none());
        // The evicted handle is now unknown, and its request ID is free again.
        assert_eq!(
            rejection(&m.release(
                "p0",
                ExecutionRelease {
                    admission_handle: h0
                },
                t0
            )),
            PreparationErrorCode::UnknownHandle
        );
    }

    #[test]
    fn capacity_bounds_count_closing_resources() {
        let t0 = Instant::now();
        let mut m = machine(Limits {
            admission_records: 64,
            active_preparations: 1,
            active_executions: 1,
            idle_executors: 1,
        });
        let (h, e) = ready(&mut m, "p1", S1, t0);
        assert_eq!(
            rejection(&m.prepare("p2", request(S2), t0)),
            PreparationErrorCode::PreparationCapacity
        );
        m.start("p1", start(&h, &e, "r1"), false, t0);
        m.start_finished(&e, &RunId::new("r1").unwrap(), true, t0);
        // The preparation slot moved to execution; a new preparation fits, its start not.
        let (h2, e2) = ready(&mut m, "p2", S2, t0);
        assert_eq!(
            rejection(&m.start("p2", start(&h2, &e2, "r2"), false, t0)),
            PreparationErrorCode::PreparationCapacity
        );
        // The Run is lost: its Executor closes, and keeps counting while the close fails.
        m.run_lost(&e, &RunId::new("r1").unwrap(), t0);
        assert_eq!(m.take_due_close(t0), Ok(e.clone()));
        m.close_finished(&e, false, t0);
        assert_eq!(m.count(Slot::Execution), 1);
        assert_eq!(
            rejection(&m.start("p2", start(&h2, &e2, "r2"), false, t0)),
            PreparationErrorCode::PreparationCapacity
        );
        // Retry only after cleanup_retry.
        assert_eq!(m.take_due_close(t0), Err(Some(t0 + RETRY)));
        assert_eq!(m.take_due_close(t0 + RETRY), Ok(e.clone()));
        m.close_finished(&e, true, t0 + RETRY);
        assert_eq!(m.count(Slot::Execution), 0);
        assert!(matches!(
            only_status(&m.start("p2", start(&h2, &e2, "r2"), false, t0 + RETRY)),
            PreparationStatus::Starting { .. }
        ));
    }

    #[test]
    fn a_profile_without_reuse_closes_a_settled_runs_executor_but_keeps_a_released_one() {
        let t0 = Instant::now();
        let mut m = machine(big()).with_profile(WireProfile {
            reuse_executors: false,
            ..WireProfile::default()
        });
        let (h, e) = ready(&mut m, "p1", S1, t0);
        m.start("p1", start(&h, &e, "run-1"), false, t0);
        m.start_finished(&e, &RunId::new("run-1").unwrap(), true, t0);
        let effects = m.run_settled(&e, &RunId::new("run-1").unwrap(), t0);
        assert!(effects.contains(&Effect::WakeCleanup));
        assert_eq!(m.take_due_close(t0), Ok(e));
        assert_eq!(m.count(Slot::Idle), 0);
        // "Releasing admission ... does not close the Session's idle Executor."
        let (h2, _) = ready(&mut m, "p2", S2, t0);
        m.release(
            "p2",
            ExecutionRelease {
                admission_handle: h2,
            },
            t0,
        );
        assert_eq!(m.count(Slot::Idle), 1);
    }

    #[test]
    fn idle_bound_closes_surplus_executors() {
        let t0 = Instant::now();
        let mut m = machine(Limits {
            idle_executors: 1,
            ..big()
        });
        let (h1, _) = ready(&mut m, "p1", S1, t0);
        let (h2, e2) = ready(&mut m, "p2", S2, t0);
        m.release(
            "p1",
            ExecutionRelease {
                admission_handle: h1,
            },
            t0,
        );
        assert_eq!(m.count(Slot::Idle), 1);
        let effects = m.release(
            "p2",
            ExecutionRelease {
                admission_handle: h2,
            },
            t0,
        );
        assert!(effects.contains(&Effect::WakeCleanup));
        assert_eq!(m.take_due_close(t0), Ok(e2));
    }

    #[test]
    fn release_keeps_executor_idle_and_preparing_release() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let (h, e) = ready(&mut m, "p1", S1, t0);
        let effects = m.release(
            "p1",
            ExecutionRelease {
                admission_handle: h.clone(),
            },
            t0,
        );
        assert!(matches!(
            only_status(&effects),
            PreparationStatus::Released { revision: 3, .. }
        ));
        assert_eq!(
            m.executor(&e).map(|x| x.state.clone()),
            Some(ExecutorState::Idle)
        );
        // Release while preparing: released now; the Executor goes idle when prepared,
        // and no `ready` is published.
        let effects = m.prepare("p2", request(S2), t0);
        let PreparationStatus::Preparing {
            admission_handle: h2,
            ..
        } = only_status(&effects)
        else {
            panic!()
        };
        let e2 = effects
            .iter()
            .find_map(|x| match x {
                Effect::NativePrepare(p) => Some(p.executor_id.clone()),
                _ => None,
            })
            .unwrap();
        assert!(matches!(
            only_status(&m.release(
                "p2",
                ExecutionRelease {
                    admission_handle: h2
                },
                t0
            )),
            PreparationStatus::Released { revision: 2, .. }
        ));
        assert!(statuses(&m.prepare_finished(&e2, Ok(()), t0)).is_empty());
        assert_eq!(m.count(Slot::Idle), 2);
    }

    #[test]
    fn native_preparation_failure() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let effects = m.prepare("p1", request(S1), t0);
        let e = effects
            .iter()
            .find_map(|x| match x {
                Effect::NativePrepare(p) => Some(p.executor_id.clone()),
                _ => None,
            })
            .unwrap();
        let effects = m.prepare_finished(&e, Err(false), t0);
        assert!(matches!(
            only_status(&effects),
            PreparationStatus::Failed {
                revision: 2,
                error_code: PreparationErrorCode::NativePreparationFailed,
                ..
            }
        ));
        assert!(m.is_drained());
    }

    #[test]
    fn read_only_profile_release_and_cleanup_retry() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let effects = m.prepare("ro", read_only_request(), t0);
        assert!(
            !effects
                .iter()
                .any(|x| matches!(x, Effect::NativePrepare(_)))
        );
        let PreparationStatus::Ready {
            admission_handle: h,
            executor_id: e,
            revision: 1,
            ..
        } = only_status(&effects)
        else {
            panic!()
        };
        assert_eq!(
            rejection(&m.start("ro", start(&h, &e, "r"), false, t0)),
            PreparationErrorCode::ReadOnlyProfile
        );
        // Release: nothing is published until the local close settles.
        let effects = m.release(
            "ro",
            ExecutionRelease {
                admission_handle: h.clone(),
            },
            t0,
        );
        assert!(statuses(&effects).is_empty());
        assert_eq!(m.take_due_close(t0), Ok(e.clone()));
        let effects = m.close_finished(&e, false, t0);
        assert!(matches!(
            only_status(&effects),
            PreparationStatus::Failed {
                revision: 2,
                error_code: PreparationErrorCode::CleanupUnconfirmed,
                ..
            }
        ));
        assert_eq!(m.count(Slot::Preparation), 1);
        // Before the retry succeeded, a repeated release and a duplicate prepare re-send
        // the failed status (same revision), never `released`.
        let failed = PreparationStatus::Failed {
            admission_handle: h.clone(),
            revision: 2,
            error_code: PreparationErrorCode::CleanupUnconfirmed,
        };
        let again = ExecutionRelease {
            admission_handle: h.clone(),
        };
        assert_eq!(only_status(&m.release("ro", again.clone(), t0)), failed);
        assert_eq!(
            only_status(&m.prepare("ro", read_only_request(), t0)),
            failed
        );
        assert_eq!(m.take_due_close(t0 + RETRY), Ok(e.clone()));
        assert_eq!(only_status(&m.release("ro", again, t0 + RETRY)), failed);
        let effects = m.close_finished(&e, true, t0 + RETRY);
        assert!(matches!(
            only_status(&effects),
            PreparationStatus::Released { revision: 3, .. }
        ));
        assert!(m.is_drained());
    }

    #[test]
    fn connection_loss_drops_records_but_not_executors() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let (h, e) = ready(&mut m, "p1", S1, t0);
        let (h2, e2) = ready(&mut m, "p2", S2, t0);
        m.start("p2", start(&h2, &e2, "r2"), false, t0);
        m.connection_lost(t0);
        assert_eq!(m.records(), 0);
        assert_eq!(
            m.executor(&e).map(|x| x.state.clone()),
            Some(ExecutorState::Idle)
        );
        // The start completes after the loss: the Run is active, nothing is published.
        assert!(statuses(&m.start_finished(&e2, &RunId::new("r2").unwrap(), true, t0)).is_empty());
        assert_eq!(m.active_executions(), 1);
        assert_eq!(
            rejection(&m.start("p1", start(&h, &e, "r"), false, t0)),
            PreparationErrorCode::UnknownHandle
        );
    }

    #[test]
    fn quiesce_and_resume() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let fence = EnvironmentFence {
            environment_id: binding().environment_id,
        };
        let (h, e) = ready(&mut m, "p1", S1, t0);
        m.start("p1", start(&h, &e, "r"), false, t0);
        assert_eq!(
            m.quiesce("s1", &fence).error_code,
            Some(FenceErrorCode::ExecutionActive)
        );
        m.start_finished(&e, &RunId::new("r").unwrap(), true, t0);
        m.run_settled(&e, &RunId::new("r").unwrap(), t0);
        assert_eq!(m.quiesce("s1", &fence).status, FenceStatus::Applied);
        assert_eq!(
            rejection(&m.prepare("p2", request(S2), t0)),
            PreparationErrorCode::EnvironmentQuiesced
        );
        assert_eq!(
            m.resume("s0", &fence).error_code,
            Some(FenceErrorCode::StaleSuspension)
        );
        assert_eq!(m.resume("s1", &fence).status, FenceStatus::Applied);
        assert_eq!(
            m.resume("s1", &fence).error_code,
            Some(FenceErrorCode::NotQuiesced)
        );
        let other = EnvironmentFence {
            environment_id: Uuid::new(S2).unwrap(),
        };
        assert_eq!(
            m.quiesce("s2", &other).error_code,
            Some(FenceErrorCode::EnvironmentMismatch)
        );
    }

    #[test]
    fn shutdown_closes_everything_serially() {
        let t0 = Instant::now();
        let mut m = machine(big());
        let (h, e) = ready(&mut m, "p1", S1, t0);
        let (_, e2) = ready(&mut m, "p2", S2, t0);
        m.start("p1", start(&h, &e, "r"), false, t0);
        m.start_finished(&e, &RunId::new("r").unwrap(), true, t0);
        m.begin_shutdown(t0);
        assert_eq!(
            rejection(&m.prepare("p3", request(S1), t0)),
            PreparationErrorCode::ShuttingDown
        );
        let first = m.take_due_close(t0).unwrap();
        // Serial: nothing else is handed out until the first finishes? Each call hands
        // out the next queued close; the service runs them one at a time.
        m.close_finished(&first, false, t0);
        let second = m.take_due_close(t0).unwrap();
        assert_ne!(first, second);
        m.close_finished(&second, true, t0);
        assert!(!m.is_drained());
        assert_eq!(m.take_due_close(t0 + RETRY), Ok(first.clone()));
        m.close_finished(&first, true, t0 + RETRY);
        assert!(m.is_drained());
        assert!([e, e2].contains(&first));
    }
}
