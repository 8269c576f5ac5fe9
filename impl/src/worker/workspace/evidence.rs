//! `evidence.resolve` (`{"method":"evidence.resolve","refs":["event:42"]}`): each
//! reference resolved on its own against the host's durable operator lane
//! ([`OperatorLane::event`]). Reads only; it never writes the lane.
//!
//! Our readings (the spec shows one reference, `event:42`, and nothing of the reply):
//!
//! * A reference is `event:<n>`, `n` a positive decimal without sign, leading zero or
//!   space; any other text is `malformed_ref`. A well-formed reference the lane has no
//!   event for is `unknown_ref`. Both are reported in that reference's place of the
//!   results, never as a failure of the request: one stale reference does not hide what
//!   the others resolve to.
//! * The request fails as a whole only when it names more than [`EVIDENCE_REFS_MAX`]
//!   references (`too_many_refs`) or the lane cannot be read (`lane_failed`).
//! * The results hold the events' texts up to [`EVIDENCE_TEXT_MAX_BYTES`] together, in
//!   order; a text past that budget is cut at a character boundary and its
//!   `truncated_bytes` says how much is missing.

use serde_json::{Value, json};

use super::WorkspaceError;
use crate::worker::lane::OperatorLane;
use crate::worker::wire::limits::RETURNED_TEXT_MAX_BYTES;

/// Most references of one `evidence.resolve`. Our reference choice (the spec names no
/// bound); it keeps a reply's size bounded with [`EVIDENCE_TEXT_MAX_BYTES`].
pub const EVIDENCE_REFS_MAX: usize = 64;

/// Bytes of event text one `evidence.resolve` reply returns, all results together. Our
/// reference choice: the spec's bound of the text a cell returns ("Transport and
/// bounds": "returned text <=65,536 bytes").
pub const EVIDENCE_TEXT_MAX_BYTES: usize = RETURNED_TEXT_MAX_BYTES;

/// The prefix of an operator-lane event reference (the spec's example `event:42`).
pub const EVENT_REF_PREFIX: &str = "event:";

/// The event ID `reference` names, or why it names none.
pub(super) fn parse_ref(reference: &str) -> Result<u64, &'static str> {
    let digits = reference
        .strip_prefix(EVENT_REF_PREFIX)
        .ok_or("only operator-lane events (`event:<n>`) are resolvable")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.starts_with('0') {
        return Err("an event reference is `event:` then a positive decimal number");
    }
    digits
        .parse::<u64>()
        .map_err(|_| "the event number is out of range")
}

/// The `evidence.resolve` value for `refs`: `{results: [...]}` (see the module docs);
/// `code` renders a per-reference code as the host reports it.
///
/// # Errors
/// [`WorkspaceError::TooManyRefs`], [`WorkspaceError::Lane`].
pub(super) fn resolve(
    lane: &OperatorLane,
    refs: &[String],
    code: impl Fn(&'static str) -> String,
) -> Result<Value, WorkspaceError> {
    if refs.len() > EVIDENCE_REFS_MAX {
        return Err(WorkspaceError::TooManyRefs(refs.len()));
    }
    let mut budget = EVIDENCE_TEXT_MAX_BYTES;
    let mut results = Vec::with_capacity(refs.len());
    for reference in refs {
        let event_id = match parse_ref(reference) {
            Ok(id) => id,
            Err(why) => {
                results
                    .push(json!({"kind": "error", "code": code("malformed_ref"), "message": why}));
                continue;
            }
        };
        match lane.event(event_id).map_err(WorkspaceError::Lane)? {
            None => results.push(json!({
                "kind": "error",
                "code": code("unknown_ref"),
                "message": format!("the operator lane has no event {event_id}"),
            })),
            Some(event) => {
                let mut end = event.text.len().min(budget);
                while !event.text.is_char_boundary(end) {
                    end -= 1;
                }
                budget -= end;
                results.push(json!({
                    "kind": "ok",
                    "value": {
                        "event_id": event.event_id,
                        "effect_id": event.effect_id,
                        "text": &event.text[..end],
                        "truncated_bytes": event.text.len() - end,
                    },
                }));
            }
        }
    }
    Ok(json!({ "results": results }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_event_and_a_positive_canonical_number() {
        assert_eq!(parse_ref("event:42"), Ok(42));
        assert_eq!(parse_ref("event:18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "event:",
            "event:0",
            "event:042",
            "event:-1",
            "event:+1",
            "event: 1",
            "event:1 ",
            "event:1.0",
            "Event:1",
            "42",
            "file:a.txt",
            "event:18446744073709551616",
            "",
        ] {
            assert!(parse_ref(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_reference_is_resolved_on_its_own_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let lane = OperatorLane::open(dir.path()).unwrap();
        lane.record("g.c1.r1", "hello", None).unwrap();
        let refs: Vec<String> = ["event:1", "event:7", "evt-1", "event:1"]
            .map(String::from)
            .to_vec();
        let value = resolve(&lane, &refs, str::to_string).unwrap();
        let ok = json!({"kind": "ok", "value": {"event_id": 1, "effect_id": "g.c1.r1", "text": "hello", "truncated_bytes": 0}});
        assert_eq!(value["results"][0], ok);
        assert_eq!(value["results"][1]["code"], "unknown_ref");
        assert_eq!(value["results"][2]["code"], "malformed_ref");
        assert_eq!(value["results"][3], ok);
        assert_eq!(value["results"].as_array().unwrap().len(), 4);
        let none = resolve(&lane, &[], str::to_string).unwrap();
        assert_eq!(none, json!({"results": []}));
        let at_bound = vec!["event:1".to_string(); EVIDENCE_REFS_MAX];
        assert!(resolve(&lane, &at_bound, str::to_string).is_ok());
        let past = vec!["event:1".to_string(); EVIDENCE_REFS_MAX + 1];
        assert_eq!(
            resolve(&lane, &past, str::to_string).unwrap_err().code(),
            "too_many_refs"
        );
    }

    #[test]
    fn texts_share_one_budget_and_a_cut_keeps_whole_characters() {
        let dir = tempfile::tempdir().unwrap();
        let lane = OperatorLane::open(dir.path()).unwrap();
        // One byte short of the budget, then a two-byte character that no longer fits.
        let first = "x".repeat(EVIDENCE_TEXT_MAX_BYTES - 1);
        lane.record("a", &first, None).unwrap();
        lane.record("b", "éé", None).unwrap();
        lane.record("c", "more", None).unwrap();
        let refs: Vec<String> = ["event:1", "event:2", "event:3"].map(String::from).to_vec();
        let value = resolve(&lane, &refs, str::to_string).unwrap();
        let r = &value["results"];
        assert_eq!(r[0]["value"]["truncated_bytes"], 0);
        assert_eq!(
            (&r[1]["value"]["text"], &r[1]["value"]["truncated_bytes"]),
            (&json!(""), &json!(4))
        );
        assert_eq!(
            (&r[2]["value"]["text"], &r[2]["value"]["truncated_bytes"]),
            (&json!("m"), &json!(3))
        );
    }
}
