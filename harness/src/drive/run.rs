//! The live state of one run ([`Run`]) and the generic steps, written once for every
//! family and side: frames sent and expected, `silence`, `any_order`, `disconnect`,
//! `half_close`, `send_bytes`, `expect_close`, `expect_exit`, `crash`, the secret scan
//! of every event, per-step deadlines, recording and the after-the-last-step check.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::failure::{FailureCode, StepError, StepResult, fail};
use super::peer::{Describe, Event, Outgoing, Peer, Process};
use crate::bind::{Bindings, Difference};
use crate::golden::{EntryKind, GoldenEntry, Recording};
use crate::matcher::{match_frame, skip_pattern};
use crate::scenario::model::{ExitCodeSpec, RawMessage, Step};
use crate::transport::ws::truncate;

/// Close code `half_close` sends by default and the harness sends after the last step
/// (normal closure, RFC 6455 §7.4.1).
pub const DEFAULT_CLOSE_CODE: u16 = 1000;

/// Reason of the Close (code [`DEFAULT_CLOSE_CODE`]) the harness sends after the last
/// step of a passing scenario, before it reads the target's trailing output.
pub const END_CLOSE_REASON: &str = "scenario complete";

/// What a failure found while reading the target's trailing output names.
pub const AFTER_LAST_STEP: &str = "after the last step";

/// Bound on waiting for a `SIGKILL`ed target to be reaped (`crash`).
pub const KILL_REAP_BOUND: Duration = Duration::from_secs(5);

/// The failure text of the credential checks: `credential leaked in <channel>` (the
/// credential itself is never printed). Family-neutral: each family's launch contract
/// says where, if anywhere, its secret may travel (core_runtime: only as the exact
/// `Authorization: Bearer <credential>` header; plugin and worker: nowhere, only proofs
/// derived from it).
pub fn leak_message(channel: &str) -> String {
    format!(
        "credential leaked in {channel}; the secret the harness gave the target at launch \
         may appear only where the family's launch contract puts it (never in a URL, a \
         frame, a message or the target's output)"
    )
}

/// `value` as one bounded line.
pub fn show(value: &Value) -> String {
    truncate(&value.to_string(), 300)
}

/// `5s` or `1500ms`.
pub fn show_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The state of one run every step shares: the placeholder table, the recording, the
/// target process, the secret and the deadlines. Family steps receive it next to their
/// peer.
pub struct Run {
    /// The placeholder table.
    pub bindings: Bindings,
    /// Everything the target emitted so far.
    pub recording: Recording,
    /// 1-based index of the running step (0 before the first).
    pub step: usize,
    /// Deadline of every step.
    pub step_timeout: Duration,
    /// Deadline of the target's readiness (also after a `crash`).
    pub startup_timeout: Duration,
    /// The secret that may appear nowhere but where the family allows it.
    pub secret: String,
    /// The target process.
    pub process: Box<dyn Process>,
    /// The first step is `expect_exit`, yet the target became ready.
    pub ready_instead_of_exit: bool,
    /// Stderr tails of processes a `crash` killed.
    pub earlier_stderr: String,
    /// The output channel on which a killed process had leaked the secret.
    pub earlier_leak: Option<&'static str>,
    /// Frames of the target that `optional:` steps allow before the next expected frame.
    optional: Vec<PendingOptional>,
    /// Text frames of the target received while awaiting a typical frame before a send,
    /// handed to the next receive (in order).
    held: std::collections::VecDeque<String>,
    /// The label of the first recorded body that carried the secret (redacted).
    pub recorded_leak: Option<String>,
    normalize: fn(&Value) -> Value,
    /// When the run started (the wire log's clock).
    pub started: Instant,
}

/// A typical frame an `optional:` step allows, not yet seen.
#[derive(Debug, Clone)]
struct PendingOptional {
    /// The frame's pattern.
    pattern: Value,
    /// Set when the step is inside a `reference:` group in vendor mode: our reference
    /// sends the frame, so its absence is a [`crate::bind::Difference`] naming this
    /// requirement.
    requirement: Option<String>,
    /// The 1-based index of its step.
    step: usize,
}

fn identity(value: &Value) -> Value {
    value.clone()
}

/// Whether any string (or key) in `value` contains `secret`; every occurrence is
/// replaced by `<credential>`.
fn redact_value(value: &mut Value, secret: &str) -> bool {
    match value {
        Value::String(text) if text.contains(secret) => {
            *text = text.replace(secret, "<credential>");
            true
        }
        Value::Array(items) => {
            // Every element is redacted: no short-circuit.
            let mut found = false;
            for item in items {
                found |= redact_value(item, secret);
            }
            found
        }
        Value::Object(map) => {
            let leaked_keys: Vec<String> =
                map.keys().filter(|k| k.contains(secret)).cloned().collect();
            for key in &leaked_keys {
                if let Some(v) = map.remove(key) {
                    map.insert(key.replace(secret, "<credential>"), v);
                }
            }
            map.values_mut().fold(!leaked_keys.is_empty(), |found, v| {
                redact_value(v, secret) || found
            })
        }
        _ => false,
    }
}

/// Whether any string (or key) of `value` contains `secret`.
fn carries_secret(value: &Value, secret: &str) -> bool {
    match value {
        Value::String(text) => text.contains(secret),
        Value::Array(items) => items.iter().any(|v| carries_secret(v, secret)),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k.contains(secret) || carries_secret(v, secret)),
        _ => false,
    }
}

impl Run {
    /// A fresh run around `process`.
    pub fn new(
        process: Box<dyn Process>,
        secret: String,
        step_timeout: Duration,
        startup_timeout: Duration,
    ) -> Self {
        Self {
            bindings: Bindings::new(),
            recording: Recording::new(),
            step: 0,
            step_timeout,
            startup_timeout,
            secret,
            process,
            ready_instead_of_exit: false,
            earlier_stderr: String::new(),
            earlier_leak: None,
            optional: Vec::new(),
            held: Default::default(),
            recorded_leak: None,
            normalize: identity,
            started: Instant::now(),
        }
    }

