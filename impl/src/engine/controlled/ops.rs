//! The controlled client's operations (`docs/engine-client-control.md`, "Operations"):
//! argument checks, the order in which ops see the session, and the outcome of each.
//!
//! Every op is long: it is checked when read (a bad argument is refused `bad_request` at
//! once), then registers its outcome and runs on. The session an op uses is fixed when
//! it is read: the one of the last `initialize` read before it, once that ended (so an
//! op pipelined behind an `initialize` waits for it, and `initialize`s run one after the
//! other, each reconnecting with what the previous one kept). An op behind no won
//! `initialize` ends `not_initialized` without a call.

use std::sync::{Arc, OnceLock, PoisonError};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::{Config, error_outcome, status_outcome};
use crate::control::{
    OpError, Ops, Outcomes, bad, bool_arg, required, str_arg, strings_arg, uint_arg,
};
use crate::engine::cli::state::{ClientState, private_dir};
use crate::engine::client::{self, Client, ClientError};
use crate::engine::compat::MINOR_MAX;
use crate::engine::daemon::limits::MAX_PAGE_EVENTS;
use crate::engine::json::{from_json, to_json};
use crate::engine::proto::engine::v1 as pb;
use crate::engine::session::{Session, SessionError, operation_id};

/// The choices the spec leaves to a client, and ours (`engine controlled --profile`):
/// another correct client reports other codes for its own refusals and for a gap inside
/// a stream, does not use our daemon's cursor-gap trailer, reads smaller pages and names
/// its operations otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// Reported codes renamed: `(ours, theirs)`.
    pub codes: &'static [(&'static str, &'static str)],
    /// Whether `follow` goes on after a cursor gap from the daemon's trailer.
    pub across_gaps: bool,
    /// The page size of `follow` without `page`.
    pub page: u32,
    /// The prefix of client operation IDs (`op-` is ours).
    pub operation_prefix: &'static str,
}

impl Choices {
    /// Ours.
    pub const REFERENCE: Choices = Choices {
        codes: &[],
        across_gaps: true,
        page: MAX_PAGE_EVENTS,
        operation_prefix: "op-",
    };

    /// Another correct client's.
    pub const DIFFERENT: Choices = Choices {
        codes: &[
            ("not_initialized", "no_session"),
            ("capability_not_negotiated", "snapshot_authority_missing"),
            ("DATA_LOSS", "ABORTED"),
        ],
        across_gaps: false,
        page: 100,
        operation_prefix: "mutation-",
    };

    /// A fresh client operation ID.
    fn operation_id(self) -> String {
        match operation_id().strip_prefix("op-") {
            Some(id) => format!("{}{id}", self.operation_prefix),
            None => operation_id(),
        }
    }

    /// `outcome` with its error code renamed as these choices report it.
    fn rename(self, mut outcome: Value) -> Value {
        if let Some(code) = outcome.pointer_mut("/error/code")
            && let Some((_, theirs)) = self.codes.iter().find(|(ours, _)| code == ours)
        {
            *code = Value::String((*theirs).to_string());
        }
        outcome
    }
}

/// The session ops read after an `initialize` use, once that `initialize` ended.
#[derive(Clone)]
enum Held {
    /// The `initialize` runs.
    Pending,
    /// The session of the last won claim (`None`: none was won).
    Ready(Option<Arc<Session>>),
}

/// The session `held` settles to (`None` when no claim was won, or the `initialize` it
/// waited for was dropped).
async fn settled(mut held: watch::Receiver<Held>) -> Option<Session> {
    match held.wait_for(|h| matches!(h, Held::Ready(_))).await {
        Ok(h) => match &*h {
            Held::Ready(s) => s.as_deref().cloned(),
            Held::Pending => None,
        },
        Err(_) => None,
    }
}

