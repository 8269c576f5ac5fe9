//! The Runtime daemon of the Core ↔ Runtime protocol (`core-runtime-protocol`).
//!
//! Split as the design asks: wire types live in [`crate::core_runtime::wire`] (the
//! single definition); the I/O-free state is [`admission`] (injected clock) with the
//! pure request checks of [`validate`]; the service layer is [`dispatcher`] (routing,
//! effects, cleanup worker), [`run`] (Run events, receipts, interactions),
//! [`workspace_ops`] (workspace reads/writes/exports and `runtime_prepare`) and
//! [`connection`] (bootstrap, WebSocket, heartbeat, reconnect), with sockets only in
//! `connection`. [`config`] is the launch configuration (`docs/launch-contract.md`).
//!
//! [`run_daemon`] is the whole daemon: it returns when `device_shutdown` completed, or
//! after SIGTERM / SIGINT once every Executor is closed.

pub mod admission;
pub mod config;
pub mod connection;
pub mod dispatcher;
pub mod outbound;
pub mod run;
#[cfg(test)]
mod test_support;
pub mod validate;
pub mod workspace_ops;

use std::sync::Arc;

use crate::core_runtime::adapter::HarnessAdapter;
use crate::core_runtime::workspace::Workspace;

pub use config::{ConfigError, RuntimeConfig};
pub use connection::{ConnectOptions, Credential};
pub use dispatcher::Runtime;

/// How long the Runtime keeps closing its Executors after SIGTERM or SIGINT before it
/// exits anyway (daemon policy): 10 s. Each close is itself bounded by
/// `timers.cancel_settle`; the command adapter's close is its SIGTERM → grace → SIGKILL
/// of the Run's whole process group.
pub const SIGNAL_SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// How long, once every Executor closed after a signal, the Runtime waits for its
/// WebSocket's closing handshake (1001 `process_shutdown`) before it exits anyway.
pub const SIGNAL_CLOSE_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// How [`run_daemon`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonEnd {
    /// `device_shutdown` completed: every Executor closed, WebSocket closed 1000.
    DeviceShutdown,
    /// SIGTERM or SIGINT: every Executor closed, then the WebSocket closed with 1001
    /// `process_shutdown`.
    Signalled,
    /// SIGTERM or SIGINT, and Executors were still owned after
    /// [`SIGNAL_SHUTDOWN_BOUND`] (their closes failed or hung; logged).
    SignalledUndrained,
}

/// Runs the daemon until `device_shutdown` completed (every Executor closed and the
/// WebSocket closed with 1000 `device_shutdown`) or a SIGTERM / SIGINT arrived, which
/// refuses new work and closes every Executor (bounded by [`SIGNAL_SHUTDOWN_BOUND`])
/// while the connection stays up, so Core still learns how the drain went, then closes
/// the WebSocket with 1001 `process_shutdown` (bounded by [`SIGNAL_CLOSE_BOUND`]) before
/// returning: no program a Run started outlives the Runtime's orderly exit. A
/// permanent connection rejection never returns by itself (the process idles until
/// signalled).
pub async fn run_daemon(
    config: RuntimeConfig,
    adapter: Arc<dyn HarnessAdapter>,
    workspace: Workspace,
    options: ConnectOptions,
) -> DaemonEnd {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = Runtime::start(config, adapter, workspace);
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        _ => {
            tracing::error!("cannot install the SIGTERM/SIGINT handlers");
            connection::run(rt, options).await;
            return DaemonEnd::DeviceShutdown;
        }
    };
    let connection = connection::run(rt.clone(), options);
    tokio::pin!(connection);
    tokio::select! {
        () = &mut connection => return DaemonEnd::DeviceShutdown,
        _ = term.recv() => tracing::info!("SIGTERM: closing every Executor before exiting"),
        _ = int.recv() => tracing::info!("SIGINT: closing every Executor before exiting"),
    }
    rt.begin_shutdown(dispatcher::ShutdownCause::ProcessShutdown)
        .await;
    if !rt.config.profile.keep_connection_on_signal {
        // The profile's other choice (CR-CONN-025): the connection closes at the signal.
        rt.close_connection(dispatcher::ShutdownCause::ProcessShutdown)
            .await;
    }
    let mut phase = rt.shutdown_phase();
    // The connection keeps serving while the Executors close; it returns only once they
    // are, after its closing handshake.
    let drained = tokio::time::timeout(SIGNAL_SHUTDOWN_BOUND, async {
        tokio::select! {
            () = &mut connection => true,
            _ = phase.wait_for(|p| *p == dispatcher::ShutdownPhase::Done) => false,
        }
    })
    .await;
    // Drained first: an open connection is now closing (1001); wait for it, bounded.
    let connected = rt.state.lock().await.conn.is_some();
    if drained == Ok(false)
        && connected
        && tokio::time::timeout(SIGNAL_CLOSE_BOUND, &mut connection)
            .await
            .is_err()
    {
        tracing::warn!("the WebSocket's closing handshake did not end in time; exiting anyway");
    }
    match drained {
        Ok(_) => DaemonEnd::Signalled,
        Err(_) => {
            tracing::error!(
                bound_ms = SIGNAL_SHUTDOWN_BOUND.as_millis() as u64,
                "Executors still owned when the signal shutdown bound passed; exiting anyway"
            );
            DaemonEnd::SignalledUndrained
        }
    }
}
