//! Strict JSON decoding and encoding.
//!
//! `serde_json` keeps the *last* of duplicate keys silently and writes a non-finite
//! `f64` as `null`. The protocols require the opposite, so every frame first goes
//! through [`parse_strict`], which builds a [`serde_json::Value`] while refusing
//! duplicate keys and `null` at any depth, and only then through typed decoding
//! ([`decode_strict`]) whose serde models use `deny_unknown_fields`.
//!
//! No protocol in this suite assigns a meaning to JSON `null`: an optional field is
//! either absent or present with a value. A `null` is therefore always a typed
//! [`WireError::NullValue`], never "absent".

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserializer, Serialize};
use serde_json::{Map, Value};

/// A rejected frame or value. Every variant has a stable [`code`](WireError::code)
/// that tests, goldens and peers compare; the `Display` text is for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The bytes are not one well-formed JSON document (includes `NaN`/`Infinity`
    /// literals, which are not JSON).
    #[error("malformed JSON: {0}")]
    Malformed(String),
    /// The same key appears twice in one JSON object.
    #[error("duplicate key `{key}` at {path}")]
    DuplicateKey {
        /// JSON path of the object holding the key (`$` is the root).
        path: String,
        /// The repeated key.
        key: String,
    },
    /// A `null` appeared where the protocol only allows absence or a value.
    #[error("null value at {path}")]
    NullValue {
        /// JSON path of the `null`.
        path: String,
    },
    /// A field the schema does not define.
    #[error("unknown field `{field}` at {path}")]
    UnknownField {
        /// JSON path of the object holding the field.
        path: String,
        /// The unknown field name.
        field: String,
    },
    /// A required field is absent.
    #[error("missing field `{field}` at {path}")]
    MissingField {
        /// JSON path of the object lacking the field.
        path: String,
        /// The missing field name.
        field: String,
    },
    /// A value of the wrong type, out of range, over its bound or otherwise invalid.
    #[error("invalid value at {path}: {reason}")]
    InvalidValue {
        /// JSON path of the value.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The Envelope names a message type the family does not define.
    #[error("unknown message type `{0}`")]
    UnknownType(String),
    /// A known message type sent in the direction the spec does not allow.
    #[error("message type `{0}` is not allowed in this direction")]
    WrongDirection(String),
    /// A frame larger than the bound the spec sets for it.
    #[error("frame of {size} bytes exceeds the {limit}-byte bound")]
    FrameTooLarge {
        /// Size of the offending frame in bytes.
        size: usize,
        /// The bound in bytes.
        limit: usize,
    },
    /// Encoding met a non-finite number (NaN or ±Infinity).
    #[error("non-finite number at {path}")]
    NonFinite {
        /// JSON path of the number.
        path: String,
    },
}