/// The arguments each op takes.
fn allowed(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "initialize" => &["require", "minor", "as"],
        "start_run" => &["definition", "message", "as"],
        "follow" => &["run_id", "after_sequence", "page", "tail", "as"],
        "respond" => &["run_id", "interaction_id", "response", "as"],
        "interactions" | "cancel" | "suspend" | "resume" | "export" => &["run_id", "as"],
        _ => return None,
    })
}

/// A run operation, its arguments checked.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    StartRun {
        definition: pb::DefinitionRef,
        message: String,
    },
    Follow {
        run_id: String,
        after: u64,
        page: u32,
        tail: bool,
    },
    Interactions {
        run_id: String,
    },
    Respond {
        run_id: String,
        interaction_id: String,
        response_json: String,
    },
    Cancel {
        run_id: String,
    },
    Suspend {
        run_id: String,
    },
    Resume {
        run_id: String,
    },
    Export {
        run_id: String,
    },
}

impl Call {
    /// Reads the run operation `op` from `args` (only keys [`allowed`] lists).
    fn parse(op: &str, args: &Map<String, Value>, choices: Choices) -> Result<Self, OpError> {
        let run_id = || str_arg(args, "run_id").map(str::to_string);
        Ok(match op {
            "start_run" => Call::StartRun {
                definition: from_json(
                    required("definition", args.get("definition"))?,
                    "engine.v1.DefinitionRef",
                )
                .map_err(|e| bad(format!("`definition` must be {{id, revision}}: {e}")))?,
                message: str_arg(args, "message")?.to_string(),
            },
            "follow" => Call::Follow {
                run_id: run_id()?,
                after: required(
                    "after_sequence",
                    uint_arg(args, "after_sequence", u64::MAX)?,
                )?,
                page: uint_arg(args, "page", u64::from(u32::MAX))?
                    .map_or(Ok(choices.page), u32::try_from)
                    .map_err(|_| bad("`page` must fit 32 bits"))?,
                tail: bool_arg(args, "tail")?.unwrap_or(true),
            },
            "interactions" => Call::Interactions { run_id: run_id()? },
            "respond" => Call::Respond {
                run_id: run_id()?,
                interaction_id: str_arg(args, "interaction_id")?.to_string(),
                // The response is a JSON value; the request carries its JSON text.
                response_json: required("response", args.get("response"))?.to_string(),
            },
            "cancel" => Call::Cancel { run_id: run_id()? },
            "suspend" => Call::Suspend { run_id: run_id()? },
            "resume" => Call::Resume { run_id: run_id()? },
            "export" => Call::Export { run_id: run_id()? },
            other => return Err(OpError::new("unknown_op", format!("unknown op `{other}`"))),
        })
    }

