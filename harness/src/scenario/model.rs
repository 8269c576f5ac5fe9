//! The typed scenario model: what a scenario file *means* once loaded and validated.
//!
//! This module owns the in-memory shape of a scenario (sides, parties, steps, launch-time
//! configuration). It never reads files, never parses YAML (that is
//! [`super::loader`]) and never touches sockets or processes; drivers consume these
//! types read-only.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A side of a protocol family that can be the **target** of a scenario run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The Runtime (daemon on the device) is under test; the harness plays Core.
    Runtime,
    /// Core (the gateway) is under test; the harness plays the Runtime.
    Core,
    /// The worker (the Python worker of the worker protocol) is under test; the harness
    /// plays the host.
    Worker,
    /// The worker host is under test; the harness plays the worker.
    Host,
    /// The engine daemon is under test; the harness plays its client.
    Daemon,
    /// The engine client is under test; the harness plays the daemon.
    Client,
    /// A tool plugin is under test; the harness plays its host (plugin family).
    Plugin,
}

impl Side {
    /// Every side, in a stable order.
    pub const ALL: [Side; 7] = [
        Side::Runtime,
        Side::Core,
        Side::Worker,
        Side::Host,
        Side::Daemon,
        Side::Client,
        Side::Plugin,
    ];

    /// The side's name as written in scenarios, goldens and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Runtime => "runtime",
            Side::Core => "core",
            Side::Worker => "worker",
            Side::Host => "host",
            Side::Daemon => "daemon",
            Side::Client => "client",
            Side::Plugin => "plugin",
        }
    }

    /// The other side of the same family (the one the harness plays). `host` is the
    /// worker family's (its other side is `worker`); the plugin family's other side of
    /// `host` comes from its scenario table.
    pub fn opposite(self) -> Side {
        match self {
            Side::Runtime => Side::Core,
            Side::Core => Side::Runtime,
            Side::Worker => Side::Host,
            Side::Host => Side::Worker,
            Side::Daemon => Side::Client,
            Side::Client => Side::Daemon,
            Side::Plugin => Side::Host,
        }
    }

    /// Parses a side name as written in scenarios (`runtime`, `core`).
    pub fn parse(name: &str) -> Option<Side> {
        Side::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The party that acts for this side.
    pub fn party(self) -> Party {
        match self {
            Side::Runtime => Party::Runtime,
            Side::Core => Party::Core,
            Side::Worker => Party::Worker,
            Side::Host => Party::Host,
            Side::Daemon => Party::Daemon,
            Side::Client => Party::Client,
            Side::Plugin => Party::Plugin,
        }
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who acts in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Party {
    /// Core sends the frame.
    Core,
    /// The Runtime sends the frame.
    Runtime,
    /// The Runtime's native agent (driven through the controlled Harness adapter).
    Native,
    /// The worker host sends the message (worker family).
    Host,
    /// The worker sends the message (worker family).
    Worker,
    /// The engine daemon answers (engine family).
    Daemon,
    /// The engine client calls (engine family).
    Client,
    /// The tool plugin answers (plugin family); the host calls as `host`.
    Plugin,
}

impl Party {
    /// The party's name as written in scenarios.
    pub fn as_str(self) -> &'static str {
        match self {
            Party::Core => "core",
            Party::Runtime => "runtime",
            Party::Native => "native",
            Party::Host => "host",
            Party::Worker => "worker",
            Party::Daemon => "daemon",
            Party::Client => "client",
            Party::Plugin => "plugin",
        }
    }

    /// The side this party belongs to when it is the target.
    pub fn side(self) -> Side {
        match self {
            Party::Core => Side::Core,
            Party::Runtime | Party::Native => Side::Runtime,
            Party::Host => Side::Host,
            Party::Worker => Side::Worker,
            Party::Daemon => Side::Daemon,
            Party::Client => Side::Client,
            Party::Plugin => Side::Plugin,
        }
    }
}

impl std::fmt::Display for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One loaded, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Protocol family (`core_runtime`); equals the directory name.
    pub family: String,
    /// Scenario name; equals the file stem.
    pub name: String,
    /// One-line human summary.
    pub summary: String,
    /// Requirement IDs (from `scenarios/requirements/<family>.yaml`) this scenario covers.
    pub covers: Vec<String>,
    /// Sides this scenario runs against; `None` means every side of the family.
    pub sides: Option<Vec<Side>>,
    /// Launch-time settings for the target.
    pub config: ScenarioConfig,
    /// The ordered steps.
    pub steps: Vec<Step>,
    /// Sides the scenario is meant to run on but cannot pass yet, with the reason
    /// (`pending: {core: "..."}`). A pending side is listed, never run and never counted
    /// as passed (the contract test marks it ignored; the CLI prints it as pending).
    pub pending: BTreeMap<Side, String>,
    /// The optional features of the family (`super::families::FamilyTable::features`)
    /// the scenario needs the target to declare (`true`) or to declare unsupported
    /// (`false`, a refusal scenario). A run against a target whose declaration (its
    /// `--features` file, or the wire where the family declares features there) does not
    /// fit is reported `not applicable`, never passed. Empty: runs against every target.
    pub requires: BTreeMap<String, bool>,
    /// The edges of catalog bounds this scenario exercises, by `<requirement ID>/<bound
    /// name>` (`edges: {CR-WS-008/entries: [at, past]}`): `at` sits exactly at the bound
    /// and succeeds, `past` one past it and gets the spec's outcome. The requirement is
    /// one the scenario covers.
    pub edges: BTreeMap<String, Vec<crate::requirements::Edge>>,
    /// The file the scenario was loaded from (for a scenario generated from a value
    /// table, `super::tables`, the table).
    pub path: PathBuf,
}

