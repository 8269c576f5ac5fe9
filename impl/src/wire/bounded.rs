//! Collections and strings whose bound is part of their type.
//!
//! A bound that lives in the type is checked once, when the value is decoded or
//! built, instead of in scattered checks along the way.

use std::ops::Deref;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// The longest prefix of `text` of at most `max` bytes that ends on a character
/// boundary (the whole text when it fits): how a string is cut to a byte bound.
pub fn utf8_prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A `Vec<T>` of at most `N` items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct BoundedVec<T, const N: usize>(Vec<T>);

impl<T, const N: usize> BoundedVec<T, N> {
    /// Wraps `items` if there are at most `N` of them.
    ///
    /// # Errors
    /// The reason when `items` is over the bound.
    pub fn new(items: Vec<T>) -> Result<Self, String> {
        if items.len() > N {
            return Err(format!("{} items exceed the bound of {N}", items.len()));
        }
        Ok(Self(items))
    }
    /// Unwraps the items.
    pub fn into_inner(self) -> Vec<T> {
        self.0
    }
}

impl<T, const N: usize> Default for BoundedVec<T, N> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T, const N: usize> Deref for BoundedVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<'de, T: DeserializeOwned, const N: usize> Deserialize<'de> for BoundedVec<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let items = Vec::<T>::deserialize(d)?;
        Self::new(items).map_err(serde::de::Error::custom)
    }
}

impl<T: JsonSchema, const N: usize> JsonSchema for BoundedVec<T, N> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("BoundedVec_{}_{N}", T::schema_name()).into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let items = generator.subschema_for::<T>();
        schemars::json_schema!({ "type": "array", "items": items, "maxItems": N })
    }
}

/// A UTF-8 string of at most `N` bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct BoundedString<const N: usize>(String);

impl<const N: usize> BoundedString<N> {
    /// Wraps `value` if it is at most `N` bytes long.
    ///
    /// # Errors
    /// The reason when `value` is over the bound.
    pub fn new(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        if value.len() > N {
            return Err(format!(
                "string of {} bytes exceeds the {N}-byte bound",
                value.len()
            ));
        }
        Ok(Self(value))
    }
    /// The string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> Deref for BoundedString<N> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de, const N: usize> Deserialize<'de> for BoundedString<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl<const N: usize> JsonSchema for BoundedString<N> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("BoundedString_{N}").into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "maxLength": N })
    }
}

/// Standard (padded) base64 carrying at most `N` decoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base64Bytes<const N: usize>(Vec<u8>);

impl<const N: usize> Base64Bytes<N> {
    /// Wraps raw bytes if there are at most `N` of them.
    ///
    /// # Errors
    /// The reason when `bytes` is over the bound.
    pub fn new(bytes: Vec<u8>) -> Result<Self, String> {
        if bytes.len() > N {
            return Err(format!("{} bytes exceed the {N}-byte bound", bytes.len()));
        }
        Ok(Self(bytes))
    }
    /// The decoded bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
    /// Unwraps the decoded bytes.
    pub fn into_inner(self) -> Vec<u8> {
        self.0
    }
}

impl<const N: usize> Serialize for Base64Bytes<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de, const N: usize> Deserialize<'de> for Base64Bytes<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        // Refuse to decode text that cannot fit before allocating for it.
        if text.len() / 4 * 3 > N + 3 {
            return Err(serde::de::Error::custom(format!(
                "base64 data exceeds the {N}-byte bound"
            )));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))?;
        Self::new(bytes).map_err(serde::de::Error::custom)
    }
}

impl<const N: usize> JsonSchema for Base64Bytes<N> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Base64Bytes_{N}").into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "contentEncoding": "base64",
            "description": format!("Standard base64, at most {N} decoded bytes."),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced_on_decode() {
        assert!(serde_json::from_str::<BoundedVec<u8, 2>>("[1,2]").is_ok());
        assert!(serde_json::from_str::<BoundedVec<u8, 2>>("[1,2,3]").is_err());
        assert!(serde_json::from_str::<BoundedString<3>>("\"abcd\"").is_err());
        let b: Base64Bytes<4> = serde_json::from_str("\"AAECAw==\"").unwrap();
        assert_eq!(b.bytes(), &[0, 1, 2, 3]);
        assert!(serde_json::from_str::<Base64Bytes<3>>("\"AAECAw==\"").is_err());
        assert!(serde_json::from_str::<Base64Bytes<8>>("\"***\"").is_err());
    }
}