    /// Sets the normalization applied to every recorded body.
    pub fn set_normalize(&mut self, normalize: fn(&Value) -> Value) {
        self.normalize = normalize;
    }

    /// Records one emission of the target at the running step (normalized).
    ///
    /// A body that carries the secret in any decoded string (however the target escaped
    /// it on the wire) is recorded with the secret replaced by `<credential>`, and the run
    /// fails at its end ([`Run::recorded_leak`]): a golden never holds the secret.
    pub fn record(&mut self, label: &str, kind: EntryKind, body: Value) {
        let mut body = (self.normalize)(&body);
        if !self.secret.is_empty() && redact_value(&mut body, &self.secret) {
            self.recorded_leak.get_or_insert_with(|| label.to_string());
        }
        self.log_wire("from target", label, &body);
        self.recording.push(GoldenEntry {
            step: self.step,
            label: label.to_string(),
            kind,
            body,
        });
    }

    /// Fails when `text` carries the secret.
    ///
    /// # Errors
    /// [`FailureCode::CredentialLeak`] naming `place`.
    pub fn check_secret(&self, text: &str, place: &str) -> StepResult {
        if !self.secret.is_empty() && text.contains(self.secret.as_str()) {
            return Err(fail::leak(leak_message(place)));
        }
        Ok(())
    }

    /// Fails when `event` carries the secret (frame, binary message, close reason, or
    /// wherever the family says for its own events).
    ///
    /// # Errors
    /// [`FailureCode::CredentialLeak`].
    pub fn check_event<P: Peer>(&self, peer: &P, event: &Event<P::Other>) -> StepResult {
        match event {
            Event::Text(text) => self.check_secret(text, "a text frame"),
            Event::Binary(bytes) => {
                self.check_secret(&String::from_utf8_lossy(bytes), "a binary message")
            }
            Event::Close { reason, .. } => self.check_secret(reason, "a close reason"),
            Event::Other(other) if !self.secret.is_empty() => {
                match peer.leak_in_other(other, &self.secret) {
                    Some(place) => Err(fail::leak(leak_message(&place))),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// The next thing the target does within `timeout`, secret-checked.
    ///
    /// # Errors
    /// A leak, or the peer's machinery stopped.
    pub async fn next_event<P: Peer>(
        &mut self,
        peer: &mut P,
        timeout: Duration,
    ) -> StepResult<Option<Event<P::Other>>> {
        if let Some(text) = self.held.pop_front() {
            return Ok(Some(Event::Text(text)));
        }
        let event = peer.recv(timeout).await?;
        if let Some(event) = &event {
            self.check_event(peer, event)?;
        }
        Ok(event)
    }

    /// [`Run::next_event`] until `deadline`: `None` once it has passed.
    ///
    /// # Errors
    /// As [`Run::next_event`].
    async fn next_event_until<P: Peer>(
        &mut self,
        peer: &mut P,
        deadline: Instant,
    ) -> StepResult<Option<Event<P::Other>>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        self.next_event(peer, left).await
    }

    /// `expected …, got nothing within <step deadline>`.
    pub fn nothing<P: Peer>(&self, peer: &mut P, expected: &str) -> StepError {
        let state = if peer.connected() {
            ""
        } else {
            " (no connection is open)"
        };
        fail::timeout(format!(
            "expected {expected}, got nothing within {}{state}",
            show_duration(self.step_timeout)
        ))
    }

    /// Decodes and schema-checks one emitted text frame.
    fn decode_emitted<P: Peer>(&self, peer: &P, text: &str, expected: &str) -> StepResult<Value> {
        let codec = peer.role().codec;
        let value = codec.decode(text).map_err(|e| {
            StepError::new(
                FailureCode::InvalidFrame,
                format!(
                    "expected {expected}, got an invalid frame ({e}): {}",
                    truncate(text, 300)
                ),
            )
        })?;
        codec.check_emitted(&value).map_err(|e| {
            StepError::new(
                FailureCode::SchemaViolation,
                format!(
                    "emitted frame violates the wire schema ({e}): {}",
                    show(&value)
                ),
            )
        })?;
        self.check_decoded(&value, "a text frame")?;
        Ok(value)
    }

    /// Fails when a decoded frame carries the secret in any string or key (an escaped
    /// secret passes the raw-text check).
    ///
    /// # Errors
    /// [`FailureCode::CredentialLeak`] naming `place`.
    pub fn check_decoded(&self, value: &Value, place: &str) -> StepResult {
        if !self.secret.is_empty() && carries_secret(value, &self.secret) {
            return Err(fail::leak(leak_message(place)));
        }
        Ok(())
    }

    /// Receives the next frame from the target within the step deadline, decodes and
    /// schema-checks it, and records it.
    ///
    /// # Errors
    /// Nothing came, something else came, or the frame is invalid.
    pub async fn expect_frame<P: Peer>(
        &mut self,
        peer: &mut P,
        expected: &str,
    ) -> StepResult<Value> {
        self.expect_frame_of(peer, expected, &[]).await
    }

    /// [`Run::expect_frame`], where a frame matching a pending `optional:` pattern but
    /// none of `awaited` is taken by that optional step (recorded, bound) and the wait
    /// goes on, within the same deadline.
    async fn expect_frame_of<P: Peer>(
        &mut self,
        peer: &mut P,
        expected: &str,
        awaited: &[&Value],
    ) -> StepResult<Value> {
        let deadline = Instant::now() + self.step_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.nothing(peer, expected));
            }
            let text = match self.next_event(peer, left).await? {
                Some(Event::Text(text)) => text,
                Some(Event::Error { code, detail }) => {
                    return Err(StepError::new(
                        FailureCode::InvalidFrame,
                        format!(
                            "expected {expected}, got a frame the transport refuses ({code}: {detail})"
                        ),
                    ));
                }
                Some(other) => {
                    return Err(fail::unexpected(format!(
                        "expected {expected}, got {}",
                        other.describe()
                    )));
                }
                None => return Err(self.nothing(peer, expected)),
            };
            let value = self.decode_emitted(peer, &text, expected)?;
            self.record(peer.role().emitted_label, EntryKind::Frame, value.clone());
            // Awaited frames are tried as if the pending typical frames never came.
            let mut view = self.bindings.clone();
            for pending in &self.optional {
                skip_pattern(&pending.pattern, &mut view, None);
            }
            let awaited_match = awaited.iter().any(|pattern| {
                let mut trial = view.clone();
                match_frame(pattern, &value, &mut trial).is_ok()
            });
            if awaited_match || !self.take_optional(&value) {
                return Ok(value);
            }
        }
    }

