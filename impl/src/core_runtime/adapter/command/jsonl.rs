//! The Turn's input as program stdin (plain text or JSON records) and the `jsonl` program protocol's records.

use super::*;

/// The text a Run or an active input writes to stdin: the text parts of each message
/// concatenated in order, messages joined by `\n`, then `\n` unless the text is empty
/// or already ends with one.
///
/// # Errors
/// [`AdapterError::Refused`] when any part is an image ("a text-only transport rejects
/// image content rather than dropping it").
pub fn input_text(input: &[MessageInput]) -> Result<String, AdapterError> {
    let mut text = String::new();
    for (m, message) in input.iter().enumerate() {
        if m > 0 {
            text.push('\n');
        }
        for (p, part) in message.content.iter().enumerate() {
            match part {
                ContentPart::Text { text: t } => text.push_str(t.as_str()),
                ContentPart::Image { .. } => {
                    return Err(AdapterError::Refused(format!(
                        "message {m} part {p} is an image; the command adapter's stdin is text-only"
                    )));
                }
            }
        }
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// The `jsonl` stdin record of one input, with its `\n`:
/// `{"type":"input","input_id":"<input_id>","content":[<parts>]}` where `content` is
/// the content parts of every message of `input`, in order, as the wire encodes them
/// (`{"type":"text","text":"…"}`).
///
/// # Errors
/// [`AdapterError::Refused`] when any part is an image (the adapter's stdin is
/// text-only, as in plain mode, and `message_images` is declared false).
pub fn jsonl_input_line(input_id: &str, input: &[MessageInput]) -> Result<String, AdapterError> {
    let mut parts = Vec::new();
    for (m, message) in input.iter().enumerate() {
        for (p, part) in message.content.iter().enumerate() {
            match part {
                ContentPart::Text { .. } => parts.push(part),
                ContentPart::Image { .. } => {
                    return Err(AdapterError::Refused(format!(
                        "message {m} part {p} is an image; the command adapter's stdin is text-only"
                    )));
                }
            }
        }
    }
    let record = serde_json::json!({"type": "input", "input_id": input_id, "content": parts});
    let mut line = serde_json::to_string(&record)
        .map_err(|e| AdapterError::Refused(format!("cannot encode the input record: {e}")))?;
    line.push('\n');
    Ok(line)
}

/// One stdout record of the `jsonl` program protocol (see "Program protocol"). Decoded
/// strictly: an unknown `type`, an unknown or missing field, or a value of the wrong
/// shape is refused.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProgramRecord {
    /// `{"type":"delta","text":"…"}`: a text fragment (→ [`NativeEvent::Delta`]).
    Delta {
        /// The text.
        text: String,
    },
    /// `{"type":"accepted","input_id":"…"}`: the program consumed that input
    /// (→ [`NativeEvent::InputAccepted`]).
    Accepted {
        /// The consumed input (an active input's ID, or [`INITIAL_INPUT_ID`]).
        input_id: InputId,
    },
    /// `{"type":"tool_call","call_id","tool_name","state","observation":{"kind","summary"}}`
    /// (→ [`NativeEvent::ToolCall`]; `state` is `started`, `completed` or `failed`).
    ToolCall(ToolCall),
    /// `{"type":"usage","input_tokens"?,"cached_input_tokens"?,"output_tokens"?,
    /// "reasoning_output_tokens"?}`: a cumulative snapshot (→ [`NativeEvent::Usage`]).
    Usage(Usage),
    /// `{"type":"error","message":"…","code"?:…,"http_status"?:…}`: a native error
    /// with raw metadata (→ [`NativeEvent::Error`]; the Runtime classifies it,
    /// "Native failure classification").
    Error {
        /// The message.
        message: String,
        /// Raw native code (any JSON value).
        #[serde(default)]
        code: Option<Value>,
        /// Raw native HTTP status (any JSON value).
        #[serde(default)]
        http_status: Option<Value>,
    },
}

/// Why a `jsonl` stdout record was refused. Any of them fails the Run.
/// [`RecordError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Longer than [`JSONL_RECORD_MAX_BYTES`] (an unterminated last record counts
    /// with its missing `\n`).
    #[error("longer than {max} bytes")]
    TooLong {
        /// The bound.
        max: usize,
    },
    /// Not valid UTF-8.
    #[error("not valid UTF-8")]
    NotUtf8,
    /// Not a JSON object of a known record shape.
    #[error("not a valid record: {0}")]
    Invalid(String),
    /// `accepted` names an input this Run never wrote to the program.
    #[error("`accepted` names input `{0}`, which was never written to this Run")]
    UnknownInput(String),
    /// `accepted` repeats an input already accepted.
    #[error("`accepted` repeats input `{0}`")]
    DuplicateAccept(String),
}

impl RecordError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            RecordError::TooLong { .. } => "record_too_long",
            RecordError::NotUtf8 => "record_not_utf8",
            RecordError::Invalid(_) => "invalid_record",
            RecordError::UnknownInput(_) => "unknown_input",
            RecordError::DuplicateAccept(_) => "duplicate_accept",
        }
    }
}

