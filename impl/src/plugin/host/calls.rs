//! One call on a leased generation ("Initial tool API", "Generation lifecycle"): the tool
//! checked against the lease's snapshot, `Execute` streamed with every message checked
//! (call ID, progress token, sequence, the progress bound, exactly one terminal message
//! and nothing after it), and the outcome typed. A call interrupted by a crash is failed,
//! and a mutating one is reported uncertain and never replayed; cancellation goes
//! through the RPC first, then the process tree, and whether termination was confirmed
//! is part of the outcome.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::plugin::proto::v1::{CancelRequest, ExecuteRequest, FailureCode, execute_response};
use crate::plugin::wire::{check_call_id, random_hex};

use super::generations::Lease;

/// How long a cancelled call may take to end before its generation is stopped hard.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// What a call ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The tool's output (JSON text).
    Result(String),
    /// The tool's typed failure.
    Failure {
        /// The code.
        code: FailureCode,
        /// The plugin's explanation.
        message: String,
    },
}

/// Why a call has no outcome from the plugin (stable `code()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The tool is not in the lease's snapshot (nothing was sent).
    #[error("unknown_tool: {0} is not a tool of this generation")]
    UnknownTool(String),
    /// The call ID breaks the grammar (nothing was sent).
    #[error("invalid_call: {0}")]
    InvalidCall(String),
    /// The plugin refused the call with a gRPC status.
    #[error("refused: {0}")]
    Refused(String),
    /// The stream broke before its terminal message (the plugin crashed or went away).
    /// `uncertain` for a mutating tool: its effect may have happened; it is never replayed.
    #[error("interrupted: the call's stream broke before its outcome (uncertain: {uncertain})")]
    Interrupted {
        /// Whether the effect may have happened.
        uncertain: bool,
    },
    /// The plugin broke the call's rules (stable `rule`).
    #[error("protocol_violation: {rule}: {detail}")]
    Violation {
        /// `call_id_mismatch`, `progress_token_mismatch`, `progress_sequence`,
        /// `progress_bound`, `post_terminal_message`, `no_terminal_message`,
        /// `stdout_contamination`.
        rule: &'static str,
        /// What was seen.
        detail: String,
    },
    /// The call was cancelled (or timed out) before its outcome.
    #[error(
        "cancelled: acknowledged: {acknowledged}, termination confirmed: {confirmed}, uncertain: {uncertain}"
    )]
    Cancelled {
        /// Whether the plugin answered the `Cancel` RPC.
        acknowledged: bool,
        /// Whether the call is known to have stopped: the plugin acknowledged the cancel,
        /// or (when it did not) its process tree was stopped and confirmed gone.
        confirmed: bool,
        /// Whether the effect may have happened.
        uncertain: bool,
    },
}

impl CallError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::UnknownTool(_) => "unknown_tool",
            CallError::InvalidCall(_) => "invalid_call",
            CallError::Refused(_) => "refused",
            CallError::Interrupted { .. } => "interrupted",
            CallError::Violation { .. } => "protocol_violation",
            CallError::Cancelled { .. } => "cancelled",
        }
    }
}

fn violation(rule: &'static str, detail: impl Into<String>) -> CallError {
    CallError::Violation {
        rule,
        detail: detail.into(),
    }
}

