//! The instruction header of the controlled host's session ("The instruction header and
//! its revisions"), driven over the control channel the way a real host drives it
//! (`docs/worker-host-control.md`, "The instruction header"):
//!
//! * `instructions` sets the runtime's current instruction sources (a real host reads
//!   them; ours is told), and says who changed them: a change made through a tool call of
//!   the running cell is that execution's, any other the host's ([`attribute`]).
//! * `assemble` is a request assembly: the header rules run ([`InstructionStore::record`]);
//!   it answers the pinned head and the observation rendered at this sequence, if one was
//!   written.
//! * `fold` is a fold: the head moves when the rules say so.
//! * A cell's `runtime.instructions` is answered with the resolved chain's reply
//!   ([`Serving`]); the host's cell exchange has already refused a request of any
//!   execution but the live one.
//!
//! The records are the session's transcript's, durable in the host's data directory
//! ([`InstructionStore`]). This module never decides a rule (that is
//! [`crate::worker::instructions`]) and never speaks the worker wire.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use crate::control::{OpError, bad, bool_arg, required, uint_arg};
use crate::worker::host::{RequestHandler, now_since_epoch};
use crate::worker::instructions::sources::check_sources;
use crate::worker::instructions::{
    Actor, Digest, HeaderRecord, InstructionStore, Occasion, Recorded, Source, StoreError,
    ToolCall, attribute, joined_text, render_observation, resolve,
};
use crate::worker::wire::{HostRequest, Identifier, Reply};

/// The largest `at` (milliseconds since the Unix epoch): the largest integer every JSON
/// reader keeps exactly.
pub const AT_MAX: u64 = (1 << 53) - 1;

/// The arguments of the instruction ops, `None` for any other op.
pub(super) fn allowed(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "instructions" => &["sources", "execution_id", "step", "path", "reason"],
        "assemble" => &["can_observe", "at"],
        "fold" => &["covers_revision", "at"],
        _ => return None,
    })
}

/// The session's instruction header: the store, the runtime's current sources and who
/// changed them since the transcript last reached them.
pub(super) struct Instructions {
    store: InstructionStore,
    transcript: String,
    state: Mutex<State>,
    /// The different profile: `runtime.instructions` answered in another shape, with
    /// other codes ([`Instructions::reply`]).
    different: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The runtime's current instruction sources (none until `instructions` sets them).
    sources: Vec<Source>,
    /// Who changed `sources` since the transcript's newest text was theirs: `None` when
    /// nothing is pending.
    unrecorded: Option<Actor>,
}

impl Instructions {
    /// Opens the store in `dir` for the transcript `transcript` (the session's ID).
    ///
    /// # Errors
    /// The store's, as text.
    pub(super) fn open(dir: &Path, transcript: &str) -> Result<Self, String> {
        let store = InstructionStore::open(dir).map_err(|e| e.to_string())?;
        Ok(Self {
            store,
            transcript: transcript.to_string(),
            state: Mutex::new(State::default()),
            different: false,
        })
    }

