//! Side `daemon` of the engine family: the daemon under test is launched per
//! `docs/engine-launch-contract.md` and the harness plays its **client** over the Unix
//! socket: unary calls and server streams with the endpoint token in metadata (or
//! without it, or a wrong one), deadlines, cancellation, raw payloads and raw HTTP/2
//! bytes. Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `client: {call, method, request, …}` | starts the call (engine); its events arrive as daemon frames; `request_size: n` pads the encoded request to exactly `n` bytes with an unknown field |
//! | `client: {call, cancel: true}` | cancels the call in flight (RST_STREAM) |
//! | `client: {call, method, …, read: paused}` | starts the call on a connection of its own and reads nothing (a stalled reader) |
//! | `client: {call, read: discard}` | from now on reads that call's messages and drops them; when it ends, `{call, discarded: {lastSequence}}` then its status |
//! | `daemon: {call, message}` / `{call, status}` | the next event of any call must match (engine) |
//! | `send_bytes: {base64}` | those bytes on a fresh connection; the daemon's answer is `{call: raw, raw: {goaway, closed}}` |
//! | `disconnect` | drops the connection and every call in flight |
//! | `crash` | SIGKILL of the daemon, then the same launch again (same data directory) |
//!
//! The endpoint token is the run's secret: it must never appear in the daemon's output.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::codec::{DAEMON_ROLE, ENGINE_SERVICE};
use crate::drive::{
    Connection, DriveOptions, Event, NoOther, Peer, Process, Role, Run, Started, StepResult, fail,
};
use crate::rpc::client::ClientLink;
use crate::scenario::model::{Scenario, Step};
use crate::target::{LaunchSpec, RunDir, Target, check_socket_path};

/// The socket file in the run directory.
pub const SOCKET: &str = "engine.sock";

/// The data directory in the run directory.
pub const DATA_DIR: &str = "data";

/// The token file the daemon writes in its data directory.
pub const TOKEN_FILE: &str = "endpoint-token";

/// The client the harness plays against a target daemon.
pub struct ScriptedClientPeer {
    link: ClientLink,
    spec: LaunchSpec,
    _run_dir: RunDir,
}