impl Lease {
    /// Runs `tool` with `arguments_json` as call `call_id`, reporting each progress
    /// message to `on_progress` (sequence, text), until the outcome, the call bound, or
    /// `cancel` completes.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn execute(
        &self,
        call_id: &str,
        tool: &str,
        arguments_json: &str,
        mut on_progress: impl FnMut(u64, &str),
        cancel: impl Future<Output = ()>,
    ) -> Result<ToolOutcome, CallError> {
        let generation = self.generation();
        check_call_id("call_id", call_id).map_err(|e| CallError::InvalidCall(e.message))?;
        let Some(definition) = generation.tools.iter().find(|t| t.name == tool) else {
            return Err(CallError::UnknownTool(tool.to_string()));
        };
        let uncertain = definition.mutating;
        let token = format!("p-{}", &random_hex()[..16]);
        let mut client = generation.client.clone();
        let request = ExecuteRequest {
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            arguments_json: arguments_json.to_string(),
            progress_token: token.clone(),
        };
        let run = async {
            let mut stream = match client.execute(request).await {
                Ok(response) => response.into_inner(),
                // No answer at all: the connection broke (the plugin crashed or went
                // away) after the request may have reached it.
                Err(s)
                    if matches!(
                        s.code(),
                        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                    ) =>
                {
                    generation.broken.store(true, Ordering::SeqCst);
                    return Err(CallError::Interrupted { uncertain });
                }
                Err(s) => {
                    return Err(CallError::Refused(format!(
                        "{:?}: {}",
                        s.code(),
                        s.message()
                    )));
                }
            };
            let mut terminal = None;
            let mut sequence = 0u64;
            loop {
                let message = match stream.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(_) if terminal.is_some() => break,
                    Err(_) => {
                        generation.broken.store(true, Ordering::SeqCst);
                        return Err(CallError::Interrupted { uncertain });
                    }
                };
                if terminal.is_some() {
                    return Err(violation(
                        "post_terminal_message",
                        "a message followed the call's terminal message",
                    ));
                }
                if message.call_id != call_id {
                    return Err(violation(
                        "call_id_mismatch",
                        format!("{:?}", message.call_id),
                    ));
                }
                match message.event {
                    Some(execute_response::Event::Progress(p)) => {
                        if p.progress_token != token {
                            return Err(violation(
                                "progress_token_mismatch",
                                format!("{:?}", p.progress_token),
                            ));
                        }
                        if p.sequence != sequence + 1 {
                            return Err(violation(
                                "progress_sequence",
                                format!("{} after {sequence}", p.sequence),
                            ));
                        }
                        sequence = p.sequence;
                        if sequence > u64::from(generation.max_progress_messages) {
                            return Err(violation(
                                "progress_bound",
                                format!("progress message {sequence}"),
                            ));
                        }
                        on_progress(sequence, &p.message);
                    }
                    Some(execute_response::Event::Result(r)) => {
                        terminal = Some(ToolOutcome::Result(r.output_json))
                    }
                    Some(execute_response::Event::Failure(f)) => {
                        terminal = Some(ToolOutcome::Failure {
                            code: FailureCode::try_from(f.code).unwrap_or(FailureCode::Unspecified),
                            message: f.message,
                        });
                    }
                    None => return Err(violation("empty_message", "a message without an event")),
                }
            }
            terminal.ok_or_else(|| {
                violation(
                    "no_terminal_message",
                    "the stream ended without a result or failure",
                )
            })
        };
        let outcome = tokio::select! {
            outcome = run => outcome,
            () = cancel => Err(CallError::Cancelled { acknowledged: false, confirmed: false, uncertain }),
            () = tokio::time::sleep(generation.call_timeout) => Err(CallError::Cancelled { acknowledged: false, confirmed: false, uncertain }),
        };
        if let Err(CallError::Cancelled { uncertain, .. }) = outcome {
            // Through the RPC first; the dropped stream (RST_STREAM) says the same.
            let mut client = generation.client.clone();
            let asked = tokio::time::timeout(
                CANCEL_GRACE,
                client.cancel(CancelRequest {
                    call_id: call_id.to_string(),
                }),
            )
            .await;
            let acknowledged = matches!(asked, Ok(Ok(_)));
            let confirmed = if acknowledged {
                true
            } else {
                // The plugin does not answer: the call's only sure end is its process
                // tree's ("Cancellation propagates through RPC then process-tree
                // cleanup"). The generation is broken; later calls need a restart.
                generation.broken.store(true, Ordering::SeqCst);
                generation.stop_process().await
            };
            return Err(CallError::Cancelled {
                acknowledged,
                confirmed,
                uncertain,
            });
        }
        if let Some(c) = generation.output().await.settled_contamination().await {
            return Err(violation("stdout_contamination", format!("{c:?}")));
        }
        outcome
    }
}
