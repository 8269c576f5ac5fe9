//! Matching an emitted frame against a scenario frame.
//!
//! This module owns the pattern semantics of `docs/scenario-format.md` ("Matching"):
//! object keys the scenario writes must be present and match (keys it leaves out are
//! ignored here and checked by the family's codec, `crate::drive::Codec`, instead); arrays match element-wise with
//! equal length; scalars must be equal; a placeholder matches any value and binds it
//! (see [`crate::bind`]); `$absent` under a key requires the key to be missing; the
//! object `{$generated: {seed, offset?, size}}` matches a base64 string whose decoded
//! bytes are exactly `size` bytes of generated workspace content from `offset`
//! ([`GeneratedContent`]), so a scenario can check a 1 MiB read without pasting it.
//!
//! A match is all-or-nothing: bindings are made on a scratch copy and committed only when
//! the whole frame matched, so a failed attempt (e.g. while trying `any_order`
//! candidates) leaves no partial binding behind. The matcher is pure: it never touches
//! sockets, files or clocks.

use std::fmt;

use serde_json::Value;

use crate::bind::{Bindings, Placeholder, Token, parse_token};
use crate::scenario::GeneratedContent;

mod contains;
mod stamp;

/// The key of the generated-content pattern `{$generated: {seed, offset?, size}}`.
pub const GENERATED_MARKER: &str = "$generated";

/// A parsed `{$generated: {seed, offset?, size}}` pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneratedPattern {
    /// Seed of the generated file.
    pub seed: u64,
    /// First byte expected.
    pub offset: u64,
    /// Number of bytes expected.
    pub size: u64,
}

impl GeneratedPattern {
    /// Parses `pattern` when it is a generated-content pattern: `Ok(None)` when it is not
    /// one (not an object with the single key [`GENERATED_MARKER`]).
    ///
    /// # Errors
    /// A message naming what is wrong with the pattern's arguments.
    pub fn parse(pattern: &Value) -> Result<Option<Self>, String> {
        let Value::Object(map) = pattern else {
            return Ok(None);
        };
        let Some(args) = map.get(GENERATED_MARKER) else {
            return Ok(None);
        };
        if map.len() != 1 {
            return Err(format!(
                "`{GENERATED_MARKER}` must be the only key of its mapping"
            ));
        }
        let Value::Object(args) = args else {
            return Err(format!(
                "`{GENERATED_MARKER}` needs a mapping {{seed, offset?, size}}"
            ));
        };
        if let Some(key) = args
            .keys()
            .find(|k| !["seed", "offset", "size"].contains(&k.as_str()))
        {
            return Err(format!(
                "`{GENERATED_MARKER}`: unknown key `{key}` (expected seed, offset, size)"
            ));
        }
        let number = |key: &str, default: Option<u64>| match args.get(key) {
            Some(v) => v.as_u64().ok_or_else(|| {
                format!("`{GENERATED_MARKER}.{key}` must be a non-negative integer")
            }),
            None => default.ok_or_else(|| format!("`{GENERATED_MARKER}` needs `{key}`")),
        };
        let pattern = Self {
            seed: number("seed", None)?,
            offset: number("offset", Some(0))?,
            size: number("size", None)?,
        };
        if pattern.size > crate::scenario::GENERATED_FILE_MAX_BYTES {
            return Err(format!(
                "`{GENERATED_MARKER}.size` exceeds the {}-byte bound of a generated file",
                crate::scenario::GENERATED_FILE_MAX_BYTES
            ));
        }
        Ok(Some(pattern))
    }

    /// The base64 (standard alphabet, padded) of these bytes: the value the harness sends
    /// for the pattern in a value it only sends (`api.call.body`).
    pub fn base64(&self) -> String {
        use base64::Engine as _;
        // `size` is bounded by the 64 MiB of a generated file, so it fits a `usize`.
        let mut bytes = vec![0u8; self.size as usize];
        GeneratedContent::at(self.seed, self.offset).fill(&mut bytes);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Whether `actual` is the base64 (standard alphabet, padded) of exactly these bytes;
    /// `Err` says why not.
    fn check(&self, actual: &Value) -> Result<(), String> {
        use base64::Engine as _;
        let Value::String(text) = actual else {
            return Err(format!(
                "expected a base64 string, got {}",
                type_name(actual)
            ));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| format!("not valid base64: {e}"))?;
        if bytes.len() as u64 != self.size {
            return Err(format!(
                "expected {} bytes of generated content, got {} bytes",
                self.size,
                bytes.len()
            ));
        }
        let mut expected = vec![0u8; bytes.len()];
        GeneratedContent::at(self.seed, self.offset).fill(&mut expected);
        match bytes.iter().zip(&expected).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "byte {i} differs from the generated content (seed {}, file offset {})",
                self.seed,
                self.offset + i as u64
            )),
        }
    }
}

/// What a golden records where the scenario's pattern says `$unspecified`.
pub const UNSPECIFIED_MARK: &str = "<unspecified>";

/// `value` as a golden records it under `pattern`: every value the pattern matches with
/// `$unspecified` becomes [`UNSPECIFIED_MARK`] (objects by key, arrays by position), the
/// rest as it is.
pub fn mask_unspecified(pattern: &Value, value: &Value) -> Value {
    match (pattern, value) {
        (Value::String(s), _)
            if matches!(
                parse_token(s),
                Ok(Token::Placeholder(Placeholder::Unspecified))
            ) =>
        {
            Value::String(UNSPECIFIED_MARK.into())
        }
        (Value::Object(p), Value::Object(v)) => Value::Object(
            v.iter()
                .map(|(k, x)| {
                    let masked = p
                        .get(k)
                        .map_or_else(|| x.clone(), |pk| mask_unspecified(pk, x));
                    (k.clone(), masked)
                })
                .collect(),
        ),
        (Value::Array(p), Value::Array(v)) => Value::Array(
            v.iter()
                .enumerate()
                .map(|(i, x)| {
                    p.get(i)
                        .map_or_else(|| x.clone(), |pi| mask_unspecified(pi, x))
                })
                .collect(),
        ),
        _ => value.clone(),
    }
}

/// The largest text a `{$text: …}` value expands to (16 MiB).
pub const TEXT_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// `value` with every `{$text: {size, fill?, prefix?, suffix?}}` replaced by the string of
/// exactly `size` bytes: `prefix` (default empty), `fill` (one ASCII character, default
/// `x`) repeated, then `suffix` (default empty; a multi-byte character across a byte
/// bound). The form for a text bound at the bound and one past it in a frame the
/// harness sends (a cell source of 262,144 bytes) without pasting it.
///
/// # Errors
/// A malformed `$text` (unknown key, size over [`TEXT_MAX_BYTES`] or below the prefix and
/// suffix,
/// a fill that is not one ASCII character), with its path.
pub fn expand_text(value: &Value) -> Result<Value, String> {
    fn expand(value: &Value, path: &str) -> Result<Value, String> {
        match value {
            Value::Object(map) if map.len() == 1 && map.contains_key("$text") => {
                let Some(Value::Object(spec)) = map.get("$text") else {
                    return Err(format!(
                        "at {path}: `$text` takes {{size, fill?, prefix?, suffix?}}"
                    ));
                };
                if let Some(key) = spec
                    .keys()
                    .find(|k| !["size", "fill", "prefix", "suffix"].contains(&k.as_str()))
                {
                    return Err(format!(
                        "at {path}: `$text` takes size, fill, prefix and suffix, not `{key}`"
                    ));
                }
                let size = spec
                    .get("size")
                    .and_then(Value::as_u64)
                    .filter(|s| *s <= TEXT_MAX_BYTES)
                    .ok_or_else(|| {
                        format!(
                            "at {path}: `$text.size` must be a byte count up to {TEXT_MAX_BYTES}"
                        )
                    })?;
                let fill = match spec.get("fill") {
                    None => "x",
                    Some(Value::String(f)) if f.len() == 1 && f.is_ascii() => f.as_str(),
                    Some(_) => {
                        return Err(format!(
                            "at {path}: `$text.fill` must be one ASCII character"
                        ));
                    }
                };
                let prefix = match spec.get("prefix") {
                    None => "",
                    Some(Value::String(p)) => p.as_str(),
                    Some(_) => return Err(format!("at {path}: `$text.prefix` must be text")),
                };
                let suffix = match spec.get("suffix") {
                    None => "",
                    Some(Value::String(p)) => p.as_str(),
                    Some(_) => return Err(format!("at {path}: `$text.suffix` must be text")),
                };
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                let Some(fill_bytes) = size.checked_sub(prefix.len() + suffix.len()) else {
                    return Err(format!(
                        "at {path}: `$text.prefix` and `$text.suffix` are longer than `size`"
                    ));
                };
                Ok(Value::String(format!(
                    "{prefix}{}{suffix}",
                    fill.repeat(fill_bytes)
                )))
            }
            Value::Array(items) => Ok(Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| expand(item, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            )),
            Value::Object(map) => Ok(Value::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), expand(v, &child_path(path, k))?)))
                    .collect::<Result<_, String>>()?,
            )),
            other => Ok(other.clone()),
        }
    }
    expand(value, "$")
}

