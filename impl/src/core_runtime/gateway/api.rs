//! The public API: HTTP JSON under `/v1` (`docs/core-api.md`).
//!
//! Bodies are strict JSON (duplicate keys, `null` and unknown fields are refused).
//! Errors are `{"error": "<code>", "message": "..."}` with a 4xx status for bad input
//! and 5xx only for storage failures. Every write is one store transaction, so a
//! refused request leaves nothing half-written.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::admission::AgentDefinition;
use super::env_files::{self, TransferError};
use super::extract::{ApiBody, ApiPath, ApiQuery, BodyBound};
use super::files::{self, FilesError};
use super::files_export::{self, ExportError};
use super::files_write::{self, WriteError};
use super::suspension::{self, Fence, SuspensionError};
use super::turn::FrozenSession;
use super::{Core, TurnMsg, now_ms};
use crate::core_runtime::store::{
    AgentRecord, EVENTS_PAGE_MAX, EnvironmentKind, EnvironmentRecord, InteractionKind,
    InteractionState, SessionRecord, StoreError, TurnRecord, TurnState,
};
use crate::core_runtime::wire::limits::{
    INPUT_MESSAGES_MAX, PUBLIC_INLINE_WRITE_MAX_BYTES, TRANSPORT_FRAME_MAX_BYTES,
};
use crate::core_runtime::wire::{
    MessageInput, PermissionVerdict, PromptForUserChoiceDecision, ReadOperation, Uuid,
    validate_question_answers,
};
use crate::wire::bounded::{BoundedString, BoundedVec};

/// Bound on a public request body (bytes): an input must fit one transport frame.
pub const BODY_MAX_BYTES: usize = TRANSPORT_FRAME_MAX_BYTES;

/// JSON overhead allowed around the base64 content of a file write (the members
/// `content_base64` and `sha256`, with whitespace).
pub const WRITE_BODY_ENVELOPE_BYTES: usize = 1024;

/// Bound on the body of `PUT /v1/sessions/{id}/files/content`: the base64 encoding of
/// the 5 MiB decoded inline limit plus [`WRITE_BODY_ENVELOPE_BYTES`]; a larger body
/// is refused `request_too_large` (413) before it is parsed.
pub const WRITE_BODY_MAX_BYTES: usize =
    (PUBLIC_INLINE_WRITE_MAX_BYTES as usize).div_ceil(3) * 4 + WRITE_BODY_ENVELOPE_BYTES;

/// Bound on the body of `POST /v1/environments/{id}/files`: the base64 encoding of
/// the 5 MiB decoded inline limit, the longest wire path and
/// [`WRITE_BODY_ENVELOPE_BYTES`]; a larger body is refused `request_too_large` (413).
pub const ENV_FILES_BODY_MAX_BYTES: usize = WRITE_BODY_MAX_BYTES
    + crate::core_runtime::wire::limits::PATH_MAX_BYTES
    + WRITE_BODY_ENVELOPE_BYTES;

/// Default page size of `GET /v1/turns/{id}/events`.
pub const EVENTS_PAGE_DEFAULT: u32 = 100;

/// Bound on the payload bytes of one events page (daemon policy): events are added while
/// their payloads stay within it, so a page may hold fewer than `limit` events; the
/// first event always goes in, whatever its size.
pub const EVENTS_PAGE_BYTES_MAX: usize = 1024 * 1024;

/// What an events page reserves of the answer budget before it is built: the page bound
/// and room for the page's framing; a page that comes out larger (its first event a
/// large one) tops its reservation up before it is answered.
pub const EVENTS_PAGE_RESERVE_BYTES: usize = EVENTS_PAGE_BYTES_MAX + 64 * 1024;

