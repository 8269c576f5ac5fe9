//! What the request costs ("What the request costs: cache reporting"): one reader of the
//! usage a route reports, and the rule that keeps cache options off routes that did not
//! declare them.
//!
//! "Usage fields are read from every shape the routes we talk to actually send, and never
//! derived: `prompt_tokens_details.cached_tokens` and `cache_write_tokens` (also under
//! `input_tokens_details`), or DeepSeek's `prompt_cache_hit_tokens` /
//! `prompt_cache_miss_tokens`." Each measurement of a [`CacheUsage`] is read from the
//! paths of [`USAGE_SHAPES`].
//!
//! This module owns the reading of a usage object and the cache-option rule of route
//! options. It never derives a measurement (`prompt_tokens - cached_prompt_tokens` is our
//! arithmetic, not the route's), never turns an absent measurement into zero, never checks
//! the route's sums, and never sends a request.
//!
//! Our reading where the spec is silent (catalog entries `WK-USAGE-*` of level
//! `reference`):
//! * the prompt count is `prompt_tokens` (chat shape) or `input_tokens` (Responses shape),
//!   and both detail objects may carry `cached_tokens` and `cache_write_tokens`;
//! * JSON `null`, for a count or a detail object, is the route saying nothing: absent;
//! * a count that is not a non-negative whole number within `u64` (a string, a fraction,
//!   `3.0`, a negative number) is a [`UsageError`], not an absent measurement: the route
//!   did say something, so "absent" would record a silence that did not happen;
//! * two shapes that report one measurement with different values are a
//!   [`UsageError::Disagreement`]: picking one would be our choice, not the route's report.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Which measurement of a [`CacheUsage`] a route's usage field reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measurement {
    /// `prompt_tokens`: the tokens of the prompt, cached or not.
    PromptTokens,
    /// `cached_prompt_tokens`: prompt tokens the route served from its cache.
    CachedPromptTokens,
    /// `cache_write_tokens`: prompt tokens the route wrote into its cache.
    CacheWriteTokens,
    /// `uncached_prompt_tokens`: prompt tokens the route says it did not find cached.
    UncachedPromptTokens,
}

impl Measurement {
    /// The field name in a [`CacheUsage`] record.
    pub fn as_str(self) -> &'static str {
        match self {
            Measurement::PromptTokens => "prompt_tokens",
            Measurement::CachedPromptTokens => "cached_prompt_tokens",
            Measurement::CacheWriteTokens => "cache_write_tokens",
            Measurement::UncachedPromptTokens => "uncached_prompt_tokens",
        }
    }
}

/// Every usage field read, as `(measurement, detail object or "" for the top level,
/// field)`, in the order a disagreement names them ("What the request costs: cache
/// reporting"): the chat shape (`prompt_tokens`, `prompt_tokens_details`), the Responses
/// shape (`input_tokens`, `input_tokens_details`) and DeepSeek's hit/miss counts.
pub const USAGE_SHAPES: [(Measurement, &str, &str); 8] = [
    (Measurement::PromptTokens, "", "prompt_tokens"),
    (Measurement::PromptTokens, "", "input_tokens"),
    (
        Measurement::CachedPromptTokens,
        "prompt_tokens_details",
        "cached_tokens",
    ),
    (
        Measurement::CachedPromptTokens,
        "input_tokens_details",
        "cached_tokens",
    ),
    (
        Measurement::CachedPromptTokens,
        "",
        "prompt_cache_hit_tokens",
    ),
    (
        Measurement::CacheWriteTokens,
        "prompt_tokens_details",
        "cache_write_tokens",
    ),
    (
        Measurement::CacheWriteTokens,
        "input_tokens_details",
        "cache_write_tokens",
    ),
    (
        Measurement::UncachedPromptTokens,
        "",
        "prompt_cache_miss_tokens",
    ),
];

