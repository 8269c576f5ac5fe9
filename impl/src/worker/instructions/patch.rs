//! Line patches of one text ("The instruction header and its revisions": "A revision is
//! carried as **verified patches** against the newest text the transcript can
//! reconstruct"): computing them with `similar` and applying them strictly.
//!
//! A line keeps its line ending (`"\n"`, or `"\r\n"` as a line whose last two bytes are
//! `\r\n`); the last line of a text may have none, and an empty text has no lines. This
//! file never decides whether a patch is kept: the caller verifies the result byte for
//! byte and falls back to the whole text ([`super::revise`]).

use similar::{Algorithm, DiffTag, capture_diff_slices};

use super::records::Patch;

/// Why patches do not apply to a text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// `start_line` 0 (lines are numbered from 1).
    #[error("start_line 0: lines are numbered from 1")]
    LineZero,
    /// A patch that starts before the end of the previous one of its source.
    #[error("the patch at line {start_line} overlaps or precedes the one before it")]
    OutOfOrder {
        /// Its `start_line`.
        start_line: u64,
    },
    /// A patch that reaches past the base's last line.
    #[error("the patch at line {start_line} reaches past the base's {lines} lines")]
    OutOfRange {
        /// Its `start_line`.
        start_line: u64,
        /// The base's line count.
        lines: usize,
    },
    /// `old_lines` that are not the base's lines at `start_line`.
    #[error("the base's lines at {start_line} are not the patch's old lines")]
    Mismatch {
        /// Its `start_line`.
        start_line: u64,
    },
    /// A patch naming a source the base does not have (or not [`super::JOINED_SOURCE`]
    /// where the change is patched over the joined text).
    #[error("the patch names source {0:?}, which this change does not patch")]
    NoSuchSource(String),
}

/// The lines of `text`, each keeping its line ending.
pub fn lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// The patches that turn `old` into `new`, under the source name `source`: one per run
/// of changed lines (no context lines), in order.
pub fn diff(source: &str, old: &str, new: &str) -> Vec<Patch> {
    let (old_lines, new_lines) = (lines(old), lines(new));
    let mut patches: Vec<Patch> = Vec::new();
    // Positions are counted from the operations' lengths, in order: the index a Myers
    // operation gives for its other side (a deletion's new index, an insertion's old
    // index) can be wrong in `similar` (its issue #78), its lengths are not.
    let (mut at_old, mut at_new) = (0usize, 0usize);
    let mut open = false;
    for op in capture_diff_slices(Algorithm::Myers, &old_lines, &new_lines) {
        let (tag, old_range, new_range) = op.as_tag_tuple();
        let (old_len, new_len) = (old_range.len(), new_range.len());
        let parts = (
            old_lines.get(at_old..at_old + old_len),
            new_lines.get(at_new..at_new + new_len),
        );
        let (Some(old_part), Some(new_part)) = parts else {
            // Operations that do not add up to the two texts: no patches, which the
            // caller's verification turns into the whole text.
            return Vec::new();
        };
        let owned = |ls: &[&str]| ls.iter().map(|l| (*l).to_string()).collect::<Vec<_>>();
        match (tag, patches.last_mut()) {
            (DiffTag::Equal, _) => open = false,
            (_, Some(last)) if open => {
                last.old_lines.extend(owned(old_part));
                last.new_lines.extend(owned(new_part));
            }
            _ => {
                patches.push(Patch {
                    source: source.to_string(),
                    start_line: at_old as u64 + 1,
                    old_lines: owned(old_part),
                    new_lines: owned(new_part),
                });
                open = true;
            }
        }
        at_old += old_len;
        at_new += new_len;
    }
    patches
}