/// A typed API error.
#[derive(Debug)]
pub struct ApiError {
    pub(super) status: StatusCode,
    code: &'static str,
    message: String,
    /// Extra members of the error object (e.g. `write_id`).
    details: serde_json::Map<String, Value>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: serde_json::Map::new(),
        }
    }
    fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }
    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        let status = match &err {
            StoreError::NotFound { .. } => StatusCode::NOT_FOUND,
            StoreError::AlreadyExists { .. }
            | StoreError::SessionBusy(_)
            | StoreError::WriteReserved(_)
            | StoreError::InvalidState(_) => StatusCode::CONFLICT,
            StoreError::LimitReached(_) => StatusCode::TOO_MANY_REQUESTS,
            StoreError::Database(_) | StoreError::Corrupt(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, err.code(), err.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = self.details;
        body.insert("error".into(), Value::from(self.code));
        body.insert("message".into(), Value::from(self.message));
        (self.status, Json(Value::Object(body))).into_response()
    }
}

pub(super) type ApiResult = Result<Response, ApiError>;

/// Decodes a body strictly; its size was bounded when it was read (the router's
/// `DefaultBodyLimit` of [`BODY_MAX_BYTES`], or the route's own).
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    crate::wire::decode_strict(body)
        .map_err(|e| ApiError::bad("invalid_request", format!("{e} ({})", e.code())))
}

fn created(value: Value) -> ApiResult {
    Ok((StatusCode::CREATED, Json(value)).into_response())
}

fn accepted(value: Value) -> ApiResult {
    Ok((StatusCode::ACCEPTED, Json(value)).into_response())
}

/// SHA-256 of an API key (what Core keeps; the key itself is compared by digest, in
/// constant time).
pub fn key_digest(key: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).into()
}

/// Every public route requires the Project API key as `Authorization: Bearer <key>`
/// ("Credentials checked on every route and never in a URL"): anything else is `401
/// unauthorized`. The daemon credential is not an API key, and an API key is not a
/// daemon credential (bootstrap and the upgrade check the device's credential only).
pub async fn require_api_key(
    State(core): State<Arc<Core>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if api_key_ok(&core, request.headers()) {
        next.run(request).await
    } else {
        unauthorized()
    }
}

/// Whether `headers` present the Project API key (compared by digest, in constant time).
fn api_key_ok(core: &Core, headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::wire::bearer::bearer_credential_str)
        .map(key_digest)
        .is_some_and(|d| {
            d.iter()
                .zip(core.api_key_digest.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        })
}

fn unauthorized() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the public API needs `Authorization: Bearer <Project API key>`",
    )
    .into_response()
}

/// Every request no route matches: typed JSON like every other refusal; under `/v1` the
/// API key is checked first (an anonymous client learns nothing about the routes).
pub async fn no_route(State(core): State<Arc<Core>>, request: axum::extract::Request) -> Response {
    let path = request.uri().path();
    if (path == "/v1" || path.starts_with("/v1/")) && !api_key_ok(&core, request.headers()) {
        return unauthorized();
    }
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response()
}

/// A route asked with a method it does not serve: `405 method_not_allowed`, JSON; under
/// `/v1` the API key is checked first.
pub async fn wrong_method(
    State(core): State<Arc<Core>>,
    request: axum::extract::Request,
) -> Response {
    let path = request.uri().path();
    if path.starts_with("/v1/") && !api_key_ok(&core, request.headers()) {
        return unauthorized();
    }
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not served on this route", request.method()),
    )
    .into_response()
}

