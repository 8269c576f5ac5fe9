//! Value tables: every identifier and value rule of a family's wire, generated from one
//! table instead of written by hand.
//!
//! `scenarios/tables/<family>.values.yaml` holds one row per identifier-bearing or
//! unsigned-integer field the receiver decodes: the field's kind (an opaque identifier
//! with a byte bound, a UUID, an unsigned integer), the steps that bring the target to
//! the point where it reads the field, the frame that carries it (with `$value` in its
//! slot), what an accepted value must produce and (by default the table's) what a refused
//! one must produce. [`load_table`] expands every row into one ordinary [`Scenario`] per
//! case of its kind (`value_<row>_<case>`: empty, one byte, exactly the bound, one past
//! it, a control character, a wrong JSON type; the non-canonical forms of a UUID; a
//! negative, fractional or quoted integer, the largest one and one past it), each
//! through the same loader and validation as a scenario file, so the runner, goldens,
//! `--filter` and `coverage` see them like any other. The format is documented in
//! `docs/scenario-format.md` ("Value tables").
//!
//! This module only reads and generates; it never runs anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use serde_saphyr::{Location, Spanned};

use super::families;
use super::loader::{LoadError, parse_scenario, parse_yaml};
use super::model::{Party, Scenario, Side};
use crate::requirements::Edge;

/// The directory under the scenario root that holds the value tables.
pub const TABLES_DIR: &str = "tables";

/// A family's value table: `<scenario root>/tables/<family>.values.yaml`.
pub fn table_path(root: &Path, family: &str) -> PathBuf {
    root.join(TABLES_DIR).join(format!("{family}.values.yaml"))
}

/// Every generated scenario's name starts with this.
pub const NAME_PREFIX: &str = "value_";

/// The slot a row's frame and expectations name the case's value with.
pub const VALUE_SLOT: &str = "$value";

/// The one-byte value of an identifier's `min` case.
pub const MIN_ID: &str = "x";

/// Largest `max` an `id` kind may have: its cases are strings of that many bytes, and
/// no wire field is longer than one 4 MiB transport frame.
pub const ID_MAX_CAP_BYTES: u64 = 4 * 1024 * 1024;

/// The multi-byte character an identifier's `max` and `past` cases are made of (two
/// bytes in UTF-8, one character): a receiver that counts characters instead of bytes
/// accepts the `past` case.
pub const WIDE_CHAR: char = 'é';

/// The control character of an identifier's `control` case (ESC, U+001B).
pub const CONTROL_CHAR: char = '\u{1b}';

/// DEL (U+007F), a control character outside the C0 range.
pub const DELETE_CHAR: char = '\u{7f}';

/// NEL (U+0085), a C1 control character.
pub const C1_CONTROL_CHAR: char = '\u{85}';

// ---------------------------------------------------------------------------------------
// The table as written.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    family: Spanned<String>,
    kinds: BTreeMap<String, Spanned<RawKind>>,
    refuse: Vec<Value>,
    #[serde(default)]
    setups: BTreeMap<String, RawSetup>,
    rows: Vec<Spanned<RawRow>>,
}

/// The value type of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueType {
    /// An opaque identifier: a JSON string of 1..=`max` bytes of UTF-8, no control
    /// character.
    Id,
    /// A canonical UUID (lower-case hex, hyphenated).
    Uuid,
    /// An unsigned integer: a JSON integer in 0..=`max`.
    Uint,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKind {
    #[serde(rename = "type")]
    ty: ValueType,
    #[serde(default)]
    max: Option<u64>,
    #[serde(default)]
    requirement: Option<String>,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    bound: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSetup {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    steps: Vec<Value>,
}

/// The most setups one chain of `from:` may hold (a longer one is a cycle).
const SETUP_CHAIN_MAX: usize = 16;

/// The setup `name` resolved through its `from:` chain: its config (the nearest one
/// given) and every step, the base's first.
fn resolve_setup(
    setups: &BTreeMap<String, RawSetup>,
    name: &str,
) -> Result<(Option<Value>, Vec<Value>), String> {
    let mut chain = Vec::new();
    let mut next = Some(name);
    while let Some(n) = next {
        if chain.len() == SETUP_CHAIN_MAX {
            return Err(format!("setup `{name}`: its `from:` chain is a cycle"));
        }
        let setup = setups
            .get(n)
            .ok_or_else(|| format!("unknown setup `{n}`"))?;
        chain.push(setup);
        next = setup.from.as_deref();
    }
    let config = chain.iter().find_map(|s| s.config.clone());
    let steps = chain
        .iter()
        .rev()
        .flat_map(|s| s.steps.iter().cloned())
        .collect();
    Ok((config, steps))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRow {
    row: String,
    field: String,
    kind: String,
    covers: Vec<String>,
    #[serde(default)]
    setup: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    steps: Vec<Value>,
    send: Value,
    #[serde(default)]
    valid: Option<Value>,
    #[serde(default)]
    max: bool,
    #[serde(default)]
    accept_config: Option<Value>,
    accept: Vec<Value>,
    #[serde(default)]
    refuse: Option<Vec<Value>>,
}

// ---------------------------------------------------------------------------------------
// Kinds and their cases.

/// One kind of value (`kinds:` of the table): its type, bound and the requirements its
/// rules belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    /// The value type.
    pub ty: ValueType,
    /// `id`: the byte bound; `uint`: the largest value.
    pub max: Option<u64>,
    /// A required rule every case of the kind exercises (listed in `covers:`).
    pub requirement: Option<String>,
    /// The reference requirement of the kind's rules where they are our choice: the
    /// outcome of every refused case and of the `max` case is asserted inside a
    /// `reference:` group of it.
    pub reference: Option<String>,
    /// The catalog bound (`bounds:` name of `reference`, else `requirement`) the `max`
    /// and `past` cases sit at and past.
    pub bound: Option<String>,
}

impl Kind {
    /// `<requirement>/<bound>`, the key of the `edges:` the `max` and `past` cases name.
    pub fn edge_key(&self) -> Option<String> {
        let owner = self.reference.as_ref().or(self.requirement.as_ref())?;
        Some(format!("{owner}/{}", self.bound.as_ref()?))
    }
}

/// One generated case of a row.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The case name (the suffix of the scenario name).
    pub name: &'static str,
    /// The value in the slot.
    pub value: Value,
    /// Whether the receiver must accept it.
    pub accepted: bool,
    /// Whether the outcome is the kind's reference choice (a refusal, or the largest
    /// value accepted), asserted inside a `reference:` group of [`Kind::reference`].
    pub choice: bool,
    /// The edge of the kind's bound this case sits on.
    pub edge: Option<Edge>,
    /// What the value is, for the summary.
    pub describe: String,
}