/// `value` with every `{$generated: {seed, offset?, size}}` pattern replaced by the base64
/// of its bytes ([`GeneratedPattern::base64`]): how a value the harness only sends (an
/// `api.call.body`) carries a big body without pasting it.
///
/// # Errors
/// The reason a pattern is malformed, with its path.
pub fn expand_generated(value: &Value) -> Result<Value, String> {
    fn expand(value: &Value, path: &str) -> Result<Value, String> {
        if let Some(pattern) =
            GeneratedPattern::parse(value).map_err(|reason| format!("at {path}: {reason}"))?
        {
            return Ok(Value::String(pattern.base64()));
        }
        Ok(match value {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| expand(item, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), expand(v, &child_path(path, k))?)))
                    .collect::<Result<_, String>>()?,
            ),
            other => other.clone(),
        })
    }
    expand(value, "$")
}

/// The keys of a comparison pattern (`{$gt: $r1, $as: $r2}`, `{$plus: [$s1, 2], $as: $s3}`).
pub const COMPARE_KEYS: &[&str] = &["$gt", "$ge", "$lt", "$le", "$plus", "$as"];

/// A number a comparison reads: a JSON number, or a string of decimal digits (with an
/// optional leading `-`), which is how the proto3 JSON mapping writes a 64-bit integer
/// (`"18446744073709551615"`). Integers compare exactly, whatever their size.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    /// The number `value` is or spells, with whether it was written as a string.
    fn read(value: &Value) -> Option<(Self, bool)> {
        match value {
            Value::Number(n) => n
                .as_i64()
                .map(|i| Num::Int(i128::from(i)))
                .or_else(|| n.as_u64().map(|u| Num::Int(i128::from(u))))
                .or_else(|| n.as_f64().map(Num::Float))
                .map(|x| (x, false)),
            Value::String(s) => {
                let digits = s.strip_prefix('-').unwrap_or(s);
                if digits.is_empty()
                    || digits.len() > 38
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    return None;
                }
                s.parse::<i128>().ok().map(|i| (Num::Int(i), true))
            }
            _ => None,
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            #[allow(clippy::cast_precision_loss)]
            Num::Int(i) => i as f64,
            Num::Float(x) => x,
        }
    }

    fn cmp(self, other: Num) -> Option<std::cmp::Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }

    /// `self + 1` (`up`) or `self - 1` for an integer; a fraction is its own step.
    fn step(self, up: bool) -> Num {
        match self {
            Num::Int(i) => Num::Int(if up { i + 1 } else { i - 1 }),
            Num::Float(x) if x.fract() == 0.0 => Num::Float(if up { x + 1.0 } else { x - 1.0 }),
            other => other,
        }
    }

    /// The JSON value: a decimal string when `string`, else a number (integral when it is).
    fn to_value(self, string: bool) -> Result<Value, String> {
        match self {
            Num::Int(i) if string => Ok(Value::String(i.to_string())),
            Num::Int(i) => i64::try_from(i)
                .map(Value::from)
                .or_else(|_| u64::try_from(i).map(Value::from))
                .map_err(|_| format!("{i} does not fit a JSON integer")),
            #[allow(clippy::cast_possible_truncation)]
            Num::Float(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                let n = x as i64;
                Ok(if string {
                    Value::String(n.to_string())
                } else {
                    Value::from(n)
                })
            }
            Num::Float(x) => serde_json::Number::from_f64(x)
                .map(Value::Number)
                .ok_or_else(|| "the bound is not a finite number".to_string()),
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

/// One side of a comparison: a literal number or a bound placeholder.
#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Literal(Num),
    Named(String),
}

impl Operand {
    fn parse(key: &str, value: &Value) -> Result<Self, String> {
        match value {
            Value::Number(n) => match Num::read(value) {
                Some((Num::Float(x), _)) if !x.is_finite() => {
                    Err(format!("`{key}`: {n} is not a finite number"))
                }
                Some((x, _)) => Ok(Operand::Literal(x)),
                None => Err(format!("`{key}`: {n} is not a finite number")),
            },
            Value::String(s) => match parse_token(s) {
                Ok(Token::Placeholder(Placeholder::Named(name))) => Ok(Operand::Named(name)),
                _ => Err(format!(
                    "`{key}` takes a number or a named placeholder (`$r1`), not {value}"
                )),
            },
            other => Err(format!(
                "`{key}` takes a number or a named placeholder, not {}",
                type_name(other)
            )),
        }
    }

    /// The bound's value, with whether the placeholder holds it as a decimal string;
    /// `None` when it names a placeholder of a typical frame the target did not send
    /// ([`Bindings::is_skipped`]): there is no such bound.
    fn resolve(&self, bindings: &Bindings) -> Result<Option<(Num, bool)>, String> {
        match self {
            Operand::Literal(x) => Ok(Some((*x, false))),
            Operand::Named(name) if bindings.is_skipped(name) => Ok(None),
            Operand::Named(name) => match bindings.get(name) {
                Some(v) => match Num::read(v) {
                    Some((Num::Float(x), _)) if !x.is_finite() => {
                        Err(format!("`${name}` is not a finite number"))
                    }
                    Some(x) => Ok(Some(x)),
                    None => Err(format!(
                        "`${name}` is bound to {}, not a number",
                        compact(v)
                    )),
                },
                None => Err(format!(
                    "`${name}` is not bound yet (bind it in an earlier step)"
                )),
            },
        }
    }
}

/// A comparison pattern: a number bounded below (`$gt`, `$ge`) and/or above (`$lt`,
/// `$le`) by literals or bound placeholders, bound to `$as` when it matches. The form for
/// values the spec orders but does not fix: `revision: {$gt: $r1, $as: $r2}` ("after the
/// previous revision of this handle"), `expires_in_ms: {$gt: 0, $le: 300000}`. Where the
/// harness sends such a value it sends the upper bound when there is one (minus one when
/// strict: the full five minutes of an expiry), else the lower bound (plus one when
/// strict: the next revision); an integer when the bound is one.
///
/// `{$plus: [$s1, 2], $as: $s3}` is the exact form: the number `$s1 + 2`, no other (an
/// event sequence the spec makes contiguous from an origin it leaves free). It takes no
/// other bound, and is what the harness sends.
///
/// A decimal string (proto3 JSON's 64-bit integers, `"18446744073709551615"`) compares as
/// the integer it spells, and a value minted from a placeholder holding one is a decimal
/// string too.
#[derive(Debug, Clone, PartialEq)]
pub struct ComparePattern {
    lower: Option<(Operand, bool)>,
    upper: Option<(Operand, bool)>,
    /// `$plus: [operand, offset]`: exactly `operand + offset`.
    exact: Option<(Operand, i64)>,
    /// The placeholder the matched (or sent) value binds to.
    pub name: Option<String>,
}

impl ComparePattern {
    /// Parses `pattern` when it is a comparison pattern (an object whose keys are all
    /// [`COMPARE_KEYS`] with at least one bound): `Ok(None)` when it is not one.
    ///
    /// # Errors
    /// A message naming what is wrong (two lower bounds, a bad operand, …).
    pub fn parse(pattern: &Value) -> Result<Option<Self>, String> {
        let Value::Object(map) = pattern else {
            return Ok(None);
        };
        if map.is_empty() || !map.keys().all(|k| COMPARE_KEYS.contains(&k.as_str())) {
            if map.keys().any(|k| COMPARE_KEYS[..5].contains(&k.as_str())) {
                return Err(format!(
                    "a comparison takes only the keys {}",
                    COMPARE_KEYS.join(", ")
                ));
            }
            return Ok(None);
        }
        let operand = |key: &str| map.get(key).map(|v| Operand::parse(key, v)).transpose();
        let lower = match (operand("$gt")?, operand("$ge")?) {
            (Some(_), Some(_)) => return Err("a comparison takes `$gt` or `$ge`, not both".into()),
            (Some(x), None) => Some((x, true)),
            (None, Some(x)) => Some((x, false)),
            (None, None) => None,
        };
        let upper = match (operand("$lt")?, operand("$le")?) {
            (Some(_), Some(_)) => return Err("a comparison takes `$lt` or `$le`, not both".into()),
            (Some(x), None) => Some((x, true)),
            (None, Some(x)) => Some((x, false)),
            (None, None) => None,
        };
        let exact = match map.get("$plus") {
            None => None,
            Some(Value::Array(pair)) if pair.len() == 2 => {
                let base = Operand::parse("$plus", &pair[0])?;
                if !matches!(base, Operand::Named(_)) {
                    return Err("`$plus` starts from a named placeholder (`[$s1, 2]`)".into());
                }
                let Some(offset) = pair[1].as_i64() else {
                    return Err(format!(
                        "`$plus` adds an integer (`[$s1, 2]`), not {}",
                        compact(&pair[1])
                    ));
                };
                if lower.is_some() || upper.is_some() {
                    return Err("`$plus` is exact: it takes no `$gt`, `$ge`, `$lt` or `$le`".into());
                }
                Some((base, offset))
            }
            Some(other) => {
                return Err(format!(
                    "`$plus` takes `[placeholder, integer]` (`[$s1, 2]`), not {}",
                    compact(other)
                ));
            }
        };
        if lower.is_none() && upper.is_none() && exact.is_none() {
            return Err("`$as` needs a bound (`$gt`, `$ge`, `$lt`, `$le` or `$plus`)".into());
        }
        let name = match map.get("$as") {
            None => None,
            Some(Value::String(s)) => match parse_token(s) {
                Ok(Token::Placeholder(Placeholder::Named(name))) => Some(name),
                _ => {
                    return Err(format!(
                        "`$as` takes a named placeholder (`$r2`), not {s:?}"
                    ));
                }
            },
            Some(other) => {
                return Err(format!(
                    "`$as` takes a named placeholder, not {}",
                    type_name(other)
                ));
            }
        };
        Ok(Some(Self {
            lower,
            upper,
            exact,
            name,
        }))
    }

    /// The value `$plus` names, with whether its placeholder holds a decimal string;
    /// `None` without `$plus` or when its placeholder was skipped.
    fn exact_value(&self, bindings: &Bindings) -> Result<Option<(Num, bool)>, String> {
        let Some((base, offset)) = &self.exact else {
            return Ok(None);
        };
        Ok(base.resolve(bindings)?.map(|(b, string)| {
            let sum = match b {
                Num::Int(i) => Num::Int(i + i128::from(*offset)),
                #[allow(clippy::cast_precision_loss)]
                Num::Float(x) => Num::Float(x + *offset as f64),
            };
            (sum, string)
        }))
    }

    /// Whether `actual` is a number within the bounds (`Err` says why not).
    fn check(&self, actual: &Value, bindings: &Bindings) -> Result<(), String> {
        let Some((x, _)) = Num::read(actual) else {
            return Err(format!(
                "expected a number (or a decimal string), got {}",
                type_name(actual)
            ));
        };
        if let Some((want, _)) = self.exact_value(bindings)?
            && x.cmp(want) != Some(std::cmp::Ordering::Equal)
        {
            return Err(format!("expected exactly {want}"));
        }
        if let Some((bound, strict)) = &self.lower
            && let Some((b, _)) = bound.resolve(bindings)?
        {
            let ord = x.cmp(b);
            if ord.is_none_or(|o| o.is_lt() || (*strict && o.is_eq())) {
                return Err(format!(
                    "expected a number {} {b}",
                    if *strict { ">" } else { ">=" }
                ));
            }
        }
        if let Some((bound, strict)) = &self.upper
            && let Some((b, _)) = bound.resolve(bindings)?
        {
            let ord = x.cmp(b);
            if ord.is_none_or(|o| o.is_gt() || (*strict && o.is_eq())) {
                return Err(format!(
                    "expected a number {} {b}",
                    if *strict { "<" } else { "<=" }
                ));
            }
        }
        Ok(())
    }

    /// The value the harness sends for this pattern: the `$plus` sum; else the upper
    /// bound when there is one (minus one when strict), else the lower bound (plus one
    /// when strict); integral when the bound is, and a decimal string when the bound's
    /// placeholder holds one.
    ///
    /// # Errors
    /// An unbound operand, or bounds nothing satisfies.
    pub fn mint(&self, bindings: &Bindings) -> Result<Value, String> {
        let resolve =
            |side: &Option<(Operand, bool)>| -> Result<Option<(Num, bool, bool)>, String> {
                match side {
                    Some((b, strict)) => Ok(b.resolve(bindings)?.map(|(x, s)| (x, s, *strict))),
                    None => Ok(None),
                }
            };
        let (x, string) = if let Some(exact) = self.exact_value(bindings)? {
            exact
        } else if self.exact.is_some() {
            return Err("the placeholder `$plus` starts from was not sent".into());
        } else {
            match (resolve(&self.lower)?, resolve(&self.upper)?) {
                (_, Some((b, s, strict))) => (if strict { b.step(false) } else { b }, s),
                (Some((b, s, strict)), None) => (if strict { b.step(true) } else { b }, s),
                (None, None) => return Err("a comparison needs a bound".into()),
            }
        };
        let value = x.to_value(string)?;
        self.check(&value, bindings)
            .map_err(|e| format!("no value satisfies the comparison: {e}"))?;
        Ok(value)
    }

    /// The value a skipped `$as` takes: the `$plus` sum, else the value of a named lower
    /// bound.
    fn skipped_value(&self, bindings: &Bindings) -> Option<Value> {
        if self.exact.is_some() {
            return self
                .exact_value(bindings)
                .ok()
                .flatten()
                .and_then(|(x, s)| x.to_value(s).ok());
        }
        match &self.lower {
            Some((Operand::Named(n), _)) => bindings.get(n).cloned(),
            _ => None,
        }
    }
}

/// The keys of a reference pattern.
pub const REFERENCE_KEYS: &[&str] = &["$reference", "$requirement", "$otherwise"];

/// A value our reference implementation chooses where the spec leaves the choice:
/// `{$reference: hb-1, $requirement: CR-CONN-021, $otherwise: $_}`. In strict mode (our
/// runs) the value must match `$reference`; in vendor mode it must match `$otherwise`
/// (default `$_`), and where it does not also match `$reference` the run records a
/// [`crate::bind::Difference`] naming the requirement instead of failing. Where the harness
/// sends such a value it sends `$reference`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferencePattern {
    /// Our reference's pattern.
    pub reference: Value,
    /// The `level: reference` requirement it asserts.
    pub requirement: String,
    /// What the spec requires of any implementation.
    pub otherwise: Value,
}