    /// The same header, `runtime.instructions` answered as the different profile does
    /// (`different`) or as ours.
    pub(super) fn answering(self, different: bool) -> Self {
        Self { different, ..self }
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, OpError> {
        self.state
            .lock()
            .map_err(|_| OpError::new("store_failed", "the instruction state is poisoned"))
    }

    /// Applies `instructions`, `assemble` or `fold`; `running` is the operation ID of the
    /// cell running now, if any.
    ///
    /// # Errors
    /// `bad_request` for an argument that is not what the op takes; `not_running` for an
    /// `execution_id` that is not the running cell; `chain_stopped` when a revision is due
    /// on a chain that stopped; `store_failed`.
    pub(super) fn apply(
        &self,
        op: &str,
        args: &Map<String, Value>,
        running: Option<Identifier>,
    ) -> Result<Value, OpError> {
        match op {
            "instructions" => self.set_sources(args, running),
            "assemble" => {
                let can_observe = bool_arg(args, "can_observe")?.unwrap_or(true);
                let (written, head) = self.record(Occasion::Request { can_observe }, at(args)?)?;
                let observation = match &written {
                    Some(HeaderRecord::HeaderRevision(revision)) => {
                        Value::String(render_observation(revision))
                    }
                    _ => Value::Null,
                };
                Ok(
                    json!({"head": encode(head), "written": encode(written), "observation": observation}),
                )
            }
            "fold" => {
                let covers_a_revision =
                    required("covers_revision", bool_arg(args, "covers_revision")?)?;
                let (written, head) =
                    self.record(Occasion::Fold { covers_a_revision }, at(args)?)?;
                Ok(json!({"head": encode(head), "written": encode(written)}))
            }
            other => Err(OpError::new("unknown_op", format!("unknown op `{other}`"))),
        }
    }

    /// `instructions`: the new current sources and who changed them.
    fn set_sources(
        &self,
        args: &Map<String, Value>,
        running: Option<Identifier>,
    ) -> Result<Value, OpError> {
        let sources = sources_arg(args)?;
        let text_arg = |key: &str| match args.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("`{key}` must be a string"))),
        };
        let (path, reason) = (text_arg("path")?, text_arg("reason")?);
        let step = uint_arg(args, "step", AT_MAX)?;
        let tool_call = match args.get("execution_id") {
            None if step.is_some() => {
                return Err(bad(
                    "`step` needs `execution_id`: a change outside the transcript has no step",
                ));
            }
            None => None,
            Some(value) => {
                let id = value
                    .as_str()
                    .and_then(|s| Identifier::new(s).ok())
                    .ok_or_else(|| bad("`execution_id` must be an identifier"))?;
                // "A change a session makes through a tool call is attributed to that
                // execution": a tool call is the running cell's.
                if running.as_ref() != Some(&id) {
                    return Err(OpError::new(
                        "not_running",
                        format!("execution {id} is not the cell running now"),
                    ));
                }
                Some(ToolCall {
                    execution_id: id,
                    step,
                })
            }
        };
        let digest = Digest::of(&joined_text(&sources));
        let mut state = self.lock()?;
        if state.sources != sources {
            let actor = attribute(tool_call, path, reason);
            state.unrecorded = Some(match state.unrecorded.take() {
                None => actor,
                Some(earlier) if earlier == actor => actor,
                // Changed by more than one actor since the transcript last took the
                // text: no one of them is the whole change's.
                Some(_) => Actor::Host {
                    path: None,
                    reason: None,
                },
            });
            state.sources = sources;
        }
        Ok(json!({"digest": digest}))
    }

    /// Runs the header rules at `occasion`: the record written (if any) and the pinned
    /// head.
    fn record(
        &self,
        occasion: Occasion,
        at_ms: u64,
    ) -> Result<(Option<HeaderRecord>, Option<HeaderRecord>), OpError> {
        let mut state = self.lock()?;
        let actor = state.unrecorded.clone().unwrap_or(Actor::Host {
            path: None,
            reason: None,
        });
        let recorded = self
            .store
            .record(
                &self.transcript,
                state.sources.clone(),
                occasion,
                actor,
                at_ms,
            )
            .map_err(store_error)?;
        let records = self.store.records(&self.transcript).map_err(store_error)?;
        let resolution = resolve(&records).map_err(|e| store_error(e.into()))?;
        if resolution.newest.digest == Digest::of(&joined_text(&state.sources)) {
            state.unrecorded = None;
        }
        let head = records
            .into_iter()
            .rev()
            .find(|r| matches!(r, HeaderRecord::HeaderPin(_)));
        let written = match recorded {
            Recorded::Pinned(pin) => Some(HeaderRecord::HeaderPin(pin)),
            Recorded::Revised(revision) => Some(HeaderRecord::HeaderRevision(revision)),
            Recorded::Kept => None,
        };
        Ok((written, head))
    }

    /// The reply to `runtime.instructions`: the resolved chain
    /// ([`crate::worker::instructions::InstructionsReply`]), or `no_pin` before the
    /// transcript pinned a head. The different profile answers the same facts as
    /// `{current: {text, digest}, pinned: {digest, reason, at_ms}, parts: [name] | null,
    /// revisions_applied, stopped_at: null | {index, code, message}}`, its codes
    /// `header-<ours>` (`header-no-pin`).
    pub(super) fn reply(&self) -> Reply {
        match self.store.resolve(&self.transcript) {
            Ok(resolution) if self.different => {
                let reply = resolution.reply();
                Reply::Ok {
                    value: json!({
                        "current": {"text": reply.text, "digest": reply.digest},
                        "pinned": {
                            "digest": reply.pin.digest,
                            "reason": reply.pin.reason,
                            "at_ms": reply.pin.pinned_at_ms,
                        },
                        "parts": reply.sources.map(|sources| {
                            sources.into_iter().map(|s| s.name).collect::<Vec<_>>()
                        }),
                        "revisions_applied": reply.applied,
                        "stopped_at": reply.stopped.map(|stop| json!({
                            "index": stop.index,
                            "code": different_code(stop.code),
                            "message": stop.message,
                        })),
                    }),
                }
            }
            Ok(resolution) => Reply::Ok {
                value: serde_json::to_value(resolution.reply()).unwrap_or_default(),
            },
            Err(StoreError::Chain(e)) => Reply::Error {
                code: if self.different {
                    different_code(e.code())
                } else {
                    e.code().into()
                },
                message: e.to_string(),
            },
            Err(e) => Reply::Error {
                code: "store_failed".into(),
                message: e.to_string(),
            },
        }
    }
}