    /// Makes the call(s) on `s`; the outcome.
    async fn run(self, mut s: Session, choices: Choices) -> Value {
        match self {
            Call::StartRun {
                definition,
                message,
            } => {
                let r = s
                    .start_run(definition, &message, &choices.operation_id())
                    .await;
                response(r, "engine.v1.StartRunResponse")
            }
            Call::Follow {
                run_id,
                after,
                page,
                tail,
            } => {
                let mut sequences = Vec::new();
                let mut missed = Vec::new();
                let on_event = |e: &pb::RunEvent| sequences.push(e.sequence);
                let followed = if choices.across_gaps {
                    s.follow_across_gaps(&run_id, after, page, tail, on_event, |first, last| {
                        missed.push([first, last]);
                    })
                    .await
                } else {
                    s.follow(&run_id, after, page, tail, on_event).await
                };
                match followed {
                    Ok(f) => {
                        let terminal = match &f.terminal {
                            Some(t) => match to_json(t, "engine.v1.RunTerminal") {
                                Ok(t) => t,
                                Err(e) => return encoding_failed(&e),
                            },
                            None => Value::Null,
                        };
                        json!({"sequences": sequences, "last_sequence": f.last_sequence,
                               "terminal": terminal, "missed": missed})
                    }
                    Err(status) => status_outcome(&status),
                }
            }
            Call::Interactions { run_id } => match s.interactions(&run_id).await {
                Ok(snapshot) => match to_json(&snapshot, "engine.v1.InteractionSnapshot") {
                    Ok(snapshot) => json!({"snapshot": snapshot}),
                    Err(e) => encoding_failed(&e),
                },
                Err(status) => status_outcome(&status),
            },
            Call::Respond {
                run_id,
                interaction_id,
                response_json,
            } => {
                let r = s
                    .respond(
                        &run_id,
                        &interaction_id,
                        &response_json,
                        &choices.operation_id(),
                    )
                    .await;
                response(r, "engine.v1.RespondInteractionResponse")
            }
            Call::Cancel { run_id } => response(
                s.cancel(&run_id, &choices.operation_id()).await,
                "engine.v1.CancelRunResponse",
            ),
            Call::Suspend { run_id } => response(
                s.suspend(&run_id, &choices.operation_id()).await,
                "engine.v1.SuspendRunResponse",
            ),
            Call::Resume { run_id } => response(
                s.resume(&run_id, &choices.operation_id()).await,
                "engine.v1.ResumeRunResponse",
            ),
            Call::Export { run_id } => match s.export(&run_id).await {
                Ok(snapshot) => response::<_, tonic::Status>(
                    Ok(pb::ExportSnapshotResponse {
                        snapshot: Some(snapshot),
                    }),
                    "engine.v1.ExportSnapshotResponse",
                ),
                Err(e) => failure(&e),
            },
        }
    }
}

/// `{"response": <message>}`, or the failure's outcome.
fn response<M: prost::Message, E: Into<SessionError>>(r: Result<M, E>, full_name: &str) -> Value {
    match r {
        Ok(m) => match to_json(&m, full_name) {
            Ok(m) => json!({"response": m}),
            Err(e) => encoding_failed(&e),
        },
        Err(e) => failure(&e.into()),
    }
}

/// A message that does not render (never for a message we decoded).
fn encoding_failed(e: &str) -> Value {
    error_outcome("encoding_failed", e)
}

/// The outcome of a failed call, or of a refusal before any call.
fn failure(e: &SessionError) -> Value {
    match e {
        SessionError::Client(ClientError::Status(s)) => status_outcome(s),
        // A daemon that cannot be reached is what a gRPC client reports UNAVAILABLE.
        SessionError::Client(ClientError::Connect { .. }) => {
            error_outcome("UNAVAILABLE", e.to_string())
        }
        other => error_outcome(other.code(), other.to_string()),
    }
}

/// The controlled client's state.
pub(super) struct EngineClient {
    config: Config,
    choices: Choices,
    outcomes: Outcomes,
    /// The channel to the daemon, made by the first `initialize`.
    client: tokio::sync::Mutex<Option<Client>>,
    /// The endpoint token once read, scrubbed from every outcome.
    token: OnceLock<String>,
    /// What the next op reads as its session.
    session: std::sync::Mutex<watch::Receiver<Held>>,
}

impl EngineClient {
    pub(super) fn new(config: Config, choices: Choices) -> Self {
        let (_, none) = watch::channel(Held::Ready(None));
        Self {
            config,
            choices,
            outcomes: Outcomes::new(),
            client: tokio::sync::Mutex::new(None),
            token: OnceLock::new(),
            session: std::sync::Mutex::new(none),
        }
    }

    /// The channel to the daemon, connected on first use.
    async fn client(&self) -> Result<Client, ClientError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let token = client::read_token(&self.config.token_file)?;
        let _ = self.token.set(token);
        let c = client::connect(&self.config.socket, &self.config.token_file).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// `value` with every occurrence of the endpoint token in its strings replaced.
    fn scrub(&self, value: Value) -> Value {
        match self.token.get() {
            Some(token) if !token.is_empty() => scrub(value, token),
            _ => value,
        }
    }

