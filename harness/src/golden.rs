//! Golden snapshots: the one golden format, read and written only here.
//!
//! This module owns normalizing what a target emitted during one scenario run into
//! stable text, comparing it with `golden/<family>/<name>.<side>.golden`, printing a
//! unified diff (via `similar`) and the first differing step and field, and accepting
//! pending goldens. It never touches sockets or processes; the only I/O is reading and
//! writing golden files.
//!
//! # Format
//!
//! ```text
//! # golden: core_runtime/prepare_start_done [runtime target]
//! # Frames the target emitted, normalized: placeholder values as "$name",
//! # generated values as "<key#n>", keys sorted. Review with `make golden-review`.
//!
//! ## step 3 runtime frame
//! {
//!   "id": "prep-1",
//!   "payload": {
//!     "admission_handle": "$h1",
//!     "executor_id": "<executor_id#1>",
//!     "revision": 1,
//!     "status": "preparing"
//!   },
//!   "type": "preparation_status"
//! }
//! ```
//!
//! Normalization: every **string** equal to a bound placeholder's value becomes `"$name"`
//! (non-string bindings are left as emitted, so a placeholder bound to `1` does not
//! rewrite every `1`; a decimal-integer string, proto3 JSON's 64-bit integer `"1"`, is a
//! number too and becomes `"$name"` only at a path (array indexes aside) where that
//! placeholder matched an emitted value, so an event `sequence` bound as `$s1` does not
//! rename an `epoch` or a definition's `revision` that is also `"1"`); every value under a *generated key* (e.g. `executor_id`) not
//! bound to a placeholder becomes an alias `"<key#n>"` numbered in first-seen order, and
//! every other string equal to an aliased value gets the same alias; object keys are
//! sorted at every level. A string longer than [`LONG_STRING_MAX_BYTES`] (a base64 read
//! result, an exported archive) is replaced by a stable summary
//! `"<string: N bytes, sha256 XXXXXXXXXXXXXXXX>"` (the first 16 hex digits of the
//! SHA-256 of its UTF-8 bytes), even when bound to a placeholder, so a golden stays
//! readable while a reviewer still sees any change of the value.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};
use similar::TextDiff;

use crate::bind::Bindings;
use crate::scenario::{Scenario, Side};

/// What kind of emission a golden entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// An HTTP request the target made (bootstrap POST, upgrade request).
    HttpRequest,
    /// An HTTP answer the target gave (bootstrap, upgrade refusal, public API call).
    HttpResponse,
    /// A WebSocket data frame.
    Frame,
    /// A WebSocket close (code and reason) or a dropped connection.
    Close,
    /// The target process exited (`{exit_code}` or `{signal}`).
    Exit,
}

impl EntryKind {
    /// Short name (`http_request`, `http_response`, `frame`, `close`, `exit`).
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::HttpRequest => "http_request",
            EntryKind::HttpResponse => "http_response",
            EntryKind::Frame => "frame",
            EntryKind::Close => "close",
            EntryKind::Exit => "exit",
        }
    }
}

/// One emission of the target.
#[derive(Debug, Clone, PartialEq)]
pub struct GoldenEntry {
    /// 1-based index of the scenario step during which it was observed.
    pub step: usize,
    /// Human label, e.g. `runtime frame`, `bootstrap request`, `close`.
    pub label: String,
    /// What was emitted.
    pub kind: EntryKind,
    /// The emitted value as JSON (frame, request summary, `{code, reason}`).
    pub body: Value,
}

/// Every emission of the target during one run, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    /// The entries in emission order.
    pub entries: Vec<GoldenEntry>,
    /// Every frame both ways, in order, with the time since the run started (never in a
    /// golden: `run --wire-log DIR` writes it): `{t_ms, step, dir, label, body}`.
    pub wire: Vec<Value>,
}

impl Recording {
    /// An empty recording.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one entry.
    pub fn push(&mut self, entry: GoldenEntry) {
        self.entries.push(entry);
    }
}

/// Longest string (bytes) a golden shows verbatim; longer ones are summarized by
/// [`summarize_long_string`].
pub const LONG_STRING_MAX_BYTES: usize = 512;

/// Hex digits of the SHA-256 a long-string summary shows.
const SUMMARY_SHA256_HEX_DIGITS: usize = 16;

