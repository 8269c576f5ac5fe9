//! Building a revision record ("The instruction header and its revisions": "A revision
//! is carried as **verified patches** against the newest text the transcript can
//! reconstruct, and as the whole text when a patch does not reproduce that text
//! exactly").
//!
//! Patches are per source while the two source sets line up by name, else over the
//! joined texts under [`JOINED_SOURCE`]. Verification is the chain's own link check
//! ([`apply_link`]): a diff is kept only when applying it to the base reproduces the new
//! text byte for byte, so every record this file builds resolves. This file never
//! decides whether a revision is due (that is [`super::rules`]) and never writes one.

use super::chain::{Reconstructed, apply_link, lines_up};
use super::patch::diff;
use super::records::{Actor, Change, Digest, HeaderRevision, JOINED_SOURCE, Patch};
use super::sources::{Source, SourceSetError, check_sources, joined_text};

/// The revision that takes `base` (the newest text the transcript can reconstruct) to
/// the text of `sources`, noticed at `observed_at_ms` and attributed to `actor`:
/// `form: diff` when its patches verify, else `form: full`.
///
/// # Errors
/// `sources` is not a set (an empty or repeated name, a digest not of its text).
pub fn build_revision(
    base: &Reconstructed,
    sources: Vec<Source>,
    actor: Actor,
    observed_at_ms: u64,
) -> Result<HeaderRevision, SourceSetError> {
    check_sources(&sources)?;
    let patches = if lines_up(base.sources.as_deref(), &sources) {
        base.sources
            .iter()
            .flatten()
            .zip(&sources)
            .flat_map(|(old, new)| diff(&new.name, &old.text, &new.text))
            .collect()
    } else {
        diff(JOINED_SOURCE, &base.text, &joined_text(&sources))
    };
    Ok(verified(base, patches, sources, actor, observed_at_ms))
}

/// The revision carrying `patches` when they take `base` to the joined text of
/// `sources` exactly, else the whole text.
pub(super) fn verified(
    base: &Reconstructed,
    patches: Vec<Patch>,
    sources: Vec<Source>,
    actor: Actor,
    observed_at_ms: u64,
) -> HeaderRevision {
    let text = joined_text(&sources);
    let mut revision = HeaderRevision {
        digest: Digest::of(&text),
        change: Change::Diff {
            base_digest: base.digest.clone(),
            patches,
        },
        sources,
        actor,
        observed_at_ms,
    };
    let reproduces = apply_link(base, &revision).is_ok_and(|reached| reached.text == text);
    if !reproduces {
        revision.change = Change::Full {
            base_digest: base.digest.clone(),
            text,
        };
    }
    revision
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::instructions::records::{HeaderPin, PinReason};

    fn host() -> Actor {
        Actor::Host {
            path: None,
            reason: None,
        }
    }

    fn pinned(text: &str) -> Reconstructed {
        Reconstructed::from_pin(&HeaderPin::new(text, PinReason::SessionStart, 0))
    }

    fn patch_sources(revision: &HeaderRevision) -> Vec<&str> {
        match &revision.change {
            Change::Diff { patches, .. } => patches.iter().map(|p| p.source.as_str()).collect(),
            Change::Full { .. } => vec!["<full>"],
        }
    }

    #[test]
    fn a_head_whose_parts_are_unknown_is_patched_as_one_anonymous_source() {
        let base = pinned("a\nb\n");
        let revision =
            build_revision(&base, vec![Source::new("contract", "a\nc\n")], host(), 5).unwrap();
        assert_eq!(patch_sources(&revision), [JOINED_SOURCE]);
        assert_eq!(revision.digest, Digest::of("a\nc\n"));
        assert_eq!(revision.change.base_digest(), &base.digest);
    }

    #[test]
    fn sets_that_line_up_are_patched_per_source_and_others_over_the_joined_text() {
        let base = apply_link(
            &pinned("a\nb\n"),
            &build_revision(
                &pinned("a\nb\n"),
                vec![Source::new("one", "a\n"), Source::new("two", "b\n")],
                host(),
                1,
            )
            .unwrap(),
        )
        .unwrap();
        let same_names = vec![Source::new("one", "a\n"), Source::new("two", "B\n")];
        let revision = build_revision(&base, same_names, host(), 2).unwrap();
        assert_eq!(patch_sources(&revision), ["two"]);

        // A rename reads as the edit it is: here none, so an empty joined patch.
        let renamed = vec![Source::new("one", "a\n"), Source::new("three", "b\n")];
        let revision = build_revision(&base, renamed, host(), 3).unwrap();
        assert_eq!(patch_sources(&revision), Vec::<&str>::new());
        assert!(matches!(revision.change, Change::Diff { .. }));
        // A source that appears, or the same names in another order.
        for sources in [
            vec![
                Source::new("one", "a\n"),
                Source::new("two", "b\n"),
                Source::new("x", "c"),
            ],
            vec![Source::new("two", "b\n"), Source::new("one", "a\n")],
        ] {
            let revision = build_revision(&base, sources, host(), 4).unwrap();
            let named = patch_sources(&revision);
            assert!(!named.is_empty() && named.iter().all(|s| *s == JOINED_SOURCE));
        }
    }

    #[test]
    fn patches_that_do_not_reproduce_the_text_become_the_whole_text() {
        let base = pinned("a\nb\n");
        let sources = vec![Source::new("s", "a\nc\n")];
        let wrong = diff(JOINED_SOURCE, "a\nb\n", "a\nd\n");
        let revision = verified(&base, wrong, sources.clone(), host(), 0);
        assert_eq!(
            revision.change,
            Change::Full {
                base_digest: base.digest.clone(),
                text: "a\nc\n".into()
            }
        );
        assert_eq!(apply_link(&base, &revision).unwrap().text, "a\nc\n");
        let not_applying = diff(JOINED_SOURCE, "x\n", "a\nc\n");
        let revision = verified(&base, not_applying, sources, host(), 0);
        assert!(matches!(revision.change, Change::Full { .. }));
    }

    #[test]
    fn sources_that_are_not_a_set_are_refused() {
        let base = pinned("");
        let twice = vec![Source::new("a", "1"), Source::new("a", "2")];
        assert_eq!(
            build_revision(&base, twice, host(), 0),
            Err(SourceSetError::DuplicateName("a".into()))
        );
    }
}
