//! `{$contains: pattern}`: an object or an array that holds, at any depth below itself,
//! a value matching `pattern`: the members of an object, the elements of an array, and
//! theirs in turn. It finds what the spec fixes inside a reply whose shape the spec leaves
//! free (a refused skill id and its reason somewhere in a `skills.index` reply, the exact
//! current instruction text somewhere in a `runtime.instructions` reply), without holding
//! a target to our reply's keys.
//!
//! Precise, not lenient: the value itself is never the match (a string is not "contained"
//! in itself, and a scalar contains nothing), a string is never searched inside (a text
//! that merely includes the wanted text does not match), and the candidates are tried in
//! document order (an object's members in their order, an array's elements in theirs,
//! each value before what it holds): the first that matches binds the pattern's
//! placeholders, and no other binding is tried.

use serde_json::Value;

use crate::bind::Bindings;

/// The key of the pattern.
pub const KEY: &str = "$contains";

/// Checks `actual` against `{$contains: pattern}`. `try_match(path, pattern, candidate,
/// bindings)` is the matcher's own match of one candidate (binding into `bindings` only
/// on success). `Err` says why nothing matched.
pub fn check(
    path: &str,
    pattern: &Value,
    actual: &Value,
    bindings: &mut Bindings,
    mut try_match: impl FnMut(&str, &Value, &Value, &mut Bindings) -> bool,
) -> Result<(), String> {
    if !matches!(actual, Value::Object(_) | Value::Array(_)) {
        return Err("`$contains` expects an object or an array".into());
    }
    let mut found = false;
    visit_children(path, actual, &mut |at, candidate| {
        if found {
            return;
        }
        let mut scratch = bindings.clone();
        if try_match(at, pattern, candidate, &mut scratch) {
            *bindings = scratch;
            found = true;
        }
    });
    if found {
        Ok(())
    } else {
        Err(format!(
            "no value at any depth matches {}",
            serde_json::to_string(pattern).unwrap_or_default()
        ))
    }
}

/// Calls `f` with every value below `value` (not `value` itself), in document order, each
/// before its own children.
fn visit_children(path: &str, value: &Value, f: &mut dyn FnMut(&str, &Value)) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let at = format!("{path}.{key}");
                f(&at, child);
                visit_children(&at, child, f);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let at = format!("{path}[{i}]");
                f(&at, child);
                visit_children(&at, child, f);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::bind::Bindings;
    use crate::matcher::match_frame;
    use serde_json::json;

    fn matches(pattern: serde_json::Value, actual: serde_json::Value) -> bool {
        match_frame(&pattern, &actual, &mut Bindings::new()).is_ok()
    }

    #[test]
    fn a_value_at_any_depth_matches() {
        let reply =
            json!({"refused": [{"id": "both", "why": {"reason": "duplicate_id"}}], "ids": ["a"]});
        assert!(matches(json!({"$contains": "duplicate_id"}), reply.clone()));
        assert!(matches(
            json!({"$contains": {"reason": "duplicate_id"}}),
            reply.clone()
        ));
        assert!(matches(json!({"$contains": ["a"]}), reply.clone()));
        assert!(matches(json!({"$contains": "a"}), reply.clone()));
        assert!(!matches(json!({"$contains": "b"}), reply.clone()));
        // A pattern matches one value whole: the keys it names must be in that object.
        assert!(!matches(
            json!({"$contains": {"id": "both", "reason": "duplicate_id"}}),
            reply
        ));
    }

    #[test]
    fn the_value_itself_a_scalar_and_the_inside_of_a_string_are_no_match() {
        assert!(!matches(json!({"$contains": {"a": 1}}), json!({"a": 1})));
        assert!(matches(json!({"$contains": 1}), json!({"a": 1})));
        assert!(!matches(json!({"$contains": "x"}), json!("x")));
        assert!(!matches(
            json!({"$contains": "text"}),
            json!({"t": "the text"})
        ));
        assert!(!matches(json!({"$contains": "$_"}), json!({})));
        assert!(!matches(json!({"$contains": "$_"}), json!([])));
    }

    #[test]
    fn the_first_match_in_document_order_binds() {
        let mut b = Bindings::new();
        let pattern = json!({"all": {"$contains": {"id": "$id", "ok": true}}, "again": "$id"});
        let actual = json!({"all": [{"id": "x", "ok": false}, {"id": "y", "ok": true}, {"id": "z", "ok": true}], "again": "y"});
        match_frame(&pattern, &actual, &mut b).unwrap();
        assert_eq!(b.get("id"), Some(&json!("y")));
        // A bound placeholder is compared, not rebound.
        let mut b = Bindings::new();
        b.bind("id", json!("z")).unwrap();
        match_frame(
            &json!({"$contains": {"id": "$id", "ok": true}}),
            &actual,
            &mut b,
        )
        .unwrap();
        assert!(
            match_frame(
                &json!({"$contains": {"id": "$id", "ok": false}}),
                &actual,
                &mut b
            )
            .is_err()
        );
    }

    #[test]
    fn a_failed_search_binds_nothing_and_names_the_pattern() {
        let mut b = Bindings::new();
        let err = match_frame(
            &json!({"v": {"$contains": {"id": "$id", "n": 2}}}),
            &json!({"v": [{"id": "x", "n": 1}]}),
            &mut b,
        )
        .unwrap_err();
        assert_eq!(err.path, "$.v");
        assert!(
            err.reason.contains("no value at any depth"),
            "{}",
            err.reason
        );
        assert!(b.get("id").is_none());
    }
}