impl Scenario {
    /// The scenario's identifier, `<family>/<name>` (e.g. `core_runtime/prepare_start_done`).
    pub fn id(&self) -> String {
        format!("{}/{}", self.family, self.name)
    }

    /// Whether the scenario runs when `side` is the target.
    pub fn runs_on(&self, side: Side) -> bool {
        self.sides
            .as_ref()
            .is_none_or(|sides| sides.contains(&side))
    }

    /// The requirement of [`Scenario::requires`] that `declared` (feature → declared
    /// supported) does not meet on `side`, first in name order, as `(feature, required
    /// value)`; a feature `declared` does not name counts as supported, and on a side
    /// other than the family's `feature_side` nothing is judged. `None`: the scenario
    /// applies.
    pub fn unmet_requirement(
        &self,
        side: Side,
        declared: &BTreeMap<String, bool>,
    ) -> Option<(&str, bool)> {
        let judged =
            super::families::table(&self.family).is_some_and(|t| t.feature_side == Some(side));
        if !judged {
            return None;
        }
        self.requires
            .iter()
            .find(|(name, want)| declared.get(*name).copied().unwrap_or(true) != **want)
            .map(|(name, want)| (name.as_str(), *want))
    }

    /// Why the scenario is pending on `side`, if it is (see [`Scenario::pending`]).
    pub fn pending_reason(&self, side: Side) -> Option<&str> {
        self.pending.get(&side).map(String::as_str)
    }

    /// The sides the scenario runs on: its family's sides (in the family's order,
    /// `super::families`) that `sides:` admits.
    pub fn target_sides(&self) -> Vec<Side> {
        let sides: &[Side] = super::families::table(&self.family).map_or(&Side::ALL, |t| t.sides);
        sides.iter().copied().filter(|s| self.runs_on(*s)).collect()
    }
}

/// Launch-time settings the target must honour (`config:`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioConfig {
    /// Merged into the Runtime launch configuration (timers, limits, …).
    #[serde(default)]
    pub runtime: Option<Value>,
    /// Merged into the Core launch configuration.
    #[serde(default)]
    pub core: Option<Value>,
    /// Files and directories created in `CONTRACT_WORKSPACE` before launch.
    #[serde(default)]
    pub workspace: Option<WorkspaceSeed>,
    /// The worker family's launch settings (`role`, `hooks` source files).
    #[serde(default)]
    pub worker: Option<Value>,
    /// The engine family's launch settings (`retained_events`, `snapshot_key`).
    #[serde(default)]
    pub engine: Option<Value>,
    /// The plugin family's launch settings (`env`, `env_omit`: the launch environment
    /// changed on purpose).
    #[serde(default)]
    pub plugin: Option<Value>,
}

