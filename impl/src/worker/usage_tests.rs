//! Unit tests of `usage.rs`: one table per usage shape, the refusals, the serialized form
//! and the cache-option rule.

use serde_json::{Value, json};

use super::*;

/// `(case, usage, expected record)`.
type Case = (&'static str, Value, CacheUsage);

fn usage(
    prompt: Option<u64>,
    cached: Option<u64>,
    write: Option<u64>,
    uncached: Option<u64>,
) -> CacheUsage {
    CacheUsage {
        prompt_tokens: prompt,
        cached_prompt_tokens: cached,
        cache_write_tokens: write,
        uncached_prompt_tokens: uncached,
    }
}

fn check(cases: &[Case]) {
    for (case, input, expected) in cases {
        assert_eq!(CacheUsage::read(input).as_ref(), Ok(expected), "{case}");
    }
}

#[test]
fn chat_shape_prompt_tokens_details() {
    check(&[
        (
            "cached and written",
            json!({"prompt_tokens": 1200, "completion_tokens": 7,
                   "prompt_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 176}}),
            usage(Some(1200), Some(1024), Some(176), None),
        ),
        (
            "reported zero stays zero",
            json!({"prompt_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}}),
            usage(Some(0), Some(0), Some(0), None),
        ),
        (
            "details absent: cache fields absent, not zero",
            json!({"prompt_tokens": 1200, "completion_tokens": 7}),
            usage(Some(1200), None, None, None),
        ),
        (
            "empty details: absent",
            json!({"prompt_tokens": 9, "prompt_tokens_details": {}}),
            usage(Some(9), None, None, None),
        ),
        (
            "null details and null counts: absent",
            json!({"prompt_tokens": null, "prompt_tokens_details": null}),
            usage(None, None, None, None),
        ),
        (
            "cached only, the write count absent",
            json!({"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 3}}),
            usage(Some(50), Some(0), None, None),
        ),
    ]);
}

#[test]
fn responses_shape_input_tokens_details() {
    check(&[
        (
            "Responses style",
            json!({"input_tokens": 300, "output_tokens": 20,
                   "input_tokens_details": {"cached_tokens": 256}}),
            usage(Some(300), Some(256), None, None),
        ),
        (
            "with a write count",
            json!({"input_tokens": 300, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 300}}),
            usage(Some(300), Some(0), Some(300), None),
        ),
        (
            "chat count beside Responses details",
            json!({"prompt_tokens": 10, "input_tokens_details": {"cached_tokens": 4}}),
            usage(Some(10), Some(4), None, None),
        ),
        (
            "both shapes agreeing",
            json!({"prompt_tokens": 10, "input_tokens": 10,
                   "prompt_tokens_details": {"cached_tokens": 4}, "input_tokens_details": {"cached_tokens": 4}}),
            usage(Some(10), Some(4), None, None),
        ),
        (
            "reported zero",
            json!({"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}}),
            usage(Some(0), Some(0), None, None),
        ),
    ]);
}

#[test]
fn deepseek_shape_hit_and_miss() {
    check(&[
        (
            "hit and miss",
            json!({"prompt_tokens": 100, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36}),
            usage(Some(100), Some(64), None, Some(36)),
        ),
        (
            "the route's sum is not checked",
            json!({"prompt_tokens": 100, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 1}),
            usage(Some(100), Some(64), None, Some(1)),
        ),
        (
            "miss only: the hit count is not derived",
            json!({"prompt_tokens": 100, "prompt_cache_miss_tokens": 100}),
            usage(Some(100), None, None, Some(100)),
        ),
        (
            "hit only: the miss count is not derived",
            json!({"prompt_tokens": 100, "prompt_cache_hit_tokens": 0}),
            usage(Some(100), Some(0), None, None),
        ),
        (
            "hit agreeing with the details",
            json!({"prompt_tokens": 100, "prompt_cache_hit_tokens": 64,
                   "prompt_tokens_details": {"cached_tokens": 64}}),
            usage(Some(100), Some(64), None, None),
        ),
    ]);
}

#[test]
fn a_usage_that_says_nothing_is_all_absent() {
    check(&[
        ("empty", json!({}), CacheUsage::default()),
        (
            "other fields only",
            json!({"completion_tokens": 5, "total_tokens": 5, "cost": 0.25}),
            CacheUsage::default(),
        ),
        (
            "unread shapes are ignored",
            json!({"cache_creation_input_tokens": 5, "cached_tokens": 9}),
            CacheUsage::default(),
        ),
    ]);
}

#[test]
fn refusals_name_the_field_and_have_codes() {
    let cases: [(Value, &str, &str); 11] = [
        (json!([]), "usage_not_an_object", "not a JSON object"),
        (json!(null), "usage_not_an_object", "not a JSON object"),
        (
            json!({"prompt_tokens_details": 5}),
            "usage_details_not_an_object",
            "`prompt_tokens_details` is a number",
        ),
        (
            json!({"input_tokens_details": []}),
            "usage_details_not_an_object",
            "`input_tokens_details` is an array",
        ),
        (
            json!({"prompt_tokens": "12"}),
            "usage_not_a_number",
            "`prompt_tokens` is a string",
        ),
        (
            json!({"prompt_tokens_details": {"cached_tokens": true}}),
            "usage_not_a_number",
            "`prompt_tokens_details.cached_tokens` is a boolean",
        ),
        (
            json!({"prompt_cache_hit_tokens": -1}),
            "usage_negative",
            "`prompt_cache_hit_tokens` is negative (-1)",
        ),
        (
            json!({"prompt_cache_miss_tokens": -0.5}),
            "usage_negative",
            "`prompt_cache_miss_tokens` is negative (-0.5)",
        ),
        (
            json!({"input_tokens_details": {"cache_write_tokens": 1.5}}),
            "usage_not_whole",
            "`input_tokens_details.cache_write_tokens` is 1.5",
        ),
        (
            json!({"input_tokens": 3.0}),
            "usage_not_whole",
            "`input_tokens` is 3.0",
        ),
        (
            serde_json::from_str("{\"prompt_tokens\": 18446744073709551616}").unwrap(),
            "usage_not_whole",
            "`prompt_tokens` is 1.8446744073709552e+19",
        ),
    ];
    for (input, code, message) in cases {
        let err = CacheUsage::read(&input).unwrap_err();
        assert_eq!(err.code(), code, "{input}");
        assert!(err.to_string().contains(message), "{input}: {err}");
    }
}

#[test]
fn two_shapes_that_disagree_are_refused() {
    let cases: [(Value, &str); 4] = [
        (
            json!({"prompt_tokens": 10, "input_tokens": 11}),
            "`prompt_tokens` (10) and `input_tokens` (11) disagree about prompt_tokens",
        ),
        (
            json!({"prompt_tokens_details": {"cached_tokens": 4}, "input_tokens_details": {"cached_tokens": 0}}),
            "`prompt_tokens_details.cached_tokens` (4) and `input_tokens_details.cached_tokens` (0) disagree about cached_prompt_tokens",
        ),
        (
            json!({"prompt_tokens_details": {"cached_tokens": 4}, "prompt_cache_hit_tokens": 5}),
            "`prompt_tokens_details.cached_tokens` (4) and `prompt_cache_hit_tokens` (5) disagree about cached_prompt_tokens",
        ),
        (
            json!({"prompt_tokens_details": {"cache_write_tokens": 1}, "input_tokens_details": {"cache_write_tokens": 2}}),
            "`prompt_tokens_details.cache_write_tokens` (1) and `input_tokens_details.cache_write_tokens` (2) disagree about cache_write_tokens",
        ),
    ];
    for (input, message) in cases {
        let err = CacheUsage::read(&input).unwrap_err();
        assert_eq!(err.code(), "usage_disagreement", "{input}");
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn the_serialized_form_omits_absent_fields_and_keeps_zero() {
    let cases = [
        (CacheUsage::default(), json!({})),
        (
            usage(Some(100), Some(0), None, None),
            json!({"prompt_tokens": 100, "cached_prompt_tokens": 0}),
        ),
        (
            usage(Some(1), Some(2), Some(3), Some(4)),
            json!({"prompt_tokens": 1, "cached_prompt_tokens": 2, "cache_write_tokens": 3, "uncached_prompt_tokens": 4}),
        ),
    ];
    for (record, form) in cases {
        assert_eq!(serde_json::to_value(record).unwrap(), form);
        assert_eq!(serde_json::from_value::<CacheUsage>(form).unwrap(), record);
    }
    // A stored record holds only its own fields.
    assert!(serde_json::from_value::<CacheUsage>(json!({"cached_tokens": 1})).is_err());
}

#[test]
fn cache_options_pass_only_where_the_profile_accepts_them() {
    let options = json!({"temperature": 0.2, "prompt_cache_retention": "24h",
                         "prompt_cache_options": {"ttl": 300}, "max_tokens": 10});
    let options = options.as_object().unwrap();
    let both = CacheCapability {
        prompt_cache_retention: true,
        prompt_cache_options: true,
    };
    let retention = CacheCapability {
        prompt_cache_retention: true,
        ..CacheCapability::default()
    };
    let cases = [
        (
            "no declaration: both stripped",
            CacheCapability::default(),
            json!({"temperature": 0.2, "max_tokens": 10}),
        ),
        (
            "retention declared",
            retention,
            json!({"temperature": 0.2, "prompt_cache_retention": "24h", "max_tokens": 10}),
        ),
        (
            "both declared: unchanged",
            both,
            Value::Object(options.clone()),
        ),
    ];
    for (case, capability, expected) in cases {
        let request = route_request_options(options, capability);
        assert_eq!(Value::Object(request.clone()), expected, "{case}");
        // Order of the remaining options is kept.
        let keys: Vec<&str> = request.keys().map(String::as_str).collect();
        let mut kept: Vec<&str> = options.keys().map(String::as_str).collect();
        kept.retain(|k| request.contains_key(*k));
        assert_eq!(keys, kept, "{case}");
    }
    // A declaration never adds an option the route options did not have.
    let bare = json!({"temperature": 1});
    assert_eq!(
        Value::Object(route_request_options(bare.as_object().unwrap(), both)),
        bare
    );
}

#[test]
fn cache_option_keys_round_trip() {
    for option in CacheOption::ALL {
        assert_eq!(CacheOption::from_key(option.key()), Some(option));
    }
    assert_eq!(CacheOption::from_key("prompt_cache_key"), None);
    assert_eq!(
        serde_json::from_value::<CacheCapability>(json!({"prompt_cache_options": true})).unwrap(),
        CacheCapability {
            prompt_cache_retention: false,
            prompt_cache_options: true,
        }
    );
}
