//! What a family supplies to the step engine: the [`Codec`] of its wire, the [`Peer`] the
//! harness plays for a side, and the target [`Process`] its launch contract started.
//!
//! These traits are the engine's seams; they name no family. The event vocabulary
//! ([`Event`], [`Outgoing`]) fits a message transport (WebSocket, 4-byte framed) and an
//! RPC transport alike: an RPC family maps a response message, a status with its
//! trailers and the end of a stream onto [`Event::Text`] (the message in its JSON
//! mapping, one call ID inside it), [`Event::Other`] and [`Event::Eof`].

use std::collections::BTreeMap;
use std::process::ExitStatus;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::failure::StepResult;
use super::run::Run;
use crate::scenario::model::{Party, Step};
use crate::target::Target;
use crate::transport::ws::truncate;

/// Something that can describe itself in one line of a failure message.
pub trait Describe {
    /// A short description (bounded; long text truncated).
    fn describe(&self) -> String;
}

/// Something the target did, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<O> {
    /// A data message the family's [`Codec`] decodes (a WebSocket text message, a framed
    /// payload that is UTF-8).
    Text(String),
    /// A data message that is not text (a binary WebSocket message).
    Binary(Vec<u8>),
    /// The target closed the connection with a Close (`code` `None`: no status).
    Close {
        /// Close status code.
        code: Option<u16>,
        /// Close reason (empty when none).
        reason: String,
    },
    /// The connection ended without a Close.
    Eof,
    /// The target violated the transport or one of its bounds (stable `code`).
    Error {
        /// Stable transport code (`message_too_large`, `frame_too_long`, …).
        code: &'static str,
        /// Detail for people.
        detail: String,
    },
    /// A family event the engine does not interpret (an HTTP request, an RPC status).
    Other(O),
}

impl<O: Describe> Describe for Event<O> {
    fn describe(&self) -> String {
        match self {
            Event::Text(text) => format!("text frame {}", truncate(text, 200)),
            Event::Binary(bytes) => format!("binary message of {} bytes", bytes.len()),
            Event::Close { code, reason } => match code {
                Some(code) => format!("close {code} {reason:?}"),
                None => "close without status".to_string(),
            },
            Event::Eof => "connection dropped without a close frame".to_string(),
            Event::Error { code, detail } => format!("transport error {code}: {detail}"),
            Event::Other(other) => other.describe(),
        }
    }
}

/// A family without events of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoOther {}

impl Describe for NoOther {
    fn describe(&self) -> String {
        match *self {}
    }
}

/// One message the harness sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Encoded by the codec (or written raw by `send_bytes: {text}`).
    Text(String),
    /// Raw bytes (`send_bytes: {base64}`).
    Binary(Vec<u8>),
    /// A text message of raw payload bytes, not necessarily UTF-8
    /// (`send_bytes: {text_base64}`).
    TextBytes(Vec<u8>),
}

/// Why the codec refused a frame: the family's stable wire code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireFault {
    /// The family's stable code (`missing_field`, `duplicate_key`, …).
    pub code: String,
    /// Detail for people.
    pub message: String,
}

impl std::fmt::Display for WireFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// A family's wire, for the engine: decode what the target emitted, check it against
/// the family's single wire definition, check and encode what the harness sends, and
/// say which frames may trail the last step.
pub trait Codec: Send + Sync {
    /// Strictly decodes one emitted data message.
    ///
    /// # Errors
    /// The family's wire fault (duplicate keys, non-finite numbers, …).
    fn decode(&self, text: &str) -> Result<Value, WireFault>;
    /// Checks a decoded frame the **target** emitted.
    ///
    /// # Errors
    /// The schema violation.
    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault>;
    /// Checks a frame the **harness** is about to send.
    ///
    /// # Errors
    /// The schema violation (the scenario must use `send_bytes` for malformed input).
    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault>;
    /// Encodes a checked frame.
    ///
    /// # Errors
    /// A value the wire cannot carry (a non-finite number).
    fn encode(&self, frame: &Value) -> Result<String, WireFault>;
    /// Encodes a frame **without** the schema check, for `send_bytes: {frame}` (malformed
    /// on purpose). By default compact JSON of the frame as it is.
    ///
    /// # Errors
    /// A value JSON cannot carry.
    fn encode_unchecked(&self, frame: &Value) -> Result<String, WireFault> {
        serde_json::to_string(frame).map_err(|e| WireFault {
            code: "invalid_value".into(),
            message: e.to_string(),
        })
    }
    /// Whether a schema-valid frame the target emits after the last step is allowed
    /// (periodic frames by design); such frames are never recorded.
    fn may_trail(&self, frame: &Value) -> bool;
    /// The rule [`Codec::may_trail`] implements, for failure messages
    /// (`only heartbeats may follow the last step`).
    fn trailing_rule(&self) -> &'static str;
    /// The optional features (`crate::scenario::families::FamilyTable::features`) a
    /// recorded frame of the target declares, each supported or not, where the family
    /// declares them on the wire (core_runtime: a Runtime's heartbeat; read by the
    /// feature probe, `crate::family::probe_features`); `None` for every other frame. By
    /// default no frame declares any.
    fn declared_features(&self, frame: &Value) -> Option<BTreeMap<String, bool>> {
        let _ = frame;
        None
    }
}