/// Files and directories seeded into the target's workspace before launch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSeed {
    /// Relative path → file contents.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Relative paths of (empty) directories.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Files of generated content (for size bounds that literal contents cannot reach).
    #[serde(default)]
    pub generated: Vec<GeneratedFile>,
    /// Relative path → symlink target: a symbolic link created at the path (parents
    /// created). The target is relative, resolved from the link's directory, and stays
    /// inside the workspace; it need not exist.
    #[serde(default)]
    pub symlinks: BTreeMap<String, String>,
}

/// Largest generated workspace file (`config.workspace.generated[].size`): 64 MiB.
pub const GENERATED_FILE_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Largest total size of a scenario's generated workspace files: 256 MiB.
pub const GENERATED_TOTAL_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// One generated workspace file (`config.workspace.generated: [{path, size, seed?,
/// text?}]`): `size` bytes of deterministic content derived from `seed` (see
/// [`GeneratedContent`] and `docs/scenario-format.md`), or, with `text`, a text of exactly
/// `size` bytes (a file at a text bound and one past it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratedFile {
    /// Workspace-relative path (parent directories are created).
    pub path: String,
    /// Size in bytes, at most [`GENERATED_FILE_MAX_BYTES`].
    pub size: u64,
    /// Seed of the content; default 0.
    #[serde(default)]
    pub seed: u64,
    /// A text instead of generated bytes: its `prefix`, then `fill` repeated, cut at
    /// `size` bytes (`seed` is then not given).
    #[serde(default)]
    pub text: Option<GeneratedText>,
}

/// The text of a generated file (`text: {prefix?, fill?}`): `prefix`, then the ASCII
/// character `fill` (default `x`) up to the file's size.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratedText {
    /// The text's start; default empty.
    #[serde(default)]
    pub prefix: String,
    /// One ASCII character repeated after the prefix; default `x`.
    #[serde(default = "default_fill")]
    pub fill: String,
}

fn default_fill() -> String {
    "x".to_string()
}

/// The deterministic content of a generated workspace file: the concatenation of the
/// 8-byte little-endian words `splitmix64(seed + k)` for `k = 0, 1, 2, …` (wrapping
/// addition), cut at the file's size. Documented in `docs/scenario-format.md` so a
/// reviewer (or a third party) can reproduce any byte.
#[derive(Debug, Clone)]
pub struct GeneratedContent {
    seed: u64,
    word: u64,
    /// Bytes of the current word already handed out (8 = fetch the next word).
    used: usize,
}

impl GeneratedContent {
    /// The content stream for `seed`, from its first byte.
    pub fn new(seed: u64) -> Self {
        Self::at(seed, 0)
    }

    /// The content stream for `seed`, from byte `offset`.
    pub fn at(seed: u64, offset: u64) -> Self {
        let word_index = offset / 8;
        // `offset % 8` is below 8, so the cast cannot truncate.
        let used = (offset % 8) as usize;
        let first = seed.wrapping_add(word_index);
        Self {
            seed: first.wrapping_add(1),
            word: Self::splitmix64(first),
            used,
        }
    }

    /// One step of SplitMix64 (Steele, Lea, Flood 2014) applied to `x`.
    pub fn splitmix64(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for byte in buf {
            if self.used == 8 {
                self.word = Self::splitmix64(self.seed);
                self.seed = self.seed.wrapping_add(1);
                self.used = 0;
            }
            *byte = self.word.to_le_bytes()[self.used];
            self.used += 1;
        }
    }
}

/// One raw WebSocket message the harness sends as-is (`send_bytes:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawMessage {
    /// A text message (`{text: ...}`).
    Text(String),
    /// A binary message (`{base64: ...}`, decoded).
    Binary(Vec<u8>),
    /// A text message whose payload is these raw bytes (`{text_base64: ...}`, decoded),
    /// valid UTF-8 or not: the form for testing a receiver's UTF-8 check.
    TextBytes(Vec<u8>),
    /// A frame built like a frame step's (placeholders substituted, `$text` expanded) but
    /// sent without the schema check (`{frame: {...}}`): a frame with a field the type
    /// does not define, or over a bound, that still names the run's real handles.
    Frame(Value),
    /// `{frame: {...}, repeat_key: {path, value?}}`: the frame built and encoded like
    /// `Frame`'s, then written with one member repeated (the one fault a decoder that
    /// refuses duplicate keys must see, in a frame that names the run's real identifiers).
    FrameRepeatingKey {
        /// The frame, as for `Frame`.
        frame: Value,
        /// Which member of the encoded frame is repeated, and with what.
        repeat: RepeatKey,
    },
}

