//! Resolving the chain of one transcript's header records ("The instruction header and
//! its revisions": "`runtime.instructions` resolves the chain on the host for a reader
//! that wants the exact current text instead of applying patches by hand; a link that
//! does not reconstruct stops the chain at the last text that did").
//!
//! From the newest pin, each revision is applied in order; every applied link is checked
//! byte for byte (its base digest, its patches, its result digest, its sources), so the
//! resolved text is always one that was written. This file never writes records and
//! never repairs a link: a link that does not reconstruct ends the resolution there.

use super::patch::{self, PatchError};
use super::records::{
    Change, Digest, HeaderPin, HeaderRecord, HeaderRevision, JOINED_SOURCE, PinReason,
};
use super::sources::{Source, SourceSetError, check_sources, joined_text};

/// A text the chain reconstructed: the pin's, or the result of a verified link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconstructed {
    /// The text.
    pub text: String,
    /// Its digest.
    pub digest: Digest,
    /// Its sources, when recorded (a pin's parts are unknown: `None`).
    pub sources: Option<Vec<Source>>,
}

impl Reconstructed {
    /// The text a pin holds (its parts unknown).
    pub fn from_pin(pin: &HeaderPin) -> Self {
        Self {
            text: pin.text.clone(),
            digest: Digest::of(&pin.text),
            sources: None,
        }
    }
}

/// Whether a change from `base` to `new` is patched per source: "Patches are per source
/// while the two source sets line up by name" - our reading: the base's sources are known
/// and have the same names in the same order (an order change moves text between
/// sources, which per-source patches cannot say).
pub fn lines_up(base: Option<&[Source]>, new: &[Source]) -> bool {
    base.is_some_and(|base| {
        base.len() == new.len() && base.iter().zip(new).all(|(b, n)| b.name == n.name)
    })
}

/// Why a link does not reconstruct its text. Every variant has a stable
/// [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The link's base is not the text the chain reached.
    #[error("the link applies to {found}, the chain reached {expected}")]
    BaseMismatch {
        /// The digest of the text the chain reached.
        expected: Digest,
        /// The link's `base_digest`.
        found: Digest,
    },
    /// A patch does not apply to its base.
    #[error("a patch of source {source_name:?} does not apply: {error}")]
    PatchDoesNotApply {
        /// The patch's `source`.
        source_name: String,
        /// Why.
        error: PatchError,
    },
    /// The patched (or whole) text is not the text of the link's digest.
    #[error("the link reaches {found}, not its digest {expected}")]
    ResultMismatch {
        /// The link's `digest`.
        expected: Digest,
        /// The digest of the text it reaches.
        found: Digest,
    },
    /// The link's `sources` are not a set, or are not the text it reaches.
    #[error("the link's sources disagree with its text: {0}")]
    SourcesDisagree(String),
}

impl LinkError {
    /// The stable code: `base_mismatch`, `patch_does_not_apply`, `result_mismatch` or
    /// `sources_disagree`.
    pub fn code(&self) -> &'static str {
        match self {
            LinkError::BaseMismatch { .. } => "base_mismatch",
            LinkError::PatchDoesNotApply { .. } => "patch_does_not_apply",
            LinkError::ResultMismatch { .. } => "result_mismatch",
            LinkError::SourcesDisagree(_) => "sources_disagree",
        }
    }
}

impl From<SourceSetError> for LinkError {
    fn from(error: SourceSetError) -> Self {
        LinkError::SourcesDisagree(error.to_string())
    }
}

/// The text `revision` reaches from `base`, checked: its base digest is `base`'s, its
/// patches apply (per source while the sets line up, else all under
/// [`JOINED_SOURCE`]), the result has its digest, and its sources are a set that joins
/// to exactly that text.
///
/// # Errors
/// Why the link does not reconstruct.
pub fn apply_link(
    base: &Reconstructed,
    revision: &HeaderRevision,
) -> Result<Reconstructed, LinkError> {
    if revision.change.base_digest() != &base.digest {
        return Err(LinkError::BaseMismatch {
            expected: base.digest.clone(),
            found: revision.change.base_digest().clone(),
        });
    }
    check_sources(&revision.sources)?;
    let text = match &revision.change {
        Change::Full { text, .. } => text.clone(),
        Change::Diff { patches, .. } => match base.sources.as_deref() {
            Some(base_sources) if lines_up(Some(base_sources), &revision.sources) => {
                per_source(base_sources, patches)?
            }
            _ => {
                if let Some(p) = patches.iter().find(|p| p.source != JOINED_SOURCE) {
                    return Err(not_applied(
                        &p.source,
                        PatchError::NoSuchSource(p.source.clone()),
                    ));
                }
                patch::apply(&base.text, patches)
                    .map_err(|error| not_applied(JOINED_SOURCE, error))?
            }
        },
    };
    let found = Digest::of(&text);
    if found != revision.digest {
        return Err(LinkError::ResultMismatch {
            expected: revision.digest.clone(),
            found,
        });
    }
    if joined_text(&revision.sources) != text {
        return Err(LinkError::SourcesDisagree(
            "the sources do not join to the link's text".into(),
        ));
    }
    Ok(Reconstructed {
        text,
        digest: found,
        sources: Some(revision.sources.clone()),
    })
}