impl ReferencePattern {
    /// Parses `pattern` when it is a reference pattern (an object with the key
    /// `$reference`): `Ok(None)` when it is not one.
    ///
    /// # Errors
    /// A missing or malformed `$requirement`, or an unknown key.
    pub fn parse(pattern: &Value) -> Result<Option<Self>, String> {
        let Value::Object(map) = pattern else {
            return Ok(None);
        };
        let Some(reference) = map.get("$reference") else {
            return Ok(None);
        };
        if let Some(key) = map.keys().find(|k| !REFERENCE_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "a reference pattern takes only {}, not `{key}`",
                REFERENCE_KEYS.join(", ")
            ));
        }
        let requirement = match map.get("$requirement") {
            Some(Value::String(id)) if crate::scenario::validation::is_requirement_id(id) => {
                id.clone()
            }
            _ => return Err("a reference pattern needs `$requirement: <requirement ID>`".into()),
        };
        Ok(Some(Self {
            reference: reference.clone(),
            requirement,
            otherwise: map
                .get("$otherwise")
                .cloned()
                .unwrap_or_else(|| Value::String("$_".into())),
        }))
    }
}

/// The keys of an in-order list pattern.
pub const IN_ORDER_KEYS: &[&str] = &["$in_order", "$besides"];

/// A list whose elements must include the `$in_order` patterns in that order, where
/// any other element must match one of the `$besides` patterns: the form for a list the
/// spec lets a target extend with elements of a known kind (the native calls of a Runtime
/// that closes an idle Executor as soon as its Run ended, which the spec leaves to its
/// resource policy):
/// `{$in_order: [{call: prepare}, {call: start}], $besides: [{call: close_executor}]}`.
/// Matching is greedy: an element that matches the next `$in_order` pattern is taken for
/// it. `$besides` patterns bind nothing: a placeholder in one compares with its bound
/// value, and one not bound yet matches any value.
#[derive(Debug, Clone, PartialEq)]
pub struct InOrderPattern {
    /// The elements that must appear, in this order.
    pub in_order: Vec<Value>,
    /// What any other element must match.
    pub besides: Vec<Value>,
}

impl InOrderPattern {
    /// Parses `pattern` when it is an in-order list pattern (an object with the key
    /// `$in_order`): `Ok(None)` when it is not one.
    ///
    /// # Errors
    /// A non-array `$in_order`, a missing, empty or non-array `$besides`, or another key.
    pub fn parse(pattern: &Value) -> Result<Option<Self>, String> {
        let Value::Object(map) = pattern else {
            return Ok(None);
        };
        let Some(in_order) = map.get("$in_order") else {
            if map.contains_key("$besides") {
                return Err("`$besides` needs `$in_order` beside it".into());
            }
            return Ok(None);
        };
        if let Some(key) = map.keys().find(|k| !IN_ORDER_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "an in-order list pattern takes only {}, not `{key}`",
                IN_ORDER_KEYS.join(", ")
            ));
        }
        let Value::Array(in_order) = in_order else {
            return Err("`$in_order` takes a list of patterns".into());
        };
        let besides = match map.get("$besides") {
            Some(Value::Array(items)) if !items.is_empty() => items.clone(),
            _ => {
                return Err(
                    "`$in_order` needs `$besides`: a non-empty list of the patterns other \
                     elements must match (without it, write the list itself)"
                        .into(),
                );
            }
        };
        Ok(Some(Self {
            in_order: in_order.clone(),
            besides,
        }))
    }

    #[expect(
        clippy::result_large_err,
        reason = "a mismatch is the rare failure path; its fields are the documented interface"
    )]
    fn check(
        &self,
        path: &str,
        expected: &Value,
        actual: &Value,
        bindings: &mut Bindings,
    ) -> Result<(), Mismatch> {
        let Value::Array(items) = actual else {
            return Err(mismatch(
                path,
                expected,
                Some(actual),
                format!("expected an array, got {}", type_name(actual)),
            ));
        };
        let mut next = 0;
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            if let Some(pattern) = self.in_order.get(next) {
                let mut scratch = bindings.clone();
                if match_at(&item_path, pattern, item, &mut scratch).is_ok() {
                    *bindings = scratch;
                    next += 1;
                    continue;
                }
            }
            let allowed = self.besides.iter().any(|pattern| {
                let mut scratch = bindings.clone();
                match_at(&item_path, pattern, item, &mut scratch).is_ok()
            });
            if !allowed {
                let reason = match self.in_order.get(next) {
                    Some(pattern) => format!(
                        "element matches neither the next expected element {} nor any of `$besides`",
                        bounded(pattern)
                    ),
                    None => "element after every expected one matches none of `$besides`".into(),
                };
                return Err(mismatch(&item_path, expected, Some(item), reason));
            }
        }
        match self.in_order.get(next) {
            None => Ok(()),
            Some(pattern) => Err(mismatch(
                path,
                expected,
                Some(actual),
                format!(
                    "{} of {} expected elements found in order; missing {}",
                    next,
                    self.in_order.len(),
                    bounded(pattern)
                ),
            )),
        }
    }
}