/// The golden summary of a string longer than [`LONG_STRING_MAX_BYTES`]:
/// `<string: N bytes, sha256 XXXXXXXXXXXXXXXX>` (length in bytes, the first 16 hex digits
/// of the SHA-256 of the UTF-8 bytes); `None` for a string short enough to show.
pub fn summarize_long_string(text: &str) -> Option<String> {
    if text.len() <= LONG_STRING_MAX_BYTES {
        return None;
    }
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(SUMMARY_SHA256_HEX_DIGITS);
    for byte in digest.iter().take(SUMMARY_SHA256_HEX_DIGITS / 2) {
        let _ = write!(hex, "{byte:02x}");
    }
    Some(format!("<string: {} bytes, sha256 {hex}>", text.len()))
}

/// Keys whose values the target generates (IDs, handles) and which goldens alias.
pub const CORE_RUNTIME_GENERATED_KEYS: &[&str] = &[
    "executor_id",
    "admission_handle",
    "run_id",
    "session_id",
    "connection_id",
    "traceparent",
    "tracestate",
];

/// Renders `recording` as normalized golden text (see the module docs).
pub fn render(
    scenario: &Scenario,
    side: Side,
    recording: &Recording,
    bindings: &Bindings,
    generated_keys: &[&str],
) -> String {
    let mut norm = Normalizer {
        bindings,
        generated_keys,
        aliases: BTreeMap::new(),
        counters: BTreeMap::new(),
    };
    for entry in &recording.entries {
        norm.collect(&entry.body, None, "$");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# golden: {} [{} target]",
        scenario.id(),
        side.as_str()
    );
    out.push_str(
        "# Frames the target emitted, normalized: placeholder values as \"$name\",\n\
         # generated values as \"<key#n>\", keys sorted. Review with `make golden-review`.\n",
    );
    if recording.entries.is_empty() {
        out.push_str("\n(no emissions)\n");
    }
    for entry in &recording.entries {
        let body = norm.normalize(&entry.body, None, "$");
        let pretty = serde_json::to_string_pretty(&body).unwrap_or_else(|_| "null".into());
        let _ = write!(
            out,
            "\n## step {} {}\n{}\n",
            entry.step, entry.label, pretty
        );
    }
    out
}

struct Normalizer<'a> {
    bindings: &'a Bindings,
    generated_keys: &'a [&'a str],
    /// Emitted scalar (as compact JSON) → alias.
    aliases: BTreeMap<String, String>,
    counters: BTreeMap<String, usize>,
}

impl Normalizer<'_> {
    fn scalar_key(value: &Value) -> Option<String> {
        match value {
            Value::String(_) | Value::Number(_) => serde_json::to_string(value).ok(),
            _ => None,
        }
    }

    /// First pass: assign aliases to generated values in first-seen order.
    fn collect(&mut self, value: &Value, key: Option<&str>, path: &str) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    self.collect(v, Some(k), &crate::matcher::child_path(path, k));
                }
            }
            Value::Array(items) => {
                let item_path = format!("{path}[]");
                for item in items {
                    self.collect(item, key, &item_path);
                }
            }
            scalar => {
                let Some(key) = key.filter(|k| self.generated_keys.contains(k)) else {
                    return;
                };
                if matches!(scalar, Value::String(_))
                    && self.bindings.name_at(scalar, path).is_some()
                {
                    return;
                }
                let Some(id) = Self::scalar_key(scalar) else {
                    return;
                };
                if !self.aliases.contains_key(&id) {
                    let n = self.counters.entry(key.to_string()).or_insert(0);
                    *n += 1;
                    self.aliases.insert(id, format!("<{key}#{n}>"));
                }
            }
        }
    }

    /// Second pass: substitute names and aliases; sort keys.
    fn normalize(&self, value: &Value, key: Option<&str>, path: &str) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for k in keys {
                    out.insert(
                        k.clone(),
                        self.normalize(&map[k], Some(k), &crate::matcher::child_path(path, k)),
                    );
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                let item_path = format!("{path}[]");
                Value::Array(
                    items
                        .iter()
                        .map(|v| self.normalize(v, key, &item_path))
                        .collect(),
                )
            }
            Value::String(text) => {
                if let Some(summary) = summarize_long_string(text) {
                    return Value::String(summary);
                }
                if let Some(name) = self.bindings.name_at(value, path) {
                    return Value::String(format!("${name}"));
                }
                Self::scalar_key(value)
                    .and_then(|id| self.aliases.get(&id))
                    .map_or_else(|| value.clone(), |a| Value::String(a.clone()))
            }
            Value::Number(_) if key.is_some_and(|k| self.generated_keys.contains(&k)) => {
                Self::scalar_key(value)
                    .and_then(|id| self.aliases.get(&id))
                    .map_or_else(|| value.clone(), |a| Value::String(a.clone()))
            }
            other => other.clone(),
        }
    }
}

