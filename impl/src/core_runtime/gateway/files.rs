//! Files reads ("Workspace operations"): list a directory or read a file of a
//! Session's Environment, idle (while no Turn runs) or during an active execution.
//!
//! Core holds a Session scheduling reservation ([`Core::files_reserved`]; the
//! scheduler claims no Turn of a reserved Session) for the whole operation, selects a
//! device whose declaration admits the read (capability table row "an idle Files
//! directory read needs read-only preparation"), and on that connection:
//!
//! 1. (once per connection and Environment) `runtime_prepare` `initialize`;
//! 2. `execution_prepare` with the read-only profile: only the Environment binding and
//!    `workspace_read_only: true`; waits for `ready`;
//! 3. `workspace_read` against the admission handle, with the exact frozen Environment;
//! 4. `execution_release`, then waits for `released` (the confirmed close).
//!
//! Data is returned only when the read was `ok` *and* the close was confirmed; an
//! incomplete read, a lost connection, `failed` (e.g. `cleanup_unconfirmed`) or the
//! [`FILES_OPERATION_TIMEOUT`] returns `unavailable` without data. The reservation is
//! released before the result is delivered. Nothing is retried or replayed.
//!
//! During an active execution ([`read`]: the Session's Turn is `running` with a Run on
//! its device's current connection) the read names that exact Run instead: one
//! `workspace_read` with `target: {run_id}` and the frozen Environment on the Run's
//! connection, without preparation or release ([`run_read`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::admission::{AdmissionContext, AdmissionRefusal, check_admission};
use super::connection::{DeviceConnection, RouteKind};
use super::turn::FrozenSession;
use super::{Core, TURN_QUEUE_MAX, TurnMsg};
use crate::core_runtime::store::{EnvironmentKind, SessionRecord, StoreError, TurnState};
use crate::core_runtime::wire::{
    AdmissionHandle, AgentKindDeclaration, EnvironmentType, ExecutionConfiguration,
    ExecutionPrepare, ExecutionRelease, Frame, LocalEnvironment, Message, PreparationStatus,
    ReadOperation, RunId, RuntimePrepare, RuntimePrepareResult, Uuid, WirePath, WorkspaceErrorCode,
    WorkspaceRead, WorkspaceReadResult, WorkspaceStatus, WorkspaceTarget,
};

/// Bound on one Files operation, from reservation to confirmed close (Core policy; the
/// spec requires the read and release to be bounded but names no timer).
pub const FILES_OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a Files read returned no data; [`FilesError::code`] is the public error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    /// A store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Session's Environment is `none`: there is no workspace.
    #[error("the Session's Environment has no workspace")]
    NoWorkspace,
    /// A Turn of the Session is not terminal, or another Files operation holds it.
    #[error("the Session is busy")]
    SessionBusy,
    /// The path is not a valid workspace-relative wire path.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// No connected device declares the Agent's kind, available.
    #[error("no connected device can serve the read")]
    NoDevice,
    /// Every declaring device refuses the read-only profile.
    #[error("{0}")]
    Unsupported(AdmissionRefusal),
    /// The Runtime refused the read (safe refusal, no bytes): `not_found`.
    #[error("no such file or directory")]
    NotFound,
    /// The Runtime refused the read for another bounded reason.
    #[error("the Runtime refused the read: {0}")]
    Refused(String),
    /// The Runtime definitely refused to initialize the Environment or to prepare the
    /// read-only execution (e.g. `environment_quiesced`, `environment_mismatch`): a
    /// settled answer, not an unknown outcome; nothing was read or written. The wire
    /// code is kept. (`preparation_capacity` is transient and stays [`Self::Unavailable`].)
    #[error("the Runtime refused the preparation: {0}")]
    PreparationRefused(String),
    /// Incomplete read, uncertain cleanup, lost connection or timeout: no data.
    #[error("the Files operation is unavailable: {0}")]
    Unavailable(String),
}

impl FilesError {
    /// Stable public code.
    pub fn code(&self) -> &'static str {
        match self {
            FilesError::Store(e) => e.code(),
            FilesError::NoWorkspace => "no_workspace",
            FilesError::SessionBusy => "session_busy",
            FilesError::InvalidPath(_) => "invalid_path",
            FilesError::NoDevice => "no_device",
            FilesError::Unsupported(_) => "unsupported_capability",
            FilesError::NotFound => "not_found",
            FilesError::Refused(_) => "workspace_refused",
            FilesError::PreparationRefused(_) => "preparation_refused",
            FilesError::Unavailable(_) => "unavailable",
        }
    }
}

