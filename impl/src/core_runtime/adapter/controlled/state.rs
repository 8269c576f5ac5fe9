//! The controlled adapter's shared state: call records, per-kind faults and holds,
//! open Runs and pending cancels. Pure data behind one mutex; no I/O, no awaits.

use std::collections::{HashMap, VecDeque};

use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::protocol::{CallKind, FailMode};
use crate::core_runtime::adapter::{CancelSettlement, RunEventSink};
use crate::core_runtime::wire::RunId;

/// Most call records kept. Records past it are counted (`report.dropped`) but not kept,
/// so an `await` for them times out; the calls themselves behave normally.
pub const MAX_CALL_RECORDS: usize = 10_000;

/// Most Runs remembered (open ones plus tombstones of settled ones). At the bound the
/// tombstones are forgotten (an op on a forgotten Run then waits like one on a Run that
/// never started); with no tombstone left to forget, a new `start` is refused.
pub const MAX_RUNS: usize = 10_000;

/// Most `hold`s armed per call kind that no call consumed yet.
pub const MAX_ARMED_HOLDS: u32 = 1_024;

/// Most calls of one kind blocked by a hold at once; past it a call is not held.
pub const MAX_HELD_CALLS: usize = 1_024;

/// Most concurrent `cancel` calls waiting for `settle_cancel` on one Run; past it the
/// call is refused.
pub const MAX_PENDING_CANCELS_PER_RUN: usize = 64;

/// A Run the adapter knows.
pub enum RunSlot {
    /// Started natively and not settled: native events go to this sink.
    Open(RunEventSink),
    /// Settled (or its event stream was dropped by the Runtime): nothing more is emitted.
    Closed,
}

/// Holds of one call kind.
#[derive(Default)]
pub struct HoldState {
    /// Holds that the next calls of the kind will consume.
    pub armed: u32,
    /// Calls blocked by a hold, oldest first; `release` unblocks the oldest live one.
    pub held: VecDeque<oneshot::Sender<()>>,
}

/// Everything the control channel and the native calls share.
#[derive(Default)]
pub struct State {
    /// Set once the control channel is gone; nothing is waited for afterwards.
    pub closed: bool,
    /// Call records in call order (at most [`MAX_CALL_RECORDS`]).
    pub records: Vec<Value>,
    /// Calls made after the record bound was reached.
    pub dropped_records: u64,
    /// Armed failures per call kind: mode and remaining count.
    pub faults: [Option<(FailMode, u32)>; CallKind::COUNT],
    /// Holds per call kind.
    pub holds: [HoldState; CallKind::COUNT],
    /// Runs by ID.
    pub runs: HashMap<RunId, RunSlot>,
    /// `cancel` calls waiting for `settle_cancel`, by Run.
    pub pending_cancels: HashMap<RunId, Vec<oneshot::Sender<CancelSettlement>>>,
}

impl State {
    /// Appends a call record, or counts it as dropped past [`MAX_CALL_RECORDS`].
    pub fn push_record(&mut self, record: Value) {
        if self.records.len() < MAX_CALL_RECORDS {
            self.records.push(record);
        } else {
            if self.dropped_records == 0 {
                tracing::warn!(
                    bound = MAX_CALL_RECORDS,
                    "controlled adapter: call record bound reached; later calls are not recorded"
                );
            }
            self.dropped_records = self.dropped_records.saturating_add(1);
        }
    }

    /// Consumes one armed failure of `kind`, if any.
    pub fn take_fault(&mut self, kind: CallKind) -> Option<FailMode> {
        let slot = &mut self.faults[kind.index()];
        let (mode, remaining) = (*slot)?;
        *slot = (remaining > 1).then(|| (mode, remaining - 1));
        Some(mode)
    }

