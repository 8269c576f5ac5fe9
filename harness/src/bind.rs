//! Placeholders (`$name`) and their bindings.
//!
//! This module owns the placeholder syntax and the table of bound values of one scenario
//! run: a placeholder is **bound** on first sight in a frame the target emits (see
//! [`crate::matcher`]) and must be equal on every later sight; in a frame the harness
//! sends it is **substituted** with its bound value or **minted** (a fresh,
//! deterministic, unique string) when the harness plays the party that first mentions it.
//!
//! Syntax: a string that is exactly `$name` (`name` = ASCII letters, digits, `_`) is a
//! named placeholder; `$_` matches anything and never binds; `$$x` is the literal string
//! `$x`. Any other string starting with a single `$` is malformed (rejected when the
//! scenario is loaded).
//!
//! It never touches sockets, files or clocks: minting is a counter, so the same scenario
//! always mints the same strings.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// A placeholder found in a scenario string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placeholder {
    /// `$name`: binds on first sight, compared afterwards.
    Named(String),
    /// `$_`: matches any value, never binds.
    Any,
    /// `$absent`: the key it is written under must not be present in the emitted frame.
    Absent,
    /// `$unspecified`: any value, never binds, and the golden records `"<unspecified>"`
    /// in its place: a value the spec leaves open and a run may change (a state read
    /// while the target moves on).
    Unspecified,
}

/// How one scenario string is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token<'a> {
    /// A plain string (with `$$` unescaped to `$`).
    Literal(Cow<'a, str>),
    /// A placeholder.
    Placeholder(Placeholder),
}

/// Errors of placeholder syntax, binding and substitution.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BindError {
    /// A string starts with a single `$` but is not `$name`.
    #[error(
        "malformed placeholder `{0}` (use `$name` with letters, digits, `_`, or `$$` for a literal `$`)"
    )]
    Malformed(String),
    /// A placeholder is already bound to a different value.
    #[error("placeholder `${name}` is bound to {bound} but now saw {value}")]
    Conflict {
        /// The placeholder name.
        name: String,
        /// The value bound earlier.
        bound: Box<Value>,
        /// The conflicting value.
        value: Box<Value>,
    },
    /// A placeholder in a frame to send is unbound and minting is not allowed.
    #[error("placeholder `${0}` is not bound yet (the target has not sent it)")]
    Unbound(String),
    /// A placeholder in a frame to send is only carried by a typical (`optional:`) frame
    /// the target did not send: the step needs that frame.
    #[error(
        "placeholder `${name}` is carried only by a typical frame the target did not send{}",
        requirement.as_ref().map(|r| format!(" (our reference sends it, {r})")).unwrap_or_default()
    )]
    Skipped {
        /// The placeholder name.
        name: String,
        /// The `level: reference` requirement of the skipped frame's `reference:` group.
        requirement: Option<String>,
    },
    /// `$_` appeared in a frame the harness must send.
    #[error("`$_` cannot be sent; it only matches emitted values")]
    AnyInSent,
    /// `$absent` appeared in a frame the harness must send.
    #[error("`$absent` cannot be sent outside a mapping (as a key's value it is the key left out)")]
    AbsentInSent,
    /// A comparison pattern (`{$gt: …}`) is malformed or cannot be satisfied.
    #[error("comparison: {0}")]
    Comparison(String),
}

/// The reserved placeholder name of [`Placeholder::Unspecified`] (`$unspecified`).
pub const UNSPECIFIED: &str = "unspecified";

/// The reserved placeholder name of [`Placeholder::Absent`] (`$absent`).
pub const ABSENT: &str = "absent";

/// Object keys whose values the wire types as canonical UUIDs: a placeholder minted
/// under one of them is a UUID, so that a frame the harness sends stays valid.
pub const UUID_KEYS: &[&str] = &["session_id", "environment_id"];

/// Whether `name` is a valid placeholder name (non-empty ASCII letters, digits, `_`).
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Reads one scenario string.
///
/// # Errors
/// [`BindError::Malformed`] for a string starting with a single `$` that is not `$name`.
pub fn parse_token(s: &str) -> Result<Token<'_>, BindError> {
    if let Some(rest) = s.strip_prefix("$$") {
        return Ok(Token::Literal(Cow::Owned(format!("${rest}"))));
    }
    match s.strip_prefix('$') {
        None => Ok(Token::Literal(Cow::Borrowed(s))),
        Some("_") => Ok(Token::Placeholder(Placeholder::Any)),
        Some(ABSENT) => Ok(Token::Placeholder(Placeholder::Absent)),
        Some(UNSPECIFIED) => Ok(Token::Placeholder(Placeholder::Unspecified)),
        Some(name) if is_valid_name(name) => {
            Ok(Token::Placeholder(Placeholder::Named(name.to_string())))
        }
        Some(_) => Err(BindError::Malformed(s.to_string())),
    }
}

