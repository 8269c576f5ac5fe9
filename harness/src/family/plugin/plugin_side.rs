//! Side `plugin` of the plugin family: the plugin under test is launched per
//! `docs/plugin-launch-contract.md` and the harness plays its **host**: a fresh launch
//! secret and socket path in the environment, stdin a pipe it holds, readiness the
//! handshake line on stdout, then calls over the plugin's socket with the host's proof in
//! metadata. Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `host: {call, method, request, …}` | starts the call (as the engine family's client: `auth`, `timeout_ms`, `metadata`, `request_size`, `request_base64`, `read`) |
//! | `host: {call, cancel: true}` | cancels the call in flight (RST_STREAM) |
//! | `host: {lifeline: close}` | closes the plugin's stdin: its host is gone |
//! | `plugin: {call, message}` / `{call, status}` | the next event of any call must match |
//! | `send_bytes: {base64}` | those bytes on a fresh connection to the plugin's socket |
//! | `expect_exit: {code}` | the plugin exits with that status |
//!
//! Placeholders bound at launch: `$challenge` and `$other_challenge` (fresh random
//! challenges) and `$proof` (the proof of this launch's secret for `$challenge`). The
//! secret itself must never appear in the plugin's output, and nothing may follow the
//! handshake line on stdout.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use contract_impl::plugin::wire::{
    HANDSHAKE_LINE, PROTOCOL, PROTOCOL_ENV, SECRET_ENV, SOCKET_ENV, host_proof, random_hex,
    secret_proof,
};
use serde_json::Value;
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

use super::codec::{PLUGIN_ROLE, PLUGIN_SERVICE, is_lifeline};
use crate::drive::{
    Connection, DriveOptions, Event, FailureCode, NoOther, Outgoing, Peer, Role, Run, Started,
    StepError, StepResult, expects_exit_first, fail,
};
use crate::rpc::client::ClientLink;
use crate::scenario::model::{Scenario, Step};
use crate::target::{LaunchSpec, RunDir, Startup, Target, check_socket_path};
use crate::transport::ws::truncate;

/// The socket file in the run directory.
pub const SOCKET: &str = "plugin.sock";

/// How long the end of a run waits for the plugin to close stdout once its host is gone.
pub const STDOUT_END_WAIT: Duration = Duration::from_secs(2);

/// The keys of `config.plugin`.
const CONFIG_KEYS: &[&str] = &["env", "env_omit"];

/// The host the harness plays against a plugin under test.
pub struct ScriptedHostPeer {
    link: PluginLink,
    _run_dir: RunDir,
}

/// The plugin's socket, and its stdin: the host's lifeline.
pub struct PluginLink {
    calls: ClientLink,
    stdin: Option<ChildStdin>,
    /// Stdout lines after the handshake line (each one contamination).
    stdout: Option<mpsc::Receiver<Vec<u8>>>,
}

#[async_trait]
impl Connection for PluginLink {
    fn is_open(&self) -> bool {
        self.calls.is_open()
    }

    fn abort(&mut self) -> bool {
        self.calls.abort()
    }

    async fn send(&mut self, message: Outgoing, timeout: Duration) -> StepResult {
        if let Outgoing::Text(text) = &message
            && let Ok(frame) = serde_json::from_str::<Value>(text)
            && is_lifeline(&frame)
        {
            return match self.stdin.take() {
                Some(stdin) => {
                    drop(stdin);
                    Ok(())
                }
                None => Err(StepError::new(
                    FailureCode::ScenarioInvalid,
                    "the plugin's stdin is already closed",
                )),
            };
        }
        self.calls.send(message, timeout).await
    }

    async fn send_close(&mut self, code: u16, reason: &str, timeout: Duration) -> StepResult {
        self.calls.send_close(code, reason, timeout).await
    }

    async fn end(&mut self, timeout: Duration) {
        self.calls.end(timeout).await;
    }
}

/// The environment of the launch contract, changed as `config.plugin` says.
fn environment(
    scenario: &Scenario,
    socket: &Path,
    secret: &str,
) -> Result<Vec<(String, String)>, String> {
    let mut env = vec![
        (PROTOCOL_ENV.to_string(), PROTOCOL.to_string()),
        (SOCKET_ENV.to_string(), socket.display().to_string()),
        (SECRET_ENV.to_string(), secret.to_string()),
    ];
    let Some(config) = &scenario.config.plugin else {
        return Ok(env);
    };
    let Value::Object(map) = config else {
        return Err("config.plugin must be a mapping".into());
    };
    if let Some(k) = map.keys().find(|k| !CONFIG_KEYS.contains(&k.as_str())) {
        return Err(format!(
            "config.plugin: unknown key `{k}` (keys: {})",
            CONFIG_KEYS.join(", ")
        ));
    }
    if let Some(omit) = map.get("env_omit") {
        let names = omit
            .as_array()
            .filter(|a| a.iter().all(Value::is_string))
            .ok_or("config.plugin.env_omit must list variable names")?;
        env.retain(|(k, _)| !names.iter().any(|n| n.as_str() == Some(k)));
    }
    if let Some(set) = map.get("env") {
        let set = set
            .as_object()
            .filter(|m| m.values().all(Value::is_string))
            .ok_or("config.plugin.env must map variable names to text")?;
        for (k, v) in set {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
        }
    }
    Ok(env)
}

