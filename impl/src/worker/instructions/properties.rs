//! Property tests of the chain ("Verification is not optional: a patch that does not
//! reconstruct its text is replaced by the whole text, so a reader never reconstructs an
//! instruction text nobody wrote"): random line edits (empty texts, texts without a final
//! newline, CRLF) and source renames, additions and removals, with folds between them.
//!
//! * Resolving the chain of built revisions yields exactly the current text, and every
//!   built revision is a diff (our patches always verify).
//! * A randomly corrupted link stops the chain at a text that was written before it,
//!   never at a text nobody wrote.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::sample::Index;

use super::chain::resolve;
use super::patch::lines;
use super::records::{Actor, Change, Digest, HeaderPin, HeaderRecord, HeaderRevision};
use super::revise::build_revision;
use super::rules::{Decision, Occasion, decide};
use super::sources::{Source, joined_text};

/// Cases per property: enough to reach every edit and corruption kind many times, few
/// enough to run in a few seconds in a debug build.
const CASES: u32 = 1024;

/// Source names, including the joined name as a real source's.
const NAMES: [&str; 5] = ["contract", "skills", "local", "notes", "instructions"];

/// One edit of the runtime's sources.
#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, Index, Vec<&'static str>),
    Delete(Index, Index, usize),
    Replace(Index, Index, usize, Vec<&'static str>),
    Rename(Index, Index),
    Add(Index, Index, Vec<&'static str>),
    Remove(Index),
    /// A fold: the head moves (rule 3).
    Fold,
}

fn line() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a\n", "b\n", "\n", "c\r\n", "\r\n", "d", "e f\n", ""])
}

fn some_lines() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(line(), 0..4)
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), any::<Index>(), some_lines()).prop_map(|(s, a, l)| Edit::Insert(s, a, l)),
        2 => (any::<Index>(), any::<Index>(), 0..3usize).prop_map(|(s, a, n)| Edit::Delete(s, a, n)),
        3 => (any::<Index>(), any::<Index>(), 0..3usize, some_lines())
            .prop_map(|(s, a, n, l)| Edit::Replace(s, a, n, l)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(s, n)| Edit::Rename(s, n)),
        1 => (any::<Index>(), any::<Index>(), some_lines()).prop_map(|(a, n, l)| Edit::Add(a, n, l)),
        1 => any::<Index>().prop_map(Edit::Remove),
        1 => Just(Edit::Fold),
    ]
}

fn initial() -> impl Strategy<Value = Vec<(usize, Vec<&'static str>)>> {
    prop::collection::vec((0..NAMES.len(), some_lines()), 0..3)
}

/// The sources after `edit` (names stay unique; an edit that would repeat one is none).
fn edited(sources: &[Source], edit: &Edit) -> Vec<Source> {
    let mut out = sources.to_vec();
    let free = |name: &str| !sources.iter().any(|s| s.name == name);
    let edit_lines = |out: &mut Vec<Source>, s: &Index, f: &dyn Fn(&mut Vec<String>)| {
        if out.is_empty() {
            return;
        }
        let i = s.index(out.len());
        let mut ls: Vec<String> = lines(&out[i].text).into_iter().map(String::from).collect();
        f(&mut ls);
        out[i] = Source::new(out[i].name.clone(), ls.concat());
    };
    let owned = |l: &[&str]| l.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    match edit {
        Edit::Insert(s, at, new) => edit_lines(&mut out, s, &|ls| {
            let at = at.index(ls.len() + 1);
            ls.splice(at..at, owned(new));
        }),
        Edit::Delete(s, at, n) => edit_lines(&mut out, s, &|ls| {
            let at = at.index(ls.len() + 1);
            ls.drain(at..(at + n).min(ls.len()));
        }),
        Edit::Replace(s, at, n, new) => edit_lines(&mut out, s, &|ls| {
            let at = at.index(ls.len() + 1);
            ls.splice(at..(at + n).min(ls.len()), owned(new));
        }),
        Edit::Rename(s, name) => {
            let name = NAMES[name.index(NAMES.len())];
            if !out.is_empty() && free(name) {
                let i = s.index(out.len());
                out[i] = Source::new(name, out[i].text.clone());
            }
        }
        Edit::Add(at, name, text) => {
            let name = NAMES[name.index(NAMES.len())];
            if free(name) {
                out.insert(at.index(out.len() + 1), Source::new(name, text.concat()));
            }
        }
        Edit::Remove(s) => {
            if !out.is_empty() {
                out.remove(s.index(out.len()));
            }
        }
        Edit::Fold => {}
    }
    out
}

fn host() -> Actor {
    Actor::Host {
        path: None,
        reason: None,
    }
}