    /// Consumes one armed hold of `kind`, if any, and returns what the call waits on.
    pub fn take_hold(&mut self, kind: CallKind) -> Option<oneshot::Receiver<()>> {
        let hold = &mut self.holds[kind.index()];
        if hold.armed == 0 {
            return None;
        }
        hold.armed -= 1;
        hold.held.retain(|tx| !tx.is_closed());
        if hold.held.len() >= MAX_HELD_CALLS {
            tracing::warn!(
                call = kind.as_str(),
                "controlled adapter: too many held calls"
            );
            return None;
        }
        let (tx, rx) = oneshot::channel();
        hold.held.push_back(tx);
        Some(rx)
    }

    /// `release`: unblocks the oldest live held call of `kind`, or else disarms one
    /// armed hold. Returns whether anything changed.
    pub fn release(&mut self, kind: CallKind) -> bool {
        let hold = &mut self.holds[kind.index()];
        while let Some(tx) = hold.held.pop_front() {
            if tx.send(()).is_ok() {
                return true;
            }
        }
        if hold.armed > 0 {
            hold.armed -= 1;
            return true;
        }
        false
    }

    /// The `count`-th (1-based) record of `kind` whose fields include every entry of
    /// `matcher` with an equal value.
    pub fn nth_match(
        &self,
        kind: CallKind,
        matcher: &Map<String, Value>,
        count: usize,
    ) -> Option<&Value> {
        self.records
            .iter()
            .filter(|record| {
                record.get("call").and_then(Value::as_str) == Some(kind.as_str())
                    && matcher.iter().all(|(k, v)| record.get(k) == Some(v))
            })
            .nth(count.checked_sub(1)?)
    }

    /// Registers a started Run.
    ///
    /// # Errors
    /// A reason when the Run is already open or the Run bound is reached.
    pub fn open_run(&mut self, run_id: RunId, sink: RunEventSink) -> Result<(), String> {
        if let Some(RunSlot::Open(_)) = self.runs.get(&run_id) {
            return Err(format!("run `{run_id}` is already started"));
        }
        if self.runs.len() >= MAX_RUNS && !self.runs.contains_key(&run_id) {
            self.runs.retain(|_, slot| matches!(slot, RunSlot::Open(_)));
            if self.runs.len() >= MAX_RUNS {
                return Err(format!("more than {MAX_RUNS} runs are open"));
            }
        }
        self.runs.insert(run_id, RunSlot::Open(sink));
        Ok(())
    }

    /// Registers a pending `cancel` of `run_id`.
    ///
    /// # Errors
    /// A reason when [`MAX_PENDING_CANCELS_PER_RUN`] cancels already wait on the Run.
    pub fn add_pending_cancel(
        &mut self,
        run_id: &RunId,
    ) -> Result<oneshot::Receiver<CancelSettlement>, String> {
        if self.pending_cancels.len() >= MAX_RUNS {
            self.pending_cancels.retain(|_, waiters| {
                waiters.retain(|tx| !tx.is_closed());
                !waiters.is_empty()
            });
        }
        let waiters = self.pending_cancels.entry(run_id.clone()).or_default();
        waiters.retain(|tx| !tx.is_closed());
        if waiters.len() >= MAX_PENDING_CANCELS_PER_RUN {
            return Err(format!(
                "more than {MAX_PENDING_CANCELS_PER_RUN} cancels are pending on run `{run_id}`"
            ));
        }
        let (tx, rx) = oneshot::channel();
        waiters.push(tx);
        Ok(rx)
    }

    /// Resolves every live pending `cancel` of `run_id`. Returns how many resolved.
    pub fn settle_cancels(&mut self, run_id: &RunId, settlement: CancelSettlement) -> usize {
        let Some(waiters) = self.pending_cancels.remove(run_id) else {
            return 0;
        };
        waiters
            .into_iter()
            .filter_map(|tx| tx.send(settlement).ok())
            .count()
    }

    /// Marks the channel closed and drops every waiter and Run sink, so pending native
    /// calls resolve and open Runs' event streams end.
    pub fn close(&mut self) {
        self.closed = true;
        self.pending_cancels.clear();
        for hold in &mut self.holds {
            hold.armed = 0;
            hold.held.clear();
        }
        for slot in self.runs.values_mut() {
            *slot = RunSlot::Closed;
        }
    }
}
