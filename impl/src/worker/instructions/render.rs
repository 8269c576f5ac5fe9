//! The rendered observation of a revision ("The instruction header and its revisions":
//! "The rendered observation names the mechanism, because two instruction texts in one
//! request are otherwise ambiguous"):
//!
//! ```text
//! [2026-09-13T19:54:53Z · instructions changed for this runtime · changed outside this transcript]
//! the header of this transcript is the revision it started under; the text below is current from here on.
//! <current instruction text or the verified patch that reaches it>
//! ```
//!
//! This file renders a record it is given; it never decides where in the transcript the
//! observation goes, and never renders a time that is not the record's own.

use std::time::Duration;

use super::patch::lines;
use super::records::{Actor, Change, HeaderRevision, Patch};
use crate::worker::host::rfc3339_utc;

/// The middle part of the first line ("The instruction header and its revisions": "The
/// rendered observation names the mechanism").
pub const MECHANISM: &str = "instructions changed for this runtime";

/// The last part of the first line for a `host` actor ("The instruction header and its
/// revisions", the rendered observation's first line).
pub const OUTSIDE: &str = "changed outside this transcript";

/// The fixed second line ("The instruction header and its revisions", the rendered
/// observation's second line).
pub const SECOND_LINE: &str = "the header of this transcript is the revision it started under; the text below is current from here on.";

/// What the first line says where the record has no usable time (our reading, after
/// "Framing what the model reads": "Inputs whose event has no usable time say `time
/// unknown` rather than rendering epoch zero as 1970").
pub const TIME_UNKNOWN: &str = "time unknown";

/// The line a rendered patch puts after a line without a line ending (our choice for
/// "the verified patch that reaches it": the unified-diff convention a reader knows).
pub const NO_NEWLINE: &str = "\\ No newline at end of file";

/// The observation text of `revision`: the first line, [`SECOND_LINE`], then the body.
///
/// Our readings: the time is `observed_at_ms` in the `Z` shape to the second, or
/// [`TIME_UNKNOWN`] for 0; a `session` actor's change says `changed in this transcript by
/// execution <id>` (with `at step <n>` when the step is known) instead of [`OUTSIDE`];
/// the body is the verified patch for `form: diff` (as unified-diff hunks per source,
/// see [`render_patches`]) and the whole current text for `form: full`.
pub fn render_observation(revision: &HeaderRevision) -> String {
    let time = if revision.observed_at_ms == 0 {
        TIME_UNKNOWN.to_string()
    } else {
        seconds_z(revision.observed_at_ms)
    };
    let who = match &revision.actor {
        Actor::Host { .. } => OUTSIDE.to_string(),
        Actor::Session {
            execution_id, step, ..
        } => match step {
            Some(step) => {
                format!("changed in this transcript by execution {execution_id} at step {step}")
            }
            None => format!("changed in this transcript by execution {execution_id}"),
        },
    };
    let body = match &revision.change {
        Change::Full { text, .. } => text.clone(),
        Change::Diff { patches, .. } => render_patches(patches),
    };
    format!("[{time} · {MECHANISM} · {who}]\n{SECOND_LINE}\n{body}")
}

/// `YYYY-MM-DDTHH:MM:SSZ` for milliseconds since the Unix epoch (the spec's example shape,
/// to the second).
fn seconds_z(ms: u64) -> String {
    let full = rfc3339_utc(Duration::from_millis(ms));
    match full.rfind('.') {
        Some(dot) => format!("{}Z", &full[..dot]),
        None => full,
    }
}