fn case(name: &'static str, value: Value, accepted: bool, describe: String) -> Case {
    Case {
        name,
        value,
        accepted,
        choice: !accepted,
        edge: None,
        describe,
    }
}

/// `n` bytes of [`WIDE_CHAR`]s (and one `x` when `n` is odd).
fn wide(n: u64) -> String {
    let mut s: String = std::iter::repeat_n(WIDE_CHAR, (n / 2) as usize).collect();
    if n % 2 == 1 {
        s.push('x');
    }
    s
}

/// The cases of `kind` for a row whose valid value is `valid` (`None`: the field is free,
/// any value of the kind) and, for an unsigned integer, that takes the kind's whole range
/// (`full_range`).
///
/// # Errors
/// What the row must say for its kind (a valid UUID, a valid integer, …).
pub fn cases(kind: &Kind, valid: Option<&Value>, full_range: bool) -> Result<Vec<Case>, String> {
    let mut out = Vec::new();
    match kind.ty {
        ValueType::Id => {
            let max = kind
                .max
                .ok_or("an `id` kind needs `max` (its byte bound)")?;
            if max < 2 {
                return Err("an `id` kind's `max` must be at least 2 bytes".into());
            }
            if max > ID_MAX_CAP_BYTES {
                return Err(format!(
                    "an `id` kind's `max` is at most {ID_MAX_CAP_BYTES} bytes (one transport frame)"
                ));
            }
            if full_range {
                return Err(
                    "`max: true` is for `uint` rows; an identifier's bound is always tested".into(),
                );
            }
            match valid {
                Some(v @ Value::String(_)) => {
                    out.push(case("valid", v.clone(), true, format!("{v}")))
                }
                Some(other) => {
                    return Err(format!(
                        "`valid` of an identifier must be a string, not {other}"
                    ));
                }
                None => {
                    out.push(case("min", Value::from(MIN_ID), true, "1 byte".into()));
                    let mut at = case(
                        "max",
                        Value::from(wide(max)),
                        true,
                        format!(
                            "{max} bytes ({} × \"{WIDE_CHAR}\", two bytes each)",
                            max / 2
                        ),
                    );
                    at.choice = true;
                    at.edge = Some(Edge::At);
                    out.push(at);
                }
            }
            out.push(case(
                "empty",
                Value::from(""),
                false,
                "the empty string".into(),
            ));
            let mut past = case(
                "past",
                Value::from(format!("{}x", wide(max))),
                false,
                format!(
                    "{} bytes ({} characters: a bound counted in characters would let it through)",
                    max + 1,
                    max / 2 + max % 2 + 1
                ),
            );
            past.edge = Some(Edge::Past);
            out.push(past);
            out.push(case(
                "control",
                Value::from(format!("id{CONTROL_CHAR}x")),
                false,
                format!("a control character (U+{:04X})", CONTROL_CHAR as u32),
            ));
            // The rest of Unicode's control category, which a check for the characters
            // below U+0020 alone would let through: DEL and a C1 control.
            for (name, c) in [("delete", DELETE_CHAR), ("c1_control", C1_CONTROL_CHAR)] {
                out.push(case(
                    name,
                    Value::from(format!("id{c}x")),
                    false,
                    format!("a control character (U+{:04X})", c as u32),
                ));
            }
            out.push(case(
                "number",
                Value::from(7),
                false,
                "a number instead of a string".into(),
            ));
        }
        ValueType::Uuid => {
            if full_range {
                return Err("`max: true` is for `uint` rows".into());
            }
            let Some(Value::String(v)) = valid else {
                return Err(
                    "a `uuid` row needs `valid`: the canonical UUID the receiver expects there"
                        .into(),
                );
            };
            let canonical = uuid::Uuid::parse_str(v)
                .map(|u| u.hyphenated().to_string())
                .map_err(|e| format!("`valid` `{v}` is not a UUID: {e}"))?;
            if &canonical != v {
                return Err(format!("`valid` `{v}` is not canonical (`{canonical}`)"));
            }
            let upper = v.to_uppercase();
            if &upper == v {
                return Err(format!(
                    "`valid` `{v}` has no letter, so its upper-case form is itself; use a UUID with hex letters"
                ));
            }
            out.push(case("valid", Value::from(v.as_str()), true, v.clone()));
            out.push(case(
                "upper",
                Value::from(upper),
                false,
                "upper case".into(),
            ));
            out.push(case(
                "braces",
                Value::from(format!("{{{v}}}")),
                false,
                "in braces".into(),
            ));
            out.push(case(
                "no_hyphens",
                Value::from(v.replace('-', "")),
                false,
                "without hyphens".into(),
            ));
            out.push(case(
                "empty",
                Value::from(""),
                false,
                "the empty string".into(),
            ));
            out.push(case(
                "number",
                Value::from(7),
                false,
                "a number instead of a string".into(),
            ));
        }
        ValueType::Uint => {
            let max = kind
                .max
                .ok_or("a `uint` kind needs `max` (its largest value)")?;
            let Some(n) = valid.and_then(Value::as_u64) else {
                return Err(
                    "a `uint` row needs `valid`: an integer the receiver accepts there".into(),
                );
            };
            if n > max {
                return Err(format!("`valid` {n} is above the kind's `max` {max}"));
            }
            out.push(case("valid", Value::from(n), true, n.to_string()));
            if full_range {
                let mut at = case("max", Value::from(max), true, format!("{max}, the largest"));
                at.choice = true;
                at.edge = Some(Edge::At);
                out.push(at);
                // One past the largest u64 is no JSON integer a decoder can hold: it is
                // written as the number it is (2^64, in exponent form).
                let past_value = match max.checked_add(1) {
                    Some(p) => Value::from(p),
                    None => Value::from(2f64.powi(64)),
                };
                let mut past = case("past", past_value, false, format!("{max} + 1"));
                past.edge = Some(Edge::Past);
                out.push(past);
            }
            out.push(case("negative", Value::from(-1), false, "-1".into()));
            out.push(case(
                "fraction",
                Value::from(n as f64 + 0.5),
                false,
                format!("{n}.5"),
            ));
            out.push(case(
                "string",
                Value::from(n.to_string()),
                false,
                format!("\"{n}\" (a string)"),
            ));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Expansion.

/// Key of a choice by outcome: `{$accepted: A, $refused: R}` stands for `A` in the
/// scenarios of accepted values and for `R` in those of refused ones (the answer of a
/// public call in flight when the value is sent, say).
pub const ACCEPTED_KEY: &str = "$accepted";
/// See [`ACCEPTED_KEY`].
pub const REFUSED_KEY: &str = "$refused";

/// `value` for one case: every string that is exactly [`VALUE_SLOT`] replaced by `with`,
/// and every `{$accepted, $refused}` mapping by the branch of `accepted`.
pub fn fill(value: &Value, with: &Value, accepted: bool) -> Value {
    match value {
        Value::String(s) if s == VALUE_SLOT => with.clone(),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| fill(v, with, accepted)).collect())
        }
        Value::Object(map) => match (map.len(), map.get(ACCEPTED_KEY), map.get(REFUSED_KEY)) {
            (2, Some(a), Some(r)) => fill(if accepted { a } else { r }, with, accepted),
            _ => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), fill(v, with, accepted)))
                    .collect(),
            ),
        },
        other => other.clone(),
    }
}

