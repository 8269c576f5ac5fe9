//! Framing what the model reads ("Framing what the model reads"): the line in front of an
//! input or a tool result when it is assembled into a request.
//!
//! "An input is assembled into the request with a frame in front of the sender's own
//! words, derived from the durable event on every assembly" - `[<time> · <label>]`, a
//! newline, then the words. "The stored content is exactly what arrived, so a frame is
//! never part of a durable record and never has to be parsed back out of one."
//!
//! This module owns the frame lines and the assembled text. By construction a frame
//! lives only in an [`Assembled`] text: [`StoredInput`] and [`StoredToolResult`] hold what
//! arrived and the event it came with, have no field a frame could go into, and assembling
//! them reads them without changing them. Every function is pure: it never reads the
//! clock, so assembling a record twice, now or on replay, gives the same bytes, and it
//! never renders a relative time ("four minutes ago"). It never stores anything.
//!
//! Our reading where the spec is silent (catalog entries `WK-FRAME-*` of level
//! `reference`): a stamp drops the fraction of its second; a time of 0 ms or less, or
//! past [`FRAME_TIME_MS_MAX`], is no usable time; a run time is whole milliseconds; a label
//! part (source, peer request id or session) is one non-empty line.

use std::time::Duration;

use super::host::rfc3339_utc_seconds;

/// Separator of a frame's parts ("Framing what the model reads": `[<time> · operator]`).
pub const FRAME_SEPARATOR: &str = " · ";

/// What a frame says in place of a time when its event has none that is usable
/// ("Framing what the model reads": "Inputs whose event has no usable time say `time
/// unknown` rather than rendering epoch zero as 1970").
pub const TIME_UNKNOWN: &str = "time unknown";

/// Latest usable frame time, in milliseconds since the Unix epoch: the last millisecond
/// of 9999-12-31, the latest instant the four-digit year of the `Z` shape
/// (`YYYY-MM-DDTHH:MM:SSZ`, "Framing what the model reads") can state.
pub const FRAME_TIME_MS_MAX: i64 = 253_402_300_799_999;

/// The label of an instruction-change observation ("The instruction header and its
/// revisions").
pub const INSTRUCTIONS_CHANGED: &str = "instructions changed for this runtime";

/// The mechanism of a change with nothing in the transcript to attribute it to ("The
/// instruction header and its revisions").
pub const CHANGED_OUTSIDE: &str = "changed outside this transcript";

/// The fixed second line of an instruction-change observation ("The instruction header
/// and its revisions").
pub const INSTRUCTIONS_CHANGED_NOTE: &str = "the header of this transcript is the revision it started under; the text below is current from here on.";

/// Why a label part cannot be framed. Every variant has a stable [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The part is empty.
    #[error("the {part} of a frame label is empty")]
    Empty {
        /// `source`, `peer request id` or `peer request session`.
        part: &'static str,
    },
    /// The part holds a control character or a line separator, so the frame would not
    /// be one line.
    #[error("the {part} of a frame label holds a control character at byte {offset}")]
    NotOneLine {
        /// `source`, `peer request id` or `peer request session`.
        part: &'static str,
        /// Byte offset of the first such character.
        offset: usize,
    },
}

impl FrameError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::Empty { .. } => "frame_label_empty",
            FrameError::NotOneLine { .. } => "frame_label_not_one_line",
        }
    }
}

/// Checks that `text` can stand in a one-line frame label.
fn one_line(part: &'static str, text: String) -> Result<String, FrameError> {
    if text.is_empty() {
        return Err(FrameError::Empty { part });
    }
    match text
        .char_indices()
        .find(|(_, c)| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        Some((offset, _)) => Err(FrameError::NotOneLine { part, offset }),
        None => Ok(text),
    }
}

/// The time of a frame: `YYYY-MM-DDTHH:MM:SSZ` for `at_ms` (milliseconds since the Unix
/// epoch, the fraction of a second dropped), or [`TIME_UNKNOWN`] when it is absent, 0 or
/// less, or past [`FRAME_TIME_MS_MAX`].
pub fn frame_time(at_ms: Option<i64>) -> String {
    match at_ms {
        Some(ms) if (1..=FRAME_TIME_MS_MAX).contains(&ms) => {
            rfc3339_utc_seconds(Duration::from_millis(ms.unsigned_abs()))
        }
        _ => TIME_UNKNOWN.to_string(),
    }
}

/// The identity of a peer request an input's payload carries: what the recipient needs
/// to answer it, and nothing else of the payload ("the model never sees the sibling
/// fields").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRequest {
    id: String,
    session: String,
}

impl PeerRequest {
    /// The request `id` and the `session` it comes from.
    ///
    /// # Errors
    /// [`FrameError`]: either is empty or not one line.
    pub fn new(id: impl Into<String>, session: impl Into<String>) -> Result<Self, FrameError> {
        Ok(Self {
            id: one_line("peer request id", id.into())?,
            session: one_line("peer request session", session.into())?,
        })
    }

    /// The request ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session the request comes from.
    pub fn session(&self) -> &str {
        &self.session
    }
}

