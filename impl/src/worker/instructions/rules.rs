//! The three rules of the instruction header, in the order they apply ("The instruction
//! header and its revisions"), as a pure decision:
//!
//! 1. "No pin yet: the transcript pins the current text (`session_start`) and runs under
//!    it."
//! 2. "The text changed and this transcript has (or can take) the change as an
//!    observation: the head keeps its bytes and the observation renders at the sequence
//!    where it was noticed. [...] The observation is written once and replayed like any
//!    other record."
//! 3. "A fold moves the head. [...] a head whose only support was one of those must move
//!    (`fold_covered_revision`) rather than silently drop an instruction the model is
//!    running under."
//!
//! This file decides what is written; it never writes (that is [`super::store`]), never
//! decides when a fold happens or whether the transcript can take an observation (the
//! host says so through [`Occasion`]), and never moves the head outside a fold.

use super::chain::Resolution;
use super::records::{Actor, Digest, PinReason};
use crate::worker::wire::Identifier;

/// The head as the chain resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The digest of the pinned text.
    pub pinned: Digest,
    /// The digest of the newest text the transcript can reconstruct (the pinned one when
    /// no revision was written since the pin).
    pub newest: Digest,
}

impl Resolution {
    /// The head this resolution describes.
    pub fn head(&self) -> Head {
        Head {
            pinned: self.pinned.clone(),
            newest: self.newest.digest.clone(),
        }
    }
}

/// Where the transcript is when the header is checked (told by the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occasion {
    /// A request is being assembled.
    Request {
        /// Whether the transcript can take an observation at this sequence (rule 2's
        /// "has (or can take) the change as an observation").
        can_observe: bool,
    },
    /// A frontier is being installed (rule 3's fold).
    Fold {
        /// Whether the frontier covers a revision written since the pin: the newest
        /// text's support then no longer renders whole (our reading of "a head whose
        /// only support was one of those").
        covers_a_revision: bool,
    },
}

/// What the header rules write now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Pin the current text, for this reason (rule 1, or rule 3).
    Pin(PinReason),
    /// Write a revision record of the current text (rule 2).
    Revise,
    /// Write nothing: the head keeps its bytes.
    Keep,
}

/// The rules, in order, for a transcript whose head is `head` (`None`: no pin yet) while
/// the runtime's current text has digest `current`.
///
/// Our readings: a change the transcript cannot take yet is kept for a later occasion
/// (nothing is written); a change is compared with the newest reconstructable text, so
/// an observation already written is not written again; at a fold the head moves to the
/// current text whenever the transcript's text differs from the pin in any way (an
/// observation since the pin, or a change not yet observed) - with
/// `fold_covered_revision` when the frontier covers a revision since the pin, else
/// `fold` - and a fold with nothing to move writes nothing.
pub fn decide(head: Option<&Head>, current: &Digest, occasion: Occasion) -> Decision {
    let Some(head) = head else {
        return Decision::Pin(PinReason::SessionStart);
    };
    match occasion {
        Occasion::Request { can_observe } => {
            if &head.newest != current && can_observe {
                Decision::Revise
            } else {
                Decision::Keep
            }
        }
        Occasion::Fold { covers_a_revision } => {
            let revised = head.newest != head.pinned;
            if revised && covers_a_revision {
                Decision::Pin(PinReason::FoldCoveredRevision)
            } else if revised || &head.pinned != current {
                Decision::Pin(PinReason::Fold)
            } else {
                Decision::Keep
            }
        }
    }
}

/// The tool call a change came through: the session execution it is attributed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The execution.
    pub execution_id: Identifier,
    /// Its step, when known.
    pub step: Option<u64>,
}

/// The actor of a change: "A change a session makes through a tool call is attributed to
/// that execution; a change with nothing in the transcript to attribute it to is reported
/// as `host`, with what is known and no invented actor." `path` and `reason` are what is
/// known, if anything.
pub fn attribute(
    tool_call: Option<ToolCall>,
    path: Option<String>,
    reason: Option<String>,
) -> Actor {
    match tool_call {
        Some(ToolCall { execution_id, step }) => Actor::Session {
            execution_id,
            step,
            path,
            reason,
        },
        None => Actor::Host { path, reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pinned: &str, newest: &str) -> Head {
        Head {
            pinned: Digest::of(pinned),
            newest: Digest::of(newest),
        }
    }

    const REQUEST: Occasion = Occasion::Request { can_observe: true };
    const BUSY: Occasion = Occasion::Request { can_observe: false };
    const FOLD: Occasion = Occasion::Fold {
        covers_a_revision: false,
    };
    const COVERING_FOLD: Occasion = Occasion::Fold {
        covers_a_revision: true,
    };

    #[test]
    fn rule_1_pins_at_session_start_whatever_the_occasion() {
        for occasion in [REQUEST, BUSY, FOLD, COVERING_FOLD] {
            assert_eq!(
                decide(None, &Digest::of("a"), occasion),
                Decision::Pin(PinReason::SessionStart)
            );
        }
    }

    #[test]
    fn rule_2_writes_a_change_once_and_only_when_the_transcript_can_take_it() {
        let a = Digest::of("a");
        let b = Digest::of("b");
        assert_eq!(decide(Some(&head("a", "a")), &b, REQUEST), Decision::Revise);
        assert_eq!(decide(Some(&head("a", "a")), &b, BUSY), Decision::Keep);
        assert_eq!(decide(Some(&head("a", "b")), &b, REQUEST), Decision::Keep);
        assert_eq!(decide(Some(&head("a", "a")), &a, REQUEST), Decision::Keep);
        // Back to the pinned text is a change from the newest text.
        assert_eq!(decide(Some(&head("a", "b")), &a, REQUEST), Decision::Revise);
    }

    #[test]
    fn rule_3_moves_the_head_at_a_fold() {
        let a = Digest::of("a");
        let b = Digest::of("b");
        let cases = [
            (
                head("a", "b"),
                &b,
                COVERING_FOLD,
                Decision::Pin(PinReason::FoldCoveredRevision),
            ),
            (
                head("a", "b"),
                &a,
                COVERING_FOLD,
                Decision::Pin(PinReason::FoldCoveredRevision),
            ),
            (head("a", "b"), &b, FOLD, Decision::Pin(PinReason::Fold)),
            (
                head("a", "a"),
                &b,
                COVERING_FOLD,
                Decision::Pin(PinReason::Fold),
            ),
            (head("a", "a"), &b, FOLD, Decision::Pin(PinReason::Fold)),
            (head("a", "a"), &a, COVERING_FOLD, Decision::Keep),
            (head("a", "a"), &a, FOLD, Decision::Keep),
        ];
        for (head, current, occasion, decision) in cases {
            assert_eq!(
                decide(Some(&head), current, occasion),
                decision,
                "{occasion:?}"
            );
        }
    }

    #[test]
    fn a_change_through_a_tool_call_is_the_execution_s_and_any_other_the_host_s() {
        let execution_id = Identifier::new("e-1").unwrap();
        let call = ToolCall {
            execution_id: execution_id.clone(),
            step: Some(3),
        };
        assert_eq!(
            attribute(Some(call), Some("AGENTS.md".into()), None),
            Actor::Session {
                execution_id,
                step: Some(3),
                path: Some("AGENTS.md".into()),
                reason: None
            }
        );
        assert_eq!(
            attribute(None, None, Some("file watcher".into())),
            Actor::Host {
                path: None,
                reason: Some("file watcher".into())
            }
        );
    }
}
