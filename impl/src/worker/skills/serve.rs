//! The host requests `skills.index` and `skills.load` ("Message vocabulary", "Skills"), and
//! their reply shapes (ours, `WK-SKILL-013`, `WK-SKILL-014`):
//!
//! * `skills.index` → `{"revision", "ids", "digests", "refused", "roots"}`: `revision` the
//!   one this generation loaded (its `hello`'s: the set's revision, `null` when no skill
//!   was offered); `ids` the model-visible index, ids only, sorted; `digests` each offered
//!   id's SHA-256 of its body; `refused` `[{"id", "root", "reason", "message"}]` sorted by
//!   id then root (`reason` a [`Refusal`](super::Refusal) code); `roots` `{"builtin",
//!   "managed"}`, each a [`RootState`](super::RootState) (`present`, `absent`, …).
//! * `skills.load` → `{"id", "digest", "body"}`, or an error reply `unknown_skill`,
//!   `skill_refused` or `skill_changed` ([`LoadError`](super::LoadError)).
//!
//! Both answer the index scanned when the generation started: a body written during a
//! turn is offered on the next generation, not mid-turn. This module only shapes replies;
//! it never scans a root and never speaks the worker wire.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::SkillIndex;
use crate::worker::host::{PendingReply, RequestHandler};
use crate::worker::wire::{HostRequest, Identifier, Reply};

/// The `skills.index` value of `index`.
pub fn index_value(index: &SkillIndex) -> Value {
    if index.different {
        return different_index_value(index);
    }
    let digests: Map<String, Value> = index
        .skills
        .iter()
        .map(|s| (s.id.clone(), Value::String(s.digest.clone())))
        .collect();
    let refused: Vec<Value> = index
        .refused
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "root": r.root,
                "reason": r.refusal.code(),
                "message": r.refusal.to_string(),
            })
        })
        .collect();
    json!({
        "revision": index.loaded_revision(),
        "ids": index.skills.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        "digests": digests,
        "refused": refused,
        "roots": {"builtin": index.builtin, "managed": index.managed},
    })
}

/// The different profile's `skills.index` value: another shape (offered skills as
/// records, refusals as one text each, newest id first) and other reason codes, what a
/// conformant host may answer ("Refused ids are reported with their reason").
fn different_index_value(index: &SkillIndex) -> Value {
    let offered: Vec<Value> = index
        .skills
        .iter()
        .rev()
        .map(|s| json!({"name": s.id, "sha256": s.digest}))
        .collect();
    let not_offered: Vec<Value> = index
        .refused
        .iter()
        .rev()
        .map(|r| {
            json!({
                "skill": r.id,
                "location": r.root,
                "why": format!("{}: {}", r.refusal.code().replace('_', "-"), r.refusal),
            })
        })
        .collect();
    json!({
        "loaded": index.loaded_revision(),
        "offered": offered,
        "not_offered": not_offered,
        "roots": [
            {"root": "builtin", "state": index.builtin},
            {"root": "managed", "state": index.managed},
        ],
    })
}

/// The `skills.load` reply for `id`.
pub fn load_reply(index: &SkillIndex, id: &str) -> Reply {
    if index.different {
        return match index.load(id) {
            Ok(skill) => Reply::Ok {
                value: json!({"skill": skill.id, "text": skill.body, "sha256": skill.digest}),
            },
            Err(e) => Reply::Error {
                code: format!("skills.{}", e.code().replace('_', "-")),
                message: format!("skills.load {id}: {e}"),
            },
        };
    }
    match index.load(id) {
        Ok(skill) => Reply::Ok {
            value: json!({"id": skill.id, "digest": skill.digest, "body": skill.body}),
        },
        Err(e) => Reply::Error {
            code: e.code().into(),
            message: e.to_string(),
        },
    }
}

/// Answers `skills.index` and `skills.load` from the index a generation was started with,
/// and hands every other request to `inner`. Without an index (a host with no skill roots)
/// `inner` answers them too.
pub struct SkillRequests<H> {
    index: Option<Arc<SkillIndex>>,
    inner: H,
}

impl<H> SkillRequests<H> {
    /// Skills from `index` in front of `inner`.
    pub fn new(index: Option<Arc<SkillIndex>>, inner: H) -> Self {
        Self { index, inner }
    }
}

#[async_trait]
impl<H: RequestHandler> RequestHandler for SkillRequests<H> {
    async fn handle(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply {
        let Some(index) = self.index.clone() else {
            return self.inner.handle(execution_id, request_id, request).await;
        };
        match request {
            HostRequest::SkillsIndex {} => Reply::Ok {
                value: index_value(&index),
            },
            // A bounded read of one file, off the async threads.
            HostRequest::SkillsLoad { id } => {
                let id = id.clone();
                tokio::task::spawn_blocking(move || load_reply(&index, &id))
                    .await
                    .unwrap_or_else(|e| Reply::Error {
                        code: "skill_changed".into(),
                        message: format!("the body could not be read again: {e}"),
                    })
            }
            _ => self.inner.handle(execution_id, request_id, request).await,
        }
    }

    fn start(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Option<PendingReply> {
        match request {
            HostRequest::SkillsIndex {} | HostRequest::SkillsLoad { .. }
                if self.index.is_some() =>
            {
                None
            }
            _ => self.inner.start(execution_id, request_id, request),
        }
    }
}