/// Why an emitted value does not match the scenario's pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// JSON path of the first difference (`$.payload.revision`).
    pub path: String,
    /// The pattern at that path (as written in the scenario).
    pub expected: Value,
    /// The emitted value at that path (`None` when absent).
    pub actual: Option<Value>,
    /// What went wrong, for people.
    pub reason: String,
    /// The `level: reference` requirement of the `{$reference: …}` pattern that did not
    /// match (strict mode), if that is what failed.
    pub reference: Option<String>,
}

/// Most characters of one value a [`Mismatch`] message shows (a 1 MiB payload must not
/// flood a failure report).
pub const MISMATCH_VALUE_MAX_CHARS: usize = 1024;

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at {}: {}; expected {}",
            self.path,
            self.reason,
            bounded(&self.expected)
        )?;
        match &self.actual {
            Some(actual) => write!(f, ", got {}", bounded(actual)),
            None => write!(f, ", got nothing"),
        }
    }
}

/// A value for a failure message: a long string as its golden summary (length and
/// SHA-256 prefix), anything else compact JSON cut at [`MISMATCH_VALUE_MAX_CHARS`].
fn bounded(value: &Value) -> String {
    if let Value::String(text) = value
        && let Some(summary) = crate::golden::summarize_long_string(text)
    {
        return summary;
    }
    crate::transport::ws::truncate(&compact(value), MISMATCH_VALUE_MAX_CHARS)
}

impl std::error::Error for Mismatch {}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "<unprintable>".to_string())
}

/// The JSON path of `key` under `parent` (`$.a`, or `$["odd key"]` when `key` is not an
/// identifier).
pub fn child_path(parent: &str, key: &str) -> String {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        format!("{parent}.{key}")
    } else {
        format!("{parent}[{}]", compact(&Value::String(key.to_string())))
    }
}

/// Equality of JSON values where numbers compare by value (`1` equals `1.0`).
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y
                || match (x.as_f64(), y.as_f64()) {
                    (Some(fx), Some(fy)) => fx == fy,
                    _ => false,
                }
        }
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| values_equal(x, y))
        }
        (Value::Object(xm), Value::Object(ym)) => {
            xm.len() == ym.len()
                && xm
                    .iter()
                    .all(|(k, x)| ym.get(k).is_some_and(|y| values_equal(x, y)))
        }
        _ => a == b,
    }
}

/// Matches `actual` (emitted by the target) against the pattern `expected`, binding
/// placeholders into `bindings` only if the whole value matched.
///
/// # Errors
/// The first [`Mismatch`] in document order of the pattern.
#[expect(
    clippy::result_large_err,
    reason = "a mismatch is the rare failure path; its fields are the documented interface"
)]
pub fn match_frame(
    expected: &Value,
    actual: &Value,
    bindings: &mut Bindings,
) -> Result<(), Mismatch> {
    let mut scratch = bindings.clone();
    match_at("$", expected, actual, &mut scratch)?;
    *bindings = scratch;
    Ok(())
}