/// The placeholder `s` denotes, if any (`$x` → `Named("x")`, `$_` → `Any`; `$$x`, plain
/// and malformed strings → `None`).
pub fn placeholder(s: &str) -> Option<Placeholder> {
    match parse_token(s) {
        Ok(Token::Placeholder(p)) => Some(p),
        _ => None,
    }
}

/// Every malformed placeholder string inside `value` (object keys are never placeholders),
/// with its JSON path.
pub fn malformed_placeholders(value: &Value) -> Vec<(String, String)> {
    fn walk(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
        match value {
            Value::String(s) if parse_token(s).is_err() => {
                out.push((path.to_string(), s.clone()));
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), out);
                }
            }
            Value::Object(map) => {
                for (k, v) in map {
                    walk(v, &crate::matcher::child_path(path, k), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, "$", &mut out);
    out
}

/// Collects every named placeholder (`$_` and `$absent` excluded) in `value`, keys of
/// comparison and reference patterns included.
pub fn placeholder_names(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => {
            if let Some(Placeholder::Named(name)) = placeholder(s) {
                out.push(name);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| placeholder_names(v, out)),
        Value::Object(map) => map.values().for_each(|v| placeholder_names(v, out)),
        _ => {}
    }
}

/// A value where the target differs from our reference behaviour, found in vendor mode
/// by a `{$reference: …}` pattern ([`crate::matcher::ReferencePattern`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// The `level: reference` requirement.
    pub requirement: String,
    /// JSON path of the value.
    pub path: String,
    /// Our reference's pattern.
    pub reference: Value,
    /// What the target sent; `None` for a typical frame (an `optional:` step inside a
    /// `reference:` group) it did not send at all.
    pub actual: Option<Value>,
}

/// The placeholder table of one scenario run (one target side). It also carries the
/// run's judgement of `{$reference: …}` patterns (strict or vendor) and the differences
/// from the reference found so far, so that both follow the all-or-nothing commit of a
/// match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bindings {
    /// Bound values by name.
    values: BTreeMap<String, Value>,
    /// Names in binding order (for deterministic reverse lookup).
    order: Vec<String>,
    /// Number of values minted so far.
    minted: u64,
    /// Vendor mode: a `{$reference: …}` value the target does not match is a
    /// [`Difference`], not a mismatch.
    pub vendor: bool,
    /// The differences found (vendor mode), in order.
    pub differences: Vec<Difference>,
    /// Placeholders of typical frames the target did not send (never bound by them), with
    /// the reference requirement of the frame if any: a comparison bound naming one is no
    /// bound ([`crate::matcher::skip_pattern`]); a frame to send cannot use one.
    skipped: BTreeMap<String, Option<String>>,
    /// The match paths (array indexes as `[]`) at which each placeholder matched an
    /// emitted value (bound or compared equal): where a golden shows a decimal-integer
    /// value as its name ([`Bindings::name_at`]).
    matched_at: BTreeMap<String, BTreeSet<String>>,
}

