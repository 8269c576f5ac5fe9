//! Unit tests of [`super`] (the chain's links and its stops).

use super::*;
use crate::worker::instructions::records::{Actor, Patch};
use crate::worker::instructions::revise::build_revision;

fn host() -> Actor {
    Actor::Host {
        path: None,
        reason: None,
    }
}

fn pin(text: &str) -> HeaderRecord {
    HeaderRecord::HeaderPin(HeaderPin::new(text, PinReason::SessionStart, 1))
}

/// A pin of `texts[0]` and a revision to each next text, as one source `s`.
fn chain(texts: &[&str]) -> Vec<HeaderRecord> {
    let mut records = vec![pin(texts[0])];
    for text in &texts[1..] {
        let base = resolve(&records).unwrap().newest;
        let revision = build_revision(&base, vec![Source::new("s", *text)], host(), 2);
        records.push(HeaderRecord::HeaderRevision(revision.unwrap()));
    }
    records
}

fn revision_mut(records: &mut [HeaderRecord], index: usize) -> &mut HeaderRevision {
    match &mut records[index] {
        HeaderRecord::HeaderRevision(revision) => revision,
        HeaderRecord::HeaderPin(_) => panic!("record {index} is a pin"),
    }
}

#[test]
fn a_chain_resolves_from_its_newest_pin_through_every_revision() {
    let records = chain(&["a\n", "a\nb\n", "b\n", "b\nc"]);
    let resolution = resolve(&records).unwrap();
    assert_eq!(resolution.newest.text, "b\nc");
    assert_eq!(resolution.newest.digest, Digest::of("b\nc"));
    assert_eq!((resolution.applied, resolution.stop), (3, None));
    assert_eq!(resolution.pinned, Digest::of("a\n"));
    let names: Vec<_> = resolution
        .newest
        .sources
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["s"]);

    let mut moved = records.clone();
    moved.push(HeaderRecord::HeaderPin(HeaderPin::new(
        "z",
        PinReason::Fold,
        3,
    )));
    let resolution = resolve(&moved).unwrap();
    assert_eq!(
        (resolution.newest.text.as_str(), resolution.applied),
        ("z", 0)
    );
    assert_eq!(resolution.pin_reason, PinReason::Fold);
}

#[test]
fn no_pin_or_a_pin_that_does_not_verify_has_no_resolution() {
    assert_eq!(resolve(&[]), Err(ChainError::NoPin));
    let mut records = chain(&["a", "b"]);
    records.remove(0);
    assert_eq!(resolve(&records), Err(ChainError::NoPin));
    let mut forged = HeaderPin::new("a", PinReason::SessionStart, 0);
    forged.text = "b".into();
    assert_eq!(
        resolve(&[HeaderRecord::HeaderPin(forged)]),
        Err(ChainError::PinDoesNotVerify)
    );
}

/// A way to corrupt a link.
type Corrupt = fn(&mut HeaderRevision);

#[test]
fn a_link_that_does_not_reconstruct_stops_the_chain_at_the_last_text_that_did() {
    let texts = ["a\n", "a\nb\n", "a\nb\nc\n", "c\n"];
    let corruptions: [(&str, Corrupt); 5] = [
        ("base_mismatch", |r| match &mut r.change {
            Change::Diff { base_digest, .. } | Change::Full { base_digest, .. } => {
                *base_digest = Digest::of("elsewhere")
            }
        }),
        ("patch_does_not_apply", |r| {
            if let Change::Diff { patches, .. } = &mut r.change {
                patches[0].start_line += 7;
            }
        }),
        ("patch_does_not_apply", |r| {
            if let Change::Diff { patches, .. } = &mut r.change {
                patches[0].source = "elsewhere".into();
            }
        }),
        ("result_mismatch", |r| {
            if let Change::Diff { patches, .. } = &mut r.change {
                patches[0].new_lines.push("forged\n".into());
            }
        }),
        ("sources_disagree", |r| {
            r.sources = vec![Source::new("s", "forged")]
        }),
    ];
    for (code, corrupt) in corruptions {
        let mut records = chain(&texts);
        corrupt(revision_mut(&mut records, 2));
        let resolution = resolve(&records).unwrap();
        assert_eq!(resolution.newest.text, texts[1], "{code}");
        assert_eq!(resolution.applied, 1);
        let stop = resolution.stop.unwrap();
        assert_eq!(
            (stop.index, stop.unapplied, stop.error.code()),
            (1, 2, code)
        );
        assert_eq!(stop.claimed, Digest::of(texts[2]));
    }
}

#[test]
fn a_full_link_is_checked_like_a_diff() {
    let mut records = chain(&["a\n", "b\n"]);
    let revision = revision_mut(&mut records, 1);
    revision.change = Change::Full {
        base_digest: Digest::of("a\n"),
        text: "b\n".into(),
    };
    assert_eq!(resolve(&records).unwrap().newest.text, "b\n");
    revision_mut(&mut records, 1).change = Change::Full {
        base_digest: Digest::of("a\n"),
        text: "c\n".into(),
    };
    let stop = resolve(&records).unwrap().stop.unwrap();
    assert_eq!(stop.error.code(), "result_mismatch");
}

#[test]
fn per_source_patches_apply_to_their_own_source() {
    let base = Reconstructed {
        text: "a\nb\n".into(),
        digest: Digest::of("a\nb\n"),
        sources: Some(vec![Source::new("one", "a\n"), Source::new("two", "b\n")]),
    };
    let sources = vec![Source::new("one", "a\n"), Source::new("two", "c\n")];
    let patch = |source: &str| Patch {
        source: source.into(),
        start_line: 1,
        old_lines: vec!["b\n".into()],
        new_lines: vec!["c\n".into()],
    };
    let mut revision = build_revision(&base, sources, host(), 0).unwrap();
    assert_eq!(
        revision.change,
        Change::Diff {
            base_digest: base.digest.clone(),
            patches: vec![patch("two")]
        }
    );
    assert_eq!(apply_link(&base, &revision).unwrap().text, "a\nc\n");
    // The same lines under the joined name are not a source of a set that lines up.
    revision.change = Change::Diff {
        base_digest: base.digest.clone(),
        patches: vec![patch(JOINED_SOURCE)],
    };
    assert_eq!(
        apply_link(&base, &revision).unwrap_err(),
        LinkError::PatchDoesNotApply {
            source_name: JOINED_SOURCE.into(),
            error: PatchError::NoSuchSource(JOINED_SOURCE.into())
        }
    );
}