fn not_applied(source: &str, error: PatchError) -> LinkError {
    LinkError::PatchDoesNotApply {
        source_name: source.to_string(),
        error,
    }
}

/// The joined text of `base` with each source's patches applied to it.
fn per_source(base: &[Source], patches: &[super::records::Patch]) -> Result<String, LinkError> {
    if let Some(p) = patches
        .iter()
        .find(|p| !base.iter().any(|s| s.name == p.source))
    {
        return Err(not_applied(
            &p.source,
            PatchError::NoSuchSource(p.source.clone()),
        ));
    }
    let mut patched = Vec::with_capacity(base.len());
    for source in base {
        let own = patches.iter().filter(|p| p.source == source.name);
        let text =
            patch::apply(&source.text, own).map_err(|error| not_applied(&source.name, error))?;
        patched.push(Source::new(source.name.clone(), text));
    }
    Ok(joined_text(&patched))
}

/// Where and why a chain stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainStop {
    /// The position of the link that did not reconstruct among the revisions after the
    /// pin (0 is the first revision).
    pub index: usize,
    /// The digest that link claims.
    pub claimed: Digest,
    /// Why it does not reconstruct.
    pub error: LinkError,
    /// How many revisions after the pin were not applied (this one included).
    pub unapplied: usize,
}

/// The resolved chain: the pin it started from and the newest text it reconstructs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The pinned head's digest.
    pub pinned: Digest,
    /// Why the head was pinned.
    pub pin_reason: PinReason,
    /// When, in milliseconds since the Unix epoch.
    pub pinned_at_ms: u64,
    /// The newest text the chain reconstructs (the pin's when no revision applied).
    pub newest: Reconstructed,
    /// How many revisions after the pin were applied.
    pub applied: usize,
    /// Where the chain stopped, when a link did not reconstruct.
    pub stop: Option<ChainStop>,
}

/// Why a transcript's records have no resolution at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// No `header_pin` among the records (rule 1 has not applied yet).
    #[error("the transcript has not pinned a header")]
    NoPin,
    /// The newest pin's digest is not the digest of its text: no text reconstructs.
    #[error("the pinned head does not have the digest of its text")]
    PinDoesNotVerify,
}

impl ChainError {
    /// The stable code: `no_pin` or `pin_does_not_verify`.
    pub fn code(&self) -> &'static str {
        match self {
            ChainError::NoPin => "no_pin",
            ChainError::PinDoesNotVerify => "pin_does_not_verify",
        }
    }
}

/// Resolves `records` (one transcript's header records, in the order written): from the
/// newest pin, each later revision in order, stopping at the first link that does not
/// reconstruct.
///
/// # Errors
/// [`ChainError::NoPin`] when there is no pin, [`ChainError::PinDoesNotVerify`] when
/// the newest pin is not the text of its digest.
pub fn resolve(records: &[HeaderRecord]) -> Result<Resolution, ChainError> {
    let (at, pin) = records
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, r)| match r {
            HeaderRecord::HeaderPin(pin) => Some((i, pin)),
            HeaderRecord::HeaderRevision(_) => None,
        })
        .ok_or(ChainError::NoPin)?;
    let mut newest = Reconstructed::from_pin(pin);
    if newest.digest != pin.digest {
        return Err(ChainError::PinDoesNotVerify);
    }
    let revisions: Vec<&HeaderRevision> = records[at + 1..]
        .iter()
        .filter_map(|r| match r {
            HeaderRecord::HeaderRevision(revision) => Some(revision),
            HeaderRecord::HeaderPin(_) => None,
        })
        .collect();
    let mut stop = None;
    let mut applied = 0;
    for (index, revision) in revisions.iter().enumerate() {
        match apply_link(&newest, revision) {
            Ok(next) => {
                newest = next;
                applied += 1;
            }
            Err(error) => {
                stop = Some(ChainStop {
                    index,
                    claimed: revision.digest.clone(),
                    error,
                    unapplied: revisions.len() - index,
                });
                break;
            }
        }
    }
    Ok(Resolution {
        pinned: pin.digest.clone(),
        pin_reason: pin.reason,
        pinned_at_ms: pin.pinned_at_ms,
        newest,
        applied,
        stop,
    })
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