    /// The claim: a reconnect with what the state directory keeps, or a new owner; a won
    /// claim is kept before its outcome. The session afterwards: the new one, or
    /// `previous` when the claim was not won.
    async fn initialize(
        &self,
        previous: Option<Session>,
        require: &[String],
        minor: u32,
    ) -> (Value, Option<Session>) {
        let path = self.config.state_file();
        let recorded = match ClientState::load(&path) {
            Ok(recorded) => recorded,
            Err(e) => return (error_outcome(e.code(), e.to_string()), previous),
        };
        let c = match self.client().await {
            Ok(c) => c,
            Err(e) => return (failure(&e.into()), previous),
        };
        let ownership = ClientState::ownership(recorded);
        match Session::initialize(c, &ownership, require, minor).await {
            Ok(session) => {
                let kept = private_dir(&self.config.state_dir)
                    .and_then(|()| ClientState::of(&session).store(&path));
                if let Err(e) = kept {
                    return (error_outcome(e.code(), e.to_string()), previous);
                }
                let result =
                    pb::initialize_response::Result::Initialized(session.initialized.clone());
                (result_json(result), Some(session))
            }
            Err(SessionError::Refused(result)) => (result_json(*result), previous),
            Err(e) => (failure(&e), previous),
        }
    }
}

/// The `result` oneof of an `InitializeResponse` in the proto3 JSON mapping:
/// `{"initialized": …}`, `{"staleClaim": …}`, ….
fn result_json(result: pb::initialize_response::Result) -> Value {
    let response = pb::InitializeResponse {
        result: Some(result),
    };
    to_json(&response, "engine.v1.InitializeResponse").unwrap_or_else(|e| encoding_failed(&e))
}

/// `value` with `token` replaced in every string.
fn scrub(value: Value, token: &str) -> Value {
    match value {
        Value::String(s) if s.contains(token) => Value::String(s.replace(token, "<redacted>")),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| scrub(v, token)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k.replace(token, "<redacted>"), scrub(v, token)))
                .collect(),
        ),
        other => other,
    }
}