/// Accounts for a typical (`optional:`) frame the target did not send: every named
/// placeholder of `pattern` that is still unbound is marked skipped
/// ([`Bindings::skip`]), except that a comparison's `$as` takes the value of its bound
/// placeholder lower bound, so an ordering chain passes through the missing frame
/// (`started: {$gt: $r3}` with `starting: {$gt: $r2, $as: $r3}` not sent compares with
/// `$r2`). A bound naming a skipped placeholder is no bound.
pub fn skip_pattern(pattern: &Value, bindings: &mut Bindings, requirement: Option<&str>) {
    match pattern {
        Value::String(s) => {
            if let Ok(Token::Placeholder(Placeholder::Named(name))) = parse_token(s)
                && bindings.get(&name).is_none()
            {
                bindings.skip(&name, requirement);
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| skip_pattern(item, bindings, requirement)),
        Value::Object(map) => {
            if let Ok(Some(r)) = ReferencePattern::parse(pattern) {
                skip_pattern(&r.otherwise, bindings, requirement);
                skip_pattern(&r.reference, bindings, requirement);
                return;
            }
            if let Ok(Some(compare)) = ComparePattern::parse(pattern) {
                let Some(name) = compare.name.as_deref() else {
                    return;
                };
                if bindings.get(name).is_some() {
                    return;
                }
                match compare.skipped_value(bindings) {
                    Some(value) => {
                        // Unbound and valid (checked when parsed): cannot fail.
                        let _ = bindings.bind(name, value);
                    }
                    None => bindings.skip(name, requirement),
                }
                return;
            }
            if matches!(GeneratedPattern::parse(pattern), Ok(Some(_))) {
                return;
            }
            if let Ok(Some(list)) = InOrderPattern::parse(pattern) {
                list.in_order
                    .iter()
                    .for_each(|item| skip_pattern(item, bindings, requirement));
                return;
            }
            map.values()
                .for_each(|v| skip_pattern(v, bindings, requirement));
        }
        _ => {}
    }
}

fn mismatch(
    path: &str,
    expected: &Value,
    actual: Option<&Value>,
    reason: impl Into<String>,
) -> Mismatch {
    Mismatch {
        path: path.to_string(),
        expected: expected.clone(),
        actual: actual.cloned(),
        reason: reason.into(),
        reference: None,
    }
}

fn is_absent_marker(pattern: &Value) -> bool {
    matches!(pattern, Value::String(s) if matches!(parse_token(s), Ok(Token::Placeholder(Placeholder::Absent))))
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[expect(
    clippy::result_large_err,
    reason = "a mismatch is the rare failure path; its fields are the documented interface"
)]
fn match_at(
    path: &str,
    expected: &Value,
    actual: &Value,
    bindings: &mut Bindings,
) -> Result<(), Mismatch> {
    match expected {
        Value::String(s) => match parse_token(s) {
            Err(e) => Err(mismatch(path, expected, Some(actual), e.to_string())),
            Ok(Token::Placeholder(Placeholder::Any | Placeholder::Unspecified)) => Ok(()),
            Ok(Token::Placeholder(Placeholder::Absent)) => Err(mismatch(
                path,
                expected,
                Some(actual),
                "field must be absent",
            )),
            Ok(Token::Placeholder(Placeholder::Named(name))) => {
                match bindings.get(&name) {
                    Some(bound) if values_equal(bound, actual) => {}
                    Some(bound) => {
                        return Err(mismatch(
                            path,
                            expected,
                            Some(actual),
                            format!("placeholder `${name}` was bound to {}", compact(bound)),
                        ));
                    }
                    None => bindings
                        .bind(&name, actual.clone())
                        .map_err(|e| mismatch(path, expected, Some(actual), e.to_string()))?,
                }
                bindings.note_matched_at(&name, path);
                Ok(())
            }
            Ok(Token::Literal(text)) => match actual {
                Value::String(a) if *a == text => Ok(()),
                _ => Err(mismatch(
                    path,
                    &Value::String(text.into_owned()),
                    Some(actual),
                    "different value",
                )),
            },
        },
        Value::Object(pattern) => {
            match ReferencePattern::parse(expected) {
                Ok(Some(r)) => return match_reference(path, expected, &r, actual, bindings),
                Err(reason) => return Err(mismatch(path, expected, Some(actual), reason)),
                Ok(None) => {}
            }
            match ComparePattern::parse(expected) {
                Ok(Some(compare)) => {
                    compare
                        .check(actual, bindings)
                        .map_err(|reason| mismatch(path, expected, Some(actual), reason))?;
                    if let Some(name) = &compare.name {
                        bindings
                            .bind(name, actual.clone())
                            .map_err(|e| mismatch(path, expected, Some(actual), e.to_string()))?;
                        bindings.note_matched_at(name, path);
                    }
                    return Ok(());
                }
                Err(reason) => return Err(mismatch(path, expected, Some(actual), reason)),
                Ok(None) => {}
            }
            // `{$not: pattern}`: anything the pattern does not match (a refusal whose
            // code the spec leaves free is still never `OK`); binds nothing.
            if pattern.len() == 1
                && let Some(inner) = pattern.get("$not")
            {
                let mut scratch = bindings.clone();
                return match match_at(path, inner, actual, &mut scratch) {
                    Ok(()) => Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        format!("must not match {}", compact(inner)),
                    )),
                    Err(_) => Ok(()),
                };
            }
            // `{$unordered: [patterns…]}`: an array of as many elements, each pattern
            // matching a different one, in any order (a set the spec does not order).
            if pattern.len() == 1
                && let Some(Value::Array(patterns)) = pattern.get("$unordered")
            {
                let Value::Array(elements) = actual else {
                    return Err(mismatch(path, expected, Some(actual), "expected an array"));
                };
                if elements.len() != patterns.len() {
                    return Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        format!("{} elements, not {}", elements.len(), patterns.len()),
                    ));
                }
                let mut taken = vec![false; elements.len()];
                for (i, p) in patterns.iter().enumerate() {
                    let found = elements.iter().enumerate().find_map(|(j, e)| {
                        if taken[j] {
                            return None;
                        }
                        let mut scratch = bindings.clone();
                        match_at(&format!("{path}[{j}]"), p, e, &mut scratch)
                            .ok()
                            .map(|()| (j, scratch))
                    });
                    match found {
                        Some((j, scratch)) => {
                            taken[j] = true;
                            *bindings = scratch;
                        }
                        None => {
                            return Err(mismatch(
                                path,
                                expected,
                                Some(actual),
                                format!("no element matches pattern {i}: {}", compact(p)),
                            ));
                        }
                    }
                }
                return Ok(());
            }
            // `{$json: pattern}`: a string holding JSON text whose value matches the
            // pattern (a JSON payload carried as text, whatever its spacing, key order or
            // escapes).
            if pattern.len() == 1
                && let Some(inner) = pattern.get("$json")
            {
                let Value::String(text) = actual else {
                    return Err(mismatch(path, expected, Some(actual), "expected JSON text"));
                };
                let parsed: Value = serde_json::from_str(text).map_err(|e| {
                    mismatch(path, expected, Some(actual), format!("not JSON text: {e}"))
                })?;
                return match_at(&format!("{path}<json>"), inner, &parsed, bindings);
            }
            // `{$prefix: text}`: a string that starts with `text` (a stable code before
            // an implementation's own wording).
            if pattern.len() == 1
                && let Some(want) = pattern.get("$prefix")
            {
                let Some(want) = want.as_str() else {
                    return Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        "`$prefix` takes text",
                    ));
                };
                return match actual {
                    Value::String(s) if s.starts_with(want) => Ok(()),
                    _ => Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        format!("expected a string starting with {want:?}"),
                    )),
                };
            }
            // `{$stamp_ms: "$name"}`: milliseconds within the second of the `Z`-shape
            // stamp bound to `$name` (module `stamp`).
            if pattern.len() == 1
                && let Some(operand) = pattern.get(stamp::KEY)
            {
                return stamp::check(operand, actual, bindings)
                    .map_err(|reason| mismatch(path, expected, Some(actual), reason));
            }
            // `{$contains: pattern}`: an object or array holding, at any depth below
            // itself, a value that matches (module `contains`).
            if pattern.len() == 1
                && let Some(inner) = pattern.get(contains::KEY)
            {
                return contains::check(path, inner, actual, bindings, |at, p, v, b| {
                    match_at(at, p, v, b).is_ok()
                })
                .map_err(|reason| mismatch(path, expected, Some(actual), reason));
            }
            // `{$length: N}`: a string of exactly N bytes (a text bound at its edge), or an
            // array of exactly N elements (a page at its bound).
            if pattern.len() == 1
                && let Some(want) = pattern.get("$length")
            {
                let Some(want) = want.as_u64() else {
                    return Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        "`$length` takes a byte or element count",
                    ));
                };
                return match actual {
                    Value::String(s) if s.len() as u64 == want => Ok(()),
                    Value::String(s) => Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        format!("a string of {} bytes, not {want}", s.len()),
                    )),
                    Value::Array(a) if a.len() as u64 == want => Ok(()),
                    Value::Array(a) => Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        format!("an array of {} elements, not {want}", a.len()),
                    )),
                    other => Err(mismatch(
                        path,
                        expected,
                        Some(actual),
                        format!("expected a string or an array, got {}", type_name(other)),
                    )),
                };
            }
            match InOrderPattern::parse(expected) {
                Ok(Some(list)) => return list.check(path, expected, actual, bindings),
                Err(reason) => return Err(mismatch(path, expected, Some(actual), reason)),
                Ok(None) => {}
            }
            match GeneratedPattern::parse(expected) {
                Ok(Some(generated)) => {
                    return generated
                        .check(actual)
                        .map_err(|reason| mismatch(path, expected, Some(actual), reason));
                }
                Err(reason) => return Err(mismatch(path, expected, Some(actual), reason)),
                Ok(None) => {}
            }
            let Value::Object(map) = actual else {
                return Err(mismatch(
                    path,
                    expected,
                    Some(actual),
                    format!("expected an object, got {}", type_name(actual)),
                ));
            };
            for (key, sub) in pattern {
                let sub_path = child_path(path, key);
                match map.get(key) {
                    Some(value) => match_at(&sub_path, sub, value, bindings)?,
                    None if is_absent_marker(sub) => {}
                    None => match ReferencePattern::parse(sub) {
                        // Our reference sends the key; the spec lets it be left out (a
                        // `$otherwise` of `$_` or `$absent`): a difference for a vendor.
                        Ok(Some(r)) if bindings.vendor && allows_absence(&r.otherwise) => {
                            bindings.differences.push(crate::bind::Difference {
                                requirement: r.requirement.clone(),
                                path: sub_path,
                                reference: r.reference.clone(),
                                actual: None,
                            });
                        }
                        Ok(Some(r)) => {
                            let mut m = mismatch(
                                &sub_path,
                                sub,
                                None,
                                format!(
                                    "missing field (our reference behaviour, {})",
                                    r.requirement
                                ),
                            );
                            m.reference = Some(r.requirement.clone());
                            return Err(m);
                        }
                        _ => return Err(mismatch(&sub_path, sub, None, "missing field")),
                    },
                }
            }
            Ok(())
        }
        Value::Array(pattern) => {
            let Value::Array(items) = actual else {
                return Err(mismatch(
                    path,
                    expected,
                    Some(actual),
                    format!("expected an array, got {}", type_name(actual)),
                ));
            };
            if pattern.len() != items.len() {
                return Err(mismatch(
                    path,
                    expected,
                    Some(actual),
                    format!("expected {} elements, got {}", pattern.len(), items.len()),
                ));
            }
            for (i, (sub, value)) in pattern.iter().zip(items).enumerate() {
                match_at(&format!("{path}[{i}]"), sub, value, bindings)?;
            }
            Ok(())
        }
        scalar => {
            if values_equal(scalar, actual) {
                Ok(())
            } else {
                Err(mismatch(path, expected, Some(actual), "different value"))
            }
        }
    }
}

/// Whether a reference pattern's `$otherwise` lets the key be left out: `$_` (any value,
/// or none) and `$absent`.
fn allows_absence(otherwise: &Value) -> bool {
    matches!(
        otherwise.as_str().map(parse_token),
        Some(Ok(Token::Placeholder(
            Placeholder::Any | Placeholder::Absent
        )))
    )
}

