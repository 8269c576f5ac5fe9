//! Identifier newtypes, validated once when decoded.
//!
//! [`wire_id!`](crate::wire_id) declares an opaque string identifier with a byte
//! bound; [`Uuid`] is a canonical (lower-case, hyphenated) UUID string, which the
//! specs require for Core-owned identities such as Session and Environment IDs.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// Default bound, in bytes, of an opaque identifier (the spec's 128-byte
/// correlation-ID bound, "Workspace operations").
pub const ID_MAX_BYTES: usize = 128;

/// Validates an opaque identifier: 1..=`max` bytes, no control characters.
///
/// # Errors
/// A human-readable reason when the identifier is empty, too long or contains
/// control characters.
pub fn validate_id(value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err("identifier must not be empty".into());
    }
    if value.len() > max {
        return Err(format!(
            "identifier of {} bytes exceeds the {max}-byte bound",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return Err("identifier must not contain control characters".into());
    }
    Ok(())
}

/// Declares an opaque, bounded string identifier newtype.
///
/// The type serializes as a JSON string, rejects empty, over-long or
/// control-character values on decode, and documents its bound in its JSON Schema.
#[macro_export]
macro_rules! wire_id {
    ($(#[$meta:meta])* $name:ident, $max:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Maximum length in bytes.
            pub const MAX_BYTES: usize = $max;
            /// Validates and wraps `value`.
            ///
            /// # Errors
            /// The reason the value is not a valid identifier.
            pub fn new(value: impl Into<String>) -> Result<Self, String> {
                let value = value.into();
                $crate::wire::ids::validate_id(&value, $max)?;
                Ok(Self(value))
            }
            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": $max,
                    "description": concat!("Opaque identifier, at most ", stringify!($max), " bytes, no control characters."),
                })
            }
        }
    };
}

/// A canonical UUID string (lower-case hex, hyphenated, 36 characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Uuid(String);

impl Uuid {
    /// Validates that `value` is a canonical UUID.
    ///
    /// # Errors
    /// The reason the value is not canonical.
    pub fn new(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        let parsed =
            uuid::Uuid::parse_str(&value).map_err(|e| format!("not a UUID ({e}): {value}"))?;
        let canonical = parsed.hyphenated().to_string();
        if canonical != value {
            return Err(format!("UUID is not canonical (expected {canonical})"));
        }
        Ok(Self(value))
    }
    /// Generates a random (v4) UUID.
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().hyphenated().to_string())
    }
    /// The UUID as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Uuid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Uuid {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Uuid".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
            "description": "Canonical lower-case hyphenated UUID.",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::wire_id!(
        /// Test identifier.
        TestId,
        4
    );

    #[test]
    fn ids_are_bounded() {
        assert_eq!(TestId::MAX_BYTES, 4);
        assert_eq!(TestId::new("abcd").unwrap().as_str(), "abcd");
        assert!(TestId::new("abcde").is_err());
        assert!(TestId::new("").is_err());
        assert!(TestId::new("a\nb").is_err());
        assert!(serde_json::from_str::<TestId>("\"abcdef\"").is_err());
    }

    #[test]
    fn uuids_are_canonical() {
        assert!(Uuid::new("6f1c2a8e-1b2c-4d3e-8f9a-0b1c2d3e4f5a").is_ok());
        assert!(Uuid::new("6F1C2A8E-1B2C-4D3E-8F9A-0B1C2D3E4F5A").is_err());
        assert!(Uuid::new("6f1c2a8e1b2c4d3e8f9a0b1c2d3e4f5a").is_err());
    }
}