impl WireError {
    /// Stable machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            WireError::Malformed(_) => "malformed_json",
            WireError::DuplicateKey { .. } => "duplicate_key",
            WireError::NullValue { .. } => "null_value",
            WireError::UnknownField { .. } => "unknown_field",
            WireError::MissingField { .. } => "missing_field",
            WireError::InvalidValue { .. } => "invalid_value",
            WireError::UnknownType(_) => "unknown_type",
            WireError::WrongDirection(_) => "wrong_direction",
            WireError::FrameTooLarge { .. } => "frame_too_large",
            WireError::NonFinite { .. } => "non_finite_number",
        }
    }

    /// Builds an [`WireError::InvalidValue`] for `path`.
    pub fn invalid(path: impl Into<String>, reason: impl Into<String>) -> Self {
        WireError::InvalidValue {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Prefixes the error's path with `prefix` (used when a payload is decoded on
    /// its own but reported relative to the Envelope).
    pub fn under(self, prefix: &str) -> Self {
        // `$` becomes `$.prefix`, `$.a[0]` becomes `$.prefix.a[0]`.
        let join = |p: String| format!("$.{prefix}{}", p.trim_start_matches('$'));
        match self {
            WireError::DuplicateKey { path, key } => WireError::DuplicateKey {
                path: join(path),
                key,
            },
            WireError::NullValue { path } => WireError::NullValue { path: join(path) },
            WireError::UnknownField { path, field } => WireError::UnknownField {
                path: join(path),
                field,
            },
            WireError::MissingField { path, field } => WireError::MissingField {
                path: join(path),
                field,
            },
            WireError::InvalidValue { path, reason } => WireError::InvalidValue {
                path: join(path),
                reason,
            },
            WireError::NonFinite { path } => WireError::NonFinite { path: join(path) },
            other => other,
        }
    }
}

/// Parses one JSON document, refusing duplicate keys and `null` at any depth.
///
/// # Errors
/// [`WireError::Malformed`], [`WireError::DuplicateKey`], [`WireError::NullValue`].
pub fn parse_strict(bytes: &[u8]) -> Result<Value, WireError> {
    parse(bytes, false)
}

/// Parses one JSON document, refusing duplicate keys at any depth but keeping `null`:
/// for a protocol in which `null` is a value (the worker protocol's `revision: null`).
///
/// # Errors
/// [`WireError::Malformed`] (NaN/Infinity literals included), [`WireError::DuplicateKey`].
pub fn parse_strict_with_nulls(bytes: &[u8]) -> Result<Value, WireError> {
    parse(bytes, true)
}

fn parse(bytes: &[u8], nulls: bool) -> Result<Value, WireError> {
    // A document that is not well-formed JSON is `malformed_json` wherever a duplicate
    // key or a `null` sits before the syntax error: the verdict on the whole document
    // comes first, as a parser that reads it all before looking at keys gives it.
    // With `nulls` (the worker wire, whose decoders must agree with Python's), the
    // pre-pass reads every value (numbers out of range, unpaired surrogates); otherwise
    // it only skims the syntax, which is cheaper on the hot Core ↔ Runtime path.
    let syntax = if nulls {
        serde_json::from_slice::<Value>(bytes).map(|_| ())
    } else {
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map(|_| ())
    };
    if let Err(e) = syntax {
        return Err(WireError::Malformed(e.to_string()));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut failure: Option<WireError> = None;
    let seed = StrictSeed {
        path: "$".to_string(),
        failure: &mut failure,
        nulls,
    };
    let result = seed.deserialize(&mut de);
    if let Some(err) = failure {
        return Err(err);
    }
    let value = result.map_err(|e| WireError::Malformed(e.to_string()))?;
    de.end().map_err(|e| WireError::Malformed(e.to_string()))?;
    Ok(value)
}

/// Parses `bytes` strictly and decodes them into `T`.
///
/// # Errors
/// Any [`WireError`] from [`parse_strict`] or from typed decoding.
pub fn decode_strict<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    from_value_strict(parse_strict(bytes)?)
}

/// Decodes an already strictly parsed value into `T`, classifying serde's errors
/// into typed [`WireError`]s with the JSON path of the offending value.
///
/// # Errors
/// [`WireError::UnknownField`], [`WireError::MissingField`], [`WireError::InvalidValue`],
/// and [`WireError::NullValue`] if `value` still holds a `null`.
pub fn from_value_strict<T: DeserializeOwned>(value: Value) -> Result<T, WireError> {
    if let Some(path) = find_null(&value, "$") {
        return Err(WireError::NullValue { path });
    }
    from_value_with_nulls(value)
}

/// Decodes an already strictly parsed value into `T` where `null` is a value of the
/// protocol (typed decoding decides where it is allowed); errors as
/// [`from_value_strict`].
///
/// # Errors
/// [`WireError::UnknownField`], [`WireError::MissingField`], [`WireError::InvalidValue`].
pub fn from_value_with_nulls<T: DeserializeOwned>(value: Value) -> Result<T, WireError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let path = if path == "." || path.is_empty() {
            "$".to_string()
        } else {
            format!("$.{path}")
        };
        classify(path, err.into_inner().to_string())
    })
}

fn classify(path: String, message: String) -> WireError {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let field = rest.split('`').next().unwrap_or_default().to_string();
        // serde reports the path *of* the unknown field; report its parent object.
        let parent = parent_path(&path, &field);
        return WireError::UnknownField {
            path: parent,
            field,
        };
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or_default().to_string();
        return WireError::MissingField { path, field };
    }
    if message.starts_with("unknown variant `") {
        return WireError::InvalidValue {
            path,
            reason: message,
        };
    }
    WireError::InvalidValue {
        path,
        reason: message,
    }
}

fn parent_path(path: &str, field: &str) -> String {
    let suffix = format!(".{field}");
    match path.strip_suffix(&suffix) {
        Some(parent) if !parent.is_empty() => parent.to_string(),
        Some(_) => "$".to_string(),
        None => path.to_string(),
    }
}

/// Serializes `value` to compact JSON, refusing non-finite numbers and `null`s
/// (which is how `serde_json` would have written them).
///
/// # Errors
/// [`WireError::NonFinite`] when a value serializes to `null`.
pub fn encode_strict<T: Serialize>(value: &T) -> Result<String, WireError> {
    let json = serde_json::to_value(value).map_err(|e| WireError::invalid("$", e.to_string()))?;
    if let Some(path) = find_null(&json, "$") {
        return Err(WireError::NonFinite { path });
    }
    serde_json::to_string(&json).map_err(|e| WireError::invalid("$", e.to_string()))
}

/// Returns the path of the first `null` in `value`, if any.
pub fn find_null(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::Null => Some(path.to_string()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| find_null(v, &format!("{path}[{i}]"))),
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| find_null(v, &format!("{path}.{k}"))),
        _ => None,
    }
}