/// `patches` as unified-diff hunks without context: `--- <source>` / `+++ <source>`
/// whenever the source changes, then `@@ -<old start>,<count> +<new start>,<count> @@`
/// and the lines with `-` and `+`. New-side numbers count the patches before it in the
/// same source; an empty range names the line before it, as unified diffs do.
pub fn render_patches(patches: &[Patch]) -> String {
    let mut out = String::new();
    let mut source: Option<&str> = None;
    let mut shift: i128 = 0;
    for patch in patches {
        if source != Some(patch.source.as_str()) {
            source = Some(&patch.source);
            shift = 0;
            out.push_str(&format!("--- {0}\n+++ {0}\n", patch.source));
        }
        let (old_n, new_n) = (patch.old_lines.len(), patch.new_lines.len());
        let start = i128::from(patch.start_line);
        let range = |start: i128, n: usize| if n == 0 { start - 1 } else { start };
        out.push_str(&format!(
            "@@ -{},{old_n} +{},{new_n} @@\n",
            range(start, old_n),
            range(start + shift, new_n)
        ));
        shift += new_n as i128 - old_n as i128;
        for (sign, lines_of) in [('-', &patch.old_lines), ('+', &patch.new_lines)] {
            for line in lines_of.iter().flat_map(|l| lines(l)) {
                out.push(sign);
                out.push_str(line);
                if !line.ends_with('\n') {
                    out.push('\n');
                    out.push_str(NO_NEWLINE);
                    out.push('\n');
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::instructions::records::Digest;
    use crate::worker::instructions::sources::Source;
    use crate::worker::wire::Identifier;

    fn revision(change: Change, actor: Actor, observed_at_ms: u64) -> HeaderRevision {
        HeaderRevision {
            digest: Digest::of(""),
            change,
            sources: vec![Source::new("contract", "")],
            actor,
            observed_at_ms,
        }
    }

    fn host() -> Actor {
        Actor::Host {
            path: None,
            reason: Some("edited".into()),
        }
    }

    #[test]
    fn a_host_change_renders_as_the_spec_s_text_block() {
        let full = Change::Full {
            base_digest: Digest::of(""),
            text: "be brief\n".into(),
        };
        // 2026-09-13T19:54:53.250Z
        let rendered = render_observation(&revision(full, host(), 1_789_329_293_250));
        assert_eq!(
            rendered,
            "[2026-09-13T19:54:53Z · instructions changed for this runtime · changed outside this transcript]\n\
             the header of this transcript is the revision it started under; the text below is current from here on.\n\
             be brief\n"
        );
    }

    #[test]
    fn a_session_change_names_its_execution_and_an_unknown_time_says_so() {
        let full = Change::Full {
            base_digest: Digest::of(""),
            text: String::new(),
        };
        let actor = |step| Actor::Session {
            execution_id: Identifier::new("e-1").unwrap(),
            step,
            path: None,
            reason: None,
        };
        let first_line =
            |r: &HeaderRevision| render_observation(r).lines().next().unwrap().to_string();
        assert_eq!(
            first_line(&revision(full.clone(), actor(Some(2)), 0)),
            "[time unknown · instructions changed for this runtime · changed in this transcript by execution e-1 at step 2]"
        );
        assert_eq!(
            first_line(&revision(full, actor(None), 1_000)),
            "[1970-01-01T00:00:01Z · instructions changed for this runtime · changed in this transcript by execution e-1]"
        );
    }

    #[test]
    fn a_diff_renders_as_its_verified_patch() {
        let patch = |source: &str, start_line, old: &[&str], new: &[&str]| Patch {
            source: source.into(),
            start_line,
            old_lines: old.iter().map(|l| l.to_string()).collect(),
            new_lines: new.iter().map(|l| l.to_string()).collect(),
        };
        let patches = vec![
            patch("contract", 99, &["\n"], &["A revision ...\n", "\n"]),
            patch("contract", 120, &[], &["tail"]),
            patch("skills", 1, &["old\r\n"], &[]),
        ];
        assert_eq!(
            render_patches(&patches),
            "--- contract\n+++ contract\n@@ -99,1 +99,2 @@\n-\n+A revision ...\n+\n\
             @@ -119,0 +121,1 @@\n+tail\n\\ No newline at end of file\n\
             --- skills\n+++ skills\n@@ -1,1 +0,0 @@\n-old\r\n"
        );
        let diff = Change::Diff {
            base_digest: Digest::of(""),
            patches,
        };
        let rendered = render_observation(&revision(diff, host(), 1_000));
        assert!(rendered.ends_with("-old\r\n"), "{rendered}");
        assert_eq!(rendered.lines().nth(2), Some("--- contract"));
    }
}
