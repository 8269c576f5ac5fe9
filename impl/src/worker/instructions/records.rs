//! The two records of the instruction header ("The instruction header and its revisions"),
//! typed exactly as the spec shows them:
//!
//! ```json
//! {"type":"header_pin","digest":"<sha256>","text":"...","reason":"session_start|fold|fold_covered_revision","pinned_at_ms":0}
//! {"type":"header_revision","digest":"<sha256 of the current text>","change":{"form":"diff"|"full", ...},"sources":[{"name":"...","digest":"...","text":"..."}],"actor":{"origin":"session|host","execution_id":"...","step":1,"path":"...","reason":"..."},"observed_at_ms":0}
//! ```
//!
//! This file owns the shapes and the digest (sources and their joined text are
//! [`super::sources`]); it never
//! decides when a record is written (that is [`super::rules`]) and never checks that a
//! change reconstructs its text (that is [`super::chain`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::worker::wire::Identifier;

use super::sources::Source;

/// Length of a digest: SHA-256 as lowercase hex ("The instruction header and its
/// revisions": `"digest":"<sha256>"`).
pub const DIGEST_HEX_LEN: usize = 64;

/// The source name a change is patched under when the two source sets do not line up
/// ("The instruction header and its revisions": "the change is patched over the joined
/// texts under the source name `instructions` instead").
pub const JOINED_SOURCE: &str = "instructions";

/// A SHA-256 digest of a text, as [`DIGEST_HEX_LEN`] lowercase hex characters (`digest`,
/// `base_digest` and a source's `digest`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

/// A string that is not a [`Digest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a digest is {DIGEST_HEX_LEN} lowercase hex characters, got {0:?}")]
pub struct DigestError(pub String);

impl Digest {
    /// The digest of `text`'s UTF-8 bytes.
    pub fn of(text: &str) -> Self {
        Self(hex::encode(Sha256::digest(text.as_bytes())))
    }

    /// The digest as hex.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;

    fn try_from(value: String) -> Result<Self, DigestError> {
        let hex = value.len() == DIGEST_HEX_LEN
            && value
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if hex {
            Ok(Self(value))
        } else {
            Err(DigestError(value))
        }
    }
}