    /// Whether `value` is a frame a pending `optional:` step allows (it is then taken:
    /// the pattern is dropped and its placeholders bound). A taken frame just recorded
    /// is labelled with the step that declared it, not the step during which it
    /// happened to arrive: the golden is the same whether the target sends it at once or
    /// later, and in strict and vendor mode alike.
    fn take_optional(&mut self, value: &Value) -> bool {
        for i in 0..self.optional.len() {
            if match_frame(&self.optional[i].pattern, value, &mut self.bindings).is_ok() {
                let declared = self.optional.remove(i).step;
                let normalized = (self.normalize)(value);
                if let Some(last) = self.recording.entries.last_mut()
                    && matches!(last.kind, EntryKind::Frame)
                    && last.body == normalized
                {
                    last.step = declared;
                }
                return true;
            }
        }
        false
    }

    /// Before the harness sends `template`: when it uses a placeholder that only a pending
    /// typical frame carries (the admission handle of a `preparing` the harness must
    /// release), that frame is awaited within the step deadline, as a real peer would wait
    /// for the value. Another frame arriving first is held for the next step, and the
    /// typical frames are then over, as is the wait when the deadline passes: the send
    /// then fails on the placeholder ([`crate::bind::BindError::Skipped`]).
    ///
    /// # Errors
    /// Something other than a frame arrived first.
    async fn await_carried<P: Peer>(&mut self, peer: &mut P, template: &Value) -> StepResult {
        let carried = |run: &Self| {
            let mut view = run.bindings.clone();
            for pending in &run.optional {
                skip_pattern(&pending.pattern, &mut view, None);
            }
            let mut names = Vec::new();
            crate::bind::placeholder_names(template, &mut names);
            names.into_iter().any(|n| view.is_skipped(&n))
        };
        if self.optional.is_empty() || !carried(self) {
            return Ok(());
        }
        let deadline = Instant::now() + self.step_timeout;
        while carried(self) {
            match self.next_event_until(peer, deadline).await? {
                None => break,
                Some(event @ Event::Text(_)) => {
                    if !self.take_if_optional(peer, &event)? {
                        // Kept for the next step, which checks and records it.
                        if let Event::Text(text) = event {
                            self.held.push_back(text);
                        }
                        break;
                    }
                }
                Some(other) => {
                    return Err(fail::unexpected(format!(
                        "expected the typical frame that carries a value of the frame to send, \
                         got {}",
                        other.describe()
                    )));
                }
            }
        }
        if carried(self) {
            self.drop_optionals();
        }
        Ok(())
    }

    /// A later frame arrived (or the steps ended): the typical frames still pending can
    /// no longer come. Their placeholders are skipped ([`skip_pattern`]); one inside a
    /// `reference:` group (vendor mode) is recorded as a difference from the reference.
    fn drop_optionals(&mut self) {
        for pending in std::mem::take(&mut self.optional) {
            skip_pattern(
                &pending.pattern,
                &mut self.bindings,
                pending.requirement.as_deref(),
            );
            if let Some(requirement) = pending.requirement {
                self.bindings.differences.push(Difference {
                    requirement,
                    path: format!("step {} (typical frame, not sent)", pending.step),
                    reference: pending.pattern,
                    actual: None,
                });
            }
        }
    }

    /// Expects one frame matching `pattern` (binds on success).
    ///
    /// # Errors
    /// As [`Run::expect_frame`], or the frame does not match.
    pub async fn expect_matching<P: Peer>(&mut self, peer: &mut P, pattern: &Value) -> StepResult {
        let value = self
            .expect_frame_of(peer, &show(pattern), &[pattern])
            .await?;
        // A later frame arrived: the typical ones before it can no longer come.
        self.drop_optionals();
        match_frame(pattern, &value, &mut self.bindings).map_err(|m| {
            let reference = m.reference.clone();
            let mut e = fail::mismatch(format!(
                "emitted frame does not match: {m}\n  emitted: {}",
                show(&value)
            ));
            e.reference = reference;
            e
        })?;
        let last = self.recording.entries.len().checked_sub(1);
        self.mask_recorded(last, pattern);
        Ok(())
    }

    /// The recorded entry `entry` with what `pattern` marks `$unspecified` masked
    /// ([`crate::matcher::mask_unspecified`]): a golden never records a value the spec
    /// leaves open.
    pub fn mask_recorded(&mut self, entry: Option<usize>, pattern: &Value) {
        if let Some(e) = entry.and_then(|i| self.recording.entries.get_mut(i)) {
            e.body = crate::matcher::mask_unspecified(pattern, &e.body);
        }
    }

    /// Appends one frame to the run's wire log ([`Recording::wire`]), the secret
    /// redacted.
    pub fn log_wire(&mut self, dir: &str, label: &str, body: &Value) {
        let mut body = body.clone();
        if !self.secret.is_empty() {
            redact_value(&mut body, &self.secret);
        }
        let t_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.recording.wire.push(json!({
            "t_ms": t_ms, "step": self.step, "dir": dir, "label": label, "body": body,
        }));
    }

