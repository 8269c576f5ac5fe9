//! The instruction sources of a revision ("The instruction header and its revisions":
//! `"sources":[{"name":"...","digest":"...","text":"..."}]`) and how they join into the
//! one text a head holds ("the change is patched over the joined texts").
//!
//! This file owns what a source set is and its joined text; it never reads a source from
//! anywhere (the host passes their texts) and never decides how a change is patched
//! (that is [`super::revise`]).

use serde::{Deserialize, Serialize};

use super::records::Digest;

/// One instruction source of a revision: `{"name":"...","digest":"...","text":"..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The source's name (our reading: any non-empty text, unique within one set).
    pub name: String,
    /// The digest of `text`.
    pub digest: Digest,
    /// The source's whole text.
    pub text: String,
}

impl Source {
    /// A source named `name` holding `text`, with its digest.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        let text = text.into();
        Self {
            name: name.into(),
            digest: Digest::of(&text),
            text,
        }
    }
}

/// Why a list of sources is not a source set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceSetError {
    /// A source with an empty name.
    #[error("source {index} has an empty name")]
    EmptyName {
        /// Its position in the list.
        index: usize,
    },
    /// Two sources with one name ("line up by name" needs names to be unique).
    #[error("two sources are named {0:?}")]
    DuplicateName(String),
    /// A source whose `digest` is not the digest of its `text`.
    #[error("source {0:?} does not have the digest of its text")]
    DigestMismatch(String),
}

/// Checks that `sources` is a set: every name non-empty and unique, every digest the
/// digest of its text.
///
/// # Errors
/// The first source that breaks it.
pub fn check_sources(sources: &[Source]) -> Result<(), SourceSetError> {
    let mut names = std::collections::BTreeSet::new();
    for (index, source) in sources.iter().enumerate() {
        if source.name.is_empty() {
            return Err(SourceSetError::EmptyName { index });
        }
        if !names.insert(source.name.as_str()) {
            return Err(SourceSetError::DuplicateName(source.name.clone()));
        }
        if source.digest != Digest::of(&source.text) {
            return Err(SourceSetError::DigestMismatch(source.name.clone()));
        }
    }
    Ok(())
}

/// The one instruction text of a source set (our reading of "the joined texts", which
/// the spec does not spell out): the sources' texts in their order, with one `\n` put
/// before a source whenever the text joined so far is non-empty and does not end in
/// `\n`, so that every source starts on a line of its own. Names are not part of the
/// text: a rename alone changes no byte the model reads.
pub fn joined_text(sources: &[Source]) -> String {
    let mut text = String::new();
    for source in sources {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&source.text);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_join_each_on_a_line_of_its_own_and_names_are_checked() {
        let join = |texts: &[&str]| {
            let sources: Vec<Source> = texts.iter().map(|t| Source::new("n", *t)).collect();
            joined_text(&sources)
        };
        assert_eq!(join(&[]), "");
        assert_eq!(join(&["a\n", "b"]), "a\nb");
        assert_eq!(join(&["a", "b"]), "a\nb");
        assert_eq!(join(&["", "b"]), "b");
        assert_eq!(join(&["a\r\n", "", "b"]), "a\r\nb");
        assert_eq!(join(&["a", ""]), "a\n");

        assert_eq!(
            check_sources(&[Source::new("a", ""), Source::new("a", "")]),
            Err(SourceSetError::DuplicateName("a".into()))
        );
        assert_eq!(
            check_sources(&[Source::new("", "")]),
            Err(SourceSetError::EmptyName { index: 0 })
        );
        let mut forged = Source::new("a", "x");
        forged.text = "y".into();
        assert_eq!(
            check_sources(&[forged]),
            Err(SourceSetError::DigestMismatch("a".into()))
        );
    }
}