/// The durable event an input comes from, as far as its frame reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputEvent {
    at_ms: Option<i64>,
    source: String,
    peer_request: Option<PeerRequest>,
}

impl InputEvent {
    /// An event from `source` at `at_ms` (milliseconds since the Unix epoch, as
    /// recorded; `None` when the event has none), without a peer request.
    ///
    /// # Errors
    /// [`FrameError`]: the source is empty or not one line.
    pub fn new(at_ms: Option<i64>, source: impl Into<String>) -> Result<Self, FrameError> {
        Ok(Self {
            at_ms,
            source: one_line("source", source.into())?,
            peer_request: None,
        })
    }

    /// The same event, its payload carrying the peer request `request`.
    pub fn with_peer_request(self, request: PeerRequest) -> Self {
        Self {
            peer_request: Some(request),
            ..self
        }
    }

    /// The recorded time, in milliseconds since the Unix epoch.
    pub fn at_ms(&self) -> Option<i64> {
        self.at_ms
    }

    /// The event's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The peer request the payload carries.
    pub fn peer_request(&self) -> Option<&PeerRequest> {
        self.peer_request.as_ref()
    }

    /// The frame's label: `peer request <id> from <session>` when the payload carries a
    /// peer request identity, else the source.
    pub fn label(&self) -> String {
        match &self.peer_request {
            Some(p) => format!("peer request {} from {}", p.id, p.session),
            None => self.source.clone(),
        }
    }

    /// The frame line: `[<time> · <label>]`, without a newline.
    pub fn frame(&self) -> String {
        format!(
            "[{}{FRAME_SEPARATOR}{}]",
            frame_time(self.at_ms),
            self.label()
        )
    }
}

/// Text assembled for the model: a frame line, a newline, then content. It exists only
/// to be put into a request; nothing turns it back into a stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembled(String);

impl Assembled {
    fn new(frame: &str, content: &str) -> Self {
        Self(format!("{frame}\n{content}"))
    }

    /// The assembled text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The assembled text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for Assembled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An input as stored: its event and exactly what arrived, never a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredInput {
    event: InputEvent,
    content: String,
}

impl StoredInput {
    /// The input `content` (the sender's exact words) as it arrived with `event`.
    pub fn arrived(event: InputEvent, content: impl Into<String>) -> Self {
        Self {
            event,
            content: content.into(),
        }
    }

    /// The event.
    pub fn event(&self) -> &InputEvent {
        &self.event
    }

    /// Exactly what arrived.
    pub fn content(&self) -> &str {
        &self.content
    }

    /// The input as the model reads it: [`InputEvent::frame`], a newline, the content.
    pub fn assemble(&self) -> Assembled {
        Assembled::new(&self.event.frame(), &self.content)
    }
}

/// When a tool result's observation was made and how long its cell ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolObservation {
    /// The instant the observation was made, in milliseconds since the Unix epoch;
    /// `None` when unknown.
    pub observed_at_ms: Option<i64>,
    /// How long the cell ran; `None` when no cell ran.
    pub ran: Option<Duration>,
}

impl ToolObservation {
    /// The frame line: `[<instant> · ran <n>ms]`, or `[<instant>]` when no cell ran;
    /// `<n>` is whole milliseconds (a fraction dropped). Without a newline.
    pub fn frame(&self) -> String {
        let instant = frame_time(self.observed_at_ms);
        match self.ran {
            Some(ran) => format!("[{instant}{FRAME_SEPARATOR}ran {}ms]", ran.as_millis()),
            None => format!("[{instant}]"),
        }
    }
}

/// A tool result as stored: its observation and exactly the result, never a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredToolResult {
    observation: ToolObservation,
    content: String,
}

impl StoredToolResult {
    /// The result `content` as observed.
    pub fn recorded(observation: ToolObservation, content: impl Into<String>) -> Self {
        Self {
            observation,
            content: content.into(),
        }
    }

    /// The observation.
    pub fn observation(&self) -> ToolObservation {
        self.observation
    }

    /// Exactly the result.
    pub fn content(&self) -> &str {
        &self.content
    }

    /// The result as the model reads it: [`ToolObservation::frame`], a newline, the
    /// content.
    pub fn assemble(&self) -> Assembled {
        Assembled::new(&self.observation.frame(), &self.content)
    }
}

/// The two header lines of an instruction-change observation with nothing in the
/// transcript to attribute it to ("The instruction header and its revisions"):
/// `[<time> · instructions changed for this runtime · changed outside this transcript]`,
/// a newline, [`INSTRUCTIONS_CHANGED_NOTE`]; no trailing newline. The current text or
/// the verified patch that follows is the caller's.
pub fn instructions_changed_outside(observed_at_ms: Option<i64>) -> String {
    format!(
        "[{}{FRAME_SEPARATOR}{INSTRUCTIONS_CHANGED}{FRAME_SEPARATOR}{CHANGED_OUTSIDE}]\n{INSTRUCTIONS_CHANGED_NOTE}",
        frame_time(observed_at_ms)
    )
}

#[cfg(test)]
#[path = "framing_tests.rs"]
mod tests;
