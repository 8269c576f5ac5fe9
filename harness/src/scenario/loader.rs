//! Strict YAML loading of scenario files (and of any other harness YAML, such as the
//! requirement catalogs).
//!
//! This module owns reading `scenarios/<family>/<name>.yaml` through serde-saphyr into
//! private raw serde types (`deny_unknown_fields` everywhere, no `flatten`; duplicate
//! keys, unknown keys, unknown step keys, wrong types and bad durations are errors
//! located at `file:line:column` with a source snippet), converting them into the public
//! [`Scenario`] model and running [`super::validation`]. It never runs a scenario, never
//! touches sockets and never panics on bad input.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Map, Value};
use serde_saphyr::{Location, Spanned};

use super::model::{
    ApiResultStep, ApiStep, BootstrapStep, ConnectStep, ExitCodeSpec, Party, RawMessage, RepeatKey,
    Scenario, ScenarioConfig, Side, Step, WorkspaceSeed,
};
use super::validation::{self, Spans, StepSpan};

/// A scenario (or catalog) file that could not be loaded. Displays as
/// `file:line:column: message`, followed by a source snippet when one is available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// 1-based column, when known.
    pub column: Option<u64>,
    /// What is wrong (without the location).
    pub message: String,
    /// A source excerpt pointing at the location, when available.
    pub snippet: Option<String>,
}

impl LoadError {
    /// An error about `path` with no location (I/O, directory-level problems).
    pub fn new(path: &Path, message: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            line: None,
            column: None,
            message: message.into(),
            snippet: None,
        }
    }

    /// An error at a known location; a snippet is cut from `source` when given.
    pub fn at(
        path: &Path,
        location: Option<Location>,
        message: impl Into<String>,
        source: Option<&str>,
    ) -> Self {
        let mut err = Self::new(path, message);
        if let Some(loc) = location.filter(|l| l.line() > 0) {
            err.line = Some(loc.line());
            err.column = Some(loc.column());
            err.snippet = source.map(|s| snippet(s, loc.line(), loc.column()));
        }
        err
    }

    /// The location prefix, `file:line:column` (or `file` / `file:line` when unknown).
    pub fn location(&self) -> String {
        let mut out = self.path.display().to_string();
        if let Some(line) = self.line {
            out.push_str(&format!(":{line}"));
            if let Some(column) = self.column {
                out.push_str(&format!(":{column}"));
            }
        }
        out
    }

    /// `file:line:column: message` without the snippet.
    pub fn headline(&self) -> String {
        format!("{}: {}", self.location(), self.message)
    }

    fn render(&self) -> String {
        match &self.snippet {
            Some(snippet) => format!("{}\n{snippet}", self.headline()),
            None => self.headline(),
        }
    }

    /// Converts a serde-saphyr error for `path`, keeping its location.
    pub fn from_yaml(path: &Path, err: &serde_saphyr::Error, source: &str) -> Self {
        let location = err.location();
        let mut message = err.without_snippet().to_string();
        if let Some(loc) = location {
            let suffix = format!(" at line {}, column {}", loc.line(), loc.column());
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_string();
            }
        }
        if let Some(stripped) =
            message.strip_suffix(", set DuplicateKeyPolicy in Options if acceptable")
        {
            message = stripped.to_string();
        }
        Self::at(path, location, message, Some(source))
    }
}

/// Most characters of one source line a snippet shows: a window around the column, so
/// a long line (a big inline mapping, generated text) never floods the terminal.
pub const SNIPPET_LINE_MAX_CHARS: usize = 200;

/// A small excerpt of `source` (two lines of context) with a caret under `column`. Each
/// line is cut to a window of at most [`SNIPPET_LINE_MAX_CHARS`] characters around the
/// column (the cuts marked with `…`).
pub(crate) fn snippet(source: &str, line: u64, column: u64) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let Ok(line_idx) = usize::try_from(line) else {
        return String::new();
    };
    if line_idx == 0 || line_idx > lines.len() {
        return String::new();
    }
    let col = usize::try_from(column.saturating_sub(1)).unwrap_or(0);
    // The window starts so that the column sits in its middle, as far as possible.
    let start = col.saturating_sub(SNIPPET_LINE_MAX_CHARS / 2);
    let first = line_idx.saturating_sub(2).max(1);
    let width = line_idx.to_string().len();
    let mut out = String::new();
    for n in first..=line_idx {
        out.push_str(&format!("{n:>width$} | {}\n", window(lines[n - 1], start)));
    }
    let lead = usize::from(start > 0);
    let pad = col - start + lead;
    out.push_str(&format!("{:>width$} | {}^", "", " ".repeat(pad)));
    out
}

/// The characters `start..start + SNIPPET_LINE_MAX_CHARS` of `line`, with `…` marking
/// each cut (a leading `…` when `start > 0`, so columns stay aligned with the caret).
fn window(line: &str, start: usize) -> String {
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    let mut chars = line.chars().skip(start);
    out.extend(chars.by_ref().take(SNIPPET_LINE_MAX_CHARS));
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// The parse options every harness YAML file is read with: YAML 1.2 booleans only (so
/// `yes` stays a string), numbers with leading zeros stay strings, duplicate keys and
/// non-finite floats are errors (the library defaults).
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
    }
}

/// Parses YAML text strictly into `T`, locating errors in `path`.
///
/// # Errors
/// A located [`LoadError`] for syntax, duplicate keys, unknown keys and wrong types.
pub fn parse_yaml<T: for<'de> Deserialize<'de>>(path: &Path, source: &str) -> Result<T, LoadError> {
    serde_saphyr::from_str_with_options(source, yaml_options())
        .map_err(|e| LoadError::from_yaml(path, &e, source))
}

/// Reads and strictly parses a YAML file into `T`.
///
/// # Errors
/// I/O errors (unlocated) and parse errors (located).
pub fn read_yaml<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, LoadError> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| LoadError::new(path, format!("cannot read: {e}")))?;
    parse_yaml(path, &source)
}

// ---------------------------------------------------------------------------------------
// Raw serde shapes (private): exactly what the file may contain.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    family: Spanned<String>,
    name: Spanned<String>,
    summary: Spanned<String>,
    covers: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    sides: Option<Spanned<Vec<Side>>>,
    #[serde(default)]
    config: Option<Spanned<ScenarioConfig>>,
    #[serde(default)]
    pending: Option<Spanned<BTreeMap<Side, String>>>,
    #[serde(default)]
    requires: Option<Spanned<Value>>,
    #[serde(default)]
    edges: Option<Spanned<BTreeMap<String, Vec<crate::requirements::Edge>>>>,
    steps: Spanned<Vec<Spanned<RawStep>>>,
}

/// `requires:` as written — a list of features the target must declare, or a mapping
/// feature → `true` (must declare) / `false` (must declare unsupported) — as the mapping,
/// or what is wrong with it.
fn requires_of(value: &Value) -> Result<BTreeMap<String, bool>, String> {
    const SHAPE: &str =
        "requires: expected a list of feature names or a mapping of feature: true|false";
    let mut map = BTreeMap::new();
    match value {
        Value::Array(names) => {
            for name in names {
                let Value::String(name) = name else {
                    return Err(format!("{SHAPE}; found the list item {name}"));
                };
                if map.insert(name.clone(), true).is_some() {
                    return Err(format!("requires: `{name}` is listed twice"));
                }
            }
        }
        Value::Object(entries) => {
            for (name, want) in entries {
                let Value::Bool(want) = want else {
                    return Err(format!("{SHAPE}; `{name}` is {want}"));
                };
                map.insert(name.clone(), *want);
            }
        }
        other => return Err(format!("{SHAPE}; found {other}")),
    }
    Ok(map)
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum RawStep {
    Core(RawFrame),
    Runtime(RawFrame),
    Host(Map<String, Value>),
    Worker(Map<String, Value>),
    Client(Map<String, Value>),
    Daemon(Map<String, Value>),
    Plugin(Map<String, Value>),
    Native(Spanned<Map<String, Value>>),
    Launch(Map<String, Value>),
    WorkerStdio(Map<String, Value>),
    ReceivedBy(Map<String, Value>),
    PluginProcess(Map<String, Value>),
    Bootstrap(BootstrapStep),
    Connect(ConnectStep),
    Handshake(RawHandshake),
    Reconnect(RawReconnect),
    Silence(Spanned<DurationText>),
    Sleep(Spanned<DurationText>),
    AnyOrder(Vec<Spanned<RawStep>>),
    Repeat(RawRepeat),
    Optional(Box<Spanned<RawStep>>),
    Tolerated(Box<Spanned<RawStep>>),
    Reference(RawReference),
    Disconnect(Empty),
    HalfClose(RawClose),
    SendBytes(RawBytes),
    ExpectClose(RawExpectClose),
    Api(ApiStep),
    ApiResult(ApiResultStep),
    Crash(RawCrash),
    Terminate(Empty),
    WriteWorkspace(WorkspaceSeed),
    ExpectExit(RawExit),
}

/// An Envelope as written in a scenario: `type`, `id`, `payload`, optional `trace`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFrame {
    #[serde(rename = "type")]
    kind: String,
    id: Value,
    payload: Value,
    #[serde(default)]
    trace: Option<Value>,
}

