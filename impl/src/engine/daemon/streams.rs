//! The server streams ("Operations", "Bounds and backpressure"):
//!
//! * `StreamEvents(after_sequence)`: one atomic capture ([`EventLog::capture`]), the
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
        Some(c) if c.max_events == 0 => {
            return Err(Status::invalid_argument(format!(
                "invalid_cursor: max_events must be 1..={}",
                limits::MAX_PAGE_EVENTS
            )));
        }
        Some(c) => (c.max_events, c.tail, true),
        None => (limits::MAX_PAGE_EVENTS, false, false),
    };
    let log = daemon.log.clone();
    let after = request.after_sequence;
    let run_log = run.log.clone();
    let page = tokio::task::spawn_blocking(move || {
        log.capture(&run_log, after, max_events, limits::MAX_PAGE_BYTES, tail)
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
    .map_err(|e| match e {
        CaptureError::Store(_) => Status::unavailable(e.to_string()),
        _ => Status::out_of_range(e.to_string()),
    })?;
    let last = page.events.last().map_or(after, |e| e.sequence);
    let control = pb::StreamControl {
        page_last_sequence: current.then_some(last),
        has_more: last < page.latest,
        tailing: page.tail.is_some(),
        latest_sequence: page.latest,
        oldest_retained_sequence: page.oldest,
    };
    Ok(async_stream(page.events, control, page.tail, last))
}

fn async_stream(
    events: Vec<pb::RunEvent>,
    control: pb::StreamControl,
    tail: Option<super::log::Tail>,
    last: u64,
) -> impl Stream<Item = Result<pb::StreamEventsResponse, Status>> + Send {
    let frame = |f| Ok(pb::StreamEventsResponse { frame: Some(f) });
    let head = tokio_stream::iter(
        events
            .into_iter()
            .map(move |e| frame(EventFrame::Event(e)))
            .chain(std::iter::once(frame(EventFrame::Control(control)))),
    );
    let tail = futures_util::stream::unfold(tail.map(|t| (t, last)), move |state| async move {
        let (mut tail, last) = state?;
        if tail.lagged() {
            return Some((Err(slow_reader("sequence", last)), None));
        }
        match tail.rx.recv().await {
            Some(event) if !tail.lagged() => {
                let last = event.sequence;
                Some((
                    frame(EventFrame::Event((*event).clone())),
                    Some((tail, last)),
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
    let rest = futures_util::stream::unfold(
        subscription.map(|s| (s, revision)),
        move |state| async move {
            let ((mut rx, lagged), mut revision) = state?;
            let slow = || {
                let mut s = slow_reader("revision", revision);
                s.metadata_mut().remove(LAST_DELIVERED_TRAILER);
                s
            };
            if lagged.load(std::sync::atomic::Ordering::Acquire) {
                return Some((Err(slow()), None));
            }
            match rx.recv().await {
                Some(InteractionFrame::Delta(d)) => {
                    revision = d.revision;
                    Some((frame(IFrame::Delta(d)), Some(((rx, lagged), revision))))
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
