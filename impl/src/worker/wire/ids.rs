//! Identifiers ("Transport and bounds": "Identifiers are 1..128 ASCII
//! letters/digits/underscore/dot/hyphen") and the nullable-but-required field.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::limits::IDENTIFIER_MAX_BYTES;

/// A protocol identifier: 1..=[`IDENTIFIER_MAX_BYTES`] bytes of `[A-Za-z0-9_.-]`. Used
/// for `session_id`, `generation`, operation, request and execution IDs and the token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Identifier(String);

impl Identifier {
    /// Validates `value`.
    ///
    /// # Errors
    /// Why it is not an identifier (empty, too long, a character outside the set).
    pub fn new(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        check_identifier(&value)?;
        Ok(Self(value))
    }

    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why `value` is not an identifier, if it is not one.
///
/// # Errors
/// The reason, naming the first offending byte.
pub fn check_identifier(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("an identifier is 1..128 bytes, got an empty one".into());
    }
    if value.len() > IDENTIFIER_MAX_BYTES {
        return Err(format!(
            "an identifier is at most {IDENTIFIER_MAX_BYTES} bytes, got {}",
            value.len()
        ));
    }
    if let Some((i, c)) = value
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "an identifier holds only ASCII letters, digits, `_`, `.` and `-`; byte {i} is {c:?}"
        ));
    }
    Ok(())
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Identifier {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Identifier {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Identifier".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[A-Za-z0-9_.-]{1,128}$",
            "description": "1..128 ASCII letters, digits, underscore, dot or hyphen.",
        })
    }
}

/// A field that must be present and may be `null` ("All outer fields are required";
/// `revision` is "null for workbench", a cell's `error` is `null` when it succeeded).
/// Unlike `Option<T>`, a missing key is a `missing_field` error.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Nullable<T>(pub Option<T>);

impl<T> Nullable<T> {
    /// `null`.
    pub fn null() -> Self {
        Self(None)
    }
    /// A value.
    pub fn some(value: T) -> Self {
        Self(Some(value))
    }
    /// The value, if not `null`.
    pub fn as_ref(&self) -> Option<&T> {
        self.0.as_ref()
    }
}

impl<T: Serialize> Serialize for Nullable<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Nullable<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Through `deserialize_any` (not `deserialize_option`), so that serde reports a
        // missing key as `missing field` instead of reading it as `null`.
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Null => Ok(Self(None)),
            value => serde_json::from_value(value)
                .map(|v| Self(Some(v)))
                .map_err(serde::de::Error::custom),
        }
    }
}

impl<T: JsonSchema> JsonSchema for Nullable<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Nullable_{}", T::schema_name()).into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        Option::<T>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_bounded_and_of_one_alphabet() {
        assert!(Identifier::new("g-1.a_B9").is_ok());
        assert!(Identifier::new("x".repeat(128)).is_ok());
        assert!(Identifier::new("x".repeat(129)).is_err());
        for bad in ["", "a b", "é", "a/b", "a\n", "a:b"] {
            assert!(Identifier::new(bad).is_err(), "{bad:?}");
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct R {
        revision: Nullable<String>,
    }

    #[test]
    fn a_nullable_field_is_still_required() {
        let r: R = serde_json::from_str(r#"{"revision":null}"#).unwrap();
        assert_eq!(r.revision, Nullable::null());
        let err = serde_json::from_str::<R>("{}").unwrap_err().to_string();
        assert!(err.contains("missing field `revision`"), "{err}");
    }
}