/// Decodes one stdout piece (a line with its `\n`, or the unterminated last one) of
/// the `jsonl` protocol. A blank line (only whitespace) is `Ok(None)`.
///
/// # Errors
/// [`RecordError::TooLong`], [`RecordError::NotUtf8`], [`RecordError::Invalid`].
pub fn decode_record(piece: &[u8]) -> Result<Option<ProgramRecord>, RecordError> {
    let terminated = piece.ends_with(b"\n");
    if piece.len() + usize::from(!terminated) > JSONL_RECORD_MAX_BYTES {
        return Err(RecordError::TooLong {
            max: JSONL_RECORD_MAX_BYTES,
        });
    }
    let text = std::str::from_utf8(piece).map_err(|_| RecordError::NotUtf8)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| RecordError::Invalid(e.to_string()))
}

/// The active inputs of one `jsonl` Run.
#[derive(Debug, Default)]
pub(super) struct JsonlInputs {
    /// Inputs written (or being written) to the program.
    pub(super) written: HashSet<InputId>,
    /// Inputs the program accepted.
    pub(super) accepted: HashSet<InputId>,
}

/// Protocol state of one `jsonl` Run, shared by `write_input`, the stdout decoder and
/// the supervisor.
pub(super) struct JsonlRun {
    pub(super) inputs: Mutex<JsonlInputs>,
    /// The program sent at least one `error` record.
    pub(super) reported_error: AtomicBool,
    /// The first protocol violation (the Run fails with it).
    pub(super) violation: Mutex<Option<String>>,
    /// Set to `true` on the first violation, so the supervisor stops the program.
    pub(super) violated: watch::Sender<bool>,
}

impl JsonlRun {
    pub(super) fn new() -> Self {
        Self {
            inputs: Mutex::new(JsonlInputs::default()),
            reported_error: AtomicBool::new(false),
            violation: Mutex::new(None),
            violated: watch::Sender::new(false),
        }
    }

    pub(super) fn inputs(&self) -> MutexGuard<'_, JsonlInputs> {
        self.inputs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn violation(&self) -> Option<String> {
        self.violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn violate(&self, message: String) {
        tracing::warn!(%message, "command adapter: program protocol violation; stopping the program");
        self.violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(message);
        self.violated.send_replace(true);
    }

    /// Resolves once a violation was recorded.
    pub(super) async fn wait_violated(&self) {
        let mut rx = self.violated.subscribe();
        // The sender lives in `self`, so the wait cannot fail while `self` is borrowed.
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Registers `input_id` as written before it is written.
    pub(super) fn register_input(&self, input_id: &InputId) -> Result<(), AdapterError> {
        if input_id.as_str() == INITIAL_INPUT_ID {
            return Err(AdapterError::Refused(format!(
                "input ID `{INITIAL_INPUT_ID}` is reserved for the Turn's own input"
            )));
        }
        let mut inputs = self.inputs();
        if inputs.written.len() >= RUN_ACTIVE_INPUTS_MAX {
            return Err(AdapterError::Refused(format!(
                "{RUN_ACTIVE_INPUTS_MAX} active inputs were already written to this run"
            )));
        }
        if !inputs.written.insert(input_id.clone()) {
            return Err(AdapterError::Refused(format!(
                "input `{input_id}` was already written to this run"
            )));
        }
        Ok(())
    }

    /// Forgets an input whose write provably did not reach the program.
    pub(super) fn unregister_input(&self, input_id: &InputId) {
        self.inputs().written.remove(input_id);
    }

    /// The native event of one stdout piece (`None` for a blank line and for the
    /// acceptance of [`INITIAL_INPUT_ID`], which the Run's start already committed).
    pub(super) fn translate(&self, piece: &[u8]) -> Result<Option<NativeEvent>, RecordError> {
        let Some(record) = decode_record(piece)? else {
            return Ok(None);
        };
        Ok(Some(match record {
            ProgramRecord::Delta { text } => NativeEvent::Delta {
                text,
                item_id: None,
            },
            ProgramRecord::Accepted { input_id } => {
                if input_id.as_str() == INITIAL_INPUT_ID {
                    return Ok(None);
                }
                let mut inputs = self.inputs();
                if !inputs.written.contains(&input_id) {
                    return Err(RecordError::UnknownInput(input_id.to_string()));
                }
                if !inputs.accepted.insert(input_id.clone()) {
                    return Err(RecordError::DuplicateAccept(input_id.to_string()));
                }
                NativeEvent::InputAccepted { input_id }
            }
            ProgramRecord::ToolCall(call) => NativeEvent::ToolCall(call),
            ProgramRecord::Usage(usage) => NativeEvent::Usage(usage),
            ProgramRecord::Error {
                message,
                code,
                http_status,
            } => {
                self.reported_error.store(true, Ordering::SeqCst);
                NativeEvent::Error {
                    message,
                    code,
                    http_status,
                }
            }
        }))
    }
}