/// Why a route's usage object gives no [`CacheUsage`]. Every variant has a stable
/// [`code`](Self::code); a path is the usage field's dotted path (`a.b`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// The usage is not a JSON object.
    #[error("the route's usage is not a JSON object")]
    NotAnObject,
    /// A detail object (`prompt_tokens_details`, `input_tokens_details`) is neither an
    /// object nor `null`.
    #[error("`{path}` is {found}, not an object")]
    DetailsNotAnObject {
        /// The detail object's name.
        path: &'static str,
        /// The JSON type found (`a string`, `an array`, ...).
        found: &'static str,
    },
    /// A count is neither a number nor `null`.
    #[error("`{path}` is {found}, not a token count")]
    NotANumber {
        /// The count's path.
        path: String,
        /// The JSON type found.
        found: &'static str,
    },
    /// A count is a negative number.
    #[error("`{path}` is negative ({value}), not a token count")]
    Negative {
        /// The count's path.
        path: String,
        /// The number as the route wrote it.
        value: String,
    },
    /// A count is a non-negative number but not a whole one within `u64` (a fraction,
    /// a number written with a fraction or exponent, or beyond `u64::MAX`).
    #[error("`{path}` is {value}, not a whole token count")]
    NotWhole {
        /// The count's path.
        path: String,
        /// The number as the route wrote it.
        value: String,
    },
    /// Two shapes report one measurement with different values.
    #[error(
        "`{first}` ({first_value}) and `{second}` ({second_value}) disagree about {measurement}"
    )]
    Disagreement {
        /// The record field both report.
        measurement: &'static str,
        /// The first path (in [`USAGE_SHAPES`] order) and its value.
        first: String,
        /// Its value.
        first_value: u64,
        /// The path that disagrees.
        second: String,
        /// Its value.
        second_value: u64,
    },
}

impl UsageError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            UsageError::NotAnObject => "usage_not_an_object",
            UsageError::DetailsNotAnObject { .. } => "usage_details_not_an_object",
            UsageError::NotANumber { .. } => "usage_not_a_number",
            UsageError::Negative { .. } => "usage_negative",
            UsageError::NotWhole { .. } => "usage_not_whole",
            UsageError::Disagreement { .. } => "usage_disagreement",
        }
    }
}

/// The cache measurements of one request, as the route reported them ("What the request
/// costs: cache reporting"). Token counts; `None` is "the route said nothing about it",
/// which is a different record from `Some(0)`. The serialized form omits absent fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheUsage {
    /// Prompt tokens, cached or not (`prompt_tokens` or `input_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens served from the route's cache (`cached_tokens` of a detail object,
    /// or DeepSeek's `prompt_cache_hit_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_prompt_tokens: Option<u64>,
    /// Prompt tokens written into the route's cache (`cache_write_tokens` of a detail
    /// object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Prompt tokens the route did not find cached (DeepSeek's
    /// `prompt_cache_miss_tokens`); never computed from the other fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncached_prompt_tokens: Option<u64>,
}

impl CacheUsage {
    /// Reads a route's usage object (the `usage` of its response) over every shape of
    /// [`USAGE_SHAPES`]. Fields outside them are ignored.
    ///
    /// # Errors
    /// [`UsageError`]: the usage or a detail object is not an object, a count is not a
    /// non-negative whole number, or two shapes disagree.
    pub fn read(usage: &Value) -> Result<Self, UsageError> {
        let usage = usage.as_object().ok_or(UsageError::NotAnObject)?;
        let mut record = CacheUsage::default();
        let mut first: [Option<(String, u64)>; 4] = Default::default();
        for (measurement, details, field) in USAGE_SHAPES {
            let (container, path) = if details.is_empty() {
                (Some(usage), field.to_string())
            } else {
                (detail_object(usage, details)?, format!("{details}.{field}"))
            };
            let Some(value) = container.and_then(|c| c.get(field)) else {
                continue;
            };
            let Some(count) = token_count(&path, value)? else {
                continue;
            };
            let slot = record.slot(measurement);
            match &first[measurement as usize] {
                Some((at, seen)) if *seen != count => {
                    return Err(UsageError::Disagreement {
                        measurement: measurement.as_str(),
                        first: at.clone(),
                        first_value: *seen,
                        second: path,
                        second_value: count,
                    });
                }
                Some(_) => {}
                None => {
                    *slot = Some(count);
                    first[measurement as usize] = Some((path, count));
                }
            }
        }
        Ok(record)
    }