/// `base` with `patches` applied, in order: each patch's `old_lines` must be exactly the
/// base's lines at its `start_line`, and each starts at or after the end of the one
/// before it.
///
/// # Errors
/// The first patch that does not apply.
pub fn apply<'a>(
    base: &str,
    patches: impl IntoIterator<Item = &'a Patch>,
) -> Result<String, PatchError> {
    let base_lines = lines(base);
    let mut out = String::with_capacity(base.len());
    let mut next = 0usize;
    for patch in patches {
        let start_line = patch.start_line;
        let index = start_line.checked_sub(1).ok_or(PatchError::LineZero)?;
        // A number past `usize` is past every base (refused as out of range below).
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        if index < next {
            return Err(PatchError::OutOfOrder { start_line });
        }
        let end = index
            .checked_add(patch.old_lines.len())
            .filter(|end| *end <= base_lines.len())
            .ok_or(PatchError::OutOfRange {
                start_line,
                lines: base_lines.len(),
            })?;
        if base_lines[index..end] != patch.old_lines[..] {
            return Err(PatchError::Mismatch { start_line });
        }
        base_lines[next..index].iter().for_each(|l| out.push_str(l));
        patch.new_lines.iter().for_each(|l| out.push_str(l));
        next = end;
    }
    base_lines[next..].iter().for_each(|l| out.push_str(l));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(start_line: u64, old: &[&str], new: &[&str]) -> Patch {
        Patch {
            source: "s".into(),
            start_line,
            old_lines: old.iter().map(|l| l.to_string()).collect(),
            new_lines: new.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn lines_keep_their_endings() {
        assert!(lines("").is_empty());
        assert_eq!(lines("a"), ["a"]);
        assert_eq!(lines("a\r\nb\n\nc"), ["a\r\n", "b\n", "\n", "c"]);
    }

    #[test]
    fn the_spec_s_example_patch_applies_at_line_99() {
        let base: String = (1..=100)
            .map(|n| {
                if n == 99 {
                    "\n".into()
                } else {
                    format!("{n}\n")
                }
            })
            .collect();
        let example = patch(99, &["\n"], &["A revision ...\n", "\n"]);
        let new = apply(&base, [&example]).unwrap();
        assert_eq!(lines(&new)[98..101], ["A revision ...\n", "\n", "100\n"]);
        // Our diff finds the shorter insertion before the blank line; both reach `new`.
        let ours = diff("s", &base, &new);
        assert_eq!(ours, [patch(99, &[], &["A revision ...\n"])]);
        assert_eq!(apply(&base, &ours).unwrap(), new);
    }

    #[test]
    fn diffs_apply_to_their_base() {
        let cases = [
            ("", ""),
            ("", "a"),
            ("a", ""),
            ("a", "a\n"),
            ("a\nb\nc\n", "a\nc\nd"),
            ("x\r\ny\r\n", "x\ny\r\n"),
            ("1\n2\n3\n4\n", "0\n1\n3\n4\n5\n"),
            // Myers reports this insertion's old index wrongly; positions come from lengths.
            ("\nb\n", "b\nd\nb\n"),
        ];
        for (old, new) in cases {
            let patches = diff("s", old, new);
            assert_eq!(apply(old, &patches).unwrap(), new, "{old:?} -> {new:?}");
            assert_eq!(patches.is_empty(), old == new);
        }
        // A pure insertion at the end is numbered one past the last line.
        assert_eq!(diff("s", "a\n", "a\nb\n"), [patch(2, &[], &["b\n"])]);
        // Two changed runs are two patches; a replacement is one.
        assert_eq!(diff("s", "a\nb\nc\n", "A\nb\nC\n").len(), 2);
        assert_eq!(diff("s", "a\nb\n", "c\nd\n").len(), 1);
    }

    #[test]
    fn a_patch_that_does_not_fit_its_base_is_refused() {
        let base = "a\nb\nc\n";
        let cases = [
            (vec![patch(0, &[], &["x"])], PatchError::LineZero),
            (
                vec![patch(2, &["b\n"], &[]), patch(1, &["a\n"], &[])],
                PatchError::OutOfOrder { start_line: 1 },
            ),
            (
                vec![patch(3, &["c\n", "d\n"], &[])],
                PatchError::OutOfRange {
                    start_line: 3,
                    lines: 3,
                },
            ),
            (
                vec![patch(5, &[], &["x"])],
                PatchError::OutOfRange {
                    start_line: 5,
                    lines: 3,
                },
            ),
            (
                vec![patch(2, &["b"], &[])],
                PatchError::Mismatch { start_line: 2 },
            ),
            (
                vec![patch(u64::MAX, &["b\n"], &[])],
                PatchError::OutOfRange {
                    start_line: u64::MAX,
                    lines: 3,
                },
            ),
        ];
        for (patches, error) in cases {
            assert_eq!(apply(base, &patches), Err(error));
        }
        assert_eq!(apply(base, [&patch(4, &[], &["d"])]).unwrap(), "a\nb\nc\nd");
    }
}
