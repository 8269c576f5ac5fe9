//! The scenario loader (`contract_harness::scenario::loader::parse_scenario`): YAML,
//! the typed model and validation.
//!
//! The path a scenario is loaded from names its family and name; it is taken from the
//! input's own top-level `family:` and `name:` lines (when plain words), so a seed that
//! is a real scenario loads as one and the fuzzer explores validation, not the naming
//! rule. Beyond "never panics": a refusal always carries at least one error, and every
//! error renders (location, headline, source snippet).
#![no_main]

use std::path::PathBuf;

use contract_harness::scenario::loader::parse_scenario;
use libfuzzer_sys::fuzz_target;

/// The plain word after `key: ` on a top-level line, if any.
fn top_level(source: &str, key: &str) -> Option<String> {
    source.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?.trim();
        let word = value.split('#').next()?.trim();
        (!word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then(|| word.to_string())
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let family = top_level(source, "family").unwrap_or_else(|| "core_runtime".into());
    let name = top_level(source, "name").unwrap_or_else(|| "fuzz".into());
    let path = PathBuf::from(format!("scenarios/{family}/{name}.yaml"));
    match parse_scenario(&path, source) {
        Ok(scenario) => {
            assert_eq!(scenario.family, family);
            assert_eq!(scenario.name, name);
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "a refusal without an error");
            for error in &errors {
                let _ = error.location();
                let _ = error.headline();
                let _ = error.to_string();
            }
        }
    }
});