/// Matches a reference pattern (see [`ReferencePattern`]) in the run's mode.
#[expect(
    clippy::result_large_err,
    reason = "a mismatch is the rare failure path; its fields are the documented interface"
)]
fn match_reference(
    path: &str,
    expected: &Value,
    r: &ReferencePattern,
    actual: &Value,
    bindings: &mut Bindings,
) -> Result<(), Mismatch> {
    if !bindings.vendor {
        // Strict: our reference value; `$otherwise` still binds what it names, so that
        // later patterns (`{$gt: $r1}`) can refer to it.
        match_at(path, &r.reference, actual, bindings).map_err(|mut m| {
            m.reason = format!("{} (our reference behaviour, {})", m.reason, r.requirement);
            m.reference = Some(r.requirement.clone());
            m
        })?;
        let mut trial = bindings.clone();
        if match_at(path, &r.otherwise, actual, &mut trial).is_ok() {
            *bindings = trial;
        }
        return Ok(());
    }
    // Vendor: what the spec requires; a value that differs from ours is recorded.
    match_at(path, &r.otherwise, actual, bindings).map_err(|mut m| {
        m.expected = expected.clone();
        m
    })?;
    let mut trial = bindings.clone();
    if match_at(path, &r.reference, actual, &mut trial).is_err() {
        bindings.differences.push(crate::bind::Difference {
            requirement: r.requirement.clone(),
            path: path.to_string(),
            reference: r.reference.clone(),
            actual: Some(actual.clone()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_patterns_ignore_spacing_and_key_order() {
        let mut b = Bindings::default();
        let p = json!({"out": {"$json": {"a": 1, "b": "$x"}}});
        match_frame(
            &p,
            &json!({"out": "{ \"b\": \"\\u0041\", \"a\": 1 }"}),
            &mut b,
        )
        .unwrap();
        assert_eq!(b.get("x"), Some(&json!("A")));
        assert!(match_frame(&p, &json!({"out": "{\"a\":2,\"b\":\"A\"}"}), &mut b).is_err());
        assert!(match_frame(&p, &json!({"out": "not json"}), &mut b).is_err());
    }

    #[test]
    fn unordered_arrays_match_each_pattern_to_a_different_element() {
        let mut b = Bindings::default();
        let p = json!({"t": {"$unordered": [{"name": "a"}, {"name": "b", "n": "$n"}]}});
        match_frame(
            &p,
            &json!({"t": [{"name": "b", "n": 2}, {"name": "a"}]}),
            &mut b,
        )
        .unwrap();
        assert_eq!(b.get("n"), Some(&json!(2)));
        let mut b = Bindings::default();
        assert!(match_frame(&p, &json!({"t": [{"name": "a"}, {"name": "a"}]}), &mut b).is_err());
        assert!(match_frame(&p, &json!({"t": [{"name": "a"}]}), &mut b).is_err());
    }

    #[test]
    fn not_and_prefix_patterns() {
        let mut b = Bindings::default();
        let refused = json!({"status": {"code": {"$not": "OK"}, "message": {"$prefix": "already_initialized:"}}});
        match_frame(
            &refused,
            &json!({"status": {"code": "FAILED_PRECONDITION", "message": "already_initialized: once"}}),
            &mut b,
        )
        .unwrap();
        assert!(
            match_frame(
                &refused,
                &json!({"status": {"code": "OK", "message": "already_initialized: x"}}),
                &mut b
            )
            .is_err()
        );
        assert!(
            match_frame(
                &refused,
                &json!({"status": {"code": "UNKNOWN", "message": "other"}}),
                &mut b
            )
            .is_err()
        );
        assert!(
            match_frame(
                &refused,
                &json!({"status": {"code": "UNKNOWN", "message": 3}}),
                &mut b
            )
            .is_err()
        );
        // `$not` binds nothing, even when its pattern would.
        match_frame(&json!({"a": {"$not": "$x"}}), &json!({"b": 1}), &mut b).ok();
        assert!(b.get("x").is_none());
    }

    #[test]
    fn unspecified_matches_anything_and_the_golden_records_a_mark() {
        let pattern =
            json!({"turn_id": "$turn", "state": "$unspecified", "list": ["$unspecified", 2]});
        let emitted = json!({"turn_id": "t-1", "state": "starting", "list": [1, 2], "other": 3});
        let mut b = Bindings::default();
        match_frame(&pattern, &emitted, &mut b).unwrap();
        assert_eq!(
            mask_unspecified(&pattern, &emitted),
            json!({"turn_id": "t-1", "state": "<unspecified>", "list": ["<unspecified>", 2], "other": 3})
        );
        // It must still be present, and it is never sent.
        let mut b = Bindings::default();
        assert!(match_frame(&pattern, &json!({"turn_id": "t", "list": [1, 2]}), &mut b).is_err());
        assert!(
            b.substitute(&json!({"state": "$unspecified"}), true)
                .is_err()
        );
    }
    use serde_json::json;

    #[test]
    fn a_reference_key_may_be_left_out_by_a_vendor_when_the_spec_allows_it() {
        let pattern = json!({"status": "rejected", "admission_handle": {"$reference": "$h1", "$requirement": "CR-PREP-037"}});
        let frame = json!({"status": "rejected"});
        let mut strict = Bindings::new();
        strict.bind("h1", json!("h-1")).unwrap();
        let mut vendor = strict.clone();
        vendor.vendor = true;
        let m = match_frame(&pattern, &frame, &mut strict).unwrap_err();
        assert_eq!(m.reference.as_deref(), Some("CR-PREP-037"));
        match_frame(&pattern, &frame, &mut vendor).unwrap();
        assert_eq!(vendor.differences.len(), 1);
        assert_eq!(vendor.differences[0].actual, None);
        // A required value (`$otherwise` not `$_`/`$absent`) stays required.
        let pattern = json!({"admission_handle": {"$reference": "$h1", "$requirement": "CR-PREP-037", "$otherwise": "$h2"}});
        assert!(match_frame(&pattern, &frame, &mut vendor).is_err());
    }

    #[test]
    fn reference_values_are_strict_for_us_and_differences_for_vendors() {
        let pattern = json!({"id": {"$reference": "hb-1", "$requirement": "CR-CONN-021"}, "type": "heartbeat"});
        let theirs = json!({"id": "beat-7", "type": "heartbeat"});
        let mut strict = Bindings::new();
        let m = match_frame(&pattern, &theirs, &mut strict).unwrap_err();
        assert_eq!(m.reference.as_deref(), Some("CR-CONN-021"));
        assert!(m.reason.contains("our reference behaviour"), "{m:?}");
        match_frame(
            &pattern,
            &json!({"id": "hb-1", "type": "heartbeat"}),
            &mut strict,
        )
        .unwrap();
        assert!(strict.differences.is_empty());
        let mut vendor = Bindings::new();
        vendor.vendor = true;
        match_frame(&pattern, &theirs, &mut vendor).unwrap();
        assert_eq!(vendor.differences.len(), 1);
        assert_eq!(vendor.differences[0].path, "$.id");
        assert_eq!(vendor.differences[0].actual, Some(json!("beat-7")));
        // A frame that fails elsewhere commits no difference.
        let mut vendor = Bindings::new();
        vendor.vendor = true;
        assert!(match_frame(&pattern, &json!({"id": "x", "type": "other"}), &mut vendor).is_err());
        assert!(vendor.differences.is_empty());
        // `$otherwise` is still required in vendor mode.
        let bounded =
            json!({"$reference": 1, "$requirement": "CR-PREP-013", "$otherwise": {"$gt": 0}});
        let mut vendor = Bindings::new();
        vendor.vendor = true;
        assert!(match_frame(&bounded, &json!(0), &mut vendor).is_err());
        match_frame(&bounded, &json!(100), &mut vendor).unwrap();
        assert!(ReferencePattern::parse(&json!({"$reference": 1})).is_err());
        assert!(
            ReferencePattern::parse(&json!({"$reference": 1, "$requirement": "CR-A-001", "x": 1}))
                .is_err()
        );
    }

    #[test]
    fn generated_pattern_matches_exact_content() {
        use base64::Engine as _;
        let mut content = vec![0u8; 40];
        GeneratedContent::new(7).fill(&mut content);
        let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut b = Bindings::new();
        let pat = |offset: u64, size: u64| json!({"data": {"$generated": {"seed": 7, "offset": offset, "size": size}}});
        match_frame(&pat(0, 40), &json!({"data": encode(&content)}), &mut b).unwrap();
        // From an offset that is not a word boundary.
        match_frame(
            &pat(13, 20),
            &json!({"data": encode(&content[13..33])}),
            &mut b,
        )
        .unwrap();
        match_frame(
            &json!({"data": {"$generated": {"seed": 7, "size": 3}}}),
            &json!({"data": encode(&content[..3])}),
            &mut b,
        )
        .unwrap();
        let err = match_frame(
            &pat(0, 40),
            &json!({"data": encode(&content[..39])}),
            &mut b,
        )
        .unwrap_err();
        assert_eq!(err.path, "$.data");
        assert_eq!(
            err.reason,
            "expected 40 bytes of generated content, got 39 bytes"
        );
        let mut wrong = content.clone();
        wrong[17] ^= 1;
        let err = match_frame(&pat(0, 40), &json!({"data": encode(&wrong)}), &mut b).unwrap_err();
        assert!(err.reason.starts_with("byte 17 differs"), "{}", err.reason);
        let err = match_frame(&pat(0, 1), &json!({"data": "!!"}), &mut b).unwrap_err();
        assert!(err.reason.starts_with("not valid base64"), "{}", err.reason);
        let err = match_frame(&pat(0, 1), &json!({"data": 5}), &mut b).unwrap_err();
        assert_eq!(err.reason, "expected a base64 string, got number");
        for bad in [
            json!({"$generated": {"seed": 7}}),
            json!({"$generated": {"seed": -1, "size": 1}}),
            json!({"$generated": {"seed": 7, "size": 1, "sise": 1}}),
            json!({"$generated": {"seed": 7, "size": 1}, "other": 1}),
            json!({"$generated": 3}),
        ] {
            assert!(GeneratedPattern::parse(&bad).is_err(), "{bad}");
        }
        assert_eq!(GeneratedPattern::parse(&json!({"a": 1})), Ok(None));
    }

    #[test]
    fn generated_patterns_expand_to_base64_in_sent_values() {
        use base64::Engine as _;
        let mut content = vec![0u8; 40];
        GeneratedContent::new(7).fill(&mut content);
        let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let body = json!({"content_base64": {"$generated": {"seed": 7, "offset": 5, "size": 30}},
                          "list": [{"$generated": {"seed": 7, "size": 0}}, "$x"], "n": 1});
        assert_eq!(
            expand_generated(&body).unwrap(),
            json!({"content_base64": encode(&content[5..35]), "list": ["", "$x"], "n": 1})
        );
        // Starts `d7 0d 32 59 e4 e1 cb 63` (docs/scenario-format.md).
        let pattern = GeneratedPattern {
            seed: 7,
            offset: 0,
            size: 8,
        };
        assert_eq!(
            pattern.base64(),
            encode(&[0xd7, 0x0d, 0x32, 0x59, 0xe4, 0xe1, 0xcb, 0x63])
        );
        let err = expand_generated(&json!({"a": [{"$generated": {"seed": 7}}]})).unwrap_err();
        assert_eq!(err, "at $.a[0]: `$generated` needs `size`");
    }

    #[test]
    fn long_values_are_bounded_in_messages() {
        let long = "A".repeat(4000);
        let mut b = Bindings::new();
        let err = match_frame(&json!({"d": "short"}), &json!({"d": long}), &mut b).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("got <string: 4000 bytes, sha256 "), "{text}");
        assert!(text.len() < 200, "{text}");
        let err = match_frame(&json!({"d": 1}), &json!({"d": [long]}), &mut b).unwrap_err();
        assert!(err.to_string().len() < MISMATCH_VALUE_MAX_CHARS + 200);
    }

    #[test]
    fn absent_marker_requires_a_missing_key() {
        let mut b = Bindings::new();
        let pat = json!({"payload": {"code": "x", "http_status": "$absent"}});
        match_frame(&pat, &json!({"payload": {"code": "x"}}), &mut b).unwrap();
        let err = match_frame(
            &pat,
            &json!({"payload": {"code": "x", "http_status": 429}}),
            &mut b,
        )
        .unwrap_err();
        assert_eq!(err.path, "$.payload.http_status");
        assert_eq!(err.reason, "field must be absent");
        assert!(b.get("absent").is_none());
    }

    #[test]
    fn subset_objects_and_binding() {
        let mut b = Bindings::new();
        let pat = json!({"type": "t", "payload": {"h": "$h"}});
        let act = json!({"type": "t", "id": "1", "payload": {"h": "abc", "extra": 1}});
        match_frame(&pat, &act, &mut b).unwrap();
        assert_eq!(b.get("h"), Some(&json!("abc")));
        // compared after binding
        let act2 = json!({"type": "t", "payload": {"h": "zzz"}});
        let err = match_frame(&pat, &act2, &mut b).unwrap_err();
        assert_eq!(err.path, "$.payload.h");
        assert!(err.reason.contains("bound to \"abc\""), "{err}");
    }

    #[test]
    fn any_and_escape() {
        let mut b = Bindings::new();
        match_frame(&json!({"a": "$_"}), &json!({"a": {"x": [1]}}), &mut b).unwrap();
        assert!(b.is_empty());
        match_frame(&json!({"a": "$$x"}), &json!({"a": "$x"}), &mut b).unwrap();
        let err = match_frame(&json!({"a": "$$x"}), &json!({"a": "y"}), &mut b).unwrap_err();
        assert_eq!(err.expected, json!("$x"));
    }

    #[test]
    fn arrays_exact_length_and_nested() {
        let mut b = Bindings::new();
        let pat = json!({"xs": [{"k": "$k"}, 2]});
        match_frame(&pat, &json!({"xs": [{"k": 5, "o": 1}, 2]}), &mut b).unwrap();
        assert_eq!(b.get("k"), Some(&json!(5)));
        let err = match_frame(&pat, &json!({"xs": [{"k": 5}]}), &mut b).unwrap_err();
        assert_eq!(err.path, "$.xs");
        let err = match_frame(&pat, &json!({"xs": [{"k": 5}, 3]}), &mut b).unwrap_err();
        assert_eq!(err.path, "$.xs[1]");
        assert!(err.to_string().contains("expected 2, got 3"), "{err}");
    }

    #[test]
    fn missing_field_and_types() {
        let mut b = Bindings::new();
        let err = match_frame(&json!({"a": {"b": 1}}), &json!({"a": {}}), &mut b).unwrap_err();
        assert_eq!(err.path, "$.a.b");
        assert_eq!(err.actual, None);
        let err = match_frame(&json!({"a": {"b": 1}}), &json!({"a": 1}), &mut b).unwrap_err();
        assert!(err.reason.contains("object"));
        assert!(values_equal(&json!(1), &json!(1.0)));
    }

    #[test]
    fn no_partial_binding_on_mismatch() {
        let mut b = Bindings::new();
        let pat = json!({"a": "$a", "b": 1});
        assert!(match_frame(&pat, &json!({"a": "x", "b": 2}), &mut b).is_err());
        assert_eq!(b.get("a"), None);
    }

    #[test]
    fn comparisons_order_values_and_bind_them() {
        let mut b = Bindings::new();
        match_frame(
            &json!({"revision": "$r1"}),
            &json!({"revision": 100}),
            &mut b,
        )
        .unwrap();
        let next = json!({"revision": {"$gt": "$r1", "$as": "$r2"}});
        let err = match_frame(&next, &json!({"revision": 100}), &mut b).unwrap_err();
        assert!(err.reason.contains("> 100"), "{err:?}");
        assert_eq!(b.get("r2"), None);
        match_frame(&next, &json!({"revision": 107}), &mut b).unwrap();
        assert_eq!(b.get("r2"), Some(&json!(107)));
        // At the bound and one past it.
        let expiry = json!({"expires_in_ms": {"$gt": 0, "$le": 300000}});
        match_frame(&expiry, &json!({"expires_in_ms": 300000}), &mut b).unwrap();
        assert!(match_frame(&expiry, &json!({"expires_in_ms": 300001}), &mut b).is_err());
        assert!(match_frame(&expiry, &json!({"expires_in_ms": 0}), &mut b).is_err());
        assert!(match_frame(&expiry, &json!({"expires_in_ms": "5x"}), &mut b).is_err());
        assert!(match_frame(&expiry, &json!({"expires_in_ms": ""}), &mut b).is_err());
        assert!(match_frame(&expiry, &json!({"expires_in_ms": "1e3"}), &mut b).is_err());
        // An unbound operand is a mismatch naming it.
        let err =
            match_frame(&json!({"r": {"$ge": "$nope"}}), &json!({"r": 1}), &mut b).unwrap_err();
        assert!(err.reason.contains("`$nope` is not bound yet"), "{err:?}");
    }

    #[test]
    fn comparisons_are_parsed_strictly_and_mint_a_bound() {
        for bad in [
            json!({"$gt": 1, "$ge": 1}),
            json!({"$lt": 1, "$le": 1}),
            json!({"$as": "$x"}),
            json!({"$gt": "x"}),
            json!({"$gt": 1, "other": 2}),
            json!({"$gt": 1, "$as": "x"}),
        ] {
            assert!(ComparePattern::parse(&bad).is_err(), "{bad}");
        }
        assert_eq!(ComparePattern::parse(&json!({"a": 1})), Ok(None));
        let mut b = Bindings::new();
        b.bind("r1", json!(4)).unwrap();
        let mint = |p: Value, b: &Bindings| ComparePattern::parse(&p).unwrap().unwrap().mint(b);
        assert_eq!(mint(json!({"$gt": "$r1"}), &b), Ok(json!(5)));
        assert_eq!(mint(json!({"$ge": "$r1"}), &b), Ok(json!(4)));
        assert_eq!(mint(json!({"$lt": 10}), &b), Ok(json!(9)));
        assert_eq!(
            mint(json!({"$gt": 0, "$le": 300000}), &b),
            Ok(json!(300000))
        );
        assert!(mint(json!({"$gt": 5, "$lt": 6}), &b).is_err());
    }

    #[test]
    fn comparisons_read_decimal_strings_as_the_integers_they_spell() {
        // proto3 JSON writes a uint64 as a decimal string.
        let mut b = Bindings::new();
        match_frame(&json!({"s": "$s1"}), &json!({"s": "1000"}), &mut b).unwrap();
        let later = json!({"s": {"$gt": "$s1", "$as": "$s2"}});
        assert!(match_frame(&later, &json!({"s": "1000"}), &mut b).is_err());
        assert!(match_frame(&later, &json!({"s": "999"}), &mut b).is_err());
        match_frame(&later, &json!({"s": "1001"}), &mut b).unwrap();
        assert_eq!(b.get("s2"), Some(&json!("1001")));
        // Past 2^53, exactly: u64::MAX - 1 < u64::MAX.
        let mut b = Bindings::new();
        b.bind("top", json!("18446744073709551615")).unwrap();
        let below = json!({"s": {"$lt": "$top"}});
        match_frame(&below, &json!({"s": "18446744073709551614"}), &mut b).unwrap();
        assert!(match_frame(&below, &json!({"s": "18446744073709551615"}), &mut b).is_err());
        // A number and a string of the same integer compare equal; a literal bound too.
        match_frame(
            &json!({"s": {"$ge": 5, "$le": 5}}),
            &json!({"s": "5"}),
            &mut b,
        )
        .unwrap();
        match_frame(
            &json!({"s": {"$ge": "$top"}}),
            &json!({"s": 18446744073709551615u64}),
            &mut b,
        )
        .unwrap();
        // A minted value keeps the placeholder's spelling.
        let mint = |p: Value, b: &Bindings| ComparePattern::parse(&p).unwrap().unwrap().mint(b);
        assert_eq!(
            mint(json!({"$lt": "$top"}), &b),
            Ok(json!("18446744073709551614"))
        );
        b.bind("n", json!(7)).unwrap();
        assert_eq!(mint(json!({"$gt": "$n"}), &b), Ok(json!(8)));
    }

    #[test]
    fn matches_note_the_path_each_placeholder_matched_at() {
        let mut b = Bindings::new();
        let pattern = json!({"event": {"sequence": "$s1"}, "next": {"seq": [{"$plus": ["$s1", 1], "$as": "$s2"}]}});
        match_frame(
            &pattern,
            &json!({"event": {"sequence": "1"}, "next": {"seq": ["2"]}}),
            &mut b,
        )
        .unwrap();
        assert_eq!(b.name_at(&json!("1"), "$.event.sequence"), Some("s1"));
        assert_eq!(b.name_at(&json!("1"), "$.epoch"), None);
        assert_eq!(b.name_at(&json!("2"), "$.next.seq[5]"), Some("s2"));
        // A failed match notes nothing.
        let _ = match_frame(
            &json!({"epoch": "$s1", "x": "nope"}),
            &json!({"epoch": "1", "x": "y"}),
            &mut b,
        );
        assert_eq!(b.name_at(&json!("1"), "$.epoch"), None);
        match_frame(&json!({"epoch": "$s1"}), &json!({"epoch": "1"}), &mut b).unwrap();
        assert_eq!(b.name_at(&json!("1"), "$.epoch"), Some("s1"));
    }

    #[test]
    fn plus_is_exactly_an_offset_from_a_bound_value() {
        let mut b = Bindings::new();
        b.bind("s1", json!("1000")).unwrap();
        let next = json!({"s": {"$plus": ["$s1", 1], "$as": "$s2"}});
        assert!(match_frame(&next, &json!({"s": "1000"}), &mut b).is_err());
        let err = match_frame(&next, &json!({"s": "1002"}), &mut b).unwrap_err();
        assert!(err.reason.contains("exactly 1001"), "{err:?}");
        assert_eq!(b.get("s2"), None);
        match_frame(&next, &json!({"s": "1001"}), &mut b).unwrap();
        assert_eq!(b.get("s2"), Some(&json!("1001")));
        // `$as` naming a bound placeholder also requires its value.
        b.bind("s7", json!("1006")).unwrap();
        let seventh = json!({"s": {"$plus": ["$s1", 6], "$as": "$s7"}});
        match_frame(&seventh, &json!({"s": "1006"}), &mut b).unwrap();
        b.bind("x", json!("1005")).unwrap();
        assert!(
            match_frame(
                &json!({"s": {"$plus": ["$s1", 5], "$as": "$s7"}}),
                &json!({"s": "1005"}),
                &mut b
            )
            .is_err()
        );
        // Negative offsets and numbers.
        match_frame(
            &json!({"s": {"$plus": ["$s1", -1]}}),
            &json!({"s": 999}),
            &mut b,
        )
        .unwrap();
        // Minted: the sum, in the placeholder's spelling.
        let mint = |p: Value, b: &Bindings| ComparePattern::parse(&p).unwrap().unwrap().mint(b);
        assert_eq!(mint(json!({"$plus": ["$s1", 3]}), &b), Ok(json!("1003")));
        b.bind("n", json!(4)).unwrap();
        assert_eq!(mint(json!({"$plus": ["$n", -4]}), &b), Ok(json!(0)));
        // Strict parsing.
        for bad in [
            json!({"$plus": ["$s1"]}),
            json!({"$plus": [3, 1]}),
            json!({"$plus": ["$s1", 1.5]}),
            json!({"$plus": ["$s1", "1"]}),
            json!({"$plus": "$s1"}),
            json!({"$plus": ["$s1", 1], "$gt": 0}),
            json!({"$plus": ["$s1", 1], "other": 0}),
        ] {
            assert!(ComparePattern::parse(&bad).is_err(), "{bad}");
        }
        // A typical frame not sent: `$as` takes the sum, so the chain goes on.
        let mut b = Bindings::new();
        b.bind("s1", json!("5")).unwrap();
        skip_pattern(
            &json!({"s": {"$plus": ["$s1", 2], "$as": "$s3"}}),
            &mut b,
            None,
        );
        assert_eq!(b.get("s3"), Some(&json!("7")));
    }

    #[test]
    fn same_placeholder_twice_in_one_frame() {
        let mut b = Bindings::new();
        let pat = json!({"a": "$x", "b": "$x"});
        assert!(match_frame(&pat, &json!({"a": "1", "b": "2"}), &mut b).is_err());
        assert!(b.is_empty());
        match_frame(&pat, &json!({"a": "1", "b": "1"}), &mut b).unwrap();
    }
    #[test]
    fn in_order_lists_allow_only_their_besides_between_the_expected_elements() {
        let pat = json!({"calls": {"$in_order": [{"call": "prepare", "executor_id": "$e"}, {"call": "start", "executor_id": "$e"}],
                                   "$besides": [{"call": "close_executor"}]}});
        let call = |c: &str, e: &str| json!({"call": c, "executor_id": e});
        let mut b = Bindings::default();
        // Exactly the expected elements.
        match_frame(
            &pat,
            &json!({"calls": [call("prepare", "x"), call("start", "x")]}),
            &mut b,
        )
        .unwrap();
        assert_eq!(b.get("e"), Some(&json!("x")));
        // A close before, between and after them is allowed.
        let mut b = Bindings::default();
        let calls = json!({"calls": [call("close_executor", "o"), call("prepare", "x"), call("close_executor", "o"),
                                     call("start", "x"), call("close_executor", "x")]});
        match_frame(&pat, &calls, &mut b).unwrap();
        // Any other element is not; the failure names it.
        let mut b = Bindings::default();
        let err = match_frame(
            &pat,
            &json!({"calls": [call("prepare", "x"), call("cancel", "x"), call("start", "x")]}),
            &mut b,
        )
        .unwrap_err();
        assert_eq!(err.path, "$.calls[1]");
        // Order matters, and every expected element must come.
        let mut b = Bindings::default();
        let err = match_frame(&pat, &json!({"calls": [call("prepare", "x")]}), &mut b).unwrap_err();
        assert!(err.reason.contains("1 of 2"), "{err}");
        let mut b = Bindings::default();
        assert!(
            match_frame(
                &pat,
                &json!({"calls": [call("start", "x"), call("prepare", "x")]}),
                &mut b
            )
            .is_err()
        );
        // A bound placeholder still binds: another Executor's start is not the expected one.
        let mut b = Bindings::default();
        assert!(
            match_frame(
                &pat,
                &json!({"calls": [call("prepare", "x"), call("start", "y")]}),
                &mut b
            )
            .is_err()
        );
        assert!(b.get("e").is_none(), "a failed match binds nothing");
        // `$besides` compares with bound placeholders and binds nothing.
        let pat = json!({"$in_order": [{"call": "start"}], "$besides": [{"call": "close_executor", "executor_id": "$e"}]});
        let mut b = Bindings::default();
        match_frame(
            &pat,
            &json!([call("close_executor", "o"), call("start", "x")]),
            &mut b,
        )
        .unwrap();
        assert!(b.get("e").is_none());
        b.bind("e", json!("x")).unwrap();
        assert!(
            match_frame(
                &pat,
                &json!([call("close_executor", "o"), call("start", "x")]),
                &mut b
            )
            .is_err()
        );
        match_frame(
            &pat,
            &json!([call("start", "x"), call("close_executor", "x")]),
            &mut b,
        )
        .unwrap();
    }

    #[test]
    fn length_patterns_count_bytes() {
        let mut b = Bindings::default();
        match_frame(&json!({"e": {"$length": 3}}), &json!({"e": "é!"}), &mut b).unwrap();
        assert!(match_frame(&json!({"e": {"$length": 2}}), &json!({"e": "é!"}), &mut b).is_err());
        assert!(match_frame(&json!({"e": {"$length": 2}}), &json!({"e": 12}), &mut b).is_err());
        match_frame(
            &json!({"e": {"$length": 2}}),
            &json!({"e": [1, "x"]}),
            &mut b,
        )
        .unwrap();
        assert!(
            match_frame(
                &json!({"e": {"$length": 3}}),
                &json!({"e": [1, "x"]}),
                &mut b
            )
            .is_err()
        );
    }

    #[test]
    fn text_values_expand_to_their_exact_size() {
        let v = expand_text(
            &json!({"code": {"$text": {"size": 10, "prefix": "#", "fill": " "}}, "n": [1]}),
        )
        .unwrap();
        assert_eq!(v, json!({"code": "#         ", "n": [1]}));
        assert_eq!(
            expand_text(&json!({"$text": {"size": 3}})).unwrap(),
            json!("xxx")
        );
        assert_eq!(
            expand_text(&json!({"$text": {"size": 5, "prefix": "<", "suffix": "é"}})).unwrap(),
            json!("<xxé")
        );
        for bad in [
            json!({"$text": {"size": 1, "prefix": "ab"}}),
            json!({"$text": {"size": 2, "prefix": "a", "suffix": "é"}}),
            json!({"$text": {"size": 2, "suffix": 1}}),
            json!({"$text": {"size": 1, "fill": "ab"}}),
            json!({"$text": {"size": -1}}),
            json!({"$text": {"size": 1, "other": 1}}),
            json!({"$text": 3}),
        ] {
            assert!(expand_text(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn in_order_lists_are_well_formed() {
        for bad in [
            json!({"$in_order": [1]}),
            json!({"$in_order": [1], "$besides": []}),
            json!({"$in_order": 1, "$besides": [2]}),
            json!({"$in_order": [1], "$besides": [2], "x": 3}),
            json!({"$besides": [2]}),
        ] {
            assert!(InOrderPattern::parse(&bad).is_err(), "{bad}");
        }
        assert_eq!(InOrderPattern::parse(&json!({"a": 1})), Ok(None));
        assert!(
            InOrderPattern::parse(&json!({"$in_order": [], "$besides": [{"call": "$_"}]}))
                .unwrap()
                .is_some()
        );
    }
}
