//! Starting the engine daemon for a test: a private temporary directory, the real
//! binary, readiness when the socket and the token file exist, permissions checked.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_contract-impl");

/// A running daemon, killed on drop.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub token_file: PathBuf,
    pub token: String,
    pub dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon in a fresh directory.
pub fn start() -> Daemon {
    start_with(tempfile::tempdir().unwrap(), &[])
}

/// A daemon in `dir` (data kept there across restarts) with extra `serve` arguments.
pub fn start_with(dir: tempfile::TempDir, extra: &[&str]) -> Daemon {
    let run = dir.path().join("run");
    let data = dir.path().join("data");
    let socket = run.join("engine.sock");
    // A restart: readiness must not be read from the last run's files.
    let _ = std::fs::remove_file(data.join("endpoint-token"));
    let _ = std::fs::remove_file(&socket);
    let child = Command::new(BIN)
        .args(["engine", "serve", "--socket"])
        .arg(&socket)
        .arg("--data-dir")
        .arg(&data)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !(socket.exists() && data.join("endpoint-token").exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let token = std::fs::read_to_string(data.join("endpoint-token")).unwrap();
    for (path, mode) in [
        (&run, 0o700),
        (&data, 0o700),
        (&socket, 0o600),
        (&data.join("endpoint-token"), 0o600),
    ] {
        assert_eq!(
            std::fs::metadata(path).unwrap().permissions().mode() & 0o777,
            mode,
            "{}",
            path.display()
        );
    }
    Daemon {
        child,
        socket,
        token_file: data.join("endpoint-token"),
        token,
        dir,
    }
}