impl Bindings {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value bound to `name` (without the `$`).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.values.get(name)
    }

    /// Marks `name` as a placeholder of a frame the target did not send (inside the
    /// `reference:` group of `requirement`, if any).
    pub fn skip(&mut self, name: &str, requirement: Option<&str>) {
        self.skipped
            .insert(name.to_string(), requirement.map(str::to_string));
    }

    /// Whether `name` is unbound because the typical frame that would bind it was not sent.
    pub fn is_skipped(&self, name: &str) -> bool {
        !self.values.contains_key(name) && self.skipped.contains_key(name)
    }

    /// Whether nothing is bound.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `(name, value)` pairs in binding order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.order
            .iter()
            .filter_map(|n| self.values.get(n).map(|v| (n.as_str(), v)))
    }

    /// Binds `name` to `value`; binding the same value again is a no-op.
    ///
    /// # Errors
    /// [`BindError::Conflict`] if `name` is bound to a different value;
    /// [`BindError::Malformed`] if `name` is not a valid placeholder name.
    pub fn bind(&mut self, name: &str, value: Value) -> Result<(), BindError> {
        if !is_valid_name(name) || name == "_" {
            return Err(BindError::Malformed(format!("${name}")));
        }
        match self.values.get(name) {
            Some(bound) if crate::matcher::values_equal(bound, &value) => Ok(()),
            Some(bound) => Err(BindError::Conflict {
                name: name.to_string(),
                bound: Box::new(bound.clone()),
                value: Box::new(value),
            }),
            None => {
                self.values.insert(name.to_string(), value);
                self.order.push(name.to_string());
                Ok(())
            }
        }
    }

    /// Mints a fresh string for `name` (`<name>-<n>`, unique among bound values), binds it
    /// and returns it.
    pub fn mint(&mut self, name: &str) -> Value {
        loop {
            self.minted += 1;
            let candidate = Value::String(format!("{name}-{}", self.minted));
            if self.name_of(&candidate).is_none() {
                self.values.insert(name.to_string(), candidate.clone());
                self.order.push(name.to_string());
                return candidate;
            }
        }
    }

    /// `template` with every placeholder replaced by its bound value (and `$$x` unescaped).
    /// Unbound placeholders are minted when `mint` is true.
    ///
    /// # Errors
    /// [`BindError::Unbound`] for an unbound placeholder when `mint` is false;
    /// [`BindError::AnyInSent`] for `$_`; [`BindError::Malformed`].
    pub fn substitute(&mut self, template: &Value, mint: bool) -> Result<Value, BindError> {
        self.substitute_at(template, mint, None)
    }

    /// Mints a value for `name` found under object key `key`: a canonical UUID
    /// (`5e55a000-0000-4000-8000-<n as 12 hex digits>`) under a key the wire types as a
    /// UUID ([`UUID_KEYS`]), else `<name>-<n>` ([`Bindings::mint`]).
    fn mint_for(&mut self, name: &str, key: Option<&str>) -> Value {
        if !key.is_some_and(|k| UUID_KEYS.contains(&k)) {
            return self.mint(name);
        }
        loop {
            self.minted += 1;
            let candidate = Value::String(format!("5e55a000-0000-4000-8000-{:012x}", self.minted));
            if self.name_of(&candidate).is_none() {
                self.values.insert(name.to_string(), candidate.clone());
                self.order.push(name.to_string());
                return candidate;
            }
        }
    }

    fn substitute_at(
        &mut self,
        template: &Value,
        mint: bool,
        key: Option<&str>,
    ) -> Result<Value, BindError> {
        Ok(match template {
            Value::String(s) => match parse_token(s)? {
                Token::Literal(text) => Value::String(text.into_owned()),
                Token::Placeholder(Placeholder::Any | Placeholder::Unspecified) => {
                    return Err(BindError::AnyInSent);
                }
                Token::Placeholder(Placeholder::Absent) => return Err(BindError::AbsentInSent),
                Token::Placeholder(Placeholder::Named(name)) => match self.values.get(&name) {
                    Some(v) => v.clone(),
                    None if self.skipped.contains_key(&name) => {
                        let requirement = self.skipped[&name].clone();
                        return Err(BindError::Skipped { name, requirement });
                    }
                    None if mint => self.mint_for(&name, key),
                    None => return Err(BindError::Unbound(name)),
                },
            },
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.substitute_at(item, mint, key))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => {
                if let Some(compare) = crate::matcher::ComparePattern::parse(template)
                    .map_err(BindError::Comparison)?
                {
                    return self.substitute_comparison(&compare);
                }
                // The harness sends our reference's value, and binds what `$otherwise`
                // names to it (`$r1`, or a comparison's `$as`).
                if let Some(r) = crate::matcher::ReferencePattern::parse(template)
                    .map_err(BindError::Comparison)?
                {
                    let value = self.substitute_at(&r.reference, mint, key)?;
                    let name = match &r.otherwise {
                        Value::String(text) => match parse_token(text)? {
                            Token::Placeholder(Placeholder::Named(name)) => Some(name),
                            _ => None,
                        },
                        other => crate::matcher::ComparePattern::parse(other)
                            .ok()
                            .flatten()
                            .and_then(|c| c.name),
                    };
                    if let Some(name) = name {
                        self.bind(&name, value.clone())?;
                    }
                    return Ok(value);
                }
                let mut out = Map::new();
                for (k, v) in map {
                    // `key: $absent` in a frame the harness sends is the key left out,
                    // so one frame serves as expectation (the key must be absent) and
                    // as what the harness sends when it plays that party.
                    if v.as_str() == Some("$absent") {
                        continue;
                    }
                    out.insert(k.clone(), self.substitute_at(v, mint, Some(k))?);
                }
                Value::Object(out)
            }
            other => other.clone(),
        })
    }

    /// The value to send for a comparison pattern: its `$as` placeholder's value when
    /// bound, else the bound the pattern names ([`crate::matcher::ComparePattern::mint`]),
    /// then bound to `$as`.
    fn substitute_comparison(
        &mut self,
        compare: &crate::matcher::ComparePattern,
    ) -> Result<Value, BindError> {
        if let Some(bound) = compare.name.as_ref().and_then(|n| self.values.get(n)) {
            return Ok(bound.clone());
        }
        let value = compare.mint(self).map_err(BindError::Comparison)?;
        if let Some(name) = &compare.name {
            self.bind(name, value.clone())?;
        }
        Ok(value)
    }

    /// Records that placeholder `name` matched the emitted value at the match path `path`
    /// (`$.message.delta.revision`; array indexes count as one, [`generic_path`]).
    pub fn note_matched_at(&mut self, name: &str, path: &str) {
        self.matched_at
            .entry(name.to_string())
            .or_default()
            .insert(generic_path(path));
    }

    /// The name a golden shows for the emitted `value` found at `path` (spelled as a match
    /// path, from the emitted value's root): the first-bound placeholder whose value
    /// equals it ([`Bindings::name_of`]), except that a decimal-integer string (proto3
    /// JSON's 64-bit integer, `"1"`) is a number, whose equal values elsewhere are
    /// coincidences: it is named only at a path where that placeholder matched an emitted
    /// value (an event's `sequence`, not an `epoch` or a definition's `revision` that is
    /// also `"1"`).
    pub fn name_at(&self, value: &Value, path: &str) -> Option<&str> {
        if !value.as_str().is_some_and(is_decimal_integer) {
            return self.name_of(value);
        }
        let path = generic_path(path);
        self.order
            .iter()
            .find(|n| {
                self.matched_at
                    .get(n.as_str())
                    .is_some_and(|paths| paths.contains(&path))
                    && self
                        .values
                        .get(n.as_str())
                        .is_some_and(|v| crate::matcher::values_equal(v, value))
            })
            .map(String::as_str)
    }

    /// The first-bound placeholder name whose value equals `value`.
    pub fn name_of(&self, value: &Value) -> Option<&str> {
        self.order
            .iter()
            .find(|n| {
                self.values
                    .get(n.as_str())
                    .is_some_and(|v| crate::matcher::values_equal(v, value))
            })
            .map(String::as_str)
    }
}