struct StrictSeed<'f> {
    path: String,
    failure: &'f mut Option<WireError>,
    nulls: bool,
}

impl<'de> DeserializeSeed<'de> for StrictSeed<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(StrictVisitor {
            path: self.path,
            failure: self.failure,
            nulls: self.nulls,
        })
    }
}

struct StrictVisitor<'f> {
    path: String,
    failure: &'f mut Option<WireError>,
    nulls: bool,
}

impl<'de> Visitor<'de> for StrictVisitor<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        match serde_json::Number::from_f64(v) {
            Some(n) => Ok(Value::Number(n)),
            None => {
                *self.failure = Some(WireError::NonFinite { path: self.path });
                Err(E::custom("non-finite number"))
            }
        }
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        if self.nulls {
            return Ok(Value::Null);
        }
        *self.failure = Some(WireError::NullValue { path: self.path });
        Err(E::custom("null value"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let path = format!("{}[{}]", self.path, items.len());
            let next = seq.next_element_seed(StrictSeed {
                path,
                failure: &mut *self.failure,
                nulls: self.nulls,
            })?;
            match next {
                Some(v) => items.push(v),
                None => break,
            }
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            if map.contains_key(&key) {
                *self.failure = Some(WireError::DuplicateKey {
                    path: self.path.clone(),
                    key,
                });
                return Err(de::Error::custom("duplicate key"));
            }
            let path = format!("{}.{}", self.path, key);
            let value = access.next_value_seed(StrictSeed {
                path,
                failure: &mut *self.failure,
                nulls: self.nulls,
            })?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        a: u32,
        #[serde(default)]
        b: Option<String>,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        inner: Inner,
    }

    #[test]
    fn nulls_are_values_where_the_protocol_says_so() {
        assert_eq!(
            parse_strict_with_nulls(br#"{"a":null,"b":[null]}"#).unwrap(),
            serde_json::json!({"a": null, "b": [null]})
        );
        assert_eq!(
            parse_strict(br#"{"a":null}"#).unwrap_err().code(),
            "null_value"
        );
        let err = parse_strict_with_nulls(br#"{"a":{"x":null,"x":1}}"#).unwrap_err();
        assert_eq!(err.code(), "duplicate_key");
        assert_eq!(
            parse_strict_with_nulls(b"[NaN]").unwrap_err().code(),
            "malformed_json"
        );
    }

    #[test]
    fn duplicate_keys_are_rejected_at_depth() {
        let err = parse_strict(br#"{"inner":{"a":1,"a":2}}"#).unwrap_err();
        assert_eq!(
            err,
            WireError::DuplicateKey {
                path: "$.inner".into(),
                key: "a".into()
            }
        );
        assert_eq!(err.code(), "duplicate_key");
    }

    #[test]
    fn null_is_rejected_even_for_optional_fields() {
        let err = decode_strict::<Outer>(br#"{"inner":{"a":1,"b":null}}"#).unwrap_err();
        assert_eq!(
            err,
            WireError::NullValue {
                path: "$.inner.b".into()
            }
        );
    }

    #[test]
    fn unknown_and_missing_fields_are_typed() {
        let err = decode_strict::<Outer>(br#"{"inner":{"a":1,"zz":2}}"#).unwrap_err();
        assert_eq!(
            err,
            WireError::UnknownField {
                path: "$.inner".into(),
                field: "zz".into()
            }
        );
        let err = decode_strict::<Outer>(br#"{"inner":{}}"#).unwrap_err();
        assert_eq!(
            err,
            WireError::MissingField {
                path: "$.inner".into(),
                field: "a".into()
            }
        );
    }

    #[test]
    fn malformed_and_non_json_numbers_are_rejected() {
        assert_eq!(
            parse_strict(b"{\"a\": NaN}").unwrap_err().code(),
            "malformed_json"
        );
        assert_eq!(parse_strict(b"{} {}").unwrap_err().code(), "malformed_json");
        assert_eq!(
            decode_strict::<Outer>(br#"{"inner":{"a":"x"}}"#)
                .unwrap_err()
                .code(),
            "invalid_value"
        );
    }

    #[test]
    fn encoding_refuses_non_finite_numbers() {
        #[derive(Serialize)]
        struct F {
            x: f64,
        }
        let err = encode_strict(&F { x: f64::NAN }).unwrap_err();
        assert_eq!(err, WireError::NonFinite { path: "$.x".into() });
        assert_eq!(encode_strict(&F { x: 1.5 }).unwrap(), r#"{"x":1.5}"#);
    }

    #[test]
    fn under_prefixes_paths() {
        let e = WireError::NullValue { path: "$.a".into() }.under("payload");
        assert_eq!(
            e,
            WireError::NullValue {
                path: "$.payload.a".into()
            }
        );
        let root = WireError::invalid("$", "not an object").under("payload");
        assert_eq!(root, WireError::invalid("$.payload", "not an object"));
    }
}
