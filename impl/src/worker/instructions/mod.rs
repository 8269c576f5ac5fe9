//! The instruction header and its revisions ("The instruction header and its revisions"):
//! "The head of a request is the text this transcript pinned, not the live contents of
//! the runtime's instruction sources. `prompt.header` records the pin; `prompt.revision`
//! records a change."
//!
//! * [`records`]: `header_pin` and `header_revision` as typed records, and the digest.
//! * [`sources`]: the instruction sources of a revision and how they join into the one
//!   text.
//! * [`rules`]: the three rules, in their order, as a pure decision ([`decide`]), and
//!   who a change is attributed to ([`attribute`]).
//! * [`patch`]: line patches: computed with `similar`, applied strictly.
//! * [`revise`]: building a revision as verified patches, or the whole text.
//! * [`chain`]: resolving a transcript's records to the exact current text, stopping at
//!   the last text that reconstructs.
//! * [`reply`]: the `runtime.instructions` reply value (our proposal).
//! * [`store`]: the durable records of each transcript.
//! * [`render`]: the rendered observation text.
//!
//! A host calls [`InstructionStore::record`] with the current sources at each request it
//! assembles and at each fold, renders a [`Recorded::Revised`] record with
//! [`render_observation`] at that sequence, and answers `runtime.instructions` with
//! [`InstructionStore::resolve`] and [`Resolution::reply`].
//!
//! This module owns the records, the rules and the chain; it never reads the runtime's
//! instruction sources (the host passes them), never decides when a fold happens or where
//! a record renders (the host's), and never rewrites a pinned head or a written record.

pub mod chain;
pub mod patch;
pub mod records;
pub mod render;
pub mod reply;
pub mod revise;
pub mod rules;
pub mod sources;
pub mod store;

#[cfg(test)]
mod properties;

pub use chain::{ChainError, ChainStop, LinkError, Reconstructed, Resolution, resolve};
pub use records::{
    Actor, Change, Digest, HeaderPin, HeaderRecord, HeaderRevision, JOINED_SOURCE, Patch, PinReason,
};
pub use render::render_observation;
pub use reply::InstructionsReply;
pub use revise::build_revision;
pub use rules::{Decision, Head, Occasion, ToolCall, attribute, decide};
pub use sources::{Source, joined_text};
pub use store::{Appended, InstructionStore, Recorded, StoreError};