/// The first stdout line must be the handshake line.
async fn handshake(lines: &mut mpsc::Receiver<Vec<u8>>) -> Result<(), String> {
    match lines.recv().await {
        Some(line) if line == HANDSHAKE_LINE.as_bytes() => Ok(()),
        Some(line) => Err(format!(
            "stdout_contamination: the plugin's first stdout line is {:?}, not the handshake line {HANDSHAKE_LINE:?}",
            truncate(&String::from_utf8_lossy(&line), 200)
        )),
        // Stdout ended: the exit (or the startup timeout) decides what happened.
        None => std::future::pending().await,
    }
}

/// Launches the plugin under test with a fresh secret and socket path in a private run
/// directory and waits for its handshake line.
///
/// # Errors
/// The launch failed (the text names why, with the plugin's stderr tail).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
) -> Result<Started<ScriptedHostPeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let socket = run_dir.path().join(SOCKET);
    check_socket_path(&socket).map_err(|e| e.to_string())?;
    let secret = random_hex();
    let spec = LaunchSpec {
        command: opts.target_cmd.clone(),
        env: environment(scenario, &socket, &secret)?,
        cwd: run_dir.cwd(),
        secret: secret.clone(),
        capture_stdout: true,
        stdin_pipe: true,
    };
    let mut target = Target::spawn(&spec).map_err(|e| e.to_string())?;
    let stdin = target.take_stdin();
    let mut lines = target
        .take_stdout_lines()
        .ok_or("the plugin's stdout is not captured")?;
    let ready = match target
        .await_ready_or_exit(handshake(&mut lines), opts.startup_timeout)
        .await
    {
        Ok(Startup::Ready(())) => true,
        Ok(Startup::Exited(_)) if expects_exit_first(scenario) => false,
        Ok(Startup::Exited(status)) => {
            return Err(format!(
                "the plugin exited before its handshake line ({status}); stderr:\n{}",
                target.stderr_tail()
            ));
        }
        Err(e) => {
            target.shutdown().await;
            return Err(e.to_string());
        }
    };
    if ready {
        // "0700 dirs, 0600 files and sockets": the plugin's socket is its own to protect.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&socket).map(|m| m.permissions().mode() & 0o777);
        if mode.as_ref().ok() != Some(&0o600) {
            target.shutdown().await;
            return Err(format!(
                "socket_mode: the plugin's socket {} is {}, not 0600",
                socket.display(),
                mode.map_or_else(|e| e.to_string(), |m| format!("{m:o}"))
            ));
        }
    }
    let challenge = random_hex();
    let other_challenge = random_hex();
    let proof = secret_proof(&secret, &challenge);
    Ok(Started {
        ready,
        peer: ScriptedHostPeer {
            link: PluginLink {
                calls: ClientLink::new(&socket, &PLUGIN_SERVICE, host_proof(&secret)),
                stdin,
                stdout: Some(lines),
            },
            _run_dir: run_dir,
        },
        process: Box::new(target),
        secret,
        normalize: super::normalize,
        prebound: vec![
            ("challenge".into(), Value::String(challenge)),
            ("other_challenge".into(), Value::String(other_challenge)),
            ("proof".into(), Value::String(proof)),
        ],
    })
}

#[async_trait]
impl Peer for ScriptedHostPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &PLUGIN_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        Ok(self.link.calls.recv(timeout).await)
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

    /// Nothing may follow the handshake line on stdout ("stdout protocol contamination
    /// fail\[s\] the candidate or call").
    /// The host goes away first (its end of stdin closes), and stdout is read until the
    /// plugin closes it ([`STDOUT_END_WAIT`] at most), so a late print is caught too.
    async fn end_check(&mut self) -> StepResult {
        self.link.stdin = None;
        let Some(lines) = self.link.stdout.as_mut() else {
            return Ok(());
        };
        match tokio::time::timeout(STDOUT_END_WAIT, lines.recv()).await {
            Ok(Some(line)) => Err(StepError::new(
                FailureCode::TrailingOutput,
                format!(
                    "stdout_contamination: the plugin wrote on stdout after its handshake line: {:?}",
                    truncate(&String::from_utf8_lossy(&line), 200)
                ),
            )),
            // Stdout ended, or the plugin keeps it open: nothing more was written.
            Ok(None) | Err(_) => Ok(()),
        }
    }

    async fn family_step(&mut self, _run: &mut Run, step: &Step) -> StepResult {
        Err(fail::unsupported(format!(
            "`{}` is not a step of the plugin family's side plugin",
            step.keyword()
        )))
    }

    fn release(&mut self) {
        self.link.calls.abort();
        // The host is gone: the plugin's stdin ends.
        self.link.stdin = None;
    }
}
