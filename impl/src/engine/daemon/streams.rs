//! The server streams ("Operations", "Bounds and backpressure"):
//!
//! * `StreamEvents(after_sequence)`: one atomic capture ([`super::log::EventLog::capture`]), the
//!   page's events, one control, and — when the cursor asks to tail and the page reached
//!   the head — the live tail until the run's terminal event. "For current controls,
//!   has_more is exactly equivalent to page_last_sequence < latest_sequence." Without a
//!   cursor the stream is "the provisional non-paging, non-tailing compatibility shape":
//!   one bounded page and a control without `page_last_sequence`.
//! * `StreamInteractions`: "a complete atomic snapshot of every pending prompt as its
//!   first frame", then "revision-contiguous opened/closed deltas and a final control".
//!
//! A reader that falls a full queue behind is cut off with `RESOURCE_EXHAUSTED`
//! (`slow_reader: …`) naming the last sequence (or revision) it was given, also in the
//! trailer `engine-last-delivered-sequence`; the run never waits for it.
//!
//! This module owns stream shapes; it never changes a run.

use std::sync::Arc;

use tokio_stream::Stream;
use tonic::Status;

use super::limits;
use super::log::CaptureError;
use super::runs::InteractionFrame;
use super::state::Daemon;
use crate::engine::proto::engine::v1 as pb;
use pb::stream_events_response::Frame as EventFrame;
use pb::stream_interactions_response::Frame as IFrame;

/// The call's deadline from its `grpc-timeout` header ("Every unary/stream request has
/// [...] deadline limits"): `None` without one. A deadline longer than
/// [`limits::MAX_DEADLINE_MS`] never gets here ([`limits::check_deadline`] refused it).
///
/// # Errors
/// `invalid_deadline` (`INVALID_ARGUMENT`) for a header that is not `<1-8 digits><H|M|S|m|u|n>`.
pub fn deadline(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Option<tokio::time::Instant>, Status> {
    Ok(limits::requested_timeout(metadata)?.map(|duration| tokio::time::Instant::now() + duration))
}

fn deadline_passed(what: &str, last: u64) -> Status {
    Status::deadline_exceeded(format!(
        "deadline_exceeded: the call's deadline passed; last delivered {what} {last}"
    ))
}

/// What a stream waiting for its next frame got.
enum Wait<T> {
    /// The frame.
    Next(T),
    /// The call's deadline passed.
    Deadline,
    /// The daemon is stopping.
    Stopping,
}

/// Waits for `next` until `deadline` (forever without one) or the daemon stops.
async fn until<T>(
    deadline: Option<tokio::time::Instant>,
    stopping: &mut tokio::sync::watch::Receiver<bool>,
    next: impl std::future::Future<Output = T>,
) -> Wait<T> {
    let deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        v = next => Wait::Next(v),
        () = deadline => Wait::Deadline,
        _ = stopping.wait_for(|s| *s) => Wait::Stopping,
    }
}

fn stopping_status(what: &str, last: u64) -> Status {
    let mut status = Status::unavailable(format!(
        "daemon_stopping: the daemon is shutting down; last delivered {what} {last}"
    ));
    if what == "sequence"
        && let Ok(v) = last.to_string().parse()
    {
        status.metadata_mut().insert(LAST_DELIVERED_TRAILER, v);
    }
    status
}

/// The trailer of a `cursor_gap` refusal naming the oldest retained sequence, so a client
/// can resume from just before it.
pub const OLDEST_RETAINED_TRAILER: &str = "engine-oldest-retained-sequence";

/// The trailer naming a cut-off reader's last delivered sequence.
pub const LAST_DELIVERED_TRAILER: &str = "engine-last-delivered-sequence";

fn slow_reader(what: &str, last: u64) -> Status {
    let mut status = Status::resource_exhausted(format!(
        "slow_reader: the reader fell {} frames behind; last delivered {what} {last}",
        super::log::TAIL_QUEUE_MAX
    ));
    if let Ok(v) = last.to_string().parse() {
        status.metadata_mut().insert(LAST_DELIVERED_TRAILER, v);
    }
    status
}