impl Ops for EngineClient {
    fn allowed(&self, op: &str) -> Option<&'static [&'static str]> {
        allowed(op)
    }

    fn outcomes(&self) -> &Outcomes {
        &self.outcomes
    }

    async fn apply(
        self: &Arc<Self>,
        op: &str,
        name: String,
        args: &Map<String, Value>,
    ) -> Result<Value, OpError> {
        let me = self.clone();
        if op == "initialize" {
            let require = strings_arg(args, "require")?.unwrap_or_default();
            let minor = uint_arg(args, "minor", u64::from(u32::MAX))?
                .map_or(Ok(MINOR_MAX), u32::try_from)
                .map_err(|_| bad("`minor` must fit 32 bits"))?;
            let pending = self.outcomes.register(name)?;
            let (tx, rx) = watch::channel(Held::Pending);
            let previous = std::mem::replace(
                &mut *self.session.lock().unwrap_or_else(PoisonError::into_inner),
                rx,
            );
            pending.spawn(async move {
                let previous = settled(previous).await;
                let (outcome, now) = me.initialize(previous, &require, minor).await;
                tx.send_replace(Held::Ready(now.map(Arc::new)));
                me.scrub(me.choices.rename(outcome))
            });
            return Ok(json!({}));
        }
        let call = Call::parse(op, args, self.choices)?;
        let held = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.outcomes.spawn(name, async move {
            let outcome = match settled(held).await {
                Some(session) => call.run(session, me.choices).await,
                None => error_outcome(
                    "not_initialized",
                    "no initialize was won before this operation",
                ),
            };
            me.scrub(me.choices.rename(outcome))
        })
    }

    async fn stop(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{Dispatch, dispatch};

    fn args(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    fn unreachable_daemon(dir: &std::path::Path) -> Arc<EngineClient> {
        Arc::new(EngineClient::new(
            Config {
                socket: dir.join("no-daemon.sock"),
                token_file: dir.join("no-token"),
                state_dir: dir.join("state"),
            },
            Choices::REFERENCE,
        ))
    }

    async fn line(c: &Arc<EngineClient>, l: &str) -> Value {
        match dispatch(c, l.as_bytes()).await {
            Dispatch::Now(r) => serde_json::from_str(&r).unwrap(),
            Dispatch::Later(w) => serde_json::from_str(&w.await).unwrap(),
        }
    }

    #[test]
    fn run_operations_read_their_arguments() {
        assert_eq!(
            Call::parse(
                "start_run",
                &args(json!({"definition": {"id": "scripted", "revision": "1"}, "message": "hi"})),
                Choices::REFERENCE,
            )
            .unwrap(),
            Call::StartRun {
                definition: pb::DefinitionRef {
                    id: "scripted".into(),
                    revision: 1
                },
                message: "hi".into()
            }
        );
        assert_eq!(
            Call::parse(
                "follow",
                &args(json!({"run_id": "r", "after_sequence": 3})),
                Choices::REFERENCE
            )
            .unwrap(),
            Call::Follow {
                run_id: "r".into(),
                after: 3,
                page: MAX_PAGE_EVENTS,
                tail: true
            }
        );
        assert_eq!(
            Call::parse(
                "follow",
                &args(json!({"run_id": "r", "after_sequence": 0, "page": 2, "tail": false})),
                Choices::REFERENCE,
            )
            .unwrap(),
            Call::Follow {
                run_id: "r".into(),
                after: 0,
                page: 2,
                tail: false
            }
        );
        assert_eq!(
            Call::parse(
                "respond",
                &args(json!({"run_id": "r", "interaction_id": "i", "response": {"ok": "yes"}})),
                Choices::REFERENCE,
            )
            .unwrap(),
            Call::Respond {
                run_id: "r".into(),
                interaction_id: "i".into(),
                response_json: r#"{"ok":"yes"}"#.into()
            }
        );
        assert_eq!(
            Call::parse("export", &args(json!({"run_id": "r"})), Choices::REFERENCE).unwrap(),
            Call::Export { run_id: "r".into() }
        );
    }

    #[test]
    fn bad_run_arguments_are_refused_typed() {
        for (op, a) in [
            ("start_run", json!({"message": "hi"})),
            ("start_run", json!({"definition": {"id": "s"}})),
            (
                "start_run",
                json!({"definition": {"id": "s", "revision": -1}, "message": "hi"}),
            ),
            (
                "start_run",
                json!({"definition": {"id": "s", "rev": 1}, "message": "hi"}),
            ),
            ("start_run", json!({"definition": "s@1", "message": "hi"})),
            ("follow", json!({"run_id": "r"})),
            ("follow", json!({"run_id": "r", "after_sequence": "0"})),
            (
                "follow",
                json!({"run_id": "r", "after_sequence": 0, "page": 4_294_967_296_u64}),
            ),
            (
                "follow",
                json!({"run_id": "r", "after_sequence": 0, "tail": "yes"}),
            ),
            ("respond", json!({"run_id": "r", "interaction_id": "i"})),
            ("cancel", json!({})),
            ("suspend", json!({"run_id": 7})),
        ] {
            let e = Call::parse(op, &args(a.clone()), Choices::REFERENCE).unwrap_err();
            assert_eq!(e.code, "bad_request", "{op} {a}: {e:?}");
        }
    }

    #[test]
    fn another_clients_choices_rename_its_codes_and_operation_ids() {
        let d = Choices::DIFFERENT;
        assert_eq!(
            d.rename(json!({"error": {"code": "not_initialized", "message": "m"}})),
            json!({"error": {"code": "no_session", "message": "m"}})
        );
        assert_eq!(
            d.rename(json!({"error": {"code": "NOT_FOUND"}})),
            json!({"error": {"code": "NOT_FOUND"}})
        );
        assert_eq!(d.rename(json!({"response": {}})), json!({"response": {}}));
        assert!(d.operation_id().starts_with("mutation-"));
        assert!(Choices::REFERENCE.operation_id().starts_with("op-"));
        assert_eq!(
            Call::parse(
                "follow",
                &args(json!({"run_id": "r", "after_sequence": 0})),
                d
            )
            .unwrap(),
            Call::Follow {
                run_id: "r".into(),
                after: 0,
                page: 100,
                tail: true
            }
        );
    }

    #[tokio::test]
    async fn ops_before_a_won_initialize_end_not_initialized_without_a_call() {
        let dir = tempfile::tempdir().unwrap();
        let c = unreachable_daemon(dir.path());
        for (seq, op) in [
            r#""op":"start_run","definition":{"id":"scripted","revision":1},"message":"m""#,
            r#""op":"follow","run_id":"r","after_sequence":0"#,
            r#""op":"export","run_id":"r""#,
        ]
        .iter()
        .enumerate()
        {
            let r = line(&c, &format!(r#"{{"seq":{seq},{op},"as":"op{seq}"}}"#)).await;
            assert_eq!(r["result"], json!({}), "{r}");
            let r = line(&c, &format!(r#"{{"seq":9,"op":"await","as":"op{seq}"}}"#)).await;
            assert_eq!(r["result"]["error"]["code"], "not_initialized", "{r}");
        }
        assert!(c.client.lock().await.is_none(), "no connection was made");
        // An unknown argument, and an unknown op.
        let r = line(&c, r#"{"seq":1,"op":"initialize","minor":1,"bogus":true}"#).await;
        assert_eq!(r["error"]["code"], "bad_request", "{r}");
        let r = line(&c, r#"{"seq":2,"op":"initialize","require":"snapshots"}"#).await;
        assert_eq!(r["error"]["code"], "bad_request", "{r}");
        let r = line(&c, r#"{"seq":3,"op":"import","run_id":"r"}"#).await;
        assert_eq!(r["error"]["code"], "unknown_op", "{r}");
    }

    #[tokio::test]
    async fn an_unreachable_daemon_is_unavailable_and_leaves_no_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("no-token"), "secret-token\n").unwrap();
        let c = unreachable_daemon(dir.path());
        line(&c, r#"{"seq":1,"op":"initialize"}"#).await;
        line(&c, r#"{"seq":2,"op":"cancel","run_id":"r"}"#).await;
        let r = line(&c, r#"{"seq":3,"op":"await","as":"initialize"}"#).await;
        assert_eq!(r["result"]["error"]["code"], "UNAVAILABLE", "{r}");
        let r = line(&c, r#"{"seq":4,"op":"await","as":"cancel"}"#).await;
        assert_eq!(r["result"]["error"]["code"], "not_initialized", "{r}");
        assert!(
            !dir.path()
                .join("state")
                .join(super::super::STATE_FILE)
                .exists()
        );
    }

    #[test]
    fn responses_keep_enum_values_the_client_does_not_know() {
        let r: Result<_, tonic::Status> = Ok(pb::CancelRunResponse {
            already_terminal: true,
            outcome: 99,
        });
        assert_eq!(
            response(r, "engine.v1.CancelRunResponse"),
            json!({"response": {"alreadyTerminal": true, "outcome": 99}})
        );
        let r: Result<pb::CancelRunResponse, _> = Err(tonic::Status::data_loss("gap"));
        assert_eq!(
            response(r, "engine.v1.CancelRunResponse"),
            json!({"error": {"code": "DATA_LOSS", "message": "gap"}})
        );
    }

    #[test]
    fn the_token_is_scrubbed_from_every_string() {
        let v = json!({"error": {"code": "UNAUTHENTICATED", "message": "bad tok-123 here"},
                       "list": ["tok-123", 1], "tok-123": true});
        assert_eq!(
            scrub(v, "tok-123"),
            json!({"error": {"code": "UNAUTHENTICATED", "message": "bad <redacted> here"},
                   "list": ["<redacted>", 1], "<redacted>": true})
        );
    }
}