impl RawFrame {
    fn into_value(self) -> Value {
        let mut map = Map::new();
        map.insert("type".into(), Value::String(self.kind));
        map.insert("id".into(), self.id);
        map.insert("payload".into(), self.payload);
        if let Some(trace) = self.trace {
            map.insert("trace".into(), trace);
        }
        Value::Object(map)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

/// `crash: {fresh_state?}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCrash {
    #[serde(default)]
    fresh_state: bool,
}

/// `reconnect: {within?}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReconnect {
    #[serde(default)]
    within: Option<DurationText>,
}

/// `repeat: {times, steps}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRepeat {
    times: u32,
    steps: Vec<Spanned<RawStep>>,
}

/// `reference: {requirement, steps}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReference {
    requirement: String,
    steps: Vec<Spanned<RawStep>>,
    #[serde(default)]
    sides: Option<Vec<Side>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHandshake {
    #[serde(default)]
    heartbeat_interval_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClose {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
}

/// `expect_close: {code?, reason?}`: values or patterns.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpectClose {
    #[serde(default, deserialize_with = "explicit")]
    code: Option<Value>,
    #[serde(default, deserialize_with = "explicit")]
    reason: Option<Value>,
}

/// A key that is present, `null` included (`Some(Value::Null)`), so that validation can
/// refuse `code: null` instead of reading it as "not given".
fn explicit<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExit {
    #[serde(default)]
    code: Option<RawExitCode>,
    #[serde(default)]
    stderr: Option<OneOrMany>,
}

/// `code: <integer>` or `code: nonzero`.
struct RawExitCode(ExitCodeSpec);

