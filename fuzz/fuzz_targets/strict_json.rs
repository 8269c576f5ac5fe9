//! The strict JSON decoder (`contract_impl::wire::strict`): `parse_strict`,
//! `parse_strict_with_nulls` and `decode_strict`.
//!
//! Beyond "never panics": what the strict parser accepts is what `serde_json` accepts
//! (it only refuses more), it never holds a `null`, the null-keeping parser agrees with
//! it, and re-encoding what it accepted (compact, and with `encode_strict`) parses
//! strictly again to the same value.
#![no_main]

use contract_impl::wire::strict::find_null;
use contract_impl::wire::{
    WireError, decode_strict, encode_strict, parse_strict, parse_strict_with_nulls,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let strict = parse_strict(data);
    let with_nulls = parse_strict_with_nulls(data);
    if let Err(err) = &strict {
        assert!(!err.code().is_empty());
        let _ = err.to_string();
    }
    if let Err(err) = &with_nulls {
        assert!(
            !matches!(err, WireError::NullValue { .. }),
            "the null-keeping parser refused a null: {err}"
        );
    }
    let Ok(value) = strict else {
        return;
    };
    assert_eq!(
        find_null(&value, "$"),
        None,
        "a strictly parsed value holds a null"
    );
    // The null-keeping parser accepts whatever the strict one does, as the same value.
    assert_eq!(with_nulls.as_ref(), Ok(&value));
    // The strict parser only refuses more than serde_json: it never reads differently.
    let lenient: Value =
        serde_json::from_slice(data).expect("serde_json refused what the strict parser accepted");
    assert_eq!(lenient, value);
    // Re-encoding round-trips through the strict parser.
    let compact = serde_json::to_vec(&value).expect("a parsed value encodes");
    assert_eq!(parse_strict(&compact).as_ref(), Ok(&value));
    let encoded = encode_strict(&value).expect("a strictly parsed value encodes strictly");
    assert_eq!(parse_strict(encoded.as_bytes()).as_ref(), Ok(&value));
    // Typed decoding of what parsed: into a Value, the same value.
    assert_eq!(decode_strict::<Value>(data).as_ref(), Ok(&value));
});