/// What to do when a golden is missing or differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoldenMode {
    /// Compare only; a missing or different golden fails (CI).
    Check,
    /// Write the emitted text as the golden (`make golden-accept`).
    Accept,
    /// Compare; on a difference write `<golden>.pending` for review (the run still fails).
    Pending,
}

/// Result of comparing one run with its golden.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoldenOutcome {
    /// The golden equals the emitted text.
    Matched,
    /// The golden was (re)written ([`GoldenMode::Accept`]).
    Written,
    /// No golden exists (in [`GoldenMode::Pending`] a `.pending` file was written).
    Missing,
    /// The golden differs (in [`GoldenMode::Pending`] a `.pending` file was written).
    Mismatch {
        /// Unified diff, `--- golden` / `+++ emitted`, 3 lines of context.
        diff: String,
        /// E.g. `step 5 field $.payload.revision: golden 1, now 2`.
        first_difference: String,
    },
}

impl GoldenOutcome {
    /// Whether the run passes with this outcome.
    pub fn is_ok(&self) -> bool {
        matches!(self, GoldenOutcome::Matched | GoldenOutcome::Written)
    }

    /// A failure description (`None` when [`Self::is_ok`]).
    pub fn failure(&self, path: &Path) -> Option<String> {
        match self {
            GoldenOutcome::Matched | GoldenOutcome::Written => None,
            GoldenOutcome::Missing => Some(format!(
                "golden {} is missing; run with --pending and `contract-harness golden accept \
                 --golden-dir {}` (or --accept)",
                path.display(),
                golden_root(path).display()
            )),
            GoldenOutcome::Mismatch {
                diff,
                first_difference,
            } => Some(format!(
                "golden {} differs: {first_difference}\n{diff}",
                path.display()
            )),
        }
    }
}

/// The golden root of a [`golden_path`] (`<dir>` of `<dir>/<family>/<file>`); the path
/// itself when it is too short to have one.
pub fn golden_root(path: &Path) -> &Path {
    path.parent().and_then(Path::parent).unwrap_or(path)
}

/// `<dir>/<family>/<name>.<side>.golden`.
pub fn golden_path(dir: &Path, family: &str, name: &str, side: Side) -> PathBuf {
    dir.join(family)
        .join(format!("{name}.{}.golden", side.as_str()))
}

/// The `.pending` companion of a golden path.
pub fn pending_path(golden: &Path) -> PathBuf {
    let mut name = golden.as_os_str().to_os_string();
    name.push(".pending");
    PathBuf::from(name)
}

fn normalize_newlines(text: &str) -> String {
    let mut t = text.replace("\r\n", "\n");
    if !t.ends_with('\n') {
        t.push('\n');
    }
    t
}

fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)
}

