//! The engine daemon (`contract-impl engine serve --socket PATH --data-dir DIR`,
//! engine-protocol.md): gRPC on a Unix socket only ("The initial protocol has no TCP
//! listener. Unix sockets [...] and endpoint metadata are current-user only").
//!
//! * The socket's directory is private (created 0700, or refused when it grants group or
//!   other access); the socket is made 0600; its path is checked against
//!   [`SOCKET_PATH_MAX_BYTES`] with an error naming it.
//! * A random endpoint token is written to `<data-dir>/endpoint-token` (0600) for clients
//!   and checked on every call by [`auth::TokenCheck`] before the payload is decoded.
//!   It is never logged.
//! * The client store ([`store`]) is SQLite in the data directory (0700).
//! * SIGTERM stops the server gracefully; the socket file is removed.
//!
//! This module owns the listener and its files; the handlers are [`service`]'s.

pub mod auth;
pub mod executor;
pub mod ledger;
pub mod limits;
pub mod log;
pub mod operations;
pub mod profile;
pub mod runs;
pub mod service;
pub mod snapshot;
pub mod state;
pub mod store;
pub mod streams;

pub use profile::Profile;
pub use state::Config;

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

use crate::engine::proto::engine::v1::engine_service_server::EngineServiceServer;

/// Longest socket path: a Unix socket address holds 108 bytes, NUL included.
pub const SOCKET_PATH_MAX_BYTES: usize = 107;

/// The token file in the data directory.
pub const TOKEN_FILE: &str = "endpoint-token";

/// Why the daemon cannot start (stable [`code`](Self::code)).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path does not fit a Unix socket address.
    #[error(
        "the socket path {path} is {len} bytes, over the {SOCKET_PATH_MAX_BYTES}-byte limit of a Unix socket address"
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// A directory grants group or other access, or belongs to another user.
    #[error("{0} is not private to this user (it must not grant group or other access)")]
    NotPrivate(PathBuf),
    /// Something else is at the socket path.
    #[error("{0} exists and is not a stale socket of ours")]
    InUse(PathBuf),
    /// A file or the store could not be set up.
    #[error("{0}")]
    Setup(String),
}

impl ServeError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ServeError::SocketPathTooLong { .. } => "socket_path_too_long",
            ServeError::NotPrivate(_) => "not_private",
            ServeError::InUse(_) => "socket_in_use",
            ServeError::Setup(_) => "setup_failed",
        }
    }
}

fn setup(path: &Path, e: impl std::fmt::Display) -> ServeError {
    ServeError::Setup(format!("{}: {e}", path.display()))
}

/// Creates `dir` 0700, or checks that an existing one is this user's and private.
fn private_dir(dir: &Path) -> Result<(), ServeError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => {
            let me = nix::unistd::getuid().as_raw();
            if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
                return Err(ServeError::NotPrivate(dir.to_path_buf()));
            }
            Ok(())
        }
        Err(_) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| setup(dir, e)),
    }
}

/// Binds the socket, writes the token file, and serves until SIGTERM (or SIGINT).
///
/// # Errors
/// [`ServeError`] when it cannot start.
pub async fn serve(socket: &Path, data_dir: &Path, config: &Config) -> Result<(), ServeError> {
    let len = socket.as_os_str().len();
    if len > SOCKET_PATH_MAX_BYTES {
        return Err(ServeError::SocketPathTooLong {
            path: socket.to_path_buf(),
            len,
        });
    }
    let socket_dir = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    private_dir(socket_dir)?;
    private_dir(data_dir)?;
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        let stale = std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
            && std::os::unix::net::UnixStream::connect(socket).is_err();
        if !stale {
            return Err(ServeError::InUse(socket.to_path_buf()));
        }
        std::fs::remove_file(socket).map_err(|e| setup(socket, e))?;
    }
    let daemon = state::Daemon::open(data_dir, config)
        .await
        .map_err(ServeError::Setup)?;
    // The socket is bound inside the 0700 directory and made 0600 before the token
    // file exists: the token file is what a client waits for, so no client ever sees
    // the socket with the umask's mode.
    let listener = UnixListener::bind(socket).map_err(|e| setup(socket, e))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| setup(socket, e))?;
    let token = auth::new_token();
    let token_path = data_dir.join(TOKEN_FILE);
    // Written whole under a temporary name and renamed: a client never reads half a token.
    let partial = data_dir.join(format!("{TOKEN_FILE}.partial"));
    let _ = std::fs::remove_file(&partial);
    crate::private_fs::create_private(&partial, token.as_bytes())
        .map_err(|e| setup(&partial, e))?;
    std::fs::rename(&partial, &token_path).map_err(|e| setup(&token_path, e))?;
    let stopping = daemon.stopping.clone();
    let engine = EngineServiceServer::new(service::Engine::new(daemon))
        .max_decoding_message_size(limits::MAX_REQUEST_BYTES)
        .max_encoding_message_size(limits::MAX_RESPONSE_BYTES);
    let authenticated = InterceptedService::new(
        engine,
        auth::TokenCheck::new(&token).with_profile(config.profile),
    );
    eprintln!(
        "contract-impl engine: listening on {} (token in {})",
        socket.display(),
        token_path.display()
    );
    let (signalled, mut signal_seen) = tokio::sync::watch::channel(false);
    let stop = async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        // Open streams end now (`UNAVAILABLE`, their last sequence named), so the
        // graceful shutdown does not wait on a tail that would never end.
        stopping.send_replace(true);
        signalled.send_replace(true);
    };
    let server = Server::builder()
        // A peer that stops reading its socket altogether is dropped by the keepalive.
        .http2_keepalive_interval(Some(limits::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(limits::KEEPALIVE_TIMEOUT))
        .timeout(std::time::Duration::from_millis(limits::MAX_DEADLINE_MS))
        .layer(tower::util::MapResponseLayer::new(limits::size_status))
        .add_service(authenticated)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop);
    // After the signal, connections get SHUTDOWN_GRACE to finish; then the daemon exits.
    let grace = async move {
        let _ = signal_seen.wait_for(|s| *s).await;
        tokio::time::sleep(limits::SHUTDOWN_GRACE).await;
    };
    let served = tokio::select! {
        served = server => served.map_err(|e| ServeError::Setup(e.to_string())),
        () = grace => Ok(()),
    };
    let _ = std::fs::remove_file(socket);
    served
}