/// The public routes.
pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route("/v1/devices/{id}", get(get_device))
        .merge(super::credentials::routes())
        .route("/v1/agents", post(create_agent))
        .route("/v1/agents/{id}", get(get_agent))
        .route("/v1/environments", post(create_environment))
        .route("/v1/environments/{id}", get(get_environment))
        .route("/v1/environments/{id}/quiesce", post(quiesce_environment))
        .route("/v1/environments/{id}/resume", post(resume_environment))
        .route(
            "/v1/environments/{id}/files",
            post(install_environment_file).layer((
                DefaultBodyLimit::max(ENV_FILES_BODY_MAX_BYTES),
                Extension(BodyBound(ENV_FILES_BODY_MAX_BYTES)),
            )),
        )
        .route("/v1/sessions", post(create_session))
        .route("/v1/sessions/{id}", get(get_session))
        .route("/v1/sessions/{id}/turns", post(create_turn))
        .route("/v1/sessions/{id}/files", get(list_files))
        .route(
            "/v1/sessions/{id}/files/content",
            get(read_file).put(write_file).layer((
                DefaultBodyLimit::max(WRITE_BODY_MAX_BYTES),
                Extension(BodyBound(WRITE_BODY_MAX_BYTES)),
            )),
        )
        .route("/v1/sessions/{id}/files/writes/{write_id}", get(get_write))
        .route("/v1/sessions/{id}/files/export", get(export_files))
        .route("/v1/turns/{id}", get(get_turn))
        .route("/v1/turns/{id}/events", get(get_events))
        .route("/v1/turns/{id}/inputs", post(send_input).get(list_inputs))
        .route("/v1/turns/{id}/cancel", post(cancel_turn))
        .route("/v1/turns/{id}/interactions", get(list_interactions))
        .route(
            "/v1/turns/{id}/permissions/{request_id}",
            post(answer_permission),
        )
        .route(
            "/v1/turns/{id}/user_choices/{ask_id}",
            post(answer_user_choice),
        )
        .route(
            "/v1/turns/{id}/function_results/{call_id}",
            post(answer_function),
        )
        // Every other body is bounded by one transport frame (the file routes above set
        // their own, larger bound); past it the body is refused unread.
        .layer(DefaultBodyLimit::max(BODY_MAX_BYTES))
        .layer(Extension(BodyBound(BODY_MAX_BYTES)))
        .layer(axum::middleware::map_response(close_after_refused_body))
}

