//! The `runtime.instructions` reply ("The instruction header and its revisions":
//! "`runtime.instructions` resolves the chain on the host for a reader that wants the
//! exact current text instead of applying patches by hand"). The spec names the request,
//! not its reply: this shape is our proposal.
//!
//! This file only shapes a [`Resolution`] for the wire; it never resolves a chain (that
//! is [`super::chain`]) and never serves the request (that is the host's).

use serde::Serialize;

use super::chain::Resolution;
use super::records::{Digest, PinReason};

/// Our proposed `runtime.instructions` reply value (the spec names the request, not its
/// reply): the resolved text and where it came from.
///
/// ```json
/// {"digest":"<sha256>","text":"...","sources":[{"name":"...","digest":"..."}]|null,
///  "pin":{"digest":"<sha256>","reason":"session_start","pinned_at_ms":0},
///  "applied":2,"stopped":null|{"index":2,"claimed_digest":"<sha256>","code":"base_mismatch","message":"...","unapplied":1}}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstructionsReply {
    /// The digest of `text`.
    pub digest: Digest,
    /// The exact current text the chain reaches.
    pub text: String,
    /// Its sources' names and digests, or `null` when its parts are unknown.
    pub sources: Option<Vec<SourceSummary>>,
    /// The pinned head.
    pub pin: PinSummary,
    /// How many revisions after the pin were applied.
    pub applied: usize,
    /// Where the chain stopped, or `null`.
    pub stopped: Option<StopSummary>,
}

/// A source of [`InstructionsReply`]: name and digest (the text is in `text`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceSummary {
    /// The source's name.
    pub name: String,
    /// Its digest.
    pub digest: Digest,
}

/// The pin of [`InstructionsReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinSummary {
    /// The pinned text's digest.
    pub digest: Digest,
    /// Why it was pinned.
    pub reason: PinReason,
    /// When, in milliseconds since the Unix epoch.
    pub pinned_at_ms: u64,
}

/// The stop of [`InstructionsReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StopSummary {
    /// [`ChainStop::index`](super::ChainStop::index).
    pub index: usize,
    /// The digest the link claims.
    pub claimed_digest: Digest,
    /// [`LinkError::code`](super::LinkError::code).
    pub code: &'static str,
    /// The error's text.
    pub message: String,
    /// [`ChainStop::unapplied`](super::ChainStop::unapplied).
    pub unapplied: usize,
}

impl Resolution {
    /// The `runtime.instructions` reply value for this resolution.
    pub fn reply(&self) -> InstructionsReply {
        InstructionsReply {
            digest: self.newest.digest.clone(),
            text: self.newest.text.clone(),
            sources: self.newest.sources.as_ref().map(|sources| {
                sources
                    .iter()
                    .map(|s| SourceSummary {
                        name: s.name.clone(),
                        digest: s.digest.clone(),
                    })
                    .collect()
            }),
            pin: PinSummary {
                digest: self.pinned.clone(),
                reason: self.pin_reason,
                pinned_at_ms: self.pinned_at_ms,
            },
            applied: self.applied,
            stopped: self.stop.as_ref().map(|stop| StopSummary {
                index: stop.index,
                claimed_digest: stop.claimed.clone(),
                code: stop.error.code(),
                message: stop.error.to_string(),
                unapplied: stop.unapplied,
            }),
        }
    }
}