impl<'de> Deserialize<'de> for RawExitCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawExitCode;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an exit code (0..=255) or `nonzero`")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawExitCode, E> {
                i32::try_from(v)
                    .map(|c| RawExitCode(ExitCodeSpec::Exact(c)))
                    .map_err(|_| E::custom(format!("exit code {v} is outside 0..=255")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawExitCode, E> {
                i32::try_from(v)
                    .map(|c| RawExitCode(ExitCodeSpec::Exact(c)))
                    .map_err(|_| E::custom(format!("exit code {v} is outside 0..=255")))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawExitCode, A::Error> {
                let mut code = None;
                let mut requirement = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "$reference" => code = Some(map.next_value::<i64>()?),
                        "$requirement" => requirement = Some(map.next_value::<String>()?),
                        other => {
                            return Err(serde::de::Error::custom(format!(
                                "an exit code reference takes $reference and $requirement, not `{other}`"
                            )));
                        }
                    }
                }
                let (Some(code), Some(requirement)) = (code, requirement) else {
                    return Err(serde::de::Error::custom(
                        "an exit code reference needs `$reference: <code>` and `$requirement: <ID>`",
                    ));
                };
                let code = i32::try_from(code)
                    .ok()
                    .filter(|c| (0..=255).contains(c))
                    .ok_or_else(|| {
                        serde::de::Error::custom(format!("exit code {code} is outside 0..=255"))
                    })?;
                Ok(RawExitCode(ExitCodeSpec::Reference { code, requirement }))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawExitCode, E> {
                if v == "nonzero" {
                    Ok(RawExitCode(ExitCodeSpec::NonZero))
                } else {
                    Err(E::custom(format!(
                        "invalid exit code `{v}` (use an integer or `nonzero`)"
                    )))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// One string or a list of strings.
struct OneOrMany(Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<String>()? {
                    out.push(item);
                }
                Ok(OneOrMany(out))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `send_bytes: {text, pad_to?}`, `{base64}` or `{text_base64}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBytes {
    #[serde(default)]
    text: Option<String>,
    /// A YAML integer; read as a value so that a quoted `"10"` is refused, not coerced.
    #[serde(default)]
    pad_to: Option<Value>,
    #[serde(default)]
    base64: Option<String>,
    #[serde(default)]
    text_base64: Option<String>,
    #[serde(default)]
    frame: Option<Value>,
    #[serde(default)]
    repeat_key: Option<RawRepeatKey>,
}

/// `send_bytes.repeat_key: {path, value?}` (with `frame` only).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRepeatKey {
    path: Vec<String>,
    /// Present (`null` included) or absent: the member's own value.
    #[serde(default, deserialize_with = "present_value")]
    value: Option<Value>,
}

/// A value that is present, `null` included (`Option<Value>` alone reads `null` as absent).
fn present_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl RawRepeatKey {
    fn check(self) -> Result<RepeatKey, String> {
        if self.path.is_empty() || self.path.iter().any(String::is_empty) {
            return Err(
                "`send_bytes.repeat_key.path` names one or more keys, none of them empty".into(),
            );
        }
        Ok(RepeatKey {
            path: self.path,
            value: self.value,
        })
    }
}

/// The largest `send_bytes.pad_to` (16 MiB): room to test any frame bound one past it.
pub const PAD_TO_MAX: usize = 16 * 1024 * 1024;

impl RawBytes {
    /// The message, or what is wrong with the step.
    fn message(self) -> Result<RawMessage, String> {
        let decode = |text: &str, key: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| format!("`send_bytes.{key}` is not valid base64: {e}"))
        };
        let pad_to = match self.pad_to {
            None => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => {
                Some(usize::try_from(n.as_u64().unwrap_or(u64::MAX)).unwrap_or(usize::MAX))
            }
            Some(other) => {
                return Err(format!(
                    "`send_bytes.pad_to` takes a byte count (an unquoted integer), not {other}"
                ));
            }
        };
        if let Some(frame) = self.frame {
            return match (&self.text, &self.base64, &self.text_base64, pad_to) {
                (None, None, None, None) if frame.is_object() => match self.repeat_key {
                    None => Ok(RawMessage::Frame(frame)),
                    Some(repeat) => Ok(RawMessage::FrameRepeatingKey {
                        frame,
                        repeat: repeat.check()?,
                    }),
                },
                (None, None, None, None) => Err("`send_bytes.frame` must be a mapping".into()),
                _ => Err("`send_bytes.frame` goes alone".into()),
            };
        }
        if self.repeat_key.is_some() {
            return Err("`send_bytes.repeat_key` goes with `frame`".into());
        }
        match (self.text, self.base64, self.text_base64, pad_to) {
            (Some(mut text), None, None, pad_to) => {
                if let Some(size) = pad_to {
                    if size > PAD_TO_MAX {
                        return Err(format!(
                            "`send_bytes.pad_to` {size} is above {PAD_TO_MAX} bytes"
                        ));
                    }
                    if text.len() > size {
                        return Err(format!(
                            "`send_bytes.text` is {} bytes, longer than `pad_to` {size}",
                            text.len()
                        ));
                    }
                    // JSON allows trailing whitespace: the frame stays what it was.
                    let pad = size - text.len();
                    text.push_str(&" ".repeat(pad));
                }
                Ok(RawMessage::Text(text))
            }
            (None, Some(b64), None, None) => Ok(RawMessage::Binary(decode(&b64, "base64")?)),
            (None, None, Some(b64), None) => {
                Ok(RawMessage::TextBytes(decode(&b64, "text_base64")?))
            }
            (None, _, _, Some(_)) => Err("`send_bytes.pad_to` goes with `text`".into()),
            _ => Err(
                "`send_bytes` takes exactly one of `text` (with `pad_to`), `base64`, \
                 `text_base64` and `frame`"
                    .into(),
            ),
        }
    }
}

/// A duration written as `<n>ms` or `<n>s` (non-negative integer `n`).
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(DurationText)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses `200ms` / `2s`.
///
/// # Errors
/// A message naming the bad text.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration `{text}` (use e.g. `200ms` or `2s`)");
    let (digits, unit_ms) = if let Some(d) = text.strip_suffix("ms") {
        (d, 1u64)
    } else if let Some(d) = text.strip_suffix('s') {
        (d, 1000u64)
    } else {
        return Err(bad());
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

// ---------------------------------------------------------------------------------------
// Conversion raw → model.

struct Converter<'a> {
    path: &'a Path,
    source: &'a str,
    errors: Vec<LoadError>,
}

impl Converter<'_> {
    fn error(&mut self, location: Location, message: impl Into<String>) {
        self.errors.push(LoadError::at(
            self.path,
            Some(location),
            message,
            Some(self.source),
        ));
    }

    /// The steps of a group (`any_order`, `repeat`, `reference`), their locations added
    /// to the group's span.
    fn nested(&mut self, items: Vec<Spanned<RawStep>>, span: &mut StepSpan) -> Vec<Step> {
        let mut steps = Vec::new();
        for item in items {
            if let Some((step, child)) = self.step(item) {
                steps.push(step);
                span.children.push(child.location);
            }
        }
        steps
    }

    fn step(&mut self, raw: Spanned<RawStep>) -> Option<(Step, StepSpan)> {
        let location = raw.referenced;
        let mut span = StepSpan {
            location,
            children: Vec::new(),
        };
        let step = match raw.value {
            RawStep::Core(frame) => Step::Frame {
                party: Party::Core,
                frame: frame.into_value(),
            },
            RawStep::Runtime(frame) => Step::Frame {
                party: Party::Runtime,
                frame: frame.into_value(),
            },
            // The worker family's frames are messages (`{kind, ...}`); the envelope's
            // identity is the connection's.
            RawStep::Host(message) => Step::Frame {
                party: Party::Host,
                frame: Value::Object(message),
            },
            RawStep::Worker(message) => Step::Frame {
                party: Party::Worker,
                frame: Value::Object(message),
            },
            // The engine family's frames are RPC events on named calls.
            RawStep::Client(event) => Step::Frame {
                party: Party::Client,
                frame: Value::Object(event),
            },
            RawStep::Daemon(event) => Step::Frame {
                party: Party::Daemon,
                frame: Value::Object(event),
            },
            // The plugin family's answers are RPC events on named calls, too.
            RawStep::Plugin(event) => Step::Frame {
                party: Party::Plugin,
                frame: Value::Object(event),
            },
            RawStep::Native(map) => {
                let map_location = map.referenced;
                let mut map = map.value;
                let expect = map.shift_remove("expect");
                if map.len() != 1 {
                    let keys: Vec<&str> = map.keys().map(String::as_str).collect();
                    self.error(
                        map_location,
                        format!(
                            "`native` needs exactly one op key (plus optional `expect`), found {}",
                            if keys.is_empty() {
                                "none".to_string()
                            } else {
                                format!("`{}`", keys.join("`, `"))
                            }
                        ),
                    );
                    return None;
                }
                let (op, args) = map.into_iter().next()?;
                Step::Native { op, args, expect }
            }
            RawStep::Launch(args) => Step::Launch {
                args: Value::Object(args),
            },
            RawStep::WorkerStdio(args) => Step::WorkerStdio {
                args: Value::Object(args),
            },
            RawStep::ReceivedBy(args) => Step::ReceivedBy {
                args: Value::Object(args),
            },
            RawStep::PluginProcess(args) => Step::PluginProcess {
                args: Value::Object(args),
            },
            RawStep::Bootstrap(b) => Step::Bootstrap(b),
            RawStep::Connect(c) => Step::Connect(c),
            RawStep::Handshake(h) => Step::Handshake {
                heartbeat_interval_ms: h.heartbeat_interval_ms,
            },
            RawStep::Reconnect(r) => Step::Reconnect {
                within: r.within.map(|d| d.0),
            },
            RawStep::Silence(d) => Step::Silence(d.value.0),
            RawStep::Sleep(d) => Step::Sleep(d.value.0),
            RawStep::AnyOrder(items) => {
                let steps = self.nested(items, &mut span);
                Step::AnyOrder(steps)
            }
            RawStep::Repeat(r) => {
                let steps = self.nested(r.steps, &mut span);
                Step::Repeat {
                    times: r.times,
                    steps,
                }
            }
            RawStep::Reference(r) => {
                let steps = self.nested(r.steps, &mut span);
                Step::Reference {
                    requirement: r.requirement,
                    steps,
                    sides: r.sides,
                }
            }
            RawStep::Optional(inner) => {
                let (step, child) = self.step(*inner)?;
                span.children.push(child.location);
                Step::Optional(Box::new(step))
            }
            RawStep::Tolerated(inner) => {
                let (step, child) = self.step(*inner)?;
                span.children.push(child.location);
                Step::Tolerated(Box::new(step))
            }
            RawStep::Disconnect(Empty {}) => Step::Disconnect,
            RawStep::HalfClose(c) => Step::HalfClose {
                code: c.code,
                reason: c.reason,
            },
            RawStep::SendBytes(raw) => match raw.message() {
                Ok(message) => Step::SendBytes(message),
                Err(e) => {
                    self.error(location, e);
                    return None;
                }
            },
            RawStep::ExpectClose(c) => Step::ExpectClose {
                code: c.code,
                reason: c.reason,
            },
            RawStep::Api(v) => Step::Api(v),
            RawStep::ApiResult(v) => Step::ApiResult(v),
            RawStep::Crash(c) => Step::Crash {
                fresh_state: c.fresh_state,
            },
            RawStep::Terminate(Empty {}) => Step::Terminate,
            RawStep::WriteWorkspace(seed) => Step::WriteWorkspace(seed),
            RawStep::ExpectExit(e) => Step::ExpectExit {
                code: e.code.map(|c| c.0),
                stderr: e.stderr.map(|s| s.0).unwrap_or_default(),
            },
        };
        Some((step, span))
    }
}

/// Parses scenario text as if read from `path` (the path determines the expected family
/// and name), then validates it.
///
/// # Errors
/// Every problem found, each located where possible (parse errors stop at the first).
pub fn parse_scenario(path: &Path, source: &str) -> Result<Scenario, Vec<LoadError>> {
    let raw: RawScenario = parse_yaml(path, source).map_err(|e| vec![e])?;
    let mut conv = Converter {
        path,
        source,
        errors: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut step_spans = Vec::new();
    for raw_step in raw.steps.value {
        if let Some((step, span)) = conv.step(raw_step) {
            steps.push(step);
            step_spans.push(span);
        }
    }
    let spans = Spans {
        family: raw.family.referenced,
        name: raw.name.referenced,
        summary: raw.summary.referenced,
        covers: raw.covers.referenced,
        cover_items: raw.covers.value.iter().map(|c| c.referenced).collect(),
        sides: raw.sides.as_ref().map(|s| s.referenced),
        config: raw.config.as_ref().map(|c| c.referenced),
        pending: raw.pending.as_ref().map(|p| p.referenced),
        requires: raw.requires.as_ref().map(|r| r.referenced),
        steps: raw.steps.referenced,
        step_items: step_spans,
    };
    let requires_span = raw.requires.as_ref().map(|r| r.referenced);
    let edges_span = raw.edges.as_ref().map(|e| e.referenced);
    let edges = raw.edges.map(|e| e.value).unwrap_or_default();
    let covers: Vec<String> = raw.covers.value.iter().map(|c| c.value.clone()).collect();
    for (key, list) in &edges {
        let problem = match key.split_once('/') {
            None => Some(format!(
                "edges: `{key}` is not `<requirement ID>/<bound name>`"
            )),
            Some((id, _)) if !covers.iter().any(|c| c == id) => Some(format!(
                "edges: `{key}` names {id}, which this scenario does not list in `covers:`"
            )),
            Some(_) if list.is_empty() => Some(format!("edges: `{key}` lists no edge")),
            Some(_) if list.len() == 2 && list[0] == list[1] => {
                Some(format!("edges: `{key}` lists an edge twice"))
            }
            Some(_) if list.len() > 2 => Some(format!("edges: `{key}` lists an edge twice")),
            Some(_) => None,
        };
        if let Some(message) = problem {
            conv.errors
                .push(LoadError::at(path, edges_span, message, Some(source)));
        }
    }
    let scenario = Scenario {
        family: raw.family.value,
        name: raw.name.value,
        summary: raw.summary.value,
        covers: raw.covers.value.into_iter().map(|c| c.value).collect(),
        sides: raw.sides.map(|s| s.value),
        config: raw.config.map(|c| c.value).unwrap_or_default(),
        steps,
        pending: raw.pending.map(|p| p.value).unwrap_or_default(),
        requires: match raw.requires.as_ref().map(|r| requires_of(&r.value)) {
            None => BTreeMap::new(),
            Some(Ok(map)) => map,
            Some(Err(message)) => {
                conv.errors
                    .push(LoadError::at(path, requires_span, message, Some(source)));
                BTreeMap::new()
            }
        },
        edges,
        path: path.to_path_buf(),
    };
    let mut errors = conv.errors;
    for issue in validation::validate(&scenario, &spans) {
        errors.push(LoadError::at(
            path,
            issue.location,
            issue.message,
            Some(source),
        ));
    }
    if errors.is_empty() {
        Ok(scenario)
    } else {
        Err(errors)
    }
}

/// Loads one scenario file strictly and validates it (family = directory name, name =
/// file stem, …). Only the first problem is returned; see [`load_scenario_all_errors`].
///
/// # Errors
/// A located [`LoadError`].
pub fn load_scenario(path: &Path) -> Result<Scenario, LoadError> {
    load_scenario_all_errors(path).map_err(|mut errors| errors.swap_remove(0))
}

/// As [`load_scenario`], returning every problem found (never an empty list on error).
///
/// # Errors
/// Every located [`LoadError`].
pub fn load_scenario_all_errors(path: &Path) -> Result<Scenario, Vec<LoadError>> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| vec![LoadError::new(path, format!("cannot read: {e}"))])?;
    parse_scenario(path, &source)
}

/// The one extension scenario files have. `.yml` is **not** accepted: a `.yml` file in a
/// family directory is a load error (two spellings would let `x.yaml` and `x.yml` both
/// declare scenario `x` and write the same golden).
pub const SCENARIO_EXTENSION: &str = "yaml";

/// Loads every `*.yaml` scenario under `dir/<family>/` and every scenario the family's
/// value table (`dir/tables/<family>.values.yaml`, when there is one) generates, sorted
/// by name.
///
/// # Errors
/// Every problem of every file (the directory missing is one error); a `*.yml` file is
/// an error (use `.yaml`), and so are two files declaring the same scenario name (the
/// error names both).
pub fn load_family(dir: &Path, family: &str) -> Result<Vec<Scenario>, Vec<LoadError>> {
    let family_dir = dir.join(family);
    let entries = std::fs::read_dir(&family_dir).map_err(|e| {
        vec![LoadError::new(
            &family_dir,
            format!("cannot read directory: {e}"),
        )]
    })?;
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut errors = Vec::new();
    for path in entries.flatten().map(|e| e.path()).filter(|p| p.is_file()) {
        match path.extension().and_then(|e| e.to_str()) {
            Some(SCENARIO_EXTENSION) => paths.push(path),
            Some("yml") => errors.push(LoadError::new(
                &path,
                format!(
                    "scenario files must end in `.{SCENARIO_EXTENSION}` (`.yml` is not \
                     accepted); rename it"
                ),
            )),
            _ => {}
        }
    }
    paths.sort();
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    let mut scenarios: Vec<Scenario> = Vec::new();
    for path in paths {
        match load_scenario_all_errors(&path) {
            Ok(s) => scenarios.push(s),
            Err(mut e) => errors.append(&mut e),
        }
    }
    // The family's value table, expanded into its scenarios (`super::tables`).
    let table = super::tables::table_path(dir, family);
    if table.is_file() {
        match super::tables::load_table(&table, family) {
            Ok(mut generated) => scenarios.append(&mut generated),
            Err(mut e) => errors.append(&mut e),
        }
    }
    scenarios.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.path.cmp(&b.path)));
    for pair in scenarios.windows(2) {
        if pair[0].name == pair[1].name {
            errors.push(LoadError::new(
                &pair[1].path,
                format!(
                    "scenario `{}` is also declared by {}; scenario names (and so golden \
                     files) must be unique",
                    pair[1].name,
                    pair[0].path.display()
                ),
            ));
        }
    }
    // Every `.yml` file that shadows a `.yaml` one is named together with it.
    for e in &mut errors {
        if e.path.extension().is_some_and(|x| x == "yml") {
            let twin = e.path.with_extension(SCENARIO_EXTENSION);
            if twin.is_file() {
                e.message.push_str(&format!(
                    "; it would declare the same scenario as {}",
                    twin.display()
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(scenarios)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::model::GeneratedFile;
    use serde_json::json;

    const VALID: &str = r#"family: core_runtime
name: sample
summary: One Turn from preparation to done.
covers: [CR-ADM-001, CR-RUN-003]
sides: [runtime, core]
config:
  runtime:
    timers: { admission_expiry_ms: 200 }
  workspace:
    files: { "src/main.py": "print('hi')\n" }
    dirs: ["empty"]
steps:
  - handshake: {}
  - core: { type: execution_prepare, id: prep-1, payload: { session_id: s1 } }
  - runtime:
      type: preparation_status
      id: prep-1
      payload: { status: preparing, admission_handle: $h1, revision: 1, note: "$$lit", flag: yes }
  - native: { emit: { run_id: $run, type: delta, payload: { text: hi } } }
  - native: { await: { call: start }, expect: { run_id: $run } }
  - any_order:
      - runtime: { type: delta, id: $run, payload: { text: hi } }
      - runtime: { type: usage, id: $run, payload: $_ }
  - silence: 200ms
  - silence: 2s
  - bootstrap: { request: { device_id: dev-1 }, response: { status: 200, body: { heartbeat_interval_ms: 10 } } }
  - connect: { query: { device_id: dev-1, version: "1" }, response: { status: 426 } }
  - reconnect: {}
  - half_close: { code: 1000, reason: bye }
  - send_bytes: { text: "{not json" }
  - send_bytes: { base64: "AAE=" }
  - expect_close: { code: 1008 }
  - disconnect: {}
  - api: { call: { method: POST, path: /v1/sessions/s-1/turns, body: { input: [] } }, expect: { status: 201, body: { turn_id: $t1 } } }
  - api: { call: { method: GET, path: /v1/turns/$t1 }, expect: { status: 200 }, poll: true }
"#;

    /// Writes `text` as `<tmp>/core_runtime/<name>.yaml` and loads it.
    fn load(name: &str, text: &str) -> (tempfile::TempDir, Result<Scenario, LoadError>) {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("core_runtime");
        std::fs::create_dir_all(&fam).unwrap();
        let path = fam.join(format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        let result = load_scenario(&path);
        (dir, result)
    }

    fn load_err(name: &str, text: &str) -> String {
        let (_dir, result) = load(name, text);
        match result {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn reference_steps_load_and_are_checked() {
        let base = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - handshake: {}\n";
        let (_dir, ok) = load(
            "x",
            &format!(
                "{base}  - reference: {{requirement: CR-PREP-018, steps: [{{silence: 10ms}}, {{disconnect: {{}}}}]}}\n"
            ),
        );
        let s = ok.unwrap();
        assert!(
            matches!(&s.steps[1], Step::Reference { requirement, steps, .. } if requirement == "CR-PREP-018" && steps.len() == 2)
        );
        let err = load_err(
            "x",
            &format!("{base}  - reference: {{requirement: nope, steps: [{{silence: 10ms}}]}}\n"),
        );
        assert!(
            err.contains("x.yaml:7:5") && err.contains("malformed requirement ID `nope`"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!("{base}  - reference: {{requirement: CR-A-001, steps: []}}\n"),
        );
        assert!(err.contains("`steps` must not be empty"), "{err}");
    }

    #[test]
    fn optional_frames_and_comparisons_load_and_are_checked() {
        let base = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - handshake: {}\n";
        let (_dir, ok) = load(
            "x",
            &format!(
                "{base}  - optional: {{runtime: {{type: preparation_status, id: p, payload: {{status: preparing, admission_handle: $h, revision: $r1}}}}}}\n  - runtime: {{type: preparation_status, id: p, payload: {{status: ready, admission_handle: $h, revision: {{$gt: $r1}}, expires_in_ms: {{$gt: 0, $le: 300000}}}}}}\n"
            ),
        );
        let s = ok.unwrap();
        assert!(
            matches!(&s.steps[1], Step::Optional(inner) if matches!(**inner, Step::Frame { party: Party::Runtime, .. }))
        );
        let err = load_err("x", &format!("{base}  - optional: {{silence: 10ms}}\n"));
        assert!(
            err.contains("x.yaml:7:15") && err.contains("optional holds one frame step"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!(
                "{base}  - runtime: {{type: heartbeat, id: h, payload: {{runtime_version: {{$gt: 1, $ge: 2}}}}}}\n"
            ),
        );
        assert!(
            err.contains("x.yaml:7:5") && err.contains("`$gt` or `$ge`, not both"),
            "{err}"
        );
    }

    #[test]
    fn another_familys_keywords_sides_and_settings_are_located_errors() {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("demo");
        std::fs::create_dir_all(&fam).unwrap();
        let path = fam.join("x.yaml");
        let text = "family: demo\nname: x\nsummary: s\ncovers: [DM-X-001]\nsides: [core, runtime]\nconfig: {runtime: {}}\nsteps:\n  - silence: 10ms\n  - handshake: {}\n  - any_order:\n      - core: {type: a, id: x, payload: {}}\n      - runtime: {type: b, id: y, payload: {}}\n";
        std::fs::write(&path, text).unwrap();
        let errors: Vec<String> = load_scenario_all_errors(&path)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        let all = errors.join("\n");
        assert!(
            all.contains("x.yaml:9:")
                && all.contains(
                    "`handshake` is not a step of family `demo` (its steps: core, silence"
                ),
            "{all}"
        );
        assert!(
            all.contains("x.yaml:12:") && all.contains("`runtime` is not a step of family `demo`"),
            "{all}"
        );
        assert!(
            all.contains("family `demo` has no side `runtime` (its sides: core)"),
            "{all}"
        );
        assert!(
            all.contains("config.runtime is not a setting of family `demo` (its settings: none)"),
            "{all}"
        );
        // An unknown family is named where it is written.
        let other = dir.path().join("nope");
        std::fs::create_dir_all(&other).unwrap();
        let path = other.join("y.yaml");
        std::fs::write(
            &path,
            "family: nope\nname: y\nsummary: s\ncovers: [DM-X-001]\nsteps:\n  - silence: 10ms\n",
        )
        .unwrap();
        let err = load_scenario(&path).unwrap_err().to_string();
        assert!(
            err.contains("y.yaml:1:9")
                && err.contains("unknown family `nope`; families: core_runtime"),
            "{err}"
        );
    }

    #[test]
    fn async_api_calls_and_queries_are_checked() {
        let head = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsides: [core]\nsteps:\n";
        let start = |id: &str| {
            format!(
                "  - api: {{ call: {{ method: GET, path: /v1/sessions/s-1/files/content, query: {{ path: \"src/a b.py\" }} }}, expect: {{ status: 200 }}, id: {id}, await: false }}\n"
            )
        };
        let result = |id: &str| format!("  - api_result: {{ id: {id} }}\n");
        let (_dir, ok) = load(
            "x",
            &format!(
                "{head}{}  - silence: 1ms\n{}",
                start("files1"),
                result("files1")
            ),
        );
        let s = ok.unwrap();
        match &s.steps[0] {
            Step::Api(api) => {
                assert!(!api.wait);
                assert_eq!(api.id.as_deref(), Some("files1"));
                let query = api.call.query.as_ref().unwrap();
                assert_eq!(query["path"], "src/a b.py");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.steps[2],
            Step::ApiResult(ApiResultStep {
                id: "files1".into()
            })
        );
        // Unknown ID, located at the api_result step (line 7).
        let err = load_err("x", &format!("{head}{}", result("nope")));
        assert!(err.contains("no earlier `api` step"), "{err}");
        assert!(err.contains(":7:"), "{err}");
        // Awaited before it was started.
        let err = load_err("x", &format!("{head}{}{}", result("a"), start("a")));
        assert!(err.contains("no earlier `api` step"), "{err}");
        // Never awaited, located at the api step (line 7).
        let err = load_err("x", &format!("{head}{}", start("a")));
        assert!(err.contains("never awaited"), "{err}");
        assert!(err.contains(":7:"), "{err}");
        // Awaited twice.
        let err = load_err(
            "x",
            &format!("{head}{}{}{}", start("a"), result("a"), result("a")),
        );
        assert!(err.contains("already awaited by step 2"), "{err}");
        // The same ID started twice.
        let err = load_err(
            "x",
            &format!("{head}{}{}{}", start("a"), start("a"), result("a")),
        );
        assert!(err.contains("already used by step 1"), "{err}");
        // Too many in flight.
        let ids = ["a", "b", "c", "d", "e"];
        let starts: String = ids.iter().map(|id| start(id)).collect();
        let results: String = ids.iter().map(|id| result(id)).collect();
        let err = load_err("x", &format!("{head}{starts}{results}"));
        assert!(err.contains("more than 4"), "{err}");
        // `await: false` without an ID, an ID without `await: false`, polling, bad IDs.
        for (step, needle) in [
            (
                "{ call: { method: GET, path: /v1/x }, expect: { status: 200 }, await: false }",
                "needs an `id`",
            ),
            (
                "{ call: { method: GET, path: /v1/x }, expect: { status: 200 }, id: a }",
                "add `await: false`",
            ),
            (
                "{ call: { method: GET, path: /v1/x }, expect: { status: 200 }, id: a, await: false, poll: true }",
                "cannot poll",
            ),
            (
                "{ call: { method: GET, path: \"/v1/x?path=a\" }, expect: { status: 200 } }",
                "call.query",
            ),
            (
                "{ call: { method: GET, path: /v1/x, query: { \"\": a } }, expect: { status: 200 } }",
                "non-empty literal",
            ),
        ] {
            let err = load_err("x", &format!("{head}  - api: {step}\n"));
            assert!(err.contains(needle), "{step}: {err}");
        }
        let err = load_err(
            "x",
            &format!(
                "{head}  - api: {{ call: {{ method: GET, path: /v1/x }}, expect: {{ status: 200 }}, id: \"a b\", await: false }}\n  - api_result: {{ id: \"a b\" }}\n"
            ),
        );
        assert!(err.contains("must be 1..=64 letters"), "{err}");
        let err = load_err(
            "x",
            &format!("{head}  - api_result: {{ id: a, extra: 1 }}\n"),
        );
        assert!(err.contains("extra"), "{err}");
        // A placeholder used only in a query value is a typo.
        let err = load_err(
            "x",
            &format!(
                "{head}  - api: {{ call: {{ method: GET, path: /v1/x, query: {{ path: $typo }} }}, expect: {{ status: 200 }} }}\n"
            ),
        );
        assert!(err.contains("`$typo` appears nowhere else"), "{err}");
    }

    #[test]
    fn requires_names_known_features_in_either_shape() {
        let head = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\n";
        let load = |requires: &str| {
            parse_scenario(
                Path::new("scenarios/core_runtime/x.yaml"),
                &format!("{head}requires: {requires}\nsteps:\n  - silence: 1ms\n"),
            )
        };
        let s = load("[message_items]").unwrap();
        assert_eq!(s.requires, [("message_items".to_string(), true)].into());
        let s = load("{ mcp_http_tools: false }").unwrap();
        assert_eq!(s.requires, [("mcp_http_tools".to_string(), false)].into());
        for (bad, says) in [
            ("[3]", "found the list item 3"),
            ("message_items", "found \"message_items\""),
            ("{ usage: \"no\" }", "`usage` is \"no\""),
            ("{ usage: yes }", "`usage` is \"yes\""),
            ("{ usage: null }", "`usage` is null"),
            ("[usage, usage]", "`usage` is listed twice"),
            (
                "[teleport]",
                "`teleport` is not an optional feature of family `core_runtime`",
            ),
            ("[streaming]", "`streaming` is not an optional feature"),
        ] {
            let errors = load(bad).unwrap_err();
            let text = errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n");
            assert!(
                text.contains(says) && text.contains("x.yaml:5:"),
                "{bad}: {text}"
            );
        }
    }

    #[test]
    fn api_crash_and_pending_are_checked() {
        let head = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\n";
        let (_dir, ok) = load(
            "x",
            &format!(
                "{head}sides: [core]\npending: {{ core: \"not yet\" }}\nsteps:\n  - crash: {{}}\n  - api: {{ call: {{ method: GET, path: /v1/turns/t-1 }}, expect: {{ status: 200 }}, poll: true }}\n"
            ),
        );
        let s = ok.unwrap();
        assert_eq!(s.pending_reason(Side::Core), Some("not yet"));
        assert_eq!(s.steps[0], Step::Crash { fresh_state: false });
        let err = load_err("x", &format!("{head}steps:\n  - crash: {{}}\n"));
        assert!(
            err.contains(
                "crash restarts the target Core, engine daemon, engine client or worker host"
            ),
            "{err}"
        );
        // The worker host restarts (same working directory); the plugin host does not.
        let crash_on = |family: &str, side: &str| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(family).join("x.yaml");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(
                &path,
                format!(
                    "family: {family}\nname: x\nsummary: s\ncovers: [X-001]\nsides: [{side}]\nsteps:\n  - crash: {{}}\n"
                ),
            )
            .unwrap();
            load_scenario(&path).map_err(|e| e.to_string())
        };
        assert_eq!(
            crash_on("worker", "host").unwrap().steps[0],
            Step::Crash { fresh_state: false }
        );
        for (family, side) in [("worker", "worker"), ("plugin", "host")] {
            let err = crash_on(family, side).unwrap_err();
            assert!(err.contains("crash restarts"), "{family}/{side}: {err}");
        }
        let err = load_err(
            "x",
            &format!(
                "{head}steps:\n  - api: {{ call: {{ method: POST, path: /v1/agents }}, expect: {{ status: 201 }}, poll: true }}\n"
            ),
        );
        assert!(err.contains("only for GET"), "{err}");
        let err = load_err(
            "x",
            &format!(
                "{head}steps:\n  - api: {{ call: {{ method: FETCH, path: agents }}, expect: {{ status: 201 }} }}\n"
            ),
        );
        assert!(err.contains("method `FETCH`"), "{err}");
        let err = load_err(
            "x",
            &format!(
                "{head}steps:\n  - api: {{ call: {{ method: GET, path: agents }}, expect: {{ status: 200 }} }}\n"
            ),
        );
        assert!(err.contains("must start with `/v1/`"), "{err}");
        let err = load_err(
            "x",
            &format!(
                "{head}steps:\n  - api: {{ call: {{ method: GET, path: /v1/x }}, expect: {{ status: 200 }}, retry: 3 }}\n"
            ),
        );
        assert!(err.contains("retry"), "{err}");
        let err = load_err(
            "x",
            &format!(
                "{head}sides: [runtime]\npending: {{ core: \"x\" }}\nsteps:\n  - silence: 1ms\n"
            ),
        );
        assert!(err.contains("does not run on"), "{err}");
        let err = load_err(
            "x",
            &format!("{head}pending: {{ core: \" \" }}\nsteps:\n  - silence: 1ms\n"),
        );
        assert!(err.contains("say why"), "{err}");
    }

    #[test]
    fn valid_scenario_loads() {
        let (_dir, result) = load("sample", VALID);
        let s = result.unwrap();
        assert_eq!(s.id(), "core_runtime/sample");
        assert_eq!(s.covers, vec!["CR-ADM-001", "CR-RUN-003"]);
        assert!(s.runs_on(Side::Core) && s.runs_on(Side::Runtime));
        assert_eq!(
            s.config.runtime,
            Some(json!({"timers": {"admission_expiry_ms": 200}}))
        );
        let ws = s.config.workspace.as_ref().unwrap();
        assert_eq!(ws.files["src/main.py"], "print('hi')\n");
        assert_eq!(s.steps.len(), 18);
        assert!(
            matches!(&s.steps[17], Step::Api(api) if api.poll && api.call.path == "/v1/turns/$t1")
        );
        assert_eq!(
            s.steps[0],
            Step::Handshake {
                heartbeat_interval_ms: None
            }
        );
        match &s.steps[2] {
            Step::Frame { party, frame } => {
                assert_eq!(*party, Party::Runtime);
                assert_eq!(frame["payload"]["admission_handle"], json!("$h1"));
                assert_eq!(frame["payload"]["revision"], json!(1));
                // YAML 1.2 booleans only: `yes` stays a string.
                assert_eq!(frame["payload"]["flag"], json!("yes"));
                let keys: Vec<&String> = frame.as_object().unwrap().keys().collect();
                assert_eq!(keys, ["type", "id", "payload"]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.steps[4],
            Step::Native {
                op: "await".into(),
                args: json!({"call": "start"}),
                expect: Some(json!({"run_id": "$run"})),
            }
        );
        assert!(matches!(&s.steps[5], Step::AnyOrder(v) if v.len() == 2));
        assert_eq!(s.steps[6], Step::Silence(Duration::from_millis(200)));
        assert_eq!(s.steps[7], Step::Silence(Duration::from_secs(2)));
        assert_eq!(s.steps[13], Step::SendBytes(RawMessage::Binary(vec![0, 1])));
        assert_eq!(
            s.steps[14],
            Step::ExpectClose {
                code: Some(serde_json::json!(1008)),
                reason: None
            }
        );
    }

    #[test]
    fn send_bytes_frame_takes_a_repeat_key() {
        let step = |yaml: &str| {
            let raw: RawBytes = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
            raw.message()
        };
        assert_eq!(
            step("{frame: {kind: shutdown}, repeat_key: {path: [message, kind]}}"),
            Ok(RawMessage::FrameRepeatingKey {
                frame: serde_json::json!({"kind": "shutdown"}),
                repeat: RepeatKey {
                    path: vec!["message".into(), "kind".into()],
                    value: None
                },
            })
        );
        assert_eq!(
            step("{frame: {kind: shutdown}, repeat_key: {path: [generation], value: null}}"),
            Ok(RawMessage::FrameRepeatingKey {
                frame: serde_json::json!({"kind": "shutdown"}),
                repeat: RepeatKey {
                    path: vec!["generation".into()],
                    value: Some(Value::Null)
                },
            })
        );
        for bad in [
            "{text: '{}', repeat_key: {path: [a]}}",
            "{frame: {kind: shutdown}, repeat_key: {path: []}}",
            "{frame: {kind: shutdown}, repeat_key: {path: ['']}}",
            "{frame: {kind: shutdown}, repeat_key: {path: [a], other: 1}}",
        ] {
            assert!(step(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn send_bytes_pads_to_an_exact_size_and_sends_raw_text_bytes() {
        let raw = |text: Option<&str>,
                   pad_to: Option<usize>,
                   b64: Option<&str>,
                   text_b64: Option<&str>| {
            RawBytes {
                text: text.map(Into::into),
                pad_to: pad_to.map(|n| Value::from(n as u64)),
                base64: b64.map(Into::into),
                text_base64: text_b64.map(Into::into),
                frame: None,
                repeat_key: None,
            }
            .message()
        };
        assert_eq!(
            raw(Some("{}"), Some(5), None, None),
            Ok(RawMessage::Text("{}   ".into()))
        );
        assert_eq!(
            raw(None, None, None, Some("/w==")),
            Ok(RawMessage::TextBytes(vec![0xff]))
        );
        for bad in [
            raw(Some("{}"), Some(1), None, None),
            raw(Some("{}"), Some(PAD_TO_MAX + 1), None, None),
            raw(None, Some(4), Some("AA=="), None),
            raw(Some("x"), None, Some("AA=="), None),
            raw(None, None, None, None),
            raw(None, None, None, Some("not base64!")),
        ] {
            assert!(bad.is_err(), "{bad:?}");
        }
        // A quoted size is text, not a byte count.
        let text = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - send_bytes: { text: \"{}\", pad_to: \"10\" }\n";
        let err = load_err("x", text);
        assert!(err.contains("takes a byte count"), "{err}");
    }

    #[test]
    fn misspelled_frame_key_is_located() {
        let text = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - core:\n      type: execution_prepare\n      id: p\n      paylod: {}\n";
        let err = load_err("x", text);
        assert!(
            err.contains("core_runtime/x.yaml:9:7: unknown field `paylod`, expected one of type, id, payload, trace"),
            "{err}"
        );
        assert!(err.contains("9 |       paylod: {}\n  |       ^"), "{err}");
    }

    #[test]
    fn misspelled_top_level_and_step_field() {
        let err = load_err("x", "family: core_runtime\nname: x\nsumary: s\n");
        assert!(err.contains("x.yaml:3:1: unknown field `sumary`"), "{err}");
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - half_close: { code: 1000, reasn: x }\n",
        );
        assert!(err.contains("x.yaml:6:31: unknown field `reasn`"), "{err}");
    }

    #[test]
    fn duplicate_key_is_an_error() {
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - core: { type: device_shutdown, id: a, id: b, payload: {} }\n",
        );
        assert!(
            err.contains("x.yaml:6:43: duplicate mapping key: id"),
            "{err}"
        );
        assert!(!err.contains("DuplicateKeyPolicy"), "{err}");
    }

    #[test]
    fn unknown_step_is_located() {
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - handshake: {}\n  - silense: 2s\n",
        );
        assert!(
            err.contains("x.yaml:7:5: unknown variant `silense`"),
            "{err}"
        );
        // A step map with two keys.
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - handshake: {}\n    silence: 2s\n",
        );
        assert!(err.contains("x.yaml:7:5:"), "{err}");
    }

    #[test]
    fn bad_duration_is_located() {
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - silence: 2 minutes\n",
        );
        assert!(
            err.contains("x.yaml:6:14: invalid duration `2 minutes`"),
            "{err}"
        );
        assert_eq!(parse_duration("15ms"), Ok(Duration::from_millis(15)));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1.5s").is_err());
    }

    #[test]
    fn validation_errors_are_located() {
        let base = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n";
        let err = load_err("y", &format!("{base}  - disconnect: {{}}\n"));
        assert!(
            err.contains("y.yaml:2:7: name `x` does not match the file name `y`"),
            "{err}"
        );
        let err = load_err(
            "x",
            "family: engine\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - disconnect: {}\n",
        );
        assert!(
            err.contains("x.yaml:1:9: family `engine` does not match the directory `core_runtime`"),
            "{err}"
        );
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [cr-1]\nsteps:\n  - disconnect: {}\n",
        );
        assert!(
            err.contains("x.yaml:4:10: malformed requirement ID `cr-1`"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!("{base}  - core: {{ type: device_shutdown, id: $bad-name, payload: {{}} }}\n"),
        );
        assert!(
            err.contains("x.yaml:6:5:")
                && err.contains("malformed placeholder `$bad-name` at $.id"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!(
                "{base}  - any_order:\n      - runtime: {{ type: delta, id: r, payload: {{}} }}\n      - silence: 1s\n"
            ),
        );
        assert!(
            err.contains("x.yaml:8:9: any_order may contain only"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!("{base}  - core: {{ type: heartbeat, id: a, payload: {{}} }}\n"),
        );
        assert!(err.contains("`heartbeat` is not sent by core"), "{err}");
        let err = load_err("x", &format!("{base}  - native: {{ emitt: {{}} }}\n"));
        assert!(err.contains("unknown native op `emitt`"), "{err}");
        let err = load_err(
            "x",
            &format!("{base}  - native: {{ emit: {{}}, settle: {{}} }}\n"),
        );
        assert!(err.contains("exactly one op key"), "{err}");
        let err = load_err(
            "x",
            "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsides: [runtime, bogus]\nsteps: []\n",
        );
        assert!(
            err.contains("x.yaml:5:18: unknown variant `bogus`"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!("{base}  - send_bytes: {{ base64: \"!!\" }}\n"),
        );
        assert!(err.contains("not valid base64"), "{err}");
        let err = load_err(
            "x",
            &format!("{base}  - core: {{ type: device_shutdown, id: a, payload: {{ x: ~ }} }}\n"),
        );
        assert!(err.contains("null at $.payload.x"), "{err}");
    }

    #[test]
    fn expect_exit_parses_codes_and_stderr() {
        let base = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n";
        let (_dir, result) = load(
            "x",
            &format!(
                "{base}  - expect_exit: {{ code: 3, stderr: invalid_capability_declaration }}\n"
            ),
        );
        assert_eq!(
            result.unwrap().steps,
            vec![Step::ExpectExit {
                code: Some(ExitCodeSpec::Exact(3)),
                stderr: vec!["invalid_capability_declaration".into()],
            }]
        );
        let (_dir, result) = load(
            "x",
            &format!(
                "{base}  - handshake: {{}}\n  - expect_exit: {{ code: nonzero, stderr: [a, b] }}\n"
            ),
        );
        assert_eq!(
            result.unwrap().steps[1],
            Step::ExpectExit {
                code: Some(ExitCodeSpec::NonZero),
                stderr: vec!["a".into(), "b".into()],
            }
        );
        let (_dir, result) = load("x", &format!("{base}  - expect_exit: {{}}\n"));
        assert_eq!(
            result.unwrap().steps,
            vec![Step::ExpectExit {
                code: None,
                stderr: vec![]
            }]
        );
        assert!(ExitCodeSpec::NonZero.matches(Some(3)));
        assert!(!ExitCodeSpec::NonZero.matches(Some(0)));
        assert!(!ExitCodeSpec::NonZero.matches(None));
        assert!(ExitCodeSpec::Exact(0).matches(Some(0)));
    }

    #[test]
    fn expect_exit_errors_are_located() {
        let base = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nsteps:\n";
        let err = load_err("x", &format!("{base}  - expect_exit: {{ code: some }}\n"));
        assert!(
            err.contains("x.yaml:6:") && err.contains("invalid exit code `some`"),
            "{err}"
        );
        let err = load_err("x", &format!("{base}  - expect_exit: {{ code: 300 }}\n"));
        assert!(
            err.contains("x.yaml:6:5: expect_exit: exit code 300 is outside 0..=255"),
            "{err}"
        );
        let err = load_err("x", &format!("{base}  - expect_exit: {{ stderr: \"\" }}\n"));
        assert!(err.contains("must not be empty"), "{err}");
        let err = load_err("x", &format!("{base}  - expect_exit: {{ cod: 1 }}\n"));
        assert!(err.contains("x.yaml:6:20: unknown field `cod`"), "{err}");
        let err = load_err(
            "x",
            &format!("{base}  - expect_exit: {{ code: 0 }}\n  - silence: 1s\n"),
        );
        assert!(
            err.contains("x.yaml:6:5: expect_exit must be the last step"),
            "{err}"
        );
        // Our exit in a reference group: its last step, the group the scenario's last.
        let group = "  - reference:\n      requirement: CR-A-002\n      steps:\n";
        let (_dir, result) = load(
            "x",
            &format!("{base}  - silence: 1ms\n{group}        - expect_exit: {{ code: 2 }}\n"),
        );
        result.expect("expect_exit ends the last reference group");
        let err = load_err(
            "x",
            &format!("{base}{group}        - expect_exit: {{ code: 2 }}\n        - silence: 1ms\n"),
        );
        assert!(
            err.contains("expect_exit inside `reference` must be the group's last step"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!("{base}{group}        - expect_exit: {{ code: 2 }}\n  - silence: 1ms\n"),
        );
        assert!(
            err.contains("x.yaml:6:5: expect_exit must be the last step"),
            "{err}"
        );
        let err = load_err(
            "x",
            &format!("{base}  - terminate: {{}}\n  - sleep: 10ms\n  - terminate: {{}}\n"),
        );
        assert!(
            err.contains("x.yaml:8:5: terminate may appear once"),
            "{err}"
        );
    }

    #[test]
    fn generated_files_parse_and_are_bounded() {
        let head = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\n";
        let steps = "steps:\n  - handshake: {}\n";
        let (_dir, result) = load(
            "x",
            &format!(
                "{head}config:\n  workspace:\n    generated: [ {{ path: big.bin, size: 2097152, seed: 7 }}, {{ path: d/empty, size: 0 }} ]\n{steps}"
            ),
        );
        let s = result.unwrap();
        let generated = &s.config.workspace.as_ref().unwrap().generated;
        assert_eq!(
            generated,
            &vec![
                GeneratedFile {
                    path: "big.bin".into(),
                    size: 2_097_152,
                    seed: 7,
                    text: None,
                },
                GeneratedFile {
                    path: "d/empty".into(),
                    size: 0,
                    seed: 0,
                    text: None,
                },
            ]
        );
        let err = load_err(
            "x",
            &format!(
                "{head}config:\n  workspace:\n    generated: [ {{ path: a, size: 67108865 }} ]\n{steps}"
            ),
        );
        assert!(
            err.contains("x.yaml:6:3: config.workspace.generated[0] (`a`): size 67108865 exceeds"),
            "{err}"
        );
        let five = (0..5)
            .map(|i| format!("{{ path: f{i}, size: 67108864 }}"))
            .collect::<Vec<_>>()
            .join(", ");
        let err = load_err(
            "x",
            &format!("{head}config:\n  workspace:\n    generated: [ {five} ]\n{steps}"),
        );
        assert!(err.contains("335544320 bytes in all exceed"), "{err}");
        // A text takes no seed, one printable ASCII fill, and a prefix within the size.
        for bad in [
            "{ path: t, size: 9, seed: 1, text: {} }",
            "{ path: t, size: 9, text: { fill: xy } }",
            "{ path: t, size: 2, text: { prefix: abc } }",
        ] {
            let err = load_err(
                "x",
                &format!("{head}config:\n  workspace:\n    generated: [ {bad} ]\n{steps}"),
            );
            assert!(err.contains("a `text` takes no `seed`"), "{bad}: {err}");
        }
        let (_dir, result) = load(
            "x",
            &format!(
                "{head}config:\n  workspace:\n    generated: [ {{ path: t, size: 9, text: {{ prefix: ab }} }} ]\n{steps}"
            ),
        );
        let text = &result.unwrap().config.workspace.unwrap().generated[0].text;
        assert_eq!(text.as_ref().map(|t| t.fill.as_str()), Some("x"));
        let err = load_err(
            "x",
            &format!(
                "{head}config:\n  workspace:\n    files: {{ a: x }}\n    generated: [ {{ path: a, size: 1 }} ]\n{steps}"
            ),
        );
        assert!(err.contains("`a` is seeded twice"), "{err}");
        let err = load_err(
            "x",
            &format!(
                "{head}config:\n  workspace:\n    generated: [ {{ path: ../a, size: 1 }} ]\n{steps}"
            ),
        );
        assert!(err.contains("must be a relative path inside"), "{err}");
        let err = load_err(
            "x",
            &format!(
                "{head}config:\n  workspace:\n    generated: [ {{ path: a, size: 1, sed: 2 }} ]\n{steps}"
            ),
        );
        assert!(err.contains("unknown field `sed`"), "{err}");
    }

    #[test]
    fn generated_patterns_are_checked() {
        let head = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\n";
        let frame = "  - runtime: { type: workspace_read_result, id: op-1, payload: { status: ok, truncated: true, data: { $generated: GEN } } }\n";
        let ok = frame.replace("GEN", "{ seed: 7, size: 4 }");
        let (_dir, result) = load("x", &format!("{head}sides: [runtime]\nsteps:\n{ok}"));
        result.unwrap();
        let err = load_err("x", &format!("{head}steps:\n{ok}"));
        assert!(
            err.contains("x.yaml:6:5:")
                && err.contains(
                    "`$generated` at $.payload.data needs a scenario that runs on one side"
                ),
            "{err}"
        );
        // In a frame the harness sends in a one-sided scenario it stands for its base64.
        let sent = "  - core: { type: workspace_write, id: w-1, payload: { phase: chunk, offset: 0, data: { $generated: { seed: 7, size: 4 } } } }\n";
        let (_dir, result) = load("x", &format!("{head}sides: [runtime]\nsteps:\n{sent}"));
        result.unwrap();
        let err = load_err("x", &format!("{head}steps:\n{sent}"));
        assert!(
            err.contains("needs a scenario that runs on one side"),
            "{err}"
        );
        let bad = frame.replace("GEN", "{ seed: 7 }");
        let err = load_err("x", &format!("{head}sides: [runtime]\nsteps:\n{bad}"));
        assert!(
            err.contains("at $.payload.data: `$generated` needs `size`"),
            "{err}"
        );
        // In a body the harness sends (`api.call.body`) it stands for its base64, on any side.
        let api = "  - api: { call: { method: PUT, path: /v1/sessions/s-1/files/content, body: { content_base64: { $generated: GEN } } }, expect: { status: 200 } }\n";
        let (_dir, result) = load(
            "x",
            &format!(
                "{head}steps:\n{ok}",
                ok = api.replace("GEN", "{ seed: 7, size: 4 }")
            ),
        );
        result.unwrap();
        let err = load_err(
            "x",
            &format!(
                "{head}steps:\n{bad}",
                bad = api.replace("GEN", "{ seed: 7 }")
            ),
        );
        assert!(
            err.contains("api.call.body: at $.content_base64: `$generated` needs `size`"),
            "{err}"
        );
    }

    #[test]
    fn nulls_in_launch_config_are_kept() {
        let text = "family: core_runtime\nname: x\nsummary: s\ncovers: [CR-A-001]\nconfig:\n  runtime:\n    agent_kinds: [ { agent_kind: k, available: true, capabilities: { resume: null, usage: ~ } } ]\nsteps:\n  - expect_exit: {}\n";
        let (_dir, result) = load("x", text);
        let s = result.unwrap();
        assert_eq!(
            s.config.runtime.unwrap()["agent_kinds"][0]["capabilities"],
            json!({"resume": null, "usage": null})
        );
    }

    #[test]
    fn family_loads_sorted_and_collects_errors() {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("core_runtime");
        std::fs::create_dir_all(&fam).unwrap();
        for name in ["b", "a"] {
            std::fs::write(
                fam.join(format!("{name}.yaml")),
                format!("family: core_runtime\nname: {name}\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - disconnect: {{}}\n"),
            )
            .unwrap();
        }
        let all = load_family(dir.path(), "core_runtime").unwrap();
        assert_eq!(
            all.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        std::fs::write(fam.join("c.yaml"), "family: core_runtime\n").unwrap();
        std::fs::write(fam.join("d.yaml"), "nope: 1\n").unwrap();
        let errors = load_family(dir.path(), "core_runtime").unwrap_err();
        assert_eq!(errors.len(), 2);
        assert!(load_family(dir.path(), "engine").is_err());
    }

    #[test]
    fn snippets_of_long_lines_are_bounded() {
        let long = format!("key: [{}bad]", "x, ".repeat(2000));
        let col = long.find("bad").unwrap() as u64 + 1;
        let text = snippet(&format!("a: 1\n{long}\n"), 2, col);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        for l in &lines {
            assert!(l.chars().count() <= SNIPPET_LINE_MAX_CHARS + 8, "{l}");
        }
        // The caret still points at the column.
        let caret = lines[2].chars().position(|c| c == '^').unwrap();
        assert_eq!(
            lines[1].chars().skip(caret).take(3).collect::<String>(),
            "bad"
        );
        // Short lines are shown whole.
        assert_eq!(
            snippet("a: 1\nb: 2\n", 2, 4),
            "1 | a: 1\n2 | b: 2\n  |    ^"
        );
    }

    #[test]
    fn yml_files_and_duplicate_names_are_load_errors() {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("core_runtime");
        std::fs::create_dir(&fam).unwrap();
        let text = VALID.replace("name: sample", "name: x");
        std::fs::write(fam.join("x.yaml"), &text).unwrap();
        assert_eq!(load_family(dir.path(), "core_runtime").unwrap().len(), 1);
        std::fs::write(fam.join("x.yml"), &text).unwrap();
        let errors = load_family(dir.path(), "core_runtime").unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let message = errors[0].to_string();
        assert!(message.contains("x.yml"), "{message}");
        assert!(message.contains("`.yml` is not accepted"), "{message}");
        assert!(
            message.contains(&fam.join("x.yaml").display().to_string()),
            "{message}"
        );
    }

    #[test]
    fn single_use_placeholders_in_sent_values_are_errors() {
        let text = "family: core_runtime
name: x
summary: s
covers: [CR-ADM-001]
sides: [runtime]
steps:
  - handshake: {}
  - runtime: { type: preparation_status, id: p, payload: { admission_handle: $h1, unused: $bound_once } }
  - core: { type: execution_start, id: r, payload: { admission_handle: $hl } }
  - core: { type: execution_start, id: r2, payload: { admission_handle: $h1 } }
  - native: { emit: { run_id: $typo_run } }
";
        let path = Path::new("scenarios/core_runtime/x.yaml");
        let all = |text: &str| {
            parse_scenario(path, text)
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        };
        let err = all(text);
        assert!(
            err.contains(
                "x.yaml:9:5: step 3: `core` frame: placeholder `$hl` appears nowhere else"
            ),
            "{err}"
        );
        assert!(
            err.contains("x.yaml:11:5: step 5: native `emit`: placeholder `$typo_run`"),
            "{err}"
        );
        // Bound once in an expected frame and never used again: legitimate.
        assert!(!err.contains("`$bound_once`"), "{err}");
        assert!(!err.contains("`$h1`"), "{err}");
        // On both sides a frame is also expected (on the other side): not flagged.
        let both = text.replace("sides: [runtime]\n", "");
        let err = all(&both);
        assert!(!err.contains("`$hl`"), "{err}");
        assert!(err.contains("`$typo_run`"), "{err}");
    }
}