/// A code of ours as the different profile names it (`no_pin` → `header-no-pin`).
fn different_code(ours: &str) -> String {
    format!("header-{}", ours.replace('_', "-"))
}

fn encode(record: Option<HeaderRecord>) -> Value {
    serde_json::to_value(record).unwrap_or_default()
}

/// `at`: the clock reading the record takes, default the host's clock.
fn at(args: &Map<String, Value>) -> Result<u64, OpError> {
    Ok(uint_arg(args, "at", AT_MAX)?.unwrap_or_else(|| now_since_epoch().as_millis() as u64))
}

/// `sources`: `[{name, text}, ...]`, a set (names non-empty and unique).
fn sources_arg(args: &Map<String, Value>) -> Result<Vec<Source>, OpError> {
    let shape = || bad("`sources` must be an array of `{name, text}` (two strings)");
    let list = args
        .get("sources")
        .ok_or_else(|| bad("`sources` is required"))?
        .as_array()
        .ok_or_else(shape)?;
    let mut sources = Vec::with_capacity(list.len());
    for item in list {
        let item = item.as_object().ok_or_else(shape)?;
        if item.len() != 2 {
            return Err(shape());
        }
        let field = |key| item.get(key).and_then(Value::as_str).ok_or_else(shape);
        sources.push(Source::new(field("name")?, field("text")?));
    }
    check_sources(&sources).map_err(|e| bad(format!("`sources`: {e}")))?;
    Ok(sources)
}

fn store_error(e: StoreError) -> OpError {
    match e {
        StoreError::ChainStopped { .. } => OpError::new("chain_stopped", e.to_string()),
        other => OpError::new("store_failed", other.to_string()),
    }
}

/// A cell's request handler with `runtime.instructions` answered from the session's
/// header; every other request goes to `rest`.
pub(super) struct Serving<'a> {
    /// The session's header.
    pub(super) instructions: Arc<Instructions>,
    /// Every other request.
    pub(super) rest: &'a mut (dyn RequestHandler + Send),
}