/// Compares `rendered` with the golden at `path` and acts per `mode`.
///
/// # Errors
/// I/O errors reading or writing golden files (a missing golden is not an error).
pub fn check_golden(
    path: &Path,
    rendered: &str,
    mode: GoldenMode,
) -> std::io::Result<GoldenOutcome> {
    let rendered = normalize_newlines(rendered);
    let pending = pending_path(path);
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(normalize_newlines(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if existing.as_deref() == Some(rendered.as_str()) {
        if mode != GoldenMode::Check && pending.exists() {
            std::fs::remove_file(&pending)?;
        }
        return Ok(GoldenOutcome::Matched);
    }
    match mode {
        GoldenMode::Accept => {
            write_file(path, &rendered)?;
            if pending.exists() {
                std::fs::remove_file(&pending)?;
            }
            return Ok(GoldenOutcome::Written);
        }
        GoldenMode::Pending => write_file(&pending, &rendered)?,
        GoldenMode::Check => {}
    }
    Ok(match existing {
        None => GoldenOutcome::Missing,
        Some(golden) => GoldenOutcome::Mismatch {
            diff: unified_diff(&golden, &rendered),
            first_difference: first_difference(&golden, &rendered),
        },
    })
}

/// Unified diff of two golden texts (`--- golden`, `+++ emitted`, context 3).
pub fn unified_diff(golden: &str, emitted: &str) -> String {
    TextDiff::from_lines(golden, emitted)
        .unified_diff()
        .context_radius(3)
        .header("golden", "emitted")
        .to_string()
}

/// One `## step N label` section of a golden text.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedEntry {
    /// The header after `## ` (e.g. `step 3 runtime frame`).
    pub header: String,
    /// The JSON body text.
    pub body: String,
}

/// Splits golden text into its entries (header comments are skipped).
pub fn parse_entries(text: &str) -> Vec<ParsedEntry> {
    let mut entries: Vec<ParsedEntry> = Vec::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("## ") {
            entries.push(ParsedEntry {
                header: header.to_string(),
                body: String::new(),
            });
        } else if let Some(entry) = entries.last_mut() {
            entry.body.push_str(line);
            entry.body.push('\n');
        }
    }
    for entry in &mut entries {
        entry.body = entry.body.trim().to_string();
    }
    entries
}

/// A one-line description of the first difference between two golden texts, naming the
/// step and the JSON field (`step 5 field $.payload.revision: golden 1, now 2`).
pub fn first_difference(golden: &str, emitted: &str) -> String {
    let old = parse_entries(golden);
    let new = parse_entries(emitted);
    for (i, (o, n)) in old.iter().zip(&new).enumerate() {
        if o == n {
            continue;
        }
        if o.header != n.header {
            return format!("entry {}: golden `{}`, now `{}`", i + 1, o.header, n.header);
        }
        let place = o.header.split(' ').take(2).collect::<Vec<_>>().join(" ");
        return match (
            serde_json::from_str::<Value>(&o.body),
            serde_json::from_str::<Value>(&n.body),
        ) {
            (Ok(ov), Ok(nv)) => {
                let mut changes = Vec::new();
                crate::changes::field_changes("$", &ov, &nv, &mut changes);
                match changes.first() {
                    Some(c) => format!(
                        "{place} field {}: golden {}, now {}",
                        c.path,
                        show(c.old.as_ref()),
                        show(c.new.as_ref())
                    ),
                    None => format!("{place}: formatting differs"),
                }
            }
            _ => format!("{place}: body differs"),
        };
    }
    match old.len().cmp(&new.len()) {
        std::cmp::Ordering::Less => format!(
            "extra emission `{}` (golden has {} entries, now {})",
            new[old.len()].header,
            old.len(),
            new.len()
        ),
        std::cmp::Ordering::Greater => format!(
            "missing emission `{}` (golden has {} entries, now {})",
            old[new.len()].header,
            old.len(),
            new.len()
        ),
        std::cmp::Ordering::Equal => "header or formatting differs".to_string(),
    }
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(
        || "(absent)".to_string(),
        |v| serde_json::to_string(v).unwrap_or_default(),
    )
}

/// Every `*.pending` file under `dir` (recursively), sorted.
pub fn pending_files(dir: &Path) -> Vec<PathBuf> {
    files_with_extension(dir, "pending")
}

/// Every file under `dir` (recursively) whose extension is `extension`, sorted.
pub fn files_with_extension(dir: &Path, extension: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, extension: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, extension, out);
            } else if path.extension().is_some_and(|e| e == extension) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, extension, &mut out);
    out.sort();
    out
}