/// `send_bytes: {frame, repeat_key: {path, value?}}`: a member of the encoded frame written
/// twice. `path` names object keys from the encoded frame's root (on the worker family
/// the envelope: `[generation]`, `[message, id]`); its last key is the member repeated,
/// which must exist in an object reached through objects only. The repeat is written
/// right after the member itself, with `value` (placeholders substituted like the
/// frame's) or, without one, the member's own value: then the frame means the same
/// whichever occurrence a lax decoder keeps, so the repetition is its only fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatKey {
    /// Object keys from the encoded frame's root; never empty.
    pub path: Vec<String>,
    /// The repeated member's value; `None`: the member's own.
    pub value: Option<Value>,
}

impl RepeatKey {
    /// `text`, one JSON value holding the member at `path`, written again compactly (key
    /// order kept) with that member repeated right after itself, carrying `value` or its
    /// own. Every key and string is escaped as JSON, so no value can break out of its
    /// member. An error names the path where the frame has no such member.
    pub fn apply(&self, text: &str, value: Option<&Value>) -> Result<String, String> {
        let parsed: Value = serde_json::from_str(text)
            .map_err(|e| format!("the encoded frame is not JSON: {e}"))?;
        let mut out = String::with_capacity(text.len() + 64);
        let mut found = false;
        write_repeating(&parsed, &self.path, value, &mut out, &mut found)?;
        if found {
            Ok(out)
        } else {
            Err(format!(
                "`repeat_key.path` [{}]: the frame has no such member",
                self.path.join(", ")
            ))
        }
    }
}

/// Writes `value` as compact JSON, repeating the member at `path` (see [`RepeatKey`]).
fn write_repeating(
    value: &Value,
    path: &[String],
    extra: Option<&Value>,
    out: &mut String,
    found: &mut bool,
) -> Result<(), String> {
    let json = |v: &Value| serde_json::to_string(v).map_err(|e| e.to_string());
    let Some((head, rest)) = path.split_first() else {
        out.push_str(&json(value)?);
        return Ok(());
    };
    let Value::Object(map) = value else {
        out.push_str(&json(value)?);
        return Ok(());
    };
    out.push('{');
    for (i, (key, member)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let key_json = json(&Value::String(key.clone()))?;
        out.push_str(&key_json);
        out.push(':');
        if key != head {
            out.push_str(&json(member)?);
        } else if rest.is_empty() {
            out.push_str(&json(member)?);
            out.push(',');
            out.push_str(&key_json);
            out.push(':');
            out.push_str(&json(extra.unwrap_or(member))?);
            *found = true;
        } else {
            write_repeating(member, rest, extra, out, found)?;
        }
    }
    out.push('}');
    Ok(())
}

/// `bootstrap:` — the Runtime's bootstrap POST and Core's answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapStep {
    /// Expected (Runtime target) or sent (Core target) request body; default
    /// `{device_id: <launch device ID>}`.
    #[serde(default)]
    pub request: Option<Value>,
    /// Core's answer; default `200` with the harness's defaults.
    #[serde(default)]
    pub response: Option<HttpResponseSpec>,
    /// With Core as the target: the Bearer the harness presents, `daemon` (the device's
    /// daemon credential, the default) or `api_key` (Core's Project API key, which is not
    /// a Runtime credential).
    #[serde(default)]
    pub credential: Option<String>,
    /// With Core as the target: the word the harness writes before the credential in
    /// `Authorization` (default `Bearer`). Any case of `Bearer` must be accepted (an
    /// authentication scheme is case-insensitive); another word refused `401`.
    #[serde(default)]
    pub scheme: Option<String>,
}

/// `connect:` — the Runtime's WebSocket upgrade request and Core's answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectStep {
    /// Expected / sent query parameters (`device_id`, `version`).
    #[serde(default)]
    pub query: Option<Value>,
    /// Core's answer; default `101` (upgrade).
    #[serde(default)]
    pub response: Option<HttpResponseSpec>,
    /// With Core as the target: the word the harness writes before the credential in
    /// `Authorization` (default `Bearer`). Any case of `Bearer` must be accepted (an
    /// authentication scheme is case-insensitive); another word refused `401`.
    #[serde(default)]
    pub scheme: Option<String>,
}

