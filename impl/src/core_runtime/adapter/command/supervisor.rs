//! The watch of one Run's supervisor (`contract-impl worker supervise`): a private
//! directory (0700, named `cw-run-…` so that a supervisor whose watch ended removes it)
//! holding a Unix socket (0600) the supervisor connects to before it starts the program.
//! The adapter holds the connection for the Run's life; when it ends (the Run settled, or
//! the Runtime exited or was killed, SIGKILL included) the supervisor SIGKILLs the
//! program's group and every descendant re-parented to it (it is a child subreaper, so a
//! `setsid` grandchild is one of them) and reaps them.
//!
//! This module never reads or writes the program's stdio; it only learns the program's
//! pid (its process group) from the supervisor's one line, `pid <N>\n`.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Child;

/// Longest the adapter waits for a started supervisor to connect and report its
/// program's pid (it does both before anything else).
pub const SUPERVISOR_START_BOUND: Duration = Duration::from_secs(10);

/// Longest `pid <N>\n` line accepted from a supervisor (bytes).
const PID_LINE_MAX_BYTES: usize = 32;

/// One Run's watch: its private directory and the listening socket.
pub(super) struct SupervisorWatch {
    dir: tempfile::TempDir,
    listener: UnixListener,
}

impl SupervisorWatch {
    /// Creates the private directory and binds the watch socket in it.
    pub(super) fn bind() -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("cw-run-").tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        let listener = UnixListener::bind(dir.path().join("watch.sock"))?;
        std::fs::set_permissions(
            dir.path().join("watch.sock"),
            std::fs::Permissions::from_mode(0o600),
        )?;
        Ok(Self { dir, listener })
    }

    /// The socket's path (for `CONTRACT_SUPERVISOR_WATCH`).
    pub(super) fn path(&self) -> PathBuf {
        self.dir.path().join("watch.sock")
    }

    /// The supervisor's connection and its program's pid, or why there is none (the
    /// supervisor exited first, said something else, or took longer than
    /// [`SUPERVISOR_START_BOUND`]).
    pub(super) async fn accept(&self, supervisor: &mut Child) -> Result<(UnixStream, u32), String> {
        let connected = async {
            let (mut stream, _) = self.listener.accept().await.map_err(|e| e.to_string())?;
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while line.len() < PID_LINE_MAX_BYTES {
                match stream.read(&mut byte).await {
                    Ok(0) => break,
                    Ok(_) if byte[0] == b'\n' => break,
                    Ok(_) => line.push(byte[0]),
                    Err(e) => return Err(e.to_string()),
                }
            }
            let pid = std::str::from_utf8(&line)
                .ok()
                .and_then(|l| l.strip_prefix("pid "))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|&n| n > 1)
                .ok_or_else(|| {
                    "the supervisor could not start the program (see its stderr)".to_string()
                })?;
            Ok((stream, pid))
        };
        tokio::select! {
            accepted = tokio::time::timeout(SUPERVISOR_START_BOUND, connected) => {
                accepted.unwrap_or_else(|_| Err(format!(
                    "the supervisor did not report within {} ms",
                    SUPERVISOR_START_BOUND.as_millis()
                )))
            }
            status = supervisor.wait() => Err(format!(
                "the supervisor exited before starting the program ({})",
                status.map_or_else(|e| e.to_string(), |s| s.to_string())
            )),
        }
    }
}