/// The one connection to the target that the steps use, as the engine sees it: a
/// WebSocket, a framed stream, an RPC channel. Opening it is the family's business
/// (a handshake step); everything else about it is here.
#[async_trait]
pub trait Connection: Send {
    /// Whether it is open.
    fn is_open(&self) -> bool;
    /// Drops it abruptly (no Close); `false` when none was open.
    fn abort(&mut self) -> bool;
    /// Sends one message within `timeout`.
    ///
    /// # Errors
    /// [`super::FailureCode::NotConnected`] when none is open; the send failed.
    async fn send(&mut self, message: Outgoing, timeout: Duration) -> StepResult;
    /// Sends a Close (the closing handshake's first half; a transport without one ends
    /// its write side).
    ///
    /// # Errors
    /// As [`Connection::send`].
    async fn send_close(&mut self, code: u16, reason: &str, timeout: Duration) -> StepResult;
    /// After the target's Close arrived: flushes the Close reply and drops it (at most
    /// `timeout`).
    async fn end(&mut self, timeout: Duration);
}

/// A target process started through a launch contract. [`Target`] is the real one; the
/// engine's unit tests use an in-memory fake.
#[async_trait]
pub trait Process: Send {
    /// Waits for the process to exit (cancel-safe).
    ///
    /// # Errors
    /// Waiting failed.
    async fn wait_exit(&mut self) -> Result<ExitStatus, String>;
    /// Kills the process (its whole group) at once and reaps it.
    ///
    /// # Errors
    /// Killing or reaping failed.
    async fn kill_now(&mut self) -> Result<ExitStatus, String>;
    /// Stops the process (`SIGTERM`, grace, `SIGKILL` of the group); its status.
    async fn shutdown(&mut self) -> Option<ExitStatus>;
    /// Sends `SIGTERM` to the process group and returns at once (`terminate:`).
    fn terminate(&self);
    /// The output channel (`stderr`, `stdout`) on which the secret appeared, if any.
    fn leak_channel(&self) -> Option<&'static str>;
    /// The bounded stderr tail.
    fn stderr_tail(&self) -> String;
    /// The bounded stdout tail.
    fn stdout_tail(&self) -> String;
}

#[async_trait]
impl Process for Target {
    async fn wait_exit(&mut self) -> Result<ExitStatus, String> {
        Target::wait_exit(self).await.map_err(|e| e.to_string())
    }
    async fn kill_now(&mut self) -> Result<ExitStatus, String> {
        Target::kill_now(self).await.map_err(|e| e.to_string())
    }
    async fn shutdown(&mut self) -> Option<ExitStatus> {
        Target::shutdown(self).await
    }
    fn terminate(&self) {
        Target::terminate(self);
    }
    fn leak_channel(&self) -> Option<&'static str> {
        Target::leak_channel(self)
    }
    fn stderr_tail(&self) -> String {
        Target::stderr_tail(self)
    }
    fn stdout_tail(&self) -> String {
        Target::stdout_tail(self)
    }
}

/// The role the harness plays for one side (h2's `Peer` as data): which party the
/// target is, which parties the harness sends for, and the side's wire and names.
pub struct Role {
    /// The family's wire, as this side reads and writes it.
    pub codec: &'static dyn Codec,
    /// The party the target acts as: its frames are expected, never sent.
    pub target: Party,
    /// The parties whose frames the harness sends.
    pub plays: &'static [Party],
    /// The golden label of a frame the target emitted (`runtime frame`).
    pub emitted_label: &'static str,
    /// What the target is called in failure messages (`the target`, `Core`).
    pub target_name: &'static str,
    /// Step keywords this side refuses, each with the reason (`crash` on a side whose
    /// launch contract cannot restart the target).
    pub refuses: &'static [(&'static str, &'static str)],
}