/// Whether `value` holds the slot.
fn has_slot(value: &Value) -> bool {
    match value {
        Value::String(s) => s == VALUE_SLOT,
        Value::Array(items) => items.iter().any(has_slot),
        Value::Object(map) => map.values().any(has_slot),
        _ => false,
    }
}

/// Every requirement `steps` mark as our reference's: `reference: {requirement}` groups
/// and `$requirement` of reference patterns, in order of appearance.
pub fn marked_requirements(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| marked_requirements(v, out)),
        Value::Object(map) => {
            if let Some(Value::String(id)) = map.get("$requirement") {
                out.push(id.clone());
            }
            if let Some(Value::String(id)) = map.get("reference").and_then(|r| r.get("requirement"))
            {
                out.push(id.clone());
            }
            map.values().for_each(|v| marked_requirements(v, out));
        }
        _ => {}
    }
}

/// `value` as YAML text the scenario loader reads back exactly: JSON's flow syntax (a
/// subset of YAML 1.2) with every control character of a string escaped (`\uXXXX`, which
/// YAML's double-quoted scalars share with JSON), so that no raw control byte reaches the
/// YAML reader.
pub fn yaml_text(value: &Value) -> String {
    let mut out = String::new();
    emit(value, &mut out);
    out
}

fn emit(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => emit_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                emit(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                emit_str(k, out);
                out.push_str(": ");
                emit(v, out);
            }
            out.push('}');
        }
    }
}

fn emit_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || c == '\u{feff}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A row checked against its table: everything but the case.
struct Row<'a> {
    raw: &'a RawRow,
    kind: &'a Kind,
    setup_config: Option<Value>,
    setup_steps: Vec<Value>,
    party: Party,
    frame: &'a Value,
    target: Side,
}