    /// Builds (placeholders substituted, unbound ones minted), schema-checks, encodes and
    /// sends one frame as the party the harness plays.
    ///
    /// # Errors
    /// The frame cannot be built or is invalid; the send failed.
    pub async fn send_frame<P: Peer>(
        &mut self,
        peer: &mut P,
        template: &Value,
    ) -> StepResult<Value> {
        self.await_carried(peer, template).await?;
        let frame = self.build_frame(template)?;
        let codec = peer.role().codec;
        codec.check_outgoing(&frame).map_err(|e| {
            fail::scenario(format!(
                "the scenario's frame is invalid ({e}); use send_bytes to send malformed input on purpose"
            ))
        })?;
        let text = codec
            .encode(&frame)
            .map_err(|e| fail::scenario(format!("cannot encode the frame to send: {e}")))?;
        peer.connection()
            .send(Outgoing::Text(text), self.step_timeout)
            .await
            .map_err(|e| {
                StepError::new(e.code, format!("sending the frame failed: {}", e.message))
            })?;
        let normalized = (self.normalize)(&frame);
        self.log_wire("to target", "harness frame", &normalized);
        Ok(frame)
    }

    /// Runs one step: the generic ones here, every other one through
    /// [`Peer::family_step`].
    ///
    /// # Errors
    /// The step's failure.
    pub async fn exec<P: Peer>(&mut self, peer: &mut P, step: &Step) -> StepResult {
        match step {
            Step::Reference {
                requirement,
                steps,
                sides,
            } => {
                // Our reference's choice only on the sides it names: elsewhere the steps
                // are ordinary (a Core's behaviour in a group about the Runtime's).
                if let Some(sides) = sides
                    && !sides.contains(&peer.role().target.side())
                {
                    for inner in steps {
                        self.exec_plain(peer, inner).await?;
                    }
                    return Ok(());
                }
                // A group inside a group: its steps are its own requirement's (the
                // innermost names a difference), flattened in order.
                let mut flat: Vec<(&String, &Step)> = Vec::new();
                for inner in steps {
                    match inner {
                        Step::Reference {
                            requirement: r,
                            steps: s,
                            ..
                        } => {
                            for deeper in s {
                                if matches!(deeper, Step::Reference { .. }) {
                                    return Err(fail::scenario(
                                        "`reference` groups nest at most two deep",
                                    ));
                                }
                                flat.push((r, deeper));
                            }
                        }
                        other => flat.push((requirement, other)),
                    }
                }
                for (requirement, inner) in flat {
                    // A typical frame of the target that our reference sends: expected in
                    // strict mode; in vendor mode optional, its absence a difference.
                    if let Step::Optional(frame) = inner
                        && let Step::Frame { party, frame } = &**frame
                        && *party == peer.role().target
                    {
                        if self.bindings.vendor {
                            self.optional.push(PendingOptional {
                                pattern: frame.clone(),
                                requirement: Some(requirement.clone()),
                                step: self.step,
                            });
                            continue;
                        }
                        self.expect_matching(peer, frame).await.map_err(|e| {
                            let mut e = e.in_reference(requirement);
                            e.message = format!("{} ({})", e.message, inner.describe());
                            e
                        })?;
                        continue;
                    }
                    self.exec_plain(peer, inner).await.map_err(|e| {
                        let mut e = e.in_reference(requirement);
                        e.message = format!("{} ({})", e.message, inner.describe());
                        e
                    })?;
                }
                Ok(())
            }
            other => self.exec_plain(peer, other).await,
        }
    }