/// An HTTP answer (status and optional JSON body).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpResponseSpec {
    /// HTTP status code.
    pub status: u16,
    /// JSON body (a pattern when Core is the target).
    #[serde(default)]
    pub body: Option<Value>,
}

/// HTTP methods an `api:` call may use.
pub const API_METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

/// Most asynchronous `api:` calls (`await: false`) a scenario may have in flight at once
/// (started and not yet awaited by their `api_result:` step).
pub const API_IN_FLIGHT_MAX: usize = 4;

/// Most query parameters one `api:` call may carry (`call.query`).
pub const API_QUERY_PARAMS_MAX: usize = 16;

/// Longest `api:` call ID (`id: files1`), in bytes.
pub const API_CALL_ID_MAX_BYTES: usize = 64;

/// Most passes of one `repeat:` step: a stream long enough for any bound of the specs
/// (a page, a queue) and short enough that a typo cannot make a run last hours.
pub const REPEAT_TIMES_MAX: u32 = 100_000;

/// `api:` — one call to the target Core's public API and the answer it must give.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiStep {
    /// The request.
    pub call: ApiCall,
    /// The expected answer.
    pub expect: HttpResponseSpec,
    /// Repeat the call (only `GET`, which is safe to repeat) until the answer matches,
    /// within the step deadline: for state Core reaches asynchronously (a Turn becoming
    /// `completed` after `done`). Default `false`: one call, which must match.
    #[serde(default)]
    pub poll: bool,
    /// Name of an asynchronous call (`await: false`), which a later
    /// `api_result: {id}` step awaits. Only together with `await: false`.
    #[serde(default)]
    pub id: Option<String>,
    /// `false` starts the call and goes on with the next step at once (the answer is
    /// awaited and matched by the `api_result:` step naming [`ApiStep::id`]), for calls
    /// Core answers only after the scripted Runtime has acted. Default `true`: the step
    /// waits for the answer.
    #[serde(default = "default_true", rename = "await")]
    pub wait: bool,
}

fn default_true() -> bool {
    true
}

/// `api_result:` — awaits the answer of the asynchronous `api:` call named `id` (within
/// the step deadline) and matches it against that call's `expect`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiResultStep {
    /// The [`ApiStep::id`] of an earlier `api:` step with `await: false`.
    pub id: String,
}

/// The request of an [`ApiStep`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiCall {
    /// HTTP method, upper case (one of [`API_METHODS`]).
    pub method: String,
    /// Path under the base URL, starting with `/v1/`; placeholders are written as
    /// whole path segments (`/v1/turns/$turn`) and substituted.
    pub path: String,
    /// Query parameters (name → value), percent-encoded by the harness and appended to
    /// the path in name order; a value may be a placeholder (substituted). At most
    /// [`API_QUERY_PARAMS_MAX`].
    #[serde(default)]
    pub query: Option<BTreeMap<String, String>>,
    /// JSON body (placeholders substituted, unbound ones minted).
    #[serde(default)]
    pub body: Option<Value>,
    /// The credential presented: `api_key` (Core's Project API key, the default),
    /// `daemon` (the device's daemon credential, which is not a key) or `none` (no
    /// `Authorization` header).
    #[serde(default)]
    pub credential: Option<String>,
    /// The word the harness writes before the credential in
    /// `Authorization` (default `Bearer`). Any case of `Bearer` must be accepted (an
    /// authentication scheme is case-insensitive); another word refused `401`.
    #[serde(default)]
    pub scheme: Option<String>,
}