/// The scenario document of `case` of `row`, as the loader reads a scenario file.
fn document(table: &Table<'_>, row: &Row<'_>, case: &Case) -> Value {
    let raw = row.raw;
    let mut steps: Vec<Value> = row.setup_steps.clone();
    steps.extend(raw.steps.iter().cloned());
    // A valid value goes as a frame step (the harness's schema check applies), a refused
    // one as raw bytes.
    let send = if case.accepted {
        single(row.party.as_str(), row.frame.clone())
    } else {
        single("send_bytes", single("frame", row.frame.clone()))
    };
    steps.push(send);
    let outcome: Vec<Value> = if case.accepted {
        raw.accept.clone()
    } else {
        raw.refuse.clone().unwrap_or_else(|| table.refuse.to_vec())
    };
    match (&row.kind.reference, case.choice) {
        (Some(requirement), true) => {
            let mut group = Map::new();
            group.insert("requirement".into(), Value::from(requirement.as_str()));
            group.insert("steps".into(), Value::Array(outcome));
            steps.push(single("reference", Value::Object(group)));
        }
        _ => steps.extend(outcome),
    }
    let steps = fill(&Value::Array(steps), &case.value, case.accepted);
    // The setup's config, the row's over it, and for an accepted value `accept_config`
    // over both (a declaration naming the value, which a refused value cannot be in).
    let mut config: Option<Value> = None;
    let accept_config = raw.accept_config.as_ref().filter(|_| case.accepted);
    for layer in [
        row.setup_config.as_ref(),
        raw.config.as_ref(),
        accept_config,
    ]
    .into_iter()
    .flatten()
    {
        config = Some(match config {
            Some(base) => merge(base, layer),
            None => layer.clone(),
        });
    }
    let config = config.map(|c| fill(&c, &case.value, case.accepted));

    let mut covers: Vec<String> = raw.covers.clone();
    // The kind's required rule is covered only by a case whose outcome is asserted
    // outside a reference group: a refusal whose every step is our choice cannot show a
    // vendor's target breaking it (it would only differ).
    let outcome_is_ours = case.choice && row.kind.reference.is_some();
    if !outcome_is_ours {
        covers.extend(row.kind.requirement.clone());
    }
    marked_requirements(&steps, &mut covers);
    let mut seen = BTreeSet::new();
    covers.retain(|c| seen.insert(c.clone()));

    let outcome = if case.accepted {
        format!("{} accepts it", target_name(row.target))
    } else {
        format!("{} refuses the frame", target_name(row.target))
    };
    let summary = format!(
        "Generated from the value table, row `{}`: {} is {}; {outcome}.",
        raw.row, raw.field, case.describe
    );

    let mut doc = Map::new();
    doc.insert("family".into(), Value::from(table.family));
    doc.insert(
        "name".into(),
        Value::from(scenario_name(&raw.row, case.name)),
    );
    doc.insert("summary".into(), Value::from(summary));
    doc.insert("covers".into(), Value::from(covers));
    doc.insert("sides".into(), Value::from(vec![row.target.as_str()]));
    if let Some(config) = config {
        doc.insert("config".into(), config);
    }
    if let (Some(edge), Some(key)) = (case.edge, row.kind.edge_key()) {
        doc.insert(
            "edges".into(),
            single(&key, Value::from(vec![edge.as_str()])),
        );
    }
    doc.insert("steps".into(), steps);
    Value::Object(doc)
}

/// Mappings merged key by key (`over` wins), anything else replaced by `over`: how the
/// launch configuration merges `config:`.
fn merge(base: Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(mut base), Value::Object(over)) => {
            for (k, v) in over {
                let merged = match base.remove(k) {
                    Some(b) => merge(b, v),
                    None => v.clone(),
                };
                base.insert(k.clone(), merged);
            }
            Value::Object(base)
        }
        (_, over) => over.clone(),
    }
}

fn target_name(side: Side) -> &'static str {
    match side {
        Side::Core => "Core",
        Side::Runtime => "the Runtime",
        other => other.as_str(),
    }
}

fn single(key: &str, value: Value) -> Value {
    let mut map = Map::new();
    map.insert(key.into(), value);
    Value::Object(map)
}

/// `value_<row>_<case>`.
pub fn scenario_name(row: &str, case: &str) -> String {
    format!("{NAME_PREFIX}{row}_{case}")
}

/// What every row of a table shares.
struct Table<'a> {
    family: &'a str,
    refuse: &'a [Value],
}

/// Loads the value table at `path` for `family` and expands every row into its
/// scenarios (each loaded and validated like a scenario file of `family`), sorted by
/// name. A generated scenario's `path` is the table's; on the family's feature side its
/// `requires:` is what its frames exercise
/// ([`families::FamilyTable::implied_features`]).
///
/// # Errors
/// A missing field is reported by the YAML decoder where its mapping ended: the next
/// row, or the end of the file. Inside `rows:`, it is moved to the `- row:` line of the
/// row that lacks it, named in the message.
fn at_row_start(e: LoadError, path: &Path, source: &str) -> LoadError {
    let Some(line) = e.line.filter(|_| e.message.starts_with("missing field")) else {
        return e;
    };
    let lines: Vec<&str> = source.lines().collect();
    let end = usize::try_from(line)
        .unwrap_or(usize::MAX)
        .min(lines.len() + 1);
    let row = (0..end.saturating_sub(1))
        .rev()
        .find_map(|i| Some((i, lines[i].trim_start().strip_prefix("- row:")?.trim())));
    match row {
        Some((i, name)) => {
            let column = lines[i].find("row:").unwrap_or(0) as u64 + 1;
            LoadError {
                line: Some(i as u64 + 1),
                column: Some(column),
                snippet: Some(super::loader::snippet(source, i as u64 + 1, column)),
                message: format!("row `{name}`: {}", e.message),
                ..LoadError::new(path, "")
            }
        }
        None => e,
    }
}