impl Role {
    /// Why `step` cannot run on this side, if it cannot.
    pub fn refusal(&self, step: &Step) -> Option<&'static str> {
        let keyword = step.keyword();
        self.refuses
            .iter()
            .find(|(k, _)| *k == keyword)
            .map(|(_, why)| *why)
    }
}

/// The party the harness plays for one side of a family: its transport, its handshake
/// and the family's own steps. The engine runs every generic step (frames, `silence`,
/// `any_order`, `disconnect`, `half_close`, `send_bytes`, `expect_close`,
/// `expect_exit`, `crash`) through these methods and hands every other step to
/// [`Peer::family_step`].
#[async_trait]
pub trait Peer: Send + Sized {
    /// Family events the engine passes through uninterpreted ([`Event::Other`]).
    type Other: Describe + Send;

    /// Which role the harness plays on this side: data, not code.
    const ROLE: &'static Role;

    /// [`Peer::ROLE`], for calls through a value.
    fn role(&self) -> &'static Role {
        Self::ROLE
    }
    /// The normalization of every recorded body (clock masks, addresses); identity by
    /// default.
    fn normalize(&self, body: Value) -> Value {
        body
    }
    /// The next thing the target does within `timeout` (`None`: nothing came). The
    /// engine checks it for the secret. A connection's end is reported once, as
    /// [`Event::Eof`], and the peer then counts as not connected. Must be cancel-safe.
    ///
    /// # Errors
    /// The peer's own machinery stopped.
    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<Self::Other>>>;
    /// Where `other` carries `secret`, if it does (`the URL of an HTTP POST request`).
    fn leak_in_other(&self, other: &Self::Other, secret: &str) -> Option<String>;
    /// The connection the steps use (to send on, close, drop).
    fn connection(&mut self) -> &mut dyn Connection;
    /// Whether a connection to the target is open.
    fn connected(&mut self) -> bool {
        self.connection().is_open()
    }
    /// A family event after the last step: `Ok` when the family tolerates it (already
    /// secret-checked).
    ///
    /// # Errors
    /// [`super::FailureCode::TrailingOutput`] when it does not.
    fn trailing_other(&mut self, other: Self::Other) -> StepResult;
    /// What the family checks once every step passed and the trailing output was
    /// accepted (side `host` of the worker family: no worker launch no step took).
    ///
    /// # Errors
    /// [`super::FailureCode::TrailingOutput`] naming what the target did unasked.
    async fn end_check(&mut self) -> StepResult {
        Ok(())
    }
    /// Family events already queued when the run ends (secret-checked, then dropped).
    fn queued_others(&mut self) -> Vec<Self::Other> {
        Vec::new()
    }
    /// Called after the harness sent `frame` (a frame step of a party it plays).
    async fn frame_sent(&mut self, _run: &mut Run, _frame: &Value) -> StepResult {
        Ok(())
    }
    /// Runs a step the engine does not know (`bootstrap`, `api`, `native`, …).
    async fn family_step(&mut self, run: &mut Run, step: &Step) -> StepResult;
    /// A `crash` step killed the target: drop every connection to it.
    fn crashed(&mut self) {}
    /// Starts the target again after a `crash` (same environment and directories) and
    /// waits for its readiness.
    ///
    /// # Errors
    /// The restart failed.
    async fn relaunch(&mut self, _startup_timeout: Duration) -> Result<Box<dyn Process>, String> {
        Err("this side's launch contract cannot restart the target".into())
    }
    /// After a `crash: {fresh_state: true}` killed the target, before [`Peer::relaunch`]:
    /// empties the durable state the launch contract gives it (its data directory), so
    /// it starts again as a new machine with the same launch configuration.
    ///
    /// # Errors
    /// This side's launch contract has no such state, or clearing it failed.
    fn forget_state(&mut self) -> Result<(), String> {
        Err("this side's launch contract has no durable state to start afresh".into())
    }
    /// The run is over: drop every connection and listener so the target sees the end
    /// (the run directory stays until the peer is dropped, after the target stopped).
    fn release(&mut self);
}