impl From<Digest> for String {
    fn from(digest: Digest) -> String {
        digest.0
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the head was pinned (`reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PinReason {
    /// Rule 1: "No pin yet: the transcript pins the current text (`session_start`)".
    SessionStart,
    /// Rule 3: "A fold moves the head."
    Fold,
    /// Rule 3: "a head whose only support was one of those must move
    /// (`fold_covered_revision`)" - one of the observations the frontier covers.
    FoldCoveredRevision,
}

/// `header_pin` (`prompt.header`): the text this transcript's head holds from here on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderPin {
    /// The digest of `text`.
    pub digest: Digest,
    /// The pinned text (the joined text of the sources; a pin records no sources).
    pub text: String,
    /// Why it was pinned.
    pub reason: PinReason,
    /// When, in milliseconds since the Unix epoch.
    pub pinned_at_ms: u64,
}

impl HeaderPin {
    /// A pin of `text`, with its digest.
    pub fn new(text: impl Into<String>, reason: PinReason, pinned_at_ms: u64) -> Self {
        let text = text.into();
        Self {
            digest: Digest::of(&text),
            text,
            reason,
            pinned_at_ms,
        }
    }
}

/// One verified patch: the lines `old_lines` of source `source`, starting at line
/// `start_line` of its base text, become `new_lines`. Lines keep their line ending
/// (`"\n"`, `"\r\n"`); the last line of a text may have none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    /// The source patched, or [`JOINED_SOURCE`] for the joined text.
    pub source: String,
    /// Our reading: the 1-based number, in the base text, of the first line replaced;
    /// for a pure insertion (`old_lines` empty) the number the first inserted line
    /// takes (the base's line count + 1 appends). The patches of one source refer to the
    /// base's numbering and are in order, without overlap.
    pub start_line: u64,
    /// The base's lines replaced, exactly.
    pub old_lines: Vec<String>,
    /// The lines put in their place.
    pub new_lines: Vec<String>,
}

/// How a revision carries its change (`change`), by `form`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "form", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// `{"form":"diff","base_digest":...,"patches":[...]}`: verified patches against the
    /// text of digest `base_digest`.
    Diff {
        /// The digest of the text the patches apply to.
        base_digest: Digest,
        /// The patches, per source or all under [`JOINED_SOURCE`].
        patches: Vec<Patch>,
    },
    /// `{"form":"full","base_digest":...,"text":...}`: the whole text, where a patch did
    /// not reproduce it. Our reading of the spec's `...`: the whole current text, plus
    /// the digest of the text it replaces, so that a full link sits in the chain exactly
    /// where a diff would.
    Full {
        /// The digest of the text it replaces.
        base_digest: Digest,
        /// The whole current text.
        text: String,
    },
}

impl Change {
    /// The digest of the text the change applies to.
    pub fn base_digest(&self) -> &Digest {
        match self {
            Change::Diff { base_digest, .. } | Change::Full { base_digest, .. } => base_digest,
        }
    }
}

/// Who changed the text (`actor`), by `origin`. The two origins are distinct types, so a
/// `host` actor can carry no execution ("no invented actor").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "origin", rename_all = "snake_case", deny_unknown_fields)]
pub enum Actor {
    /// "A change a session makes through a tool call is attributed to that execution."
    Session {
        /// The execution whose tool call made the change.
        execution_id: Identifier,
        /// The step of that execution, when known (our reading: its host-request count).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        /// The source path it wrote, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// Why, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// "A change with nothing in the transcript to attribute it to is reported as
    /// `host`, with what is known."
    Host {
        /// The source path that changed, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// What the host knows of why, when anything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// `header_revision` (`prompt.revision`): a change of the text, observed at a sequence of
/// the transcript while the head keeps its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRevision {
    /// The digest of the current text (the joined text of `sources`).
    pub digest: Digest,
    /// The change from the newest text the transcript could reconstruct.
    pub change: Change,
    /// The current sources, in order.
    pub sources: Vec<Source>,
    /// Who changed it.
    pub actor: Actor,
    /// When the change was noticed, in milliseconds since the Unix epoch.
    pub observed_at_ms: u64,
}

/// One record of a transcript's header, by `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HeaderRecord {
    /// `header_pin`.
    HeaderPin(HeaderPin),
    /// `header_revision`.
    HeaderRevision(HeaderRevision),
}

impl HeaderRecord {
    /// The digest of the text the record reaches.
    pub fn digest(&self) -> &Digest {
        match self {
            HeaderRecord::HeaderPin(pin) => &pin.digest,
            HeaderRecord::HeaderRevision(revision) => &revision.digest,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn digest(c: char) -> String {
        c.to_string().repeat(DIGEST_HEX_LEN)
    }

    #[test]
    fn the_spec_s_record_shapes_round_trip_in_field_order() {
        let pin = format!(
            r#"{{"type":"header_pin","digest":"{}","text":"...","reason":"fold_covered_revision","pinned_at_ms":0}}"#,
            digest('a')
        );
        let revision = format!(
            r#"{{"type":"header_revision","digest":"{}","change":{{"form":"diff","base_digest":"{}","patches":[{{"source":"contract","start_line":99,"old_lines":["\n"],"new_lines":["A revision ...\n","\n"]}}]}},"sources":[{{"name":"contract","digest":"{}","text":"..."}}],"actor":{{"origin":"session","execution_id":"e-1","step":1,"path":"AGENTS.md","reason":"..."}},"observed_at_ms":0}}"#,
            digest('b'),
            digest('c'),
            digest('d')
        );
        let host = format!(
            r#"{{"type":"header_revision","digest":"{}","change":{{"form":"full","base_digest":"{}","text":"x\n"}},"sources":[],"actor":{{"origin":"host","reason":"..."}},"observed_at_ms":7}}"#,
            digest('e'),
            digest('f')
        );
        for line in [pin, revision, host] {
            let record: HeaderRecord = serde_json::from_str(&line).unwrap();
            assert_eq!(serde_json::to_string(&record).unwrap(), line);
        }
    }

    #[test]
    fn a_host_actor_with_an_execution_and_unknown_fields_are_refused() {
        let refused = [
            json!({"origin": "host", "execution_id": "e-1"}),
            json!({"origin": "host", "step": 1}),
            json!({"origin": "session"}),
            json!({"origin": "session", "execution_id": "not an id"}),
            json!({"origin": "model"}),
        ];
        for actor in refused {
            assert!(
                serde_json::from_value::<Actor>(actor.clone()).is_err(),
                "{actor}"
            );
        }
        let pin = json!({"type": "header_pin", "digest": digest('a'), "text": "",
            "reason": "fold", "pinned_at_ms": 0, "extra": 1});
        assert!(serde_json::from_value::<HeaderRecord>(pin).is_err());
        let change = json!({"form": "full", "base_digest": digest('a'), "text": "", "patches": []});
        assert!(serde_json::from_value::<Change>(change).is_err());
    }

    #[test]
    fn a_digest_is_sha256_as_lowercase_hex() {
        assert_eq!(
            Digest::of("").as_str(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        for bad in ["", &digest('A'), &digest('g'), &"a".repeat(63)] {
            let value = Value::String(bad.to_string());
            assert!(serde_json::from_value::<Digest>(value).is_err(), "{bad}");
        }
    }
}