/// `StreamEvents`.
///
/// # Errors
/// `unknown_run` (`NOT_FOUND`), `invalid_cursor` (`INVALID_ARGUMENT`), `cursor_gap` /
/// `cursor_ahead` (`OUT_OF_RANGE`).
pub async fn stream_events(
    daemon: &Arc<Daemon>,
    request: pb::StreamEventsRequest,
    deadline: Option<tokio::time::Instant>,
) -> Result<impl Stream<Item = Result<pb::StreamEventsResponse, Status>> + Send + use<>, Status> {
    let run = daemon.run(&request.run_id)?;
    let (max_events, tail, current) = match request.cursor {
        Some(c) if c.max_events > limits::MAX_PAGE_EVENTS => {
            return Err(Status::invalid_argument(format!(
                "invalid_cursor: max_events {} is over the page limit {}",
                c.max_events,
                limits::MAX_PAGE_EVENTS
            )));
        }
        // "0: the limit" (engine.proto, `PageCursor.max_events`).
        Some(c) if c.max_events == 0 => (limits::MAX_PAGE_EVENTS, c.tail, true),
        Some(c) => (c.max_events, c.tail, true),
        None => (limits::MAX_PAGE_EVENTS, false, false),
    };
    let log = daemon.log.clone();
    let after = request.after_sequence;
    let run_log = run.log.clone();
    let page_bytes = daemon.page_bytes;
    let page = tokio::task::spawn_blocking(move || {
        log.capture(&run_log, after, max_events, page_bytes, tail)
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
    .map_err(|e| match e {
        CaptureError::Store(_) => Status::unavailable(e.to_string()),
        CaptureError::Gap { oldest, .. } => {
            let mut status = Status::out_of_range(e.to_string());
            if let Ok(v) = oldest.to_string().parse() {
                status.metadata_mut().insert(OLDEST_RETAINED_TRAILER, v);
            }
            status
        }
        CaptureError::Ahead { .. } => Status::out_of_range(e.to_string()),
    })?;
    let last = page.events.last().map_or(page.after, |e| e.sequence);
    let control = pb::StreamControl {
        page_last_sequence: current.then_some(last),
        has_more: last < page.latest,
        tailing: page.tail.is_some(),
        latest_sequence: page.latest,
        oldest_retained_sequence: page.oldest,
    };
    let stopping = daemon.stopping.subscribe();
    Ok(async_stream(
        page.events,
        control,
        page.tail,
        last,
        deadline,
        stopping,
    ))
}

fn async_stream(
    events: Vec<pb::RunEvent>,
    control: pb::StreamControl,
    tail: Option<super::log::Tail>,
    last: u64,
    deadline: Option<tokio::time::Instant>,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> impl Stream<Item = Result<pb::StreamEventsResponse, Status>> + Send {
    let frame = |f| Ok(pb::StreamEventsResponse { frame: Some(f) });
    let head = tokio_stream::iter(
        events
            .into_iter()
            .map(move |e| frame(EventFrame::Event(e)))
            .chain(std::iter::once(frame(EventFrame::Control(control)))),
    );
    let tail =
        futures_util::stream::unfold(tail.map(|t| (t, last, stopping)), move |state| async move {
            let (mut tail, last, mut stopping) = state?;
            if tail.lagged() {
                return Some((Err(slow_reader("sequence", last)), None));
            }
            let next = match until(deadline, &mut stopping, tail.rx.recv()).await {
                Wait::Next(next) => next,
                Wait::Deadline => return Some((Err(deadline_passed("sequence", last)), None)),
                Wait::Stopping => return Some((Err(stopping_status("sequence", last)), None)),
            };
            match next {
                Some(event) if !tail.lagged() => {
                    let last = event.sequence;
                    Some((
                        frame(EventFrame::Event((*event).clone())),
                        Some((tail, last, stopping)),
                    ))
                }
                Some(_) => Some((Err(slow_reader("sequence", last)), None)),
                None if tail.lagged() => Some((Err(slow_reader("sequence", last)), None)),
                None => None,
            }
        });
    tokio_stream::StreamExt::chain(head, tail)
}

/// `StreamInteractions`.
///
/// # Errors
/// `unknown_run` (`NOT_FOUND`).
pub async fn stream_interactions(
    daemon: &Arc<Daemon>,
    request: pb::StreamInteractionsRequest,
    deadline: Option<tokio::time::Instant>,
) -> Result<impl Stream<Item = Result<pb::StreamInteractionsResponse, Status>> + Send + use<>, Status>
{
    let run = daemon.run(&request.run_id)?;
    let (snapshot, subscription) = run.interactions().subscribe();
    let frame = |f| Ok(pb::StreamInteractionsResponse { frame: Some(f) });
    let revision = snapshot.revision;
    let first = match &subscription {
        None => vec![
            frame(IFrame::Snapshot(snapshot)),
            frame(IFrame::Control(pb::InteractionControl {
                revision,
                run_terminal: true,
            })),
        ],
        Some(_) => vec![frame(IFrame::Snapshot(snapshot))],
    };
    let stopping = daemon.stopping.subscribe();
    let rest = futures_util::stream::unfold(
        subscription.map(|s| (s, revision, stopping)),
        move |state| async move {
            let ((mut rx, lagged), mut revision, mut stopping) = state?;
            let slow = || {
                let mut s = slow_reader("revision", revision);
                s.metadata_mut().remove(LAST_DELIVERED_TRAILER);
                s
            };
            if lagged.load(std::sync::atomic::Ordering::Acquire) {
                return Some((Err(slow()), None));
            }
            let next = match until(deadline, &mut stopping, rx.recv()).await {
                Wait::Next(next) => next,
                Wait::Deadline => return Some((Err(deadline_passed("revision", revision)), None)),
                Wait::Stopping => return Some((Err(stopping_status("revision", revision)), None)),
            };
            match next {
                Some(InteractionFrame::Delta(d)) => {
                    revision = d.revision;
                    Some((
                        frame(IFrame::Delta(d)),
                        Some(((rx, lagged), revision, stopping)),
                    ))
                }
                Some(InteractionFrame::Control(c)) => Some((frame(IFrame::Control(c)), None)),
                None if lagged.load(std::sync::atomic::Ordering::Acquire) => {
                    Some((Err(slow()), None))
                }
                None => None,
            }
        },
    );
    Ok(tokio_stream::StreamExt::chain(
        tokio_stream::iter(first),
        rest,
    ))
}