    fn slot(&mut self, measurement: Measurement) -> &mut Option<u64> {
        match measurement {
            Measurement::PromptTokens => &mut self.prompt_tokens,
            Measurement::CachedPromptTokens => &mut self.cached_prompt_tokens,
            Measurement::CacheWriteTokens => &mut self.cache_write_tokens,
            Measurement::UncachedPromptTokens => &mut self.uncached_prompt_tokens,
        }
    }
}

/// The JSON type of `value`, as an error names it.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The detail object `name` of `usage`; `None` when absent or `null`.
fn detail_object<'a>(
    usage: &'a Map<String, Value>,
    name: &'static str,
) -> Result<Option<&'a Map<String, Value>>, UsageError> {
    match usage.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(details)) => Ok(Some(details)),
        Some(other) => Err(UsageError::DetailsNotAnObject {
            path: name,
            found: json_type(other),
        }),
    }
}

/// The token count `value` at `path`; `None` for `null`.
fn token_count(path: &str, value: &Value) -> Result<Option<u64>, UsageError> {
    let number = match value {
        Value::Null => return Ok(None),
        Value::Number(n) => n,
        other => {
            return Err(UsageError::NotANumber {
                path: path.to_string(),
                found: json_type(other),
            });
        }
    };
    if let Some(count) = number.as_u64() {
        return Ok(Some(count));
    }
    let negative = number.as_i64().is_some() || number.as_f64().is_some_and(|f| f < 0.0);
    let (path, value) = (path.to_string(), number.to_string());
    Err(if negative {
        UsageError::Negative { path, value }
    } else {
        UsageError::NotWhole { path, value }
    })
}

/// A cache field of route options that only a profile's declaration lets through ("What
/// the request costs: cache reporting": "`prompt_cache_retention` and
/// `prompt_cache_options` are stripped from route options and only re-added by a profile
/// that says the route accepts them").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOption {
    /// `prompt_cache_retention`.
    PromptCacheRetention,
    /// `prompt_cache_options`.
    PromptCacheOptions,
}

impl CacheOption {
    /// Every cache option the rule governs.
    pub const ALL: [CacheOption; 2] = [
        CacheOption::PromptCacheRetention,
        CacheOption::PromptCacheOptions,
    ];

    /// The option's key in route options.
    pub fn key(self) -> &'static str {
        match self {
            CacheOption::PromptCacheRetention => "prompt_cache_retention",
            CacheOption::PromptCacheOptions => "prompt_cache_options",
        }
    }

    /// The cache option whose key is `key`, if any.
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.key() == key)
    }
}

/// Which cache options a profile says its route accepts (the route's declared
/// capability, "What the request costs: cache reporting"). The default accepts none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheCapability {
    /// The route accepts `prompt_cache_retention`.
    #[serde(default)]
    pub prompt_cache_retention: bool,
    /// The route accepts `prompt_cache_options`.
    #[serde(default)]
    pub prompt_cache_options: bool,
}

impl CacheCapability {
    /// Whether the route accepts `option`.
    pub fn accepts(self, option: CacheOption) -> bool {
        match option {
            CacheOption::PromptCacheRetention => self.prompt_cache_retention,
            CacheOption::PromptCacheOptions => self.prompt_cache_options,
        }
    }
}

/// The route options a request carries: `options` with every [`CacheOption`] stripped,
/// then re-added (with its value from `options`) where `capability` accepts it. Every
/// other option passes unchanged, in its order.
pub fn route_request_options(
    options: &Map<String, Value>,
    capability: CacheCapability,
) -> Map<String, Value> {
    let mut request = options.clone();
    request.retain(|key, _| CacheOption::from_key(key).is_none_or(|o| capability.accepts(o)));
    request
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