/// `path` with every array index written `[]` (`$.pending[3].id` → `$.pending[].id`): the
/// elements of one array share the paths a placeholder matched at.
pub fn generic_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        if rest.starts_with('"') {
            // A quoted key (`["a.b"]`): copied whole, escapes and all.
            let mut end = 1;
            let bytes = rest.as_bytes();
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            let end = (end + 1).min(rest.len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(']') {
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// Whether `text` is a decimal integer (`-`? digits), the proto3 JSON spelling of a 64-bit
/// integer.
fn is_decimal_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_absent_key_is_left_out_of_a_sent_frame() {
        let mut b = Bindings::default();
        let sent = b
            .substitute(
                &json!({"message": "m", "http_status": "$absent", "x": {"y": "$absent"}}),
                true,
            )
            .unwrap();
        assert_eq!(sent, json!({"message": "m", "x": {}}));
        assert!(matches!(
            b.substitute(&json!(["$absent"]), true),
            Err(BindError::AbsentInSent)
        ));
    }

    #[test]
    fn comparisons_send_a_bound_and_bind_it() {
        let mut b = Bindings::new();
        b.bind("r1", json!(100)).unwrap();
        let sent = b
            .substitute(&json!({"revision": {"$gt": "$r1", "$as": "$r2"}}), true)
            .unwrap();
        assert_eq!(sent, json!({"revision": 101}));
        assert_eq!(b.get("r2"), Some(&json!(101)));
        // Bound already: the bound value is sent.
        let again = b
            .substitute(&json!({"revision": {"$gt": "$r1", "$as": "$r2"}}), true)
            .unwrap();
        assert_eq!(again, json!({"revision": 101}));
        assert!(matches!(
            b.substitute(&json!({"x": {"$gt": "$unbound"}}), true),
            Err(BindError::Comparison(_))
        ));
    }

    #[test]
    fn uuid_keys_mint_uuids() {
        let mut b = Bindings::new();
        let sent = b
            .substitute(
                &json!({"session_id": "$s", "run_id": "$r", "list": [{"environment_id": "$e"}]}),
                true,
            )
            .unwrap();
        assert_eq!(sent["session_id"], "5e55a000-0000-4000-8000-000000000001");
        assert_eq!(sent["run_id"], "r-2");
        assert_eq!(
            sent["list"][0]["environment_id"],
            "5e55a000-0000-4000-8000-000000000003"
        );
        assert_eq!(b.name_of(&sent["session_id"]), Some("s"));
    }

    #[test]
    fn tokens() {
        assert_eq!(placeholder("$h1"), Some(Placeholder::Named("h1".into())));
        assert_eq!(placeholder("$_"), Some(Placeholder::Any));
        assert_eq!(placeholder("$$h1"), None);
        assert_eq!(placeholder("plain"), None);
        assert_eq!(
            parse_token("$$h1").unwrap(),
            Token::Literal(Cow::Owned("$h1".into()))
        );
        assert!(matches!(parse_token("$a-b"), Err(BindError::Malformed(_))));
        assert!(matches!(parse_token("$"), Err(BindError::Malformed(_))));
    }

    #[test]
    fn decimal_integers_are_named_only_at_paths_they_matched_at() {
        let mut b = Bindings::new();
        b.bind("s1", json!("1")).unwrap();
        b.bind("run", json!("run-1")).unwrap();
        b.bind("e1", json!("1")).unwrap();
        b.note_matched_at("s1", "$.events[4].sequence");
        b.note_matched_at("e1", "$.session.epoch");
        // Any other string is named wherever it appears.
        assert_eq!(b.name_at(&json!("run-1"), "$.other"), Some("run"));
        // A decimal integer only where its placeholder matched (any element of an
        // array); the first such one.
        assert_eq!(b.name_at(&json!("1"), "$.events[0].sequence"), Some("s1"));
        assert_eq!(b.name_at(&json!("1"), "$.session.epoch"), Some("e1"));
        assert_eq!(b.name_at(&json!("1"), "$.definition.revision"), None);
        assert_eq!(b.name_at(&json!("1"), "$.sequence"), None);
        b.bind("neg", json!("-5")).unwrap();
        assert_eq!(b.name_at(&json!("-5"), "$.x"), None);
        assert!(is_decimal_integer("-5") && is_decimal_integer("18446744073709551615"));
        assert!(!is_decimal_integer("-") && !is_decimal_integer("") && !is_decimal_integer("1a"));
        assert_eq!(generic_path("$.a[12][3].b[\"[7]\"]"), "$.a[][].b[\"[7]\"]");
    }

    #[test]
    fn bind_once_then_compare() {
        let mut b = Bindings::new();
        b.bind("h", json!("x")).unwrap();
        b.bind("h", json!("x")).unwrap();
        assert!(matches!(
            b.bind("h", json!("y")),
            Err(BindError::Conflict { .. })
        ));
        assert_eq!(b.get("h"), Some(&json!("x")));
        assert_eq!(b.name_of(&json!("x")), Some("h"));
    }

    #[test]
    fn substitute_and_mint_deterministically() {
        let mut b = Bindings::new();
        b.bind("run", json!("run-a")).unwrap();
        let t = json!({"run_id": "$run", "h": "$h", "lit": "$$h", "n": [1, "$h"]});
        assert!(matches!(
            b.clone().substitute(&t, false),
            Err(BindError::Unbound(n)) if n == "h"
        ));
        let out = b.substitute(&t, true).unwrap();
        assert_eq!(
            out,
            json!({"run_id": "run-a", "h": "h-1", "lit": "$h", "n": [1, "h-1"]})
        );
        assert!(matches!(
            b.substitute(&json!("$_"), true),
            Err(BindError::AnyInSent)
        ));
    }

    #[test]
    fn malformed_found_with_path() {
        let v = json!({"a": ["ok", "$bad-name"], "b": "$$fine"});
        assert_eq!(
            malformed_placeholders(&v),
            vec![("$.a[1]".to_string(), "$bad-name".to_string())]
        );
    }
}