/// A definite refusal of initialization or preparation: `preparation_capacity` says
/// "not now" (503 `unavailable`, retry later); any other code is settled (409
/// `preparation_refused`).
fn preparation_refused(code: String) -> FilesError {
    if code == "preparation_capacity" {
        FilesError::Unavailable(code)
    } else {
        FilesError::PreparationRefused(code)
    }
}

/// Releases the Session scheduling reservation and the task's routes on every exit
/// path.
pub(super) struct Reservation {
    pub(super) core: Arc<Core>,
    pub(super) session_id: String,
    pub(super) key: String,
    pub(super) conn: Option<Arc<DeviceConnection>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(conn) = &self.conn {
            conn.unroute_turn(&self.key);
        }
        if let Ok(mut turns) = self.core.turns.lock() {
            turns.remove(&self.key);
        }
        if let Ok(mut set) = self.core.files_reserved.lock() {
            set.remove(&self.session_id);
        }
        self.core.wake.notify_one();
    }
}

/// The wire name of a serializable code.
pub(super) fn wire_code(value: impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// The frozen identity a Files operation targets.
pub(super) struct SessionTarget {
    /// The Session record.
    pub(super) session: SessionRecord,
    /// The frozen Agent kind.
    pub(super) agent_kind: String,
    /// The Session ID as a wire UUID.
    pub(super) session_uuid: Uuid,
    /// The frozen Environment identity.
    pub(super) environment_id: Uuid,
    /// The frozen Environment type (never `none`).
    pub(super) environment_type: EnvironmentType,
}

/// Loads the Session and its frozen Environment.
///
/// # Errors
/// [`FilesError::NoWorkspace`] for an Environment of type `none`; store errors.
pub(super) async fn session_target(
    core: &Arc<Core>,
    session_id: &str,
) -> Result<SessionTarget, FilesError> {
    let sid = session_id.to_string();
    let session = core.store.call(move |s| s.session(&sid)).await?;
    let frozen: FrozenSession = serde_json::from_value(session.frozen.clone())
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let environment_type = match frozen.environment_type {
        EnvironmentKind::None => return Err(FilesError::NoWorkspace),
        EnvironmentKind::OpenaiHosted => EnvironmentType::OpenaiHosted,
        EnvironmentKind::SelfHosted => EnvironmentType::SelfHosted,
    };
    let environment_id = Uuid::new(session.environment_id.clone()).map_err(StoreError::Corrupt)?;
    let session_uuid = Uuid::new(session.session_id.clone()).map_err(StoreError::Corrupt)?;
    Ok(SessionTarget {
        agent_kind: frozen.agent.agent_kind.to_string(),
        session,
        session_uuid,
        environment_id,
        environment_type,
    })
}

/// Runs one Files read of `path` in the Session's workspace: against the Session's
/// active Run when one is running on its device's current connection ([`run_read`]),
/// otherwise an idle read ([`idle_read`], which refuses a Session with a non-terminal
/// Turn: `session_busy`).
///
/// # Errors
/// Any [`FilesError`].
pub async fn read(
    core: &Arc<Core>,
    session_id: &str,
    operation: ReadOperation,
    path: &str,
) -> Result<WorkspaceReadResult, FilesError> {
    let wire_path = WirePath::new(path).map_err(|e| FilesError::InvalidPath(e.to_string()))?;
    let target = session_target(core, session_id).await?;
    let sid = target.session.session_id.clone();
    let active = core
        .store
        .call(move |s| match s.active_turn(&sid)? {
            Some(turn_id) => s.turn(&turn_id).map(Some),
            None => Ok(None),
        })
        .await?;
    if let Some(turn) = active
        && turn.state == TurnState::Running
        && let (Some(run_id), Some(device_id), Some(epoch)) =
            (turn.run_id, turn.device_id, turn.owner_epoch)
    {
        let conn = core
            .devices
            .lock()
            .ok()
            .and_then(|d| d.get(&device_id).cloned())
            .filter(|c| c.epoch == epoch && !c.is_closed());
        if let Some(conn) = conn {
            let run_id = RunId::new(run_id).map_err(StoreError::Corrupt)?;
            return run_read(
                core,
                &conn,
                run_id,
                target.environment_id,
                operation,
                wire_path,
            )
            .await;
        }
    }
    idle_read(core, session_id, operation, path).await
}

/// Removes a Run-targeted read's task entry and routes on every exit path.
struct RunReadGuard {
    core: Arc<Core>,
    conn: Arc<DeviceConnection>,
    key: String,
}

impl Drop for RunReadGuard {
    fn drop(&mut self) {
        self.conn.unroute_turn(&self.key);
        if let Ok(mut turns) = self.core.turns.lock() {
            turns.remove(&self.key);
        }
    }
}

/// Reads `path` against the active Run `run_id` on `conn` (the connection the Run was
/// started on): one `workspace_read` with `target: {run_id}` and the exact frozen
/// Environment, no preparation and no release. Takes no scheduling reservation (the
/// Session's Turn holds the execution); leaves the Run untouched.
///
/// # Errors
/// The Runtime's refusal ([`FilesError::NotFound`], [`FilesError::InvalidPath`],
/// [`FilesError::Refused`]); [`FilesError::Unavailable`] for `unavailable`, connection
/// loss or the [`FILES_OPERATION_TIMEOUT`], without data.
pub async fn run_read(
    core: &Arc<Core>,
    conn: &Arc<DeviceConnection>,
    run_id: RunId,
    environment_id: Uuid,
    operation: ReadOperation,
    path: WirePath,
) -> Result<WorkspaceReadResult, FilesError> {
    let key = format!("files-{}", Uuid::random());
    let (tx, mut rx) = mpsc::channel(TURN_QUEUE_MAX);
    if let Ok(mut turns) = core.turns.lock() {
        turns.insert(key.clone(), tx);
    }
    let _guard = RunReadGuard {
        core: core.clone(),
        conn: conn.clone(),
        key: key.clone(),
    };
    let mut op = Op {
        conn,
        key: &key,
        rx: &mut rx,
        deadline: Instant::now() + FILES_OPERATION_TIMEOUT,
    };
    let op_id = format!("read-{}", Uuid::random());
    op.route(RouteKind::Operation, &op_id)?;
    op.send(Frame::new(
        op_id,
        Message::WorkspaceRead(WorkspaceRead {
            target: WorkspaceTarget::RunId(run_id),
            environment_id,
            operation,
            path,
            max_bytes: None,
            max_entries: None,
            offset: None,
        }),
    ))
    .await?;
    let result = loop {
        if let Message::WorkspaceReadResult(r) = op.next().await?.message {
            break r;
        }
    };
    read_outcome(result)
}

/// Maps a `workspace_read_result` to the Files result: data only for `ok`.
fn read_outcome(result: WorkspaceReadResult) -> Result<WorkspaceReadResult, FilesError> {
    match result.status {
        WorkspaceStatus::Ok => Ok(result),
        WorkspaceStatus::Unavailable => Err(FilesError::Unavailable(
            result.error_code.map_or("unavailable".into(), wire_code),
        )),
        WorkspaceStatus::Refused | WorkspaceStatus::Rejected => match result.error_code {
            Some(WorkspaceErrorCode::NotFound) => Err(FilesError::NotFound),
            Some(WorkspaceErrorCode::InvalidPath) => {
                Err(FilesError::InvalidPath("refused by the Runtime".into()))
            }
            code => Err(FilesError::Refused(
                code.map_or("refused".into(), wire_code),
            )),
        },
    }
}

/// Runs one idle read of `path` in the Session's workspace (see the module docs).
///
/// # Errors
/// Any [`FilesError`]; no data is returned unless the close was confirmed.
pub async fn idle_read(
    core: &Arc<Core>,
    session_id: &str,
    operation: ReadOperation,
    path: &str,
) -> Result<WorkspaceReadResult, FilesError> {
    let path = WirePath::new(path).map_err(|e| FilesError::InvalidPath(e.to_string()))?;
    let mut idle = IdleOp::begin(core, session_id).await?;
    let (session_uuid, environment_id, environment_type) = idle.target();
    let (op, decl) = idle.op();
    let result = op
        .run(
            decl,
            session_uuid,
            environment_id,
            environment_type,
            operation,
            path,
        )
        .await;
    drop(idle);
    result
}

/// An idle Files operation's held state: the Session scheduling reservation, the
/// selected device and the routed frame queue. Dropping it releases the reservation.
pub(super) struct IdleOp {
    reservation: Reservation,
    conn: Arc<DeviceConnection>,
    decl: AgentKindDeclaration,
    rx: mpsc::Receiver<TurnMsg>,
    deadline: Instant,
    session_uuid: Uuid,
    environment_id: Uuid,
    environment_type: EnvironmentType,
}

impl IdleOp {
    /// Loads the Session, takes its scheduling reservation (refused while a Turn of it
    /// is not terminal) and selects a device admitting the read-only profile.
    ///
    /// # Errors
    /// [`FilesError`] for every refusal before any Runtime work.
    pub(super) async fn begin(core: &Arc<Core>, session_id: &str) -> Result<Self, FilesError> {
        let SessionTarget {
            session,
            agent_kind,
            session_uuid,
            environment_id,
            environment_type,
        } = session_target(core, session_id).await?;
        // The Session scheduling reservation.
        {
            let mut set = core
                .files_reserved
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !set.insert(session.session_id.clone()) {
                return Err(FilesError::SessionBusy);
            }
        }
        let key = format!("files-{}", Uuid::random());
        let mut reservation = Reservation {
            core: core.clone(),
            session_id: session.session_id.clone(),
            key: key.clone(),
            conn: None,
        };
        let sid = session.session_id.clone();
        if core
            .store
            .call(move |s| s.active_turn(&sid))
            .await?
            .is_some()
            || core.turns.lock().map(|t| t.len()).unwrap_or(usize::MAX) >= super::ACTIVE_TURNS_MAX
        {
            return Err(FilesError::SessionBusy);
        }
        let (conn, decl) = select(core, &agent_kind)?;
        let (tx, rx) = mpsc::channel(TURN_QUEUE_MAX);
        if let Ok(mut turns) = core.turns.lock() {
            turns.insert(key, tx);
        }
        reservation.conn = Some(conn.clone());
        Ok(Self {
            reservation,
            conn,
            decl,
            rx,
            deadline: Instant::now() + FILES_OPERATION_TIMEOUT,
            session_uuid,
            environment_id,
            environment_type,
        })
    }

    /// The frozen Session ID, Environment ID and Environment type.
    pub(super) fn target(&self) -> (Uuid, Uuid, EnvironmentType) {
        (
            self.session_uuid.clone(),
            self.environment_id.clone(),
            self.environment_type,
        )
    }

    /// The operation's view of its connection, and the selected declaration.
    pub(super) fn op(&mut self) -> (Op<'_>, &AgentKindDeclaration) {
        (
            Op {
                conn: &self.conn,
                key: &self.reservation.key,
                rx: &mut self.rx,
                deadline: self.deadline,
            },
            &self.decl,
        )
    }
}

/// Picks the first connected device (by ID) whose declaration admits an idle Files
/// operation on the read-only profile.
pub(super) fn select(
    core: &Core,
    agent_kind: &str,
) -> Result<(Arc<DeviceConnection>, AgentKindDeclaration), FilesError> {
    let ctx = AdmissionContext {
        idle_directory_read: true,
        ..AdmissionContext::default()
    };
    let mut devices: Vec<Arc<DeviceConnection>> = core
        .devices
        .lock()
        .map(|d| d.values().cloned().collect())
        .unwrap_or_default();
    devices.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    let mut refusal = None;
    for conn in devices {
        let Some(decl) = conn.declaration(agent_kind) else {
            continue;
        };
        match check_admission(&decl, &ctx) {
            Ok(()) => return Ok((conn, decl)),
            Err(AdmissionRefusal::Unavailable) => {}
            Err(r) => refusal = refusal.or(Some(r)),
        }
    }
    Err(refusal.map_or(FilesError::NoDevice, FilesError::Unsupported))
}

/// One Files operation's view of its connection: frames routed to `key`, bounded by
/// `deadline`.
pub(super) struct Op<'a> {
    pub(super) conn: &'a Arc<DeviceConnection>,
    pub(super) key: &'a str,
    pub(super) rx: &'a mut mpsc::Receiver<TurnMsg>,
    pub(super) deadline: Instant,
}