/// One scenario step.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `core:` / `runtime:` — an Envelope sent by `party` (expected when `party` is the
    /// target, sent by the harness otherwise).
    Frame {
        /// [`Party::Core`] or [`Party::Runtime`].
        party: Party,
        /// The Envelope `{type, id, payload, trace?}` (a pattern; may hold placeholders).
        frame: Value,
    },
    /// `native:` — one control-channel operation on the Runtime's controlled adapter.
    Native {
        /// Operation name (`emit`, `settle`, `await`, …).
        op: String,
        /// The operation's arguments (an object).
        args: Value,
        /// Optional pattern the op's result must match.
        expect: Option<Value>,
    },
    /// `launch:` — the target host launches a worker (worker family, side `host`): the
    /// harness takes that launch, checks it and dials the worker's socket; `args`
    /// (`role`, `token`, `revision`) say what to check and bind. Where the harness
    /// itself launched the worker (side `worker`) it is a no-op.
    Launch {
        /// The step's mapping.
        args: Value,
    },
    /// `worker_stdio:` — the worker the harness plays (worker family, side `host`) writes
    /// `stdout`/`stderr` (text, or `{$text: …}`) on its own standard streams, which the
    /// host must drain; a worker that is the target writes its own.
    WorkerStdio {
        /// The step's mapping (`stdout`, `stderr`).
        args: Value,
    },
    /// `received_by: {id, token}` — the operation `id` (an `execute` or `invoke` the host
    /// sent; worker family, side `host`) went to the worker launched with startup token
    /// `token`, not to another generation (both are patterns, placeholders bound).
    ReceivedBy {
        /// The step's mapping (`id`, `token`).
        args: Value,
    },
    /// `plugin_process:` — a plugin process the harness plays (plugin family, side
    /// `host`) writes `stdout`/`stderr`, exits (`exit`), or its configured executable is
    /// changed (`replace_executable`).
    PluginProcess {
        /// The step's mapping (`process`, `stdout`, `stderr`, `exit`, `replace_executable`).
        args: Value,
    },
    /// `bootstrap:` — the HTTP bootstrap exchange.
    Bootstrap(BootstrapStep),
    /// `connect:` — the WebSocket upgrade exchange.
    Connect(ConnectStep),
    /// `handshake:` — bootstrap + connect (101) + the first heartbeat.
    Handshake {
        /// Heartbeat interval Core announces (default 3 600 000 ms).
        heartbeat_interval_ms: Option<u64>,
    },
    /// `reconnect:` — bootstrap + connect after a connection loss.
    Reconnect {
        /// `within:` — with a Runtime as the target, its bootstrap request must arrive
        /// within this long of the step's start (the upper edge of a reconnect delay;
        /// the lower edge is a `silence:` before the step). `None`: the step timeout.
        /// Not checked where the harness plays the Runtime (it reconnects at once).
        within: Option<Duration>,
    },
    /// `silence:` — the target emits nothing for this long.
    Silence(Duration),
    /// `sleep:` — the harness waits this long and checks nothing: whatever the target
    /// emits meanwhile is left to later steps (a wait that must not depend on the
    /// target's connection, e.g. before proving a stopping target is still alive).
    Sleep(Duration),
    /// `any_order:` — frame expectations that may match in any order (only [`Step::Frame`]).
    AnyOrder(Vec<Step>),
    /// `repeat: {times, steps}` — `steps` in order, `times` times over (1 to
    /// [`REPEAT_TIMES_MAX`]): a long stream written once (101 events, to read a default
    /// page of 100). A placeholder bound in the first pass compares in the later ones.
    /// Holds frame, `send_bytes`, `api`, `api_result`, `native`, `silence` and `sleep`
    /// steps only.
    Repeat {
        /// How many passes (at least 1).
        times: u32,
        /// The steps of one pass.
        steps: Vec<Step>,
    },
    /// `optional:` — one frame (only [`Step::Frame`]) the spec calls typical but does not
    /// require. Of the target's frames: it may arrive before the next frame a later step
    /// expects (then it must match, and is recorded), or not at all; of a party the
    /// harness plays: the harness sends it.
    Optional(Box<Step>),
    /// `tolerated:` — one frame (only [`Step::Frame`]) another conformant implementation
    /// may send where our reference sends nothing (a `preparing` status of a Runtime that
    /// prepares a new Executor where ours reuses one). Of the target's frames: like
    /// `optional:`; of a party the harness plays: the harness does not send it.
    Tolerated(Box<Step>),
    /// `reference:` — steps that assert our reference implementation's behaviour where
    /// the spec leaves a choice (the catalog entry `requirement` is `level: reference`).
    /// In strict mode (our own runs) they are ordinary steps; in vendor mode a failure
    /// inside them ends the run as a difference from the reference, not a failure.
    Reference {
        /// The catalog entry the steps assert.
        requirement: String,
        /// The steps.
        steps: Vec<Step>,
        /// The sides on which the steps are our reference's (`sides: [runtime]`); on any
        /// other side they are ordinary steps. `None`: every side.
        sides: Option<Vec<Side>>,
    },
    /// `disconnect:` — drop the transport abruptly.
    Disconnect,
    /// `half_close:` — send a Close frame and await the target's reply.
    HalfClose {
        /// Close code to send.
        code: Option<u16>,
        /// Close reason to send.
        reason: Option<String>,
    },
    /// `send_bytes:` — one raw WebSocket message, bypassing schema checks.
    SendBytes(RawMessage),
    /// `expect_close:` — the target closes (code and reason matching these values or
    /// patterns, e.g. `{$reference: 1007, $requirement: CR-FAM-006}`) or drops.
    ExpectClose {
        /// Expected close code: an integer or a pattern.
        code: Option<Value>,
        /// Expected close reason: a string or a pattern.
        reason: Option<Value>,
    },
    /// `api:` — a call to Core's public API (performed only when Core is the target).
    Api(ApiStep),
    /// `api_result:` — awaits and matches the answer of an asynchronous `api:` call
    /// (performed only when Core is the target).
    ApiResult(ApiResultStep),
    /// `crash:` — the target Core is killed with `SIGKILL` (its whole process group) and
    /// started again with the same data directory and environment; the step ends when it
    /// is ready again. Only for scenarios that run on side `core` alone (and the other
    /// sides whose launch contract restarts the target). With `fresh_state` the target
    /// starts again on empty durable state instead (a second machine sharing only the
    /// launch configuration: the engine daemon's configured snapshot key).
    Crash {
        /// Start again on an empty data directory (engine daemon only).
        fresh_state: bool,
    },
    /// `terminate:` — `SIGTERM` to the target's process group, the stop signal a service
    /// manager sends; nothing is awaited (later steps observe what the target does before
    /// it exits, and `expect_exit` its exit).
    Terminate,
    /// `write_workspace:` — files, directories, generated files and symlinks written into
    /// the run's workspace now, while the target runs (the shape of `config.workspace`;
    /// an existing file is overwritten): a change the target must notice or ignore.
    WriteWorkspace(WorkspaceSeed),
    /// `expect_exit:` — the target process exits within the step deadline (with this exit
    /// code, and with `stderr` contained in its stderr tail, when given). Always the last
    /// step; as the first (and only) step it expects the target to refuse to start.
    ExpectExit {
        /// Expected exit code, when given.
        code: Option<ExitCodeSpec>,
        /// Substrings the target's stderr tail must each contain (empty: no check).
        stderr: Vec<String>,
    },
}