/// Every problem of the table (located at the row) and of the scenarios it generates
/// (located at the row that generated them, naming the case).
pub fn load_table(path: &Path, family: &str) -> Result<Vec<Scenario>, Vec<LoadError>> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| vec![LoadError::new(path, format!("cannot read: {e}"))])?;
    parse_table(path, &source, family)
}

/// As [`load_table`], from the table's text.
///
/// # Errors
/// As [`load_table`].
pub fn parse_table(
    path: &Path,
    source: &str,
    family: &str,
) -> Result<Vec<Scenario>, Vec<LoadError>> {
    let raw: RawTable =
        parse_yaml(path, source).map_err(|e| vec![at_row_start(e, path, source)])?;
    let at = |loc: Location, msg: String| LoadError::at(path, Some(loc), msg, Some(source));
    let mut errors = Vec::new();
    if raw.family.value != family {
        errors.push(at(
            raw.family.referenced,
            format!(
                "family `{}` does not match the table's file name (`{family}`)",
                raw.family.value
            ),
        ));
        return Err(errors);
    }
    let Some(fam) = families::table(family) else {
        return Err(vec![at(
            raw.family.referenced,
            format!("unknown family `{family}`"),
        )]);
    };
    let mut kinds = BTreeMap::new();
    for (name, k) in &raw.kinds {
        let kind = Kind {
            ty: k.value.ty,
            max: k.value.max,
            requirement: k.value.requirement.clone(),
            reference: k.value.reference.clone(),
            bound: k.value.bound.clone(),
        };
        if kind.bound.is_some() && kind.edge_key().is_none() {
            errors.push(at(
                k.referenced,
                format!(
                    "kind `{name}`: `bound` needs the `reference` or `requirement` that sets it"
                ),
            ));
        }
        kinds.insert(name.clone(), kind);
    }
    let table = Table {
        family,
        refuse: &raw.refuse,
    };
    let mut rows_seen = BTreeSet::new();
    let mut scenarios = Vec::new();
    for spanned in &raw.rows {
        let r = &spanned.value;
        let loc = spanned.referenced;
        let mut problem = |msg: String| errors.push(at(loc, format!("row `{}`: {msg}", r.row)));
        if r.row.is_empty()
            || !r
                .row
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            problem("a row name is lower-case letters, digits and `_`".into());
            continue;
        }
        if !rows_seen.insert(r.row.clone()) {
            problem("the row name is used twice".into());
            continue;
        }
        let Some(kind) = kinds.get(&r.kind) else {
            problem(format!(
                "unknown kind `{}` (kinds: {})",
                r.kind,
                kinds.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        let (setup_config, setup_steps) = match &r.setup {
            None => (None, Vec::new()),
            Some(name) => match resolve_setup(&raw.setups, name) {
                Ok(resolved) => resolved,
                Err(e) => {
                    problem(e);
                    continue;
                }
            },
        };
        let (party, frame) = match r.send.as_object().filter(|m| m.len() == 1) {
            Some(map) => {
                let (key, frame) = map.iter().next().expect("one entry");
                match fam.parties.iter().find(|p| p.as_str() == key) {
                    Some(p) => (*p, frame),
                    None => {
                        problem(format!(
                            "`send` names `{key}`, not a party of family `{family}`"
                        ));
                        continue;
                    }
                }
            }
            None => {
                problem("`send` is one frame step (`{<party>: {…}}`)".into());
                continue;
            }
        };
        if !has_slot(frame) {
            problem(format!("the frame of `send` has no `{VALUE_SLOT}` slot"));
            continue;
        }
        // The target is the side whose party does not send the frame.
        let Some(target) = fam.sides.iter().copied().find(|s| s.party() != party) else {
            problem(format!(
                "no side of family `{family}` receives `{}` frames",
                party.as_str()
            ));
            continue;
        };
        let cases = match cases(kind, r.valid.as_ref(), r.max) {
            Ok(c) => c,
            Err(e) => {
                problem(e);
                continue;
            }
        };
        let row = Row {
            raw: r,
            kind,
            setup_config,
            setup_steps,
            party,
            frame,
            target,
        };
        for case in &cases {
            let doc = document(&table, &row, case);
            let name = scenario_name(&r.row, case.name);
            // Validated as the file `<root>/<family>/<name>.yaml` would be.
            let virtual_path = path
                .parent()
                .and_then(Path::parent)
                .unwrap_or(Path::new("."))
                .join(family)
                .join(format!("{name}.yaml"));
            match parse_scenario(&virtual_path, &yaml_text(&doc)) {
                Ok(mut s) => {
                    s.path = path.to_path_buf();
                    if fam.feature_side == Some(target) {
                        s.requires = (fam.implied_features)(&s)
                            .into_iter()
                            .map(|f| (f.to_string(), true))
                            .collect();
                    }
                    scenarios.push(s);
                }
                Err(problems) => {
                    for p in problems {
                        errors.push(at(
                            loc,
                            format!(
                                "row `{}`, case `{}` (scenario `{name}`): {}",
                                r.row, case.name, p.message
                            ),
                        ));
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        scenarios.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(scenarios)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::model::Step;
    use serde_json::json;

    fn id_kind(max: u64) -> Kind {
        Kind {
            ty: ValueType::Id,
            max: Some(max),
            requirement: None,
            reference: Some("CR-ENV-018".into()),
            bound: Some("id_bytes".into()),
        }
    }

    fn names(cases: &[Case]) -> Vec<&str> {
        cases.iter().map(|c| c.name).collect()
    }

    /// The refused cases of an identifier kind, in order.
    const REFUSED_ID_CASES: [&str; 6] =
        ["empty", "past", "control", "delete", "c1_control", "number"];

    #[test]
    fn identifier_cases_count_bytes_not_characters() {
        let all = cases(&id_kind(128), None, false).unwrap();
        let cases = &all;
        assert_eq!(
            names(cases),
            [&["min", "max"][..], &REFUSED_ID_CASES].concat()
        );
        let get = |n: &str| cases.iter().find(|c| c.name == n).unwrap();
        let text = |n: &str| get(n).value.as_str().unwrap().to_string();
        assert_eq!(text("min").len(), 1);
        assert_eq!(text("max").len(), 128);
        assert_eq!(text("max").chars().count(), 64);
        // One byte past the bound, yet fewer characters than the bound.
        assert_eq!(text("past").len(), 129);
        assert_eq!(text("past").chars().count(), 65);
        assert!(text("control").contains('\u{1b}'));
        assert_eq!(text("empty"), "");
        assert_eq!(get("number").value, json!(7));
        // Which are accepted, which sit on the bound, which are the kind's choices.
        let accepted: Vec<&str> = cases
            .iter()
            .filter(|c| c.accepted)
            .map(|c| c.name)
            .collect();
        assert_eq!(accepted, ["min", "max"]);
        assert_eq!(get("max").edge, Some(Edge::At));
        assert_eq!(get("past").edge, Some(Edge::Past));
        assert!(get("max").choice && get("past").choice && !get("min").choice);
        // An odd bound still lands exactly on it.
        let odd = super::cases(&id_kind(5), None, false).unwrap();
        assert_eq!(odd[1].value.as_str().unwrap().len(), 5);
        assert_eq!(odd[3].value.as_str().unwrap().len(), 6);
    }

    #[test]
    fn a_fixed_identifier_is_tried_as_given() {
        let fixed = cases(&id_kind(128), Some(&json!("$exe1")), false).unwrap();
        assert_eq!(names(&fixed), [&["valid"][..], &REFUSED_ID_CASES].concat());
        assert_eq!(fixed[0].value, json!("$exe1"));
        assert!(cases(&id_kind(128), Some(&json!(3)), false).is_err());
        assert!(cases(&id_kind(128), None, true).is_err());
        assert!(cases(&id_kind(1), None, false).is_err());
    }

    #[test]
    fn uuid_cases_are_the_non_canonical_forms_of_the_valid_one() {
        let kind = Kind {
            ty: ValueType::Uuid,
            max: None,
            requirement: Some("CR-ENV-013".into()),
            reference: Some("CR-FAM-006".into()),
            bound: None,
        };
        let v = "0e0e0000-0000-4000-8000-00000000000e";
        let all = cases(&kind, Some(&json!(v)), false).unwrap();
        let cases = &all;
        assert_eq!(
            names(cases),
            ["valid", "upper", "braces", "no_hyphens", "empty", "number"]
        );
        assert_eq!(
            cases[1].value,
            json!("0E0E0000-0000-4000-8000-00000000000E")
        );
        assert_eq!(cases[2].value, json!(format!("{{{v}}}")));
        assert_eq!(cases[3].value, json!("0e0e000000004000800000000000000e"));
        assert!(cases[1..].iter().all(|c| !c.accepted && c.edge.is_none()));
        // The valid one must be canonical, and have letters to upper-case.
        let err = |v: &str| super::cases(&kind, Some(&json!(v)), false).unwrap_err();
        assert!(err("0E0E0000-0000-4000-8000-00000000000E").contains("not canonical"));
        assert!(err("00000000-0000-4000-8000-000000000001").contains("no letter"));
        assert!(err("nope").contains("not a UUID"));
        assert!(super::cases(&kind, None, false).is_err());
    }

    #[test]
    fn unsigned_cases_and_the_edge_of_the_range() {
        let kind = Kind {
            ty: ValueType::Uint,
            max: Some(u64::MAX),
            requirement: None,
            reference: Some("CR-FAM-010".into()),
            bound: Some("u64_max".into()),
        };
        let fixed = cases(&kind, Some(&json!(3)), false).unwrap();
        assert_eq!(names(&fixed), ["valid", "negative", "fraction", "string"]);
        assert_eq!(fixed[1].value, json!(-1));
        assert_eq!(fixed[2].value, json!(3.5));
        assert_eq!(fixed[3].value, json!("3"));
        let full = cases(&kind, Some(&json!(3)), true).unwrap();
        assert_eq!(
            names(&full),
            ["valid", "max", "past", "negative", "fraction", "string"]
        );
        assert_eq!(full[1].value, json!(u64::MAX));
        assert!(full[1].accepted && full[1].choice);
        // 2^64 has no u64: it is written as the number it is.
        assert_eq!(full[2].value.as_f64(), Some(2f64.powi(64)));
        assert_eq!(full[2].edge, Some(Edge::Past));
        let small = Kind {
            max: Some(65535),
            bound: None,
            ..kind.clone()
        };
        let full = cases(&small, Some(&json!(503)), true).unwrap();
        assert_eq!(full[2].value, json!(65536));
        assert!(small.edge_key().is_none());
        assert!(cases(&kind, Some(&json!(-3)), false).is_err());
        assert!(cases(&small, Some(&json!(70000)), false).is_err());
    }

    #[test]
    fn yaml_text_reads_back_exactly() {
        let value = json!({
            "s": "a\u{1b}b\u{7f}c\u{85}d\u{0}\"quoted\" \\ é € \u{1F600} $value",
            "n": [-1, 3.5, 18446744073709551615u64, 2f64.powi(64), true, {"$reference": 1007}],
            "empty": "", "key with: colon": {}
        });
        let text = yaml_text(&value);
        assert!(!text.chars().any(|c| c.is_control()), "{text}");
        let back: Value = parse_yaml(Path::new("x.yaml"), &text).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn fill_puts_the_value_and_picks_the_branch_of_the_outcome() {
        let template = json!({
            "a": "$value", "b": ["$value", "$other"], "c": "$values",
            "d": {"$accepted": {"status": 200, "v": "$value"}, "$refused": {"status": 503}},
            "e": {"$accepted": 1, "$refused": 2, "x": 3}
        });
        assert_eq!(
            fill(&template, &json!("v1"), true),
            json!({
                "a": "v1", "b": ["v1", "$other"], "c": "$values",
                "d": {"status": 200, "v": "v1"},
                "e": {"$accepted": 1, "$refused": 2, "x": 3}
            })
        );
        assert_eq!(
            fill(&template, &json!(7), false)["d"],
            json!({"status": 503})
        );
        let mut marks = Vec::new();
        marked_requirements(
            &json!([{"reference": {"requirement": "CR-A-001", "steps": [{"x": {"$reference": 1, "$requirement": "CR-B-002"}}]}}]),
            &mut marks,
        );
        assert_eq!(marks, ["CR-A-001", "CR-B-002"]);
    }

    const TABLE: &str = r#"family: core_runtime
kinds:
  id: { type: id, max: 128, reference: CR-ENV-018, bound: id_bytes }
  uuid: { type: uuid, requirement: CR-ENV-013, reference: CR-FAM-006 }
refuse:
  - expect_close: { code: { $reference: 1007, $requirement: CR-FAM-006 }, reason: { $reference: invalid_value, $requirement: CR-FAM-006 } }
setups:
  base:
    config: { runtime: { timers: { reconnect_initial_ms: 10 } } }
    steps: [ { handshake: {} } ]
  ready:
    from: base
    steps:
      - core: { type: execution_prepare, id: prep-1, payload: { session_id: 5e55a000-0000-4000-8000-00000000000a, agent_kind: controlled, configuration: { agent_options: { model: m }, disable_subagents: true, local_environment: { environment_id: 0e0e0000-0000-4000-8000-00000000000e, environment_type: self_hosted } } } }
      - runtime: { type: preparation_status, id: prep-1, payload: { status: ready, admission_handle: $h1, revision: 1, executor_id: $exe1, expires_in_ms: 300000 } }
rows:
  - row: run_id
    field: execution_start.payload.run_id
    kind: id
    covers: [CR-PREP-007]
    setup: ready
    accept_config: { runtime: { timers: { cleanup_retry_ms: 5 } } }
    send: { core: { type: execution_start, id: prep-1, payload: { executor_id: $exe1, admission_handle: $h1, run_id: $value, input: [] } } }
    accept:
      - runtime: { type: preparation_status, id: prep-1, payload: { status: started, admission_handle: $h1, revision: 2, run_id: $value } }
  - row: env
    field: environment_quiesced.payload.environment_id
    kind: uuid
    valid: 0e0e0000-0000-4000-8000-00000000000e
    covers: [CR-ENV-015]
    steps:
      - handshake: {}
      - api: { call: { method: POST, path: /v1/x, body: {} }, expect: { $accepted: { status: 200 }, $refused: { status: 503 } }, id: c1, await: false }
    send: { runtime: { type: environment_quiesced, id: s-1, payload: { environment_id: $value, status: applied } } }
    accept: [ { api_result: { id: c1 } } ]
    refuse: [ { expect_close: {} }, { api_result: { id: c1 } } ]
"#;

    fn expand(text: &str) -> Result<Vec<Scenario>, Vec<LoadError>> {
        parse_table(
            Path::new("scenarios/tables/core_runtime.values.yaml"),
            text,
            "core_runtime",
        )
    }

    #[test]
    fn a_row_expands_into_one_scenario_per_case() {
        let all = expand(TABLE).unwrap();
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "value_env_braces",
                "value_env_empty",
                "value_env_no_hyphens",
                "value_env_number",
                "value_env_upper",
                "value_env_valid",
                "value_run_id_c1_control",
                "value_run_id_control",
                "value_run_id_delete",
                "value_run_id_empty",
                "value_run_id_max",
                "value_run_id_min",
                "value_run_id_number",
                "value_run_id_past",
            ]
        );
        let get = |n: &str| all.iter().find(|s| s.name == n).unwrap();
        // The frame is sent with its schema check when the value is valid, as raw bytes
        // otherwise; the receiver is the side that does not send it.
        let min = get("value_run_id_min");
        assert_eq!(min.sides, Some(vec![Side::Runtime]));
        assert_eq!(
            min.path,
            Path::new("scenarios/tables/core_runtime.values.yaml")
        );
        // Setup steps (handshake, prepare, ready), the frame, the outcome.
        assert_eq!(min.steps.len(), 5);
        assert!(
            matches!(&min.steps[3], Step::Frame { party: Party::Core, frame } if frame["payload"]["run_id"] == "x")
        );
        assert!(
            matches!(&min.steps[4], Step::Frame { party: Party::Runtime, frame } if frame["payload"]["run_id"] == "x")
        );
        let past = get("value_run_id_past");
        assert!(matches!(&past.steps[3], Step::SendBytes(_)));
        // A refusal and the largest value are the kind's choices: a reference group.
        assert!(
            matches!(&past.steps[4], Step::Reference { requirement, .. } if requirement == "CR-ENV-018")
        );
        assert!(
            matches!(&get("value_run_id_max").steps[4], Step::Reference { requirement, .. } if requirement == "CR-ENV-018")
        );
        // Covers: the row's, then every requirement its steps mark.
        assert_eq!(min.covers, ["CR-PREP-007"]);
        assert_eq!(past.covers, ["CR-PREP-007", "CR-ENV-018", "CR-FAM-006"]);
        assert_eq!(past.edges["CR-ENV-018/id_bytes"], [Edge::Past]);
        assert_eq!(
            get("value_run_id_max").edges["CR-ENV-018/id_bytes"],
            [Edge::At]
        );
        assert!(min.edges.is_empty());
        // The setup's config, with `accept_config` over it for accepted values only.
        let timers = |s: &Scenario| s.config.runtime.as_ref().unwrap()["timers"].clone();
        assert_eq!(
            timers(min),
            json!({"reconnect_initial_ms": 10, "cleanup_retry_ms": 5})
        );
        assert_eq!(timers(past), json!({"reconnect_initial_ms": 10}));
        // The Runtime's capabilities the frames exercise.
        assert_eq!(
            min.requires.keys().map(String::as_str).collect::<Vec<_>>(),
            ["local_environment", "subagent_control"]
        );
        // A UUID row: the required rule is covered where the outcome is asserted outside
        // a reference group (not by a refusal that is all our choice);
        // `$accepted`/`$refused` resolved.
        let env = get("value_env_upper");
        assert_eq!(env.sides, Some(vec![Side::Core]));
        assert_eq!(env.covers, ["CR-ENV-015", "CR-FAM-006"]);
        assert_eq!(get("value_env_valid").covers, ["CR-ENV-015", "CR-ENV-013"]);
        let Step::Api(api) = &env.steps[1] else {
            panic!()
        };
        assert_eq!(api.expect.status, 503);
        let Step::Api(api) = &get("value_env_valid").steps[1] else {
            panic!()
        };
        assert_eq!(api.expect.status, 200);
        assert!(get("value_env_valid").summary.contains("Core accepts it"));
        assert!(env.summary.contains("upper case; Core refuses the frame"));
    }

    #[test]
    fn table_errors_name_the_row() {
        let errors = |text: &str| {
            expand(text)
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        };
        // (text replaced, by what, what the error must say)
        let cases = [
            (
                "    kind: uuid\n",
                "",
                "core_runtime.values.yaml:26:5: row `env`: missing field `kind`",
            ),
            (
                "kind: uuid\n",
                "kind: nope\n",
                "core_runtime.values.yaml:26:5: row `env`: unknown kind `nope` (kinds: id, uuid)",
            ),
            (
                "run_id: $value, input",
                "run_id: r, input",
                "row `run_id`: the frame of `send` has no `$value` slot",
            ),
            (
                "row: env",
                "row: run_id",
                "row `run_id`: the row name is used twice",
            ),
            (
                "    from: base\n",
                "    from: ready\n",
                "its `from:` chain is a cycle",
            ),
            (
                "send: { runtime:",
                "send: { worker:",
                "`send` names `worker`, not a party of family `core_runtime`",
            ),
            (
                "family: core_runtime",
                "family: engine",
                "does not match the table's file name",
            ),
            // A generated scenario the loader refuses is reported at its row, with its case.
            (
                "covers: [CR-PREP-007]",
                "covers: [nope]",
                "row `run_id`, case `min` (scenario `value_run_id_min`): malformed requirement ID `nope`",
            ),
        ];
        for (from, to, expected) in cases {
            let e = errors(&TABLE.replace(from, to));
            assert!(e.contains(expected), "{from} -> {to}: {e}");
        }
    }

    #[test]
    fn the_family_loads_its_table_with_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("core_runtime");
        std::fs::create_dir_all(&fam).unwrap();
        std::fs::create_dir_all(dir.path().join(TABLES_DIR)).unwrap();
        std::fs::write(
            fam.join("a.yaml"),
            "family: core_runtime\nname: a\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - disconnect: {}\n",
        )
        .unwrap();
        std::fs::write(table_path(dir.path(), "core_runtime"), TABLE).unwrap();
        let all = crate::scenario::load_family(dir.path(), "core_runtime").unwrap();
        assert_eq!(all.len(), 15);
        assert_eq!(all[0].name, "a");
        // A scenario file of the same name as a generated one is a load error naming both.
        std::fs::write(
            fam.join("value_env_valid.yaml"),
            "family: core_runtime\nname: value_env_valid\nsummary: s\ncovers: [CR-A-001]\nsteps:\n  - disconnect: {}\n",
        )
        .unwrap();
        let errors = crate::scenario::load_family(dir.path(), "core_runtime").unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0]
                .to_string()
                .contains("scenario `value_env_valid` is also declared by"),
            "{}",
            errors[0]
        );
    }
}
