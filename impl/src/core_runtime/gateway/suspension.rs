//! Suspension fencing (spec "Message families": `environment_quiesce` /
//! `environment_resume`): Core asks the device bound to an Environment to fence it, and
//! answers with the Runtime's result.
//!
//! The device bound to the Environment is the first connected device (by ID) on whose
//! connection it is initialized; when none is, the first connected device, on which Core
//! first sends `runtime_prepare` `initialize` (once per connection and Environment).
//! Quiesce sends `environment_quiesce` with a new suspension ID as `Envelope.id`; resume
//! sends `environment_resume` with the caller's suspension ID. Core forwards the
//! Runtime's exact `environment_quiesced` / `environment_resumed` (`applied` or
//! `rejected` with its `error_code`); a lost connection or the [`SUSPENSION_TIMEOUT`]
//! answers `unavailable` (the outcome is unknown). Nothing is recorded, retried or
//! replayed: the Runtime owns the fence.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connection::{DeviceConnection, RouteKind};
use super::files::{FilesError, Op, wire_code};
use super::{Core, TURN_QUEUE_MAX};
use crate::core_runtime::store::{EnvironmentKind, StoreError};
use crate::core_runtime::wire::limits::CORRELATION_ID_MAX_BYTES;
use crate::core_runtime::wire::{
    EnvironmentFence, EnvironmentFenceResult, Frame, Message, RuntimePrepare, RuntimePrepareResult,
    Uuid,
};

/// Bound on one quiesce or resume, from sending to the Runtime's answer (Core policy).
pub const SUSPENSION_TIMEOUT: Duration = Duration::from_secs(30);

/// Which fence to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// `environment_quiesce` (a new suspension ID).
    Quiesce,
    /// `environment_resume` of an existing suspension ID.
    Resume,
}

/// Why a fence returned no Runtime result; [`SuspensionError::code`] is the public code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuspensionError {
    /// A store failure (`not_found` for an unknown Environment).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Environment is of type `none`: nothing to fence.
    #[error("an Environment of type none has nothing to fence")]
    NoWorkspace,
    /// The suspension ID is empty or over the correlation ID bound.
    #[error("suspension_id must be 1..={CORRELATION_ID_MAX_BYTES} bytes")]
    InvalidSuspensionId,
    /// No device is connected.
    #[error("no connected device")]
    NoDevice,
    /// The Runtime definitely refused to initialize the Environment on this connection
    /// (e.g. `environment_mismatch`): settled, nothing was fenced; the wire code is kept.
    #[error("the Runtime refused the preparation: {0}")]
    PreparationRefused(String),
    /// Lost connection or timeout: the outcome is unknown.
    #[error("the fence is unavailable: {0}")]
    Unavailable(String),
}

impl SuspensionError {
    /// Stable public code.
    pub fn code(&self) -> &'static str {
        match self {
            SuspensionError::Store(e) => e.code(),
            SuspensionError::NoWorkspace => "no_workspace",
            SuspensionError::InvalidSuspensionId => "invalid_request",
            SuspensionError::NoDevice => "no_device",
            SuspensionError::PreparationRefused(_) => "preparation_refused",
            SuspensionError::Unavailable(_) => "unavailable",
        }
    }
}

impl From<FilesError> for SuspensionError {
    fn from(err: FilesError) -> Self {
        match err {
            FilesError::Store(e) => SuspensionError::Store(e),
            FilesError::PreparationRefused(code) => SuspensionError::PreparationRefused(code),
            other => SuspensionError::Unavailable(match other {
                FilesError::Unavailable(reason) => reason,
                o => o.code().into(),
            }),
        }
    }
}

/// The Runtime's answer to a fence.
#[derive(Debug, Clone, PartialEq)]
pub struct FenceOutcome {
    /// The suspension ID (`Envelope.id`).
    pub suspension_id: String,
    /// The Runtime's result.
    pub result: EnvironmentFenceResult,
}