/// Runs `edits` from `initial` through the rules: the records written, the text each
/// record holds (one per record, in order), and the final sources.
fn run(
    initial: &[(usize, Vec<&'static str>)],
    edits: &[Edit],
) -> (Vec<HeaderRecord>, Vec<String>, Vec<Source>) {
    let mut sources: Vec<Source> = Vec::new();
    for (name, text) in initial {
        if !sources.iter().any(|s| s.name == NAMES[*name]) {
            sources.push(Source::new(NAMES[*name], text.concat()));
        }
    }
    let mut records = Vec::new();
    let mut written = Vec::new();
    for (step, edit) in std::iter::once(&Edit::Fold).chain(edits).enumerate() {
        sources = edited(&sources, edit);
        let text = joined_text(&sources);
        let resolution = resolve(&records).ok();
        let occasion = match edit {
            Edit::Fold => Occasion::Fold {
                covers_a_revision: step % 2 == 0,
            },
            _ => Occasion::Request { can_observe: true },
        };
        let head = resolution.as_ref().map(|r| r.head());
        match decide(head.as_ref(), &Digest::of(&text), occasion) {
            Decision::Pin(reason) => {
                records.push(HeaderRecord::HeaderPin(HeaderPin::new(&text, reason, 1)));
            }
            Decision::Revise => {
                let base = resolution.expect("a revision has a head").newest;
                let revision = build_revision(&base, sources.clone(), host(), 2).unwrap();
                records.push(HeaderRecord::HeaderRevision(revision));
            }
            Decision::Keep => continue,
        }
        written.push(text);
    }
    (records, written, sources)
}

/// One way to corrupt a revision.
#[derive(Debug, Clone, Copy)]
enum Corruption {
    BaseDigest,
    Digest,
    StartLine,
    OldLine,
    NewLine,
    DropPatch,
    SourceText,
    WholeText,
    DropLink,
}

fn corruption() -> impl Strategy<Value = Corruption> {
    use Corruption::*;
    prop::sample::select(vec![
        BaseDigest, Digest, StartLine, OldLine, NewLine, DropPatch, SourceText, WholeText, DropLink,
    ])
}

fn corrupt(revision: &mut HeaderRevision, how: Corruption, pick: &Index) {
    let forged = || "forged\n".to_string();
    match (how, &mut revision.change) {
        (
            Corruption::BaseDigest,
            Change::Diff { base_digest, .. } | Change::Full { base_digest, .. },
        ) => *base_digest = Digest::of("forged"),
        (Corruption::Digest, _) => revision.digest = Digest::of("forged"),
        (Corruption::WholeText, Change::Full { text, .. }) => text.push('x'),
        (Corruption::SourceText, _) if !revision.sources.is_empty() => {
            let i = pick.index(revision.sources.len());
            let name = revision.sources[i].name.clone();
            revision.sources[i] = Source::new(name, revision.sources[i].text.clone() + "x");
        }
        (_, Change::Diff { patches, .. }) if !patches.is_empty() => {
            let i = pick.index(patches.len());
            let patch = &mut patches[i];
            match how {
                Corruption::StartLine => patch.start_line += 1,
                Corruption::OldLine => patch.old_lines.push(forged()),
                Corruption::NewLine => patch.new_lines.insert(0, forged()),
                _ => {
                    patches.remove(i);
                }
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn resolving_the_built_chain_yields_exactly_the_current_text(
        initial in initial(),
        edits in prop::collection::vec(edit(), 0..10),
    ) {
        let (records, _, sources) = run(&initial, &edits);
        for record in &records {
            if let HeaderRecord::HeaderRevision(revision) = record {
                prop_assert!(matches!(revision.change, Change::Diff { .. }), "{revision:?}");
            }
        }
        let resolution = resolve(&records).unwrap();
        prop_assert_eq!(resolution.stop, None);
        prop_assert_eq!(&resolution.newest.text, &joined_text(&sources));
        prop_assert_eq!(resolution.newest.digest, Digest::of(&joined_text(&sources)));
    }

    #[test]
    fn a_corrupted_link_stops_the_chain_at_a_text_that_was_written(
        initial in initial(),
        edits in prop::collection::vec(edit(), 1..10),
        link in any::<Index>(),
        how in corruption(),
        pick in any::<Index>(),
    ) {
        let (mut records, written, _) = run(&initial, &edits);
        let revisions: Vec<usize> = (0..records.len())
            .filter(|i| matches!(records[*i], HeaderRecord::HeaderRevision(_)))
            .collect();
        prop_assume!(!revisions.is_empty());
        let at = revisions[link.index(revisions.len())];
        match (how, &mut records[at]) {
            (Corruption::DropLink, _) => {
                records.remove(at);
            }
            (_, HeaderRecord::HeaderRevision(revision)) => corrupt(revision, how, &pick),
            (_, HeaderRecord::HeaderPin(_)) => unreachable!(),
        }
        let resolution = resolve(&records).unwrap();
        let texts: BTreeSet<&String> = written.iter().collect();
        prop_assert!(texts.contains(&resolution.newest.text), "{:?}", resolution.newest.text);
        prop_assert_eq!(&resolution.newest.digest, &Digest::of(&resolution.newest.text));
        if let Some(stop) = &resolution.stop {
            // The stop is at the corrupted link (or, for a dropped link, the one after
            // it), and the text is the one written just before it.
            let newest_pin = records.iter().rposition(|r| matches!(r, HeaderRecord::HeaderPin(_)));
            prop_assert_eq!(newest_pin.unwrap() + 1 + stop.index, at);
            prop_assert_eq!(&resolution.newest.text, &written[at - 1]);
        }
    }
}
