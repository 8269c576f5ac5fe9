//! Argument validation against a tool's input schema ("`Execute` accepts one
//! **validated** call").
//!
//! The SDK checks the part of JSON Schema a tool's arguments need to be safe to run:
//! the arguments are an object; every `required` property is present; with
//! `additionalProperties: false` no other property is; each property's `type`
//! (`string`, `integer`, `number`, `boolean`, `object`, `array`, `null`) matches, and
//! `minimum`/`maximum` of numbers and `maxLength` of strings hold. Other keywords are
//! not checked here: a tool checks what it needs beyond this.

use serde_json::Value;

fn type_matches(kind: &str, value: &Value) -> bool {
    match kind {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => true,
    }
}

/// Checks `arguments` against `schema` (a JSON Schema object).
///
/// # Errors
/// The first rule broken, naming the property.
pub fn check_arguments(schema: &Value, arguments: &Value) -> Result<(), String> {
    let Value::Object(args) = arguments else {
        return Err("the arguments must be a JSON object".into());
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !args.contains_key(name) {
                return Err(format!("missing required property `{name}`"));
            }
        }
    }
    if schema.get("additionalProperties") == Some(&Value::Bool(false))
        && let Some(extra) = args
            .keys()
            .find(|k| properties.is_none_or(|p| !p.contains_key(*k)))
    {
        return Err(format!("unknown property `{extra}`"));
    }
    for (name, value) in args {
        let Some(rule) = properties.and_then(|p| p.get(name)) else {
            continue;
        };
        if let Some(kind) = rule.get("type").and_then(Value::as_str)
            && !type_matches(kind, value)
        {
            return Err(format!("property `{name}` must be of type {kind}"));
        }
        if let (Some(n), Some(min)) = (value.as_f64(), rule.get("minimum").and_then(Value::as_f64))
            && n < min
        {
            return Err(format!("property `{name}` is below its minimum {min}"));
        }
        if let (Some(n), Some(max)) = (value.as_f64(), rule.get("maximum").and_then(Value::as_f64))
            && n > max
        {
            return Err(format!("property `{name}` is above its maximum {max}"));
        }
        if let (Some(s), Some(max)) = (
            value.as_str(),
            rule.get("maxLength").and_then(Value::as_u64),
        ) && s.chars().count() as u64 > max
        {
            return Err(format!("property `{name}` is longer than {max} characters"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn required_types_bounds_and_extra_properties() {
        let schema = json!({
            "type": "object",
            "required": ["n"],
            "additionalProperties": false,
            "properties": {
                "n": {"type": "integer", "minimum": 1, "maximum": 3},
                "s": {"type": "string", "maxLength": 2},
            }
        });
        assert!(check_arguments(&schema, &json!({"n": 1})).is_ok());
        assert!(check_arguments(&schema, &json!({"n": 3, "s": "ab"})).is_ok());
        assert!(check_arguments(&schema, &json!({"n": 0})).is_err());
        assert!(check_arguments(&schema, &json!({"n": 4})).is_err());
        assert!(check_arguments(&schema, &json!({"n": 1.5})).is_err());
        assert!(check_arguments(&schema, &json!({"n": 1, "s": "abc"})).is_err());
        assert!(check_arguments(&schema, &json!({"s": "a"})).is_err());
        assert!(check_arguments(&schema, &json!({"n": 1, "x": 1})).is_err());
        assert!(check_arguments(&schema, &json!([1])).is_err());
        assert!(check_arguments(&json!({}), &json!({"x": 1})).is_ok());
    }
}