/// Removes the operation's routes and queue on every exit path.
struct Registration {
    core: Arc<Core>,
    key: String,
    conn: Arc<DeviceConnection>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.conn.unroute_turn(&self.key);
        if let Ok(mut turns) = self.core.turns.lock() {
            turns.remove(&self.key);
        }
    }
}

/// Picks the device bound to `environment_id` (see the module docs).
pub(super) fn bound_device(core: &Core, environment_id: &str) -> Option<Arc<DeviceConnection>> {
    let mut devices: Vec<Arc<DeviceConnection>> = core
        .devices
        .lock()
        .map(|d| d.values().cloned().collect())
        .unwrap_or_default();
    devices.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    devices
        .iter()
        .find(|c| c.initialized(environment_id))
        .or_else(|| devices.first())
        .cloned()
}

/// Sends one fence for `environment_id` and returns the Runtime's answer (see the
/// module docs). `suspension_id` is required for [`Fence::Resume`] and ignored for
/// [`Fence::Quiesce`], which mints a new one.
///
/// # Errors
/// Any [`SuspensionError`].
pub async fn fence(
    core: &Arc<Core>,
    environment_id: &str,
    fence: Fence,
    suspension_id: Option<&str>,
) -> Result<FenceOutcome, SuspensionError> {
    let suspension_id = match fence {
        Fence::Quiesce => format!("sus-{}", Uuid::random()),
        Fence::Resume => match suspension_id {
            Some(id) if !id.is_empty() && id.len() <= CORRELATION_ID_MAX_BYTES => id.to_string(),
            _ => return Err(SuspensionError::InvalidSuspensionId),
        },
    };
    let eid = environment_id.to_string();
    let environment = core.store.call(move |s| s.environment(&eid)).await?;
    if environment.kind == EnvironmentKind::None {
        return Err(SuspensionError::NoWorkspace);
    }
    let environment_id =
        Uuid::new(environment.environment_id.clone()).map_err(StoreError::Corrupt)?;
    let conn = bound_device(core, environment_id.as_str()).ok_or(SuspensionError::NoDevice)?;
    let key = format!("fence-{}", Uuid::random());
    let (tx, mut rx) = mpsc::channel(TURN_QUEUE_MAX);
    if let Ok(mut turns) = core.turns.lock() {
        turns.insert(key.clone(), tx);
    }
    let _registration = Registration {
        core: core.clone(),
        key: key.clone(),
        conn: conn.clone(),
    };
    let mut op = Op {
        conn: &conn,
        key: &key,
        rx: &mut rx,
        deadline: Instant::now() + SUSPENSION_TIMEOUT,
    };
    if !conn.initialized(environment_id.as_str()) {
        let transfer = format!("init-{}", Uuid::random());
        op.route(RouteKind::Transfer, &transfer)?;
        op.send(Frame::new(
            transfer,
            Message::RuntimePrepare(RuntimePrepare::Initialize {
                environment_id: environment_id.clone(),
            }),
        ))
        .await?;
        loop {
            if let Message::RuntimePrepareResult(r) = op.next().await?.message {
                match r {
                    RuntimePrepareResult::Initialized { .. } => {
                        conn.mark_initialized(environment_id.as_str());
                        break;
                    }
                    RuntimePrepareResult::Failed { code } => {
                        return Err(SuspensionError::PreparationRefused(wire_code(code)));
                    }
                    _ => {}
                }
            }
        }
    }
    op.route(RouteKind::Transfer, &suspension_id)?;
    let payload = EnvironmentFence { environment_id };
    let message = match fence {
        Fence::Quiesce => Message::EnvironmentQuiesce(payload),
        Fence::Resume => Message::EnvironmentResume(payload),
    };
    op.send(Frame::new(suspension_id.clone(), message)).await?;
    loop {
        let frame = op.next().await?;
        if frame.id != suspension_id {
            continue;
        }
        match (fence, frame.message) {
            (Fence::Quiesce, Message::EnvironmentQuiesced(result))
            | (Fence::Resume, Message::EnvironmentResumed(result)) => {
                return Ok(FenceOutcome {
                    suspension_id,
                    result,
                });
            }
            _ => {}
        }
    }
}