    /// One step that is not a `reference:` group.
    async fn exec_plain<P: Peer>(&mut self, peer: &mut P, step: &Step) -> StepResult {
        if let Some(reason) = peer.role().refusal(step) {
            return Err(fail::unsupported(reason));
        }
        match step {
            Step::Frame { party, frame } if *party == peer.role().target => {
                self.expect_matching(peer, frame).await
            }
            Step::Frame { party, frame } if peer.role().plays.contains(party) => {
                let sent = self.send_frame(peer, frame).await?;
                peer.frame_sent(self, &sent).await
            }
            Step::Frame { party, .. } => {
                Err(fail::unsupported(format!("`{party}` cannot send frames")))
            }
            Step::Silence(d) => self.silence(peer, *d).await,
            Step::Sleep(d) => {
                tokio::time::sleep(*d).await;
                Ok(())
            }
            Step::AnyOrder(steps) => self.any_order(peer, steps).await,
            Step::Repeat { times, steps } => {
                for pass in 1..=*times {
                    for inner in steps {
                        Box::pin(self.exec_plain(peer, inner))
                            .await
                            .map_err(|mut e| {
                                e.message = format!(
                                    "{} (pass {pass} of {times}, {})",
                                    e.message,
                                    inner.describe()
                                );
                                e
                            })?;
                    }
                }
                Ok(())
            }
            // A typical frame (`optional:`): our reference, played by the harness, sends
            // it; another conformant target may send a `tolerated:` one, which ours
            // (played by the harness) does not.
            Step::Optional(inner) | Step::Tolerated(inner) => {
                let sends = matches!(step, Step::Optional(_));
                match &**inner {
                    Step::Frame { party, frame } if *party == peer.role().target => {
                        self.optional.push(PendingOptional {
                            pattern: frame.clone(),
                            requirement: None,
                            step: self.step,
                        });
                        Ok(())
                    }
                    Step::Frame { party, frame } if peer.role().plays.contains(party) => {
                        if !sends {
                            return Ok(());
                        }
                        let sent = self.send_frame(peer, frame).await?;
                        peer.frame_sent(self, &sent).await
                    }
                    other => Err(fail::scenario(format!(
                        "{} holds one frame step, found {}",
                        step.keyword(),
                        other.describe()
                    ))),
                }
            }
            Step::Disconnect => {
                self.log_wire("to target", "disconnect", &Value::Null);
                if peer.connection().abort() {
                    Ok(())
                } else {
                    Err(fail::not_connected("there is no connection to drop"))
                }
            }
            Step::HalfClose { code, reason } => {
                self.half_close(
                    peer,
                    code.unwrap_or(DEFAULT_CLOSE_CODE),
                    reason.as_deref().unwrap_or(""),
                )
                .await
            }
            Step::SendBytes(raw) => {
                let logged = match raw {
                    RawMessage::Text(text) => json!({
                        "text": crate::golden::summarize_long_string(text).unwrap_or_else(|| text.clone())
                    }),
                    RawMessage::Binary(bytes) => json!({"binary_bytes": bytes.len()}),
                    RawMessage::TextBytes(bytes) => {
                        json!({"text_bytes": bytes.len(), "utf8": std::str::from_utf8(bytes).is_ok()})
                    }
                    RawMessage::Frame(template) => json!({"frame": template}),
                    RawMessage::FrameRepeatingKey { frame, repeat } => json!({
                        "frame": frame,
                        "repeat_key": {"path": repeat.path, "value": repeat.value},
                    }),
                };
                self.log_wire("to target", "raw bytes", &logged);
                let message = match raw {
                    RawMessage::Text(text) => Outgoing::Text(text.clone()),
                    RawMessage::Binary(bytes) => Outgoing::Binary(bytes.clone()),
                    RawMessage::TextBytes(bytes) => Outgoing::TextBytes(bytes.clone()),
                    RawMessage::Frame(template) => Outgoing::Text(self.raw_frame(peer, template)?),
                    RawMessage::FrameRepeatingKey { frame, repeat } => {
                        let text = self.raw_frame(peer, frame)?;
                        let value = match &repeat.value {
                            None => None,
                            Some(value) => Some(
                                self.bindings
                                    .substitute(value, true)
                                    .map_err(|e| fail::bind(e, "the repeated member"))?,
                            ),
                        };
                        Outgoing::Text(
                            repeat
                                .apply(&text, value.as_ref())
                                .map_err(fail::scenario)?,
                        )
                    }
                };
                peer.connection()
                    .send(message, self.step_timeout)
                    .await
                    .map_err(|e| {
                        StepError::new(e.code, format!("sending raw bytes failed: {}", e.message))
                    })
            }
            Step::ExpectClose { code, reason } => {
                self.expect_close(peer, code.as_ref(), reason.as_ref())
                    .await
            }
            Step::ExpectExit { code, stderr } => self.expect_exit(peer, code.clone(), stderr).await,
            Step::Crash { fresh_state } => self.crash(peer, *fresh_state).await,
            Step::Terminate => {
                self.process.terminate();
                Ok(())
            }
            other => peer.family_step(self, other).await,
        }
    }

    /// A frame the harness sends, from its template: `$generated` expanded, placeholders
    /// substituted (unbound ones minted), `$text` expanded.
    fn build_frame(&mut self, template: &Value) -> Result<Value, StepError> {
        let template = crate::matcher::expand_generated(template).map_err(fail::scenario)?;
        let frame = self
            .bindings
            .substitute(&template, true)
            .map_err(|e| fail::bind(e, "the frame to send"))?;
        crate::matcher::expand_text(&frame).map_err(fail::scenario)
    }

    /// The text of `send_bytes: {frame}`: placeholders substituted, `$generated` and
    /// `$text` expanded, encoded without the schema check.
    fn raw_frame<P: Peer>(&mut self, peer: &P, template: &Value) -> Result<String, StepError> {
        let frame = self.build_frame(template)?;
        peer.role()
            .codec
            .encode_unchecked(&frame)
            .map_err(|e| fail::scenario(format!("cannot encode the frame to send: {e}")))
    }

    /// `silence: d`: nothing may arrive for `d`.
    async fn silence<P: Peer>(&mut self, peer: &mut P, duration: Duration) -> StepResult {
        // A typical frame an `optional:` step allows is not a breach of silence.
        let Some(event) = self.next_unoptional(peer, duration).await? else {
            return Ok(());
        };
        if let Event::Text(text) = &event
            && let Ok(value) = peer.role().codec.decode(text)
        {
            self.check_decoded(&value, "a text frame")?;
            self.record(peer.role().emitted_label, EntryKind::Frame, value);
        }
        Err(fail::unexpected(format!(
            "expected silence for {}, got {}",
            show_duration(duration),
            event.describe()
        )))
    }