/// A body refused as too large or too slow may not have been read to its end, and the
/// connection is then closed after the answer: the answer says `Connection: close`, so
/// a client does not send its next request on that connection.
async fn close_after_refused_body(mut response: Response) -> Response {
    if matches!(
        response.status(),
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
    ) {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

async fn create_agent(State(core): State<Arc<Core>>, ApiBody(body): ApiBody) -> ApiResult {
    let definition: AgentDefinition = parse(&body)?;
    let definition = definition.frozen();
    let record = AgentRecord {
        agent_id: Uuid::random().to_string(),
        definition: serde_json::to_value(&definition)
            .map_err(|e| ApiError::bad("invalid_request", e.to_string()))?,
        created_at_ms: now_ms(),
    };
    let value = json!({ "agent_id": record.agent_id, "definition": record.definition, "created_at_ms": record.created_at_ms });
    core.store.call(move |s| s.insert_agent(&record)).await?;
    created(value)
}

/// `GET /v1/devices/{id}`: the device's connection status. `declaration_known` is
/// true only once a valid heartbeat was applied on the current connection.
async fn get_device(State(core): State<Arc<Core>>, ApiPath(id): ApiPath<String>) -> ApiResult {
    let device = id.clone();
    let stored_epoch = core.store.call(move |s| s.owner_epoch(&device)).await?;
    let conn = core
        .devices
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .cloned()
        .filter(|c| !c.is_closed());
    let (connected, epoch, snapshot) = match &conn {
        Some(c) => (true, c.epoch, c.snapshot()),
        None => (false, stored_epoch, None),
    };
    let agent_kinds: Vec<&str> = snapshot
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|d| d.agent_kind.as_str())
        .collect();
    Ok(Json(json!({
        "device_id": id,
        "connected": connected,
        "owner_epoch": epoch,
        "declaration_known": snapshot.is_some(),
        "agent_kinds": agent_kinds,
    }))
    .into_response())
}

async fn get_agent(State(core): State<Arc<Core>>, ApiPath(id): ApiPath<String>) -> ApiResult {
    let a = core.store.call(move |s| s.agent(&id)).await?;
    Ok(Json(json!({ "agent_id": a.agent_id, "definition": a.definition, "created_at_ms": a.created_at_ms })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateEnvironment {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    environment_id: Option<String>,
}

fn environment_json(e: &EnvironmentRecord) -> Value {
    json!({ "environment_id": e.environment_id, "type": e.kind.as_str(), "created_at_ms": e.created_at_ms })
}

async fn create_environment(State(core): State<Arc<Core>>, ApiBody(body): ApiBody) -> ApiResult {
    let req: CreateEnvironment = parse(&body)?;
    let kind = EnvironmentKind::parse(&req.kind).ok_or_else(|| {
        ApiError::bad(
            "invalid_environment_type",
            "type is none, openai_hosted or self_hosted",
        )
    })?;
    let id = match req.environment_id {
        Some(id) => Uuid::new(id).map_err(|e| ApiError::bad("invalid_environment_id", e))?,
        None => Uuid::random(),
    };
    let record = EnvironmentRecord {
        environment_id: id.to_string(),
        kind,
        created_at_ms: now_ms(),
    };
    let value = environment_json(&record);
    core.store
        .call(move |s| s.insert_environment(&record))
        .await?;
    created(value)
}

async fn get_environment(State(core): State<Arc<Core>>, ApiPath(id): ApiPath<String>) -> ApiResult {
    let e = core.store.call(move |s| s.environment(&id)).await?;
    Ok(Json(environment_json(&e)).into_response())
}

impl From<SuspensionError> for ApiError {
    fn from(err: SuspensionError) -> Self {
        let status = match &err {
            SuspensionError::Store(e) => return ApiError::from(e.clone()),
            SuspensionError::InvalidSuspensionId => StatusCode::BAD_REQUEST,
            SuspensionError::NoWorkspace | SuspensionError::PreparationRefused(_) => {
                StatusCode::CONFLICT
            }
            SuspensionError::NoDevice | SuspensionError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let api = Self::new(status, err.code(), err.to_string());
        match &err {
            SuspensionError::PreparationRefused(code) => {
                api.with("runtime_error_code", code.as_str())
            }
            _ => api,
        }
    }
}

fn fence_json(outcome: suspension::FenceOutcome) -> ApiResult {
    let mut value = json!({
        "suspension_id": outcome.suspension_id,
        "environment_id": outcome.result.environment_id.as_str(),
        "status": outcome.result.status,
    });
    if let Some(code) = outcome.result.error_code {
        value["error_code"] = json!(code);
    }
    Ok(Json(value).into_response())
}

async fn quiesce_environment(
    State(core): State<Arc<Core>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult {
    fence_json(suspension::fence(&core, &id, Fence::Quiesce, None).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeRequest {
    suspension_id: String,
}

async fn resume_environment(
    State(core): State<Arc<Core>>,
    ApiPath(id): ApiPath<String>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let req: ResumeRequest = parse(&body)?;
    fence_json(suspension::fence(&core, &id, Fence::Resume, Some(&req.suspension_id)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    agent_id: String,
    environment_id: String,
}

fn session_json(s: &SessionRecord) -> Value {
    json!({
        "session_id": s.session_id, "agent_id": s.agent_id, "environment_id": s.environment_id,
        "configuration": s.frozen, "native_session_id": s.native_session_id,
        "started_turns": s.started_turns, "created_at_ms": s.created_at_ms,
    })
}

async fn create_session(State(core): State<Arc<Core>>, ApiBody(body): ApiBody) -> ApiResult {
    let req: CreateSession = parse(&body)?;
    let (agent_id, env_id) = (req.agent_id.clone(), req.environment_id.clone());
    let agent = core.store.call(move |s| s.agent(&agent_id)).await?;
    let env = core.store.call(move |s| s.environment(&env_id)).await?;
    let definition: AgentDefinition = serde_json::from_value(agent.definition).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage_corrupt",
            e.to_string(),
        )
    })?;
    let frozen = FrozenSession {
        agent: definition,
        environment_type: env.kind,
    };
    let record = SessionRecord {
        session_id: Uuid::random().to_string(),
        agent_id: req.agent_id,
        environment_id: req.environment_id,
        frozen: serde_json::to_value(&frozen)
            .map_err(|e| ApiError::bad("invalid_request", e.to_string()))?,
        native_session_id: None,
        started_turns: 0,
        created_at_ms: now_ms(),
    };
    let value = session_json(&record);
    core.store.call(move |s| s.insert_session(&record)).await?;
    created(value)
}

async fn get_session(State(core): State<Arc<Core>>, ApiPath(id): ApiPath<String>) -> ApiResult {
    let s = core.store.call(move |s| s.session(&id)).await?;
    Ok(Json(session_json(&s)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputBody {
    input: BoundedVec<MessageInput, INPUT_MESSAGES_MAX>,
}

fn validate_input(input: &BoundedVec<MessageInput, INPUT_MESSAGES_MAX>) -> Result<Value, ApiError> {
    if input.is_empty() || input.iter().any(|m| m.content.is_empty()) {
        return Err(ApiError::bad(
            "invalid_input",
            "input needs at least one message, each with content",
        ));
    }
    serde_json::to_value(input).map_err(|e| ApiError::bad("invalid_input", e.to_string()))
}

fn turn_json(t: &TurnRecord) -> Value {
    json!({
        "turn_id": t.turn_id, "session_id": t.session_id, "state": t.state.as_str(),
        "run_id": t.run_id, "device_id": t.device_id, "input": t.input,
        "input_cursor": t.input_cursor, "cancel_requested": t.cancel_requested,
        "outcome": t.outcome.public(t.state),
        "created_at_ms": t.created_at_ms, "updated_at_ms": t.updated_at_ms,
    })
}

async fn create_turn(
    State(core): State<Arc<Core>>,
    ApiPath(session_id): ApiPath<String>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let req: InputBody = parse(&body)?;
    let input = validate_input(&req.input)?;
    let turn_id = Uuid::random().to_string();
    let turn = core
        .store
        .call(move |s| s.create_turn(&turn_id, &session_id, &input, now_ms()))
        .await?;
    core.wake.notify_one();
    created(turn_json(&turn))
}

async fn get_turn(State(core): State<Arc<Core>>, ApiPath(id): ApiPath<String>) -> ApiResult {
    let t = core.store.call(move |s| s.turn(&id)).await?;
    Ok(Json(turn_json(&t)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    #[serde(default)]
    after_sequence: Option<u64>,
    /// Wide enough that any integer past the bound is `invalid_limit`, not a parse error.
    #[serde(default)]
    limit: Option<u64>,
}

async fn get_events(
    State(core): State<Arc<Core>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> ApiResult {
    let limit = q.limit.unwrap_or(u64::from(EVENTS_PAGE_DEFAULT));
    if limit == 0 || limit > u64::from(EVENTS_PAGE_MAX) {
        return Err(ApiError::bad(
            "invalid_limit",
            format!("limit is 1..={EVENTS_PAGE_MAX}"),
        ));
    }
    let limit = u32::try_from(limit).unwrap_or(EVENTS_PAGE_MAX);
    let after = q.after_sequence.unwrap_or(0);
    // Budget first: a burst of readers waits here rather than each loading a page.
    let mut reservation = core
        .response_budget
        .reserve(EVENTS_PAGE_RESERVE_BYTES)
        .await;
    let (events, dropped) = core
        .store
        .call(move |s| {
            let events = s.event_page(&id, after, limit, EVENTS_PAGE_BYTES_MAX)?;
            let dropped = s.turn(&id)?.outcome.events_dropped;
            Ok::<_, crate::core_runtime::store::StoreError>((events, dropped))
        })
        .await?;
    // `{"events":[…],"next_after_sequence":N[,"events_dropped":n]}`, written from the
    // stored payload texts; the store stopped at EVENTS_PAGE_BYTES_MAX of payloads.
    let mut body = b"{\"events\":[".to_vec();
    let mut next = after;
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(event.to_json().as_bytes());
        next = event.sequence;
    }
    body.extend_from_slice(format!("],\"next_after_sequence\":{next}").as_bytes());
    // Explicit truncation: events past the Turn's bound were counted, not stored.
    if let Some(dropped) = dropped {
        body.extend_from_slice(format!(",\"events_dropped\":{dropped}").as_bytes());
    }
    body.push(b'}');
    core.response_budget
        .top_up(&mut reservation, body.len())
        .await;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        reservation.body(body),
    )
        .into_response())
}

async fn send_input(
    State(core): State<Arc<Core>>,
    ApiPath(turn_id): ApiPath<String>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let req: InputBody = parse(&body)?;
    let input = validate_input(&req.input)?;
    let input_id = format!("input-{}", Uuid::random());
    let id = turn_id.clone();
    let record = core
        .store
        .call(move |s| s.enqueue_input(&id, &input_id, &input, now_ms()))
        .await?;
    core.notify_turn(&turn_id, TurnMsg::Wake);
    accepted(
        json!({ "input_id": record.input_id, "position": record.position, "state": record.state.as_str() }),
    )
}

async fn list_inputs(
    State(core): State<Arc<Core>>,
    ApiPath(turn_id): ApiPath<String>,
) -> ApiResult {
    // One store call: the cursor and the inputs' states are read together, never with
    // an `accepted` (which moves the cursor in its transaction) landing in between.
    let (cursor, inputs) = core
        .store
        .call(move |s| {
            let cursor = s.turn(&turn_id)?.input_cursor;
            Ok::<_, crate::core_runtime::store::StoreError>((cursor, s.inputs(&turn_id)?))
        })
        .await?;
    Ok(Json(json!({ "input_cursor": cursor, "inputs": inputs })).into_response())
}

async fn cancel_turn(
    State(core): State<Arc<Core>>,
    ApiPath(turn_id): ApiPath<String>,
) -> ApiResult {
    let id = turn_id.clone();
    let turn = core
        .store
        .call(move |s| s.request_cancel(&id, now_ms()))
        .await?;
    if turn.state == TurnState::Queued {
        // Nothing was delivered: a claim can no longer happen (it requires no cancel request).
        let id = turn_id.clone();
        let outcome = turn.outcome.clone();
        core.store
            .call(move |s| s.finish_turn(&id, TurnState::Cancelled, &outcome, now_ms()))
            .await?;
    } else {
        core.notify_turn(&turn_id, TurnMsg::Wake);
    }
    let t = core.store.call(move |s| s.turn(&turn_id)).await?;
    accepted(turn_json(&t))
}

async fn list_interactions(
    State(core): State<Arc<Core>>,
    ApiPath(turn_id): ApiPath<String>,
) -> ApiResult {
    let id = turn_id.clone();
    core.store.call(move |s| s.turn(&id)).await?;
    let list = core.store.call(move |s| s.interactions(&turn_id)).await?;
    Ok(Json(json!({ "interactions": list })).into_response())
}

/// Records an answer (`pending` → `delivering`) and hands it to the Turn task.
async fn answer(
    core: &Arc<Core>,
    turn_id: String,
    interaction_id: String,
    kind: InteractionKind,
    answer: Value,
) -> ApiResult {
    let running = core
        .turns
        .lock()
        .map(|t| t.contains_key(&turn_id))
        .unwrap_or(false);
    let (t, i) = (turn_id.clone(), interaction_id.clone());
    let record = core
        .store
        .call(move |s| s.interaction(&t, &i, kind))
        .await?;
    if record.state != InteractionState::Pending {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_answered",
            format!("interaction is {}", record.state.as_str()),
        ));
    }
    if !running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "turn_not_active",
            "the Turn's Run is not active on a connection",
        ));
    }
    let delivery = format!("delivery-{}", Uuid::random());
    let (t, i, d) = (turn_id.clone(), interaction_id.clone(), delivery.clone());
    core.store
        .call(move |s| s.answer_interaction(&t, &i, kind, &answer, &d))
        .await?;
    core.notify_turn(&turn_id, TurnMsg::Wake);
    accepted(
        json!({ "interaction_id": interaction_id, "delivery_id": delivery, "state": "delivering" }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionBody {
    decision: PermissionVerdict,
}

async fn answer_permission(
    State(core): State<Arc<Core>>,
    ApiPath((turn_id, request_id)): ApiPath<(String, String)>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let req: PermissionBody = parse(&body)?;
    answer(
        &core,
        turn_id,
        request_id,
        InteractionKind::Permission,
        json!({ "decision": req.decision }),
    )
    .await
}

async fn answer_user_choice(
    State(core): State<Arc<Core>>,
    ApiPath((turn_id, ask_id)): ApiPath<(String, String)>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let mut value: Value = parse(&body)?;
    // Shared validation before anything is stored: the decision shape and the asked IDs.
    let (t, i) = (turn_id.clone(), ask_id.clone());
    let record = core
        .store
        .call(move |s| s.interaction(&t, &i, InteractionKind::UserChoice))
        .await?;
    let asked: Vec<crate::core_runtime::wire::Question> =
        serde_json::from_value(record.request["questions"].clone()).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("delivery_id".into(), Value::String("validation".into()));
    }
    let decision: PromptForUserChoiceDecision =
        crate::wire::strict::from_value_strict(value.clone())
            .map_err(|e| ApiError::bad("invalid_decision", e.to_string()))?;
    validate_question_answers(&asked, &decision)
        .map_err(|e| ApiError::bad("invalid_decision", e.to_string()))?;
    if let Some(obj) = value.as_object_mut() {
        obj.remove("delivery_id");
    }
    answer(&core, turn_id, ask_id, InteractionKind::UserChoice, value).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionBody {
    output: BoundedString<{ crate::core_runtime::wire::limits::TEXT_MAX_BYTES }>,
    #[serde(default)]
    is_error: bool,
}

async fn answer_function(
    State(core): State<Arc<Core>>,
    ApiPath((turn_id, call_id)): ApiPath<(String, String)>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let req: FunctionBody = parse(&body)?;
    answer(
        &core,
        turn_id,
        call_id,
        InteractionKind::Function,
        json!({ "output": req.output.as_str(), "is_error": req.is_error }),
    )
    .await
}

impl From<FilesError> for ApiError {
    fn from(err: FilesError) -> Self {
        let status = match &err {
            FilesError::Store(e) => return ApiError::from(e.clone()),
            FilesError::InvalidPath(_) => StatusCode::BAD_REQUEST,
            FilesError::NotFound => StatusCode::NOT_FOUND,
            FilesError::NoWorkspace
            | FilesError::SessionBusy
            | FilesError::Unsupported(_)
            | FilesError::Refused(_)
            | FilesError::PreparationRefused(_) => StatusCode::CONFLICT,
            FilesError::NoDevice | FilesError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let api = Self::new(status, err.code(), err.to_string());
        match &err {
            FilesError::PreparationRefused(code) => api.with("runtime_error_code", code.as_str()),
            _ => api,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
}

async fn list_files(
    State(core): State<Arc<Core>>,
    ApiPath(session_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FilesQuery>,
) -> ApiResult {
    let path = q.path.unwrap_or_default();
    let r = files::read(&core, &session_id, ReadOperation::Directory, &path).await?;
    Ok(Json(json!({
        "path": path,
        "entries": r.entries.map(|e| e.into_inner()).unwrap_or_default(),
        "truncated": r.truncated.unwrap_or(false),
    }))
    .into_response())
}

async fn read_file(
    State(core): State<Arc<Core>>,
    ApiPath(session_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FilesQuery>,
) -> ApiResult {
    let path = q
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad("invalid_path", "path is required"))?;
    let r = files::read(&core, &session_id, ReadOperation::Bytes, &path).await?;
    Ok(Json(json!({
        "path": path,
        "data": r.data,
        "truncated": r.truncated.unwrap_or(false),
    }))
    .into_response())
}

impl From<ExportError> for ApiError {
    fn from(err: ExportError) -> Self {
        match err {
            ExportError::Files(e) => e.into(),
            ExportError::TooLarge => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, err.code(), err.to_string())
            }
        }
    }
}

async fn export_files(
    State(core): State<Arc<Core>>,
    ApiPath(session_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FilesQuery>,
) -> ApiResult {
    let path = q
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad("invalid_path", "path is required"))?;
    let export = files_export::idle_export(&core, &session_id, &path).await?;
    Ok(Json(json!({
        "path": path,
        "archive_base64": base64::engine::general_purpose::STANDARD.encode(&export.archive),
        "sha256": export.sha256,
    }))
    .into_response())
}

impl From<WriteError> for ApiError {
    fn from(err: WriteError) -> Self {
        let status = match &err {
            WriteError::Files(e) => return ApiError::from(e.clone()),
            WriteError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            WriteError::InvalidDigest | WriteError::DigestMismatch => StatusCode::BAD_REQUEST,
            WriteError::Rejected { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            WriteError::Unknown { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut api = Self::new(status, err.code(), err.to_string());
        if let Some(id) = err.write_id() {
            api = api.with("write_id", id);
        }
        if let WriteError::Rejected { code, .. } = &err {
            api = api.with("runtime_error_code", code.as_str());
        }
        api
    }
}

/// Body of `PUT /v1/sessions/{id}/files/content`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteBody {
    /// The complete file, standard base64 with padding.
    content_base64: String,
    /// Optional SHA-256 of the decoded content (lower-case hex), checked by Core.
    #[serde(default)]
    sha256: Option<String>,
}

async fn write_file(
    State(core): State<Arc<Core>>,
    ApiPath(session_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FilesQuery>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let path = q
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad("invalid_path", "path is required"))?;
    let req: WriteBody = crate::wire::decode_strict(&body)
        .map_err(|e| ApiError::bad("invalid_request", format!("{e} ({})", e.code())))?;
    let content = base64::engine::general_purpose::STANDARD
        .decode(req.content_base64.as_bytes())
        .map_err(|e| ApiError::bad("invalid_request", format!("content_base64: {e}")))?;
    // The write runs on its own task: a client that goes away (observer cancellation)
    // does not cut the transfer short; the reservation settles as it would have.
    let task = tokio::spawn(async move {
        files_write::write(&core, &session_id, &path, content, req.sha256.as_deref()).await
    });
    let committed = task.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("the write task failed: {e}"),
        )
    })??;
    Ok(Json(json!({
        "write_id": committed.write_id, "path": committed.path, "size": committed.size,
        "sha256": committed.sha256, "state": "committed",
    }))
    .into_response())
}

async fn get_write(
    State(core): State<Arc<Core>>,
    ApiPath((session_id, write_id)): ApiPath<(String, String)>,
) -> ApiResult {
    let w = core
        .store
        .call(move |s| s.write_reservation(&session_id, &write_id))
        .await?;
    Ok(Json(json!({
        "write_id": w.reservation_id, "session_id": w.session_id, "path": w.path,
        "size": w.size, "sha256": w.sha256, "state": files_write::public_state(&core, &w),
        "created_at_ms": w.created_at_ms,
    }))
    .into_response())
}

impl From<TransferError> for ApiError {
    fn from(err: TransferError) -> Self {
        let status = match &err {
            TransferError::Store(e) => return ApiError::from(e.clone()),
            TransferError::InvalidPath(_) => StatusCode::BAD_REQUEST,
            TransferError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            TransferError::NoWorkspace | TransferError::Busy => StatusCode::CONFLICT,
            TransferError::Failed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            TransferError::NoDevice | TransferError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let mut api = Self::new(status, err.code(), err.to_string());
        if let TransferError::Failed(code) = &err {
            api = api.with("runtime_error_code", code.as_str());
        }
        api
    }
}

/// Body of `POST /v1/environments/{id}/files`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InstallBody {
    path: String,
    kind: crate::core_runtime::wire::TransferKind,
    /// The complete body, standard base64 with padding.
    content_base64: String,
}

async fn install_environment_file(
    State(core): State<Arc<Core>>,
    ApiPath(environment_id): ApiPath<String>,
    ApiBody(body): ApiBody,
) -> ApiResult {
    let req: InstallBody = crate::wire::decode_strict(&body)
        .map_err(|e| ApiError::bad("invalid_request", format!("{e} ({})", e.code())))?;
    let content = base64::engine::general_purpose::STANDARD
        .decode(req.content_base64.as_bytes())
        .map_err(|e| ApiError::bad("invalid_request", format!("content_base64: {e}")))?;
    // Own task: a client that goes away does not cut the transfer short.
    let task = tokio::spawn(async move {
        env_files::install(&core, &environment_id, &req.path, req.kind, content).await
    });
    let installed = task.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("the installation task failed: {e}"),
        )
    })??;
    Ok(Json(json!({
        "path": installed.path, "size": installed.size, "sha256": installed.sha256,
    }))
    .into_response())
}
