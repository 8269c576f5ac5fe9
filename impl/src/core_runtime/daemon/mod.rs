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
//! [`run_daemon`] is the whole daemon: it returns when `device_shutdown` completed.

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

/// Runs the daemon until `device_shutdown` completed (every Executor closed and the
/// WebSocket closed with 1000 `device_shutdown`). A permanent connection rejection
/// never returns (the process idles until killed).
pub async fn run_daemon(
    config: RuntimeConfig,
    adapter: Arc<dyn HarnessAdapter>,
    workspace: Workspace,
    options: ConnectOptions,
) {
    let rt = Runtime::start(config, adapter, workspace);
    connection::run(rt, options).await;
}