    /// `any_order`: frames are received until each expectation matched exactly one
    /// (first match wins; a failed trial binds nothing). The group's frames are recorded
    /// in the order the scenario lists their expectations, not in arrival order, so a
    /// golden never records an order the group leaves free.
    async fn any_order<P: Peer>(&mut self, peer: &mut P, steps: &[Step]) -> StepResult {
        let target = peer.role().target;
        let mut remaining: Vec<(usize, &Value)> = Vec::new();
        for step in steps {
            match step {
                Step::Frame { party, frame } if *party == target => {
                    remaining.push((remaining.len(), frame));
                }
                other => {
                    return Err(fail::scenario(format!(
                        "any_order may only hold frames the target emits; found {}",
                        other.describe()
                    )));
                }
            }
        }
        let steps_frames: Vec<&Value> = remaining.iter().map(|(_, v)| *v).collect();
        let mut placed: Vec<(usize, usize)> = Vec::new();
        while !remaining.is_empty() {
            let expected = format!(
                "one of {} frames: {}",
                remaining.len(),
                remaining
                    .iter()
                    .map(|(_, v)| show(v))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let patterns: Vec<&Value> = remaining.iter().map(|(_, v)| *v).collect();
            let value = self.expect_frame_of(peer, &expected, &patterns).await?;
            let entry = self.recording.entries.len().checked_sub(1);
            self.drop_optionals();
            let mut reasons = Vec::new();
            let mut matched = None;
            for (i, (_, pattern)) in remaining.iter().enumerate() {
                let mut trial = self.bindings.clone();
                match match_frame(pattern, &value, &mut trial) {
                    Ok(()) => {
                        self.bindings = trial;
                        matched = Some(i);
                        break;
                    }
                    Err(m) => reasons.push(format!("  vs {}: {m}", show(pattern))),
                }
            }
            match matched {
                Some(i) => {
                    let (listed, pattern) = remaining.remove(i);
                    self.mask_recorded(entry, pattern);
                    if let Some(entry) = entry {
                        placed.push((entry, listed));
                    }
                }
                None => {
                    return Err(fail::mismatch(format!(
                        "emitted frame matches none of the remaining expectations: {}\n{}",
                        show(&value),
                        reasons.join("\n")
                    )));
                }
            }
        }
        // Recorded entries of the group, put in the order their expectations are listed;
        // entries of equal expectations (which one matched which is arrival order) by how
        // the golden shows them, bound values as their placeholders.
        let slots: Vec<usize> = placed.iter().map(|(entry, _)| *entry).collect();
        let first_equal = |listed: usize| {
            let pattern = steps_frames[listed];
            steps_frames
                .iter()
                .position(|p| *p == pattern)
                .unwrap_or(listed)
        };
        let mut keyed: Vec<(usize, String, usize)> = placed
            .iter()
            .map(|(entry, listed)| {
                let shown = self.shown(&self.recording.entries[*entry].body);
                (first_equal(*listed), shown, *entry)
            })
            .collect();
        keyed.sort();
        let mut placed: Vec<(usize, usize)> = keyed.into_iter().map(|(l, _, e)| (e, l)).collect();
        placed.sort_by_key(|(_, listed)| *listed);
        let bodies: Vec<_> = placed
            .iter()
            .map(|(entry, _)| self.recording.entries[*entry].clone())
            .collect();
        for (slot, mut body) in slots.into_iter().zip(bodies) {
            body.step = self.recording.entries[slot].step;
            self.recording.entries[slot] = body;
        }
        Ok(())
    }

    /// `body` as a golden shows it: bound string values as their placeholders.
    fn shown(&self, body: &Value) -> String {
        fn walk(v: &Value, b: &crate::bind::Bindings) -> Value {
            match v {
                Value::String(_) => b
                    .name_of(v)
                    .map_or_else(|| v.clone(), |n| Value::String(format!("${n}"))),
                Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, b)).collect()),
                Value::Object(o) => {
                    Value::Object(o.iter().map(|(k, x)| (k.clone(), walk(x, b))).collect())
                }
                other => other.clone(),
            }
        }
        walk(body, &self.bindings).to_string()
    }

    fn record_close(&mut self, code: Option<u16>, reason: &str) {
        self.record(
            "close",
            EntryKind::Close,
            json!({"event": "close", "code": code, "reason": reason}),
        );
    }

    /// The next event within `timeout` that is not a frame a pending `optional:` step
    /// allows (such frames are taken: recorded and bound), so a typical frame may still
    /// arrive before a Close.
    async fn next_unoptional<P: Peer>(
        &mut self,
        peer: &mut P,
        timeout: Duration,
    ) -> StepResult<Option<Event<P::Other>>> {
        let deadline = Instant::now() + timeout;
        loop {
            let event = self.next_event_until(peer, deadline).await?;
            if let Some(e) = &event
                && self.take_if_optional(peer, e)?
            {
                continue;
            }
            return Ok(event);
        }
    }

    /// Takes `event` when it is a valid frame a pending `optional:` step allows: it is
    /// then secret-checked, recorded and bound, and `true` is returned.
    ///
    /// # Errors
    /// The frame carries the secret.
    fn take_if_optional<P: Peer>(&mut self, peer: &P, event: &Event<P::Other>) -> StepResult<bool> {
        if self.optional.is_empty() {
            return Ok(false);
        }
        let Event::Text(text) = event else {
            return Ok(false);
        };
        let codec = peer.role().codec;
        let Ok(value) = codec.decode(text) else {
            return Ok(false);
        };
        if codec.check_emitted(&value).is_err() || !self.optional_allows(&value) {
            return Ok(false);
        }
        self.check_decoded(&value, "a text frame")?;
        self.record(peer.role().emitted_label, EntryKind::Frame, value.clone());
        self.take_optional(&value);
        Ok(true)
    }

    /// Whether a pending `optional:` pattern matches `value` (nothing is bound).
    fn optional_allows(&self, value: &Value) -> bool {
        self.optional.iter().any(|pending| {
            let mut trial = self.bindings.clone();
            match_frame(&pending.pattern, value, &mut trial).is_ok()
        })
    }

    /// `half_close`: sends Close; the next event must be the target's Close reply.
    async fn half_close<P: Peer>(&mut self, peer: &mut P, code: u16, reason: &str) -> StepResult {
        self.log_wire(
            "to target",
            "close",
            &json!({"code": code, "reason": reason}),
        );
        peer.connection()
            .send_close(code, reason, self.step_timeout)
            .await
            .map_err(|e| StepError::new(e.code, format!("sending Close failed: {}", e.message)))?;
        let name = peer.role().target_name;
        match self.next_unoptional(peer, self.step_timeout).await? {
            Some(Event::Close { code, reason }) => {
                self.record_close(code, &reason);
                peer.connection().end(self.step_timeout).await;
                Ok(())
            }
            Some(other) => Err(fail::unexpected(format!(
                "expected {name}'s Close reply, got {}",
                other.describe()
            ))),
            None => Err(self.nothing(peer, &format!("{name}'s Close reply"))),
        }
    }

    /// `expect_close`: a Close, its code and reason matched when given (patterns, like a
    /// frame's values: a `{$reference: …}` code is our reference's choice), or, when
    /// neither is given, a dropped connection. A dropped connection has code and reason
    /// `null`, so it also satisfies patterns that allow any value (`$_`).
    async fn expect_close<P: Peer>(
        &mut self,
        peer: &mut P,
        code: Option<&Value>,
        reason: Option<&Value>,
    ) -> StepResult {
        let mut pattern = serde_json::Map::new();
        if let Some(code) = code {
            pattern.insert("code".into(), code.clone());
        }
        if let Some(reason) = reason {
            pattern.insert("reason".into(), reason.clone());
        }
        let pattern = Value::Object(pattern);
        let expected = if code.is_none() && reason.is_none() {
            "a Close frame or a dropped connection".to_string()
        } else {
            format!("a Close frame {}", show(&pattern))
        };
        let actual = match self.next_unoptional(peer, self.step_timeout).await? {
            Some(Event::Close {
                code: got_code,
                reason: got_reason,
            }) => {
                self.record_close(got_code, &got_reason);
                // Flush the automatic Close reply, then end the connection.
                peer.connection().end(self.step_timeout).await;
                json!({"code": got_code, "reason": got_reason})
            }
            Some(Event::Eof) => {
                self.record("close", EntryKind::Close, json!({"event": "dropped"}));
                peer.connection().abort();
                json!({"code": null, "reason": null})
            }
            Some(other) => {
                return Err(fail::unexpected(format!(
                    "expected {expected}, got {}",
                    other.describe()
                )));
            }
            None => return Err(self.nothing(peer, &expected)),
        };
        self.drop_optionals();
        match_frame(&pattern, &actual, &mut self.bindings).map_err(|m| {
            let got = if actual["code"].is_null() && actual["reason"].is_null() {
                "a dropped connection".to_string()
            } else {
                format!("close {}", show(&actual))
            };
            let mut e = fail::mismatch(format!("expected {expected}, got {got}: {m}"));
            e.reference = m.reference.clone();
            e
        })
    }

    /// `expect_exit`: the target process exits within the step deadline (a dropped
    /// connection is what an exiting target does; anything else it emits first fails);
    /// exit code and stderr substrings checked when given; records `{exit_code}` (or
    /// `{signal}`) as `target exit`.
    async fn expect_exit<P: Peer>(
        &mut self,
        peer: &mut P,
        code: Option<ExitCodeSpec>,
        stderr: &[String],
    ) -> StepResult {
        let expected = match &code {
            Some(c) => format!("the target to exit with {c}"),
            None => "the target to exit".to_string(),
        };
        if self.ready_instead_of_exit {
            return Err(StepError::new(
                FailureCode::TargetExit,
                format!(
                    "expected {expected} before it was ready, but it became ready instead; a \
                     target must refuse an invalid launch configuration by exiting non-zero \
                     and naming the problem on stderr"
                ),
            ));
        }
        let deadline = Instant::now() + self.step_timeout;
        let status = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(fail::timeout(format!(
                    "expected {expected} within {}, it is still running",
                    show_duration(self.step_timeout)
                )));
            }
            // Biased towards the connections: what the target emitted before it exited is
            // reported rather than hidden by the exit.
            let event = tokio::select! {
                biased;
                event = peer.recv(left) => match event? {
                    Some(Event::Eof) => continue,
                    Some(event) => event,
                    None => {
                        return Err(fail::timeout(format!(
                            "expected {expected} within {}, it is still running",
                            show_duration(self.step_timeout)
                        )));
                    }
                },
                status = self.process.wait_exit() => {
                    break status.map_err(fail::harness)?;
                }
            };
            self.check_event(peer, &event)?;
            // A typical frame an `optional:` step allows may still come first.
            if self.take_if_optional(peer, &event)? {
                continue;
            }
            if let Event::Text(text) = &event
                && let Ok(value) = peer.role().codec.decode(text)
            {
                self.record(peer.role().emitted_label, EntryKind::Frame, value);
            }
            let hint = match &event {
                Event::Close { .. } => " (expect it with `expect_close` first)",
                _ => "",
            };
            return Err(fail::unexpected(format!(
                "expected {expected}, got {}{hint}",
                event.describe()
            )));
        };
        let body = match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(c), _) => json!({"exit_code": c}),
            (None, Some(sig)) => json!({"signal": sig}),
            (None, None) => json!({"exit_code": Value::Null}),
        };
        self.record("target exit", EntryKind::Exit, body);
        // Our reference's code: checked in strict mode; a difference in vendor mode.
        if let Some(ExitCodeSpec::Reference {
            code: want,
            requirement,
        }) = &code
        {
            if status.code() == Some(*want) {
                return self.check_exit_stderr(stderr, status);
            }
            if self.bindings.vendor {
                self.bindings.differences.push(crate::bind::Difference {
                    requirement: requirement.clone(),
                    path: "$.exit_code".into(),
                    reference: json!(want),
                    actual: Some(status.code().map_or(Value::Null, |c| json!(c))),
                });
                return self.check_exit_stderr(stderr, status);
            }
            let mut err = StepError::new(
                FailureCode::TargetExit,
                format!("expected {expected}, it ended with {status}"),
            );
            err.reference = Some(requirement.clone());
            return Err(err);
        }
        if let Some(c) = &code
            && !c.matches(status.code())
        {
            return Err(StepError::new(
                FailureCode::TargetExit,
                format!("expected {expected}, it ended with {status}"),
            ));
        }
        self.check_exit_stderr(stderr, status)
    }

    /// The `stderr:` substrings of an `expect_exit` step, after the exit.
    fn check_exit_stderr(&self, stderr: &[String], status: std::process::ExitStatus) -> StepResult {
        let tail = self.process.stderr_tail();
        if let Some(needle) = stderr.iter().find(|n| !tail.contains(n.as_str())) {
            return Err(StepError::new(
                FailureCode::TargetExit,
                format!(
                    "expected the target's stderr to contain {needle:?}; it ended with {status} \
                     and its stderr tail does not"
                ),
            ));
        }
        Ok(())
    }

    /// `crash`: drops the connections, kills the target's process group, keeps its
    /// stderr tail and leak status, and starts it again through the peer's launch
    /// contract; the step ends when it is ready.
    async fn crash<P: Peer>(&mut self, peer: &mut P, fresh_state: bool) -> StepResult {
        peer.crashed();
        let status = tokio::time::timeout(KILL_REAP_BOUND, self.process.kill_now())
            .await
            .map_err(|_| {
                fail::harness(format!(
                    "the killed target was not reaped within {}",
                    show_duration(KILL_REAP_BOUND)
                ))
            })?
            .map_err(fail::harness)?;
        self.earlier_leak = self.earlier_leak.or(self.process.leak_channel());
        let tail = self.process.stderr_tail();
        if !tail.is_empty() {
            self.earlier_stderr.push_str(&format!(
                "{tail}\n--- crash step {}: {status} ---\n",
                self.step
            ));
        }
        if fresh_state {
            peer.forget_state().map_err(|e| {
                StepError::new(
                    FailureCode::LaunchFailed,
                    format!("clearing the target's durable state after the crash failed: {e}"),
                )
            })?;
        }
        let process = peer.relaunch(self.startup_timeout).await.map_err(|e| {
            StepError::new(
                FailureCode::LaunchFailed,
                format!("restarting the target after the crash failed: {e}"),
            )
        })?;
        self.process = process;
        Ok(())
    }

    /// One frame the target emitted after the last step: strict, schema-valid, and one
    /// the codec allows there ([`super::Codec::may_trail`]); never recorded.
    fn trailing_frame<P: Peer>(&mut self, peer: &P, text: &str) -> StepResult {
        let codec = peer.role().codec;
        let value = codec.decode(text).map_err(|e| {
            StepError::new(
                FailureCode::TrailingOutput,
                format!(
                    "unexpected frame after the last step, and it is invalid ({e}): {}",
                    truncate(text, 300)
                ),
            )
        })?;
        codec.check_emitted(&value).map_err(|e| {
            StepError::new(
                FailureCode::TrailingOutput,
                format!(
                    "frame after the last step violates the wire schema ({e}): {}",
                    show(&value)
                ),
            )
        })?;
        self.check_decoded(&value, "a text frame")?;
        if codec.may_trail(&value) || self.take_optional(&value) {
            return Ok(());
        }
        Err(StepError::new(
            FailureCode::TrailingOutput,
            format!(
                "unexpected frame after the last step: {} ({})",
                show(&value),
                codec.trailing_rule()
            ),
        ))
    }

    /// After the last step of a passing run: sends Close ([`DEFAULT_CLOSE_CODE`],
    /// [`END_CLOSE_REASON`]) and reads until the target's Close reply or the
    /// connection's end, within the step deadline. Every frame in between must be one
    /// the codec allows to trail; family events go to [`Peer::trailing_other`]; events
    /// still queued at the end are secret-checked.
    ///
    /// # Errors
    /// A disallowed frame, a leak, or no end within the deadline.
    pub async fn finish<P: Peer>(&mut self, peer: &mut P) -> StepResult {
        if peer.connected() {
            let timeout = self.step_timeout;
            let deadline = Instant::now() + timeout;
            // A target that already dropped the connection shows up as its end below.
            self.log_wire(
                "to target",
                "end-of-run close",
                &json!({"code": DEFAULT_CLOSE_CODE, "reason": END_CLOSE_REASON}),
            );
            let _ = peer
                .connection()
                .send_close(DEFAULT_CLOSE_CODE, END_CLOSE_REASON, timeout)
                .await;
            while peer.connected() {
                match self.next_event_until(peer, deadline).await? {
                    None => {
                        return Err(fail::timeout(format!(
                            "{} answered the harness's Close ({DEFAULT_CLOSE_CODE} \
                             {END_CLOSE_REASON:?}) neither with its Close nor by closing the \
                             connection within {}",
                            peer.role().target_name,
                            show_duration(timeout)
                        )));
                    }
                    Some(Event::Other(other)) => peer.trailing_other(other)?,
                    Some(Event::Text(text)) => self.trailing_frame(peer, &text)?,
                    // The reply to a normal closure is a normal closure (or none): a
                    // target that answers it with an error code (1011) has failed.
                    Some(Event::Close {
                        code: Some(code),
                        reason,
                    }) if code != DEFAULT_CLOSE_CODE => {
                        self.log_wire(
                            "from target",
                            "end-of-run close reply",
                            &json!({"code": code, "reason": reason}),
                        );
                        return Err(StepError::new(
                            FailureCode::UnexpectedEvent,
                            format!(
                                "{} answered the harness's normal Close ({DEFAULT_CLOSE_CODE}) \
                                 with Close {code}: the reply to a normal closure echoes its \
                                 code (RFC 6455 §5.5.1)",
                                peer.role().target_name
                            ),
                        ));
                    }
                    Some(Event::Close { code, reason }) => {
                        self.log_wire(
                            "from target",
                            "end-of-run close reply",
                            &json!({"code": code, "reason": reason}),
                        );
                        peer.connection().abort();
                    }
                    Some(Event::Eof) => {
                        self.log_wire("from target", "end of the connection", &Value::Null);
                        peer.connection().abort();
                    }
                    Some(other) => {
                        return Err(StepError::new(
                            FailureCode::TrailingOutput,
                            format!("unexpected {} after the last step", other.describe()),
                        ));
                    }
                }
            }
        }
        for other in peer.queued_others() {
            self.check_event(peer, &Event::Other(other))?;
        }
        peer.end_check().await?;
        self.drop_optionals();
        Ok(())
    }
}