/// The exit code an `expect_exit` step expects: `code: 3`, `code: nonzero`, or our
/// reference's code where the spec fixes none: `code: {$reference: 0, $requirement: …}`
/// (checked in strict mode; in vendor mode any exit, a different code a difference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitCodeSpec {
    /// Exactly this code (0..=255).
    Exact(i32),
    /// Any code but 0 (a launch contract that only says "exit non-zero").
    NonZero,
    /// Our reference's code (0..=255), a `level: reference` requirement.
    Reference {
        /// The code our reference exits with.
        code: i32,
        /// The requirement.
        requirement: String,
    },
}

impl ExitCodeSpec {
    /// Whether a process that exited with `code` (`None`: killed by a signal) matches
    /// (for [`ExitCodeSpec::Reference`]: our reference's code).
    pub fn matches(&self, code: Option<i32>) -> bool {
        match self {
            ExitCodeSpec::Exact(want) | ExitCodeSpec::Reference { code: want, .. } => {
                code == Some(*want)
            }
            ExitCodeSpec::NonZero => code.is_some_and(|c| c != 0),
        }
    }
}

impl std::fmt::Display for ExitCodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitCodeSpec::Exact(code) => write!(f, "code {code}"),
            ExitCodeSpec::NonZero => f.write_str("a non-zero code"),
            ExitCodeSpec::Reference { code, requirement } => {
                write!(f, "code {code} (our reference behaviour, {requirement})")
            }
        }
    }
}

