//! The client's side of the run operations (engine-protocol.md, "Operations", "Failure
//! semantics"): a [`Session`] is an initialized client (its stable ID and epoch) that
//! starts, follows and steers runs.
//!
//! * Every mutation carries a client operation ID. "Transport failure never implies a
//!   mutating request failed before commit": a call that fails in transport (the
//!   connection dropped or reset before a status, whatever code tonic gives that) or
//!   with `UNAVAILABLE` is sent again with the same operation ID, up to [`RETRIES`]
//!   times, on a new connection when the daemon dropped the old one (the channel
//!   reconnects on its own); the daemon's ledger answers the committed outcome if there
//!   was one.
//! * "A minor-1 client must require snapshot-authority-v1 before relying on export or
//!   import": [`Session::export`] and [`Session::import`] refuse, before any call, a
//!   session that did not negotiate it ([`SessionError::CapabilityNotNegotiated`]).
//! * [`Session::follow`] reads a run's events from any sequence through pages and the
//!   live tail, and after a cut-off or a broken stream resumes from the last delivered
//!   sequence, so the caller sees every event once, in order, without a gap.
//!
//! This module never prints; the command line formats what it returns.

use std::time::Duration;

use tonic::{Code, Status};

use super::client::{self, Client, ClientError, Ownership};
use super::compat::{CAP_SNAPSHOT_AUTHORITY_V1, MINOR_MAX};
use super::proto::engine::v1 as pb;
use pb::initialize_response::Result as InitResult;

/// Times a mutation is sent again after a transport failure.
pub const RETRIES: u32 = 4;

/// The first pause before a retry (doubled each time).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// Times [`Session::follow`] reopens a stream that broke without a status.
pub const FOLLOW_REOPENS: u32 = 64;

/// A fresh client operation ID.
pub fn operation_id() -> String {
    format!("op-{}", uuid::Uuid::new_v4().simple())
}

/// An initialized client.
#[derive(Debug, Clone)]
pub struct Session {
    /// The channel.
    pub client: Client,
    /// Who it is.
    pub session: pb::ClientSession,
    /// What `Initialize` returned.
    pub initialized: pb::Initialized,
}

/// Why a session could not be opened or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Connecting or a call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `Initialize` refused (a typed result).
    #[error("initialize refused: {0:?}")]
    Refused(Box<InitResult>),
    /// Refused by the client before any call: the session did not negotiate the
    /// capability the operation relies on.
    #[error("the session did not negotiate `{capability}`; refused before any call")]
    CapabilityNotNegotiated {
        /// The capability missing from the negotiated ones.
        capability: &'static str,
    },
}

impl SessionError {
    /// The stable code (`capability_not_negotiated`, `initialize_refused`, or the
    /// [`ClientError::code`]).
    pub fn code(&self) -> &'static str {
        match self {
            SessionError::Client(c) => c.code(),
            SessionError::Refused(_) => "initialize_refused",
            SessionError::CapabilityNotNegotiated { .. } => "capability_not_negotiated",
        }
    }

    /// The daemon's status, when a call ended with one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            SessionError::Client(ClientError::Status(s)) => Some(s),
            _ => None,
        }
    }
}

impl From<Status> for SessionError {
    fn from(s: Status) -> Self {
        SessionError::Client(ClientError::Status(s))
    }
}

/// Whether a call that ended with `status` is sent again: a status the daemon did not
/// send (the call failed in transport), or `UNAVAILABLE`, `UNKNOWN`, `CANCELLED` that is
/// not a fence.
/// How long a unary call, or the opening of a stream, waits for the daemon's answer;
/// then it ends `DEADLINE_EXCEEDED` ("Every unary/stream request has … deadline
/// limits"). A mutation's outcome is then unknown, so it is sent again with its
/// operation ID. A tail that is open may stay quiet longer: the channel's HTTP/2
/// keepalive notices a daemon that stopped answering.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// `call`, or `DEADLINE_EXCEEDED` when it has no answer within [`CALL_TIMEOUT`].
///
/// # Errors
/// The call's status, or the deadline.
pub async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    bounded_by(CALL_TIMEOUT, call).await
}

/// `call`, or `DEADLINE_EXCEEDED` when it has no answer within `bound`.
///
/// # Errors
/// The call's status, or the deadline.
pub async fn bounded_by<T>(
    bound: Duration,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
        Err(Status::deadline_exceeded(format!(
            "no answer from the daemon within {} s",
            bound.as_secs()
        )))
    })
}

/// How long `SuspendRun` may wait: it answers only at the run's next completed-turn
/// boundary, which a long turn reaches late; the daemon's own longest deadline.
pub const SUSPEND_TIMEOUT: Duration = Duration::from_millis(super::daemon::limits::MAX_DEADLINE_MS);