/// Renames every pending golden under `dir` over its golden; returns the goldens written.
///
/// # Errors
/// The first rename failure.
pub fn accept_pending(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut accepted = Vec::new();
    for pending in pending_files(dir) {
        let golden = pending.with_extension("");
        std::fs::rename(&pending, &golden)?;
        accepted.push(golden);
    }
    Ok(accepted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{ScenarioConfig, Step};
    use serde_json::json;

    fn scenario() -> Scenario {
        Scenario {
            pending: Default::default(),
            requires: Default::default(),
            edges: Default::default(),
            family: "core_runtime".into(),
            name: "prep".into(),
            summary: "s".into(),
            covers: vec!["CR-A-001".into()],
            sides: None,
            config: ScenarioConfig::default(),
            steps: vec![Step::Disconnect],
            path: "scenarios/core_runtime/prep.yaml".into(),
        }
    }

    fn recording(revision: u64) -> (Recording, Bindings) {
        let mut b = Bindings::new();
        b.bind("h1", json!("adm-9f2c")).unwrap();
        b.bind("rev", json!(1)).unwrap();
        let mut r = Recording::new();
        r.push(GoldenEntry {
            step: 2,
            label: "bootstrap request".into(),
            kind: EntryKind::HttpRequest,
            body: json!({"device_id": "dev-1"}),
        });
        r.push(GoldenEntry {
            step: 5,
            label: "runtime frame".into(),
            kind: EntryKind::Frame,
            body: json!({
                "type": "preparation_status",
                "id": "prep-1",
                "payload": {
                    "status": "preparing",
                    "revision": revision,
                    "executor_id": "ex-77",
                    "admission_handle": "adm-9f2c",
                    "count": 1
                }
            }),
        });
        r.push(GoldenEntry {
            step: 6,
            label: "runtime frame".into(),
            kind: EntryKind::Frame,
            body: json!({"type": "done", "id": "ex-77", "payload": {"executor_id": "ex-78"}}),
        });
        (r, b)
    }

    const EXPECTED: &str = r#"# golden: core_runtime/prep [runtime target]
# Frames the target emitted, normalized: placeholder values as "$name",
# generated values as "<key#n>", keys sorted. Review with `make golden-review`.

## step 2 bootstrap request
{
  "device_id": "dev-1"
}

## step 5 runtime frame
{
  "id": "prep-1",
  "payload": {
    "admission_handle": "$h1",
    "count": 1,
    "executor_id": "<executor_id#1>",
    "revision": 1,
    "status": "preparing"
  },
  "type": "preparation_status"
}

## step 6 runtime frame
{
  "id": "<executor_id#1>",
  "payload": {
    "executor_id": "<executor_id#2>"
  },
  "type": "done"
}
"#;

    #[test]
    fn render_normalizes() {
        let (r, b) = recording(1);
        let text = render(
            &scenario(),
            Side::Runtime,
            &r,
            &b,
            CORE_RUNTIME_GENERATED_KEYS,
        );
        assert_eq!(text, EXPECTED);
    }

    #[test]
    fn decimal_strings_are_named_only_where_their_placeholder_matched() {
        let mut b = Bindings::new();
        crate::matcher::match_frame(
            &json!({"message": {"initialSequence": "$s1", "runId": "$run"}}),
            &json!({"message": {"initialSequence": "1", "runId": "run-7"}}),
            &mut b,
        )
        .unwrap();
        let mut r = Recording::new();
        r.push(GoldenEntry {
            step: 3,
            label: "daemon message".into(),
            kind: EntryKind::Frame,
            body: json!({"message": {"initialSequence": "1", "runId": "run-7",
                "session": {"epoch": "1", "clientId": "run-7"}, "revision": "1"}}),
        });
        let text = render(&scenario(), Side::Daemon, &r, &b, &[]);
        let body = text.split_once("## step 3 daemon message\n").unwrap().1;
        let shown: Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            shown,
            json!({"message": {"initialSequence": "$s1", "runId": "$run",
                "session": {"epoch": "1", "clientId": "$run"}, "revision": "1"}})
        );
    }

    #[test]
    fn long_strings_are_summarized() {
        assert_eq!(
            summarize_long_string(&"a".repeat(LONG_STRING_MAX_BYTES)),
            None
        );
        let long = "a".repeat(LONG_STRING_MAX_BYTES + 1);
        // sha256("a" * 513) starts with these 16 hex digits (computed independently).
        let expected_hex = "02425c0f5b0dabf3";
        assert_eq!(
            summarize_long_string(&long).unwrap(),
            format!("<string: 513 bytes, sha256 {expected_hex}>")
        );
        // A one-character change shows as a different summary.
        let mut changed = long.clone();
        changed.replace_range(0..1, "b");
        assert_ne!(
            summarize_long_string(&long),
            summarize_long_string(&changed)
        );

        let mut b = Bindings::new();
        b.bind("data", json!(long)).unwrap();
        let mut r = Recording::new();
        r.push(GoldenEntry {
            step: 3,
            label: "runtime frame".into(),
            kind: EntryKind::Frame,
            body: json!({"type": "workspace_read_result", "id": "op-1", "payload": {
                "data": long, "other": [changed], "status": "ok"
            }}),
        });
        let text = render(&scenario(), Side::Runtime, &r, &b, &[]);
        assert!(
            text.contains(&format!(
                "\"data\": \"<string: 513 bytes, sha256 {expected_hex}>\""
            )),
            "{text}"
        );
        assert!(text.contains("\"<string: 513 bytes, sha256 "), "{text}");
        assert!(!text.contains(&"a".repeat(100)), "{text}");
        assert!(!text.contains("$data"), "{text}");
    }

    #[test]
    fn modes_and_diff() {
        let dir = tempfile::tempdir().unwrap();
        let path = golden_path(dir.path(), "core_runtime", "prep", Side::Runtime);
        assert!(path.ends_with("core_runtime/prep.runtime.golden"));
        let (r, b) = recording(1);
        let text = render(
            &scenario(),
            Side::Runtime,
            &r,
            &b,
            CORE_RUNTIME_GENERATED_KEYS,
        );

        assert_eq!(
            check_golden(&path, &text, GoldenMode::Check).unwrap(),
            GoldenOutcome::Missing
        );
        assert!(!path.exists());
        assert_eq!(
            check_golden(&path, &text, GoldenMode::Pending).unwrap(),
            GoldenOutcome::Missing
        );
        assert_eq!(pending_files(dir.path()), vec![pending_path(&path)]);
        assert_eq!(accept_pending(dir.path()).unwrap(), vec![path.clone()]);
        assert!(pending_files(dir.path()).is_empty());
        assert_eq!(
            check_golden(&path, &text, GoldenMode::Check).unwrap(),
            GoldenOutcome::Matched
        );

        let (r2, b2) = recording(2);
        let changed = render(
            &scenario(),
            Side::Runtime,
            &r2,
            &b2,
            CORE_RUNTIME_GENERATED_KEYS,
        );
        let outcome = check_golden(&path, &changed, GoldenMode::Check).unwrap();
        let GoldenOutcome::Mismatch {
            diff,
            first_difference,
        } = &outcome
        else {
            panic!("{outcome:?}");
        };
        assert_eq!(
            first_difference,
            "step 5 field $.payload.revision: golden 1, now 2"
        );
        assert!(diff.contains("--- golden\n+++ emitted\n"), "{diff}");
        assert!(
            diff.contains("-    \"revision\": 1,\n+    \"revision\": 2,"),
            "{diff}"
        );
        assert!(
            outcome
                .failure(&path)
                .unwrap()
                .contains("step 5 field $.payload.revision")
        );

        assert_eq!(
            check_golden(&path, &changed, GoldenMode::Pending).unwrap(),
            outcome
        );
        assert!(pending_path(&path).exists());
        assert_eq!(
            check_golden(&path, &changed, GoldenMode::Accept).unwrap(),
            GoldenOutcome::Written
        );
        assert!(!pending_path(&path).exists());
        assert_eq!(
            check_golden(&path, &changed, GoldenMode::Check).unwrap(),
            GoldenOutcome::Matched
        );
    }

    #[test]
    fn first_difference_names_extra_and_missing_entries() {
        let (r, b) = recording(1);
        let full = render(&scenario(), Side::Runtime, &r, &b, &[]);
        let mut short = r.clone();
        short.entries.pop();
        let less = render(&scenario(), Side::Runtime, &short, &b, &[]);
        assert!(
            first_difference(&less, &full).starts_with("extra emission `step 6 runtime frame`")
        );
        assert!(
            first_difference(&full, &less).starts_with("missing emission `step 6 runtime frame`")
        );
        let parsed = parse_entries(&full);
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0].header, "step 2 bootstrap request");
    }

    #[test]
    fn missing_golden_names_the_commands_that_write_it() {
        let path = golden_path(Path::new("my-goldens"), "core_runtime", "x", Side::Runtime);
        let text = GoldenOutcome::Missing.failure(&path).unwrap();
        assert!(
            text.contains("run with --pending and `contract-harness golden accept --golden-dir my-goldens` (or --accept)"),
            "{text}"
        );
        assert!(!text.contains("make golden-accept"), "{text}");
    }
}