/// The settings of `config.engine`: `retained_events` and `page_bytes` (positive
/// numbers) and `snapshot_key` (`{scope_id, generation, key}`, hex): extra flags of the
/// launch contract, passed only when a scenario sets them.
fn engine_flags(scenario: &Scenario, run_dir: &Path) -> Result<Vec<String>, String> {
    let Some(config) = &scenario.config.engine else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = config else {
        return Err("config.engine must be a mapping".into());
    };
    if let Some(k) = map
        .keys()
        .find(|k| !["retained_events", "page_bytes", "snapshot_key"].contains(&k.as_str()))
    {
        return Err(format!(
            "config.engine: unknown key `{k}` (keys: retained_events, page_bytes, snapshot_key)"
        ));
    }
    let mut flags = Vec::new();
    for (key, flag) in [
        ("retained_events", "--retained-events"),
        ("page_bytes", "--page-bytes"),
    ] {
        if let Some(n) = map.get(key) {
            let n = n
                .as_u64()
                .filter(|n| *n > 0)
                .ok_or(format!("config.engine.{key} must be a positive integer"))?;
            flags.extend([flag.to_string(), n.to_string()]);
        }
    }
    if let Some(key) = map.get("snapshot_key") {
        let path = run_dir.join("snapshot-key.json");
        std::fs::write(&path, key.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        flags.extend([
            "--snapshot-key-file".to_string(),
            path.display().to_string(),
        ]);
    }
    Ok(flags)
}

/// Waits until the daemon's token file is written and its socket accepts a connection;
/// returns the token.
async fn ready(socket: &Path, token_file: &Path) -> Result<String, String> {
    loop {
        if let Ok(token) = std::fs::read_to_string(token_file) {
            let token = token.trim().to_string();
            if !token.is_empty() && tokio::net::UnixStream::connect(socket).await.is_ok() {
                return Ok(token);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    #[allow(unreachable_code)]
    Err(String::new())
}

async fn launch(
    spec: &LaunchSpec,
    socket: &Path,
    data: &Path,
    timeout: Duration,
) -> Result<(Target, String), String> {
    let token_file = data.join(TOKEN_FILE);
    // A restart: readiness must not be read from the last launch's files.
    let _ = std::fs::remove_file(&token_file);
    let mut target = Target::spawn(spec).map_err(|e| e.to_string())?;
    match target
        .await_ready(ready(socket, &token_file), timeout)
        .await
    {
        Ok(token) => Ok((target, token)),
        Err(e) => {
            target.shutdown().await;
            Err(e.to_string())
        }
    }
}

/// Launches the daemon with `--socket` and `--data-dir` in a private run directory and
/// waits for its readiness.
///
/// # Errors
/// The launch failed (the text names why, with the daemon's stderr tail).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
) -> Result<Started<ScriptedClientPeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let socket = run_dir.path().join(SOCKET);
    check_socket_path(&socket).map_err(|e| e.to_string())?;
    let data = run_dir.path().join(DATA_DIR);
    let mut command = opts.target_cmd.clone();
    let mut args = vec![
        "--socket".to_string(),
        socket.display().to_string(),
        "--data-dir".to_string(),
        data.display().to_string(),
    ];
    args.extend(engine_flags(scenario, run_dir.path())?);
    for a in args {
        command.push(' ');
        command.push_str(&shell_words::quote(&a));
    }
    let spec = LaunchSpec {
        command,
        env: Vec::new(),
        cwd: run_dir.cwd(),
        secret: String::new(),
        capture_stdout: false,
        stdin_pipe: false,
    };
    let (target, token) = launch(&spec, &socket, &data, opts.startup_timeout).await?;
    Ok(Started {
        ready: true,
        peer: ScriptedClientPeer {
            link: ClientLink::new(&socket, &ENGINE_SERVICE, token.clone()),
            spec,
            _run_dir: run_dir,
        },
        process: Box::new(target),
        secret: token,
        normalize: super::normalize,
        prebound: Vec::new(),
    })
}

#[async_trait]
impl Peer for ScriptedClientPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &DAEMON_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        Ok(self.link.recv(timeout).await)
    }

    fn leak_in_other(&self, other: &NoOther, _secret: &str) -> Option<String> {
        match *other {}
    }

    fn connection(&mut self) -> &mut dyn Connection {
        &mut self.link
    }

    fn trailing_other(&mut self, other: NoOther) -> StepResult {
        match other {}
    }

    async fn family_step(&mut self, _run: &mut Run, step: &Step) -> StepResult {
        Err(fail::unsupported(format!(
            "`{}` is not a step of the engine family's side daemon",
            step.keyword()
        )))
    }

    fn crashed(&mut self) {
        self.link.grpc.abort();
    }

    fn forget_state(&mut self) -> Result<(), String> {
        let data = self._run_dir.path().join(DATA_DIR);
        match std::fs::remove_dir_all(&data) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("removing {}: {e}", data.display())),
        }
    }

    async fn relaunch(&mut self, startup_timeout: Duration) -> Result<Box<dyn Process>, String> {
        let socket = self.link.socket.clone();
        let data = self._run_dir.path().join(DATA_DIR);
        let (target, token) = launch(&self.spec, &socket, &data, startup_timeout).await?;
        self.link.credential = token;
        self.link.grpc.abort();
        Ok(Box::new(target))
    }

    fn release(&mut self) {
        self.link.grpc.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(config: &str) -> Scenario {
        let source = format!(
            "family: engine\nname: flags\nsummary: s\nsides: [daemon]\ncovers: [EN-AUTH-001]\n{config}steps:\n  - disconnect: {{}}\n"
        );
        crate::scenario::loader::parse_scenario(Path::new("engine/flags.yaml"), &source).unwrap()
    }

    #[test]
    fn launch_flags_only_for_the_settings_a_scenario_makes() {
        let dir = std::env::temp_dir();
        assert!(engine_flags(&scenario(""), &dir).unwrap().is_empty());
        assert_eq!(
            engine_flags(
                &scenario("config:\n  engine: { retained_events: 3, page_bytes: 700 }\n"),
                &dir
            )
            .unwrap(),
            ["--retained-events", "3", "--page-bytes", "700"]
        );
        let err =
            engine_flags(&scenario("config:\n  engine: { page_bytes: 0 }\n"), &dir).unwrap_err();
        assert!(
            err.contains("page_bytes must be a positive integer"),
            "{err}"
        );
        let err =
            engine_flags(&scenario("config:\n  engine: { deadline: 1 }\n"), &dir).unwrap_err();
        assert!(err.contains("unknown key `deadline`"), "{err}");
    }
}