fn retryable(status: &Status) -> bool {
    in_transport(status)
        || (matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
        ) && !status.message().starts_with("fenced"))
}

/// Whether `status` was made by the client's transport rather than received from the
/// daemon: tonic attaches the transport error (hyper's, an I/O error, a connect error) as
/// the source of such a status, whatever code it chose (`UNKNOWN` for a reset
/// connection, `UNAVAILABLE` for a refused one, `INTERNAL` for a `GOAWAY`); a status
/// received in trailers has no source.
fn in_transport(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<hyper::Error>() || e.is::<std::io::Error>() || e.is::<tonic::transport::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The oldest retained sequence a `cursor_gap` status names, when it lies past the
/// reader's next sequence after `last` (events it had not read were pruned).
fn oldest_retained(status: &Status, last: u64) -> Option<u64> {
    status
        .metadata()
        .get(super::daemon::streams::OLDEST_RETAINED_TRAILER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|o| last.checked_add(1).is_some_and(|next| *o > next))
}

/// How following a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Followed {
    /// The last sequence delivered to the caller.
    pub last_sequence: u64,
    /// The terminal event's outcome, when the run ended.
    pub terminal: Option<pb::RunTerminal>,
    /// Streams reopened after a cut-off or a break.
    pub reopened: u32,
}

impl Session {
    /// Connects and initializes as `ownership`, requiring `required`.
    ///
    /// # Errors
    /// [`SessionError`].
    pub async fn open(
        socket: &std::path::Path,
        token_file: &std::path::Path,
        ownership: &Ownership,
        required: &[String],
    ) -> Result<Self, SessionError> {
        let c = client::connect(socket, token_file).await?;
        Self::initialize(c, ownership, required, MINOR_MAX).await
    }

    /// Initializes on the connected `client` as `ownership`, presenting protocol
    /// `1.minor`, requiring `required`.
    ///
    /// # Errors
    /// [`SessionError::Refused`] with the daemon's typed result, or the call's failure.
    pub async fn initialize(
        mut c: Client,
        ownership: &Ownership,
        required: &[String],
        minor: u32,
    ) -> Result<Self, SessionError> {
        match client::initialize(&mut c, ownership, required, minor).await? {
            InitResult::Initialized(i) => Ok(Self {
                client: c,
                session: pb::ClientSession {
                    client_id: i.client_id.clone(),
                    epoch: i.epoch,
                },
                initialized: i,
            }),
            other => Err(SessionError::Refused(Box::new(other))),
        }
    }

    fn session(&self) -> Option<pb::ClientSession> {
        Some(self.session.clone())
    }

    /// Refuses, before any call, a session that did not negotiate `capability`.
    fn negotiated(&self, capability: &'static str) -> Result<(), SessionError> {
        if self
            .initialized
            .capabilities
            .iter()
            .any(|c| c == capability)
        {
            Ok(())
        } else {
            Err(SessionError::CapabilityNotNegotiated { capability })
        }
    }