impl Op<'_> {
    /// The next frame for this operation; `Err` on connection loss or timeout.
    pub(super) async fn next(&mut self) -> Result<Frame, FilesError> {
        let msg = tokio::select! {
            m = self.rx.recv() => m,
            _ = tokio::time::sleep_until(self.deadline) => {
                return Err(FilesError::Unavailable("timeout".into()));
            }
        };
        match msg {
            Some(TurnMsg::Frame(frame)) => Ok(*frame),
            Some(TurnMsg::Wake) => Box::pin(self.next()).await,
            Some(TurnMsg::ConnectionLost | TurnMsg::Overflow) | None => {
                Err(FilesError::Unavailable("connection_lost".into()))
            }
        }
    }

    pub(super) async fn send(&self, frame: Frame) -> Result<(), FilesError> {
        if self.conn.send(&frame).await {
            Ok(())
        } else {
            Err(FilesError::Unavailable("connection_lost".into()))
        }
    }

    pub(super) fn route(&self, kind: RouteKind, id: &str) -> Result<(), FilesError> {
        if self.conn.route(kind, id, self.key) {
            Ok(())
        } else {
            Err(FilesError::Unavailable("connection_lost".into()))
        }
    }

    /// Initializes the Environment on this connection (once) and prepares a read-only
    /// owner; returns the preparation request ID and the admission handle.
    pub(super) async fn prepare_read_only(
        &mut self,
        decl: &AgentKindDeclaration,
        session_id: Uuid,
        environment_id: &Uuid,
        environment_type: EnvironmentType,
    ) -> Result<(String, AdmissionHandle), FilesError> {
        if !self.conn.initialized(environment_id.as_str()) {
            let transfer = format!("init-{}", Uuid::random());
            self.route(RouteKind::Transfer, &transfer)?;
            self.send(Frame::new(
                transfer,
                Message::RuntimePrepare(RuntimePrepare::Initialize {
                    environment_id: environment_id.clone(),
                }),
            ))
            .await?;
            loop {
                if let Message::RuntimePrepareResult(r) = self.next().await?.message {
                    match r {
                        RuntimePrepareResult::Initialized { .. } => {
                            self.conn.mark_initialized(environment_id.as_str());
                            break;
                        }
                        RuntimePrepareResult::Failed { code } => {
                            return Err(preparation_refused(wire_code(code)));
                        }
                        _ => {}
                    }
                }
            }
        }
        let prep_id = format!("prep-{}", Uuid::random());
        self.route(RouteKind::Preparation, &prep_id)?;
        let configuration = ExecutionConfiguration {
            local_environment: Some(LocalEnvironment {
                environment_id: environment_id.clone(),
                environment_type,
            }),
            workspace_read_only: Some(true),
            ..ExecutionConfiguration::default()
        };
        self.send(Frame::new(
            prep_id.clone(),
            Message::ExecutionPrepare(ExecutionPrepare {
                session_id,
                agent_kind: decl.agent_kind.clone(),
                configuration,
            }),
        ))
        .await?;
        let handle = loop {
            if let Message::PreparationStatus(status) = self.next().await?.message {
                match status {
                    PreparationStatus::Ready {
                        admission_handle, ..
                    } => break admission_handle,
                    PreparationStatus::Rejected { error_code, .. }
                    | PreparationStatus::Failed { error_code, .. } => {
                        return Err(preparation_refused(wire_code(error_code)));
                    }
                    PreparationStatus::Expired { .. } => {
                        return Err(FilesError::Unavailable("admission_expired".into()));
                    }
                    _ => {}
                }
            }
        };
        Ok((prep_id, handle))
    }

    /// Sends `execution_release` and waits for the confirmed close (`released`).
    pub(super) async fn release(
        &mut self,
        prep_id: String,
        handle: &AdmissionHandle,
    ) -> Result<(), FilesError> {
        self.send(Frame::new(
            prep_id,
            Message::ExecutionRelease(ExecutionRelease {
                admission_handle: handle.clone(),
            }),
        ))
        .await?;
        loop {
            if let Message::PreparationStatus(status) = self.next().await?.message {
                match status {
                    PreparationStatus::Released {
                        admission_handle, ..
                    } if admission_handle == *handle => return Ok(()),
                    PreparationStatus::Failed {
                        admission_handle,
                        error_code,
                        ..
                    } if admission_handle == *handle => {
                        return Err(FilesError::Unavailable(wire_code(error_code)));
                    }
                    PreparationStatus::Rejected { error_code, .. } => {
                        return Err(FilesError::Unavailable(wire_code(error_code)));
                    }
                    _ => {}
                }
            }
        }
    }

    async fn run(
        mut self,
        decl: &AgentKindDeclaration,
        session_id: Uuid,
        environment_id: Uuid,
        environment_type: EnvironmentType,
        operation: ReadOperation,
        path: WirePath,
    ) -> Result<WorkspaceReadResult, FilesError> {
        let (prep_id, handle) = self
            .prepare_read_only(decl, session_id, &environment_id, environment_type)
            .await?;
        let op_id = format!("read-{}", Uuid::random());
        self.route(RouteKind::Operation, &op_id)?;
        self.send(Frame::new(
            op_id,
            Message::WorkspaceRead(WorkspaceRead {
                target: WorkspaceTarget::AdmissionHandle(handle.clone()),
                environment_id,
                operation,
                path,
                max_bytes: None,
                max_entries: None,
                offset: None,
            }),
        ))
        .await?;
        let result = loop {
            if let Message::WorkspaceReadResult(r) = self.next().await?.message {
                break r;
            }
        };
        // Release, and wait for the confirmed close before delivering anything.
        self.release(prep_id, &handle).await?;
        read_outcome(result)
    }
}