impl Step {
    /// The step's key as written in scenarios (`core`, `native`, `silence`, …).
    pub fn keyword(&self) -> &'static str {
        match self {
            Step::Frame { party, .. } => party.as_str(),
            Step::Native { .. } => "native",
            Step::Launch { .. } => "launch",
            Step::WorkerStdio { .. } => "worker_stdio",
            Step::ReceivedBy { .. } => "received_by",
            Step::PluginProcess { .. } => "plugin_process",
            Step::Bootstrap(_) => "bootstrap",
            Step::Connect(_) => "connect",
            Step::Handshake { .. } => "handshake",
            Step::Reconnect { .. } => "reconnect",
            Step::Silence(_) => "silence",
            Step::Sleep(_) => "sleep",
            Step::AnyOrder(_) => "any_order",
            Step::Repeat { .. } => "repeat",
            Step::Optional(_) => "optional",
            Step::Tolerated(_) => "tolerated",
            Step::Reference { .. } => "reference",
            Step::Disconnect => "disconnect",
            Step::HalfClose { .. } => "half_close",
            Step::SendBytes(_) => "send_bytes",
            Step::ExpectClose { .. } => "expect_close",
            Step::Api(_) => "api",
            Step::ApiResult(_) => "api_result",
            Step::Crash { .. } => "crash",
            Step::Terminate => "terminate",
            Step::WriteWorkspace(_) => "write_workspace",
            Step::ExpectExit { .. } => "expect_exit",
        }
    }

    /// A one-line description for failure messages (e.g. `runtime frame preparation_status`).
    pub fn describe(&self) -> String {
        match self {
            Step::Frame { party, frame } => {
                let kind = frame
                    .get("type")
                    .or_else(|| frame.get("kind"))
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                format!("{party} frame {kind}")
            }
            Step::Native { op, .. } => format!("native {op}"),
            Step::Api(api) => format!("api {} {}", api.call.method, api.call.path),
            Step::ApiResult(r) => format!("api_result {}", r.id),
            Step::Silence(d) => format!("silence {}ms", d.as_millis()),
            Step::Sleep(d) => format!("sleep {}ms", d.as_millis()),
            Step::AnyOrder(steps) => format!("any_order of {} frames", steps.len()),
            Step::Repeat { times, steps } => format!("repeat {times}× ({} steps)", steps.len()),
            Step::Optional(inner) => format!("optional {}", inner.describe()),
            Step::Tolerated(inner) => format!("tolerated {}", inner.describe()),
            Step::Reference {
                requirement, steps, ..
            } => {
                format!("reference {requirement} ({} steps)", steps.len())
            }
            other => other.keyword().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn repeat(path: &[&str], value: Option<Value>) -> RepeatKey {
        RepeatKey {
            path: path.iter().map(|k| k.to_string()).collect(),
            value,
        }
    }

    #[test]
    fn repeat_key_writes_the_member_twice_right_after_itself() {
        let text =
            r#"{"version":1,"generation":"g-1","message":{"kind":"completed","id":"c-1","n":1.5}}"#;
        assert_eq!(
            repeat(&["generation"], None).apply(text, None).unwrap(),
            r#"{"version":1,"generation":"g-1","generation":"g-1","message":{"kind":"completed","id":"c-1","n":1.5}}"#
        );
        assert_eq!(
            repeat(&["message", "id"], None).apply(text, None).unwrap(),
            r#"{"version":1,"generation":"g-1","message":{"kind":"completed","id":"c-1","id":"c-1","n":1.5}}"#
        );
        // Another value, escaped as JSON: a quote cannot end the member early.
        let other = json!("a\"b");
        assert_eq!(
            repeat(&["message", "id"], Some(other.clone()))
                .apply(text, Some(&other))
                .unwrap(),
            r#"{"version":1,"generation":"g-1","message":{"kind":"completed","id":"c-1","id":"a\"b","n":1.5}}"#
        );
        assert_eq!(
            repeat(&["message", "n"], Some(Value::Null))
                .apply(text, Some(&Value::Null))
                .unwrap(),
            r#"{"version":1,"generation":"g-1","message":{"kind":"completed","id":"c-1","n":1.5,"n":null}}"#
        );
        // Keys are escaped too.
        assert_eq!(
            repeat(&["a\"b"], None)
                .apply(r#"{"a\"b":[1]}"#, None)
                .unwrap(),
            r#"{"a\"b":[1],"a\"b":[1]}"#
        );
    }

    #[test]
    fn repeat_key_names_a_path_the_frame_does_not_hold() {
        let text = r#"{"generation":"g-1","message":{"kind":"shutdown"}}"#;
        for path in [&["nope"][..], &["message", "id"], &["generation", "x"]] {
            let err = repeat(path, None).apply(text, None).unwrap_err();
            assert!(err.contains("no such member"), "{err}");
        }
        assert!(repeat(&["a"], None).apply("not json", None).is_err());
    }
}