    async fn retry<T, F, Fut>(&mut self, call: F) -> Result<T, Status>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.retry_within(CALL_TIMEOUT, call).await
    }

    /// [`Session::retry`] with each attempt bounded by `bound`.
    async fn retry_within<T, F, Fut>(&mut self, bound: Duration, mut call: F) -> Result<T, Status>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut pause = RETRY_BACKOFF;
        let mut attempt = 0;
        loop {
            match bounded_by(bound, call(self.client.clone())).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if retryable(&s) && attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(s) => return Err(s),
            }
        }
    }

    /// `StartRun` of `definition` with `message`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn start_run(
        &mut self,
        definition: pb::DefinitionRef,
        message: &str,
        op: &str,
    ) -> Result<pb::StartRunResponse, Status> {
        let request = pb::StartRunRequest {
            client_operation_id: op.into(),
            definition: Some(definition),
            initial_message: message.into(),
            session: self.session(),
        };
        self.retry(|mut c| {
            let r = request.clone();
            async move { c.start_run(r).await }
        })
        .await
    }

    /// `CancelRun`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn cancel(
        &mut self,
        run_id: &str,
        op: &str,
    ) -> Result<pb::CancelRunResponse, Status> {
        let request = pb::CancelRunRequest {
            run_id: run_id.into(),
            client_operation_id: op.into(),
            session: self.session(),
        };
        self.retry(|mut c| {
            let r = request.clone();
            async move { c.cancel_run(r).await }
        })
        .await
    }

    /// `RespondInteraction` with `response_json`.
    ///
    /// # Errors
    /// The daemon's status (`stale_interaction` for a prompt no longer pending).
    pub async fn respond(
        &mut self,
        run_id: &str,
        interaction_id: &str,
        response_json: &str,
        op: &str,
    ) -> Result<pb::RespondInteractionResponse, Status> {
        let request = pb::RespondInteractionRequest {
            client_operation_id: op.into(),
            run_id: run_id.into(),
            interaction_id: interaction_id.into(),
            response_json: response_json.into(),
            session: self.session(),
        };
        self.retry(|mut c| {
            let r = request.clone();
            async move { c.respond_interaction(r).await }
        })
        .await
    }

    /// `SuspendRun`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn suspend(
        &mut self,
        run_id: &str,
        op: &str,
    ) -> Result<pb::SuspendRunResponse, Status> {
        let request = pb::SuspendRunRequest {
            client_operation_id: op.into(),
            run_id: run_id.into(),
            session: self.session(),
        };
        // A suspension waits for the turn boundary: not the unary deadline.
        self.retry_within(SUSPEND_TIMEOUT, |mut c| {
            let r = request.clone();
            async move { c.suspend_run(r).await }
        })
        .await
    }

    /// `ResumeRun`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn resume(
        &mut self,
        run_id: &str,
        op: &str,
    ) -> Result<pb::ResumeRunResponse, Status> {
        let request = pb::ResumeRunRequest {
            client_operation_id: op.into(),
            run_id: run_id.into(),
            session: self.session(),
        };
        self.retry(|mut c| {
            let r = request.clone();
            async move { c.resume_run(r).await }
        })
        .await
    }

    /// `ExportSnapshot`, when the session negotiated `snapshot-authority-v1`.
    ///
    /// # Errors
    /// [`SessionError::CapabilityNotNegotiated`] (no call made), or the daemon's status.
    pub async fn export(&mut self, run_id: &str) -> Result<pb::Snapshot, SessionError> {
        self.negotiated(CAP_SNAPSHOT_AUTHORITY_V1)?;
        let request = pb::ExportSnapshotRequest {
            run_id: run_id.into(),
            session: self.session(),
        };
        let r = self
            .retry(|mut c| {
                let r = request.clone();
                async move { c.export_snapshot(r).await }
            })
            .await?;
        r.snapshot
            .ok_or_else(|| Status::internal("ExportSnapshot answered no snapshot").into())
    }

    /// `ImportSnapshot`, when the session negotiated `snapshot-authority-v1`.
    ///
    /// # Errors
    /// [`SessionError::CapabilityNotNegotiated`] (no call made), or the daemon's status.
    pub async fn import(
        &mut self,
        snapshot: pb::Snapshot,
        op: &str,
    ) -> Result<pb::ImportSnapshotResponse, SessionError> {
        self.negotiated(CAP_SNAPSHOT_AUTHORITY_V1)?;
        let request = pb::ImportSnapshotRequest {
            client_operation_id: op.into(),
            snapshot: Some(snapshot),
            session: self.session(),
        };
        self.retry(|mut c| {
            let r = request.clone();
            async move { c.import_snapshot(r).await }
        })
        .await
        .map_err(SessionError::from)
    }

    /// The pending interactions of `run_id` (the stream's first frame).
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn interactions(&mut self, run_id: &str) -> Result<pb::InteractionSnapshot, Status> {
        let mut stream = bounded(
            self.client
                .stream_interactions(pb::StreamInteractionsRequest {
                    run_id: run_id.into(),
                }),
        )
        .await?
        .into_inner();
        match bounded(stream.message()).await? {
            Some(pb::StreamInteractionsResponse {
                frame: Some(pb::stream_interactions_response::Frame::Snapshot(s)),
            }) => Ok(s),
            _ => Err(Status::internal(
                "StreamInteractions did not start with a snapshot",
            )),
        }
    }

    /// Follows `run_id` from after `after`: pages of `page` events, then the live tail,
    /// until the terminal event (or, when `tail` is false, the head at the time).
    /// `on_event` sees every event once, in order.
    ///
    /// # Errors
    /// The daemon's status; `cursor_gap` when events the reader had not read were pruned
    /// ([`Session::follow_across_gaps`] goes on instead); a sequence gap inside a stream
    /// (`DATA_LOSS`), which would be a daemon bug.
    pub async fn follow(
        &mut self,
        run_id: &str,
        after: u64,
        page: u32,
        tail: bool,
        on_event: impl FnMut(&pb::RunEvent),
    ) -> Result<Followed, Status> {
        self.follow_inner(run_id, after, page, tail, on_event, None)
            .await
    }

    /// As [`Session::follow`], but when events the reader had not read yet were pruned
    /// (retention) it calls `on_gap(first_missed, last_missed)` and goes on from the
    /// oldest retained event: a person following a fast run sees what was lost, and the
    /// rest.
    ///
    /// # Errors
    /// As [`Session::follow`], except `cursor_gap` when the daemon names its oldest
    /// retained sequence.
    pub async fn follow_across_gaps(
        &mut self,
        run_id: &str,
        after: u64,
        page: u32,
        tail: bool,
        on_event: impl FnMut(&pb::RunEvent),
        mut on_gap: impl FnMut(u64, u64) + Send,
    ) -> Result<Followed, Status> {
        self.follow_inner(run_id, after, page, tail, on_event, Some(&mut on_gap))
            .await
    }

    async fn follow_inner(
        &mut self,
        run_id: &str,
        after: u64,
        page: u32,
        tail: bool,
        mut on_event: impl FnMut(&pb::RunEvent),
        mut on_gap: Option<&mut (dyn FnMut(u64, u64) + Send)>,
    ) -> Result<Followed, Status> {
        use pb::stream_events_response::Frame;
        let mut last = after;
        let mut reopened = 0;
        'streams: loop {
            let request = pb::StreamEventsRequest {
                run_id: run_id.into(),
                after_sequence: last,
                cursor: Some(pb::PageCursor {
                    max_events: page,
                    tail,
                }),
            };
            let mut stream = match bounded(self.client.stream_events(request)).await {
                Ok(s) => s.into_inner(),
                Err(s) if retryable(&s) && reopened < FOLLOW_REOPENS => {
                    reopened += 1;
                    tokio::time::sleep(RETRY_BACKOFF).await;
                    continue;
                }
                Err(s) if s.code() == Code::OutOfRange && on_gap.is_some() => {
                    let (Some(oldest), Some(report)) = (oldest_retained(&s, last), on_gap.as_mut())
                    else {
                        return Err(s);
                    };
                    report(last + 1, oldest - 1);
                    last = oldest - 1;
                    continue;
                }
                Err(s) => return Err(s),
            };
            let mut next_page = false;
            loop {
                match stream.message().await {
                    Ok(Some(pb::StreamEventsResponse {
                        frame: Some(Frame::Event(e)),
                    })) => {
                        // After 0 ("from the first retained one") the first event has
                        // whatever sequence the run starts at (or retention left): the
                        // spec fixes no origin. Every later one is the next.
                        let next = last.checked_add(1);
                        if last != 0 && next != Some(e.sequence) {
                            return Err(Status::data_loss(format!(
                                "sequence gap: expected the one after {last}, got {}",
                                e.sequence
                            )));
                        }
                        last = e.sequence;
                        on_event(&e);
                        if let Some(pb::run_event::Kind::Terminal(t)) = e.kind {
                            return Ok(Followed {
                                last_sequence: last,
                                terminal: Some(t),
                                reopened,
                            });
                        }
                    }
                    Ok(Some(pb::StreamEventsResponse {
                        frame: Some(Frame::Control(c)),
                    })) => {
                        if c.has_more {
                            next_page = true;
                        } else if !c.tailing {
                            return Ok(Followed {
                                last_sequence: last,
                                terminal: None,
                                reopened,
                            });
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(s)
                        if (s.code() == Code::ResourceExhausted || retryable(&s))
                            && reopened < FOLLOW_REOPENS =>
                    {
                        // Cut off as slow, or the stream broke: resume from `last`.
                        reopened += 1;
                        break;
                    }
                    // A gap reported after the response headers rather than instead of
                    // them: the same as at the call.
                    Err(s) if s.code() == Code::OutOfRange && on_gap.is_some() => {
                        let (Some(oldest), Some(report)) =
                            (oldest_retained(&s, last), on_gap.as_mut())
                        else {
                            return Err(s);
                        };
                        report(last + 1, oldest - 1);
                        last = oldest - 1;
                        continue 'streams;
                    }
                    Err(s) => return Err(s),
                }
            }
            if !next_page && !tail {
                return Ok(Followed {
                    last_sequence: last,
                    terminal: None,
                    reopened,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_daemon_that_never_answers_ends_the_call_at_its_deadline() {
        tokio::time::pause();
        let silent = std::future::pending::<Result<(), Status>>();
        let e = bounded(silent).await.unwrap_err();
        assert_eq!(e.code(), Code::DeadlineExceeded);
        // Its outcome is unknown: a mutation is sent again with its operation ID.
        assert!(retryable(&e));
        assert!(bounded(async { Ok::<_, Status>(7) }).await.unwrap() == 7);
    }
}