#[async_trait]
impl RequestHandler for Serving<'_> {
    async fn handle(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply {
        match request {
            HostRequest::RuntimeInstructions {} => self.instructions.reply(),
            _ => self.rest.handle(execution_id, request_id, request).await,
        }
    }

    fn start(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Option<crate::worker::host::PendingReply> {
        match request {
            HostRequest::RuntimeInstructions {} => None,
            _ => self.rest.start(execution_id, request_id, request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    fn open() -> (tempfile::TempDir, Instructions) {
        let dir = tempfile::tempdir().unwrap();
        let instructions = Instructions::open(dir.path(), "root").unwrap();
        (dir, instructions)
    }

    fn code(result: Result<Value, OpError>) -> &'static str {
        result.unwrap_err().code
    }

    #[test]
    fn bad_arguments_are_refused_with_their_codes() {
        let (_dir, i) = open();
        let set = |a: Value, running: Option<&str>| {
            i.apply(
                "instructions",
                &args(a),
                running.map(|r| Identifier::new(r).unwrap()),
            )
        };
        for bad_sources in [
            json!({}),
            json!({"sources": "x"}),
            json!({"sources": [{"name": "a"}]}),
            json!({"sources": [{"name": "a", "text": 1}]}),
            json!({"sources": [{"name": "a", "text": "", "digest": "x"}]}),
            json!({"sources": [{"name": "", "text": ""}]}),
            json!({"sources": [{"name": "a", "text": ""}, {"name": "a", "text": ""}]}),
            json!({"sources": [], "step": 1}),
            json!({"sources": [], "execution_id": "not an id"}),
            json!({"sources": [], "path": 1}),
        ] {
            assert_eq!(
                code(set(bad_sources.clone(), Some("c1"))),
                "bad_request",
                "{bad_sources}"
            );
        }
        assert_eq!(
            code(set(json!({"sources": [], "execution_id": "c1"}), None)),
            "not_running"
        );
        assert_eq!(
            code(set(
                json!({"sources": [], "execution_id": "c1"}),
                Some("c2")
            )),
            "not_running"
        );
        assert_eq!(code(i.apply("fold", &args(json!({})), None)), "bad_request");
        assert_eq!(
            code(i.apply("fold", &args(json!({"covers_revision": 1})), None)),
            "bad_request"
        );
        assert_eq!(
            code(i.apply("assemble", &args(json!({"at": -1})), None)),
            "bad_request"
        );
        assert_eq!(
            code(i.apply("assemble", &args(json!({"can_observe": "yes"})), None)),
            "bad_request"
        );
    }

    #[test]
    fn a_cell_s_change_is_its_execution_s_and_is_recorded_once() {
        let (_dir, i) = open();
        let Reply::Error { code, .. } = i.reply() else {
            panic!("no pin yet")
        };
        assert_eq!(code, "no_pin");
        let set = |text: &str, execution: Option<&str>| {
            let mut a = json!({"sources": [{"name": "contract", "text": text}]});
            if let Some(e) = execution {
                a["execution_id"] = json!(e);
                a["step"] = json!(2);
            }
            i.apply(
                "instructions",
                &args(a),
                Some(Identifier::new("c1").unwrap()),
            )
            .unwrap()
        };
        set("a\n", None);
        let pinned = i.apply("assemble", &args(json!({"at": 5})), None).unwrap();
        assert_eq!(pinned["written"]["reason"], "session_start");
        assert_eq!(pinned["head"], pinned["written"]);

        set("a\nb\n", Some("c1"));
        let busy = json!({"can_observe": false, "at": 6});
        let kept = i.apply("assemble", &args(busy), None).unwrap();
        assert_eq!(kept["written"], Value::Null);
        let revised = i.apply("assemble", &args(json!({"at": 7})), None).unwrap();
        assert_eq!(revised["head"], pinned["head"]);
        assert_eq!(
            revised["written"]["actor"],
            json!({"origin": "session", "execution_id": "c1", "step": 2})
        );
        assert!(
            revised["observation"]
                .as_str()
                .unwrap()
                .contains("changed in this transcript by execution c1 at step 2")
        );
        let again = i.apply("assemble", &args(json!({"at": 8})), None).unwrap();
        assert_eq!(
            (&again["written"], &again["observation"]),
            (&Value::Null, &Value::Null)
        );

        // A host change after the cell's, before the transcript took either: no one
        // actor is the whole change's.
        set("a\nb\nc\n", Some("c1"));
        let by_host = json!({"sources": [{"name": "contract", "text": "a\nc\n"}], "reason": "x"});
        i.apply("instructions", &args(by_host), None).unwrap();
        let mixed = i.apply("assemble", &args(json!({"at": 9})), None).unwrap();
        assert_eq!(mixed["written"]["actor"], json!({"origin": "host"}));

        let Reply::Ok { value } = i.reply() else {
            panic!("a pin")
        };
        assert_eq!(
            (value["text"].as_str(), &value["applied"]),
            (Some("a\nc\n"), &json!(2))
        );

        let folded = i
            .apply(
                "fold",
                &args(json!({"covers_revision": true, "at": 10})),
                None,
            )
            .unwrap();
        assert_eq!(folded["written"]["reason"], "fold_covered_revision");
        assert_eq!(folded["head"]["text"], "a\nc\n");
    }

    #[test]
    fn the_records_outlive_the_host() {
        let dir = tempfile::tempdir().unwrap();
        {
            let i = Instructions::open(dir.path(), "root").unwrap();
            i.apply(
                "instructions",
                &args(json!({"sources": [{"name": "n", "text": "t"}]})),
                None,
            )
            .unwrap();
            i.apply("assemble", &args(json!({"at": 1})), None).unwrap();
        }
        let i = Instructions::open(dir.path(), "root").unwrap();
        let Reply::Ok { value } = i.reply() else {
            panic!("the pin is kept")
        };
        assert_eq!(value["text"], "t");
    }

    #[test]
    fn the_different_profile_answers_the_same_chain_in_another_shape() {
        let dir = tempfile::tempdir().unwrap();
        let i = Instructions::open(dir.path(), "root")
            .unwrap()
            .answering(true);
        let Reply::Error { code, .. } = i.reply() else {
            panic!("no pin yet")
        };
        assert_eq!(code, "header-no-pin");
        i.apply(
            "instructions",
            &args(json!({"sources": [{"name": "n", "text": "t\n"}]})),
            None,
        )
        .unwrap();
        i.apply("assemble", &args(json!({"at": 7})), None).unwrap();
        let Reply::Ok { value } = i.reply() else {
            panic!("a pin")
        };
        assert_eq!(
            value,
            json!({
                "current": {"text": "t\n", "digest": Digest::of("t\n")},
                "pinned": {"digest": Digest::of("t\n"), "reason": "session_start", "at_ms": 7},
                "parts": null,
                "revisions_applied": 0,
                "stopped_at": null,
            })
        );
    }
}
